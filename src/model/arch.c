/*
 * arch.c — the architecture families: one table row per family, the tensor
 * names every family draws from, and the resolution of one model against
 * its row into what an engine needs to run it (arch_layout).
 *
 * Owns: which families spill knows and their state; on which engine each
 * family's pass is wired; each family's tensors per layer (required,
 * optional, absent; split or fused), activation, norm offset, embedding
 * scale, query scale and softcap conventions, per-layer window rule, GGUF
 * RoPE pairing, expert layout; the canonical tensor names (GGUF's) and the
 * Hugging Face names they come from; the RoPE parameters of global and
 * sliding layers; the shape check of every tensor an engine binds.
 * Does not own: reading config keys (model.c turns config.json and GGUF keys
 * into a model_desc, consulting the row for family conventions), the
 * kernels (engine/, cuda/), which engine field holds which tensor (each
 * engine maps slots to its own layer struct).
 *
 * Key decisions:
 *  - Adding a family is a row here plus the kernels it needs: the engines
 *    bind whatever the row lists (refusing a tensor they have no kernel for)
 *    and read the pass's flags from the resolved layout, never the family
 *    name.  A row says wired per engine, so a family can land on the CPU
 *    first (STYLE.md: the CPU backend is the oracle).
 *  - Tensors are slots with fixed canonical names and shapes in dimension
 *    letters; a row only says each slot's need.  Slot order is the order
 *    both engines bind in, so both report the same first missing tensor.
 *  - The RoPE parameter struct (rope_cfg) lives here, below the engines:
 *    model_arch_resolve fills it from the description (variant, scaling,
 *    the sliding layers' own base) and the CPU backend's cpu_rope_init turns
 *    it into frequency tables for both engines, with no translation between
 *    a model-side and an engine-side copy.
 *  - MoE: a slot belongs to the dense FFN, to a sparse layer's FFN (router,
 *    experts, shared expert) or to neither, and the model's per-layer
 *    sparse flag (arch_layout.layer_sparse) decides which FFN a layer
 *    needs, so one row describes models whose dense and sparse layers mix
 *    (Qwen2-MoE mlp_only_layers, decoder_sparse_step).  Experts come in
 *    three storages (GGUF stacked, transformers 5's fused gate_up, HF one
 *    tensor per expert); model_arch_experts hides which behind (tensor,
 *    first row) per expert, so engines bind rows, never file layouts.
 */
#include "arch.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "gguf.h"
#include "quant.h"

/* ---------------------------------------------------------------- slots */

/* Dimension letters a slot's shape is written in. */
enum dim { DIM_1, DIM_D, DIM_HS, DIM_KS, DIM_QKV, DIM_S, DIM_F, DIM_F2, DIM_FE, DIM_FE2, DIM_FS, DIM_E, DIM_V };

/* Which FFN of a layer a slot belongs to (arch_slot_need). */
enum ffn_part { FFN_NONE, FFN_DENSE, FFN_SPARSE };

static const struct slot {
    const char *name;        /* canonical (GGUF) name; per-layer slots are blk.N.<name> */
    const char *hf, *hf_alt; /* Hugging Face names (per layer: after model.layers.N.), or NULL */
    enum arch_kind kind;
    enum dim n, k;
    enum ffn_part part;
} slots[ARCH_SLOT_COUNT] = {
    [ARCH_TOKEN_EMBD] = {"token_embd.weight", "model.embed_tokens.weight", NULL, ARCH_MATRIX, DIM_V, DIM_D, FFN_NONE},
    [ARCH_OUTPUT_NORM] = {"output_norm.weight", "model.norm.weight", NULL, ARCH_VECTOR, DIM_D, DIM_1, FFN_NONE},
    [ARCH_OUTPUT] = {"output.weight", "lm_head.weight", NULL, ARCH_MATRIX, DIM_V, DIM_D, FFN_NONE},
    [ARCH_ATTN_NORM] = {"attn_norm.weight", "input_layernorm.weight", NULL, ARCH_VECTOR, DIM_D, DIM_1, FFN_NONE},
    [ARCH_Q] = {"attn_q.weight", "self_attn.q_proj.weight", NULL, ARCH_MATRIX, DIM_HS, DIM_D, FFN_NONE},
    [ARCH_K] = {"attn_k.weight", "self_attn.k_proj.weight", NULL, ARCH_MATRIX, DIM_KS, DIM_D, FFN_NONE},
    [ARCH_V] = {"attn_v.weight", "self_attn.v_proj.weight", NULL, ARCH_MATRIX, DIM_KS, DIM_D, FFN_NONE},
    [ARCH_QKV] = {"attn_qkv.weight", "self_attn.qkv_proj.weight", NULL, ARCH_MATRIX, DIM_QKV, DIM_D, FFN_NONE},
    [ARCH_O] = {"attn_output.weight", "self_attn.o_proj.weight", NULL, ARCH_MATRIX, DIM_D, DIM_HS, FFN_NONE},
    [ARCH_Q_BIAS] = {"attn_q.bias", "self_attn.q_proj.bias", NULL, ARCH_VECTOR, DIM_HS, DIM_1, FFN_NONE},
    [ARCH_K_BIAS] = {"attn_k.bias", "self_attn.k_proj.bias", NULL, ARCH_VECTOR, DIM_KS, DIM_1, FFN_NONE},
    [ARCH_V_BIAS] = {"attn_v.bias", "self_attn.v_proj.bias", NULL, ARCH_VECTOR, DIM_KS, DIM_1, FFN_NONE},
    [ARCH_Q_NORM] = {"attn_q_norm.weight", "self_attn.q_norm.weight", NULL, ARCH_VECTOR, DIM_S, DIM_1, FFN_NONE},
    [ARCH_K_NORM] = {"attn_k_norm.weight", "self_attn.k_norm.weight", NULL, ARCH_VECTOR, DIM_S, DIM_1, FFN_NONE},
    /* HF post_attention_layernorm: see model_arch_hf_canonical */
    [ARCH_POST_ATTN_NORM] = {"post_attention_norm.weight", NULL, NULL, ARCH_VECTOR, DIM_D, DIM_1, FFN_NONE},
    [ARCH_FFN_NORM] = {"ffn_norm.weight", "pre_feedforward_layernorm.weight", NULL, ARCH_VECTOR, DIM_D, DIM_1, FFN_NONE},
    [ARCH_POST_FFW_NORM] = {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", NULL, ARCH_VECTOR, DIM_D,
                            DIM_1, FFN_NONE},
    [ARCH_GATE] = {"ffn_gate.weight", "mlp.gate_proj.weight", NULL, ARCH_MATRIX, DIM_F, DIM_D, FFN_DENSE},
    [ARCH_UP] = {"ffn_up.weight", "mlp.up_proj.weight", NULL, ARCH_MATRIX, DIM_F, DIM_D, FFN_DENSE},
    [ARCH_GATE_UP] = {"ffn_gate_up.weight", "mlp.gate_up_proj.weight", NULL, ARCH_MATRIX, DIM_F2, DIM_D, FFN_DENSE},
    [ARCH_DOWN] = {"ffn_down.weight", "mlp.down_proj.weight", NULL, ARCH_MATRIX, DIM_D, DIM_F, FFN_DENSE},
    [ARCH_ROUTER] = {"ffn_gate_inp.weight", "mlp.gate.weight", "block_sparse_moe.gate.weight", ARCH_MATRIX, DIM_E,
                     DIM_D, FFN_SPARSE},
    /* HF per-expert tensors are named in model_arch_hf_canonical; the 3-D ones are transformers 5's */
    [ARCH_GATE_EXPS] = {"ffn_gate_exps.weight", NULL, NULL, ARCH_EXPERTS, DIM_FE, DIM_D, FFN_SPARSE},
    [ARCH_UP_EXPS] = {"ffn_up_exps.weight", NULL, NULL, ARCH_EXPERTS, DIM_FE, DIM_D, FFN_SPARSE},
    [ARCH_GATE_UP_EXPS] = {"ffn_gate_up_exps.weight", "mlp.experts.gate_up_proj", NULL, ARCH_EXPERTS, DIM_FE2, DIM_D,
                           FFN_SPARSE},
    [ARCH_DOWN_EXPS] = {"ffn_down_exps.weight", "mlp.experts.down_proj", NULL, ARCH_EXPERTS, DIM_D, DIM_FE, FFN_SPARSE},
    /* HF stores the gate [1, D]; model.c reads it as the vector GGUF stores */
    [ARCH_SHEXP_GATE_INP] = {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", NULL, ARCH_VECTOR, DIM_D,
                             DIM_1, FFN_SPARSE},
    [ARCH_SHEXP_GATE] = {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", NULL, ARCH_MATRIX, DIM_FS,
                         DIM_D, FFN_SPARSE},
    [ARCH_SHEXP_UP] = {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", NULL, ARCH_MATRIX, DIM_FS, DIM_D,
                       FFN_SPARSE},
    [ARCH_SHEXP_DOWN] = {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", NULL, ARCH_MATRIX, DIM_D,
                         DIM_FS, FFN_SPARSE},
};

/* HF names of one routed expert's tensors (after model.layers.N.<prefix>.E.) and the canonical stem of each:
 * blk.N.<stem>.E.weight. */
static const struct {
    const char *hf, *stem;
} expert_names[] = {
    {"gate_proj.weight", "ffn_gate"}, {"up_proj.weight", "ffn_up"}, {"down_proj.weight", "ffn_down"},
    {"w1.weight", "ffn_gate"},        {"w3.weight", "ffn_up"},      {"w2.weight", "ffn_down"},
};

/* ---------------------------------------------------------------- families */

#define R ARCH_REQUIRED
#define O ARCH_OPTIONAL
/* Tensor sets a row combines (each sets distinct slots). */
#define GLOBALS [ARCH_TOKEN_EMBD] = R, [ARCH_OUTPUT_NORM] = R, [ARCH_OUTPUT] = O
#define ATTENTION(bias)                                                                                                \
    [ARCH_ATTN_NORM] = R, [ARCH_Q] = R, [ARCH_K] = R, [ARCH_V] = R, [ARCH_O] = R, [ARCH_Q_BIAS] = bias,                \
    [ARCH_K_BIAS] = bias, [ARCH_V_BIAS] = bias
#define QK_NORM [ARCH_Q_NORM] = R, [ARCH_K_NORM] = R
#define POST_NORMS [ARCH_POST_ATTN_NORM] = R, [ARCH_POST_FFW_NORM] = R
#define FFN [ARCH_FFN_NORM] = R, [ARCH_GATE] = R, [ARCH_UP] = R, [ARCH_DOWN] = R
/* an MoE row lists FFN too: its dense layers bind it, its sparse layers these (arch_slot_need) */
#define EXPERTS [ARCH_ROUTER] = R, [ARCH_GATE_EXPS] = R, [ARCH_UP_EXPS] = R, [ARCH_DOWN_EXPS] = R
#define SHARED_EXPERT [ARCH_SHEXP_GATE_INP] = R, [ARCH_SHEXP_GATE] = R, [ARCH_SHEXP_UP] = R, [ARCH_SHEXP_DOWN] = R
/* Gemma's conventions: HF norm weights w - 1, queries scaled by query_pre_attn_scalar, logit softcaps. */
#define GEMMA_HF .hf_norm_plus_one = true, .query_pre_attn_scalar = true, .hf_softcap = true

static const arch_family families[] = {
    {.name = "llama",
     .state = ARCH_SUPPORTED,
     .note = "Llama 1/2/3.x and SmolLM2 (CPU engine, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(O), FFN},
     .gguf_rope = ROPE_NORM, /* llama.cpp's converter permutes Q/K rows for consecutive pairs */
     .hf_pack = true},
    {.name = "qwen2",
     .state = ARCH_SUPPORTED,
     .note = "Qwen2/2.5 with QKV bias (CPU engine, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(R), FFN},
     .hf_pack = true},
    {.name = "qwen3",
     .state = ARCH_SUPPORTED,
     .note = "Qwen3 with q/k RMSNorm (CPU engine, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(O), QK_NORM, FFN},
     .hf_pack = true},
    {.name = "mistral",
     .state = ARCH_SUPPORTED,
     .note = "Mistral with sliding-window attention (CPU engine, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(O), FFN},
     .hf_pack = true},
    /* GGUF phi3 files call the fused gate/up ffn_up.weight (2F rows): model.c renames it when phi3 is wired */
    {.name = "phi3",
     .state = ARCH_SUPPORTED,
     .note = "Phi-3/3.5, Phi-4-mini: fused QKV and gate/up, longrope, partial rotary (checked against transformers "
             "logits).",
     .cpu = true,
     .cuda = true,
     .hf_pack = true,
     .tensors = {GLOBALS, [ARCH_ATTN_NORM] = R, [ARCH_QKV] = R, [ARCH_O] = R, [ARCH_FFN_NORM] = R, [ARCH_GATE_UP] = R,
                 [ARCH_DOWN] = R}},
    {.name = "gemma2",
     .state = ARCH_SUPPORTED,
     .note =
         "Gemma 2: soft-capping, alternating sliding windows, pre/post norms (checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .hf_pack = true,
     .tensors = {GLOBALS, ATTENTION(ARCH_ABSENT), POST_NORMS, FFN},
     .act = ARCH_ACT_GELU_TANH,
     .embed_scale = true,
     GEMMA_HF,
     .gguf_window_every = 2,
     .hf_window_every = 2,
     .gguf_turn_end = "<end_of_turn>"},
    {.name = "gemma3",
     .alias = "gemma3_text",
     .state = ARCH_SUPPORTED,
     .note = "Gemma 3 text: local/global layers with their own RoPE bases, q/k norm (checked against transformers "
             "logits and llama.cpp).",
     .cpu = true,
     .cuda = true,
     .hf_pack = true,
     .tensors = {GLOBALS, ATTENTION(ARCH_ABSENT), QK_NORM, POST_NORMS, FFN},
     .act = ARCH_ACT_GELU_TANH,
     .embed_scale = true,
     GEMMA_HF,
     .gguf_rope_local = 10000.0,
     .gguf_window_every = 6,
     .gguf_turn_end = "<end_of_turn>"},
    {.name = "mixtral",
     .state = ARCH_SUPPORTED,
     .note = "Mixtral MoE: top-2 of 8 experts, renormalised (CPU and CUDA engines, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(ARCH_ABSENT), FFN, EXPERTS},
     .gguf_rope = ROPE_NORM, /* a llama file with experts: Q/K permuted as llama's */
     .moe_norm_always = true,
     .hf_pack = true,
     .gguf_name = "llama"},
    {.name = "qwen2_moe",
     .alias = "qwen2moe",
     .state = ARCH_SUPPORTED,
     .note = "Qwen2-MoE with a gated shared expert and dense layers (CPU and CUDA engines, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(R), FFN, EXPERTS, SHARED_EXPERT},
     .shared_expert = true,
     .hf_pack = true,
     .gguf_name = "qwen2moe"},
    {.name = "qwen3_moe",
     .alias = "qwen3moe",
     .state = ARCH_SUPPORTED,
     .note = "Qwen3-MoE (CPU engine, checked against transformers logits).",
     .cpu = true,
     .cuda = true,
     .tensors = {GLOBALS, ATTENTION(O), QK_NORM, FFN, EXPERTS},
     .gguf_moe_norm = true,
     .hf_pack = true,
     .gguf_name = "qwen3moe"},
    {.name = "mamba",
     .state = ARCH_UNSUPPORTED,
     .note = "Mamba is a state-space model, not a transformer; spill streams attention layers only."},
    {.name = "mamba2",
     .state = ARCH_UNSUPPORTED,
     .note = "Mamba-2 is a state-space model, not a transformer; spill streams attention layers only."},
    {.name = "jamba",
     .state = ARCH_UNSUPPORTED,
     .note = "Jamba is a hybrid attention/Mamba model; hybrid state layers are not supported."},
    {.name = "falcon_h1",
     .state = ARCH_UNSUPPORTED,
     .note = "Falcon-H1 is a hybrid attention/Mamba model; hybrid state layers are not supported."},
    {.name = "deepseek2",
     .alias = "deepseek_v2",
     .state = ARCH_UNSUPPORTED,
     .note = "DeepSeek-V2/V3 use multi-head latent attention (MLA), which spill does not implement."},
    {.name = "deepseek_v3",
     .state = ARCH_UNSUPPORTED,
     .note = "DeepSeek-V3 uses multi-head latent attention (MLA), which spill does not implement."},
    {.name = "llava", .state = ARCH_UNSUPPORTED, .note = "LLaVA is multimodal; spill runs text-only models."},
    {.name = "mllama",
     .state = ARCH_UNSUPPORTED,
     .note = "Llama 3.2 Vision is multimodal; spill runs text-only models."},
    {.name = "qwen2_vl", .state = ARCH_UNSUPPORTED, .note = "Qwen2-VL is multimodal; spill runs text-only models."},
    /* model.c's name for an HF gemma3 config with a text_config (the vision model): described as Gemma 3's
     * text config reads, never run */
    {.name = "gemma3_mm",
     .state = ARCH_UNSUPPORTED,
     .note = "Gemma 3 with its vision tower is multimodal; use the text-only checkpoint.",
     GEMMA_HF},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

const arch_family *model_arch_find(const char *arch)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].name, arch) || (families[i].alias && !strcmp(families[i].alias, arch)))
            return &families[i];
    return NULL;
}

const char *model_arch_normalise(const char *arch)
{
    const arch_family *f = model_arch_find(arch);
    return f ? f->name : arch;
}

enum arch_state model_arch_state(const char *arch, const char **note)
{
    const arch_family *f = model_arch_find(arch);
    if (note)
        *note =
            f ? f->note : "this architecture is not one spill knows; supported families are listed by `spill models`.";
    return f ? f->state : ARCH_UNSUPPORTED;
}

bool model_arch_at(size_t i, const char **name, enum arch_state *state, const char **note)
{
    if (i >= N_FAMILIES)
        return false;
    *name = families[i].name;
    *state = families[i].state;
    *note = families[i].note;
    return true;
}

/* ---------------------------------------------------------------- names */

const char *model_arch_slot_name(enum arch_slot s)
{
    return slots[s].name;
}

bool model_arch_hf_canonical(const arch_family *fam, const char *hf, char *out, size_t cap, int32_t *layer)
{
    *layer = -1;
    for (int s = 0; s < ARCH_LAYER_FIRST; s++)
        if (!strcmp(hf, slots[s].hf))
            return snprintf(out, cap, "%s", slots[s].name) > 0;
    if (strncmp(hf, "model.layers.", 13))
        return false;
    char *end;
    long l = strtol(hf + 13, &end, 10);
    if (end == hf + 13 || *end != '.' || l < 0 || l >= MODEL_MAX_LAYERS)
        return false;
    *layer = (int32_t)l;
    const char *rest = end + 1;
    /* Llama-family checkpoints call the pre-FFN norm post_attention_layernorm (GGUF ffn_norm); in families with
     * post-norms (Gemma) it really follows attention and the pre-FFN norm is pre_feedforward_layernorm. */
    if (!strcmp(rest, "post_attention_layernorm.weight")) {
        bool post = fam && fam->tensors[ARCH_POST_ATTN_NORM] != ARCH_ABSENT;
        return snprintf(out, cap, "blk.%ld.%s", l, slots[post ? ARCH_POST_ATTN_NORM : ARCH_FFN_NORM].name) > 0;
    }
    for (int s = ARCH_LAYER_FIRST; s < ARCH_SLOT_COUNT; s++)
        if ((slots[s].hf && !strcmp(rest, slots[s].hf)) || (slots[s].hf_alt && !strcmp(rest, slots[s].hf_alt)))
            return snprintf(out, cap, "blk.%ld.%s", l, slots[s].name) > 0;
    /* one routed expert's tensor: mlp.experts.E.gate_proj.weight, block_sparse_moe.experts.E.w1.weight, ... */
    const char *ex = !strncmp(rest, "mlp.experts.", 12)                ? rest + 12
                     : !strncmp(rest, "block_sparse_moe.experts.", 25) ? rest + 25
                                                                       : NULL;
    if (!ex || *ex < '0' || *ex > '9')
        return false;
    long e = strtol(ex, &end, 10);
    if (*end != '.' || e >= 1000000)
        return false;
    for (size_t i = 0; i < sizeof expert_names / sizeof expert_names[0]; i++)
        if (!strcmp(end + 1, expert_names[i].hf)) {
            int n = snprintf(out, cap, "blk.%ld.%s.%ld.weight", l, expert_names[i].stem, e);
            return n > 0 && (size_t)n < cap;
        }
    return false;
}

/* ---------------------------------------------------------------- one model */

/* Fills the RoPE parameters of global and sliding layers from the description. */
static int rope_setup(const model_desc *m, arch_layout *a, char *err, size_t errlen)
{
    if (m->rope_scaling == ROPE_SCALE_DYNAMIC)
        return util_errf(err, errlen, "%s: dynamic RoPE scaling is not implemented.", m->source);
    if (m->format == MODEL_GGUF && m->rope_scaling == ROPE_SCALE_LLAMA3)
        return util_errf(err, errlen,
                         "%s: GGUF llama3 RoPE scaling (rope_freqs tensor) is not wired yet; use the safetensors "
                         "checkpoint.",
                         m->source);
    rope_cfg *c = &a->rope;
    c->style = m->rope_style;
    c->n_rot = m->rope_dim;
    c->freq_base = m->rope_theta;
    c->scaling = m->rope_scaling;
    c->factor = m->rope_factor;
    c->low_freq_factor = m->rope_low_freq;
    c->high_freq_factor = m->rope_high_freq;
    c->orig_max_pos = m->rope_orig_ctx;
    c->beta_fast = m->rope_beta_fast;
    c->beta_slow = m->rope_beta_slow;
    c->attn_factor = m->rope_attn_factor;
    if (m->rope_scaling == ROPE_SCALE_LONGROPE) {
        if (!m->rope_short || !m->rope_long || m->rope_orig_ctx <= 0)
            return util_errf(err, errlen, "%s: longrope scaling needs short and long factors and the original length.",
                             m->source);
        /* transformers: attention_factor, else sqrt(1 + ln(factor) / ln(original)) when factor > 1 */
        if (!(c->attn_factor > 0))
            c->attn_factor = c->factor > 1.0 ? sqrt(1.0 + log(c->factor) / log((double)m->rope_orig_ctx)) : 1.0;
        c->orig_max_pos = m->rope_orig_ctx;
        c->ext_factors = m->rope_short;
        a->rope_long = *c;
        a->rope_long.ext_factors = m->rope_long;
        a->rope_long_on = true;
        a->rope_long_after = m->rope_orig_ctx;
    }
    /* Gemma 3: the sliding layers rotate with their own base and no scaling */
    a->rope_local = a->rope;
    a->rope_local_on = m->rope_theta_local > 0;
    if (a->rope_local_on) {
        a->rope_local.freq_base = m->rope_theta_local;
        a->rope_local.scaling = ROPE_SCALE_NONE;
    }
    return 0;
}

static int64_t dim_value(const model_desc *m, enum dim d)
{
    int64_t HS = (int64_t)m->n_heads * m->head_dim, KS = (int64_t)m->n_kv_heads * m->head_dim;
    switch (d) {
    case DIM_1:
        return 1;
    case DIM_D:
        return m->d_model;
    case DIM_HS:
        return HS;
    case DIM_KS:
        return KS;
    case DIM_QKV:
        return HS + 2 * KS;
    case DIM_S:
        return m->head_dim;
    case DIM_F:
        return m->ffn_dim;
    case DIM_F2:
        return 2 * (int64_t)m->ffn_dim;
    case DIM_FE:
        return m->expert_ffn_dim;
    case DIM_FE2:
        return 2 * (int64_t)m->expert_ffn_dim;
    case DIM_FS:
        return m->shared_ffn_dim;
    case DIM_E:
        return m->n_experts;
    case DIM_V:
        return m->vocab;
    }
    return 0;
}

int model_arch_resolve(const model_desc *m, enum arch_engine engine, arch_layout *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (m->state == ARCH_UNSUPPORTED)
        return util_errf(err, errlen, "%s: architecture %s is not supported: %s", m->source, m->arch, m->state_note);
    const arch_family *f = model_arch_find(m->arch);
    if (!f || !(engine == ARCH_ENGINE_CPU ? f->cpu : f->cuda)) {
        if (f && f->cpu)
            return util_errf(err, errlen,
                             "%s: architecture %s runs on the CPU engine but is not wired into the CUDA engine yet; "
                             "run it without --gpu.",
                             m->source, m->arch);
        return util_errf(err, errlen, "%s: architecture %s is described but its forward pass is not wired yet.",
                         m->source, m->arch);
    }
    out->family = f;
    for (int s = 0; s < ARCH_SLOT_COUNT; s++) {
        out->t[s].need = (enum arch_need)f->tensors[s];
        out->t[s].kind = slots[s].kind;
        out->t[s].n = dim_value(m, slots[s].n);
        out->t[s].k = dim_value(m, slots[s].k);
    }
    out->act = f->act;
    out->embed_scale = f->embed_scale ? sqrtf((float)m->d_model) : 1.0f;
    out->norm_plus_one = m->norm_plus_one;
    out->attn_scale = m->query_scale > 0 ? (float)m->query_scale : 1.0f / sqrtf((float)m->head_dim);
    out->attn_softcap = m->attn_softcap;
    out->final_softcap = m->final_softcap;
    out->sliding_window = m->sliding_window;
    out->layer_sliding = m->layer_sliding;
    out->n_experts = m->n_experts;
    out->n_experts_used = m->n_experts_used;
    out->expert_norm = m->expert_norm;
    out->shared_expert = f->shared_expert;
    out->layer_sparse = m->n_experts > 0 ? m->layer_sparse : NULL;
    return rope_setup(m, out, err, errlen);
}

enum arch_need arch_slot_need(const arch_layout *a, enum arch_slot s, int l)
{
    if (s >= ARCH_LAYER_FIRST && slots[s].part != FFN_NONE && (slots[s].part == FFN_SPARSE) != arch_layer_sparse(a, l))
        return ARCH_ABSENT;
    return a->t[s].need;
}

bool arch_slot_sparse(enum arch_slot s)
{
    return slots[s].part == FFN_SPARSE;
}

/* Checks tensor t (called name) against a slot's kind and shape in this model: one sentence when it differs. */
static int check_shape(const model_desc *m, const char *name, const model_tensor *t, enum arch_kind kind, long long n,
                       long long k, int E, char *err, size_t errlen)
{
    unsigned long long n0 = t->ne[0], n1 = t->ne[1], n2 = t->ne[2];
    switch (kind) {
    case ARCH_VECTOR:
        if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
            return util_errf(err, errlen, "%s: tensor %s has %llu elements but the config implies %lld.", m->source,
                             name, n0, n);
        if (t->dtype != GGML_F32 && t->dtype != GGML_F16 && t->dtype != GGML_BF16)
            return util_errf(err, errlen, "%s: tensor %s is stored as %s; norms and biases must be F32, F16 or BF16.",
                             m->source, name, quant_type_name(t->dtype));
        break;
    case ARCH_MATRIX:
        if (t->n_dims != 2 || t->ne[0] != (uint64_t)k || t->ne[1] != (uint64_t)n)
            return util_errf(err, errlen, "%s: tensor %s has shape [%llu, %llu] but the config implies [%lld, %lld].",
                             m->source, name, n1, n0, n, k);
        break;
    case ARCH_EXPERTS:
        if (t->n_dims != 3 || t->ne[0] != (uint64_t)k || t->ne[1] != (uint64_t)n || t->ne[2] != (uint64_t)E)
            return util_errf(err, errlen,
                             "%s: tensor %s has shape [%llu, %llu, %llu] but the config implies [%d, %lld, %lld].",
                             m->source, name, n2, n1, n0, E, n, k);
        break;
    }
    return 0;
}

int arch_fused_parts(const arch_layout *a, enum arch_slot s, enum arch_slot parts[ARCH_MAX_PARTS],
                     int64_t rows[ARCH_MAX_PARTS])
{
    static const enum arch_slot qkv[] = {ARCH_Q, ARCH_K, ARCH_V}, gate_up[] = {ARCH_GATE, ARCH_UP};
    const enum arch_slot *p = s == ARCH_QKV ? qkv : s == ARCH_GATE_UP ? gate_up : NULL;
    int n = s == ARCH_QKV ? 3 : s == ARCH_GATE_UP ? 2 : 0;
    for (int i = 0; i < n; i++) {
        parts[i] = p[i];
        rows[i] = a->t[p[i]].n; /* the split slot's shape in this model: HS, KS, KS or F, F */
    }
    return n;
}

int model_arch_tensor(const model_desc *m, const arch_layout *a, enum arch_slot s, int layer, const model_tensor **out,
                      char *err, size_t errlen)
{
    const arch_tensor *at = &a->t[s];
    enum arch_need need = arch_slot_need(a, s, layer);
    char name[sizeof m->tensors[0].name];
    *out = NULL;
    if (need == ARCH_ABSENT)
        return 0;
    if (s < ARCH_LAYER_FIRST)
        snprintf(name, sizeof name, "%s", slots[s].name);
    else
        snprintf(name, sizeof name, "blk.%d.%s", layer, slots[s].name);
    const model_tensor *t = model_tensor_find(m, name);
    if (!t)
        return need == ARCH_REQUIRED ? util_errf(err, errlen, "%s: tensor %s is missing.", m->source, name) : 0;
    if (s == ARCH_ROUTER && (t->n_dims != 2 || t->ne[0] != (uint64_t)at->k || t->ne[1] != (uint64_t)at->n))
        return util_errf(err, errlen,
                         "%s: router %s scores %llu experts from %llu inputs, but the config declares %lld experts "
                         "and a model dimension of %lld.",
                         m->source, name, (unsigned long long)t->ne[1], (unsigned long long)t->ne[0], (long long)at->n,
                         (long long)at->k);
    if (check_shape(m, name, t, at->kind, at->n, at->k, a->n_experts, err, errlen))
        return -1;
    *out = t;
    return 0;
}

int model_arch_experts(const model_desc *m, const arch_layout *a, enum arch_slot s, int layer, arch_expert *out,
                       char *err, size_t errlen)
{
    assert(s == ARCH_GATE_EXPS || s == ARCH_UP_EXPS || s == ARCH_DOWN_EXPS);
    int E = a->n_experts;
    int64_t n = a->t[s].n, k = a->t[s].k;
    const char *stem = s == ARCH_GATE_EXPS ? "ffn_gate" : s == ARCH_UP_EXPS ? "ffn_up" : "ffn_down";
    char name[sizeof m->tensors[0].name], stacked[sizeof name];
    snprintf(stacked, sizeof stacked, "blk.%d.%s", layer, slots[s].name);
    const model_tensor *t = model_tensor_find(m, stacked);
    if (t) {
        if (check_shape(m, stacked, t, ARCH_EXPERTS, n, k, E, err, errlen))
            return -1;
        for (int e = 0; e < E; e++)
            out[e] = (arch_expert){t, (int64_t)e * n};
        return 0;
    }
    if (s != ARCH_DOWN_EXPS) {
        snprintf(name, sizeof name, "blk.%d.%s", layer, slots[ARCH_GATE_UP_EXPS].name);
        if ((t = model_tensor_find(m, name))) {
            if (check_shape(m, name, t, ARCH_EXPERTS, 2 * n, k, E, err, errlen))
                return -1;
            for (int e = 0; e < E; e++)
                out[e] = (arch_expert){t, 2 * (int64_t)e * n + (s == ARCH_UP_EXPS ? n : 0)};
            return 0;
        }
    }
    /* one tensor per expert: every index must be one of the E the config declares */
    int pl = snprintf(name, sizeof name, "blk.%d.%s.", layer, stem);
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *x = &m->tensors[i];
        char *end;
        if (x->layer != layer || strncmp(x->name, name, (size_t)pl) || x->name[pl] < '0' || x->name[pl] > '9')
            continue;
        long e = strtol(x->name + pl, &end, 10);
        if (!strcmp(end, ".weight") && e >= E)
            return util_errf(err, errlen,
                             "%s: tensor %s is expert %ld of layer %d, but the config declares %d experts (0 to %d).",
                             m->source, x->src_name, e, layer, E, E - 1);
    }
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, "blk.%d.%s.%d.weight", layer, stem, e);
        if (!(t = model_tensor_find(m, name)))
            return util_errf(err, errlen,
                             "%s: expert %d of layer %d has no %s matrix (neither tensor %s nor a stacked %s), but "
                             "the config declares %d experts.",
                             m->source, e, layer, stem + 4, name, stacked, E);
        if (check_shape(m, t->src_name, t, ARCH_MATRIX, n, k, E, err, errlen))
            return -1;
        out[e] = (arch_expert){t, 0};
    }
    return 0;
}
