/*
 * size.c — a model's size per quant from its config's shapes, never from its files: a model not yet downloaded
 * (a curated tag, a hub repo whose config.json alone has arrived) has a size before gigabytes move.
 *
 * Owns: which weights a family has in terms of its shapes, and the bytes per weight of each quant.
 * Does not own: reading weight files (model.c), quantizing (quantize.c), the families' tensor lists (arch.c's
 * table says which optional tensors, such as Gemma's post norms or Qwen's q/k norms, a family has).
 *
 * Key decisions:
 *  - Counted from shapes: embeddings V×D (and an untied head V×D), per layer q H·S×D, k and v K·S×D each,
 *    o D×H·S, the dense MLP 3·D×F or, on sparse layers, the router E×D, E experts of 3·D×FE and a shared
 *    expert 3·D×FS with its gate D; norms and biases as vectors.  Fused tensors (Phi-3's qkv, gate_up) hold
 *    the same weights, so they count the same.
 *  - Bytes per weight are the block formats' (Q8_0 34/32, Q4_1 20/32, fp8 1 + a 16-byte header per row, its
 *    embedding table and head 2): the estimate is what
 *    `spill pack` would write within the rounding of block padding, and an upper bound for q4 (pack keeps
 *    Q4_0's 18/32 where it measures less error).
 */
#include "size.h"

#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "model.h"
#include "../base/util.h"

const char *size_quant_name(enum size_quant q)
{
    static const char *const names[SIZE_N_QUANTS] = {"bf16", "q8", "q4", "fp8"};
    return q < SIZE_N_QUANTS ? names[q] : "?";
}

static int cfg_int(const json_t *o, const char *k, int dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

int model_shape_from_config(const json_t *config, const char *where, model_shape *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const char *mt = json_string_value(json_object_get(config, "model_type"));
    if (!mt)
        return util_errf(err, errlen, "%s: field model_type is missing; spill cannot tell the architecture.", where);
    json_t *tc = json_object_get(config, "text_config");
    const json_t *c = json_is_object(tc) ? tc : config;
    snprintf(out->arch, sizeof out->arch, "%s",
             json_is_object(tc) && !strcmp(mt, "gemma3") ? "gemma3_mm" : model_arch_normalise(mt));
    out->n_layers = cfg_int(c, "num_hidden_layers", 0);
    out->d_model = cfg_int(c, "hidden_size", 0);
    out->n_heads = cfg_int(c, "num_attention_heads", 0);
    out->n_kv_heads = cfg_int(c, "num_key_value_heads", out->n_heads);
    out->head_dim = cfg_int(c, "head_dim", out->n_heads > 0 ? out->d_model / out->n_heads : 0);
    out->ffn_dim = cfg_int(c, "intermediate_size", 0);
    out->vocab = cfg_int(c, "vocab_size", 0);
    out->tied_embeddings = json_is_true(json_object_get(c, "tie_word_embeddings")) ||
                           json_is_true(json_object_get(config, "tie_word_embeddings"));
    const arch_family *fam = model_arch_find(out->arch);
    out->qkv_bias = json_is_true(json_object_get(c, "attention_bias")) ||
                    (fam && fam->tensors[ARCH_Q_BIAS] == ARCH_REQUIRED);
    const char *missing = out->n_layers <= 0  ? "num_hidden_layers"
                          : out->d_model <= 0 ? "hidden_size"
                          : out->n_heads <= 0 ? "num_attention_heads"
                          : out->vocab <= 0   ? "vocab_size"
                                              : NULL;
    if (missing)
        return util_errf(err, errlen, "%s: field %s is missing or not a positive integer; spill cannot size the model.",
                         where, missing);
    out->n_experts = cfg_int(c, "num_local_experts", cfg_int(c, "num_experts", 0));
    if (out->n_experts > 0) {
        out->expert_ffn_dim = cfg_int(c, "moe_intermediate_size", out->ffn_dim);
        out->shared_ffn_dim = cfg_int(c, "shared_expert_intermediate_size", 0);
        /* Qwen2-MoE's rule: a layer is sparse when (l + 1) % decoder_sparse_step == 0 and not in mlp_only_layers */
        int step = cfg_int(c, "decoder_sparse_step", 1);
        json_t *dense = json_object_get(c, "mlp_only_layers");
        for (int l = 0; l < out->n_layers; l++) {
            bool sparse = step > 0 && (l + 1) % step == 0;
            for (size_t i = 0; sparse && json_is_array(dense) && i < json_array_size(dense); i++)
                sparse = json_integer_value(json_array_get(dense, i)) != l;
            out->n_sparse_layers += sparse;
        }
    }
    return 0;
}

void model_shape_from_desc(const model_desc *m, model_shape *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->arch, sizeof out->arch, "%s", m->arch);
    out->n_layers = m->n_layers;
    out->d_model = m->d_model;
    out->n_heads = m->n_heads;
    out->n_kv_heads = m->n_kv_heads;
    out->head_dim = m->head_dim;
    out->ffn_dim = m->ffn_dim;
    out->vocab = m->vocab;
    out->n_experts = m->n_experts;
    out->expert_ffn_dim = m->expert_ffn_dim;
    out->shared_ffn_dim = m->shared_ffn_dim;
    for (int l = 0; m->n_experts > 0 && l < m->n_layers; l++)
        out->n_sparse_layers += !m->layer_sparse || m->layer_sparse[l];
    out->tied_embeddings = m->tied_embeddings;
    out->qkv_bias = m->qkv_bias;
}

/* Matrix weights and vector weights, counted apart (they are stored at different widths). */
static void count(const model_shape *s, uint64_t *matrices, uint64_t *vectors)
{
    const uint64_t L = (uint64_t)s->n_layers, D = (uint64_t)s->d_model, H = (uint64_t)s->n_heads,
                   K = (uint64_t)s->n_kv_heads, S = (uint64_t)s->head_dim, F = (uint64_t)s->ffn_dim,
                   V = (uint64_t)s->vocab, E = (uint64_t)s->n_experts, FE = (uint64_t)s->expert_ffn_dim,
                   FS = (uint64_t)s->shared_ffn_dim, LS = (uint64_t)s->n_sparse_layers;
    const arch_family *fam = model_arch_find(s->arch);
    uint64_t attn = D * H * S + 2 * D * K * S + H * S * D;
    uint64_t sparse_ffn = E * D + E * 3 * D * FE + (FS ? 3 * D * FS : 0);
    *matrices = V * D * (s->tied_embeddings ? 1 : 2) + L * attn + (L - LS) * 3 * D * F + LS * sparse_ffn;
    uint64_t per_layer = 2 * D; /* attention and FFN norms */
    if (s->qkv_bias)
        per_layer += (H + 2 * K) * S;
    if (fam && fam->tensors[ARCH_Q_NORM] != ARCH_ABSENT)
        per_layer += 2 * S;
    if (fam && fam->tensors[ARCH_POST_ATTN_NORM] != ARCH_ABSENT)
        per_layer += 2 * D;
    *vectors = D + L * per_layer + (FS ? LS * D : 0);
}

uint64_t model_param_count(const model_shape *s)
{
    uint64_t m, v;
    count(s, &m, &v);
    return m + v;
}

uint64_t model_size_estimate(const model_shape *s, enum size_quant q)
{
    uint64_t m, v;
    count(s, &m, &v);
    switch (q) {
    case SIZE_BF16:
        return 2 * m + 2 * v;
    case SIZE_Q8:
        return m / 32 * 34 + m % 32 * 2 + 4 * v;
    case SIZE_Q4:
        return m / 32 * 20 + m % 32 * 2 + 4 * v;
    case SIZE_FP8: { /* spill pack's fp8: the embedding table and head BF16, other matrices a byte a weight plus a
                      * 16-byte header per row (counted as rows of D: exact for the attention, ~2% high for a narrow
                      * expert down projection), vectors F32 */
        uint64_t head = (uint64_t)s->vocab * (uint64_t)s->d_model * (s->tied_embeddings ? 1 : 2);
        uint64_t rest = m > head ? m - head : 0;
        return 2 * head + rest + (s->d_model > 0 ? rest / (uint64_t)s->d_model * 16 : 0) + 4 * v;
    }
    default:
        return 0;
    }
}

void size_human(uint64_t bytes, char *out, size_t cap)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB"};
    double x = (double)bytes;
    int u = 0;
    while (x >= 1000 && u < 4) {
        x /= 1000;
        u++;
    }
    snprintf(out, cap, u == 0 ? "%.0f %s" : x < 10 ? "%.2f %s" : x < 100 ? "%.1f %s" : "%.0f %s", x, unit[u]);
}
