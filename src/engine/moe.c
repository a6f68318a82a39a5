/*
 * moe.c — the routed feed-forward block of a sparse layer on the CPU
 * backend (Mixtral, Qwen2-MoE, Qwen3-MoE).
 *
 * Owns: binding a sparse layer's router, experts and shared expert (each
 * expert a run of rows inside whatever tensor holds it), routing (fp32
 * softmax over the router's scores, top-k, optional renormalisation), the
 * grouped expert matmuls and the weighted sum back into each token's row.
 * Does not own: which tensors exist and their storage (model/arch.c:
 * model_arch_experts), the matmul and its summation order (cpu.c), the rest
 * of the layer (forward.c), reading streamed layers (stream.c).
 *
 * Key decisions:
 *  - Rows grouped by expert: each hit expert gathers the rows that chose it
 *    (token order), runs gate+up as one cpu_matmul_multi and down as one
 *    cpu_matmul over them, so every expert's weights are read once per pass
 *    however many tokens chose it; an expert no row chose is not touched
 *    (counted in moe_stats: which experts a pass hits is what a streamer
 *    needs to skip reading the others).  The alternative, every token through
 *    its k experts one row at a time, reads each expert once per token.
 *  - Bit-stable per token: the matmul gives each output row from its own
 *    input row alone (cpu.h), routing is per token, and each token's k expert
 *    outputs are summed in its own rank order (highest probability first,
 *    ties to the lower expert index), then the gated shared expert is added.
 *    Nothing depends on T, on which other tokens share the pass or an
 *    expert's group, on the thread count, or on streaming.
 *  - Buffers for the largest pass are allocated at open (T*k gathered rows);
 *    a pass allocates nothing.
 *
 * Semantics are transformers': probs = softmax(x . Wr^T) in fp32; the k
 * largest; if normalised (Mixtral always, Qwen norm_topk_prob) divided by
 * their sum; y = sum_j w_j * down_e(silu(gate_e x) * up_e x)
 * + sigmoid(x . w_sg) * shared(x).
 *
 * Buffers (T tokens, R = T*k gathered rows):
 *   probs (T, E) · sel, wt (T, k) · slot (T, k) gathered row of each choice
 *   xg, yg (R, D) · g, u (max(R*FE, T*FS)) · ys (T, D) · sg (T) · rows (E)
 */
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../model/gguf.h"
#include "../model/quant.h"

struct moe_ctx {
    int E, k;
    int64_t D, FE, FS, max_T;
    bool norm;
    float *probs, *wt, *xg, *yg, *g, *u, *ys, *sg;
    int32_t *sel, *slot, *rows, *next;
    uint8_t *taken; /* (E) scratch of the top-k selection */
    uint64_t run, skipped;
};

/* ---------------------------------------------------------------- binding */

/* Binds rows [row0, row0 + n) of tensor t (n rows of k) as w; checks the CPU can multiply its dtype. */
static int bind_rows(moe_mat *w, const model_desc *m, const model_tensor *t, int64_t row0, int64_t k,
                     const uint8_t *const *tbuf, char *err, size_t errlen)
{
    size_t rb;
    if (!quant_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &rb) != 0)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which the CPU backend cannot multiply.",
                         m->source, t->name, quant_type_name(t->dtype));
    const uint8_t *b = tbuf[t - m->tensors];
    w->t = t;
    w->off = (uint64_t)row0 * rb;
    w->type = t->dtype;
    w->p = b ? b + w->off : NULL;
    return 0;
}

/* Binds slot s of layer l as a whole matrix (left zero when the layer has none). */
static int bind_slot(moe_mat *w, const model_desc *m, const arch_layout *a, enum arch_slot s, int l,
                     const uint8_t *const *tbuf, char *err, size_t errlen)
{
    const model_tensor *t;
    if (model_arch_tensor(m, a, s, l, &t, err, errlen))
        return -1;
    return t ? bind_rows(w, m, t, 0, a->t[s].k, tbuf, err, errlen) : 0;
}

int moe_bind(moe_layer *ml, const model_desc *m, const arch_layout *a, int l, const uint8_t *const *tbuf, char *err,
             size_t errlen)
{
    int E = a->n_experts;
    memset(ml, 0, sizeof *ml);
    ml->n_experts = E;
    ml->gate = calloc((size_t)E * 3, sizeof *ml->gate);
    arch_expert *ex = calloc((size_t)E, sizeof *ex);
    if (!ml->gate || !ex) {
        free(ex);
        return util_errf(err, errlen, "out of memory binding the experts of layer %d.", l);
    }
    ml->up = ml->gate + E;
    ml->down = ml->gate + 2 * E;
    int rc = bind_slot(&ml->router, m, a, ARCH_ROUTER, l, tbuf, err, errlen);
    static const enum arch_slot exps[3] = {ARCH_GATE_EXPS, ARCH_UP_EXPS, ARCH_DOWN_EXPS};
    moe_mat *dst[3] = {ml->gate, ml->up, ml->down};
    for (int i = 0; i < 3 && !rc; i++) {
        rc = model_arch_experts(m, a, exps[i], l, ex, err, errlen);
        for (int e = 0; e < E && !rc; e++)
            rc = bind_rows(&dst[i][e], m, ex[e].t, ex[e].row0, a->t[exps[i]].k, tbuf, err, errlen);
    }
    free(ex);
    if (rc || bind_slot(&ml->sh_gate, m, a, ARCH_SHEXP_GATE, l, tbuf, err, errlen) ||
        bind_slot(&ml->sh_up, m, a, ARCH_SHEXP_UP, l, tbuf, err, errlen) ||
        bind_slot(&ml->sh_down, m, a, ARCH_SHEXP_DOWN, l, tbuf, err, errlen))
        return -1;
    const model_tensor *t;
    if (model_arch_tensor(m, a, ARCH_SHEXP_GATE_INP, l, &t, err, errlen))
        return -1;
    if (t) {
        if (!(ml->sh_gate_inp = malloc((size_t)m->d_model * sizeof(float))))
            return util_errf(err, errlen, "out of memory binding %s.", t->name);
        quant_dequant_row(t->dtype, tbuf[t - m->tensors], ml->sh_gate_inp, m->d_model);
    }
    return 0;
}

void moe_unbind(moe_layer *ml)
{
    free(ml->gate);
    free(ml->sh_gate_inp);
    memset(ml, 0, sizeof *ml);
}

static void rebind(moe_mat *w, const stream_layer *sl)
{
    if (w->t)
        w->p = sl->base[w->t->file] + (w->t->offset - sl->file_off[w->t->file]) + w->off;
}

void moe_rebind(moe_layer *ml, const stream_layer *sl)
{
    rebind(&ml->router, sl);
    for (int e = 0; e < 3 * ml->n_experts; e++)
        rebind(&ml->gate[e], sl); /* gate, up and down are one array */
    rebind(&ml->sh_gate, sl);
    rebind(&ml->sh_up, sl);
    rebind(&ml->sh_down, sl);
}

/* ---------------------------------------------------------------- buffers */

int64_t moe_max_k(const model_desc *m)
{
    if (m->n_experts <= 0)
        return 0;
    return m->expert_ffn_dim > m->shared_ffn_dim ? m->expert_ffn_dim : m->shared_ffn_dim;
}

/* Floats of each buffer for passes of T tokens, in the order moe_open carves them. */
static void buffer_sizes(const model_desc *m, int64_t T, int64_t f[8], int64_t i[4])
{
    int64_t E = m->n_experts, k = m->n_experts_used, D = m->d_model, R = T * k;
    int64_t gu = R * m->expert_ffn_dim > T * m->shared_ffn_dim ? R * m->expert_ffn_dim : T * m->shared_ffn_dim;
    int64_t fs[8] = {T * E, T * k, R * D, R * D, gu, gu, m->shared_ffn_dim ? T * D : 0, T};
    int64_t is[4] = {T * k, T * k, E, E};
    memcpy(f, fs, sizeof fs);
    memcpy(i, is, sizeof is);
}

uint64_t moe_buffer_bytes(const model_desc *m, int64_t max_T)
{
    if (m->n_experts <= 0)
        return 0;
    int64_t f[8], i[4];
    uint64_t n = (uint64_t)m->n_experts; /* taken */
    buffer_sizes(m, max_T, f, i);
    for (int j = 0; j < 8; j++)
        n += (uint64_t)f[j] * sizeof(float);
    for (int j = 0; j < 4; j++)
        n += (uint64_t)i[j] * sizeof(int32_t);
    return n;
}

int moe_open(const model_desc *m, const arch_layout *a, cpu_pool *p, int64_t max_T, bool q8, moe_ctx **out, char *err,
             size_t errlen)
{
    *out = NULL;
    moe_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return util_errf(err, errlen, "out of memory for the expert buffers.");
    c->E = a->n_experts;
    c->k = a->n_experts_used;
    c->D = m->d_model;
    c->FE = m->expert_ffn_dim;
    c->FS = m->shared_ffn_dim;
    c->max_T = max_T;
    c->norm = a->expert_norm;
    int64_t f[8], i[4];
    buffer_sizes(m, max_T, f, i);
    float **fb[8] = {&c->probs, &c->wt, &c->xg, &c->yg, &c->g, &c->u, &c->ys, &c->sg};
    int32_t **ib[4] = {&c->sel, &c->slot, &c->rows, &c->next};
    bool ok = (c->taken = calloc((size_t)c->E, 1)) != NULL;
    for (int j = 0; j < 8 && ok; j++)
        ok = (*fb[j] = malloc((size_t)(f[j] > 0 ? f[j] : 1) * sizeof(float))) != NULL;
    for (int j = 0; j < 4 && ok; j++)
        ok = (*ib[j] = malloc((size_t)(i[j] > 0 ? i[j] : 1) * sizeof(int32_t))) != NULL;
    if (!ok) {
        moe_close(c);
        return util_errf(err, errlen,
                         "out of memory for the expert buffers of %lld-token passes; lower the per-pass token cap.",
                         (long long)max_T);
    }
    int64_t K = moe_max_k(m) > m->d_model ? moe_max_k(m) : m->d_model;
    if (q8 && cpu_pool_reserve_q8(p, max_T * c->k, K, err, errlen)) {
        moe_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

void moe_close(moe_ctx *c)
{
    if (!c)
        return;
    free(c->probs), free(c->wt), free(c->xg), free(c->yg), free(c->g), free(c->u), free(c->ys), free(c->sg);
    free(c->sel), free(c->slot), free(c->rows), free(c->next), free(c->taken);
    free(c);
}

void moe_stats(const moe_ctx *c, uint64_t *run, uint64_t *skipped, const int32_t **rows)
{
    *run = c->run;
    *skipped = c->skipped;
    if (rows)
        *rows = c->rows;
}

/* ---------------------------------------------------------------- the block */

/* One token's routing: p (E) probabilities in, sel/wt (k) the chosen experts by falling probability (ties to
 * the lower index) and their weights. */
static void route(moe_ctx *c, const float *p, int32_t *sel, float *wt)
{
    float sum = 0;
    for (int j = 0; j < c->k; j++) {
        int best = -1;
        for (int e = 0; e < c->E; e++)
            if (!c->taken[e] && (best < 0 || p[e] > p[best]))
                best = e;
        c->taken[best] = 1;
        sel[j] = best;
        wt[j] = p[best];
        sum += p[best];
    }
    for (int j = 0; j < c->k; j++) {
        c->taken[sel[j]] = 0;
        if (c->norm)
            wt[j] /= sum;
    }
}

int moe_ffn(moe_ctx *c, cpu_pool *p, const moe_layer *ml, const float *x, int64_t T, float *y, char *err, size_t errlen)
{
    int E = c->E, k = c->k;
    int64_t D = c->D, F = c->FE, FS = c->FS;
    if (T > c->max_T)
        return util_errf(err, errlen, "a pass of %lld tokens exceeds the expert buffers' %lld.", (long long)T,
                         (long long)c->max_T);
    if (cpu_matmul(p, ml->router.p, ml->router.type, E, D, x, T, c->probs, err, errlen))
        return -1;
    memset(c->rows, 0, (size_t)E * sizeof *c->rows);
    for (int64_t t = 0; t < T; t++) {
        cpu_softmax(c->probs + t * E, E);
        route(c, c->probs + t * E, c->sel + t * k, c->wt + t * k);
        for (int j = 0; j < k; j++)
            c->rows[c->sel[t * k + j]]++;
    }
    /* gather: expert e's rows are [next[e] - rows[e], next[e]) of xg, in token order */
    for (int e = 0, r = 0; e < E; r += c->rows[e++])
        c->next[e] = r;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int32_t r = c->next[c->sel[t * k + j]]++;
            c->slot[t * k + j] = r;
            memcpy(c->xg + r * D, x + t * D, (size_t)D * sizeof *x);
        }
    for (int e = 0; e < E; e++) {
        int64_t n = c->rows[e], r0 = c->next[e] - n;
        if (n == 0) {
            c->skipped++;
            continue;
        }
        c->run++;
        cpu_mm_part gu[2] = {{ml->gate[e].p, ml->gate[e].type, F, c->g + r0 * F},
                             {ml->up[e].p, ml->up[e].type, F, c->u + r0 * F}};
        if (cpu_matmul_multi(p, gu, 2, D, c->xg + r0 * D, n, err, errlen))
            return -1;
        cpu_silu_mul(c->g + r0 * F, c->u + r0 * F, n * F);
        if (cpu_matmul(p, ml->down[e].p, ml->down[e].type, D, F, c->g + r0 * F, n, c->yg + r0 * D, err, errlen))
            return -1;
    }
    bool shared = ml->sh_gate.t != NULL;
    if (shared) {
        cpu_mm_part gu[2] = {{ml->sh_gate.p, ml->sh_gate.type, FS, c->g}, {ml->sh_up.p, ml->sh_up.type, FS, c->u}};
        if (cpu_matmul_multi(p, gu, 2, D, x, T, err, errlen))
            return -1;
        cpu_silu_mul(c->g, c->u, T * FS);
        if (cpu_matmul(p, ml->sh_down.p, ml->sh_down.type, D, FS, c->g, T, c->ys, err, errlen))
            return -1;
        if (ml->sh_gate_inp && cpu_matmul(p, ml->sh_gate_inp, GGML_F32, 1, D, x, T, c->sg, err, errlen))
            return -1;
    }
    /* x is read for the last time above: y may be x */
    for (int64_t t = 0; t < T; t++) {
        float *yt = y + t * D;
        const float *wt = c->wt + t * k;
        const int32_t *slot = c->slot + t * k;
        float sg = !shared ? 0.0f : ml->sh_gate_inp ? 1.0f / (1.0f + expf(-c->sg[t])) : 1.0f;
        for (int64_t d = 0; d < D; d++) {
            float acc = 0;
            for (int j = 0; j < k; j++)
                acc += wt[j] * c->yg[slot[j] * D + d];
            yt[d] = shared ? acc + sg * c->ys[t * D + d] : acc;
        }
    }
    return 0;
}
