/*
 * model.c — builds a model_desc from a GGUF file or a Hugging Face directory,
 * and computes the stop set (curated tags and MODEL names are registry.c's).
 *
 * Owns: the meaning of config keys (HF config.json and GGUF `<arch>.*` keys),
 * per-layer byte ranges, the stop-id union.
 * Does not own: byte-level validation (gguf.c, safetensors.c), the families
 * and their conventions (arch.c: which family a name is, its GGUF RoPE
 * pairing, Gemma's norm offset and scales, window rules, the HF→canonical
 * tensor names, all applied here while reading), tokenization (tokenizer.c),
 * template rendering (template.c).
 *
 * Key decisions:
 *  - Canonical tensor names are GGUF's (`blk.N.attn_q.weight`), so the forward
 *    pass binds one set of names whatever the file format.
 *  - Shapes are stored GGUF-style (ne[0] fastest): an HF [out,in] weight is
 *    ne={in,out}.  RoPE style follows formats.md §4: GGUF arch `llama` stores
 *    Q/K permuted for consecutive-pair RoPE (ROPE_NORM); everything else,
 *    and every HF checkpoint, uses rotate-half (ROPE_NEOX).
 *  - The stop set is the union of every declared end id: generation_config
 *    eos (int or list), config eos, tokenizer eos/eot/eom, and the template's
 *    end-of-turn marker resolved through the vocabulary.
 *  - A curated tag's installed file without a chat template gets the tag's
 *    built-in one (templates.c); any other file is described as it is.
 */
#include "model.h"

#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arch.h"
#include "gguf.h"
#include "quant.h"
#include "registry.h"
#include "safetensors.h"
#include "templates.h"
#include "../base/util.h"

/* ---------------------------------------------------------------- helpers */

static void add_stop(model_desc *m, int64_t id)
{
    if (id < 0 || id > INT32_MAX)
        return;
    for (size_t i = 0; i < m->n_stop; i++)
        if (m->stop_ids[i] == id)
            return;
    if (m->n_stop < MODEL_MAX_STOP)
        m->stop_ids[m->n_stop++] = (int32_t)id;
}

/* End-of-turn markers real templates use; each found in the template source is
 * resolved through the vocabulary and added to the stop set. */
static const char *const eot_markers[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>",
                                          "<|endoftext|>", "</s>", "<|end_of_text|>"};

static int32_t layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4))
        return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || v < 0 || v >= MODEL_MAX_LAYERS)
        return -2;
    return (int32_t)v;
}

static int cmp_range(const void *a, const void *b)
{
    const layer_range *x = a, *y = b;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return x->file < y->file ? -1 : x->file > y->file;
}

/* Builds ranges (per layer, per file), total bytes and the quant summary from m->tensors. */
static int finish_layout(model_desc *m, char *err, size_t errlen)
{
    uint64_t counts[256] = {0};
    m->total_bytes = 0;
    m->ranges = calloc((size_t)m->n_layers + 1 > m->n_tensors ? (size_t)m->n_layers + 1 : m->n_tensors + 1,
                       sizeof *m->ranges);
    if (!m->ranges)
        return util_errf(err, errlen, "%s: out of memory describing the model.", m->source);
    m->n_ranges = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        model_tensor *t = &m->tensors[i];
        if (t->layer >= m->n_layers)
            return util_errf(err, errlen, "%s: tensor %s belongs to layer %d but the model declares %d layers.",
                             m->source, t->name, t->layer, m->n_layers);
        m->total_bytes += t->size;
        counts[t->dtype < 256 ? t->dtype : 255]++;
        layer_range *r = NULL;
        for (size_t k = 0; k < m->n_ranges; k++)
            if (m->ranges[k].layer == t->layer && m->ranges[k].file == t->file) {
                r = &m->ranges[k];
                break;
            }
        if (!r) {
            r = &m->ranges[m->n_ranges++];
            r->layer = t->layer;
            r->file = t->file;
            r->begin = t->offset;
            r->end = t->offset + t->size;
        }
        if (t->offset < r->begin)
            r->begin = t->offset;
        if (t->offset + t->size > r->end)
            r->end = t->offset + t->size;
        r->bytes += t->size;
    }
    qsort(m->ranges, m->n_ranges, sizeof *m->ranges, cmp_range);
    size_t o = 0;
    m->quant_summary[0] = 0;
    for (int ty = 0; ty < 256; ty++) {
        if (!counts[ty])
            continue;
        const char *nm = NULL;
        uint32_t be, bb;
        if (ty == SPILL_DT_F8_E4M3)
            nm = "F8_E4M3";
        else if (ty == SPILL_DT_F8_E5M2)
            nm = "F8_E5M2";
        else if (!ggml_type_info((uint32_t)ty, &nm, &be, &bb))
            nm = "other";
        int n = snprintf(m->quant_summary + o, sizeof m->quant_summary - o, "%s%s x%llu", o ? ", " : "", nm,
                         (unsigned long long)counts[ty]);
        if (n < 0 || (size_t)n >= sizeof m->quant_summary - o)
            break;
        o += (size_t)n;
    }
    if (m->layer_sliding) { /* HF layer_types said it per layer */
        for (int l = 0; l < m->n_layers; l++)
            m->layer_sliding[l] = m->layer_sliding[l] && m->sliding_window > 0;
        return 0;
    }
    m->layer_sliding = calloc((size_t)m->n_layers + 1, sizeof *m->layer_sliding);
    if (!m->layer_sliding)
        return util_errf(err, errlen, "%s: out of memory describing the model.", m->source);
    for (int l = 0; l < m->n_layers; l++)
        m->layer_sliding[l] =
            m->sliding_window > 0 && (m->sliding_pattern <= 0 || (l + 1) % m->sliding_pattern != 0);
    return 0;
}

/* Marks the sparse layers of an MoE model (n_experts > 0): layer l is sparse unless it is in only_dense (HF
 * mlp_only_layers: a JSON array of layer indices, or NULL) or (l + 1) is not a multiple of step (HF
 * decoder_sparse_step).  Leaves layer_sparse NULL for a dense model or a layer count check_dims will refuse. */
static int mark_sparse_layers(model_desc *m, json_t *only_dense, int step, char *err, size_t errlen)
{
    if (m->n_experts <= 0 || m->n_layers <= 0 || m->n_layers > MODEL_MAX_LAYERS)
        return 0;
    m->layer_sparse = calloc((size_t)m->n_layers, sizeof *m->layer_sparse);
    if (!m->layer_sparse)
        return util_errf(err, errlen, "%s: out of memory describing the model.", m->source);
    for (int l = 0; l < m->n_layers; l++)
        m->layer_sparse[l] = step <= 1 || (l + 1) % step == 0;
    for (size_t i = 0; i < json_array_size(only_dense); i++) {
        json_t *v = json_array_get(only_dense, i);
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < m->n_layers)
            m->layer_sparse[json_integer_value(v)] = false;
    }
    return 0;
}

static int check_dims(model_desc *m, char *err, size_t errlen)
{
    if (m->n_layers <= 0 || m->n_layers > MODEL_MAX_LAYERS)
        return util_errf(err, errlen, "%s: layer count %d is missing or out of range (1..%d).", m->source,
                         m->n_layers, MODEL_MAX_LAYERS);
    if (m->d_model <= 0 || m->n_heads <= 0 || m->n_kv_heads <= 0 || m->head_dim <= 0 || m->ffn_dim <= 0)
        return util_errf(err, errlen,
                         "%s: a model dimension is missing or not positive (d_model %d, heads %d, kv heads %d, head "
                         "size %d, ffn %d).",
                         m->source, m->d_model, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn_dim);
    if (m->n_heads % m->n_kv_heads != 0)
        return util_errf(err, errlen, "%s: %d attention heads are not a multiple of %d kv heads.", m->source,
                         m->n_heads, m->n_kv_heads);
    if (m->rope_dim <= 0 || m->rope_dim > m->head_dim || m->rope_dim % 2)
        return util_errf(err, errlen, "%s: rotary dimension %d must be even and at most the head size %d.", m->source,
                         m->rope_dim, m->head_dim);
    if (m->n_experts > MODEL_MAX_EXPERTS)
        return util_errf(err, errlen, "%s: %d experts per layer is more than spill's limit of %d.", m->source,
                         m->n_experts, MODEL_MAX_EXPERTS);
    if (m->n_experts > 0 && (m->n_experts_used < 1 || m->n_experts_used > m->n_experts))
        return util_errf(err, errlen, "%s: %d experts per token is not between 1 and the model's %d experts.",
                         m->source, m->n_experts_used, m->n_experts);
    if (m->n_experts > 0 && m->expert_ffn_dim <= 0)
        return util_errf(err, errlen, "%s: the experts' FFN dimension is missing or not positive (%d).", m->source,
                         m->expert_ffn_dim);
    return 0;
}

/* ---------------------------------------------------------------- GGUF */

static int gguf_int(const gguf_file *g, const char *arch, const char *suffix, int *out)
{
    char key[160];
    uint64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_get_u64(g, key, &v) || v > INT32_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

static double gguf_num(const gguf_file *g, const char *arch, const char *suffix, double dflt)
{
    char key[160];
    double v;
    uint64_t u;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_get_f64(g, key, &v))
        return v;
    if (gguf_get_u64(g, key, &u))
        return (double)u;
    return dflt;
}

/* Finds an exact token string in the GGUF vocabulary (linear scan, once per marker). */
static int64_t gguf_token_id(const gguf_file *g, const char *text)
{
    const gguf_kv *kv = gguf_get(g, "tokenizer.ggml.tokens");
    if (!kv || kv->type != GGUF_V_ARRAY || kv->arr_type != GGUF_V_STRING)
        return -1;
    size_t tl = strlen(text);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        size_t len;
        const char *s = gguf_arr_str(g, kv, i, &len);
        if (s && len == tl && !memcmp(s, text, tl))
            return (int64_t)i;
    }
    return -1;
}

static int open_gguf(const char *path, model_desc *m, char *err, size_t errlen)
{
    gguf_file *g;
    if (gguf_open(path, &g, err, errlen) != 0)
        return -1;
    m->gguf = g;
    m->format = MODEL_GGUF;
    const char *a;
    size_t al;
    if (!gguf_get_str(g, "general.architecture", &a, &al) || al == 0 || al >= sizeof m->arch)
        return util_errf(err, errlen, "%s: key general.architecture is missing or not a short string.", path);
    char arch[sizeof m->arch]; /* the GGUF key prefix, before normalisation */
    memcpy(arch, a, al);
    arch[al] = 0;
    if (gguf_int(g, arch, "expert_count", &m->n_experts))
        m->n_experts = 0;
    /* llama.cpp writes Mixtral as a `llama` file with experts */
    snprintf(m->arch, sizeof m->arch, "%s",
             !strcmp(arch, "llama") && m->n_experts > 0 ? "mixtral" : model_arch_normalise(arch));
    m->state = model_arch_state(m->arch, &m->state_note);
    const arch_family *fam = model_arch_find(m->arch);
    const char *st;
    size_t stl;
    char key[160];

    if (gguf_int(g, arch, "block_count", &m->n_layers) || gguf_int(g, arch, "embedding_length", &m->d_model) ||
        gguf_int(g, arch, "attention.head_count", &m->n_heads))
        return util_errf(err, errlen,
                         "%s: key %s.block_count, .embedding_length or .attention.head_count is missing; this GGUF "
                         "does not describe a transformer spill can read.",
                         path, arch);
    if (gguf_int(g, arch, "attention.head_count_kv", &m->n_kv_heads))
        m->n_kv_heads = m->n_heads;
    if (gguf_int(g, arch, "feed_forward_length", &m->ffn_dim))
        m->ffn_dim = 0;
    if (gguf_int(g, arch, "context_length", &m->ctx_len))
        m->ctx_len = 2048;
    if (gguf_int(g, arch, "attention.key_length", &m->head_dim))
        m->head_dim = m->n_heads ? m->d_model / m->n_heads : 0;
    if (gguf_int(g, arch, "rope.dimension_count", &m->rope_dim))
        m->rope_dim = m->head_dim;
    m->norm_eps = (float)gguf_num(g, arch, "attention.layer_norm_rms_epsilon", 1e-5);
    m->rope_theta = gguf_num(g, arch, "rope.freq_base", 10000.0);
    if (gguf_int(g, arch, "attention.sliding_window", &m->sliding_window))
        m->sliding_window = 0;
    if (gguf_int(g, arch, "expert_used_count", &m->n_experts_used))
        m->n_experts_used = 0;
    if (gguf_int(g, arch, "expert_feed_forward_length", &m->expert_ffn_dim))
        m->expert_ffn_dim = m->n_experts > 0 ? m->ffn_dim : 0; /* Mixtral: feed_forward_length is the experts' */
    if (gguf_int(g, arch, "expert_shared_feed_forward_length", &m->shared_ffn_dim))
        m->shared_ffn_dim = 0;
    /* GGUF has no key for dense layers among sparse ones: a layer is sparse when it has a router (llama.cpp's
     * files have one in every layer; spill pack keeps Qwen2-MoE's dense layers dense) */
    if (mark_sparse_layers(m, NULL, 1, err, errlen))
        return -1;
    for (int l = 0; m->layer_sparse && l < m->n_layers; l++) {
        snprintf(key, sizeof key, "blk.%d.ffn_gate_inp.weight", l);
        m->layer_sparse[l] = gguf_find_tensor(g, key) != NULL;
    }
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    bool norm;
    m->expert_norm = fam && (fam->moe_norm_always || (gguf_get_bool(g, key, &norm) ? norm : fam->gguf_moe_norm));
    m->attn_softcap = gguf_num(g, arch, "attn_logit_softcapping", 0);
    m->final_softcap = gguf_num(g, arch, "final_logit_softcapping", 0);

    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_get_str(g, key, &st, &stl)) {
        if (stl == 6 && !memcmp(st, "linear", 6))
            m->rope_scaling = ROPE_SCALE_LINEAR;
        else if (stl == 4 && !memcmp(st, "yarn", 4))
            m->rope_scaling = ROPE_SCALE_YARN;
        else if (stl == 4 && !memcmp(st, "none", 4))
            m->rope_scaling = ROPE_SCALE_NONE;
        else
            return util_errf(err, errlen, "%s: key %s has the value '%.*s', which spill does not know.", path, key,
                             (int)(stl > 40 ? 40 : stl), st);
        m->rope_factor = gguf_num(g, arch, "rope.scaling.factor", 1.0);
        m->rope_orig_ctx = (int)gguf_num(g, arch, "rope.scaling.original_context_length", 0);
    }
    /* Phi-3 longrope GGUFs carry the two factor lists as tensors */
    const gguf_tensor *fl = gguf_find_tensor(g, "rope_factors_long.weight"),
                      *fs = gguf_find_tensor(g, "rope_factors_short.weight");
    if (fl || fs) {
        size_t half = (size_t)(m->rope_dim / 2);
        for (int which = 0; which < 2; which++) {
            const gguf_tensor *ft = which ? fl : fs;
            float **dst = which ? &m->rope_long : &m->rope_short;
            if (!ft || ft->type != GGML_F32 || ft->n_dims != 1 || ft->ne[0] != half)
                return util_errf(err, errlen,
                                 "%s: longrope needs rope_factors_long.weight and rope_factors_short.weight, each %zu "
                                 "F32 values (rotary dims / 2).",
                                 path, half);
            if (!(*dst = malloc(half * sizeof **dst)))
                return util_errf(err, errlen, "%s: out of memory.", path);
            memcpy(*dst, gguf_tensor_data(g, ft), half * sizeof **dst);
        }
        m->rope_scaling = ROPE_SCALE_LONGROPE;
        m->rope_orig_ctx = (int)gguf_num(g, arch, "rope.scaling.original_context_length", 0);
        m->rope_attn_factor = gguf_num(g, arch, "rope.scaling.attn_factor", 0);
        m->rope_factor = m->rope_orig_ctx > 0 ? (double)m->ctx_len / m->rope_orig_ctx : 1.0;
        if (m->rope_orig_ctx <= 0)
            return util_errf(err, errlen,
                             "%s: key %s.rope.scaling.original_context_length is missing; longrope needs it to choose "
                             "short or long factors.",
                             path, arch);
    }
    /* Llama 3.1+ GGUFs carry the llama3 scaling baked into a rope_freqs tensor. */
    if (gguf_find_tensor(g, "rope_freqs.weight"))
        m->rope_scaling = ROPE_SCALE_LLAMA3;

    m->rope_style = fam ? fam->gguf_rope : ROPE_NEOX;
    if (fam) {
        /* what llama.cpp fixes per family rather than storing: the window pattern, the sliding layers' RoPE
         * base, Gemma's query scale (its norm weights are stored with the 1 already added) */
        m->sliding_pattern = fam->gguf_window_every;
        m->rope_theta_local = fam->gguf_rope_local;
        if (fam->query_pre_attn_scalar)
            m->query_scale = m->head_dim > 0 ? 1.0 / __builtin_sqrt((double)m->head_dim) : 0;
        /* the same conventions where the file says them (spill pack writes them from an HF config) */
        int pat;
        if (!gguf_int(g, arch, "attention.sliding_window_pattern", &pat) && pat > 0)
            m->sliding_pattern = pat;
        double swa_base = gguf_num(g, arch, "rope.freq_base_swa", 0);
        if (swa_base > 0)
            m->rope_theta_local = swa_base;
        double qv = gguf_num(g, "spill", "query_pre_attn_scalar", 0);
        if (fam->query_pre_attn_scalar && qv > 0)
            m->query_scale = 1.0 / __builtin_sqrt(qv);
    }

    /* tensors */
    m->n_files = 1;
    m->files = calloc(1, sizeof *m->files);
    m->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *m->tensors);
    if (!m->files || !m->tensors || !(m->files[0].path = strdup(path)))
        return util_errf(err, errlen, "%s: out of memory describing the model.", path);
    m->files[0].size = g->size;
    m->n_tensors = g->n_tensors;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *gt = &g->tensors[i];
        model_tensor *t = &m->tensors[i];
        snprintf(t->name, sizeof t->name, "%s", gt->name);
        snprintf(t->src_name, sizeof t->src_name, "%s", gt->name);
        t->dtype = gt->type;
        t->n_dims = gt->n_dims;
        for (int d = 0; d < 4; d++)
            t->ne[d] = d < (int)gt->n_dims ? gt->ne[d] : 1;
        t->layer = layer_of(gt->name);
        if (t->layer == -2)
            return util_errf(err, errlen, "%s: tensor %s has a malformed block number.", path, gt->name);
        /* llama.cpp's Phi-3 files call the fused gate/up projection (2F rows) ffn_up */
        const char *dot = t->layer >= 0 ? strchr(gt->name + 4, '.') : NULL;
        if (fam && !strcmp(fam->name, "phi3") && dot && !strcmp(dot, ".ffn_up.weight"))
            snprintf(t->name, sizeof t->name, "blk.%d.ffn_gate_up.weight", (int)t->layer);
        t->offset = (uint64_t)(gguf_tensor_data(g, gt) - g->data); /* absolute, whatever gguf.c stores */
        t->size = gt->size;
        if (!strcmp(gt->name, "token_embd.weight") && t->n_dims >= 2)
            m->vocab = (int)t->ne[1];
        if (m->ffn_dim == 0 && !strcmp(gt->name, "blk.0.ffn_up.weight") && t->n_dims >= 2)
            m->ffn_dim = (int)t->ne[1];
        if (!strcmp(gt->name, "blk.0.attn_q.bias"))
            m->qkv_bias = true;
        if (!strcmp(gt->name, "blk.0.attn_q_norm.weight"))
            m->qk_norm = true;
    }
    m->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    if (m->vocab == 0)
        return util_errf(err, errlen, "%s: tensor token_embd.weight is missing; the model has no embedding table.",
                         path);

    /* chat template and stop set */
    if (gguf_get_str(g, "tokenizer.chat_template", &st, &stl)) {
        m->chat_template = strndup(st, stl);
        if (!m->chat_template)
            return util_errf(err, errlen, "%s: out of memory.", path);
    }
    uint64_t id;
    m->bos_id = gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &id) && id < (uint64_t)m->vocab ? (int32_t)id : -1;
    m->eos_id = gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &id) && id < (uint64_t)m->vocab ? (int32_t)id : -1;
    add_stop(m, m->eos_id);
    if (gguf_get_u64(g, "tokenizer.ggml.eot_token_id", &id) && id < (uint64_t)m->vocab)
        add_stop(m, (int64_t)id);
    if (gguf_get_u64(g, "tokenizer.ggml.eom_token_id", &id) && id < (uint64_t)m->vocab)
        add_stop(m, (int64_t)id);
    if (m->chat_template)
        for (size_t i = 0; i < sizeof eot_markers / sizeof eot_markers[0]; i++)
            if (strstr(m->chat_template, eot_markers[i]))
                add_stop(m, gguf_token_id(g, eot_markers[i]));
    /* spill pack records the source's full stop set (an HF checkpoint's generation_config list). */
    const gguf_kv *sk = gguf_get(g, "spill.stop_ids");
    if (sk && sk->type == GGUF_V_ARRAY)
        for (uint64_t i = 0; i < sk->arr_n && i < MODEL_MAX_STOP; i++) {
            double v = gguf_arr_num(sk, i);
            if (v >= 0 && v < m->vocab)
                add_stop(m, (int64_t)v);
        }
    /* Gemma GGUFs ship no template; their turn end is <end_of_turn>. */
    if (!m->chat_template && fam && fam->gguf_turn_end)
        add_stop(m, gguf_token_id(g, fam->gguf_turn_end));
    return 0;
}

/* ---------------------------------------------------------------- HF directory */

static int json_int(json_t *o, const char *k, int dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX
               ? (int)json_integer_value(v)
               : dflt;
}

static double json_num(json_t *o, const char *k, double dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static void add_stop_json(model_desc *m, json_t *v)
{
    if (json_is_integer(v))
        add_stop(m, json_integer_value(v));
    else if (json_is_array(v))
        for (size_t i = 0; i < json_array_size(v); i++)
            if (json_is_integer(json_array_get(v, i)))
                add_stop(m, json_integer_value(json_array_get(v, i)));
}

static json_t *load_json(const char *dir, const char *name, bool required, char *err, size_t errlen, int *rc)
{
    char p[4096];
    *rc = 0;
    if (util_pathf(p, sizeof p, "%s/%s", dir, name) != 0) {
        *rc = util_errf(err, errlen, "%s: path too long.", dir);
        return NULL;
    }
    if (!util_is_file(p)) {
        if (required)
            *rc = util_errf(err, errlen, "%s: %s is missing; a Hugging Face model directory needs it.", dir, name);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        *rc = util_errf(err, errlen, "%s: line %d, column %d: %s.", p, je.line, je.column,
                        j ? "the file must hold a JSON object" : je.text);
        json_decref(j);
        return NULL;
    }
    return j;
}

static uint32_t st_to_dtype(uint32_t d)
{
    switch (d) {
    case ST_F32:
        return GGML_F32;
    case ST_F16:
        return GGML_F16;
    case ST_BF16:
        return GGML_BF16;
    case ST_F8_E4M3:
        return SPILL_DT_F8_E4M3;
    case ST_F8_E5M2:
        return SPILL_DT_F8_E5M2;
    case ST_I8:
        return GGML_I8;
    case ST_I32:
        return GGML_I32;
    default:
        return SPILL_DT_OTHER;
    }
}

/* One longrope factor list: an array of rope_dim/2 positive numbers. */
static int read_factors(const char *dir, json_t *scal, const char *key, const model_desc *m, float **out, char *err,
                        size_t errlen)
{
    json_t *a = json_object_get(scal, key);
    size_t half = (size_t)(m->rope_dim / 2);
    if (!json_is_array(a) || json_array_size(a) != half)
        return util_errf(err, errlen,
                         "%s/config.json: rope scaling field %s must be a list of %zu numbers (rotary dims / 2).", dir,
                         key, half);
    *out = malloc(half * sizeof **out);
    if (!*out)
        return util_errf(err, errlen, "%s: out of memory reading %s.", dir, key);
    for (size_t i = 0; i < half; i++) {
        json_t *v = json_array_get(a, i);
        double d = json_is_number(v) ? json_number_value(v) : 0;
        if (!(d > 0) || !isfinite(d))
            return util_errf(err, errlen, "%s/config.json: %s[%zu] must be a positive number.", dir, key, i);
        (*out)[i] = (float)d;
    }
    return 0;
}

/* Phi-3 longrope: the short and long factor lists and the pretraining length that chooses between them
 * (inside the scaling block in transformers 5, beside it in 4); the attention factor when the config sets
 * none is derived in model_arch_resolve from factor = max_position_embeddings / original. */
static int read_longrope(const char *dir, json_t *c, json_t *scal, model_desc *m, char *err, size_t errlen)
{
    m->rope_orig_ctx =
        json_int(scal, "original_max_position_embeddings", json_int(c, "original_max_position_embeddings", 0));
    if (m->rope_orig_ctx <= 0)
        return util_errf(err, errlen,
                         "%s/config.json: longrope scaling needs original_max_position_embeddings (the pretraining "
                         "length that chooses short or long factors).",
                         dir);
    if (!json_is_number(json_object_get(scal, "factor")))
        m->rope_factor = (double)m->ctx_len / m->rope_orig_ctx;
    return read_factors(dir, scal, "short_factor", m, &m->rope_short, err, errlen) ||
                   read_factors(dir, scal, "long_factor", m, &m->rope_long, err, errlen)
               ? -1
               : 0;
}

/* transformers 5's layer_types: the attention kind of every layer, which decides the sliding ones. */
static int read_layer_types(const char *dir, json_t *c, model_desc *m, char *err, size_t errlen)
{
    json_t *lt = json_object_get(c, "layer_types");
    if (!lt || json_is_null(lt))
        return 0;
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)m->n_layers || m->n_layers <= 0)
        return util_errf(err, errlen,
                         "%s/config.json: layer_types must list one attention kind for each of the %d layers; it "
                         "has %zu.",
                         dir, m->n_layers, json_is_array(lt) ? json_array_size(lt) : (size_t)0);
    m->layer_sliding = calloc((size_t)m->n_layers + 1, sizeof *m->layer_sliding);
    if (!m->layer_sliding)
        return util_errf(err, errlen, "%s: out of memory describing the model.", dir);
    for (int l = 0; l < m->n_layers; l++) {
        const char *k = json_string_value(json_array_get(lt, (size_t)l));
        if (!k || (strcmp(k, "sliding_attention") && strcmp(k, "full_attention")))
            return util_errf(err, errlen,
                             "%s/config.json: layer_types[%d] is %s; spill runs sliding_attention and full_attention "
                             "layers.",
                             dir, l, k ? k : "not a string");
        m->layer_sliding[l] = !strcmp(k, "sliding_attention");
    }
    return 0;
}

static int open_hf(const char *dir, model_desc *m, char *err, size_t errlen)
{
    int rc = 0;
    json_t *cfg = NULL, *gen = NULL, *tcfg = NULL;
    st_model *stm = NULL;
    m->format = MODEL_HF;

    cfg = load_json(dir, "config.json", true, err, errlen, &rc);
    if (!cfg)
        goto out;
    gen = load_json(dir, "generation_config.json", false, err, errlen, &rc);
    if (rc)
        goto out;
    tcfg = load_json(dir, "tokenizer_config.json", false, err, errlen, &rc);
    if (rc)
        goto out;

    json_t *tc = json_object_get(cfg, "text_config");
    json_t *c = json_is_object(tc) ? tc : cfg;
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (!mt) {
        rc = util_errf(err, errlen, "%s/config.json: field model_type is missing; spill cannot tell the architecture.",
                       dir);
        goto out;
    }
    if (json_is_object(tc) && !strcmp(mt, "gemma3"))
        mt = "gemma3_mm";
    snprintf(m->arch, sizeof m->arch, "%s", model_arch_normalise(mt));
    m->state = model_arch_state(m->arch, &m->state_note);
    const arch_family *fam = model_arch_find(m->arch);

    m->n_layers = json_int(c, "num_hidden_layers", 0);
    m->d_model = json_int(c, "hidden_size", 0);
    m->n_heads = json_int(c, "num_attention_heads", 0);
    m->n_kv_heads = json_int(c, "num_key_value_heads", m->n_heads);
    m->head_dim = json_int(c, "head_dim", m->n_heads ? m->d_model / m->n_heads : 0);
    m->ffn_dim = json_int(c, "intermediate_size", 0);
    m->vocab = json_int(c, "vocab_size", 0);
    m->ctx_len = json_int(c, "max_position_embeddings", 2048);
    m->norm_eps = (float)json_num(c, "rms_norm_eps", 1e-6);
    m->tied_embeddings = json_is_true(json_object_get(c, "tie_word_embeddings"));
    m->qkv_bias = json_is_true(json_object_get(c, "attention_bias")) ||
                  (fam && fam->tensors[ARCH_Q_BIAS] == ARCH_REQUIRED);
    m->qk_norm = fam && fam->tensors[ARCH_Q_NORM] != ARCH_ABSENT;
    /* MoE: transformers 5 names the expert count num_local_experts in every family, 4 num_experts in Qwen's */
    m->n_experts = json_int(c, "num_local_experts", json_int(c, "num_experts", 0));
    m->n_experts_used = json_int(c, "num_experts_per_tok", 0);
    if (m->n_experts > 0) {
        m->expert_ffn_dim = json_int(c, "moe_intermediate_size", m->ffn_dim); /* Mixtral: intermediate_size */
        m->shared_ffn_dim = json_int(c, "shared_expert_intermediate_size", 0);
        m->expert_norm = (fam && fam->moe_norm_always) || json_is_true(json_object_get(c, "norm_topk_prob"));
        if (m->ffn_dim == 0)
            m->ffn_dim = m->expert_ffn_dim;
        if (mark_sparse_layers(m, json_object_get(c, "mlp_only_layers"), json_int(c, "decoder_sparse_step", 1), err,
                               errlen)) {
            rc = -1;
            goto out;
        }
    }
    m->rope_style = ROPE_NEOX;

    /* RoPE: transformers ≥ 5 nests it in rope_parameters; older configs use rope_theta + rope_scaling. */
    json_t *rp = json_object_get(c, "rope_parameters");
    json_t *rs = json_object_get(c, "rope_scaling");
    if (json_is_object(rp) && json_is_object(json_object_get(rp, "full_attention"))) {
        json_t *loc = json_object_get(rp, "sliding_attention");
        m->rope_theta_local = json_num(loc, "rope_theta", 0);
        rp = json_object_get(rp, "full_attention");
    }
    /* partial rotary (Phi-3.5, Phi-4-mini): transformers 5 keeps it in rope_parameters, 4 beside it */
    double partial = json_num(rp, "partial_rotary_factor", json_num(c, "partial_rotary_factor", 1.0));
    if (!(partial > 0 && partial <= 1)) {
        rc = util_errf(err, errlen, "%s/config.json: partial_rotary_factor %g must be in (0, 1].", dir, partial);
        goto out;
    }
    m->rope_dim = (int)(m->head_dim * partial);
    m->rope_theta = json_num(rp, "rope_theta", json_num(c, "rope_theta", 10000.0));
    if (m->rope_theta_local == 0)
        m->rope_theta_local = json_num(c, "rope_local_base_freq", 0);
    json_t *scal = json_is_object(rs) ? rs : rp;
    const char *rt = json_string_value(json_object_get(scal, "rope_type"));
    if (!rt)
        rt = json_string_value(json_object_get(scal, "type"));
    if (rt && strcmp(rt, "default")) {
        if (!strcmp(rt, "linear"))
            m->rope_scaling = ROPE_SCALE_LINEAR;
        else if (!strcmp(rt, "llama3"))
            m->rope_scaling = ROPE_SCALE_LLAMA3;
        else if (!strcmp(rt, "yarn"))
            m->rope_scaling = ROPE_SCALE_YARN;
        else if (!strcmp(rt, "dynamic"))
            m->rope_scaling = ROPE_SCALE_DYNAMIC;
        else if (!strcmp(rt, "longrope") || !strcmp(rt, "su") ||
                 (fam && !strcmp(fam->name, "phi3") && !strcmp(rt, "yarn")))
            m->rope_scaling = ROPE_SCALE_LONGROPE; /* Phi3Config reads su and yarn as longrope */
        else {
            rc = util_errf(err, errlen, "%s/config.json: rope scaling type '%s' is not one spill implements.", dir,
                           rt);
            goto out;
        }
        m->rope_factor = json_num(scal, "factor", 1.0);
        m->rope_low_freq = json_num(scal, "low_freq_factor", 1.0);
        m->rope_high_freq = json_num(scal, "high_freq_factor", 4.0);
        m->rope_orig_ctx = json_int(scal, "original_max_position_embeddings", 0);
        m->rope_beta_fast = json_num(scal, "beta_fast", 32.0);
        m->rope_beta_slow = json_num(scal, "beta_slow", 1.0);
        m->rope_attn_factor = json_num(scal, "attention_factor", 0);
        if (m->rope_scaling == ROPE_SCALE_LONGROPE && (rc = read_longrope(dir, c, scal, m, err, errlen)) != 0)
            goto out;
    }
    if ((rc = read_layer_types(dir, c, m, err, errlen)) != 0)
        goto out;

    json_t *sw = json_object_get(c, "sliding_window");
    if (json_is_integer(sw) && !json_is_false(json_object_get(c, "use_sliding_window")))
        m->sliding_window = (int)json_integer_value(sw);
    m->sliding_pattern = json_int(c, "sliding_window_pattern", 0);
    if (fam && fam->hf_window_every)
        m->sliding_pattern = fam->hf_window_every;
    if (fam && fam->hf_norm_plus_one)
        m->norm_plus_one = true;
    if (fam && fam->query_pre_attn_scalar) {
        int q = json_int(c, "query_pre_attn_scalar", m->head_dim);
        m->query_scale = q > 0 ? 1.0 / __builtin_sqrt((double)q) : 0;
    }
    if (fam && fam->hf_softcap) {
        m->attn_softcap = json_num(c, "attn_logit_softcapping", 0);
        m->final_softcap = json_num(c, "final_logit_softcapping", 0);
    }

    /* tensors */
    if (m->state != ARCH_UNSUPPORTED || util_is_file(dir)) {
        if (st_model_open(dir, &stm, err, errlen) != 0) {
            rc = -1;
            goto out;
        }
        m->n_files = stm->n_shards;
        m->files = calloc(stm->n_shards, sizeof *m->files);
        m->tensors = calloc(stm->n_tensors ? stm->n_tensors : 1, sizeof *m->tensors);
        if (!m->files || !m->tensors) {
            rc = util_errf(err, errlen, "%s: out of memory describing the model.", dir);
            goto out;
        }
        for (size_t i = 0; i < stm->n_shards; i++) {
            m->files[i].path = strdup(stm->shards[i]->path);
            m->files[i].size = stm->shards[i]->file_size;
        }
        size_t n = 0;
        for (size_t i = 0; i < stm->n_tensors; i++) {
            const st_tensor *s = stm->by_name[i];
            model_tensor *t = &m->tensors[n];
            if (!model_arch_hf_canonical(fam, s->name, t->name, sizeof t->name, &t->layer))
                continue; /* rotary inv_freq buffers, vision towers, ... are not bound */
            snprintf(t->src_name, sizeof t->src_name, "%s", s->name);
            t->dtype = st_to_dtype(s->dtype);
            if (s->n_dims > 4) {
                rc = util_errf(err, errlen, "%s: tensor %s has %u dimensions; weights have at most 4.", dir, s->name,
                               s->n_dims);
                goto out;
            }
            t->n_dims = s->n_dims;
            for (int d = 0; d < 4; d++)
                t->ne[d] = d < (int)s->n_dims ? s->shape[s->n_dims - 1 - d] : 1;
            if (t->n_dims == 2 && t->ne[1] == 1)
                t->n_dims = 1; /* a [1, D] weight (Qwen2-MoE's shared_expert_gate) is the vector GGUF stores */
            t->file = s->shard;
            t->offset = s->offset;
            t->size = s->size;
            if (t->dtype == SPILL_DT_F8_E4M3) { /* an fp8 checkpoint: the weight's scale rides beside it */
                const st_tensor *sc;
                enum st_scale_kind kind;
                if (st_model_fp8_scale(stm, s, dir, &sc, &kind, err, errlen)) {
                    rc = -1;
                    goto out;
                }
                t->scale_kind = kind == ST_SCALE_TENSOR ? MODEL_SCALE_TENSOR
                                : kind == ST_SCALE_ROW  ? MODEL_SCALE_ROW
                                                        : MODEL_SCALE_BLOCK128;
                t->scale_dtype = st_to_dtype(sc->dtype);
                t->scale_file = sc->shard;
                t->scale_offset = sc->offset;
                t->scale_n = sc->size / (st_dtype_bits(sc->dtype) / 8);
            }
            if (!strcmp(t->name, "blk.0.attn_q.bias"))
                m->qkv_bias = true;
            n++;
        }
        m->n_tensors = n;
        if (!st_model_find(stm, "lm_head.weight"))
            m->tied_embeddings = true;
    }

    /* chat template: chat_template.jinja wins over tokenizer_config.json */
    char p[4096];
    size_t len;
    if (util_pathf(p, sizeof p, "%s/chat_template.jinja", dir) == 0 && util_is_file(p)) {
        if (util_read_file(p, 4u << 20, &m->chat_template, &len, err, errlen) != 0) {
            rc = -1;
            goto out;
        }
    } else {
        json_t *ct = json_object_get(tcfg, "chat_template");
        if (json_is_string(ct))
            m->chat_template = strdup(json_string_value(ct));
        else if (json_is_array(ct))
            for (size_t i = 0; i < json_array_size(ct); i++) {
                json_t *e = json_array_get(ct, i);
                if (!strcmp(json_string_value(json_object_get(e, "name")) ?: "", "default") &&
                    json_is_string(json_object_get(e, "template")))
                    m->chat_template = strdup(json_string_value(json_object_get(e, "template")));
            }
    }
    if (util_pathf(p, sizeof p, "%s/tokenizer.json", dir) == 0 && util_is_file(p))
        m->tokenizer_path = strdup(p);

    m->bos_id = json_int(gen, "bos_token_id", json_int(cfg, "bos_token_id", -1));
    m->eos_id = json_int(cfg, "eos_token_id", -1);
    add_stop_json(m, json_object_get(gen, "eos_token_id"));
    add_stop_json(m, json_object_get(cfg, "eos_token_id"));
    add_stop_json(m, json_object_get(c, "eos_token_id"));
    /* tokenizer eos and template end-of-turn resolved through added_tokens_decoder */
    json_t *atd = json_object_get(tcfg, "added_tokens_decoder");
    json_t *eos = json_object_get(tcfg, "eos_token");
    const char *eos_s = json_is_string(eos) ? json_string_value(eos) : json_string_value(json_object_get(eos, "content"));
    const char *key;
    json_t *val;
    json_object_foreach(atd, key, val)
    {
        const char *content = json_string_value(json_object_get(val, "content"));
        if (!content)
            continue;
        bool hit = eos_s && !strcmp(content, eos_s);
        for (size_t i = 0; !hit && m->chat_template && i < sizeof eot_markers / sizeof eot_markers[0]; i++)
            hit = !strcmp(content, eot_markers[i]) && strstr(m->chat_template, eot_markers[i]);
        if (hit)
            add_stop(m, strtol(key, NULL, 10));
    }
    if (m->eos_id < 0 && m->n_stop)
        m->eos_id = m->stop_ids[0];
out:
    json_decref(cfg);
    json_decref(gen);
    json_decref(tcfg);
    st_model_close(stm);
    return rc;
}

/* ---------------------------------------------------------------- open/close */

/* A curated tag's own file that carries no chat template gets the tag's built-in one (registry_entry.chat_builtin):
 * the Gemma 3 GGUF spill installs ships none, and every chat row would fail.  Only the installed file itself
 * qualifies (same device and inode as the tag's path), never a look-alike, so a file the user made keeps the
 * template it has.  The stop set needs nothing more: a GGUF without a template already stops at its family's
 * turn end (arch.c's gguf_turn_end), the marker the built-in template closes turns with. */
static int attach_builtin_template(model_desc *m, const char *path, char *err, size_t errlen)
{
    struct stat a, b;
    const registry_entry *e;
    char tagpath[4096];
    if (m->chat_template || stat(path, &a) != 0)
        return 0;
    for (size_t i = 0; registry_at(i, &e); i++) {
        const char *src = templates_builtin(e->chat_builtin);
        if (!src || util_pathf(tagpath, sizeof tagpath, "%s/models/%s", util_spill_home(), e->local) != 0 ||
            stat(tagpath, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
            continue;
        if (!(m->chat_template = strdup(src)))
            return util_errf(err, errlen, "%s: out of memory.", path);
        m->template_builtin = e->chat_builtin;
        return 0;
    }
    return 0;
}

int model_open(const char *path, model_desc **out, char *err, size_t errlen)
{
    *out = NULL;
    model_desc *m = calloc(1, sizeof *m);
    if (!m || !(m->source = strdup(path))) {
        free(m);
        return util_errf(err, errlen, "%s: out of memory.", path);
    }
    m->bos_id = m->eos_id = -1;
    int rc;
    if (util_is_dir(path))
        rc = open_hf(path, m, err, errlen);
    else
        rc = open_gguf(path, m, err, errlen);
    if (rc == 0)
        rc = attach_builtin_template(m, path, err, errlen);
    if (rc == 0 && m->state != ARCH_UNSUPPORTED)
        rc = check_dims(m, err, errlen);
    if (rc == 0)
        rc = finish_layout(m, err, errlen);
    if (rc != 0) {
        model_close(m);
        return -1;
    }
    *out = m;
    return 0;
}

const model_tensor *model_tensor_find(const model_desc *m, const char *name)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

void model_close(model_desc *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_files && m->files; i++)
        free(m->files[i].path);
    free(m->files);
    free(m->tensors);
    free(m->ranges);
    free(m->layer_sliding);
    free(m->rope_short);
    free(m->rope_long);
    free(m->layer_sparse);
    free(m->chat_template);
    free(m->tokenizer_path);
    free(m->source);
    gguf_close(m->gguf);
    free(m);
}

static const char *state_name(enum arch_state s)
{
    return s == ARCH_SUPPORTED ? "supported" : s == ARCH_EXPECTED ? "expected" : "unsupported";
}

static void human_bytes(uint64_t b, char *out, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

void model_print(const model_desc *m, FILE *f)
{
    static const char *scal[] = {"none", "linear", "llama3", "yarn", "dynamic", "longrope"};
    char tb[32];
    human_bytes(m->total_bytes, tb, sizeof tb);
    fprintf(f, "model        %s\n", m->source);
    fprintf(f, "format       %s, %zu file%s, %s in %zu tensors\n", m->format == MODEL_GGUF ? "GGUF" : "safetensors",
            m->n_files, m->n_files == 1 ? "" : "s", tb, m->n_tensors);
    fprintf(f, "architecture %s (%s: %s)\n", m->arch, state_name(m->state), m->state_note);
    if (m->state == ARCH_UNSUPPORTED && m->n_layers == 0)
        return;
    fprintf(f, "dims         L=%d D=%d H=%d K=%d S=%d F=%d V=%d ctx=%d\n", m->n_layers, m->d_model, m->n_heads,
            m->n_kv_heads, m->head_dim, m->ffn_dim, m->vocab, m->ctx_len);
    fprintf(f, "norm         RMSNorm eps=%g%s\n", (double)m->norm_eps, m->norm_plus_one ? " (weight + 1)" : "");
    fprintf(f, "rope         %s, dims %d, theta %g", m->rope_style == ROPE_NEOX ? "rotate-half" : "consecutive pairs",
            m->rope_dim, m->rope_theta);
    if (m->rope_theta_local > 0)
        fprintf(f, " (sliding layers %g)", m->rope_theta_local);
    if (m->rope_scaling)
        fprintf(f, ", scaling %s factor %g orig_ctx %d", scal[m->rope_scaling], m->rope_factor, m->rope_orig_ctx);
    fputc('\n', f);
    fprintf(f, "attention    %s%s%s", m->n_kv_heads < m->n_heads ? "GQA" : "MHA", m->qkv_bias ? ", qkv bias" : "",
            m->qk_norm ? ", q/k norm" : "");
    if (m->sliding_window) {
        int n = 0;
        for (int l = 0; l < m->n_layers; l++)
            n += m->layer_sliding[l];
        fprintf(f, ", sliding window %d on %d of %d layers", m->sliding_window, n, m->n_layers);
    }
    if (m->query_scale > 0)
        fprintf(f, ", queries scaled by %.6g", m->query_scale);
    if (m->attn_softcap > 0)
        fprintf(f, ", score softcap %g", m->attn_softcap);
    fputc('\n', f);
    if (m->final_softcap > 0)
        fprintf(f, "logits       softcap %g\n", m->final_softcap);
    if (m->n_experts) {
        fprintf(f, "experts      %d of F=%d, %d per token, weights %s", m->n_experts, m->expert_ffn_dim,
                m->n_experts_used, m->expert_norm ? "normalised over the chosen" : "as routed (not normalised)");
        if (m->shared_ffn_dim)
            fprintf(f, ", shared expert F=%d", m->shared_ffn_dim);
        int n = 0;
        for (int l = 0; l < m->n_layers && m->layer_sparse; l++)
            n += !m->layer_sparse[l];
        fprintf(f, "\ndense layers %d of %d", n, m->n_layers);
        if (n)
            fprintf(f, " (F=%d):", m->ffn_dim);
        for (int l = 0; l < m->n_layers && m->layer_sparse; l++)
            if (!m->layer_sparse[l])
                fprintf(f, " %d", l);
        fputc('\n', f);
    }
    fprintf(f, "embeddings   %s\n", m->tied_embeddings ? "tied (output head = token embedding)" : "separate output head");
    fprintf(f, "dtypes       %s\n", m->quant_summary);
    fprintf(f, "stop ids     ");
    for (size_t i = 0; i < m->n_stop; i++)
        fprintf(f, "%s%d", i ? ", " : "", m->stop_ids[i]);
    fprintf(f, "%s (bos %d)\n", m->n_stop ? "" : "none declared", m->bos_id);
    if (m->template_builtin)
        fprintf(f, "template     %s (built in, the model file has none)\n", m->template_builtin);
    else
        fprintf(f, "template     %s\n", m->chat_template ? "yes" : "none (raw prompts only)");
    fprintf(f, "layers       per-layer byte ranges (file: begin-end, bytes):\n");
    for (size_t i = 0; i < m->n_ranges; i++) {
        const layer_range *r = &m->ranges[i];
        char b[32];
        human_bytes(r->bytes, b, sizeof b);
        if (r->layer < 0)
            fprintf(f, "  globals   ");
        else
            fprintf(f, "  blk.%-5d ", r->layer);
        fprintf(f, "file %u: %llu-%llu, %s\n", r->file, (unsigned long long)r->begin, (unsigned long long)r->end, b);
    }
}

void model_fingerprint(const model_desc *m, char out[65])
{
    /* Hash of what defines the weights: architecture and dims, then every
     * bound tensor's name, dtype, shape and size, and each file's size.  Two
     * copies of the same checkpoint agree; any re-quantization or edit does not. */
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned int mdlen = 0;
    char buf[256];
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    int n = snprintf(buf, sizeof buf, "%s|%d|%d|%d|%d|%d|%d|%d|%d", m->arch, m->n_layers, m->d_model, m->n_heads,
                     m->n_kv_heads, m->head_dim, m->ffn_dim, m->vocab, m->ctx_len);
    EVP_DigestUpdate(c, buf, (size_t)n);
    if (m->n_experts > 0) { /* routing that no tensor shape shows (dense models keep their old fingerprint) */
        n = snprintf(buf, sizeof buf, "|moe %d %d %d %d %d", m->n_experts, m->n_experts_used, m->expert_ffn_dim,
                     m->shared_ffn_dim, m->expert_norm);
        EVP_DigestUpdate(c, buf, (size_t)n);
        for (int l = 0; l < m->n_layers && m->layer_sparse; l++)
            EVP_DigestUpdate(c, m->layer_sparse[l] ? "s" : "d", 1);
    }
    for (size_t i = 0; i < m->n_files; i++) {
        n = snprintf(buf, sizeof buf, "|file %llu", (unsigned long long)m->files[i].size);
        EVP_DigestUpdate(c, buf, (size_t)n);
    }
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        n = snprintf(buf, sizeof buf, "|%s %u %llu %llu %llu %llu %llu", t->name, t->dtype,
                     (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                     (unsigned long long)t->ne[3], (unsigned long long)t->size);
        EVP_DigestUpdate(c, buf, (size_t)n);
    }
    EVP_DigestFinal_ex(c, md, &mdlen);
    EVP_MD_CTX_free(c);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
    out[64] = 0;
}
