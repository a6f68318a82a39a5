/*
 * forward.c — the transformer forward pass on the CPU backend, and the
 * resident engine that owns the weights it binds.
 *
 * Owns: reading the weights into RAM once (in file order, pread), binding
 * each layer's tensors by canonical name, and the pass itself for the llama
 * family (llama, qwen2 QKV bias, qwen3 q/k norm, mistral sliding window) with
 * the Gemma hooks (post-norms, GELU, per-layer windows and RoPE bases) that
 * land later.  Matrices stay in their file dtype and are dequantized inside
 * cpu_matmul; 1-D tensors (norms, biases) are converted to fp32 once here.
 *
 * Does not own: the kernels (cpu.c, quant.c), page allocation (kv.c),
 * scheduling or sampling.
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
#include "../model/gguf.h"
#include "../model/quant.h"
#include "stream.h"
#include "../base/util.h"

typedef struct wmat {
    const void *p; /* N rows of K elements in `type`; rebound every pass when streamed */
    const model_tensor *t;
    uint32_t type;
    int64_t n, k;
} wmat;

typedef struct layer_w {
    wmat q, k, v, o, gate, up, down;
    float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffw_norm; /* (D) */
    float *q_norm, *k_norm;                                       /* (S) */
    float *bq, *bk, *bv;                                          /* (H*S), (K*S), (K*S) */
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
    cpu_rope rope, rope_local;
    float embed_scale;

    /* pass buffers, allocated once for max_T tokens */
    float *x, *h, *q, *k, *v, *att, *g, *u, *last;
    int32_t *pos, *seq_of;
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

/* Binds a matrix of N rows × K columns (GGUF ne = [K, N]). */
static int bind_mat(spill_engine *e, wmat *w, const char *name, int64_t n, int64_t k, bool required, char *err,
                    size_t errlen)
{
    const model_tensor *t;
    memset(w, 0, sizeof *w);
    if (model_matrix(e->m, name, n, k, required, &t, err, errlen))
        return -1;
    if (!t)
        return 0;
    size_t rb;
    if (!quant_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &rb) != 0)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which the CPU backend cannot multiply.",
                         e->m->source, name, quant_type_name(t->dtype));
    w->p = tensor_ptr(e, t);
    w->t = t;
    w->type = t->dtype;
    w->n = n;
    w->k = k;
    return 0;
}

/* Binds a 1-D tensor of n elements as an fp32 copy (NULL when absent and optional). */
static int bind_vec(spill_engine *e, float **out, const char *name, int64_t n, bool required, char *err, size_t errlen)
{
    const model_tensor *t;
    *out = NULL;
    if (model_vector(e->m, name, n, required, &t, err, errlen))
        return -1;
    if (!t)
        return 0;
    float *v = malloc((size_t)n * sizeof *v);
    float **no = realloc(e->owned, (e->n_owned + 1) * sizeof *no);
    if (!v || !no) {
        free(v);
        if (no)
            e->owned = no;
        return util_errf(err, errlen, "out of memory binding %s.", name);
    }
    e->owned = no;
    e->owned[e->n_owned++] = v;
    quant_dequant_row(t->dtype, tensor_ptr(e, t), v, n);
    *out = v;
    return 0;
}

static int bind_weights(spill_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, H = m->n_heads, K = m->n_kv_heads, S = m->head_dim, F = m->ffn_dim, V = m->vocab;
    char nm[96];
    if (bind_mat(e, &e->embd, "token_embd.weight", V, D, true, err, errlen) ||
        bind_vec(e, &e->out_norm, "output_norm.weight", D, true, err, errlen) ||
        bind_mat(e, &e->output, "output.weight", V, D, false, err, errlen))
        return -1;
    if (!e->output.p)
        e->output = e->embd; /* tied embeddings */
    e->layers = calloc((size_t)m->n_layers, sizeof *e->layers);
    if (!e->layers)
        return util_errf(err, errlen, "out of memory binding layers.");
    for (int l = 0; l < m->n_layers; l++) {
        layer_w *w = &e->layers[l];
#define NM(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
        if (bind_vec(e, &w->attn_norm, NM("attn_norm.weight"), D, true, err, errlen) ||
            bind_mat(e, &w->q, NM("attn_q.weight"), H * S, D, true, err, errlen) ||
            bind_mat(e, &w->k, NM("attn_k.weight"), K * S, D, true, err, errlen) ||
            bind_mat(e, &w->v, NM("attn_v.weight"), K * S, D, true, err, errlen) ||
            bind_mat(e, &w->o, NM("attn_output.weight"), D, H * S, true, err, errlen) ||
            bind_vec(e, &w->bq, NM("attn_q.bias"), H * S, false, err, errlen) ||
            bind_vec(e, &w->bk, NM("attn_k.bias"), K * S, false, err, errlen) ||
            bind_vec(e, &w->bv, NM("attn_v.bias"), K * S, false, err, errlen) ||
            bind_vec(e, &w->q_norm, NM("attn_q_norm.weight"), S, m->qk_norm, err, errlen) ||
            bind_vec(e, &w->k_norm, NM("attn_k_norm.weight"), S, m->qk_norm, err, errlen) ||
            bind_vec(e, &w->post_attn_norm, NM("post_attention_norm.weight"), D, false, err, errlen) ||
            bind_vec(e, &w->ffn_norm, NM("ffn_norm.weight"), D, true, err, errlen) ||
            bind_vec(e, &w->post_ffw_norm, NM("post_ffw_norm.weight"), D, false, err, errlen) ||
            bind_mat(e, &w->gate, NM("ffn_gate.weight"), F, D, true, err, errlen) ||
            bind_mat(e, &w->up, NM("ffn_up.weight"), F, D, true, err, errlen) ||
            bind_mat(e, &w->down, NM("ffn_down.weight"), D, F, true, err, errlen))
            return -1;
#undef NM
    }
    return 0;
}

static int rope_setup(spill_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    cpu_rope_cfg c = {0};
    c.style = m->rope_style == ROPE_NORM ? CPU_ROPE_NORM : CPU_ROPE_NEOX;
    c.n_rot = m->rope_dim;
    c.freq_base = m->rope_theta;
    c.scaling = m->rope_scaling == ROPE_SCALE_LINEAR   ? CPU_ROPE_SCALE_LINEAR
                : m->rope_scaling == ROPE_SCALE_LLAMA3 ? CPU_ROPE_SCALE_LLAMA3
                : m->rope_scaling == ROPE_SCALE_YARN   ? CPU_ROPE_SCALE_YARN
                                                       : CPU_ROPE_SCALE_NONE;
    if (m->rope_scaling == ROPE_SCALE_DYNAMIC)
        return util_errf(err, errlen, "%s: dynamic RoPE scaling is not implemented.", m->source);
    c.factor = m->rope_factor;
    c.low_freq_factor = m->rope_low_freq;
    c.high_freq_factor = m->rope_high_freq;
    c.orig_max_pos = m->rope_orig_ctx;
    c.beta_fast = m->rope_beta_fast;
    c.beta_slow = m->rope_beta_slow;
    c.attn_factor = m->rope_attn_factor;
    if (m->format == MODEL_GGUF && m->rope_scaling == ROPE_SCALE_LLAMA3)
        return util_errf(err, errlen,
                         "%s: GGUF llama3 RoPE scaling (rope_freqs tensor) is not wired yet; use the safetensors "
                         "checkpoint.",
                         m->source);
    if (cpu_rope_init(&e->rope, &c, err, errlen))
        return -1;
    c.freq_base = m->rope_theta_local > 0 ? m->rope_theta_local : m->rope_theta;
    if (m->rope_theta_local > 0) {
        c.scaling = CPU_ROPE_SCALE_NONE; /* Gemma 3: local layers use the plain base */
    }
    return cpu_rope_init(&e->rope_local, &c, err, errlen);
}

int engine_open(model_desc *m, const engine_opts *o, spill_engine **out, char *err, size_t errlen)
{
    *out = NULL;
    if (m->state == ARCH_UNSUPPORTED)
        return util_errf(err, errlen, "%s: architecture %s is not supported: %s", m->source, m->arch, m->state_note);
    if (strcmp(m->arch, "llama") && strcmp(m->arch, "qwen2") && strcmp(m->arch, "qwen3") && strcmp(m->arch, "mistral"))
        return util_errf(err, errlen, "%s: architecture %s is described but its forward pass is not wired yet.",
                         m->source, m->arch);
    spill_engine *e = calloc(1, sizeof *e);
    if (!e)
        return util_errf(err, errlen, "out of memory.");
    e->m = m;
    e->max_T = o->max_pass_tokens > 0 ? o->max_pass_tokens : 512;
    e->max_seqs = o->max_pass_seqs > 0 ? o->max_pass_seqs : e->max_T;
    int64_t D = m->d_model, HS = (int64_t)m->n_heads * m->head_dim, KS = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t F = m->ffn_dim, T = e->max_T;
    int64_t maxK = D > HS ? D : HS;
    if (F > maxK)
        maxK = F;
    size_t scratch = cpu_matmul_scratch_bytes(maxK);
    size_t att_scratch = (size_t)(m->ctx_len + 64) * sizeof(float);
    if (att_scratch > scratch)
        scratch = att_scratch;
    e->embed_scale = !strncmp(m->arch, "gemma", 5) ? sqrtf((float)D) : 1.0f;
    stream_opts so = {.slots = o->stream_slots > 0 ? o->stream_slots : 3, .chunk_bytes = 16u << 20, .direct = o->direct_io};
    if (load_files(e, o->stream, err, errlen) || bind_weights(e, err, errlen) || rope_setup(e, err, errlen) ||
        (o->stream && stream_open(m, &so, &e->st, err, errlen)) ||
        cpu_pool_create(o->threads, scratch, &e->pool, err, errlen) ||
        (o->q8_activations &&
         (cpu_pool_set_q8_act(e->pool, true), cpu_pool_reserve_q8(e->pool, T, maxK, err, errlen))) ||
        kv_create(&e->kv, m->n_layers, m->n_kv_heads, m->head_dim, o->page_tokens > 0 ? o->page_tokens : 16,
                  o->kv_pages > 0 ? o->kv_pages : 256, err, errlen))
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
    if (!e->x || !e->h || !e->q || !e->k || !e->v || !e->att || !e->g || !e->u || !e->last || !e->pos || !e->seq_of) {
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
    uint64_t act = (uint64_t)T * (uint64_t)(3 * D + 2 * HS + 2 * KS + 2 * F) * 4 + (uint64_t)T * 8;
    uint64_t scratch = cpu_matmul_scratch_bytes(maxK), att = (uint64_t)(m->ctx_len + 64) * 4;
    if (att > scratch)
        scratch = att;
    uint64_t q8 = o->q8_activations ? (uint64_t)T * (uint64_t)(maxK + maxK / 8 + 64) : 0;
    *pass = act + scratch * (uint64_t)threads + q8;
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
    cpu_pool_free(e->pool);
    kv_destroy(&e->kv);
    free(e->x), free(e->h), free(e->q), free(e->k), free(e->v), free(e->att), free(e->g), free(e->u);
    free(e->last), free(e->pos), free(e->seq_of);
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

/* Points a streamed matrix at its bytes in the slot holding its layer. */
static void rebind(wmat *w, const stream_layer *sl)
{
    if (w->t)
        w->p = sl->base[w->t->file] + (w->t->offset - sl->file_off[w->t->file]);
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
        if (m->attn_softcap > 0)
            s = (float)(m->attn_softcap * tanh(s / m->attn_softcap));
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

/* One layer for all T tokens of the pass: attention (writing this pass's K/V into
 * each row's pages first) and the feed-forward block, residuals in e->x. */
static int forward_layer(spill_engine *e, fwd_seq *seqs, const layer_w *w, int l, int64_t T, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, H = m->n_heads, K = m->n_kv_heads, S = m->head_dim, F = m->ffn_dim;
    int64_t HS = H * S, KS = K * S;
    bool sliding = m->layer_sliding && m->layer_sliding[l];
    cpu_rmsnorm(e->h, e->x, w->attn_norm, T, D, m->norm_eps, m->norm_plus_one);
    cpu_mm_part qkv[3] = {{w->q.p, w->q.type, HS, e->q}, {w->k.p, w->k.type, KS, e->k}, {w->v.p, w->v.type, KS, e->v}};
    if (cpu_matmul_multi(e->pool, qkv, 3, D, e->h, T, err, errlen))
        return -1;
    add_bias(e->q, w->bq, T, HS);
    add_bias(e->k, w->bk, T, KS);
    add_bias(e->v, w->bv, T, KS);
    if (w->q_norm) {
        cpu_rmsnorm(e->q, e->q, w->q_norm, T * H, S, m->norm_eps, m->norm_plus_one);
        cpu_rmsnorm(e->k, e->k, w->k_norm, T * K, S, m->norm_eps, m->norm_plus_one);
    }
    const cpu_rope *rope = sliding && m->rope_theta_local > 0 ? &e->rope_local : &e->rope;
    cpu_rope_apply(rope, e->q, T, H, S, e->pos);
    cpu_rope_apply(rope, e->k, T, K, S, e->pos);
    for (int64_t t = 0; t < T; t++) {
        const fwd_seq *sq = &seqs[e->seq_of[t]];
        for (int64_t kh = 0; kh < K; kh++) {
            memcpy(kv_key(&e->kv, sq->kv, l, (int)kh, e->pos[t]), e->k + t * KS + kh * S, (size_t)S * 4);
            memcpy(kv_value(&e->kv, sq->kv, l, (int)kh, e->pos[t]), e->v + t * KS + kh * S, (size_t)S * 4);
        }
    }
    att_ctx ac = {e, seqs, l, sliding ? m->sliding_window : 0,
                  m->query_scale > 0 ? (float)m->query_scale : 1.0f / sqrtf((float)S)};
    cpu_pool_run(e->pool, attend, &ac, T * H);
    if (cpu_matmul(e->pool, w->o.p, w->o.type, D, HS, e->att, T, e->h, err, errlen))
        return -1;
    if (w->post_attn_norm && w->post_ffw_norm) /* Gemma: norm the attention output before the residual */
        cpu_rmsnorm(e->h, e->h, w->post_attn_norm, T, D, m->norm_eps, m->norm_plus_one);
    cpu_add(e->x, e->h, T * D);

    cpu_rmsnorm(e->h, e->x, w->ffn_norm, T, D, m->norm_eps, m->norm_plus_one);
    cpu_mm_part gate_up[2] = {{w->gate.p, w->gate.type, F, e->g}, {w->up.p, w->up.type, F, e->u}};
    if (cpu_matmul_multi(e->pool, gate_up, 2, D, e->h, T, err, errlen))
        return -1;
    if (!strncmp(m->arch, "gemma", 5))
        cpu_gelu_tanh_mul(e->g, e->u, T * F);
    else
        cpu_silu_mul(e->g, e->u, T * F);
    if (cpu_matmul(e->pool, w->down.p, w->down.type, D, F, e->g, T, e->h, err, errlen))
        return -1;
    if (w->post_ffw_norm)
        cpu_rmsnorm(e->h, e->h, w->post_ffw_norm, T, D, m->norm_eps, m->norm_plus_one);
    cpu_add(e->x, e->h, T * D);
    return 0;
}

int engine_forward(spill_engine *e, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, V = m->vocab;
    int64_t T = 0;
    int R = 0;
    if (n_seqs > e->max_seqs)
        return util_errf(err, errlen, "a pass of %d sequences exceeds the engine's %d.", n_seqs, e->max_seqs);
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
            size_t rb;
            quant_row_bytes(e->embd.type, D, &rb);
            quant_dequant_row(e->embd.type, (const uint8_t *)e->embd.p + (size_t)tok * rb, e->x + T * D, D);
            if (e->embed_scale != 1.0f)
                cpu_scale(e->x + T * D, D, e->embed_scale);
            T++;
        }
        R += sq->all_logits ? sq->n : sq->want_logits;
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
        int64_t first = seqs[s].all_logits ? t : t + seqs[s].n - 1;
        t += seqs[s].n;
        if (!seqs[s].all_logits && !seqs[s].want_logits)
            continue;
        memcpy(e->last + (size_t)r * (size_t)D, e->x + first * D, (size_t)(t - first) * (size_t)D * sizeof(float));
        r += (int)(t - first);
    }
    cpu_rmsnorm(e->last, e->last, e->out_norm, R, D, m->norm_eps, m->norm_plus_one);
    if (cpu_matmul(e->pool, e->output.p, e->output.type, V, D, e->last, R, logits, err, errlen))
        return -1;
    if (m->final_softcap > 0)
        for (int64_t i = 0; i < (int64_t)R * V; i++)
            logits[i] = (float)(m->final_softcap * tanh(logits[i] / m->final_softcap));
    return 0;
}

/* ---------------------------------------------------------------- as a backend */

spill_gpu_open_fn spill_gpu_open;

static int be_forward(void *impl, fwd_seq *seqs, int n, float *logits, char *err, size_t errlen)
{
    return engine_forward(impl, seqs, n, logits, err, errlen);
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
    out->forward = be_forward;
    out->kv = be_kv;
    out->kv_copy = be_kv_copy;
    out->close = be_close;
    out->io_line = be_io_line;
    return 0;
}
