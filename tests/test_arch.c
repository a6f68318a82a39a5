/*
 * test_arch.c — the architecture table (model/arch.c) and the layout both
 * engines bind from.
 *
 * Checks the table's invariants for every row (names and aliases resolve, no
 * family has a tensor both split and fused, a family wired on CUDA is wired
 * on the CPU, wired families list only tensors the engines bind, unwired and
 * unsupported ones are refused with their sentences), the Hugging Face name
 * map, and the layouts of the reference models in tests/data/ref: their
 * needs, flags and RoPE parameters, and the sentences of a missing or
 * misshapen tensor and of a RoPE variant spill does not run.
 */
#include <math.h>

#include "base/util.h"
#include "model/arch.h"
#include "model/model.h"
#include "test.h"

/* A model of family `arch` with small dimensions and no tensors, as model_open would describe it. */
static void fake_model(model_desc *m, const char *arch)
{
    memset(m, 0, sizeof *m);
    m->source = "fake";
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    m->state = model_arch_state(arch, &m->state_note);
    m->n_layers = 2;
    m->d_model = 64;
    m->n_heads = 4;
    m->n_kv_heads = 2;
    m->head_dim = 16;
    m->ffn_dim = 128;
    m->vocab = 100;
    m->rope_dim = 16;
    m->rope_theta = 10000;
}

static void test_table(void)
{
    const char *name, *note;
    enum arch_state st;
    char err[SPILL_ERRLEN];
    for (size_t i = 0; model_arch_at(i, &name, &st, &note); i++) {
        const arch_family *f = model_arch_find(name);
        CHECK(f && !strcmp(f->name, name) && f->state == st && note && *note, "%s: found by its name", name);
        if (!f)
            continue;
        CHECK(!f->alias || (model_arch_find(f->alias) == f && !strcmp(model_arch_normalise(f->alias), name)),
              "%s: alias %s resolves to it", name, f->alias);
        const unsigned char *t = f->tensors;
        CHECK(!(t[ARCH_Q] && t[ARCH_QKV]) && !(t[ARCH_GATE] && t[ARCH_GATE_UP]) && !(t[ARCH_GATE] && t[ARCH_GATE_EXPS]),
              "%s: a tensor both split and fused", name);
        CHECK(!f->cuda || f->cpu, "%s: wired on CUDA before the CPU", name);
        CHECK(!(f->cpu || f->cuda) || st == ARCH_SUPPORTED, "%s: wired but not supported", name);
        model_desc m;
        fake_model(&m, name);
        arch_layout a;
        int rc = model_arch_resolve(&m, ARCH_ENGINE_CPU, &a, err, sizeof err);
        if (st == ARCH_UNSUPPORTED)
            CHECK(rc < 0 && strstr(err, "is not supported: ") && strstr(err, note), "%s: %s", name, err);
        else if (!f->cpu)
            CHECK(rc < 0 && strstr(err, "is described but its forward pass is not wired yet."), "%s: %s", name, err);
        else {
            CHECK(rc == 0 && a.family == f, "%s: resolves: %s", name, err);
            for (int s = 0; rc == 0 && s < ARCH_SLOT_COUNT; s++)
                CHECK(a.t[s].need == ARCH_ABSENT || a.t[s].kind != ARCH_EXPERTS, "%s: slot %s has no engine kernel",
                      name, model_arch_slot_name((enum arch_slot)s));
            CHECK(rc == 0 && a.t[ARCH_TOKEN_EMBD].need == ARCH_REQUIRED && a.t[ARCH_OUTPUT].need == ARCH_OPTIONAL,
                  "%s: globals", name);
        }
    }
    CHECK(model_arch_find("gemma") == NULL && !strcmp(model_arch_normalise("gemma"), "gemma") &&
              model_arch_state("gemma", &note) == ARCH_UNSUPPORTED && strstr(note, "spill models"),
          "an unknown family");
    CHECK(!strcmp(model_arch_normalise("gemma3_text"), "gemma3") &&
              !strcmp(model_arch_normalise("deepseek_v2"), "deepseek2"),
          "aliases");
}

static void test_hf_names(void)
{
    const arch_family *llama = model_arch_find("llama"), *gemma2 = model_arch_find("gemma2");
    char out[96];
    int32_t l;
    static const struct {
        const char *hf, *want;
        int layer;
        bool gemma;
    } cases[] = {
        {"model.embed_tokens.weight", "token_embd.weight", -1, false},
        {"lm_head.weight", "output.weight", -1, false},
        {"model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias", 3, false},
        {"model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", 0, false},
        {"model.layers.0.post_attention_layernorm.weight", "blk.0.post_attention_norm.weight", 0, true},
        {"model.layers.1.pre_feedforward_layernorm.weight", "blk.1.ffn_norm.weight", 1, true},
        {"model.layers.2.mlp.gate.weight", "blk.2.ffn_gate_inp.weight", 2, false},
        {"model.layers.2.block_sparse_moe.gate.weight", "blk.2.ffn_gate_inp.weight", 2, false},
        {"model.layers.5.block_sparse_moe.experts.7.w1.weight", "blk.5.block_sparse_moe.experts.7.w1.weight", 5, false},
        {"model.layers.0.self_attn.qkv_proj.weight", "blk.0.attn_qkv.weight", 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = model_arch_hf_canonical(cases[i].gemma ? gemma2 : llama, cases[i].hf, out, sizeof out, &l);
        CHECK(ok && !strcmp(out, cases[i].want) && l == cases[i].layer, "%s -> %s (layer %d)", cases[i].hf,
              ok ? out : "(refused)", l);
    }
    CHECK(!model_arch_hf_canonical(llama, "model.layers.0.self_attn.rotary_emb.inv_freq", out, sizeof out, &l) &&
              !model_arch_hf_canonical(NULL, "vision_tower.blocks.0.weight", out, sizeof out, &l) &&
              !model_arch_hf_canonical(llama, "model.layers.x.mlp.up_proj.weight", out, sizeof out, &l),
          "names spill does not bind");
}

static void test_ref_layouts(void)
{
    char err[SPILL_ERRLEN];
    model_desc *m;
    arch_layout a;
    const model_tensor *t;
    /* qwen3: q/k norm required, SwiGLU, 1/sqrt(S) scale, plain RoPE */
    if (model_open("tests/data/ref/qwen3_qknorm", &m, err, sizeof err) == 0) {
        CHECK(model_arch_resolve(m, ARCH_ENGINE_CUDA, &a, err, sizeof err) == 0, "qwen3: %s", err);
        CHECK(a.t[ARCH_Q_NORM].need == ARCH_REQUIRED && a.t[ARCH_Q_NORM].n == m->head_dim &&
                  a.t[ARCH_POST_ATTN_NORM].need == ARCH_ABSENT && a.t[ARCH_Q].n == (int64_t)m->n_heads * m->head_dim &&
                  a.t[ARCH_Q].k == m->d_model && a.t[ARCH_DOWN].n == m->d_model && a.t[ARCH_DOWN].k == m->ffn_dim,
              "qwen3: tensors");
        CHECK(a.act == ARCH_ACT_SILU && a.embed_scale == 1.0f && !a.norm_plus_one &&
                  a.attn_scale == 1.0f / sqrtf((float)m->head_dim) && a.attn_softcap == 0 && !a.rope_local_on &&
                  a.rope.style == ROPE_NEOX && a.rope.n_rot == m->rope_dim && a.rope.freq_base == m->rope_theta,
              "qwen3: flags");
        CHECK(model_arch_tensor(m, &a, ARCH_K_NORM, 1, &t, err, sizeof err) == 0 && t &&
                  !strcmp(t->name, "blk.1.attn_k_norm.weight"),
              "qwen3: k norm of layer 1: %s", err);
        a.t[ARCH_Q].n++;
        CHECK(model_arch_tensor(m, &a, ARCH_Q, 0, &t, err, sizeof err) < 0 && !t &&
                  strstr(err, "tensor blk.0.attn_q.weight has shape [") && strstr(err, "but the config implies"),
              "qwen3: misshapen q: %s", err);
        a.t[ARCH_POST_FFW_NORM].need = ARCH_REQUIRED;
        CHECK(model_arch_tensor(m, &a, ARCH_POST_FFW_NORM, 0, &t, err, sizeof err) < 0 &&
                  strstr(err, ": tensor blk.0.post_ffw_norm.weight is missing."),
              "qwen3: missing post norm: %s", err);
        a.t[ARCH_POST_FFW_NORM].need = ARCH_OPTIONAL;
        CHECK(model_arch_tensor(m, &a, ARCH_POST_FFW_NORM, 0, &t, err, sizeof err) == 0 && !t, "optional and absent");
        m->rope_scaling = ROPE_SCALE_DYNAMIC;
        CHECK(model_arch_resolve(m, ARCH_ENGINE_CPU, &a, err, sizeof err) < 0 &&
                  strstr(err, "dynamic RoPE scaling is not implemented."),
              "dynamic RoPE: %s", err);
        model_close(m);
    } else
        CHECK(0, "qwen3: %s", err);
    /* mistral: every layer slides over 8 positions with the global RoPE */
    if (model_open("tests/data/ref/mistral_window8", &m, err, sizeof err) == 0) {
        CHECK(model_arch_resolve(m, ARCH_ENGINE_CPU, &a, err, sizeof err) == 0, "mistral: %s", err);
        CHECK(a.sliding_window == 8 && arch_layer_sliding(&a, 0) && arch_layer_sliding(&a, m->n_layers - 1) &&
                  !a.rope_local_on && a.t[ARCH_Q_BIAS].need == ARCH_OPTIONAL,
              "mistral: window");
        model_close(m);
    } else
        CHECK(0, "mistral: %s", err);
    /* llama yarn: the scaling parameters reach the RoPE config */
    if (model_open("tests/data/ref/llama_yarn", &m, err, sizeof err) == 0) {
        CHECK(model_arch_resolve(m, ARCH_ENGINE_CPU, &a, err, sizeof err) == 0, "llama yarn: %s", err);
        CHECK(a.rope.scaling == ROPE_SCALE_YARN && a.rope.factor == m->rope_factor &&
                  a.rope.orig_max_pos == m->rope_orig_ctx && a.rope.beta_fast == m->rope_beta_fast &&
                  a.rope_local.freq_base == a.rope.freq_base && a.rope_local.scaling == a.rope.scaling,
              "llama yarn: rope");
        model_close(m);
    } else
        CHECK(0, "llama yarn: %s", err);
}

int main(void)
{
    test_table();
    test_hf_names();
    test_ref_layouts();
    return test_finish("test_arch");
}
