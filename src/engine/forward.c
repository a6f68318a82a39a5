/*
 * forward.c — the transformer forward pass on the CPU backend, and the
 * resident engine that owns the weights it binds.
 *
 * Owns: reading the weights into RAM once (in file order, pread), binding
 * each layer's tensors into the engine's fields, and the pass itself for the
 * llama family (llama, qwen2 QKV bias, qwen3 q/k norm, mistral sliding window)
 * with the Gemma hooks (post-norms, GELU, per-layer windows and RoPE bases)
 * that land later.  Matrices stay in their file dtype and are dequantized
 * inside cpu_matmul; 1-D tensors (norms, biases) are converted to fp32 once
 * here.
 *
 * Does not own: which families run and what they bind (model/arch.c: the
 * engine resolves the model once into an arch_layout and reads its tensors,
 * flags and RoPE parameters from there, never the family name), the kernels
 * (cpu.c, quant.c), a sparse layer's routed FFN (moe.c: this file binds it
 * per layer and calls it in place of the dense FFN), the LoRA deltas
 * (lora_cpu.c: this file says where each lands — after its projection's
 * matmul, before bias, q/k norm, RoPE and the activation), page allocation
 * (kv.c), scheduling or sampling.
 *
 * The pass ends at the output norm for embeddings (engine_forward_hidden: the same pass, no output projection)
 * and goes on through the projection for logits (engine_forward); both share forward_to_norm.
 *
 * Key decision: one pass = every sequence's tokens concatenated into T rows of
 * activations, so the whole batch shares each weight read; attention is the
 * only per-sequence step and reads each row's own KV pages.
 *
 * Buffers (T = tokens in the pass, R = sequences wanting logits):
 *   x (T, D) residual · h (T, D) · q (T, H*S) · k, v (T, K*S) · att (T, H*S)
 *   g, u (T, F) · last (R, D)
 */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"
#include "lora_cpu.h"
#include "moe.h"
#include "../model/arch.h"
#include "../model/gguf.h"
#include "../model/quant.h"
#include "stream.h"
#include "../base/util.h"

typedef struct wmat {
    const void *p; /* N rows of K elements in `type`; rebound every pass when streamed */
    const model_tensor *t;
    uint64_t sub; /* bytes into t where these rows start: q, k, v of a fused QKV, gate and up of a fused gate/up */
    uint32_t type;
    int64_t n, k;
} wmat;

typedef struct layer_w {
    wmat q, k, v, o, gate, up, down;
    float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffw_norm; /* (D) */
    float *q_norm, *k_norm;                                       /* (S) */
    float *bq, *bk, *bv;                                          /* (H*S), (K*S), (K*S) */
    moe_layer *moe; /* a sparse layer's FFN (in place of gate, up, down), or NULL */
} layer_w;

struct spill_engine {
    model_desc *m;
    cpu_pool *pool;
    kv_cache kv;
    int max_T, max_seqs;

    size_t n_bufs;
    uint8_t **file_buf; /* resident: per file, bytes [file_lo, file_hi) */
    uint64_t *file_lo;
    const uint8_t **tbuf; /* (n_tensors) bytes of each tensor held in RAM, NULL when streamed */
    uint64_t weight_bytes;
    stream *st; /* NULL = resident */

    wmat embd, output;
    float *out_norm; /* (D) */
    layer_w *layers; /* (L) */
    float **owned;   /* fp32 copies of 1-D tensors, freed at close */
    size_t n_owned;
    arch_layout a;             /* what the family makes of the pass: tensors, flags, RoPE parameters */
    cpu_rope rope, rope_local; /* global and sliding layers */
    cpu_rope rope_long;        /* longrope: global layers of rows past the original length */
    moe_layer *moe_layers;     /* (L) sparse layers' FFN weights (zero for dense layers); NULL for dense models */
    moe_ctx *moe;              /* the routed FFN's pass buffers */
    lora_cpu *lora;            /* the job's adapters (engine_opts.lora), or NULL */

    /* pass buffers, allocated once for max_T tokens */
    float *x, *h, *q, *k, *v, *att, *g, *u, *last;
    int32_t *pos, *seq_of;
    bool *long_rope; /* (T) the token's row is past a.rope_long_after in this pass: rotates with rope_long */
};

/* ---------------------------------------------------------------- loading */

static int read_range(int fd, uint8_t *dst, uint64_t off, uint64_t len, const char *path, char *err, size_t errlen)
{
    while (len) {
        size_t chunk = len > (64u << 20) ? (64u << 20) : (size_t)len;
        ssize_t r = pread(fd, dst, chunk, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return util_errf(err, errlen, "%s: read failed at byte %llu: %s.", path, (unsigned long long)off,
                             r < 0 ? strerror(errno) : "unexpected end of file");
        dst += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

static int load_files(spill_engine *e, bool streamed, char *err, size_t errlen)
{
    model_desc *m = e->m;
    e->n_bufs = m->n_files;
    e->file_buf = calloc(m->n_files + m->n_tensors, sizeof *e->file_buf);
    e->file_lo = calloc(m->n_files, sizeof *e->file_lo);
    e->tbuf = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *e->tbuf);
    if (!e->file_buf || !e->file_lo || !e->tbuf)
        return util_errf(err, errlen, "out of memory loading %s.", m->source);
    for (size_t f = 0; f < m->n_files; f++) {
        int fd = open(m->files[f].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return util_errf(err, errlen, "%s: cannot open: %s.", m->files[f].path, strerror(errno));
        uint64_t lo = UINT64_MAX, hi = 0;
        for (size_t i = 0; i < m->n_tensors; i++)
            if (m->tensors[i].file == f && !streamed) {
                if (m->tensors[i].offset < lo)
                    lo = m->tensors[i].offset;
                if (m->tensors[i].offset + m->tensors[i].size > hi)
                    hi = m->tensors[i].offset + m->tensors[i].size;
            }
        int rc = 0;
        if (hi > lo) { /* resident: the file's whole tensor span in one read */
            e->file_lo[f] = lo;
            e->file_buf[f] = aligned_alloc(64, (size_t)((hi - lo + 63) / 64 * 64));
            if (!e->file_buf[f])
                rc =
                    util_errf(err, errlen, "out of memory holding %llu bytes of %s in RAM; run it streamed (--stream).",
                              (unsigned long long)(hi - lo), m->files[f].path);
            else
                rc = read_range(fd, e->file_buf[f], lo, hi - lo, m->files[f].path, err, errlen);
            e->weight_bytes += hi - lo;
            for (size_t i = 0; i < m->n_tensors && !rc; i++)
                if (m->tensors[i].file == f)
                    e->tbuf[i] = e->file_buf[f] + (m->tensors[i].offset - lo);
        }
        /* streamed: globals (embedding, final norm, output head) and every 1-D tensor stay in RAM */
        for (size_t i = 0; i < m->n_tensors && streamed && !rc; i++) {
            const model_tensor *t = &m->tensors[i];
            if (t->file != f || (t->layer >= 0 && t->n_dims > 1))
                continue;
            uint8_t *b = aligned_alloc(64, (size_t)((t->size + 63) / 64 * 64 + 64));
            if (!b) {
                rc = util_errf(err, errlen, "out of memory reading %s.", t->name);
                break;
            }
            e->file_buf[m->n_files + i] = b;
            rc = read_range(fd, b, t->offset, t->size, m->files[f].path, err, errlen);
            e->tbuf[i] = b;
            e->weight_bytes += t->size;
        }
        close(fd);
        if (rc)
            return rc;
    }
    e->n_bufs = m->n_files + m->n_tensors;
    return 0;
}

static const void *tensor_ptr(const spill_engine *e, const model_tensor *t)
{
    return e->tbuf[t - e->m->tensors];
}

/* Binds slot s of layer l (arch.h) as a matrix in its file dtype; w stays zero when the model has none. */
static int bind_mat(spill_engine *e, wmat *w, enum arch_slot s, int l, char *err, size_t errlen)
{
    const model_tensor *t;
    memset(w, 0, sizeof *w);
    if (model_arch_tensor(e->m, &e->a, s, l, &t, err, errlen))
        return -1;
    if (!t)
        return 0;
    int64_t n = e->a.t[s].n, k = e->a.t[s].k;
    size_t rb;
    if (t->dtype == SPILL_DT_F8_E4M3) /* an fp8 checkpoint's codes: their scales join them in spill pack's rows */
        return util_errf(err, errlen,
                         "%s: tensor %s is an fp8 checkpoint's F8_E4M3; run it through spill run (which packs it as "
                         "fp8 once) or spill pack --quant fp8.",
                         e->m->source, t->name);
    if (!quant_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &rb) != 0)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which the CPU backend cannot multiply.",
                         e->m->source, t->name, quant_type_name(t->dtype));
    w->p = tensor_ptr(e, t);
    w->t = t;
    w->type = t->dtype;
    w->n = n;
    w->k = k;
    return 0;
}

/* Binds the fused matrix in slot s of layer l (QKV, gate/up) as consecutive row ranges: parts[i] gets rows[i]
 * rows, in order (rows are contiguous in every dtype, so a part is the tensor's bytes from its first row). */
static int bind_fused(spill_engine *e, enum arch_slot s, int l, wmat **parts, const int64_t *rows, int n_parts,
                      char *err, size_t errlen)
{
    wmat whole;
    if (bind_mat(e, &whole, s, l, err, errlen))
        return -1;
    size_t rb;
    quant_row_bytes(whole.type, whole.k, &rb);
    uint64_t sub = 0;
    for (int i = 0; i < n_parts; i++) {
        *parts[i] = whole;
        parts[i]->sub = sub;
        parts[i]->n = rows[i];
        parts[i]->p = whole.p ? (const uint8_t *)whole.p + sub : NULL;
        sub += (uint64_t)rows[i] * rb;
    }
    return 0;
}

/* Binds slot s of layer l as an fp32 copy of its 1-D tensor (NULL when the model has none). */
static int bind_vec(spill_engine *e, float **out, enum arch_slot s, int l, char *err, size_t errlen)
{
    const model_tensor *t;
    *out = NULL;
    if (model_arch_tensor(e->m, &e->a, s, l, &t, err, errlen))
        return -1;
    if (!t)
        return 0;
    int64_t n = e->a.t[s].n;
    float *v = malloc((size_t)n * sizeof *v);
    float **no = realloc(e->owned, (e->n_owned + 1) * sizeof *no);
    if (!v || !no) {
        free(v);
        if (no)
            e->owned = no;
        return util_errf(err, errlen, "out of memory binding %s.", t->name);
    }
    e->owned = no;
    e->owned[e->n_owned++] = v;
    quant_dequant_row(t->dtype, tensor_ptr(e, t), v, n);
    *out = v;
    return 0;
}

/* The fields of w that hold per-layer slot s (a matrix, a 1-D tensor), or NULL where the CPU pass has no
 * kernel that reads the slot. */
static wmat *layer_mat(layer_w *w, enum arch_slot s)
{
    switch (s) {
    case ARCH_Q:
        return &w->q;
    case ARCH_K:
        return &w->k;
    case ARCH_V:
        return &w->v;
    case ARCH_O:
        return &w->o;
    case ARCH_GATE:
        return &w->gate;
    case ARCH_UP:
        return &w->up;
    case ARCH_DOWN:
        return &w->down;
    default:
        return NULL;
    }
}

static float **layer_vec(layer_w *w, enum arch_slot s)
{
    switch (s) {
    case ARCH_ATTN_NORM:
        return &w->attn_norm;
    case ARCH_Q_BIAS:
        return &w->bq;
    case ARCH_K_BIAS:
        return &w->bk;
    case ARCH_V_BIAS:
        return &w->bv;
    case ARCH_Q_NORM:
        return &w->q_norm;
    case ARCH_K_NORM:
        return &w->k_norm;
    case ARCH_POST_ATTN_NORM:
        return &w->post_attn_norm;
    case ARCH_FFN_NORM:
        return &w->ffn_norm;
    case ARCH_POST_FFW_NORM:
        return &w->post_ffw_norm;
    default:
        return NULL;
    }
}

/* Binds the globals and every layer's tensors the layout lists, in slot order. */
static int bind_weights(spill_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    if (bind_mat(e, &e->embd, ARCH_TOKEN_EMBD, -1, err, errlen) ||
        bind_vec(e, &e->out_norm, ARCH_OUTPUT_NORM, -1, err, errlen) ||
        bind_mat(e, &e->output, ARCH_OUTPUT, -1, err, errlen))
        return -1;
    if (!e->output.p)
        e->output = e->embd; /* tied embeddings */
    e->layers = calloc((size_t)m->n_layers, sizeof *e->layers);
    if (!e->layers)
        return util_errf(err, errlen, "out of memory binding layers.");
    for (int l = 0; l < m->n_layers; l++)
        for (int s = ARCH_LAYER_FIRST; s < ARCH_SLOT_COUNT; s++) {
            if (arch_slot_need(&e->a, (enum arch_slot)s, l) == ARCH_ABSENT || arch_slot_sparse((enum arch_slot)s))
                continue; /* a sparse layer's FFN is bound by bind_moe */
            enum arch_kind kind = e->a.t[s].kind;
            layer_w *lw = &e->layers[l];
            enum arch_slot parts[ARCH_MAX_PARTS];
            int64_t rows[ARCH_MAX_PARTS];
            int np = arch_fused_parts(&e->a, (enum arch_slot)s, parts, rows);
            if (np) { /* fused: bound as row ranges of one tensor */
                wmat *dst[ARCH_MAX_PARTS];
                for (int i = 0; i < np; i++)
                    dst[i] = layer_mat(lw, parts[i]);
                if (bind_fused(e, (enum arch_slot)s, l, dst, rows, np, err, errlen))
                    return -1;
                continue;
            }
            wmat *mat = kind == ARCH_MATRIX ? layer_mat(lw, (enum arch_slot)s) : NULL;
            float **vec = kind == ARCH_VECTOR ? layer_vec(&e->layers[l], (enum arch_slot)s) : NULL;
            if (!mat && !vec)
                return util_errf(err, errlen,
                                 "%s: architecture %s needs tensor blk.%d.%s, which the CPU engine has no kernel for "
                                 "(model/arch.c marks the family wired).",
                                 m->source, m->arch, l, model_arch_slot_name((enum arch_slot)s));
            if (mat ? bind_mat(e, mat, (enum arch_slot)s, l, err, errlen)
                    : bind_vec(e, vec, (enum arch_slot)s, l, err, errlen))
                return -1;
        }
    return 0;
}

/* Binds every sparse layer's FFN (router, experts, shared expert) through moe.c. */
static int bind_moe(spill_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    if (m->n_experts <= 0)
        return 0;
    e->moe_layers = calloc((size_t)m->n_layers, sizeof *e->moe_layers);
    if (!e->moe_layers)
        return util_errf(err, errlen, "out of memory binding layers.");
    for (int l = 0; l < m->n_layers; l++)
        if (arch_layer_sparse(&e->a, l)) {
            if (moe_bind(&e->moe_layers[l], m, &e->a, l, e->tbuf, err, errlen))
                return -1;
            e->layers[l].moe = &e->moe_layers[l];
        }
    return 0;
}

/* RoPE tables of global and sliding layers (and longrope's long factors) from the layout's parameters. */
static int rope_setup(spill_engine *e, char *err, size_t errlen)
{
    return cpu_rope_init(&e->rope, &e->a.rope, err, errlen) ||
                   cpu_rope_init(&e->rope_local, &e->a.rope_local, err, errlen) ||
                   (e->a.rope_long_on && cpu_rope_init(&e->rope_long, &e->a.rope_long, err, errlen))
               ? -1
               : 0;
}

int engine_open(model_desc *m, const engine_opts *o, spill_engine **out, char *err, size_t errlen)
{
    *out = NULL;
    arch_layout a;
    if (model_arch_resolve(m, ARCH_ENGINE_CPU, &a, err, errlen))
        return -1;
    spill_engine *e = calloc(1, sizeof *e);
    if (!e)
        return util_errf(err, errlen, "out of memory.");
    e->m = m;
    e->a = a;
    e->max_T = o->max_pass_tokens > 0 ? o->max_pass_tokens : 512;
    e->max_seqs = o->max_pass_seqs > 0 ? o->max_pass_seqs : e->max_T;
    int64_t D = m->d_model, HS = (int64_t)m->n_heads * m->head_dim, KS = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t F = m->ffn_dim, T = e->max_T;
    int64_t maxK = D > HS ? D : HS;
    if (F > maxK)
        maxK = F;
    if (moe_max_k(m) > maxK)
        maxK = moe_max_k(m);
    size_t scratch = cpu_matmul_scratch_bytes(maxK);
    size_t att_scratch = (size_t)(m->ctx_len + 64) * sizeof(float);
    if (att_scratch > scratch)
        scratch = att_scratch;
    stream_opts so = {.slots = o->stream_slots > 0 ? o->stream_slots : 3, .chunk_bytes = 16u << 20, .direct = o->direct_io};
    if (load_files(e, o->stream, err, errlen) || bind_weights(e, err, errlen) || bind_moe(e, err, errlen) ||
        rope_setup(e, err, errlen) || (o->stream && stream_open(m, &so, &e->st, err, errlen)) ||
        cpu_pool_create(o->threads, scratch, &e->pool, err, errlen) ||
        (o->q8_activations &&
         (cpu_pool_set_q8_act(e->pool, true), cpu_pool_reserve_q8(e->pool, T, maxK, err, errlen))) ||
        kv_create(&e->kv, m->n_layers, m->n_kv_heads, m->head_dim, o->page_tokens > 0 ? o->page_tokens : 16,
                  o->kv_pages > 0 ? o->kv_pages : 256, err, errlen) ||
        (m->n_experts > 0 && moe_open(m, &e->a, e->pool, T, o->q8_activations, &e->moe, err, errlen)) ||
        lora_cpu_open(o->lora, m, &e->a, cpu_pool_threads(e->pool), &e->lora, err, errlen))
        goto fail;
    e->x = malloc((size_t)(T * D) * sizeof(float));
    e->h = malloc((size_t)(T * D) * sizeof(float));
    e->q = malloc((size_t)(T * HS) * sizeof(float));
    e->k = malloc((size_t)(T * KS) * sizeof(float));
    e->v = malloc((size_t)(T * KS) * sizeof(float));
    e->att = malloc((size_t)(T * HS) * sizeof(float));
    e->g = malloc((size_t)(T * F) * sizeof(float));
    e->u = malloc((size_t)(T * F) * sizeof(float));
    e->last = malloc((size_t)(T * D) * sizeof(float));
    e->pos = malloc((size_t)T * sizeof(int32_t));
    e->seq_of = malloc((size_t)T * sizeof(int32_t));
    e->long_rope = malloc((size_t)T * sizeof(bool));
    if (!e->x || !e->h || !e->q || !e->k || !e->v || !e->att || !e->g || !e->u || !e->last || !e->pos || !e->seq_of ||
        !e->long_rope) {
        util_errf(err, errlen, "out of memory for pass buffers of %d tokens; lower the per-pass token cap.", e->max_T);
        goto fail;
    }
    *out = e;
    return 0;
fail:
    engine_close(e);
    return -1;
}

void engine_mem_estimate(const model_desc *m, const engine_opts *o, int threads, uint64_t *weights, uint64_t *ring,
                         uint64_t *pass)
{
    /* load_files: resident = each file's tensor span; streamed = globals and 1-D tensors, one by one */
    uint64_t global = 0, all = 0, slot = 0, layer_bytes = 0;
    for (size_t f = 0; f < m->n_files; f++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (size_t i = 0; i < m->n_tensors; i++)
            if (m->tensors[i].file == f) {
                const model_tensor *t = &m->tensors[i];
                lo = t->offset < lo ? t->offset : lo;
                hi = t->offset + t->size > hi ? t->offset + t->size : hi;
                if (t->layer < 0 || t->n_dims == 1)
                    global += (t->size + 63) / 64 * 64 + 64;
            }
        all += hi > lo ? hi - lo : 0;
    }
    int cur = -2;
    for (size_t i = 0; i < m->n_ranges; i++) {
        const layer_range *r = &m->ranges[i];
        if (r->layer < 0)
            continue;
        if (r->layer != cur) {
            cur = r->layer;
            layer_bytes = 0;
        }
        /* stream.c's segment: 4 KiB-aligned start and end */
        layer_bytes += (r->end + 4095) / 4096 * 4096 - r->begin / 4096 * 4096;
        if (layer_bytes > slot)
            slot = layer_bytes;
    }
    int slots = o->stream_slots >= 2 ? o->stream_slots : 3;
    *weights = o->stream ? global : all;
    *ring = o->stream ? slot * (uint64_t)slots : 0;
    int64_t D = m->d_model, HS = (int64_t)m->n_heads * m->head_dim, KS = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t F = m->ffn_dim, T = o->max_pass_tokens > 0 ? o->max_pass_tokens : 512;
    int64_t maxK = D > HS ? D : HS;
    if (F > maxK)
        maxK = F;
    if (moe_max_k(m) > maxK)
        maxK = moe_max_k(m);
    uint64_t act = (uint64_t)T * (uint64_t)(3 * D + 2 * HS + 2 * KS + 2 * F) * 4 + (uint64_t)T * 9;
    uint64_t scratch = cpu_matmul_scratch_bytes(maxK), att = (uint64_t)(m->ctx_len + 64) * 4;
    if (att > scratch)
        scratch = att;
    uint64_t q8 = o->q8_activations ? (uint64_t)T * (uint64_t)(maxK + maxK / 8 + 64) : 0;
    /* moe.c reserves the 8-bit activations for T*k gathered rows */
    int64_t q8_T = m->n_experts > 0 ? T * m->n_experts_used : T;
    uint64_t moe_q8 = o->q8_activations ? (uint64_t)(q8_T - T) * (uint64_t)(maxK + maxK / 8 + 64) : 0;
    *pass = act + scratch * (uint64_t)threads + q8 + moe_q8 + moe_buffer_bytes(m, T) +
            lora_cpu_scratch_bytes(o->lora, threads);
    for (int i = 0; o->lora && i < o->lora->n; i++) /* adapters are always resident */
        *weights += o->lora->ad[i] ? o->lora->ad[i]->bytes : 0;
}

void engine_close(spill_engine *e)
{
    if (!e)
        return;
    stream_close(e->st);
    free(e->tbuf);
    for (size_t i = 0; i < e->n_bufs; i++)
        free(e->file_buf[i]);
    free(e->file_buf);
    free(e->file_lo);
    for (size_t i = 0; i < e->n_owned; i++)
        free(e->owned[i]);
    free(e->owned);
    free(e->layers);
    for (int l = 0; e->moe_layers && l < e->m->n_layers; l++)
        moe_unbind(&e->moe_layers[l]);
    free(e->moe_layers);
    moe_close(e->moe);
    lora_cpu_close(e->lora);
    cpu_pool_free(e->pool);
    kv_destroy(&e->kv);
    free(e->x), free(e->h), free(e->q), free(e->k), free(e->v), free(e->att), free(e->g), free(e->u);
    free(e->last), free(e->pos), free(e->seq_of), free(e->long_rope);
    free(e);
}

kv_cache *engine_kv(spill_engine *e)
{
    return &e->kv;
}
const model_desc *engine_model(const spill_engine *e)
{
    return e->m;
}
int engine_threads(const spill_engine *e)
{
    return cpu_pool_threads(e->pool);
}
uint64_t engine_weight_bytes(const spill_engine *e)
{
    return e->weight_bytes;
}

bool engine_stream_stats(const spill_engine *e, size_t *ring_bytes, uint64_t *bytes_read, double *wait_s,
                         double *read_s)
{
    if (!e->st)
        return false;
    *ring_bytes = stream_ring_bytes(e->st);
    stream_stats(e->st, bytes_read, wait_s, read_s);
    return true;
}

bool engine_moe_stats(const spill_engine *e, uint64_t *run, uint64_t *skipped)
{
    if (!e->moe)
        return false;
    moe_stats(e->moe, run, skipped, NULL);
    return true;
}

/* Points a streamed matrix at its bytes in the slot holding its layer. */
static void rebind(wmat *w, const stream_layer *sl)
{
    if (w->t)
        w->p = sl->base[w->t->file] + (w->t->offset - sl->file_off[w->t->file]) + w->sub;
}

/* Rotates x (T, H, S) with the layer's table; with longrope, each run of tokens whose rows are past the
 * original length rotates with the long factors instead. */
static void rope_tokens(const spill_engine *e, const cpu_rope *rope, float *x, int64_t T, int64_t H, int64_t S)
{
    if (rope != &e->rope || !e->a.rope_long_on) {
        cpu_rope_apply(rope, x, T, H, S, e->pos);
        return;
    }
    for (int64_t t = 0; t < T;) {
        int64_t n = 1;
        while (t + n < T && e->long_rope[t + n] == e->long_rope[t])
            n++;
        cpu_rope_apply(e->long_rope[t] ? &e->rope_long : &e->rope, x + t * H * S, n, H, S, e->pos + t);
        t += n;
    }
}

/* ---------------------------------------------------------------- the pass */

typedef struct att_ctx {
    spill_engine *e;
    fwd_seq *seqs;
    int layer;
    int window; /* 0 = full causal */
    float scale;
} att_ctx;

/* One (token, head) of attention: scores over the row's cached positions
 * [lo, p], softmax, weighted sum of values into att. */
static void attend(void *vctx, int64_t task, int tid)
{
    att_ctx *c = vctx;
    spill_engine *e = c->e;
    const model_desc *m = e->m;
    int H = m->n_heads, S = m->head_dim, group = m->n_heads / m->n_kv_heads;
    int64_t t = task / H;
    int h = (int)(task % H), kh = h / group;
    const fwd_seq *sq = &c->seqs[e->seq_of[t]];
    int32_t p = e->pos[t];
    int32_t lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
    const float *q = e->q + (size_t)t * (size_t)(H * S) + (size_t)h * (size_t)S;
    float *sc = cpu_pool_scratch(e->pool, tid);
    int32_t P = e->kv.page_tokens;
    /* Positions [lo, p] in runs that share one KV page (contiguous keys / values). */
    for (int32_t j = lo; j <= p;) {
        int32_t n = P - j % P < p - j + 1 ? P - j % P : p - j + 1;
        cpu_attn_scores(q, kv_key(&e->kv, sq->kv, c->layer, kh, j), n, S, sc + (j - lo));
        j += n;
    }
    float mx = -INFINITY;
    for (int32_t j = 0; j <= p - lo; j++) {
        float s = sc[j] * c->scale;
        if (e->a.attn_softcap > 0)
            s = (float)(e->a.attn_softcap * tanh(s / e->a.attn_softcap));
        sc[j] = s;
        if (s > mx)
            mx = s;
    }
    float sum = 0;
    for (int32_t j = 0; j <= p - lo; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    float inv = 1.0f / sum;
    for (int32_t j = 0; j <= p - lo; j++)
        sc[j] *= inv;
    float *o = e->att + (size_t)t * (size_t)(H * S) + (size_t)h * (size_t)S;
    memset(o, 0, (size_t)S * sizeof *o);
    for (int32_t j = lo; j <= p;) {
        int32_t n = P - j % P < p - j + 1 ? P - j % P : p - j + 1;
        cpu_attn_accum(o, sc + (j - lo), kv_value(&e->kv, sq->kv, c->layer, kh, j), n, S);
        j += n;
    }
}

static void add_bias(float *y, const float *b, int64_t T, int64_t n)
{
    if (b)
        for (int64_t t = 0; t < T; t++)
            cpu_add(y + t * n, b, n);
}

/* The gate's activation times up, element by element, split over the pool (serial, it was ~5% of a batched
 * decode pass on 2 cores with the other thread spinning): the same values whatever the split. */
typedef struct act_ctx {
    float *g;
    const float *u;
    int64_t n;
    bool gelu;
} act_ctx;

#define ACT_CHUNK 16384

static void act_task(void *vc, int64_t j, int tid)
{
    (void)tid;
    const act_ctx *c = (const act_ctx *)vc;
    int64_t a = j * ACT_CHUNK, n = c->n - a < ACT_CHUNK ? c->n - a : ACT_CHUNK;
    if (c->gelu)
        cpu_gelu_tanh_mul(c->g + a, c->u + a, n);
    else
        cpu_silu_mul(c->g + a, c->u + a, n);
}

/* e->h (T, D) = the dense FFN of the normed hidden states in e->h (layer l's, with each row's adapter). */
static int dense_ffn(spill_engine *e, const fwd_seq *seqs, const layer_w *w, int l, int64_t T, char *err,
                     size_t errlen)
{
    int64_t D = e->m->d_model, F = e->m->ffn_dim;
    cpu_mm_part gate_up[2] = {{w->gate.p, w->gate.type, F, e->g}, {w->up.p, w->up.type, F, e->u}};
    if (cpu_matmul_multi(e->pool, gate_up, 2, D, e->h, T, err, errlen))
        return -1;
    lora_io gu[2] = {{LORA_GATE, e->h, e->g}, {LORA_UP, e->h, e->u}};
    lora_cpu_apply(e->lora, e->pool, seqs, e->seq_of, l, gu, 2, T);
    act_ctx ac = {e->g, e->u, T * F, e->a.act == ARCH_ACT_GELU_TANH};
    int64_t n_act = (T * F + ACT_CHUNK - 1) / ACT_CHUNK;
    if (n_act > 1)
        cpu_pool_run(e->pool, act_task, &ac, n_act);
    else /* one chunk (decode of a few rows): waking the pool would cost more than it saves */
        act_task(&ac, 0, 0);
    if (cpu_matmul(e->pool, w->down.p, w->down.type, D, F, e->g, T, e->h, err, errlen))
        return -1;
    lora_io down = {LORA_DOWN, e->g, e->h};
    lora_cpu_apply(e->lora, e->pool, seqs, e->seq_of, l, &down, 1, T);
    return 0;
}

/* One layer for all T tokens of the pass: attention (writing this pass's K/V into
 * each row's pages first) and the feed-forward block, residuals in e->x. */
static int forward_layer(spill_engine *e, fwd_seq *seqs, const layer_w *w, int l, int64_t T, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, H = m->n_heads, K = m->n_kv_heads, S = m->head_dim;
    int64_t HS = H * S, KS = K * S;
    const arch_layout *a = &e->a;
    bool sliding = arch_layer_sliding(a, l);
    cpu_rmsnorm(e->h, e->x, w->attn_norm, T, D, m->norm_eps, a->norm_plus_one);
    cpu_mm_part qkv[3] = {{w->q.p, w->q.type, HS, e->q}, {w->k.p, w->k.type, KS, e->k}, {w->v.p, w->v.type, KS, e->v}};
    if (cpu_matmul_multi(e->pool, qkv, 3, D, e->h, T, err, errlen))
        return -1;
    lora_io qkv_lora[3] = {{LORA_Q, e->h, e->q}, {LORA_K, e->h, e->k}, {LORA_V, e->h, e->v}};
    lora_cpu_apply(e->lora, e->pool, seqs, e->seq_of, l, qkv_lora, 3, T);
    add_bias(e->q, w->bq, T, HS);
    add_bias(e->k, w->bk, T, KS);
    add_bias(e->v, w->bv, T, KS);
    if (w->q_norm) {
        cpu_rmsnorm(e->q, e->q, w->q_norm, T * H, S, m->norm_eps, a->norm_plus_one);
        cpu_rmsnorm(e->k, e->k, w->k_norm, T * K, S, m->norm_eps, a->norm_plus_one);
    }
    const cpu_rope *rope = sliding && a->rope_local_on ? &e->rope_local : &e->rope;
    rope_tokens(e, rope, e->q, T, H, S);
    rope_tokens(e, rope, e->k, T, K, S);
    for (int64_t t = 0; t < T; t++) {
        const fwd_seq *sq = &seqs[e->seq_of[t]];
        for (int64_t kh = 0; kh < K; kh++) {
            memcpy(kv_key(&e->kv, sq->kv, l, (int)kh, e->pos[t]), e->k + t * KS + kh * S, (size_t)S * 4);
            memcpy(kv_value(&e->kv, sq->kv, l, (int)kh, e->pos[t]), e->v + t * KS + kh * S, (size_t)S * 4);
        }
    }
    att_ctx ac = {e, seqs, l, sliding ? a->sliding_window : 0, a->attn_scale};
    cpu_pool_run(e->pool, attend, &ac, T * H);
    if (cpu_matmul(e->pool, w->o.p, w->o.type, D, HS, e->att, T, e->h, err, errlen))
        return -1;
    lora_io o_lora = {LORA_O, e->att, e->h};
    lora_cpu_apply(e->lora, e->pool, seqs, e->seq_of, l, &o_lora, 1, T);
    if (w->post_attn_norm && w->post_ffw_norm) /* Gemma: norm the attention output before the residual */
        cpu_rmsnorm(e->h, e->h, w->post_attn_norm, T, D, m->norm_eps, a->norm_plus_one);
    cpu_add(e->x, e->h, T * D);

    cpu_rmsnorm(e->h, e->x, w->ffn_norm, T, D, m->norm_eps, a->norm_plus_one);
    if (w->moe) {
        if (moe_ffn(e->moe, e->pool, w->moe, e->h, T, e->h, err, errlen))
            return -1;
    } else if (dense_ffn(e, seqs, w, l, T, err, errlen))
        return -1;
    if (w->post_ffw_norm)
        cpu_rmsnorm(e->h, e->h, w->post_ffw_norm, T, D, m->norm_eps, a->norm_plus_one);
    cpu_add(e->x, e->h, T * D);
    return 0;
}

/* The pass up to and including the output norm: e->last (R, D) holds the normed final hidden states of the rows
 * engine_forward returns logits for, *R their count (0: none asked).  0, or -1 with a sentence. */
static int forward_to_norm(spill_engine *e, fwd_seq *seqs, int n_seqs, int *R_out, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, V = m->vocab;
    int64_t T = 0;
    int R = 0;
    *R_out = 0;
    if (n_seqs > e->max_seqs)
        return util_errf(err, errlen, "a pass of %d sequences exceeds the engine's %d.", n_seqs, e->max_seqs);
    if (lora_cpu_begin(e->lora, seqs, n_seqs, err, errlen))
        return -1;
    for (int s = 0; s < n_seqs; s++) {
        fwd_seq *sq = &seqs[s];
        if (sq->n <= 0 || T + sq->n > e->max_T)
            return util_errf(err, errlen, "a pass of more than %d tokens (or an empty sequence) was requested.",
                             e->max_T);
        if (kv_pages_for(&e->kv, sq->pos0 + sq->n) > sq->kv->n_pages || sq->pos0 + sq->n > m->ctx_len)
            return util_errf(err, errlen, "sequence %d has no KV room for positions up to %d.", s, sq->pos0 + sq->n);
        for (int32_t i = 0; i < sq->n; i++) {
            int32_t tok = sq->tokens[i];
            if (tok < 0 || tok >= V)
                return util_errf(err, errlen, "token id %d is outside the vocabulary of %lld.", tok, (long long)V);
            e->pos[T] = sq->pos0 + i;
            e->seq_of[T] = s;
            e->long_rope[T] = e->a.rope_long_on && sq->pos0 + sq->n > e->a.rope_long_after;
            size_t rb;
            quant_row_bytes(e->embd.type, D, &rb);
            quant_dequant_row(e->embd.type, (const uint8_t *)e->embd.p + (size_t)tok * rb, e->x + T * D, D);
            if (e->a.embed_scale != 1.0f)
                cpu_scale(e->x + T * D, D, e->a.embed_scale);
            T++;
        }
        if (sq->all_logits && (sq->logits_skip < 0 || sq->logits_skip >= sq->n))
            return util_errf(err, errlen, "sequence %d skips %d of its %d tokens' logits (at most n - 1).", s,
                             sq->logits_skip, sq->n);
        R += sq->all_logits ? sq->n - sq->logits_skip : sq->want_logits;
    }

    for (int l = 0; l < m->n_layers; l++) {
        layer_w lw = e->layers[l];
        const layer_w *w = &lw;
        if (e->st) {
            stream_layer sl;
            if (stream_acquire(e->st, l, &sl, err, errlen))
                return -1;
            wmat *all[] = {&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                rebind(all[i], &sl);
            if (lw.moe)
                moe_rebind(lw.moe, &sl);
        }
        int lrc = forward_layer(e, seqs, w, l, T, err, errlen);
        if (e->st)
            stream_release(e->st, l);
        if (lrc)
            return -1;
    }
    if (R == 0)
        return 0;
    if (R > e->max_T)
        return util_errf(err, errlen, "a pass asked for %d rows of logits, more than the engine's %d.", R, e->max_T);
    /* Gather the hidden states whose logits were asked for into last (R, D). */
    int r = 0;
    int64_t t = 0;
    for (int s = 0; s < n_seqs; s++) {
        int64_t first = seqs[s].all_logits ? t + seqs[s].logits_skip : t + seqs[s].n - 1;
        t += seqs[s].n;
        if (!seqs[s].all_logits && !seqs[s].want_logits)
            continue;
        memcpy(e->last + (size_t)r * (size_t)D, e->x + first * D, (size_t)(t - first) * (size_t)D * sizeof(float));
        r += (int)(t - first);
    }
    cpu_rmsnorm(e->last, e->last, e->out_norm, R, D, m->norm_eps, e->a.norm_plus_one);
    *R_out = R;
    return 0;
}

int engine_forward(spill_engine *e, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen)
{
    int64_t D = e->m->d_model, V = e->m->vocab;
    int R;
    if (forward_to_norm(e, seqs, n_seqs, &R, err, errlen))
        return -1;
    if (R == 0)
        return 0;
    if (cpu_matmul(e->pool, e->output.p, e->output.type, V, D, e->last, R, logits, err, errlen))
        return -1;
    if (e->a.final_softcap > 0)
        for (int64_t i = 0; i < (int64_t)R * V; i++)
            logits[i] = (float)(e->a.final_softcap * tanh(logits[i] / e->a.final_softcap));
    return 0;
}

int engine_forward_hidden(spill_engine *e, fwd_seq *seqs, int n_seqs, float *hidden, char *err, size_t errlen)
{
    int R;
    if (forward_to_norm(e, seqs, n_seqs, &R, err, errlen))
        return -1;
    memcpy(hidden, e->last, (size_t)R * (size_t)e->m->d_model * sizeof(float));
    return 0;
}

/* ---------------------------------------------------------------- as a backend */

spill_gpu_open_fn spill_gpu_open;
spill_gpu_free_fn spill_gpu_free;
int spill_gpu_index;

static int be_forward(void *impl, fwd_seq *seqs, int n, float *logits, char *err, size_t errlen)
{
    return engine_forward(impl, seqs, n, logits, err, errlen);
}
static int be_forward_hidden(void *impl, fwd_seq *seqs, int n, float *hidden, char *err, size_t errlen)
{
    return engine_forward_hidden(impl, seqs, n, hidden, err, errlen);
}
static kv_cache *be_kv(void *impl) { return engine_kv(impl); }
static int be_kv_copy(void *impl, kv_row *dst, const kv_row *src, int32_t n)
{
    return kv_row_copy(engine_kv(impl), dst, src, n);
}
static void be_close(void *impl) { engine_close(impl); }

static void be_io_line(void *impl, char *buf, size_t cap)
{
    size_t ring;
    uint64_t bytes;
    double wait_s, read_s;
    if (!engine_stream_stats(impl, &ring, &bytes, &wait_s, &read_s))
        snprintf(buf, cap, "weights resident in RAM");
    else
        snprintf(buf, cap, "read %.2f GB from disk (%.2f GB/s per busy reader), passes waited %.1f s for reads",
                 (double)bytes / 1e9, read_s > 0 ? (double)bytes / 1e9 / read_s : 0.0, wait_s);
}

int engine_backend_cpu(model_desc *m, const engine_opts *o, spill_backend *out, char *err, size_t errlen)
{
    spill_engine *e;
    memset(out, 0, sizeof *out);
    if (engine_open(m, o, &e, err, errlen))
        return -1;
    out->impl = e;
    snprintf(out->name, sizeof out->name, "%s CPU, %d threads%s", o->stream ? "streamed" : "resident",
             engine_threads(e), o->q8_activations ? "" : ", exact fp32 activations");
    out->weight_bytes = engine_weight_bytes(e);
    out->streams = o->stream;
    out->forward = be_forward;
    out->forward_hidden = be_forward_hidden;
    out->kv = be_kv;
    out->kv_copy = be_kv_copy;
    out->close = be_close;
    out->io_line = be_io_line;
    return 0;
}
