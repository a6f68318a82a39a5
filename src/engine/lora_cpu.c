/*
 * lora_cpu.c — LoRA on the CPU backend: unmerged, per row, in the pass every row shares.
 *
 * Owns: checking an adapter set against the engine's model, and the delta of one projection for one token
 *     z = scale · A·x_t  (r)        y_t += B·z  (out)        A (r, in), B (out, r) row-major fp32
 * for every token whose row names an adapter that adapts the slot, parallel over (projection, token) on the
 * engine's pool.
 * Does not own: reading adapters (model/lora.c), where in the layer a delta lands (forward.c: after the
 * projection's matmul, before bias, norms, RoPE and the activation).
 *
 * Key decisions:
 *  - Unmerged: the base weights stay shared by every row of the pass whatever adapter it names; an adapter
 *    costs 2·r·(in + out) flops per token and projection against the base matmul's 2·in·out, and memory of
 *    its factors only.
 *  - Both products are cpu_attn_scores (dot products in the matmul's fixed summation order), so a token's
 *    delta has the same bits whatever else is in the pass and however the pool splits the work: a row's
 *    logits are bit-identical alone or mixed with rows on other adapters.
 *  - Parallel over tokens rather than over output rows: a decode pass has one token per row, and rows on
 *    different adapters read different factors; per token the factors (r × (in + out) floats) stay in cache.
 *  - Scratch per thread (z (r) and B·z (out)) is allocated at open; nothing allocates per pass.
 */
#include "lora_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

struct lora_cpu {
    const lora_set *set;
    int threads;
    int64_t max_r, max_out; /* the largest rank and output width of any adapted slot, padded to 16 floats */
    float *scratch;         /* (threads, max_r + max_out) */
    bool *used;             /* (n + 1) adapter index i is named by a row of this pass */
};

static void max_dims(const lora_set *set, int64_t *max_r, int64_t *max_out)
{
    *max_r = *max_out = 0;
    for (int i = 0; i < set->n; i++) {
        const lora_adapter *ad = set->ad[i];
        for (size_t k = 0; ad && k < (size_t)ad->n_layers * LORA_N_SLOTS; k++) {
            *max_r = ad->m[k].r > *max_r ? ad->m[k].r : *max_r;
            *max_out = ad->m[k].r && ad->m[k].out > *max_out ? ad->m[k].out : *max_out;
        }
    }
    *max_r = (*max_r + 15) / 16 * 16;
    *max_out = (*max_out + 15) / 16 * 16;
}

uint64_t lora_cpu_scratch_bytes(const lora_set *set, int threads)
{
    if (!set || set->n <= 0)
        return 0;
    int64_t r, o;
    max_dims(set, &r, &o);
    return (uint64_t)threads * (uint64_t)(r + o) * sizeof(float) + (uint64_t)set->n + 1;
}

int lora_cpu_open(const lora_set *set, const model_desc *m, const arch_layout *a, int threads, lora_cpu **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    if (!set || set->n <= 0)
        return 0;
    for (int i = 0; i < set->n; i++) {
        const lora_adapter *ad = set->ad[i];
        if (!ad)
            return util_errf(err, errlen, "adapter %d of the job's set is missing (NULL).", i + 1);
        if (ad->n_layers != m->n_layers)
            return util_errf(err, errlen, "adapter %s has %d layers but the model %s has %d; load it against this base.",
                             ad->name, ad->n_layers, m->source, m->n_layers);
        for (int l = 0; l < ad->n_layers; l++)
            for (int s = 0; s < LORA_N_SLOTS; s++) {
                const lora_mat *mt = &ad->m[(size_t)l * LORA_N_SLOTS + s];
                const arch_tensor *t = &a->t[lora_arch_slot((enum lora_slot)s)];
                if (mt->r && (mt->in != t->k || mt->out != t->n || !mt->A || !mt->B))
                    return util_errf(err, errlen,
                                     "adapter %s: layer %d slot %d maps %lld inputs to %lld outputs but the model "
                                     "%s's maps %lld to %lld; load it against this base.",
                                     ad->name, l, s, (long long)mt->in, (long long)mt->out, m->source,
                                     (long long)t->k, (long long)t->n);
            }
    }
    lora_cpu *lc = calloc(1, sizeof *lc);
    if (!lc)
        return util_errf(err, errlen, "out of memory for the adapters' scratch.");
    lc->set = set;
    lc->threads = threads;
    max_dims(set, &lc->max_r, &lc->max_out);
    lc->scratch = aligned_alloc(64, (size_t)threads * (size_t)(lc->max_r + lc->max_out) * sizeof(float) + 64);
    lc->used = calloc((size_t)set->n + 1, sizeof *lc->used);
    if (!lc->scratch || !lc->used) {
        lora_cpu_close(lc);
        return util_errf(err, errlen, "out of memory for the adapters' scratch.");
    }
    *out = lc;
    return 0;
}

void lora_cpu_close(lora_cpu *lc)
{
    if (!lc)
        return;
    free(lc->scratch);
    free(lc->used);
    free(lc);
}

int lora_cpu_begin(lora_cpu *lc, const fwd_seq *seqs, int n_seqs, char *err, size_t errlen)
{
    int n = lc ? lc->set->n : 0;
    if (lc)
        memset(lc->used, 0, (size_t)n + 1);
    for (int s = 0; s < n_seqs; s++) {
        int32_t i = seqs[s].adapter;
        if (i < 0 || i > n)
            return util_errf(err, errlen,
                             "sequence %d names adapter %d but the engine holds %d (0 is the bare base, 1 to %d the "
                             "job's adapters).",
                             s, i, n, n);
        if (lc)
            lc->used[i] = true;
    }
    return 0;
}

typedef struct apply_ctx {
    lora_cpu *lc;
    const fwd_seq *seqs;
    const int32_t *seq_of;
    int layer;
    const lora_io *io;
    int64_t T;
} apply_ctx;

/* Task = (projection, token): that token's delta for that projection. */
static void apply_task(void *vctx, int64_t task, int tid)
{
    const apply_ctx *c = vctx;
    const lora_io *io = &c->io[task / c->T];
    int64_t t = task % c->T;
    int32_t i = c->seqs[c->seq_of[t]].adapter;
    if (i == 0)
        return;
    const lora_adapter *ad = c->lc->set->ad[i - 1];
    const lora_mat *mt = &ad->m[(size_t)c->layer * LORA_N_SLOTS + io->slot];
    if (!mt->r)
        return;
    float *z = c->lc->scratch + (size_t)tid * (size_t)(c->lc->max_r + c->lc->max_out), *bz = z + c->lc->max_r;
    cpu_attn_scores(io->x + t * mt->in, mt->A, mt->r, mt->in, z);
    cpu_scale(z, mt->r, ad->scale);
    cpu_attn_scores(z, mt->B, mt->out, mt->r, bz);
    cpu_add(io->y + t * mt->out, bz, mt->out);
}

void lora_cpu_apply(lora_cpu *lc, cpu_pool *pool, const fwd_seq *seqs, const int32_t *seq_of, int l,
                    const lora_io *io, int n_io, int64_t T)
{
    if (!lc || T <= 0)
        return;
    bool any = false;
    for (int i = 1; i <= lc->set->n && !any; i++)
        for (int k = 0; k < n_io && lc->used[i]; k++)
            any = any || lc->set->ad[i - 1]->m[(size_t)l * LORA_N_SLOTS + io[k].slot].r > 0;
    if (!any)
        return;
    apply_ctx c = {lc, seqs, seq_of, l, io, T};
    cpu_pool_run(pool, apply_task, &c, T * n_io);
}
