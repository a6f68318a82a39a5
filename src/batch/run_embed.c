/*
 * run_embed.c — /v1/embeddings rows: their inputs into token ids, and the embedding phase that answers them.
 *
 * A row is {model, input: string | [string] | [int] | [[int]], encoding_format, dimensions} (request.c checks
 * the shapes); each input is prefilled — no decode, no logits — and its final hidden states after the output
 * norm (spill_backend.forward_hidden, the CPU engine's pass stopped before the output projection) are pooled as
 * the model says (embed.c: last token, mean or first token; L2-normalised unless a sentence-transformers layout
 * leaves out Normalize).  body.dimensions keeps the leading components and renormalises (Matryoshka) where
 * --matryoshka allows it, else the row fails with a 400 that says why.  The answer is OpenAI's
 * CreateEmbeddingResponse (output.c), usage counting every input token.
 *
 * Scheduling: the phase runs before the generation passes (run.c) and owns the backend until it is done.  Each
 * pass carries the next prompt chunk (--prefill-chunk tokens at most) of every input in flight, within the
 * engine's sequences and tokens per pass; an input is admitted, in input order, while the KV cache has pages for
 * the whole of it (its pages go back as soon as it is pooled; embedding pages never enter the prefix index).  A
 * row whose input cannot fit even alone fails with insufficient_memory (the memory plan counts the longest input,
 * so only a cache capped by --kv-mem meets that).  Rows finished in a pass are appended and the pass ends with
 * one group commit (job.c: fsync before a row counts), so a resume skips every row already answered (run_rows.c
 * asks the job before it adds a row) and recomputes only rows in flight at the interruption.
 *
 * Why a phase and not rows of the scheduler: an embedding row has no decode, no sampler, no choices and needs
 * every prompt position's state (mean pooling), so the scheduler's row life (admission for prompt + max_tokens,
 * preemption, sampling) would carry it as a special case at every step; a phase of prefill-only passes is a page
 * of code, and a pass's cost on a streamed model is its weights' trip, which the embedding passes share fully
 * (every input of a pass rides the same read).  The price: the embedding rows and the generation rows do not
 * share passes.
 *
 * Several ranks (mpi_run.c): rank 0 runs the phase alone, into its own rank job like any row it runs, while its
 * dispatcher already hands generation rows to the others; the other ranks skip the embedding rows (rank 0 never
 * hands them out: they are not in the scheduler's queue).  Simple and correct — the phase is prefill only, a
 * small share of a mixed job; an embedding-only job uses one rank.
 *
 * Numbers: an input's vector depends only on its own tokens — the engine's matmuls sum in a fixed order per
 * output element whatever shares the pass, attention reads each chunk's keys from the row's own pages in
 * position order, and the mean adds positions in order in double — so the same input gives the same bits alone
 * or in a batch (tests/test_embed.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embed.h"
#include "run_internal.h"
#include "../base/util.h"
#include "../text/prompt.h"

/* One input of a row. */
typedef struct emb_input {
    int32_t *ids; /* (n) */
    int32_t n;
} emb_input;

/* One embedding row. */
typedef struct emb_row {
    size_t row;        /* r->rows index: custom_id, model, adapter, requested model */
    emb_input *in;     /* (n_in) */
    size_t n_in;
    bool base64;
    int64_t dims;      /* 0 = the model's D */
    float *vecs;       /* (n_in, D) pooled vectors, allocated when the first input is admitted */
    size_t n_done;     /* inputs pooled */
    uint64_t tokens;   /* every input's tokens */
    bool failed;       /* its error line is written: the rest of its inputs are skipped */
    double t_admit;    /* when its first input was admitted (the stamp's latency_s) */
    int passes, last_pass;
} emb_row;

typedef struct embed_set {
    embed_cfg cfg;
    emb_row *rows; /* (n) in input order */
    size_t n, cap;
} embed_set;

/* An input in flight. */
typedef struct emb_slot {
    size_t er, k;  /* emb_row and input index */
    kv_row kv;
    int32_t fed;   /* positions computed */
    double *acc;   /* (D) the pooled sum (mean) or the chosen position's state */
    bool on;
} emb_slot;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int run_embed_open(runner *r, const char *path, char *err, size_t errlen)
{
    r->emb = calloc(1, sizeof *r->emb);
    if (!r->emb)
        return util_errf(err, errlen, "out of memory.");
    return embed_cfg_from_model(r->m, path, r->o.pooling, r->o.matryoshka, &r->emb->cfg, err, errlen);
}

static void row_free(emb_row *e)
{
    for (size_t k = 0; k < e->n_in; k++)
        free(e->in[k].ids);
    free(e->in);
    free(e->vecs);
}

void run_embed_free(runner *r)
{
    if (!r->emb)
        return;
    for (size_t i = 0; i < r->emb->n; i++)
        row_free(&r->emb->rows[i]);
    free(r->emb->rows);
    free(r->emb);
    r->emb = NULL;
}

int run_embed_add(runner *r, size_t i, const request *q, char *msg, size_t msglen, const char **code)
{
    embed_set *es = r->emb;
    int64_t D = r->m->d_model;
    *code = "invalid_request";
    if (r->o.cmd == 1)
        return snprintf(msg, msglen, "spill distill answers text rows with their log-probs, but this row asks for "
                                     "embeddings; run it with spill run."), 1;
    if (es->cfg.refuse[0])
        return snprintf(msg, msglen, "%s", es->cfg.refuse), 1;
    if (q->emb_dims > 0 && !es->cfg.matryoshka)
        return snprintf(msg, msglen, "body.dimensions is %lld, but nothing says this model was trained for truncated "
                                     "(Matryoshka) embeddings, whose leading components stand alone; drop dimensions, "
                                     "or run the job with --matryoshka if the model was (Qwen3-Embedding is).",
                        (long long)q->emb_dims), 1;
    if (q->emb_dims > D)
        return snprintf(msg, msglen, "body.dimensions is %lld, but this model's embeddings have %lld dimensions; ask "
                                     "for at most %lld.", (long long)q->emb_dims, (long long)D, (long long)D), 1;
    if (es->n == es->cap) {
        size_t nc = es->cap ? es->cap * 2 : 64;
        emb_row *nr = realloc(es->rows, nc * sizeof *nr);
        if (!nr)
            return snprintf(msg, msglen, "Out of memory."), -1;
        es->rows = nr, es->cap = nc;
    }
    emb_row *e = &es->rows[es->n];
    memset(e, 0, sizeof *e);
    e->row = i;
    e->base64 = q->emb_base64;
    e->dims = q->emb_dims;
    e->in = calloc(q->n_prompts, sizeof *e->in);
    if (!e->in)
        return snprintf(msg, msglen, "Out of memory."), -1;
    e->n_in = q->n_prompts;
    prompt_src ps = {r->m, r->tok, r->tmpl};
    int rc = 0;
    for (size_t k = 0; k < e->n_in && !rc; k++) {
        /* one input: the whole value (a string, a token list, or a list of one), else element k */
        json_t *in = e->n_in > 1 ? json_array_get(q->prompt, k) : q->prompt;
        char err[SPILL_ERRLEN], at[40] = "body.input";
        if (e->n_in > 1)
            snprintf(at, sizeof at, "body.input[%zu]", k);
        size_t n = 0;
        if (prompt_completion(&ps, in, &e->in[k].ids, &n, err, sizeof err))
            rc = 1, snprintf(msg, msglen, "%s: %.450s", at, err);
        else if (n == 0)
            rc = 1, snprintf(msg, msglen, "%s is empty once tokenized; give it some text.", at);
        else if ((int64_t)n > r->m->ctx_len)
            rc = 1, *code = "context_length_exceeded",
            snprintf(msg, msglen, "%s is %zu tokens, but this model's context is %d tokens; shorten it or split it "
                                  "over several inputs.", at, n, r->m->ctx_len);
        e->in[k].n = (int32_t)n;
        e->tokens += n;
    }
    if (rc) {
        row_free(e);
        return 1;
    }
    es->n++;
    return 0;
}

int32_t run_embed_longest(const runner *r, size_t *inputs)
{
    int32_t m = 0;
    size_t n = 0;
    for (size_t i = 0; r->emb && i < r->emb->n; i++)
        for (size_t k = 0; k < r->emb->rows[i].n_in; k++, n++)
            m = r->emb->rows[i].in[k].n > m ? r->emb->rows[i].in[k].n : m;
    if (inputs)
        *inputs = n;
    return m;
}

static int cmp_desc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x < y) - (x > y);
}

int32_t run_embed_want_pages(const runner *r, int32_t page_tokens, int n)
{
    size_t n_in;
    run_embed_longest(r, &n_in);
    int32_t *pg = n_in ? malloc(n_in * sizeof *pg) : NULL;
    if (!pg) /* none, or no memory to sort: the longest alone, which the plan holds anyway */
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < r->emb->n; i++)
        for (size_t j = 0; j < r->emb->rows[i].n_in; j++)
            pg[k++] = (r->emb->rows[i].in[j].n + page_tokens - 1) / page_tokens;
    qsort(pg, n_in, sizeof *pg, cmp_desc);
    int64_t sum = 0;
    for (size_t i = 0; i < n_in && i < (size_t)n; i++)
        sum += pg[i];
    free(pg);
    return sum > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)sum;
}

/* Fails row e with one error line (status 400 unless code says memory); its inputs in flight stop.  0 or -1. */
static int fail_row(runner *r, emb_row *e, const char *msg, const char *code, char *err, size_t errlen)
{
    e->failed = true;
    return run_append_error_line(r, r->rows[e->row].custom_id, msg, NULL, code, err, errlen);
}

/* Writes finished row e: its vectors (truncated and renormalised to dims), through the job store.  0, or -1 when
 * the job store fails (an answer it refuses fails the row alone, 500). */
static int write_row(runner *r, emb_row *e, char *err, size_t errlen)
{
    int64_t D = r->m->d_model, dim = e->dims > 0 ? e->dims : D;
    const row *w = &r->rows[e->row];
    float *v = e->vecs;
    if (dim < D) { /* Matryoshka: the leading components, as a vector of their own */
        for (size_t k = 0; k < e->n_in; k++) {
            memmove(v + k * (size_t)dim, e->vecs + k * (size_t)D, (size_t)dim * sizeof *v);
            if (r->emb->cfg.normalize)
                embed_normalize(v + k * (size_t)dim, dim);
        }
    }
    out_stamp stamp = r->stamp;
    stamp.adapter = run_adapter_hash(r, w->adapter);
    stamp.latency_s = now_s() - e->t_admit;
    stamp.passes = e->passes;
    stamp.requested_model = w->requested;
    out_embedding oe = {w->custom_id, w->model, e->n_in, (size_t)dim, v, e->base64, e->tokens, &stamp};
    char *line;
    size_t len;
    int rc = output_embedding_line(&oe, NULL, &line, &len, err, errlen);
    if (rc == 0) {
        rc = job_append_result(r->j, line, len, err, errlen);
        free(line);
        if (rc == -1)
            return -1;
    }
    if (rc) {
        char msg[SPILL_ERRLEN + 64];
        snprintf(msg, sizeof msg, "spill could not write this row's answer: %s", err);
        return run_append_status_line(r, w->custom_id, 500, msg, NULL, "output_refused", err, errlen);
    }
    r->rows_done++;
    return 0;
}

/* The input in slot s is computed: its pooled vector into its row, its pages back; the row is written when it
 * was the last.  0 or -1. */
static int pool_input(runner *r, emb_slot *s, kv_cache *kv, char *err, size_t errlen)
{
    emb_row *e = &r->emb->rows[s->er];
    int64_t D = r->m->d_model;
    int32_t n = e->in[s->k].n;
    float *v = e->vecs + s->k * (size_t)D;
    double div = r->emb->cfg.pool == EMBED_POOL_MEAN ? (double)n : 1.0;
    for (int64_t d = 0; d < D; d++)
        v[d] = (float)(s->acc[d] / div);
    if (r->emb->cfg.normalize)
        embed_normalize(v, D);
    kv_row_release(kv, &s->kv);
    s->on = false;
    return ++e->n_done == e->n_in && !e->failed ? write_row(r, e, err, errlen) : 0;
}

int run_embed_phase(runner *r, volatile sig_atomic_t *flag, char *err, size_t errlen)
{
    embed_set *es = r->emb;
    if (!es || es->n == 0 || r->rank > 0) /* several ranks: rank 0 alone answers embedding rows */
        return 0;
    if (!r->be.forward_hidden) { /* the GPU engine: not yet */
        char msg[SPILL_ERRLEN];
        snprintf(msg, sizeof msg, "This row asks for embeddings, but the backend that runs this job (%.200s) cannot "
                                  "compute them yet; run embedding rows with --cpu.", r->be.name);
        for (size_t i = 0; i < es->n; i++)
            if (fail_row(r, &es->rows[i], msg, "embeddings_unsupported", err, errlen))
                return -1;
        return job_commit(r->j, err, errlen);
    }
    if (!r->o.quiet) {
        size_t n_in;
        int32_t longest = run_embed_longest(r, &n_in);
        printf("spill: %zu embedding rows first (%zu inputs, the longest %d tokens), pooled by %s: %s%s\n", es->n,
               n_in, longest, embed_pool_name(es->cfg.pool), es->cfg.source,
               es->cfg.normalize ? ", L2-normalised" : ", not normalised");
        fflush(stdout);
    }
    kv_cache *kv = r->be.kv(r->be.impl);
    int64_t D = r->m->d_model;
    int S = r->max_seqs, chunk = r->o.prefill_chunk, T_cap = r->max_seqs + r->o.prefill_chunk;
    bool mean = es->cfg.pool == EMBED_POOL_MEAN, cls = es->cfg.pool == EMBED_POOL_CLS;
    emb_slot *slot = calloc((size_t)S, sizeof *slot);
    fwd_seq *seqs = calloc((size_t)S, sizeof *seqs);
    int *seq_slot = calloc((size_t)S, sizeof *seq_slot);
    float *hidden = malloc((size_t)T_cap * (size_t)D * sizeof *hidden);
    double *acc = calloc((size_t)S * (size_t)D, sizeof *acc);
    int rc = 0;
    if (!slot || !seqs || !seq_slot || !hidden || !acc)
        rc = util_errf(err, errlen, "out of memory for the embedding passes.");
    for (int k = 0; k < S && !rc; k++)
        slot[k].acc = acc + (size_t)k * (size_t)D;
    size_t next_row = 0, next_in = 0; /* the next input to admit */
    int pass = 0, n_on = 0;
    while (!rc && !*flag) {
        /* admit inputs in order while a slot and pages for the whole input are free */
        while (next_row < es->n && n_on < S) {
            emb_row *e = &es->rows[next_row];
            if (e->failed || next_in >= e->n_in) {
                next_row++, next_in = 0;
                continue;
            }
            int k = 0;
            while (slot[k].on)
                k++;
            emb_slot *s = &slot[k];
            int res = kv_row_reserve(kv, &s->kv, e->in[next_in].n);
            if (res == -2) {
                rc = util_errf(err, errlen, "out of memory for a KV page table.");
                break;
            }
            if (res == -1 && n_on > 0)
                break; /* the pages free up as inputs in flight finish */
            if (res == -1) {
                char msg[SPILL_ERRLEN];
                snprintf(msg, sizeof msg, "Input %zu of this row is %d tokens, which need %d KV pages, but the cache "
                                          "holds %d; raise --kv-mem or shorten the input.", next_in, e->in[next_in].n,
                         kv_pages_for(kv, e->in[next_in].n), kv->n_pages);
                if (fail_row(r, e, msg, "insufficient_memory", err, errlen))
                    rc = -1;
                continue;
            }
            if (!e->vecs && !(e->vecs = malloc(e->n_in * (size_t)D * sizeof *e->vecs))) {
                kv_row_release(kv, &s->kv);
                rc = util_errf(err, errlen, "out of memory for the embeddings of row %s.", r->rows[e->row].custom_id);
                break;
            }
            if (e->t_admit == 0)
                e->t_admit = now_s();
            s->er = next_row, s->k = next_in++, s->fed = 0, s->on = true;
            memset(s->acc, 0, (size_t)D * sizeof *s->acc);
            n_on++;
        }
        if (rc || n_on == 0)
            break;
        /* the pass: the next chunk of every input in flight, in slot order, within the engine's tokens */
        int ns = 0, T = 0;
        for (int k = 0; k < S && T < T_cap; k++) {
            emb_slot *s = &slot[k];
            if (!s->on)
                continue;
            emb_row *e = &es->rows[s->er];
            int32_t left = e->in[s->k].n - s->fed, c = left < chunk ? left : chunk;
            c = c < T_cap - T ? c : T_cap - T;
            bool last = c == left;
            seqs[ns] = (fwd_seq){&s->kv, s->fed, c, e->in[s->k].ids + s->fed, last && !mean && !cls,
                                 mean || (cls && s->fed == 0), 0, r->rows[e->row].adapter};
            seq_slot[ns++] = k;
            T += c;
            if (e->last_pass != pass + 1)
                e->passes++, e->last_pass = pass + 1;
        }
        if (r->be.forward_hidden(r->be.impl, seqs, ns, hidden, err, errlen)) {
            rc = -1;
            break;
        }
        /* pool what came back, in sequence order: every position (mean), the first (cls), the last (last) */
        const float *h = hidden;
        for (int q = 0; q < ns && !rc; q++) {
            emb_slot *s = &slot[seq_slot[q]];
            const fwd_seq *sq = &seqs[q];
            int32_t rows = sq->all_logits ? sq->n : sq->want_logits ? 1 : 0;
            for (int32_t t = 0; t < rows; t++, h += D)
                if (mean || t == 0)
                    for (int64_t d = 0; d < D; d++)
                        s->acc[d] = mean ? s->acc[d] + h[d] : h[d];
            s->fed += sq->n;
            s->kv.len = s->fed;
            if (s->fed == es->rows[s->er].in[s->k].n) {
                if (pool_input(r, s, kv, err, errlen))
                    rc = -1;
                n_on--;
            }
        }
        /* one group commit a pass: the rows written (and any failed) count from here */
        if (!rc && job_commit(r->j, err, errlen))
            rc = -1;
        pass++;
    }
    for (int k = 0; slot && k < S; k++)
        kv_row_free(kv, &slot[k].kv);
    free(slot);
    free(seqs);
    free(seq_slot);
    free(hidden);
    free(acc);
    return rc;
}
