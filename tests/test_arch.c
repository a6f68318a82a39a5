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
 * misshapen tensor and of a RoPE variant spill does not run; the arch_ entries of the malformed
 * corpus (a layer_types list that does not cover the layers or names a kind spill does not run, a missing
 * post-norm), refused by model_open or engine_open with their exact sentence.  MoE: the
 * per-layer needs of models mixing dense and sparse layers, the three
 * storages of experts (rows found per expert), and every moe_ entry of the
 * malformed corpus (tests/data/bad/expected.tsv, tools/make_bad_models.py),
 * which engine_open must refuse with its exact sentence.
 */
#include <math.h>

#include "base/util.h"
#include "engine/engine.h"
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
        CHECK(!(t[ARCH_Q] && t[ARCH_QKV]) && !(t[ARCH_GATE] && t[ARCH_GATE_UP]) &&
                  !(t[ARCH_GATE_EXPS] && t[ARCH_GATE_UP_EXPS]),
              "%s: a tensor both split and fused", name);
        CHECK(!t[ARCH_ROUTER] == !t[ARCH_GATE_EXPS] && !t[ARCH_ROUTER] == !t[ARCH_DOWN_EXPS] &&
                  !f->shared_expert == !t[ARCH_SHEXP_GATE],
              "%s: a router without experts or the reverse, or a shared expert the row does not list", name);
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
                CHECK(a.t[s].need == ARCH_ABSENT || a.t[s].kind != ARCH_EXPERTS || a.t[ARCH_ROUTER].need,
                      "%s: slot %s has no engine kernel", name, model_arch_slot_name((enum arch_slot)s));
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
        {"model.layers.5.block_sparse_moe.experts.7.w1.weight", "blk.5.ffn_gate.7.weight", 5, false},
        {"model.layers.5.block_sparse_moe.experts.7.w2.weight", "blk.5.ffn_down.7.weight", 5, false},
        {"model.layers.5.block_sparse_moe.experts.12.w3.weight", "blk.5.ffn_up.12.weight", 5, false},
        {"model.layers.1.mlp.experts.3.gate_proj.weight", "blk.1.ffn_gate.3.weight", 1, false},
        {"model.layers.1.mlp.experts.0.down_proj.weight", "blk.1.ffn_down.0.weight", 1, false},
        {"model.layers.1.mlp.experts.gate_up_proj", "blk.1.ffn_gate_up_exps.weight", 1, false},
        {"model.layers.1.mlp.experts.down_proj", "blk.1.ffn_down_exps.weight", 1, false},
        {"model.layers.0.mlp.shared_expert.up_proj.weight", "blk.0.ffn_up_shexp.weight", 0, false},
        {"model.layers.0.mlp.shared_expert_gate.weight", "blk.0.ffn_gate_inp_shexp.weight", 0, false},
        {"model.layers.0.self_attn.qkv_proj.weight", "blk.0.attn_qkv.weight", 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = model_arch_hf_canonical(cases[i].gemma ? gemma2 : llama, cases[i].hf, out, sizeof out, &l);
        CHECK(ok && !strcmp(out, cases[i].want) && l == cases[i].layer, "%s -> %s (layer %d)", cases[i].hf,
              ok ? out : "(refused)", l);
    }
    CHECK(!model_arch_hf_canonical(llama, "model.layers.0.self_attn.rotary_emb.inv_freq", out, sizeof out, &l) &&
              !model_arch_hf_canonical(NULL, "vision_tower.blocks.0.weight", out, sizeof out, &l) &&
              !model_arch_hf_canonical(llama, "model.layers.x.mlp.up_proj.weight", out, sizeof out, &l) &&
              !model_arch_hf_canonical(llama, "model.layers.0.mlp.experts.x.up_proj.weight", out, sizeof out, &l) &&
              !model_arch_hf_canonical(llama, "model.layers.0.block_sparse_moe.experts.1.up_proj.bias", out, sizeof out,
                                       &l),
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

static void test_moe_layouts(void)
{
    char err[SPILL_ERRLEN];
    model_desc *m;
    arch_layout a;
    arch_expert ex[8];
    /* qwen2_moe_shared: layer 1 is dense (mlp_only_layers), the others sparse with a shared expert */
    if (model_open("tests/data/ref/qwen2_moe_shared", &m, err, sizeof err) == 0) {
        CHECK(model_arch_resolve(m, ARCH_ENGINE_CPU, &a, err, sizeof err) == 0, "qwen2_moe: %s", err);
        CHECK(arch_layer_sparse(&a, 0) && !arch_layer_sparse(&a, 1) && arch_layer_sparse(&a, 2) && !a.expert_norm &&
                  a.n_experts == 8 && a.n_experts_used == 2,
              "qwen2_moe: sparse layers");
        CHECK(arch_slot_need(&a, ARCH_ROUTER, 0) == ARCH_REQUIRED && arch_slot_need(&a, ARCH_GATE, 0) == ARCH_ABSENT &&
                  arch_slot_need(&a, ARCH_ROUTER, 1) == ARCH_ABSENT &&
                  arch_slot_need(&a, ARCH_GATE, 1) == ARCH_REQUIRED &&
                  arch_slot_need(&a, ARCH_SHEXP_GATE_INP, 2) == ARCH_REQUIRED &&
                  arch_slot_need(&a, ARCH_FFN_NORM, 1) == ARCH_REQUIRED,
              "qwen2_moe: needs per layer");
        CHECK(a.t[ARCH_GATE].n == 64 && a.t[ARCH_GATE_EXPS].n == 32 && a.t[ARCH_SHEXP_GATE].n == 48 &&
                  a.t[ARCH_DOWN_EXPS].k == 32,
              "qwen2_moe: dense F, expert F and shared F apart");
        CHECK(model_arch_experts(m, &a, ARCH_DOWN_EXPS, 2, ex, err, sizeof err) == 0 && ex[7].row0 == 0 &&
                  !strcmp(ex[7].t->name, "blk.2.ffn_down.7.weight") &&
                  !strcmp(ex[7].t->src_name, "model.layers.2.mlp.experts.7.down_proj.weight"),
              "qwen2_moe: per-expert tensors: %s", err);
        const model_tensor *t;
        CHECK(model_arch_tensor(m, &a, ARCH_SHEXP_GATE_INP, 0, &t, err, sizeof err) == 0 && t && t->n_dims == 1,
              "qwen2_moe: the [1, D] shared gate is a vector: %s", err);
        model_close(m);
    } else
        CHECK(0, "qwen2_moe: %s", err);
    /* qwen2_moe_top1_step2: decoder_sparse_step 2 makes only layer 1 sparse; normalised */
    if (model_open("tests/data/ref/qwen2_moe_top1_step2", &m, err, sizeof err) == 0) {
        CHECK(!m->layer_sparse[0] && m->layer_sparse[1] && !m->layer_sparse[2] && m->expert_norm &&
                  m->expert_ffn_dim == 32 && m->ffn_dim == 64,
              "qwen2_moe step 2: sparse layers");
        model_close(m);
    } else
        CHECK(0, "qwen2_moe step 2: %s", err);
    /* qwen3_moe: transformers 5 names the expert count num_local_experts */
    if (model_open("tests/data/ref/qwen3_moe_top8", &m, err, sizeof err) == 0) {
        CHECK(m->n_experts == 16 && m->n_experts_used == 8 && m->expert_norm && m->layer_sparse[0] &&
                  m->layer_sparse[1],
              "qwen3_moe: experts");
        model_close(m);
    } else
        CHECK(0, "qwen3_moe: %s", err);
}

/* Every moe_ entry of the malformed corpus: model_open accepts the files, engine_open refuses the model with
 * the expected sentence. */
static void test_bad_moe(void)
{
    char *text, err[SPILL_ERRLEN];
    size_t len;
    int n = 0;
    if (util_read_file("tests/data/bad/expected.tsv", 16u << 20, &text, &len, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    for (char *line = text, *next; *line; line = next) {
        next = strchr(line, '\n');
        next = next ? (*next = 0, next + 1) : line + strlen(line);
        char *tab = strchr(line, '\t');
        if (!tab || (strncmp(line, "moe_", 4) && strncmp(line, "arch_", 5)))
            continue;
        *tab = 0;
        char dir[300];
        snprintf(dir, sizeof dir, "tests/data/bad/%s", line);
        model_desc *m;
        int rc = model_open(dir, &m, err, sizeof err);
        if (rc) { /* a config the description refuses (arch_ entries): the sentence comes from model_open */
            CHECK(!strncmp(line, "arch_", 5) && !strcmp(err, tab + 1), "%s: model_open:\n  got  %s\n  want %s", line,
                  err, tab + 1);
            n++;
            continue;
        }
        engine_opts o = {.threads = 1, .max_pass_tokens = 4, .max_pass_seqs = 1, .page_tokens = 4, .kv_pages = 4};
        spill_engine *e = NULL;
        rc = engine_open(m, &o, &e, err, sizeof err);
        CHECK(rc < 0 && e == NULL && !strcmp(err, tab + 1), "%s:\n  got  %s\n  want %s", line, rc ? err : "(opened)",
              tab + 1);
        engine_close(e);
        model_close(m);
        n++;
    }
    free(text);
    CHECK(n >= 8, "only %d malformed MoE and dense-family models", n);
}

int main(void)
{
    test_table();
    test_hf_names();
    test_ref_layouts();
    test_moe_layouts();
    test_bad_moe();
    return test_finish("test_arch");
}
