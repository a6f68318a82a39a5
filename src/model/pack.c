/*
 * pack.c — `spill pack`: any model spill reads → one streaming-layout GGUF.
 *
 * Owns: the output tensor order (globals first, then each layer's tensors in
 * the order the forward pass uses them, every tensor 4096-aligned, so a
 * layer is one contiguous, aligned byte range: one O_DIRECT read stream per
 * layer), the choice of each tensor's output type, the HF → GGUF metadata
 * (llama-family keys, rope scaling, tokenizer) and the HF → GGUF `llama` Q/K
 * row permutation, and the error report.
 * Does not own: reading the source (model.c describes it, pread here), block
 * encodings (quantize.c / quant.c), GGUF serialization (gguf_write.c).
 *
 * Key decisions:
 *  - Type per tensor: every 2-D weight whose rows are whole 32-blocks is
 *    requantized (q8 → Q8_0; q4 → both Q4_0 and Q4_1 are computed and the one
 *    with the lower ||W−Wq|| wins, so the choice is measured per tensor, not
 *    guessed per model), except tensors already in a type the request allows
 *    (Q8_0 for q8, Q4_0/Q4_1 for q4), which are copied; 1-D tensors (norms, biases) become F32, which costs
 *    nothing and is what forward.c converts them to anyway; `none` copies
 *    matrices byte for byte.  Requantizing an already-quantized source adds
 *    its error to the source's: the report measures against the source's
 *    dequantized values, i.e. the error pack adds.
 *  - fp8 (GGML_F8_E4M3_ROW, gguf.h: E4M3 codes with one fp32 scale per row,
 *    the row's header): every matrix with K % 16 == 0 except the embedding
 *    table and the output head, which become BF16 as the published fp8
 *    checkpoints keep them (the head's rounding goes straight into the
 *    logits, and both stay resident, so they cost no link bytes per pass).
 *    An fp8 safetensors source (F8_E4M3 + weight_scale, or weight_scale_inv
 *    per 128x128 block) is decoded with its scales (model.c bound them); a
 *    per-tensor or per-row scaled one is copied code for code with the scale
 *    in the row header (exact: the report shows 0 error), a block-scaled one
 *    is requantized per row (its error reported).  Such a source always
 *    converts, whatever the quant (`none` gives fp8 rows): raw codes without
 *    their scales are nothing an engine can run.
 *  - Rows are processed in chunks (16 MiB of fp32): read source rows,
 *    dequantize, quantize, dequantize again for the error, append to the
 *    output.  q4 keeps both candidates of one tensor in RAM until it knows
 *    which to write.
 *  - HF llama: Q and K rows are permuted exactly like convert_hf_to_gguf.py
 *    (`permute(W, H, H)` for q_proj, `permute(W, H, K)` for k_proj: within each
 *    head, output row 2j+i ← input row i·S/2 + j), so arch.c's rule (GGUF
 *    arch llama ⇒ consecutive-pair RoPE, the row's gguf_rope) holds for
 *    packed files and llama.cpp reads them too.  Which HF families pack
 *    writes is the row's hf_pack.  qwen2/qwen3/mistral use rotate-half in GGUF as in HF:
 *    no permutation.  Llama 3 RoPE scaling becomes the `rope_freqs.weight`
 *    tensor, as convert_hf_to_gguf.py writes it; Phi-3's longrope lists become
 *    `rope_factors_short.weight` / `rope_factors_long.weight` and its fused
 *    gate/up projection is called ffn_up, as llama.cpp's phi3 files have them.
 *    Gemma: norms get their 1 added (HF stores w - 1), and what llama.cpp
 *    fixes per family but an HF config sets travels as keys model.c reads
 *    back: attention.sliding_window_pattern, rope.freq_base_swa, the softcaps,
 *    and spill.query_pre_attn_scalar when it is not the head size.
 *  - HF MoE: the experts become llama.cpp's stacked tensors
 *    (blk.N.ffn_gate_exps.weight [E, FE, D], ffn_up_exps, ffn_down_exps)
 *    whether the checkpoint holds one tensor per expert or transformers 5's
 *    fused gate_up_proj: an output tensor is a list of row runs of source
 *    tensors (model_arch_experts finds them), read run by run.  The file's
 *    architecture is llama.cpp's name (qwen2moe, qwen3moe, llama for
 *    Mixtral); dense layers among sparse ones keep their dense FFN and no
 *    router, which is how model.c tells them apart in a GGUF.
 *  - HF tokenizer: no conversion to tokenizer.ggml.* (the pre-tokenizer of an
 *    arbitrary tokenizer.json has no GGUF name); the file is embedded whole as
 *    the string key `spill.tokenizer.json`, next to tokenizer.chat_template,
 *    bos/eos ids and `spill.stop_ids` (the model's full stop set).
 */
#include "pack.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/pool.h"
#include "arch.h"
#include "gguf.h"
#include "gguf_write.h"
#include "model.h"
#include "quant.h"
#include "quantize.h"
#include "../base/util.h"
#include "../base/exit.h"

#define ALIGNMENT 4096
#define RAW_F8 SPILL_DT_F8_E4M3 /* an fp8 safetensors weight: codes [rows, K], scales in a sibling tensor */
#define CHUNK_F32 (16u << 20) /* bytes of fp32 per chunk of rows */

/* ---------------------------------------------------------------- order */

/* Position of a tensor in the output: globals (-1) first, layers ascending, then by use order. */
static int use_rank(const char *name)
{
    static const char *const order[] = {
        /* globals */
        "token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight", "rope_factors_long.weight",
        "rope_factors_short.weight",
        /* per layer, as forward.c uses them */
        "attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
        "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight", "attn_qkv.weight", "attn_qkv.bias",
        "attn_output.weight", "post_attention_norm.weight", "ffn_norm.weight", "ffn_gate_inp.weight", "ffn_gate.weight",
        "ffn_up.weight", "ffn_gate_up.weight", "ffn_down.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
        "ffn_down_exps.weight", "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
        "ffn_down_shexp.weight", "post_ffw_norm.weight"};
    const char *s = name;
    if (!strncmp(name, "blk.", 4)) {
        const char *dot = strchr(name + 4, '.');
        s = dot ? dot + 1 : name;
    }
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (!strcmp(s, order[i]))
            return (int)i;
    return 1000; /* experts and anything else: after the known ones, in source order */
}

typedef struct item {
    const model_tensor *t; /* NULL for a generated tensor (gen); the first run's tensor for stacked experts */
    const float *gen;      /* generated F32 tensor (rope_freqs, Phi-3's rope_factors_*): gen_n values */
    size_t gen_n;
    arch_expert *runs;     /* stacked experts: (n_runs) runs of run_rows rows each, in output order; NULL = t whole */
    int n_runs;
    uint64_t run_rows;
    uint64_t ne[4]; /* stacked experts: the output shape [k, n, E] */
    char name[96];
    int32_t layer;
    int rank;
    size_t src_idx;
    int widx;     /* index in the writer */
    bool permute; /* HF llama Q/K rows */
    bool plus_one; /* HF Gemma norm: 1 is added to every element */
    int perm_S;   /* head size for the permutation */
} item;

static int item_cmp(const void *pa, const void *pb)
{
    const item *a = pa, *b = pb;
    if (a->layer != b->layer)
        return a->layer < b->layer ? -1 : 1;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return a->src_idx < b->src_idx ? -1 : a->src_idx > b->src_idx;
}

/* ---------------------------------------------------------------- context */

typedef struct packer {
    const pack_opts *o;
    model_desc *m;
    int *fds; /* (m->n_files) */
    gguf_w *w;
    gguf_out out;
    item *items;
    size_t n_items;
    float *rope_freqs;  /* (rope_dim/2) generated for HF Llama 3 scaling */
    spill_pool *pool;     /* rows of a chunk are converted in parallel; each thread's scratch holds one row */
    float *x;           /* chunk buffer: (rows, K) fp32 */
    uint8_t *src, *dst; /* chunk buffers: source bytes, converted bytes */
    double *rerr;       /* (rows, 3): per-row squared error of Q4_0/Q8_0, of Q4_1, squared norm */
    size_t x_cap, src_cap, dst_cap, rerr_cap;
    double err2, norm2; /* totals over requantized tensors */
    float f8tab[256];   /* e4m3 code -> fp32 */
    float *scales;      /* the RAW_F8 tensor being packed: its scale_n scales as fp32 */
    size_t scales_cap;
    uint64_t done_bytes;
    double t0, last_draw;
} packer;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads source bytes.  The source is read once, in order: its pages are dropped from the page cache right
 * after (POSIX_FADV_DONTNEED), so packing a model larger than RAM does not evict everything else. */
static int read_at(packer *p, uint32_t file, void *dst, size_t n, uint64_t off, char *err, size_t errlen)
{
    uint8_t *d = dst;
    uint64_t off0 = off, n0 = n;
    while (n) {
        ssize_t r = pread(p->fds[file], d, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return util_errf(err, errlen, "%s: read failed at byte %llu: %s.", p->m->files[file].path,
                             (unsigned long long)off, r < 0 ? strerror(errno) : "unexpected end of file");
        d += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    posix_fadvise(p->fds[file], (off_t)off0, (off_t)n0, POSIX_FADV_DONTNEED);
    return 0;
}

static int grow(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    void *b = realloc(*buf, need);
    if (!b)
        return -1;
    *buf = b;
    *cap = need;
    return 0;
}

/* Output row r of a permuted Q/K matrix comes from this source row (S = head size). */
static uint64_t perm_src_row(uint64_t r, uint64_t S)
{
    uint64_t head = r / S, rem = r % S;
    return head * S + (rem % 2) * (S / 2) + rem / 2;
}

/* A tensor with one row of data (norms, biases, any [K,1,1,1]). */
static bool is_vector(const model_tensor *t)
{
    return t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1;
}

/* The embedding table and the output head: fp8 leaves them BF16 (see the file comment). */
static bool is_head(const char *name)
{
    return !strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight");
}

/* The type a converted matrix gets (q4: Q4_0 until the measured error picks between Q4_0 and Q4_1).  fp8 rows
 * need K % 16 == 0 and the Q types K % 32 == 0; what is not whole becomes BF16 (reached only by fp8 sources,
 * which always convert). */
static uint32_t target_type(const packer *p, const item *it)
{
    enum pack_quant q = p->o->quant;
    uint64_t K = it->t ? it->t->ne[0] : 0;
    if (q == PACK_FP8 || q == PACK_NONE)
        return is_head(it->name) || K % 16 ? GGML_BF16 : GGML_F8_E4M3_ROW;
    if (q == PACK_BF16 || K % 32)
        return GGML_BF16;
    return q == PACK_Q8 ? GGML_Q8_0 : GGML_Q4_0;
}

/* 2-D+ weights are converted to target_type unless --quant none or the tensor already has a type the requested
 * quant allows (Q8_0 for q8, Q4_0/Q4_1 for q4, BF16 for bf16, fp8 rows for fp8: kept byte for byte); q8/q4 keep
 * matrices whose rows are not whole 32-blocks.  An fp8 safetensors weight always converts. */
static bool is_matrix_to_quantize(const packer *p, const item *it)
{
    const model_tensor *t = it->t;
    enum pack_quant q = p->o->quant;
    if (!t || is_vector(t) || !strstr(t->name, ".weight"))
        return false;
    if (t->dtype == RAW_F8)
        return true;
    if (q == PACK_NONE || ((q == PACK_Q8 || q == PACK_Q4) && t->ne[0] % 32))
        return false;
    if (q == PACK_FP8)
        return t->dtype != target_type(p, it);
    return q == PACK_Q8 ? t->dtype != GGML_Q8_0 : q == PACK_BF16 ? t->dtype != GGML_BF16 : t->dtype != GGML_Q4_0 && t->dtype != GGML_Q4_1;
}

/* general.file_type (llama.cpp's LLAMA_FTYPE_MOSTLY_*) of a packed quant; fp8 has none (the key is dropped). */
static uint32_t file_type_of(enum pack_quant q, bool q4_1)
{
    return q == PACK_Q8 ? 7 : q == PACK_BF16 ? 32 : q4_1 ? 3 : 2;
}

/* Bytes of one source row of K elements (RAW_F8: the codes alone). */
static int src_row_bytes(const model_tensor *t, uint64_t K, size_t *out)
{
    if (t->dtype == RAW_F8) {
        *out = (size_t)K;
        return 0;
    }
    return quant_type_supported(t->dtype) ? quant_row_bytes(t->dtype, (int64_t)K, out) : -1;
}

const char *pack_quant_name(enum pack_quant q)
{
    return q == PACK_Q8 ? "q8" : q == PACK_Q4 ? "q4" : q == PACK_BF16 ? "bf16" : q == PACK_FP8 ? "fp8" : "none";
}

int pack_quant_parse(const char *s, enum pack_quant *q)
{
    for (int k = PACK_NONE; k <= PACK_FP8; k++)
        if (!strcmp(s, pack_quant_name((enum pack_quant)k))) {
            *q = (enum pack_quant)k;
            return 0;
        }
    return -1;
}

/* ---------------------------------------------------------------- metadata */

/* Gemma's conventions that llama.cpp's keys fix per family but an HF config sets: the window pattern (which
 * layers slide), the sliding layers' RoPE base, the query scale when query_pre_attn_scalar is not the head size
 * (spill.query_pre_attn_scalar: llama.cpp has no key for it), the softcaps. */
static int gemma_keys(packer *p, const char *a, char *err, size_t errlen)
{
    const model_desc *m = p->m;
    char k[160];
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
    if (m->sliding_window > 0) {
        int pat = 0; /* the N for which "every Nth layer is global" gives this model's layers */
        for (int n = 1; n <= m->n_layers + 1 && !pat; n++) {
            bool ok = true;
            for (int l = 0; l < m->n_layers && ok; l++)
                ok = m->layer_sliding[l] == (n == m->n_layers + 1 || (l + 1) % n != 0);
            pat = ok ? n : 0;
        }
        if (!pat)
            return util_errf(err, errlen,
                             "%s: its sliding layers follow no every-Nth-layer-is-global pattern, which is all GGUF "
                             "can say; run the checkpoint as it is.",
                             m->source);
        if (gguf_w_u32(p->w, KEY("attention.sliding_window_pattern"), (uint32_t)pat, err, errlen))
            return -1;
    }
    if (m->rope_theta_local > 0 &&
        gguf_w_f32(p->w, KEY("rope.freq_base_swa"), (float)m->rope_theta_local, err, errlen))
        return -1;
    if (m->attn_softcap > 0 && gguf_w_f32(p->w, KEY("attn_logit_softcapping"), (float)m->attn_softcap, err, errlen))
        return -1;
    if (m->final_softcap > 0 &&
        gguf_w_f32(p->w, KEY("final_logit_softcapping"), (float)m->final_softcap, err, errlen))
        return -1;
#undef KEY
    double q = m->query_scale > 0 ? 1.0 / (m->query_scale * m->query_scale) : m->head_dim;
    if (fabs(q - m->head_dim) > 1e-6 * m->head_dim &&
        gguf_w_f32(p->w, "spill.query_pre_attn_scalar", (float)q, err, errlen))
        return -1;
    return 0;
}

static int hf_keys(packer *p, char *err, size_t errlen)
{
    const model_desc *m = p->m;
    gguf_w *w = p->w;
    const arch_family *fam = model_arch_find(m->arch);
    const char *a = fam && fam->gguf_name ? fam->gguf_name : m->arch;
    char k[160];
    const char *base = strrchr(m->source, '/');
    base = base && base[1] ? base + 1 : m->source;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
    if (gguf_w_str(w, "general.architecture", a, strlen(a), err, errlen) ||
        gguf_w_str(w, "general.name", base, strlen(base), err, errlen) ||
        gguf_w_u32(w, KEY("block_count"), (uint32_t)m->n_layers, err, errlen) ||
        gguf_w_u32(w, KEY("context_length"), (uint32_t)m->ctx_len, err, errlen) ||
        gguf_w_u32(w, KEY("embedding_length"), (uint32_t)m->d_model, err, errlen) ||
        gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)m->ffn_dim, err, errlen) ||
        gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)m->n_heads, err, errlen) ||
        gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)m->n_kv_heads, err, errlen) ||
        gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)m->head_dim, err, errlen) ||
        gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)m->head_dim, err, errlen) ||
        gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), m->norm_eps, err, errlen) ||
        gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)m->rope_dim, err, errlen) ||
        gguf_w_f32(w, KEY("rope.freq_base"), (float)m->rope_theta, err, errlen) ||
        gguf_w_u32(w, KEY("vocab_size"), (uint32_t)m->vocab, err, errlen))
        return -1;
    if (m->sliding_window > 0 &&
        gguf_w_u32(w, KEY("attention.sliding_window"), (uint32_t)m->sliding_window, err, errlen))
        return -1;
    if (fam && fam->hf_norm_plus_one && gemma_keys(p, a, err, errlen))
        return -1;
    if (m->n_experts > 0 &&
        (gguf_w_u32(w, KEY("expert_count"), (uint32_t)m->n_experts, err, errlen) ||
         gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)m->n_experts_used, err, errlen) ||
         gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)m->expert_ffn_dim, err, errlen) ||
         gguf_w_bool(w, KEY("expert_weights_norm"), m->expert_norm, err, errlen) ||
         (m->shared_ffn_dim > 0 &&
          gguf_w_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)m->shared_ffn_dim, err, errlen))))
        return -1;
    if (m->rope_scaling == ROPE_SCALE_LONGROPE && /* the factor lists travel as tensors (plan) */
        (gguf_w_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)m->rope_orig_ctx, err, errlen) ||
         (m->rope_attn_factor > 0 &&
          gguf_w_f32(w, KEY("rope.scaling.attn_factor"), (float)m->rope_attn_factor, err, errlen))))
        return -1;
    if (m->rope_scaling == ROPE_SCALE_LINEAR || m->rope_scaling == ROPE_SCALE_YARN) {
        const char *ty = m->rope_scaling == ROPE_SCALE_LINEAR ? "linear" : "yarn";
        if (gguf_w_str(w, KEY("rope.scaling.type"), ty, strlen(ty), err, errlen) ||
            gguf_w_f32(w, KEY("rope.scaling.factor"), (float)m->rope_factor, err, errlen) ||
            (m->rope_orig_ctx > 0 &&
             gguf_w_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)m->rope_orig_ctx, err, errlen)))
            return -1;
        if (m->rope_scaling == ROPE_SCALE_YARN &&
            (gguf_w_f32(w, KEY("rope.scaling.yarn_beta_fast"), (float)m->rope_beta_fast, err, errlen) ||
             gguf_w_f32(w, KEY("rope.scaling.yarn_beta_slow"), (float)m->rope_beta_slow, err, errlen) ||
             (m->rope_attn_factor > 0 &&
              gguf_w_f32(w, KEY("rope.scaling.attn_factor"), (float)m->rope_attn_factor, err, errlen))))
            return -1;
    }
#undef KEY
    /* tokenizer: the whole tokenizer.json, the template, the ids */
    if (m->tokenizer_path) {
        char *tj;
        size_t tl;
        if (util_read_file(m->tokenizer_path, 64u << 20, &tj, &tl, err, errlen))
            return -1;
        int rc = gguf_w_str(w, "spill.tokenizer.json", tj, tl, err, errlen);
        free(tj);
        if (rc)
            return -1;
    }
    if (m->chat_template &&
        gguf_w_str(w, "tokenizer.chat_template", m->chat_template, strlen(m->chat_template), err, errlen))
        return -1;
    if (m->bos_id >= 0 && gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)m->bos_id, err, errlen))
        return -1;
    if (m->eos_id >= 0 && gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)m->eos_id, err, errlen))
        return -1;
    if (m->n_stop && gguf_w_arr_num(w, "spill.stop_ids", GGUF_V_I32, m->stop_ids, m->n_stop, err, errlen))
        return -1;
    return 0;
}

static int gguf_keys(packer *p, char *err, size_t errlen)
{
    const gguf_file *g = p->m->gguf;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        if (!strcmp(kv->key, "general.alignment") || !strncmp(kv->key, "spill.pack.", 11))
            continue;
        if (!strcmp(kv->key, "general.file_type") && p->o->quant == PACK_FP8)
            continue; /* llama.cpp has no fp8 file type */
        if (!strcmp(kv->key, "general.file_type") && p->o->quant != PACK_NONE) {
            if (gguf_w_u32(p->w, kv->key, 7, err, errlen)) /* patched once the q4 choices are known */
                return -1;
            continue;
        }
        if (gguf_w_copy_kv(p->w, g, kv, err, errlen))
            return -1;
    }
    /* a curated tag's file without a template runs with the tag's built-in one: the copy carries it */
    if (p->m->template_builtin && p->m->chat_template && !gguf_w_has(p->w, "tokenizer.chat_template") &&
        gguf_w_str(p->w, "tokenizer.chat_template", p->m->chat_template, strlen(p->m->chat_template), err, errlen))
        return -1;
    return 0;
}

/* Llama 3 frequency factors, as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes them. */
static int llama3_freqs(packer *p, char *err, size_t errlen)
{
    const model_desc *m = p->m;
    int n = m->rope_dim / 2;
    p->rope_freqs = malloc((size_t)n * sizeof *p->rope_freqs);
    if (!p->rope_freqs)
        return util_errf(err, errlen, "out of memory.");
    double old_ctx = m->rope_orig_ctx > 0 ? m->rope_orig_ctx : 8192;
    double lo_wl = old_ctx / m->rope_low_freq, hi_wl = old_ctx / m->rope_high_freq;
    for (int i = 0; i < n; i++) {
        float freq = 1.0f / powf((float)m->rope_theta, (float)(2 * i) / (float)m->rope_dim);
        double wl = 2 * M_PI / freq, f;
        if (wl < hi_wl)
            f = 1;
        else if (wl > lo_wl)
            f = m->rope_factor;
        else {
            double smooth = (old_ctx / wl - m->rope_low_freq) / (m->rope_high_freq - m->rope_low_freq);
            f = 1 / ((1 - smooth) / m->rope_factor + smooth);
        }
        p->rope_freqs[i] = (float)f;
    }
    return 0;
}

/* ---------------------------------------------------------------- tensors */

static void progress(packer *p)
{
    if (!p->o->progress || now() - p->last_draw < 0.5)
        return;
    p->last_draw = now();
    fprintf(stderr, "\rpack: %5.1f%% of %.2f GB read ", 100.0 * (double)p->done_bytes / (double)(p->m->total_bytes + 1),
            p->m->total_bytes / 1e9);
}

/* One chunk of rows being converted: row i of the chunk is output row r0 + i. */
typedef struct row_job {
    packer *p;
    const model_tensor *t;
    const item *it;
    uint64_t r0, K, S;
    size_t srow, qrow, q1row;
    bool quantize, q4;
    uint32_t qt;
    uint8_t *cand0, *cand1; /* q4: whole-tensor candidates */
    double *rerr;           /* (n, 3) */
    bool f8_copy;           /* RAW_F8 with one scale per tensor or row into fp8 rows: codes copied */
} row_job;

/* The scale of element k of source row r of a RAW_F8 tensor. */
static inline float raw_f8_scale(const packer *p, const model_tensor *t, uint64_t r, uint64_t k)
{
    switch (t->scale_kind) {
    case MODEL_SCALE_TENSOR:
        return p->scales[0];
    case MODEL_SCALE_ROW:
        return p->scales[r];
    default:
        return p->scales[(r / 128) * ((t->ne[0] + 127) / 128) + k / 128];
    }
}

/* Source row r (its bytes at srcp) as K floats. */
static void src_row_f32(const packer *p, const model_tensor *t, uint64_t r, const uint8_t *srcp, float *x, uint64_t K)
{
    if (t->dtype != RAW_F8) {
        quant_dequant_row(t->dtype, srcp, x, (int64_t)K);
        return;
    }
    for (uint64_t k = 0; k < K; k++)
        x[k] = p->f8tab[srcp[k]] * raw_f8_scale(p, t, r, k);
}

/* Converts row i of the chunk (a pool task): copy, to F32, or requantize with the error terms. */
static void row_task(void *vctx, int64_t task, int tid)
{
    const row_job *j = vctx;
    packer *p = j->p;
    uint64_t i = (uint64_t)task, K = j->K;
    uint64_t sr = j->it->permute ? perm_src_row(j->r0 + i, j->S) - j->r0 : i;
    const uint8_t *srcp = p->src + sr * j->srow;
    if (!j->quantize && !is_vector(j->t)) { /* copy (permuted or not) */
        memcpy(p->dst + i * j->srow, srcp, j->srow);
        return;
    }
    float *x = p->x + i * K;
    src_row_f32(p, j->t, j->r0 + sr, srcp, x, K); /* K = 1 for an element of a permuted bias */
    if (j->it->plus_one) /* Gemma HF norms are w - 1; GGUF stores w (convert_hf_to_gguf.py adds the 1) */
        for (uint64_t k = 0; k < K; k++)
            x[k] += 1.0f;
    if (!j->quantize) {
        memcpy(p->dst + i * K * 4, x, (size_t)K * 4);
        return;
    }
    float *y = pool_scratch(p->pool, tid); /* (K) */
    double nrm = 0, e0 = 0, e1 = 0;
    for (uint64_t k = 0; k < K; k++)
        nrm += (double)x[k] * x[k];
    uint8_t *q0 = j->q4 ? j->cand0 + (j->r0 + i) * j->qrow : p->dst + i * j->qrow;
    if (j->f8_copy) { /* the source's codes under its own scale: nothing is rounded */
        float sc = raw_f8_scale(p, j->t, j->r0 + sr, 0);
        memcpy(q0, &sc, 4);
        memset(q0 + 4, 0, 12);
        memcpy(q0 + 16, srcp, (size_t)K);
        j->rerr[3 * i] = 0, j->rerr[3 * i + 1] = 0, j->rerr[3 * i + 2] = nrm;
        return;
    }
    quantize_row(j->qt, x, q0, (int64_t)K);
    quant_dequant_row(j->qt, q0, y, (int64_t)K);
    for (uint64_t k = 0; k < K; k++)
        e0 += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
    if (j->q4) {
        uint8_t *q1 = j->cand1 + (j->r0 + i) * j->q1row;
        quantize_row(GGML_Q4_1, x, q1, (int64_t)K);
        quant_dequant_row(GGML_Q4_1, q1, y, (int64_t)K);
        for (uint64_t k = 0; k < K; k++)
            e1 += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
    }
    j->rerr[3 * i] = e0, j->rerr[3 * i + 1] = e1, j->rerr[3 * i + 2] = nrm;
}

/* Reads rows [r0, r0 + n) of item it (rows of srow bytes) into p->src, run by run for stacked experts. */
static int read_rows(packer *p, const item *it, uint64_t r0, uint64_t n, size_t srow, char *err, size_t errlen)
{
    if (!it->runs)
        return read_at(p, it->t->file, p->src, (size_t)(n * srow), it->t->offset + r0 * srow, err, errlen);
    for (uint64_t done = 0; done < n;) {
        uint64_t r = r0 + done, in = r % it->run_rows;
        uint64_t take = it->run_rows - in < n - done ? it->run_rows - in : n - done;
        const arch_expert *x = &it->runs[r / it->run_rows];
        if (read_at(p, x->t->file, p->src + done * srow, (size_t)(take * srow),
                    x->t->offset + ((uint64_t)x->row0 + in) * srow, err, errlen))
            return -1;
        done += take;
    }
    return 0;
}

/*
 * Streams one tensor through: rows are read in chunks, converted, appended to
 * the output (or, for q4, to the two candidate buffers).  Fills the report's
 * error for requantized tensors.
 */
static int pack_tensor(packer *p, item *it, pack_tensor_report *r, char *err, size_t errlen)
{
    const model_tensor *t = it->t;
    const model_desc *m = p->m;
    snprintf(r->name, sizeof r->name, "%s", it->name);
    r->permuted = it->permute;
    if (!t) { /* generated: rope_freqs, rope_factors_* */
        (void)m;
        r->src_type = r->dst_type = GGML_F32;
        r->dst_bytes = (uint64_t)it->gen_n * 4;
        return gguf_out_write(&p->out, it->gen, (size_t)r->dst_bytes, err, errlen);
    }
    r->src_type = t->dtype;
    uint64_t K = t->ne[0], rows = it->runs ? (uint64_t)it->n_runs * it->run_rows : t->ne[1] * t->ne[2] * t->ne[3];
    size_t srow, qrow = 0, q1row = 0;
    if (src_row_bytes(t, K, &srow) != 0)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which pack cannot read.", m->source, t->name,
                         quant_type_name(t->dtype));
    r->src_bytes = it->runs ? rows * srow : t->size;
    bool quantize = is_matrix_to_quantize(p, it);
    bool to_f32 = is_vector(t);
    uint32_t qt = target_type(p, it);
    bool q4 = quantize && qt == GGML_Q4_0;
    bool f8_copy = t->dtype == RAW_F8 && qt == GGML_F8_E4M3_ROW && t->scale_kind != MODEL_SCALE_BLOCK128;
    if (t->dtype == RAW_F8) { /* its scales as fp32, whole (N or N*K/16384 values: small) */
        size_t sb = quant_block_bytes(t->scale_dtype) * (size_t)t->scale_n;
        if (grow((void **)&p->scales, &p->scales_cap, (size_t)t->scale_n * 4 + sb) ||
            grow((void **)&p->src, &p->src_cap, sb))
            return util_errf(err, errlen, "out of memory reading the scales of %s.", t->name);
        if (read_at(p, t->scale_file, p->src, sb, t->scale_offset, err, errlen))
            return -1;
        quant_dequant_row(t->scale_dtype, p->src, p->scales, (int64_t)t->scale_n);
    }
    if (quantize) {
        quant_row_bytes(qt, (int64_t)K, &qrow);
        if (q4)
            quant_row_bytes(GGML_Q4_1, (int64_t)K, &q1row);
    }
    /* a 1-D tensor is one "row" of K elements; a permuted bias is handled as K rows of 1 element */
    uint64_t S = (uint64_t)it->perm_S;
    if (to_f32 && it->permute) {
        if (quant_block_elems(t->dtype) != 1)
            return util_errf(err, errlen, "%s: bias %s is stored as %s; pack permutes only F32/F16/BF16 biases.",
                             m->source, t->name, quant_type_name(t->dtype));
        rows = K;
        K = 1;
        srow = srow / t->ne[0];
    }
    uint64_t chunk = CHUNK_F32 / (K * 4);
    if (chunk < 1)
        chunk = 1;
    if (it->permute) /* whole heads per chunk, so every source row of the chunk is inside it */
        chunk = chunk < S ? S : chunk / S * S;
    if (chunk > rows)
        chunk = rows;
    size_t obytes = quantize ? qrow : to_f32 ? (size_t)K * 4 : srow;
    if (grow((void **)&p->src, &p->src_cap, (size_t)(chunk * srow)) ||
        grow((void **)&p->x, &p->x_cap, (size_t)(chunk * K * 4)) ||
        grow((void **)&p->dst, &p->dst_cap, (size_t)(chunk * obytes)) ||
        grow((void **)&p->rerr, &p->rerr_cap, (size_t)chunk * 3 * sizeof(double)))
        return util_errf(err, errlen, "out of memory packing %s.", t->name);
    uint8_t *cand0 = NULL, *cand1 = NULL; /* q4: whole-tensor Q4_0 / Q4_1 encodings */
    double e0 = 0, e1 = 0, nrm = 0;
    int rc = -1;
    if (q4) {
        cand0 = malloc((size_t)(rows * qrow));
        cand1 = malloc((size_t)(rows * q1row));
        if (!cand0 || !cand1) {
            util_errf(err, errlen, "out of memory holding the two Q4 encodings of %s (%.1f GB).", t->name,
                      (double)rows * (double)(qrow + q1row) / 1e9);
            goto out;
        }
    }
    for (uint64_t r0 = 0; r0 < rows; r0 += chunk) {
        uint64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        if (r0 + n < rows && !it->runs) /* let the kernel read the next chunk while this one is converted */
            posix_fadvise(p->fds[t->file], (off_t)(t->offset + (r0 + n) * srow),
                          (off_t)((rows - r0 - n < chunk ? rows - r0 - n : chunk) * srow), POSIX_FADV_WILLNEED);
        if (read_rows(p, it, r0, n, srow, err, errlen))
            goto out;
        p->done_bytes += n * srow;
        row_job j = {p, t, it, r0, K, S, srow, qrow, q1row, quantize, q4, qt, cand0, cand1, p->rerr, f8_copy};
        pool_run(p->pool, row_task, &j, (int64_t)n);
        for (uint64_t i = 0; quantize && i < n; i++) { /* summed in row order: the same for any thread count */
            e0 += p->rerr[3 * i];
            e1 += p->rerr[3 * i + 1];
            nrm += p->rerr[3 * i + 2];
        }
        if (!q4 && gguf_out_write(&p->out, p->dst, (size_t)(n * obytes), err, errlen))
            goto out;
        progress(p);
    }
    r->dst_type = quantize ? qt : to_f32 ? GGML_F32 : t->dtype;
    if (q4) {
        bool use1 = e1 < e0;
        r->dst_type = use1 ? GGML_Q4_1 : GGML_Q4_0;
        r->alt_err = nrm > 0 ? sqrt(use1 ? e0 : e1) / sqrt(nrm) : 0;
        if (use1)
            e0 = e1;
        if (gguf_w_set_type(p->w, it->widx, r->dst_type, err, errlen) ||
            gguf_out_write(&p->out, use1 ? cand1 : cand0, (size_t)(rows * (use1 ? q1row : qrow)), err, errlen))
            goto out;
    }
    if (quantize) {
        r->requantized = true;
        r->rel_err = nrm > 0 ? sqrt(e0) / sqrt(nrm) : 0;
        p->err2 += e0;
        p->norm2 += nrm;
    }
    r->dst_bytes = gguf_w_tensor_bytes(p->w, it->widx);
    rc = 0;
out:
    free(cand0);
    free(cand1);
    return rc;
}

/* ---------------------------------------------------------------- the whole */

/* An HF expert tensor: one expert's own (blk.N.ffn_up.E.weight) or transformers 5's 3-D ones; stacked instead. */
static bool is_hf_expert(const model_tensor *t)
{
    const char *s = t->layer >= 0 ? strchr(t->name + 4, '.') + 1 : t->name;
    if (!strcmp(s, "ffn_gate_up_exps.weight") || !strcmp(s, "ffn_down_exps.weight"))
        return true;
    for (const char *stem = "ffn_gate.\0ffn_up.\0ffn_down.\0"; *stem; stem += strlen(stem) + 1)
        if (!strncmp(s, stem, strlen(stem)) && s[strlen(stem)] >= '0' && s[strlen(stem)] <= '9')
            return true;
    return false;
}

/* Adds each sparse layer's gate, up and down experts as stacked items: E runs of FE (down: D) rows. */
static int stack_experts(packer *p, char *err, size_t errlen)
{
    const model_desc *m = p->m;
    arch_layout a;
    if (model_arch_resolve(m, ARCH_ENGINE_CPU, &a, err, errlen))
        return -1;
    static const enum arch_slot slots[3] = {ARCH_GATE_EXPS, ARCH_UP_EXPS, ARCH_DOWN_EXPS};
    for (int l = 0; l < m->n_layers; l++)
        for (int i = 0; i < 3 && arch_layer_sparse(&a, l); i++) {
            item *it = &p->items[p->n_items++];
            if (!(it->runs = calloc((size_t)a.n_experts, sizeof *it->runs)))
                return util_errf(err, errlen, "out of memory.");
            if (model_arch_experts(m, &a, slots[i], l, it->runs, err, errlen))
                return -1;
            for (int e = 1; e < a.n_experts; e++)
                if (it->runs[e].t->dtype != it->runs[0].t->dtype)
                    return util_errf(err, errlen,
                                     "%s: the experts of layer %d are stored as %s and %s; pack stacks them only "
                                     "when they share one dtype.",
                                     m->source, l, quant_type_name(it->runs[0].t->dtype),
                                     quant_type_name(it->runs[e].t->dtype));
            if (it->runs[0].t->dtype == RAW_F8)
                return util_errf(err, errlen,
                                 "%s: the experts of layer %d are F8_E4M3; pack does not read fp8 experts yet "
                                 "(their scales are per expert).",
                                 m->source, l);
            it->t = it->runs[0].t;
            it->n_runs = a.n_experts;
            it->run_rows = (uint64_t)a.t[slots[i]].n;
            uint64_t ne[4] = {(uint64_t)a.t[slots[i]].k, it->run_rows, (uint64_t)a.n_experts, 1};
            memcpy(it->ne, ne, sizeof ne);
            snprintf(it->name, sizeof it->name, "blk.%d.%s", l, model_arch_slot_name(slots[i]));
            it->layer = l;
            it->rank = use_rank(it->name);
            it->src_idx = m->n_tensors; /* after the source's own tensors of the same rank: none */
        }
    return 0;
}

static int plan(packer *p, char *err, size_t errlen)
{
    const model_desc *m = p->m;
    bool hf = m->format == MODEL_HF;
    bool llama3 = hf && m->rope_scaling == ROPE_SCALE_LLAMA3;
    /* GGUF families with consecutive-pair RoPE (llama) store Q/K rows permuted */
    const arch_family *fam = model_arch_find(m->arch);
    bool stack = hf && m->n_experts > 0; /* HF experts become GGUF stacked tensors */
    p->items = calloc(m->n_tensors + 3 + (stack ? 3 * (size_t)m->n_layers : 0), sizeof *p->items);
    if (!p->items)
        return util_errf(err, errlen, "out of memory.");
    if (stack && stack_experts(p, err, errlen))
        return -1;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (stack && is_hf_expert(t))
            continue;
        item *it = &p->items[p->n_items++];
        it->t = t;
        snprintf(it->name, sizeof it->name, "%s", t->name);
        /* llama.cpp's Phi-3 files call the fused gate/up projection ffn_up (model.c reads it back as gate/up) */
        const char *dot = t->layer >= 0 ? strchr(t->name + 4, '.') : NULL;
        if (fam && !strcmp(fam->name, "phi3") && dot && !strcmp(dot, ".ffn_gate_up.weight"))
            snprintf(it->name, sizeof it->name, "blk.%d.ffn_up.weight", (int)t->layer);
        it->layer = t->layer;
        it->rank = use_rank(t->name);
        it->src_idx = i;
        const char *s = t->layer >= 0 ? strchr(t->name + 4, '.') + 1 : t->name;
        it->permute = hf && fam && fam->gguf_rope == ROPE_NORM &&
                      (!strcmp(s, "attn_q.weight") || !strcmp(s, "attn_k.weight") || !strcmp(s, "attn_q.bias") ||
                       !strcmp(s, "attn_k.bias"));
        it->perm_S = m->head_dim;
        it->plus_one = m->norm_plus_one && is_vector(t) && strstr(t->name, "norm.weight");
        if (it->permute && m->rope_dim != m->head_dim)
            return util_errf(err, errlen,
                             "%s: partial rotary (%d of %d dims) with the llama Q/K permutation is not supported.",
                             m->source, m->rope_dim, m->head_dim);
        if (strlen(t->name) > 63)
            return util_errf(err, errlen, "%s: tensor name %s is longer than GGUF's 63 bytes.", m->source, t->name);
        size_t rb;
        if (src_row_bytes(t, t->ne[0], &rb))
            return util_errf(err, errlen, "%s: tensor %s is stored as %s, which pack cannot read.", m->source, t->name,
                             t->dtype == SPILL_DT_F8_E5M2 ? "F8_E5M2" : quant_type_name(t->dtype));
        if (hf && !strcmp(t->name, "rope_freqs.weight"))
            llama3 = false;
    }
    if (llama3) {
        if (llama3_freqs(p, err, errlen))
            return -1;
        item *it = &p->items[p->n_items++];
        snprintf(it->name, sizeof it->name, "rope_freqs.weight");
        it->gen = p->rope_freqs;
        it->gen_n = (size_t)(m->rope_dim / 2);
        it->layer = -1;
        it->rank = use_rank(it->name);
        it->src_idx = m->n_tensors;
    }
    if (hf && m->rope_scaling == ROPE_SCALE_LONGROPE) /* the factor lists as tensors, as llama.cpp's phi3 files */
        for (int which = 0; which < 2; which++) {
            item *it = &p->items[p->n_items++];
            snprintf(it->name, sizeof it->name, "%s", which ? "rope_factors_long.weight" : "rope_factors_short.weight");
            it->gen = which ? m->rope_long : m->rope_short;
            it->gen_n = (size_t)(m->rope_dim / 2);
            it->layer = -1;
            it->rank = use_rank(it->name);
            it->src_idx = m->n_tensors;
        }
    qsort(p->items, p->n_items, sizeof *p->items, item_cmp);
    for (size_t i = 0; i < p->n_items; i++) {
        item *it = &p->items[i];
        const model_tensor *t = it->t;
        uint64_t ne[4] = {(uint64_t)it->gen_n, 1, 1, 1};
        uint32_t nd = 1, ty = GGML_F32;
        if (t) {
            nd = it->runs ? 3 : t->n_dims;
            memcpy(ne, it->runs ? it->ne : t->ne, sizeof ne);
            ty = is_vector(t)                   ? GGML_F32
                 : is_matrix_to_quantize(p, it) ? target_type(p, it)
                                                : t->dtype;
        }
        if ((it->widx = gguf_w_tensor(p->w, it->name, nd, ne, ty, err, errlen)) < 0)
            return -1;
    }
    return 0;
}

void pack_report_free(pack_report *rep)
{
    free(rep->t);
    memset(rep, 0, sizeof *rep);
}

int pack_model(const pack_opts *o, pack_report *rep, char *err, size_t errlen)
{
    memset(rep, 0, sizeof *rep);
    packer P = {.o = o, .out = {.fd = -1}}, *p = &P;
    char path[4096];
    int rc = -1;
    P.t0 = now();
    for (int c = 0; c < 256; c++)
        P.f8tab[c] = quant_e4m3_to_fp32((uint8_t)c);
    if (model_resolve(o->model, path, sizeof path, err, errlen) || model_open(path, &p->m, err, errlen))
        return -1;
    const model_desc *m = p->m;
    if (m->state == ARCH_UNSUPPORTED) {
        util_errf(err, errlen, "%s: architecture %s cannot be packed: %s", m->source, m->arch, m->state_note);
        goto out;
    }
    const arch_family *fam = model_arch_find(m->arch);
    if (m->format == MODEL_HF && !(fam && fam->hf_pack)) {
        util_errf(err, errlen,
                  "%s: packing a Hugging Face %s checkpoint is not supported yet (llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3, "
                  "mixtral, qwen2_moe and qwen3_moe are); convert it to GGUF with llama.cpp and pack that.",
                  m->source, m->arch);
        goto out;
    }
    if (m->format == MODEL_HF && m->rope_scaling == ROPE_SCALE_DYNAMIC) {
        util_errf(err, errlen, "%s: dynamic RoPE scaling has no GGUF form; spill cannot pack it.", m->source);
        goto out;
    }
    p->fds = malloc(m->n_files * sizeof *p->fds);
    if (!p->fds) {
        util_errf(err, errlen, "out of memory.");
        goto out;
    }
    for (size_t f = 0; f < m->n_files; f++)
        p->fds[f] = -1;
    for (size_t f = 0; f < m->n_files; f++)
        if ((p->fds[f] = open(m->files[f].path, O_RDONLY | O_CLOEXEC)) < 0) {
            util_errf(err, errlen, "%s: cannot open: %s.", m->files[f].path, strerror(errno));
            goto out;
        }
    const char *qn = pack_quant_name(o->quant);
    if (gguf_w_new(ALIGNMENT, &p->w, err, errlen) ||
        (m->format == MODEL_GGUF ? gguf_keys(p, err, errlen) : hf_keys(p, err, errlen)))
        goto out;
    if (o->quant != PACK_NONE && !gguf_w_has(p->w, "general.quantization_version") &&
        gguf_w_u32(p->w, "general.quantization_version", 2, err, errlen))
        goto out;
    if (gguf_w_str(p->w, "spill.pack.quant", qn, strlen(qn), err, errlen) || plan(p, err, errlen))
        goto out;
    uint64_t max_k = 1;
    for (size_t i = 0; i < m->n_tensors; i++)
        max_k = m->tensors[i].ne[0] > max_k ? m->tensors[i].ne[0] : max_k;
    if (pool_create(o->threads, (size_t)max_k * sizeof(float), &p->pool, err, errlen))
        goto out;
    rep->t = calloc(p->n_items, sizeof *rep->t);
    if (!rep->t) {
        util_errf(err, errlen, "out of memory.");
        goto out;
    }
    rep->n = p->n_items;
    if (gguf_out_open(&p->out, o->out, gguf_w_data_start(p->w), 64u << 20, err, errlen))
        goto out;
    for (size_t i = 0; i < p->n_items; i++) {
        pack_tensor_report *r = &rep->t[i];
        if (pack_tensor(p, &p->items[i], r, err, errlen) || gguf_out_pad(&p->out, ALIGNMENT, err, errlen))
            goto out;
        rep->src_bytes += r->src_bytes;
        if (r->rel_err > rep->worst_err)
            rep->worst_err = r->rel_err;
        rep->n_q4_0 += r->dst_type == GGML_Q4_0 && o->quant == PACK_Q4;
        rep->n_q4_1 += r->dst_type == GGML_Q4_1;
    }
    /* LLAMA_FTYPE_MOSTLY_Q8_0 = 7, _Q4_0 = 2, _Q4_1 = 3 */
    if (o->quant != PACK_NONE && o->quant != PACK_FP8)
        gguf_w_patch_u32(p->w, "general.file_type", file_type_of(o->quant, rep->n_q4_1 > rep->n_q4_0));
    rep->dst_bytes = gguf_w_file_size(p->w);
    if (gguf_out_finish(&p->out, p->w, err, errlen))
        goto out;
    if (o->progress)
        fprintf(stderr, "\r%60s\r", "");
    rep->rel_err = p->norm2 > 0 ? sqrt(p->err2) / sqrt(p->norm2) : 0;
    rep->tokenizer_json = m->format == MODEL_HF && m->tokenizer_path;
    rep->seconds = now() - P.t0;
    rc = 0;
out:
    gguf_out_abort(&p->out);
    for (size_t f = 0; p->fds && f < m->n_files; f++)
        if (p->fds[f] >= 0)
            close(p->fds[f]);
    free(p->fds);
    gguf_w_free(p->w);
    for (size_t i = 0; p->items && i < p->n_items; i++)
        free(p->items[i].runs);
    free(p->items);
    free(p->rope_freqs);
    free(p->x), free(p->src), free(p->dst), free(p->rerr), free(p->scales);
    pool_free(p->pool);
    model_close(p->m);
    if (rc)
        pack_report_free(rep);
    return rc;
}

/* ---------------------------------------------------------------- command */

static int usage(void)
{
    fprintf(stderr, "usage: spill pack MODEL --quant q8|q4|bf16|fp8|none -o OUT.gguf|DIR\n");
    return SPILL_EX_USAGE;
}

int pack_main(int argc, char **argv)
{
    pack_opts o = {.quant = PACK_Q8};
    const char *q = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quant") && v)
            q = v, i++;
        else if (!strcmp(a, "-o") && v)
            o.out = v, i++;
        else if (a[0] != '-' && !o.model)
            o.model = a;
        else
            return usage();
    }
    if (!o.model || !o.out || !q)
        return usage();
    if (pack_quant_parse(q, &o.quant)) {
        fprintf(stderr, "spill pack: --quant '%s' must be q8, q4, bf16, fp8 or none.\n", q);
        return SPILL_EX_USAGE;
    }
    char full[4096];
    if (util_is_dir(o.out)) { /* -o DIR: <model name>-<quant>.gguf inside */
        char name[1024];
        snprintf(name, sizeof name, "%s", o.model);
        size_t nl = strlen(name);
        while (nl > 1 && name[nl - 1] == '/')
            name[--nl] = 0;
        char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
        char *dot = strstr(base, ".gguf");
        if (dot && dot[5] == 0)
            *dot = 0;
        if (util_pathf(full, sizeof full, "%s/%s-%s.gguf", o.out, base, q) != 0) {
            fprintf(stderr, "spill pack: output path under %s is too long.\n", o.out);
            return SPILL_EX_USAGE;
        }
        o.out = full;
    }
    o.progress = isatty(2);
    pack_report rep;
    char err[SPILL_ERRLEN];
    if (pack_model(&o, &rep, err, sizeof err) != 0) {
        fprintf(stderr, "spill pack: %s\n", err);
        return SPILL_EX_DATAERR;
    }
    printf("%-40s %-7s %-7s %12s %12s %9s\n", "tensor", "from", "to", "bytes in", "bytes out", "rel err");
    for (size_t i = 0; i < rep.n; i++) {
        const pack_tensor_report *r = &rep.t[i];
        printf("%-40s %-7s %-7s %12llu %12llu ", r->name,
               r->src_type == RAW_F8 ? "F8_E4M3" : quant_type_name(r->src_type), quant_type_name(r->dst_type),
               (unsigned long long)r->src_bytes, (unsigned long long)r->dst_bytes);
        if (r->requantized)
            printf("%8.3f%%", 100 * r->rel_err);
        else
            printf("%9s", "-");
        if (r->alt_err > 0)
            printf("  (%s: %.3f%%)", r->dst_type == GGML_Q4_0 ? "Q4_1" : "Q4_0", 100 * r->alt_err);
        printf("%s\n", r->permuted ? "  [Q/K rows permuted for GGUF llama RoPE]" : "");
    }
    double saved = (double)rep.src_bytes - (double)rep.dst_bytes;
    printf("\nwrote %s: %.3f GB (source weights %.3f GB, %s %.3f GB = %.1f%%) in %.1f s\n", o.out, rep.dst_bytes / 1e9,
           rep.src_bytes / 1e9, saved >= 0 ? "saved" : "grew by", fabs(saved) / 1e9,
           rep.src_bytes ? 100 * fabs(saved) / (double)rep.src_bytes : 0.0, rep.seconds);
    if (o.quant != PACK_NONE)
        printf("relative error ||W-Wq||/||W|| over requantized tensors: %.3f%% overall, %.3f%% worst%s\n",
               100 * rep.rel_err, 100 * rep.worst_err, "");
    if (o.quant == PACK_Q4)
        printf("Q4 type chosen by measured error: Q4_0 x%zu, Q4_1 x%zu\n", rep.n_q4_0, rep.n_q4_1);
    if (rep.tokenizer_json)
        printf("tokenizer.json embedded as spill.tokenizer.json\n");
    pack_report_free(&rep);
    return 0;
}
