/*
 * test_sched.c — the scheduler (sched.h) over 10,000 random jobs, on a fake
 * engine and a fake clock: admission, prompt chunks mixed into decode
 * passes, KV page reservation, preemption and recompute, n > 1 sharing the
 * prompt's pages, the end tail, the ETA.
 *
 * The fake engine's "model" is a hash: a sequence's logits are a
 * pseudo-random function of every token id it holds, read back through its
 * KV page table (so a page-table, copy or recompute bug changes the answer);
 * each pass advances the clock by c0 + c_tok * tokens + c_att * pairs.
 * The scheduler is the real one, driven through its header by the pass loop
 * below — the same calls, in the same order, as run.c's loop; tokens are
 * drawn by the real sampler (sample.c).  A choice's answer is its token ids
 * and finish reason (the text is the detokenizer's business, test_run's).
 *
 * Per job, run twice — under a memory plan for a random budget (tight), and
 * with room for every row at once (roomy):
 *   - the plan never exceeds the budget, and no pass holds more KV pages
 *     than the plan gave, more sequences or more tokens than the engine was
 *     sized for (checked inside every forward call);
 *   - every row finishes: each row fits the cache alone, the scheduler ends
 *     with nothing pending and every row done, with one answer per row;
 *   - every row's answer (token ids, finish reason, token counts) equals the
 *     roomy run's: preemption and recompute change nothing; in odd jobs the
 *     tight run's backend also picks the greedy rows' tokens itself
 *     (forward_pick, as the GPU does) and the answers still agree.
 * Every third job gives its rows shared prefixes (a few groups, each a common prompt start, rows adding their
 * own tail or none — identical prompts too): it runs tight with the prefix cache on (rows map indexed pages,
 * choices map choice 0's; every pass checks each page's count against its mappers, and no sequence may write
 * a page another row maps), once with a page copy and once without (the GPU's way: choices compute their
 * last tokens), and must answer as the roomy run without the cache.
 * Every fifth job also runs tight with the adaptive prompt budget (chunk.h) on a streamed fake clock (a pass
 * costs at least a copy its compute hides behind), the engine sized for 8x the job's chunk: the same checks
 * (pages within the plan, tokens within the engine's size), the same answers.  adaptive_job() checks the budget
 * itself: passes carrying prompt tokens converge to <= 1.30x their clean pass and follow changes of the cost.
 * And for the larger jobs, the pre-run ETA — from the fit calibrated on the
 * jobs before — lands within 25% of the fake wall time (the target SPEC §5
 * sets for real runs; decided before the first run of this test) in at
 * least 90% of them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/util.h"
#include "batch/calib.h"
#include "batch/plan.h"
#include "batch/sample.h"
#include "batch/sched.h"
#include "engine/kv.h"
#include "model/gguf.h"
#include "text/tokenizer.h"
#include "test.h"

#define N_JOBS 10000
#define VOCAB 64
#define STOP_ID 7   /* the fake model's end-of-text id */
#define CTX_LEN 4096

typedef struct fake {
    kv_cache kv;
    int max_seqs, max_tokens;
    int32_t plan_pages;
    double clock, c0, c_tok, c_att;
    double C;                /* > 0: layers "stream": a pass costs at least C, the copy its compute hides behind */
    int change_at, passes;   /* from pass change_at on (0 never) the cost model is C2 and c_tok2 */
    double C2, c_tok2;
    uint64_t violations, picks;
    char what[200];
} fake;

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void violation(fake *f, const char *what)
{
    if (!f->violations++)
        snprintf(f->what, sizeof f->what, "%s", what);
}

static int fake_forward(void *impl, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen)
{
    fake *f = impl;
    int64_t tokens = 0;
    double att = 0;
    int li = 0;
    if (n_seqs > f->max_seqs)
        violation(f, "a pass carried more sequences than the engine was sized for");
    for (int s = 0; s < n_seqs; s++) {
        fwd_seq *q = &seqs[s];
        if (q->n < 1 || (int64_t)q->pos0 + q->n > (int64_t)q->kv->n_pages * f->kv.page_tokens) {
            violation(f, "a pass wrote past the pages its row reserved");
            continue;
        }
        for (int i = 0; i < q->n; i++) {
            int32_t pg = q->kv->pages[(q->pos0 + i) / f->kv.page_tokens];
            if (f->kv.ref[pg] != 1)
                violation(f, "a pass wrote into a KV page another row maps");
            *kv_key(&f->kv, q->kv, 0, 0, q->pos0 + i) = (float)q->tokens[i];
        }
        tokens += q->n;
        att += (double)q->n * q->pos0 + (double)q->n * (q->n + 1) / 2;
        if (!q->want_logits)
            continue;
        uint64_t h = 12345;
        for (int32_t p = 0; p < q->pos0 + q->n; p++)
            h = mix(h ^ (uint64_t)*kv_key(&f->kv, q->kv, 0, 0, p));
        float *lg = logits + (size_t)li * VOCAB;
        for (int v = 0; v < VOCAB; v++)
            lg[v] = (float)((double)(mix(h + (uint64_t)v) >> 40) / (double)(1u << 24) * 8.0 - 4.0);
        li++;
    }
    if (tokens > f->max_tokens)
        violation(f, "a pass carried more tokens than the engine was sized for");
    if (f->kv.n_pages - f->kv.n_free > f->plan_pages)
        violation(f, "more KV pages held than the plan gave");
    if (f->change_at && ++f->passes == f->change_at)
        f->C = f->C2, f->c_tok = f->c_tok2;
    double t = f->c0 + f->c_tok * (double)tokens + f->c_att * att;
    f->clock += t > f->C ? t : f->C;
    return 0;
}

/* The backend-side greedy pick (forward_pick) over the same fake logits: argmax with ties to the lowest id,
 * written straight into the runner's results; the runner samples the other rows from their logits. */
static int fake_forward_pick(void *impl, fwd_seq *seqs, int n_seqs, const int32_t *want, const int32_t *target,
                             struct sample_result *picks, float *logits, char *err, size_t errlen)
{
    fake *f = impl;
    int R = 0;
    for (int s = 0; s < n_seqs; s++)
        R += seqs[s].want_logits;
    float *all = malloc(((size_t)R + 1) * VOCAB * sizeof *all);
    if (!all)
        return util_errf(err, errlen, "out of memory.");
    int rc = fake_forward(impl, seqs, n_seqs, all, err, errlen);
    for (int k = 0; rc == 0 && k < R; k++) {
        const float *lg = all + (size_t)k * VOCAB;
        if (want[k] < -1) {
            memcpy(logits + (size_t)k * VOCAB, lg, VOCAB * sizeof *lg);
            continue;
        }
        if (want[k] != -1)
            violation(f, "a greedy pick asked for log-probs the row did not request");
        int best = 0;
        for (int v = 1; v < VOCAB; v++)
            if (lg[v] > lg[best])
                best = v;
        picks[k].token = best;
        picks[k].logprob = 0;
        picks[k].n_top = 0;
        f->picks++;
    }
    free(all);
    return rc;
}

static kv_cache *fake_kv(void *impl) { return &((fake *)impl)->kv; }
static int fake_kv_copy(void *impl, kv_row *dst, const kv_row *src, int32_t n)
{
    return kv_row_copy(&((fake *)impl)->kv, dst, src, n);
}
static void fake_close(void *impl) { (void)impl; }

/* One random job. */
typedef struct job_spec {
    int n_rows, batch, chunk, page_tokens;
    uint64_t budget;
    int32_t *prompt_len, *prompt_seed, *max_new, *n_choices, *seeded;
    int32_t *group, *prefix_len; /* shared jobs: the row's prefix group (-1 none) and its length in tokens */
    float *temp;
} job_spec;

static uint64_t g_rng = 0x5eed;
static uint32_t rnd(uint32_t n) { return (uint32_t)((g_rng = mix(g_rng)) % n); }

static void spec_make(job_spec *js, bool big, bool shared)
{
    memset(js, 0, sizeof *js);
    js->n_rows = big ? 40 + (int)rnd(60) : 1 + (int)rnd(16);
    js->batch = 1 + (int)rnd(big ? 24 : 12);
    js->chunk = 1 + (int)rnd(64);
    js->page_tokens = 1 + (int)rnd(16);
    js->prompt_len = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->prompt_seed = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->max_new = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->n_choices = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->seeded = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->temp = malloc(sizeof(float) * (size_t)js->n_rows);
    js->group = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->prefix_len = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    int32_t glen[4];
    int n_groups = 1 + (int)rnd(4);
    for (int g = 0; g < 4; g++)
        glen[g] = 1 + (int32_t)rnd(rnd(3) ? 60 : 150);
    for (int i = 0; i < js->n_rows; i++) {
        js->prompt_len[i] = 1 + (int32_t)rnd(rnd(4) ? 40 : 200);
        js->prompt_seed[i] = (int32_t)rnd(1u << 30);
        js->max_new[i] = 1 + (int32_t)rnd(rnd(3) ? 12 : 60);
        js->n_choices[i] = rnd(5) ? 1 : 2 + (int32_t)rnd(2);
        js->seeded[i] = rnd(2) == 0;
        js->temp[i] = js->seeded[i] ? 0.9f : 0.0f; /* unseeded rows are greedy: the same answer every run */
        js->group[i] = shared ? (int32_t)rnd((uint32_t)n_groups + 1) - 1 : -1;
        js->prefix_len[i] = 0;
        if (js->group[i] >= 0) { /* the group's start, then the row's own tail (none a quarter of the time) */
            js->prefix_len[i] = glen[js->group[i]];
            js->prompt_len[i] = js->prefix_len[i] + (rnd(4) ? 1 + (int32_t)rnd(40) : 0);
        }
    }
}

static void spec_free(job_spec *js)
{
    free(js->prompt_len);
    free(js->prompt_seed);
    free(js->max_new);
    free(js->n_choices);
    free(js->seeded);
    free(js->temp);
    free(js->group);
    free(js->prefix_len);
}

static tokenizer *g_tok;

/* The adaptive prompt budget's runs: what run_spec's engine and clock are, and a record of every pass. */
typedef struct pass_rec {
    int prompt;        /* prompt tokens the pass carried */
    bool probe;        /* the scheduler held it to the floor to measure the clean pass */
    bool clamped;      /* the adaptive budget bounded it (rows decoding were at least half the batch) */
    double secs, clean; /* its fake seconds, and what the same pass without its prompt tokens would have cost */
} pass_rec;
/* cap > 0: run_spec's engine is sized for cap prompt tokens per pass, the budget adapts (adapt), the pass cost is
 * max(C, c0 + c_tok * tokens + c_att * pairs), changed to C2 and c_tok2 from pass change_at on (0 never) */
static struct {
    int cap;
    bool adapt; /* false: the same engine and clock with cap as a constant chunk */
    double C, c0, c_tok, c_att;
    int change_at;
    double C2, c_tok2;
} g_ad;
static pass_rec *g_log; /* (g_log_cap) when set: one record per pass of the adaptive run */
static int g_log_n, g_log_cap;

/* What the pass loop below keeps per job: each choice's token ids, written at n_gen so that a preempted row's
 * recompute overwrites its first try, and the answers of the rows written. */
typedef struct drive {
    int32_t **toks; /* (n_rows * 3) per (row, choice): (max_new) ids */
    json_t *answers; /* custom_id -> {"choices": [{"tokens", "finish"}], "usage": {"prompt", "completion"}} */
    calib *cal;      /* this run's passes and finished choices */
    int twice;       /* rows written more than once */
} drive;

/* Applies one drawn token to a choice, as run.c's accept_token does minus the text: the end id, the sampler's
 * counts, the limits. */
static int accept(drive *d, sched *s, row *w, int c, int32_t tok, char *err, size_t errlen)
{
    choice *ch = &w->ch[c];
    if (tok == STOP_ID) {
        ch->done = true;
        ch->finish = OUT_FINISH_STOP;
        return 0;
    }
    if (sample_observe(&ch->ss, tok, err, errlen))
        return -1;
    d->toks[(w - s->rows) * 3 + c][ch->n_gen++] = tok;
    ch->next = tok;
    if (ch->n_gen >= w->max_new || ch->fed + 1 >= CTX_LEN) {
        ch->done = true;
        ch->finish = OUT_FINISH_LENGTH;
    }
    return 0;
}

/* Records the finished row at s->active[ai] and retires it. */
static void write_row(drive *d, sched *s, size_t ai)
{
    row *w = &s->rows[s->active[ai]];
    json_t *chs = json_array();
    int64_t completion = 0;
    for (int c = 0; c < w->n_choices; c++) {
        const choice *ch = &w->ch[c];
        json_t *t = json_array();
        for (int32_t k = 0; k < ch->n_gen; k++)
            json_array_append_new(t, json_integer(d->toks[(w - s->rows) * 3 + c][k]));
        json_array_append_new(chs, json_pack("{s:o,s:s}", "tokens", t, "finish",
                                             ch->finish == OUT_FINISH_STOP ? "stop" : "length"));
        calib_finish(d->cal, ch->n_gen, (double)w->max_new);
        completion += ch->n_gen;
    }
    d->twice += json_object_get(d->answers, w->custom_id) != NULL;
    json_object_set_new(d->answers, w->custom_id,
                        json_pack("{s:o,s:{s:i,s:I}}", "choices", chs, "usage", "prompt", (int)w->n_prompt,
                                  "completion", (json_int_t)completion));
    sched_retire_row(s, ai);
}

/* The job's pass loop, as run.c runs it: admit, build, forward (with backend picks when the backend has
 * them), finish the pass, draw and apply in sequence order (n > 1 rows share the prompt's pages), write the
 * rows that are done.  0, or -1 with a sentence. */
static int run_passes(drive *d, sched *s, fake *f, const spill_backend *be, sample_scratch *sc, char *err,
                      size_t errlen)
{
    int max_seqs = s->cfg.max_seqs;
    float *logits = malloc((size_t)max_seqs * VOCAB * sizeof *logits);
    sample_result *sres = malloc((size_t)max_seqs * sizeof *sres);
    int32_t *want = malloc((size_t)max_seqs * sizeof *want);
    int *sidx = malloc((size_t)max_seqs * sizeof *sidx);
    int rc = logits && sres && want && sidx ? 0 : util_errf(err, errlen, "out of memory.");
    while (rc == 0 && sched_pending(s)) {
        if (sched_admit(s, err, errlen)) {
            rc = -1;
            break;
        }
        double t0 = f->clock;
        int ns = sched_build_pass(s, err, errlen);
        if (ns < 0) {
            rc = -1;
            break;
        }
        if (ns == 0)
            continue;
        double tokens, att;
        sched_pass_work(s, &tokens, &att);
        int nl = 0;
        for (int q = 0; q < ns; q++)
            if (s->seqs[q].want_logits)
                sidx[nl++] = q;
        if (be->forward_pick) {
            for (int k = 0; k < nl; k++) {
                const row *w = &s->rows[s->seq_row[sidx[k]]];
                want[k] = w->sp.temperature == 0 && w->n_choices == 1 ? -1 : -2;
            }
            rc = be->forward_pick(be->impl, s->seqs, ns, want, NULL, sres, logits, err, errlen);
        } else {
            for (int k = 0; k < nl; k++)
                want[k] = -2;
            rc = be->forward(be->impl, s->seqs, ns, logits, err, errlen);
        }
        if (rc)
            break;
        sched_finish_pass(s);
        for (int li = 0; rc == 0 && li < nl; li++) {
            int q = sidx[li];
            row *w = &s->rows[s->seq_row[q]];
            int c = s->seq_choice[q];
            choice *ch = &w->ch[c];
            const float *lg = logits + (size_t)li * VOCAB;
            bool prompt_done = c == 0 && ch->fed == w->n_prompt && ch->n_gen == 0 && ch->next < 0;
            sample_result sr = sres[li];
            if (want[li] < -1 && sample_next(lg, VOCAB, &w->sp, &ch->ss, sc, &sr, err, errlen))
                rc = -1;
            if (rc == 0)
                rc = accept(d, s, w, c, sr.token, err, errlen);
            for (int o = 1; rc == 0 && prompt_done && o < w->n_choices; o++) {
                int sh = sched_share_prompt(s, w, o, err, errlen);
                if (sh < 0)
                    rc = -1;
                else if (sh == 1 && (sample_next(lg, VOCAB, &w->sp, &w->ch[o].ss, sc, &sr, err, errlen) ||
                                     accept(d, s, w, o, sr.token, err, errlen)))
                    rc = -1;
            }
        }
        for (size_t ai = 0; rc == 0 && ai < s->n_active;) {
            row *w = &s->rows[s->active[ai]];
            bool all = true;
            for (int c = 0; c < w->n_choices; c++)
                all &= w->ch[c].done;
            if (all)
                write_row(d, s, ai);
            else
                ai++;
        }
        calib_observe(d->cal, tokens, att, f->clock - t0);
        if (g_log && g_log_n < g_log_cap) {
            /* the clean pass of this one: its decode steps alone, under the cost model it ran with */
            double dt = 0, da = 0;
            for (int q = 0; q < ns; q++)
                if (s->seq_spec[q] >= 0) {
                    double n = s->seqs[q].n, p0 = s->seqs[q].pos0;
                    dt += n;
                    da += n * p0 + n * (n + 1) / 2;
                }
            double clean = f->c0 + f->c_tok * dt + f->c_att * da;
            g_log[g_log_n++] = (pass_rec){s->pass_prompt, s->chunk.probe, s->pass_clamped, f->clock - t0, clean > f->C ? clean : f->C};
        }
        sched_observe_pass(s, f->clock - t0);
        if (rc == 0 && s->cfg.kv_check && sched_check(s, err, errlen))
            rc = -1;
    }
    free(logits);
    free(sres);
    free(want);
    free(sidx);
    return rc;
}

/* Runs the job; tight = under the plan for js->budget, else room for every row at once.
 * Returns the answers (NULL on failure); *wall = fake seconds; *eta = pre-run estimate under fit. */
/* reserve: 0 = --batch (admission by prompt pages, preemption as rows grow); 1 = batch from memory with every
 * row planned at max_tokens (cfg.reserve: must never preempt); 2 = from memory with rows planned at a quarter of
 * max_tokens (admits more, may preempt). */
/* prefix: 0 off, 1 the prefix cache with the page copy, 2 without a page copy (choices compute their tails);
 * *cached (may be NULL) adds the prompt tokens rows mapped. */
static json_t *run_spec(const job_spec *js, bool tight, bool pick, int reserve, int prefix, calib *fit, double *wall,
                        double *eta, int *preempt, uint64_t *picks, uint64_t *cached)
{
    char err[SPILL_ERRLEN] = "";
    size_t n_rows = (size_t)js->n_rows;
    row *rows = calloc(n_rows, sizeof *rows);
    int max_n = 1;
    int64_t all_pages = 0;
    int32_t P = js->page_tokens, want, min_pages;
    int32_t *need = malloc(sizeof(int32_t) * n_rows);
    drive d = {calloc(n_rows * 3, sizeof(int32_t *)), json_object(), NULL, 0};
    calib run;
    memset(&run, 0, sizeof run);
    d.cal = &run;
    for (size_t i = 0; i < n_rows; i++) {
        row *w = &rows[i];
        char id[32];
        snprintf(id, sizeof id, "row-%zu", i);
        w->custom_id = strdup(id);
        w->model = strdup("fake");
        w->endpoint = REQ_EP_CHAT;
        w->line = i + 1;
        w->n_prompt = js->prompt_len[i];
        w->prompt = malloc(sizeof(int32_t) * (size_t)w->n_prompt);
        uint64_t h = (uint64_t)js->prompt_seed[i], hg = 1000 + (uint64_t)js->group[i];
        for (int32_t k = 0; k < w->n_prompt; k++)
            w->prompt[k] = 17 + (int32_t)((k < js->prefix_len[i] ? (hg = mix(hg)) : (h = mix(h))) % (VOCAB - 17));
        w->max_new = js->max_new[i];
        w->expect_new = reserve == 2 ? (w->max_new + 3) / 4 : 0;
        w->n_choices = js->n_choices[i];
        w->sp = (sample_params){js->temp[i], 1.0f, 0, 0, 0, 0, NULL, NULL, false, 0, 0, 0, NULL, 0};
        w->has_seed = js->seeded[i];
        w->seed = js->prompt_seed[i];
        w->state = ROW_PENDING;
        for (int c = 0; c < w->n_choices; c++)
            d.toks[i * 3 + c] = malloc(sizeof(int32_t) * (size_t)w->max_new);
        max_n = w->n_choices > max_n ? w->n_choices : max_n;
        need[i] = (int32_t)((w->n_prompt + w->max_new + P - 1) / P * w->n_choices);
        all_pages += need[i];
    }
    int max_seqs = js->batch + max_n;
    plan_kv_want(need, n_rows, js->batch, &want, &min_pages);
    free(need);
    /* the plan: process, weights and pass buffers are fixed costs; KV pages the rest */
    uint64_t page_bytes = (uint64_t)P * 2 * 4;
    mem_need mn = {tight ? js->budget : (uint64_t)1 << 40, 1u << 20, 2u << 20, 0, 512u << 10, 0, page_bytes,
                   (int32_t)(tight ? want : all_pages), min_pages, 2, 0};
    mem_plan plan;
    json_t *ans = NULL;
    fake f;
    memset(&f, 0, sizeof f);
    sched s;
    memset(&s, 0, sizeof s);
    sample_scratch sc;
    memset(&sc, 0, sizeof sc);
    if (plan_solve(&mn, &plan, err, sizeof err)) {
        CHECK(0, "plan for a %llu-byte budget: %s", (unsigned long long)mn.budget, err);
        goto out;
    }
    CHECK(plan.total <= mn.budget, "plan of %llu bytes over the %llu budget", (unsigned long long)plan.total,
          (unsigned long long)mn.budget);
    int chunk = g_ad.cap > 0 ? g_ad.cap : js->chunk;
    f.max_seqs = max_seqs;
    f.max_tokens = max_seqs + chunk;
    f.plan_pages = plan.kv_pages;
    f.c0 = 0.5;
    f.c_tok = 0.01;
    f.c_att = 1e-5;
    if (g_ad.cap > 0) {
        f.C = g_ad.C, f.c0 = g_ad.c0, f.c_tok = g_ad.c_tok, f.c_att = g_ad.c_att;
        f.change_at = g_ad.change_at, f.C2 = g_ad.C2, f.c_tok2 = g_ad.c_tok2;
    }
    if (kv_create(&f.kv, 1, 1, 1, P, plan.kv_pages, err, sizeof err) ||
        sample_scratch_init(&sc, VOCAB, err, sizeof err)) {
        CHECK(0, "set-up: %s", err);
        goto out;
    }
    spill_backend be = {&f, "fake", 0, fake_forward, fake_kv, prefix == 2 ? NULL : fake_kv_copy, fake_close, NULL, NULL, NULL, false};
    if (pick)
        be.forward_pick = fake_forward_pick;
    int unfit = 0; /* the runner would fail these rows into errors.jsonl before sched_init */
    for (size_t i = 0; i < n_rows; i++)
        unfit += sched_row_pages(&f.kv, &rows[i], prefix > 0) > f.kv.n_pages;
    CHECK(unfit == 0, "%d rows need more pages than the cache's %d", unfit, f.kv.n_pages);
    sched_cfg cfg = {&be, g_tok, VOCAB, 0, js->batch, max_seqs, chunk, 0, max_seqs, reserve > 0, prefix > 0,
                     prefix > 0, 0, g_ad.cap > 0 && g_ad.adapt, NULL};
    if (sched_init(&s, &cfg, rows, n_rows, err, sizeof err)) {
        CHECK(0, "sched_init: %s", err);
        goto out;
    }
    *eta = sched_estimate(&s, fit);
    if (run_passes(&d, &s, &f, &be, &sc, err, sizeof err)) {
        CHECK(0, "run_passes: %s", err);
        goto out;
    }
    *wall = f.clock;
    *preempt = (int)s.preemptions;
    *picks = f.picks;
    CHECK(f.violations == 0, "%llu violations: %s", (unsigned long long)f.violations, f.what);
    size_t done = 0;
    for (size_t i = 0; i < n_rows; i++)
        done += rows[i].state == ROW_DONE;
    CHECK(!sched_pending(&s) && done == n_rows && json_object_size(d.answers) == n_rows && d.twice == 0,
          "%zu of %zu rows done, %zu answers, %d rows written twice", done, n_rows, json_object_size(d.answers),
          d.twice);
    for (size_t i = 0; cached && i < n_rows; i++)
        *cached += (uint64_t)rows[i].cached;
    calib_merge(fit, &run);
    ans = d.answers;
    d.answers = NULL;
out:
    sched_free(&s);
    for (size_t i = 0; i < n_rows; i++)
        sched_row_free(&rows[i]);
    free(rows);
    for (size_t i = 0; i < n_rows * 3; i++)
        free(d.toks[i]);
    free(d.toks);
    json_decref(d.answers);
    sample_scratch_free(&sc);
    kv_destroy(&f.kv);
    return ans;
}
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The adaptive prompt budget on a streamed fake (a pass costs max(C, c0 + c_tok * tokens + c_att * pairs)):
 * 120 rows of 1,500-2,500-token prompts, 40 at once, the engine sized for 4,096 prompt tokens a pass, the cost
 * model changed at pass change_at (0 never) to C2 / c_tok2.  Checks, with bounds decided before the first run:
 *   - every carrying pass the budget bounded (a probe aside; the budget bounds a pass when rows decoding are at
 *     least half the batch) costs <= 1.30x its clean pass (the bound; the target is
 *     1.25x) once `grace` such passes have passed since the start or the change (the controller converges
 *     geometrically from the first guess; a clean pass that shrank is only seen at the next probe);
 *   - the median carrying pass after those is >= 1.10x its clean pass: the budget uses the copy's shadow
 *     instead of crawling at the floor;
 *   - no pass carries more prompt tokens than the engine's cap, and run_spec's checks hold (pages within the
 *     plan, tokens within the engine's size);
 *   - the answers equal those of a constant chunk of 4,096 and of 100 (chunking never changes a row's tokens). */
static void adaptive_job(const char *what, int change_at, double C2, double c_tok2, int grace)
{
    job_spec js;
    memset(&js, 0, sizeof js);
    js.n_rows = 120;
    js.batch = 40;
    js.page_tokens = 16;
    size_t n = (size_t)js.n_rows;
    js.prompt_len = malloc(sizeof(int32_t) * n);
    js.prompt_seed = malloc(sizeof(int32_t) * n);
    js.max_new = malloc(sizeof(int32_t) * n);
    js.n_choices = malloc(sizeof(int32_t) * n);
    js.seeded = malloc(sizeof(int32_t) * n);
    js.temp = malloc(sizeof(float) * n);
    js.group = malloc(sizeof(int32_t) * n);
    js.prefix_len = malloc(sizeof(int32_t) * n);
    for (size_t i = 0; i < n; i++) {
        js.prompt_len[i] = 1500 + (int32_t)rnd(1000);
        js.prompt_seed[i] = (int32_t)rnd(1u << 30);
        js.max_new[i] = 20 + (int32_t)rnd(40);
        js.n_choices[i] = 1;
        js.seeded[i] = rnd(2) == 0;
        js.temp[i] = js.seeded[i] ? 0.9f : 0.0f;
        js.group[i] = -1;
        js.prefix_len[i] = 0;
    }
    calib scratch;
    memset(&scratch, 0, sizeof scratch);
    double wall, eta;
    int pre;
    uint64_t np;
    g_ad.cap = 4096;
    g_ad.adapt = true;
    g_ad.C = 1.0, g_ad.c0 = 0.1, g_ad.c_tok = 5e-4, g_ad.c_att = 1e-8;
    g_ad.change_at = change_at, g_ad.C2 = C2, g_ad.c_tok2 = c_tok2;
    g_log_cap = 4096;
    g_log_n = 0;
    g_log = malloc(sizeof *g_log * (size_t)g_log_cap);
    json_t *a = run_spec(&js, false, false, 0, 0, &scratch, &wall, &eta, &pre, &np, NULL);
    double wall_a = wall;
    int passes = g_log_n;
    pass_rec *log = g_log;
    g_log = NULL;
    g_ad.adapt = false; /* the same engine and clock, constant chunks */
    json_t *b = run_spec(&js, false, false, 0, 0, &scratch, &wall, &eta, &pre, &np, NULL);
    double wall_b = wall;
    g_ad.cap = 100;
    json_t *c = run_spec(&js, false, false, 0, 0, &scratch, &wall, &eta, &pre, &np, NULL);
    double wall_c = wall;
    g_ad.cap = 0;
    CHECK(a && b && json_equal(a, b), "%s: the adaptive budget answered differently from a constant 4,096", what);
    CHECK(a && c && json_equal(a, c), "%s: the adaptive budget answered differently from a constant 100", what);
    double *ratios = malloc(sizeof(double) * (size_t)(passes + 1));
    int counted = 0, over = 0, since = 0, probes = 0, capped = 0;
    double worst = 0;
    for (int p = 1; p < passes; p++) { /* pass 0 is the warm-up */
        const pass_rec *q = &log[p];
        capped += q->clamped && q->prompt > 4096; /* unbounded passes take the constant's share, run_spec checks the engine's size */
        if (change_at && p == change_at - 1)
            since = 0;
        if (q->probe) {
            probes++;
            continue;
        }
        if (q->prompt == 0 || !q->clamped || ++since <= grace)
            continue;
        double r = q->secs / q->clean;
        ratios[counted++] = r;
        over += r > 1.30;
        worst = r > worst ? r : worst;
    }
    qsort(ratios, (size_t)counted, sizeof *ratios, cmp_double);
    double med = counted ? ratios[counted / 2] : 0;
    CHECK(capped == 0, "%s: %d passes carried more prompt tokens than the engine's 4,096", what, capped);
    CHECK(counted >= 30, "%s: only %d carrying passes to judge", what, counted);
    CHECK(over == 0, "%s: %d of %d carrying passes over 1.30x their clean pass (worst %.2fx)", what, over, counted,
          worst);
    CHECK(med >= 1.10, "%s: the median carrying pass is %.2fx its clean pass: the budget starves", what, med);
    fprintf(stderr, "adaptive prompt budget, %s: %d passes, %d probes, %d carrying judged: median %.2fx, worst "
            "%.2fx the clean pass; fake wall %.0f s (constant 4,096: %.0f s, 100: %.0f s)\n", what, passes, probes,
            counted, med, worst, wall_a, wall_b, wall_c);
    free(ratios);
    free(log);
    json_decref(a);
    json_decref(b);
    json_decref(c);
    spec_free(&js);
}

int main(void)
{
    char err[SPILL_ERRLEN];
    gguf_file *gf = NULL;
    CHECK(gguf_open("tests/data/tiny/tiny-smollm2.gguf", &gf, err, sizeof err) == 0, "%s", err);
    CHECK(gf && tokenizer_from_gguf(gf, &g_tok, err, sizeof err) == 0, "%s", err);
    if (!g_tok)
        return test_finish("test_sched");

    adaptive_job("steady cost", 0, 1.0, 5e-4, 8);
    adaptive_job("prompt tokens twice as dear from pass 40", 40, 1.0, 1e-3, 8);
    adaptive_job("clean pass 1.6x longer from pass 40", 40, 1.6, 5e-4, 8);
    adaptive_job("clean pass 0.6x from pass 40", 40, 0.6, 5e-4, CHUNK_PROBE_EVERY + 8);

    calib fit;
    memset(&fit, 0, sizeof fit);
    int jobs = 0, big = 0, big_ok = 0, preempted_jobs = 0, differ = 0, reserve_jobs = 0, reserve_pre = 0;
    uint64_t picked = 0, cached = 0;
    int shared_jobs = 0, shared_differ = 0, adapt_jobs = 0, adapt_differ = 0;
    double worst = 0;
    for (int j = 0; j < N_JOBS && test_failures < 20; j++) {
        job_spec js;
        bool is_big = j % 50 == 49, shared = j % 3 == 1;
        spec_make(&js, is_big, shared);
        /* a budget between "the longest row alone" and "the whole batch at once" */
        int64_t longest = 0, sum = 0;
        for (int i = 0; i < js.n_rows; i++) {
            int64_t pg = (js.prompt_len[i] + js.max_new[i] + js.page_tokens - 1) / js.page_tokens * js.n_choices[i];
            longest = pg > longest ? pg : longest;
            sum += pg;
        }
        uint64_t fixed = (1u << 20) + (2u << 20) + (512u << 10);
        uint64_t kvb = (uint64_t)(longest + (int64_t)rnd((uint32_t)(sum - longest + 1))) * js.page_tokens * 8;
        /* solve budget - slack(budget) = fixed + kvb */
        js.budget = (uint64_t)((double)(fixed + kvb + (4u << 20)) * 50.0 / 49.0) + 64;
        double wt = 0, wr = 0, eta = -1, eta2;
        int pre = 0, pre2;
        calib before = fit;
        uint64_t np = 0, np2;
        /* odd jobs: the tight run lets the backend pick greedy rows (forward_pick), the roomy run samples
         * every row itself: the answers must still agree */
        json_t *a = run_spec(&js, true, j % 2 == 1, 0, 0, &fit, &wt, &eta, &pre, &np, NULL);
        json_t *b = run_spec(&js, false, false, 0, 0, &before, &wr, &eta2, &pre2, &np2, NULL);
        if (shared) { /* the prefix cache under the same tight plan, with and without a page copy */
            calib scratch = before;
            double w3, e3;
            int pre3;
            uint64_t np3;
            for (int px = 1; px <= 2; px++) {
                json_t *c = run_spec(&js, true, px == 2, j % 8 == 4 ? 2 : 0, px, &scratch, &w3, &e3, &pre3, &np3,
                                     &cached);
                bool same = c && b && json_equal(c, b);
                CHECK(same, "job %d: the prefix cache (%s) answered differently", j,
                      px == 1 ? "page copy" : "no page copy");
                shared_differ += !same;
                json_decref(c);
            }
            shared_jobs++;
        }
        if (j % 4 == 2) { /* the batch from memory's reserving admission under the same tight plan */
            calib scratch = before;
            double w3, e3;
            int pre3;
            uint64_t np3;
            for (int rv = 1; rv <= 2; rv++) {
                json_t *c = run_spec(&js, true, false, rv, 0, &scratch, &w3, &e3, &pre3, &np3, NULL);
                CHECK(c && b && json_equal(c, b), "job %d: reserving admission (rows planned at %s) answered "
                      "differently", j, rv == 1 ? "max_tokens" : "a quarter of it");
                if (rv == 1)
                    CHECK(pre3 == 0, "job %d: reserving admission at max_tokens preempted %d rows", j, pre3);
                reserve_jobs++, reserve_pre += rv == 2 && pre3 > 0;
                json_decref(c);
            }
            /* with the prefix cache the reserving admission counts a shared page once and a choice's mapped
             * pages as its own entries: planned at max_tokens, it still never preempts */
            json_t *c = run_spec(&js, true, false, 1, 1, &scratch, &w3, &e3, &pre3, &np3, NULL);
            CHECK(c && b && json_equal(c, b), "job %d: reserving admission with the prefix cache answered differently",
                  j);
            CHECK(pre3 == 0, "job %d: reserving admission at max_tokens with the prefix cache preempted %d rows", j,
                  pre3);
            json_decref(c);
        }
        if (j % 5 == 3) { /* the adaptive prompt budget under the same tight plan, on a streamed fake clock */
            calib scratch = before;
            double w3, e3;
            int pre3;
            uint64_t np3;
            g_ad.cap = js.chunk * 8;
            g_ad.adapt = true;
            g_ad.C = 1.0, g_ad.c0 = 0.2, g_ad.c_tok = 0.01, g_ad.c_att = 1e-5, g_ad.change_at = 0;
            json_t *c = run_spec(&js, true, j % 2 == 1, j % 4 == 3 ? 2 : 0, shared ? 1 : 0, &scratch, &w3, &e3, &pre3,
                                 &np3, NULL);
            g_ad.cap = 0;
            bool same = c && b && json_equal(c, b);
            CHECK(same, "job %d: the adaptive prompt budget answered differently", j);
            adapt_jobs++, adapt_differ += !same;
            json_decref(c);
        }
        picked += np;
        if (a && b && !json_equal(a, b)) {
            if (differ++ < 3) {
                const char *k;
                json_t *v;
                json_object_foreach(b, k, v) if (!json_equal(v, json_object_get(a, k)))
                {
                    char *x = json_dumps(v, JSON_COMPACT), *y = json_dumps(json_object_get(a, k), JSON_COMPACT);
                    fprintf(stderr, "job %d %s: roomy %.300s\n   tight %.300s\n", j, k, x, y ? y : "(none)");
                    free(x);
                    free(y);
                    break;
                }
            }
        }
        preempted_jobs += pre > 0;
        if (is_big && eta > 0 && wt > 0) {
            double e = fabs(eta - wt) / wt;
            big++;
            big_ok += e <= 0.25;
            if (e > 0.25 && getenv("SCHED_VERBOSE"))
                fprintf(stderr, "job %d: eta %.1f wall %.1f (%+.0f%%) rows %d batch %d chunk %d page %d preempt %d\n", j,
                        eta, wt, (eta - wt) / wt * 100, js.n_rows, js.batch, js.chunk, js.page_tokens, pre);
            worst = e > worst ? e : worst;
        }
        json_decref(a);
        json_decref(b);
        spec_free(&js);
        jobs++;
    }
    CHECK(differ == 0, "%d of %d jobs answered differently under the tight plan", differ, jobs);
    CHECK(cached > 10000, "the prefix cache mapped only %llu prompt tokens over %d shared jobs",
          (unsigned long long)cached, shared_jobs);
    CHECK(picked > 1000, "only %llu tokens were picked by the backend", (unsigned long long)picked);
    CHECK(preempted_jobs > jobs / 20, "only %d of %d jobs preempted a row: the budgets did not bite", preempted_jobs,
          jobs);
    CHECK(big >= 150 && big_ok * 10 >= big * 9, "pre-run ETA within 25%% on %d of %d larger jobs (worst %.0f%%)",
          big_ok, big, worst * 100);
    fprintf(stderr,
            "%d jobs, %d with preemptions, %llu greedy tokens picked by the backend; pre-run ETA within 25%% on %d of "
            "%d larger jobs (worst %.0f%%); %d reserving runs (%d planned at a quarter of max_tokens preempted); "
            "%d jobs with shared prefixes run with the prefix cache twice each (%d differed), %llu prompt tokens "
            "mapped; %d jobs with the adaptive prompt budget (%d differed)\n",
            jobs, preempted_jobs, (unsigned long long)picked, big_ok, big, worst * 100, reserve_jobs, reserve_pre,
            shared_jobs, shared_differ, (unsigned long long)cached, adapt_jobs, adapt_differ);
    tokenizer_free(g_tok);
    gguf_close(gf);
    return test_finish("test_sched");
}
