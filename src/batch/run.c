/*
 * run.c — `spill run` and `spill resume`: the job runner and its scheduler.
 *
 * Owns: the pass loop (admission, prefill chunks mixed with decode steps, sampling,
 * detokenization, stop handling), preemption when KV pages run out, durable
 * output through job.c (one group commit per pass), and what the user sees
 * (pre-run line, progress line, live tail, plain log lines when stdout is not
 * a terminal).
 *
 * It drives whichever backend the binary has (engine.h spill_backend: the CPU
 * engine, or the GPU engine that build/cuda/spill-cuda registers), and prices
 * passes for the ETA from the calibration store (calib.c).
 *
 * Beside it: run_rows.c (input lines into rows: parse, template,
 * tokenize), run_opts.c (the command line), run_internal.h (the types they
 * share).
 *
 * Does not own: the forward pass (forward.c, src/cuda/), kernels, sampling
 * maths (sample.c), stop-string matching (stop.c), line formats (output.c),
 * the on-disk job protocol (job.c).
 *
 * Scheduling, in one paragraph: rows wait in a queue ordered longest-first
 * (prompt + max new tokens), so the expensive rows start early and the end
 * tail is made of short ones.  Every pass carries one decode token for every
 * active choice, then prompt chunks of admitted rows up to a per-pass token
 * cap, all through the same matmuls.  A row is admitted when a batch slot is
 * free and the KV arena can hold its prompt while leaving one page of growth
 * per active choice; pages are reserved as positions are written.  If a
 * choice needs a page and none is free, the most recently admitted row is
 * preempted — even when it is the row asking, so the oldest row always
 * advances and no two rows can evict each other forever: its pages are freed
 * and it goes back to the head of the queue to be recomputed from scratch,
 * which yields the same tokens because a row's logits never depend on its
 * batch-mates and its RNG restarts from its seed.  When every admitted row is
 * mid-prompt and none can get a page, the newest is preempted the same way.
 *
 * Memory: the plan (plan.c, make_plan below) sizes the KV arena from the one
 * budget and picks resident or streamed weights; a live RSS guard pauses
 * admission near the budget; every pass records the measured excess over the
 * plan, stored as a fit.  The ETA (estimate_left) replays this scheduling
 * policy on the rows' expected lengths, priced by the pass-cost fit.
 * tests/test_sched.c compiles this file to drive the scheduler on a fake
 * engine and clock.
 */
#include "run.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "run_internal.h"
#include "../base/util.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

/* Tests drive the scheduler on a fake clock (tests/test_sched.c). */
static double (*g_fake_clock)(void);

static double now_s(void)
{
    if (g_fake_clock)
        return g_fake_clock();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- rows */

static void choice_free(choice *c, kv_cache *kv)
{
    kv_row_free(kv, &c->kv);
    sample_state_free(&c->ss);
    tok_stream_free(c->ts);
    stop_free(&c->sm);
    free(c->text);
    free(c->lp);
    free(c->alts);
    memset(c, 0, sizeof *c);
}

static void row_release(runner *r, row *w)
{
    if (w->ch)
        for (int c = 0; c < w->n_choices; c++)
            choice_free(&w->ch[c], r->be.kv(r->be.impl));
    free(w->ch);
    w->ch = NULL;
}

static void row_free(row *w)
{
    free(w->custom_id);
    free(w->model);
    free(w->prompt);
    for (int i = 0; i < w->n_stop; i++)
        free(w->stop[i]);
    free(w->bias_id);
    free(w->bias);
}

/* ---------------------------------------------------------------- scheduling */

static int64_t row_cost(const row *w) { return (int64_t)w->n_prompt + w->max_new; }

static const runner *g_sort_runner;
static int cmp_longest(const void *a, const void *b)
{
    const row *x = &g_sort_runner->rows[*(const size_t *)a], *y = &g_sort_runner->rows[*(const size_t *)b];
    int64_t cx = row_cost(x), cy = row_cost(y);
    if (cx != cy)
        return cx > cy ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static int32_t active_choices(const runner *r)
{
    int32_t n = 0;
    for (size_t i = 0; i < r->n_active; i++)
        n += r->rows[r->active[i]].n_choices;
    return n;
}

static int start_row(runner *r, row *w, char *err, size_t errlen)
{
    w->ch = calloc((size_t)w->n_choices, sizeof *w->ch);
    if (!w->ch)
        return util_errf(err, errlen, "out of memory admitting row %s.", w->custom_id);
    for (int c = 0; c < w->n_choices; c++) {
        choice *ch = &w->ch[c];
        ch->next = -1;
        /* Seeded rows key the RNG by (seed, choice); unseeded rows by the job seed and (line, choice). */
        uint64_t seed = w->has_seed ? (uint64_t)w->seed : r->job_seed;
        uint64_t stream = w->has_seed ? (uint64_t)c : ((uint64_t)w->line << 8) ^ (uint64_t)c;
        const char *sp[REQ_MAX_STOP];
        for (int i = 0; i < w->n_stop; i++)
            sp[i] = w->stop[i];
        if (sample_state_init(&ch->ss, &w->sp, seed, stream, r->m->vocab, w->max_new, err, errlen) ||
            tok_stream_init(r->tok, true, &ch->ts, err, errlen) ||
            stop_init(&ch->sm, sp, w->stop_len, w->n_stop, err, errlen))
            return -1;
        if (w->sp.logprobs) {
            ch->lp = calloc((size_t)(w->max_new > 0 ? w->max_new : 1), sizeof *ch->lp);
            ch->alts = calloc((size_t)(w->max_new > 0 ? w->max_new : 1) * (size_t)(w->sp.n_top_logprobs + 1),
                              sizeof *ch->alts);
            if (!ch->lp || !ch->alts)
                return util_errf(err, errlen, "out of memory for the log-probs of row %s.", w->custom_id);
        }
    }
    w->state = ROW_ACTIVE;
    w->admitted = ++r->admit_serial;
    r->active[r->n_active++] = (size_t)(w - r->rows);
    return 0;
}

/* Frees the row's pages and state and puts it back at the head of the queue. */
static void preempt(runner *r, size_t ai)
{
    size_t idx = r->active[ai];
    row *w = &r->rows[idx];
    row_release(r, w);
    w->state = ROW_PENDING;
    w->preempted++;
    r->preemptions++;
    memmove(r->active + ai, r->active + ai + 1, (r->n_active - ai - 1) * sizeof *r->active);
    r->n_active--;
    r->queue[--r->q_head] = idx;
    r->q_len++;
}

/* Reserves pages for `need` positions of choice c, preempting the newest other rows if needed.
 * Returns 0, 1 when the choice's own row was preempted (caller skips it), -1 on error. */
static int reserve(runner *r, size_t row_idx, choice *c, int32_t need)
{
    kv_cache *kv = r->be.kv(r->be.impl);
    for (;;) {
        int rc = kv_row_reserve(kv, &c->kv, need);
        if (rc == 0)
            return 0;
        if (rc == -2)
            return -1;
        /* the newest admitted row goes, even when that is the one asking: the oldest row always
         * advances, so two rows can never take turns preempting each other forever */
        size_t victim = 0;
        for (size_t i = 1; i < r->n_active; i++)
            if (r->rows[r->active[i]].admitted > r->rows[r->active[victim]].admitted)
                victim = i;
        if (r->active[victim] == row_idx) {
            preempt(r, victim);
            return 1;
        }
        preempt(r, victim);
    }
}

static void admit(runner *r, char *err, size_t errlen, int *rc)
{
    kv_cache *kv = r->be.kv(r->be.impl);
    /* the live guard: the plan is the primary control; near the budget, no newcomers this pass */
    if (r->q_len && r->n_active > 0 && r->plan.guard && plan_rss_now() > r->plan.guard) {
        r->guard_pauses++;
        return;
    }
    while (r->q_len && (int)r->n_active < r->o.batch) {
        row *w = &r->rows[r->queue[r->q_head]];
        /* the prompt of every choice, plus one page of growth for every choice already running */
        int32_t need = kv_pages_for(kv, w->n_prompt + 1) * w->n_choices + active_choices(r);
        if ((need > kv->n_free || active_choices(r) + w->n_choices > r->max_seqs) && r->n_active > 0)
            break;
        r->q_head++;
        r->q_len--;
        if (start_row(r, w, err, errlen)) {
            *rc = -1;
            return;
        }
    }
}

/* ---------------------------------------------------------------- output */

static int text_append(choice *c, const char *s, size_t n)
{
    if (c->text_len + n + 1 > c->text_cap) {
        size_t cap = c->text_cap ? c->text_cap : 256;
        while (cap < c->text_len + n + 1)
            cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t)
            return -1;
        c->text = t;
        c->text_cap = cap;
    }
    memcpy(c->text + c->text_len, s, n);
    c->text_len += n;
    c->text[c->text_len] = 0;
    return 0;
}

static int finish_row(runner *r, size_t ai, char *err, size_t errlen)
{
    size_t idx = r->active[ai];
    row *w = &r->rows[idx];
    out_choice *oc = calloc(w->n_choices > 0 ? (size_t)w->n_choices : 1, sizeof *oc);
    if (!oc)
        return util_errf(err, errlen, "out of memory writing row %s.", w->custom_id);
    uint64_t completion = 0;
    for (int c = 0; c < w->n_choices; c++) {
        choice *ch = &w->ch[c];
        calib_finish(&r->cal_run, ch->n_gen, (double)w->max_new);
        oc[c] = (out_choice){ch->text ? ch->text : "", ch->text_len, ch->finish, w->sp.logprobs,
                             (size_t)ch->n_gen, ch->lp};
        completion += (uint64_t)ch->n_gen;
    }
    out_result res = {w->custom_id, w->model, r->sys_fp, (int64_t)time(NULL), (size_t)w->n_choices, oc,
                      (uint64_t)w->n_prompt, completion, &r->stamp};
    char *line;
    size_t len;
    int rc = w->endpoint == REQ_EP_CHAT ? output_chat_line(&res, NULL, &line, &len, err, errlen)
                                        : output_completion_line(&res, NULL, &line, &len, err, errlen);
    free(oc);
    if (rc == 0) {
        rc = job_append_result(r->j, line, len, err, errlen);
        free(line);
        if (rc == -1) /* the write failed: the job is broken and stops */
            return -1;
    }
    if (rc) {
        /* An answer the store refuses (or that cannot be built) fails this row alone: the next pass, and a
         * resume, must not meet it again. */
        char msg[SPILL_ERRLEN + 64];
        snprintf(msg, sizeof msg, "spill could not write this row's answer: %s", err);
        if (run_append_status_line(r, w->custom_id, 500, msg, NULL, "output_refused", err, errlen))
            return -1;
    } else
        r->rows_done++;
    row_release(r, w);
    w->state = ROW_DONE;
    free(w->prompt);
    w->prompt = NULL;
    memmove(r->active + ai, r->active + ai + 1, (r->n_active - ai - 1) * sizeof *r->active);
    r->n_active--;
    return 0;
}

/* Pushes detokenized text through the stop matcher into the choice's text.
 * Returns 1 when a stop string matched, 0 to go on, -1 with a sentence. */
static int emit(choice *c, const char *t, size_t tl, char *err, size_t errlen)
{
    size_t cap = stop_out_cap(&c->sm, tl), ol;
    char *o = cap == SIZE_MAX ? NULL : malloc(cap + 1);
    if (!o)
        return util_errf(err, errlen, "out of memory emitting text.");
    int m = stop_push(&c->sm, t, tl, o, cap, &ol, err, errlen);
    if (m >= 0 && text_append(c, o, ol))
        m = util_errf(err, errlen, "out of memory emitting text.");
    free(o);
    return m;
}

/* Ends a choice: flushes the detokenizer and the bytes the stop matcher held back. */
static int finish_choice(choice *c, out_finish why, char *err, size_t errlen)
{
    char *t;
    size_t tl;
    if (tok_stream_flush(c->ts, &t, &tl, err, errlen))
        return -1;
    int m = emit(c, t, tl, err, errlen);
    free(t);
    if (m < 0)
        return -1;
    if (m == 0) {
        size_t cap = stop_out_cap(&c->sm, 0), ol;
        char *o = malloc(cap + 1);
        if (!o)
            return util_errf(err, errlen, "out of memory emitting text.");
        int rc = stop_finish(&c->sm, o, cap, &ol, err, errlen);
        if (rc == 0 && text_append(c, o, ol))
            rc = util_errf(err, errlen, "out of memory emitting text.");
        free(o);
        if (rc)
            return -1;
    }
    c->done = true;
    c->finish = m == 1 ? OUT_FINISH_STOP : why;
    return 0;
}

/* Applies one sampled token to a choice: end ids, log-probs, text, stop strings, limits. */
static int accept_token(runner *r, row *w, choice *c, const sample_result *sr, char *err, size_t errlen)
{
    int32_t tok = sr->token;
    for (size_t i = 0; i < r->m->n_stop; i++)
        if (r->m->stop_ids[i] == tok)
            return finish_choice(c, OUT_FINISH_STOP, err, errlen);
    if (sample_observe(&c->ss, tok, err, errlen))
        return -1;
    if (c->lp) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(r->tok, tok, &bl);
        out_token *ot = &c->lp[c->n_gen];
        out_alt *alts = c->alts + (size_t)c->n_gen * (size_t)(w->sp.n_top_logprobs + 1);
        *ot = (out_token){(const char *)b, b ? bl : 0, sr->logprob, (size_t)sr->n_top, alts};
        for (int k = 0; k < sr->n_top; k++) {
            const uint8_t *ab = tokenizer_token_bytes(r->tok, sr->top_id[k], &bl);
            alts[k] = (out_alt){(const char *)ab, ab ? bl : 0, sr->top_logprob[k]};
        }
    }
    c->n_gen++;
    r->tokens_generated++;
    c->next = tok;
    char *t;
    size_t tl;
    if (tok_stream_push(c->ts, tok, &t, &tl, err, errlen))
        return -1;
    int m = emit(c, t, tl, err, errlen);
    free(t);
    if (m < 0)
        return -1;
    if (m == 1) {
        c->done = true;
        c->finish = OUT_FINISH_STOP;
    } else if (c->n_gen >= w->max_new || c->fed + 1 >= r->m->ctx_len)
        return finish_choice(c, OUT_FINISH_LENGTH, err, errlen);
    return 0;
}

/* ---------------------------------------------------------------- estimates */

/* One row's remaining work in the estimate's simulation. */
typedef struct sim_row {
    double prompt_left, fed, gen_left, gen, pages;
    int choices;
} sim_row;

/* Seconds left for the active and pending rows under fit c, by replaying the
 * runner's own policy on expected lengths: admission in queue order up to
 * the batch and the KV pages (each row priced at prompt + completion
 * fraction × max_tokens), a token cap per pass, decode steps first, then
 * prompt chunks in admission order, the first token drawn in the pass that
 * ends the prompt.  Counting passes this way prices the end tail (the batch
 * draining) and prefill-carrying passes, which a tokens / batch formula
 * misses (the prototype's live ETA was 1.5x optimistic for exactly those).
 * Not modelled: recompute after preemption.  < 0 when c is not calibrated. */
static double estimate_left(const runner *r, const calib *c)
{
    if (!c->valid)
        return -1;
    /* running choices, by how far into max_tokens they are: censored observations for the estimate */
    double running[CALIB_BINS] = {0};
    for (size_t i = 0; i < r->n_active; i++) {
        const row *w = &r->rows[r->active[i]];
        for (int k = 0; w->ch && k < w->n_choices; k++)
            if (!w->ch[k].done)
                running[calib_bin(w->ch[k].n_gen, (double)w->max_new)] += 1;
    }
    /* rows not started: the limit-weighted mean completion (generated / max_tokens summed over finished
     * choices predicts token totals better than a mean of fractions); rows under way: Kaplan-Meier below */
    double f = calib_completion(c);
    size_t n = 0;
    sim_row *q = malloc((r->n_active + r->q_len + 1) * sizeof *q);
    if (!q)
        return -1;
    kv_cache *kv = r->be.impl ? r->be.kv(r->be.impl) : NULL;
    double P = kv ? kv->page_tokens : 16, cap_pages = kv ? kv->n_pages : 1e18;
    /* active rows first (admission order), then the queue from its head */
    for (size_t i = 0; i < r->n_active + r->q_len; i++) {
        const row *w = &r->rows[i < r->n_active ? r->active[i] : r->queue[r->q_head + (i - r->n_active)]];
        double G = f * (double)w->max_new, fed = 0, gen = 0;
        if (G < 1)
            G = 1;
        if (w->state == ROW_ACTIVE && w->ch) {
            fed = w->ch[0].fed < w->n_prompt ? w->ch[0].fed : w->n_prompt;
            for (int k = 0; k < w->n_choices; k++)
                gen += w->ch[k].n_gen;
            gen /= w->n_choices;
            if (gen > 0 && w->max_new > 0) /* a row that has run this far is expected to run further */
                G = calib_expect_frac(c, running, gen / (double)w->max_new) * (double)w->max_new;
        }
        q[n++] = (sim_row){w->n_prompt - fed, fed, G - gen > 1 ? G - gen : 1, gen,
                           ceil((w->n_prompt + G) / P) * w->n_choices, w->n_choices};
    }
    double passes = 0, tokens = 0, att = 0, pages = 0;
    size_t head = 0, n_act = 0;
    size_t *act = malloc((n + 1) * sizeof *act);
    if (!act) {
        free(q);
        return -1;
    }
    /* rows already active hold their pages */
    for (; head < r->n_active && head < n; head++) {
        act[n_act++] = head;
        pages += q[head].pages;
    }
    while (head < n || n_act) {
        while (head < n && (int)n_act < r->o.batch && (n_act == 0 || pages + q[head].pages <= cap_pages)) {
            pages += q[head].pages;
            act[n_act++] = head++;
        }
        double budget = r->max_seqs + r->o.prefill_chunk;
        for (size_t i = 0; i < n_act; i++) {
            sim_row *s = &q[act[i]];
            if (s->prompt_left > 0)
                continue;
            tokens += s->choices;
            att += s->choices * (s->fed + 1);
            s->fed += 1;
            s->gen_left -= 1;
            budget -= s->choices;
        }
        for (size_t i = 0; i < n_act && budget > 0; i++) {
            sim_row *s = &q[act[i]];
            if (s->prompt_left <= 0)
                continue;
            double k = s->prompt_left < budget ? s->prompt_left : budget;
            tokens += k;
            att += k * s->fed + k * (k + 1) / 2;
            s->fed += k;
            s->prompt_left -= k;
            budget -= k;
            if (s->prompt_left <= 0)
                s->gen_left -= 1; /* the pass that ends the prompt draws the first token */
        }
        passes++;
        size_t keep = 0;
        for (size_t i = 0; i < n_act; i++)
            if (q[act[i]].gen_left > 0 || q[act[i]].prompt_left > 0)
                act[keep++] = act[i];
            else
                pages -= q[act[i]].pages;
        n_act = keep;
    }
    free(act);
    free(q);
    return calib_predict(c, passes, tokens, att);
}

/* The fit to use now: the stored one merged with this run's passes. */
static calib current_fit(const runner *r)
{
    calib c = r->cal_stored;
    calib_merge(&c, &r->cal_run);
    return c;
}

/* ---------------------------------------------------------------- display */

static void fmt_count(uint64_t v, char *out, size_t cap)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v), o = 0;
    for (int i = 0; i < n && o < (int)cap - 2; i++) {
        if (i && (n - i) % 3 == 0)
            out[o++] = ',';
        out[o++] = tmp[i];
    }
    out[o] = 0;
}

static void fmt_eta(double s, char *out, size_t cap)
{
    if (s < 0 || !isfinite(s))
        snprintf(out, cap, "uncalibrated");
    else if (s < 90)
        snprintf(out, cap, "%.0fs", s);
    else if (s < 5400)
        snprintf(out, cap, "%.0fm", s / 60);
    else
        snprintf(out, cap, "%.1fh", s / 3600);
}

static void show_progress(runner *r, int pass, double pass_s, bool final)
{
    if (r->o.quiet && !final)
        return;
    double el = now_s() - r->t_start;
    uint64_t finished = r->rows_done + r->rows_failed;
    /* the estimate replays the rest of the job: at most once a second, counted down in between */
    double eta;
    if (final || r->eta_at == 0 || el - r->eta_at >= 1.0) {
        calib fit = current_fit(r);
        r->eta_val = estimate_left(r, &fit);
        r->eta_at = el;
    }
    eta = r->eta_val < 0 ? r->eta_val : fmax(0, r->eta_val - (el - r->eta_at));
    char rows[32], total[32], tps[32], etas[32];
    fmt_count(finished, rows, sizeof rows);
    fmt_count(r->rows_total, total, sizeof total);
    fmt_count((uint64_t)(el > 0 ? (double)r->tokens_generated / el : 0), tps, sizeof tps);
    fmt_eta(final ? 0 : eta, etas, sizeof etas);
    double mem = (double)plan_rss_now() / 1e9, budget = (double)r->o.mem_budget / 1e9;
    char line[512];
    snprintf(line, sizeof line, "rows %s/%s · pass %d (%.2f s) · %s tok/s · ETA %s · batch %zu · mem %.2f/%.2f GB",
             rows, total, pass, pass_s, tps, etas, r->n_active, mem, budget);
    if (r->preemptions)
        snprintf(line + strlen(line), sizeof line - strlen(line), " · %llu preempted",
                 (unsigned long long)r->preemptions);
    if (!r->tty) {
        if (final || el - r->last_log >= 5.0) {
            printf("%s\n", line);
            fflush(stdout);
            r->last_log = el;
        }
        return;
    }
    /* redraw: progress line + tail block */
    for (int i = 0; i < r->drawn_lines; i++)
        fputs("\x1b[1A\x1b[2K", stdout);
    printf("\r\x1b[2K%s\n", line);
    int lines = 1;
    if (!r->o.quiet && !final) {
        int shown = 0;
        for (size_t i = 0; i < r->n_active && shown < TAIL_SLOTS; i++, shown++) {
            row *w = &r->rows[r->active[i]];
            choice *c = &w->ch[0];
            const char *t = c->text ? c->text : "";
            size_t tl = c->text_len, start = tl > 80 ? tl - 80 : 0;
            while (start < tl && ((unsigned char)t[start] & 0xC0) == 0x80)
                start++;
            char shown_text[96 * 4];
            size_t o = 0;
            for (size_t k = start; k < tl && o < sizeof shown_text - 1; k++)
                shown_text[o++] = (t[k] == '\n' || t[k] == '\r' || t[k] == '\t') ? ' ' : t[k];
            shown_text[o] = 0;
            printf("\x1b[2K  %-16.16s %5d tok  %s\n", w->custom_id, c->n_gen, shown_text);
            lines++;
        }
    }
    r->drawn_lines = final ? 0 : lines;
    fflush(stdout);
}

/* ---------------------------------------------------------------- memory */

static int cmp_desc_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The memory plan for this job (plan.h): the pending rows' KV needs, the
 * engine's computed costs both ways, the process as measured now, and the
 * stored fit of what the computed model missed on earlier runs. */
static int make_plan(runner *r, const engine_opts *eo0, bool gpu, char *err, size_t errlen)
{
    int threads = r->o.threads > 0 ? r->o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    int32_t P = r->o.page_tokens, min_pages = 1;
    int32_t *need = malloc((r->n_rows + 1) * sizeof *need);
    if (!need)
        return util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows);
    size_t nn = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING) {
            int64_t toks = (int64_t)r->rows[i].n_prompt + r->rows[i].max_new;
            int64_t pg = (toks + P - 1) / P * r->rows[i].n_choices;
            need[nn] = pg > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)pg;
            if (need[nn] > min_pages)
                min_pages = need[nn];
            nn++;
        }
    qsort(need, nn, sizeof *need, cmp_desc_i32);
    int64_t want = 0;
    for (size_t i = 0; i < nn && i < (size_t)r->o.batch; i++)
        want += need[i];
    free(need);
    if (want < min_pages)
        want = min_pages;
    if (want > INT32_MAX / 4)
        want = INT32_MAX / 4;
    if (gpu) {
        /* On the GPU the KV cache and the pass buffers live in HBM, and streamed layers sit pinned in host
         * RAM: ask for the pages the batch can use, and let the GPU backend's HBM plan clamp them and
         * choose what streams (--stream still forces it).  No host guard. */
        memset(&r->plan, 0, sizeof r->plan);
        r->plan.gpu = true;
        r->plan.stream = r->o.mode == 1;
        uint64_t gpage = kv_page_bytes_as(r->m->n_layers, r->m->n_kv_heads, r->m->head_dim, r->o.page_tokens,
                                          r->o.kv_dtype == KV_I8 ? KV_I8 : KV_BF16);
        uint64_t cap = r->o.kv_bytes ? r->o.kv_bytes / gpage : (uint64_t)want;
        r->plan.kv_pages = (int32_t)(cap < (uint64_t)want ? cap : (uint64_t)want);
        if (r->plan.kv_pages < min_pages)
            r->plan.kv_pages = min_pages;
        r->plan.want_pages = (int32_t)want;
        r->mem_path[0] = 0;
        return 0;
    }
    engine_opts eo = *eo0;
    uint64_t w_res, ring_res, pass_res, w_str, ring_str, pass_str;
    eo.stream = false;
    engine_mem_estimate(r->m, &eo, threads, &w_res, &ring_res, &pass_res);
    eo.stream = true;
    engine_mem_estimate(r->m, &eo, threads, &w_str, &ring_str, &pass_str);
    /* the runner's share of a pass: logits of every sequence, sampling scratch per thread */
    uint64_t V = (uint64_t)r->m->vocab, runner_pass = (uint64_t)r->max_seqs * V * 4 + (uint64_t)(threads + 1) * V * 16;
    mem_need n = {r->o.mem_budget, plan_rss_now(), w_res, w_str + ring_str, pass_res + runner_pass, 0,
                  r->page_bytes, (int32_t)want, min_pages, r->o.mode, r->o.kv_bytes};
    char host[128] = "host", key[300];
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "%.16s-%s-mem", r->fingerprint, host);
    for (char *k = key; *k; k++)
        if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '-'))
            *k = '_';
    if (calib_path(key, r->mem_path, sizeof r->mem_path) != 0 || mem_fit_load(r->mem_path, &r->mem_stored) != 0)
        memset(&r->mem_stored, 0, sizeof r->mem_stored);
    if (r->mem_stored.valid) {
        double x = r->mem_stored.base + r->mem_stored.slope * (double)want * P;
        if (x > 0)
            n.extra = x < (double)n.budget / 4 ? (uint64_t)x : n.budget / 4;
    }
    if (plan_solve(&n, &r->plan, err, errlen))
        return -1;
    r->plan_ring = ring_str;
    r->kv_fixed_model = n.base + n.pass + (r->plan.stream ? n.ring : n.weights);
    return 0;
}

/* Records how far the measured RSS sits above the computed model now. */
static void observe_memory(runner *r)
{
    kv_cache *kv = r->be.kv(r->be.impl);
    int32_t used = kv->n_pages - kv->n_free;
    if (used > r->kv_peak_used)
        r->kv_peak_used = used;
    uint64_t rss = plan_rss_now();
    if (!rss)
        return;
    double seq_tokens = 0;
    for (size_t i = 0; i < r->n_active; i++) {
        const row *w = &r->rows[r->active[i]];
        for (int c = 0; w->ch && c < w->n_choices; c++)
            seq_tokens += w->ch[c].fed;
    }
    double modelled = (double)r->kv_fixed_model + (double)r->kv_peak_used * (double)r->page_bytes;
    mem_fit_observe(&r->mem_run, seq_tokens, (double)rss - modelled);
}

static void save_memory_fit(runner *r)
{
    if (!r->mem_path[0] || r->mem_run.n < 2)
        return;
    mem_fit f = r->mem_stored;
    f.n += r->mem_run.n;
    f.sx += r->mem_run.sx;
    f.sy += r->mem_run.sy;
    f.sxx += r->mem_run.sxx;
    f.sxy += r->mem_run.sxy;
    mem_fit_solve(&f);
    char e2[SPILL_ERRLEN];
    if (mem_fit_save(r->mem_path, &f, e2, sizeof e2))
        fprintf(stderr, "spill: memory calibration not saved: %s\n", e2);
}

static void fmt_bytes(uint64_t b, char *out, size_t cap)
{
    if (b >= 1000000000ull)
        snprintf(out, cap, "%.2f GB", (double)b / 1e9);
    else if (b >= 100000000ull)
        snprintf(out, cap, "%.0f MB", (double)b / 1e6);
    else
        snprintf(out, cap, "%.1f MB", (double)b / 1e6);
}

/* ---------------------------------------------------------------- the loop */

/* One sampling task: logits row cidx[j] of this pass. */
static void draw_task(void *ctx, int64_t j, int tid)
{
    runner *r = ctx;
    int k = r->cidx[j], s = r->sidx[k];
    row *w = &r->rows[r->seq_row[s]];
    choice *ch = &w->ch[r->seq_choice[s]];
    char err[SPILL_ERRLEN];
    r->src[k] = sample_next(r->logits + (size_t)k * (size_t)r->m->vocab, r->m->vocab, &w->sp, &ch->ss, &r->scs[tid],
                            &r->sres[k], err, sizeof err);
}

static int run_passes(runner *r, char *err, size_t errlen)
{
    int pass = 0;
    kv_cache *kv = r->be.kv(r->be.impl);
    while ((r->q_len || r->n_active) && !g_stop) {
        int rc = 0;
        admit(r, err, errlen, &rc);
        if (rc)
            return -1;
        double t0 = now_s();
        int ns = 0, budget = r->max_seqs + r->o.prefill_chunk;
        /* decode steps first: one token per running choice */
        for (size_t ai = 0; ai < r->n_active; ai++) {
            size_t idx = r->active[ai];
            row *w = &r->rows[idx];
            for (int c = 0; c < w->n_choices && w->state == ROW_ACTIVE; c++) {
                choice *ch = &w->ch[c];
                if (ch->done || ch->fed < w->n_prompt)
                    continue;
                int rr = reserve(r, idx, ch, ch->fed + 1);
                if (rr < 0)
                    return util_errf(err, errlen, "out of memory growing a KV page table.");
                if (rr == 1) {
                    ns = 0; /* the pass being built referenced freed rows: rebuild it */
                    ai = (size_t)-1;
                    budget = r->max_seqs + r->o.prefill_chunk;
                    break;
                }
                r->seqs[ns] = (fwd_seq){&ch->kv, ch->fed, 1, &ch->next, true, false};
                r->seq_row[ns] = (int)idx;
                r->seq_choice[ns] = c;
                ns++;
                budget--;
            }
        }
        /* a preemption may have freed rows whose seqs were already listed: drop stale ones */
        int keep = 0;
        for (int s = 0; s < ns; s++)
            if (r->rows[r->seq_row[s]].state == ROW_ACTIVE)
                r->seqs[keep] = r->seqs[s], r->seq_row[keep] = r->seq_row[s], r->seq_choice[keep++] = r->seq_choice[s];
        ns = keep;
        /* then prompt chunks, in admission order, up to the token cap */
        for (size_t ai = 0; ai < r->n_active && budget > 0; ai++) {
            size_t idx = r->active[ai];
            row *w = &r->rows[idx];
            for (int c = 0; c < w->n_choices && budget > 0 && w->state == ROW_ACTIVE; c++) {
                choice *ch = &w->ch[c];
                /* choices > 0 wait for choice 0's prefill and copy its KV (they prefill themselves only if
                 * the copy found no free pages) */
                if (ch->fed >= w->n_prompt || (c > 0 && w->ch[0].fed < w->n_prompt))
                    continue;
                int32_t n = w->n_prompt - ch->fed;
                if (n > budget)
                    n = budget;
                int rr = kv_row_reserve(kv, &ch->kv, ch->fed + n);
                if (rr == -2)
                    return util_errf(err, errlen, "out of memory growing a KV page table.");
                if (rr == -1)
                    break; /* no pages now: this prompt waits for pages freed by finishing rows */
                r->seqs[ns] = (fwd_seq){&ch->kv, ch->fed, n, w->prompt + ch->fed, ch->fed + n == w->n_prompt, false};
                r->seq_row[ns] = (int)idx;
                r->seq_choice[ns] = c;
                ns++;
                budget -= n;
            }
        }
        if (ns == 0) {
            if (r->n_active == 0 && r->q_len) {
                row *w = &r->rows[r->queue[r->q_head]];
                return util_errf(err, errlen,
                                 "row %s needs more KV memory than the whole cache holds; raise --kv-mem.",
                                 w->custom_id);
            }
            /* Every admitted row is mid-prompt and none can get a page for its next chunk: their partial
             * prompts hold the cache between them.  Preempt the newest so the oldest can go on (without
             * this the job would spin forever; test_sched found it). */
            size_t victim = 0;
            for (size_t i = 1; i < r->n_active; i++)
                if (r->rows[r->active[i]].admitted > r->rows[r->active[victim]].admitted)
                    victim = i;
            if (r->n_active < 2)
                return util_errf(err, errlen, "row %s cannot get KV pages for its prompt although it runs alone; "
                                              "raise --mem-budget.",
                                 r->rows[r->active[0]].custom_id);
            preempt(r, victim);
            r->stall_preemptions++;
            continue;
        }
        double pass_tokens = 0, pass_att = 0;
        for (int s2 = 0; s2 < ns; s2++) {
            double p0 = r->seqs[s2].pos0, n = r->seqs[s2].n;
            pass_tokens += n;
            pass_att += n * p0 + n * (n + 1) / 2; /* each token attends to every cached position up to itself */
        }
        int nl = 0, nc = 0, frc;
        for (int s = 0; s < ns; s++)
            if (r->seqs[s].want_logits)
                r->sidx[nl++] = s;
        if (r->be.forward_pick) {
            /* Greedy rows (temperature 0, no bias or penalty, one choice) are picked where the logits are,
             * with sample_next's ties and log-probs: only their token and log-probs come back. */
            for (int k = 0; k < nl; k++) {
                const row *w = &r->rows[r->seq_row[r->sidx[k]]];
                const sample_params *sp = &w->sp;
                bool greedy = sp->temperature == 0 && sp->n_logit_bias == 0 && sp->frequency_penalty == 0 &&
                              sp->presence_penalty == 0 && w->n_choices == 1;
                r->want[k] = !greedy ? -2 : sp->logprobs ? sp->n_top_logprobs : -1;
            }
            frc = r->be.forward_pick(r->be.impl, r->seqs, ns, r->want, r->sres, r->logits, err, errlen);
            for (int k = 0; !frc && k < nl; k++)
                if (r->want[k] < -1)
                    r->cidx[nc++] = k;
                else
                    r->src[k] = r->sres[k].token < 0 ? -1 : 0;
        } else {
            frc = r->be.forward(r->be.impl, r->seqs, ns, r->logits, err, errlen);
            for (int k = 0; k < nl; k++)
                r->cidx[nc++] = k;
        }
        if (frc)
            return frc;
        /* Draw the other rows' next tokens in parallel (each row owns its RNG and counts, each thread its
         * scratch: the draws are the same whatever thread takes which row), then apply them in order. */
        pool_run(r->spool, draw_task, r, nc);
        int li = 0;
        for (int s = 0; s < ns; s++) {
            row *w = &r->rows[r->seq_row[s]];
            choice *ch = &w->ch[r->seq_choice[s]];
            ch->fed += r->seqs[s].n;
            if (!r->seqs[s].want_logits)
                continue;
            const float *lg = r->logits + (size_t)li * (size_t)r->m->vocab;
            bool prompt_done = r->seq_choice[s] == 0 && r->seqs[s].n > 0 && ch->fed == w->n_prompt && ch->n_gen == 0 &&
                               ch->next < 0;
            sample_result sr = r->sres[li];
            if (r->src[li])
                return util_errf(err, errlen, "row %s: no token could be drawn (every logit is NaN or -inf).",
                                 w->custom_id);
            if (accept_token(r, w, ch, &sr, err, errlen))
                return -1;
            /* n > 1: the other choices share the prompt's prefill — copy its KV pages and draw their first
             * token from the same logits with their own RNG. */
            for (int c = 1; prompt_done && c < w->n_choices; c++) {
                choice *o = &w->ch[c];
                int rr = r->be.kv_copy ? r->be.kv_copy(r->be.impl, &o->kv, &ch->kv, w->n_prompt) : -1;
                if (rr == -2)
                    return util_errf(err, errlen, "out of memory growing a KV page table.");
                if (rr == -1) /* no pages: this choice prefills itself later, like a newcomer */
                    continue;
                o->fed = w->n_prompt;
                if (sample_next(lg, r->m->vocab, &w->sp, &o->ss, &r->sc, &sr, err, errlen) ||
                    accept_token(r, w, o, &sr, err, errlen))
                    return -1;
            }
            li++;
        }
        /* rows whose every choice is done are written */
        for (size_t ai = 0; ai < r->n_active;) {
            row *w = &r->rows[r->active[ai]];
            bool all = true;
            for (int c = 0; c < w->n_choices; c++)
                all &= w->ch[c].done;
            if (all) {
                if (finish_row(r, ai, err, errlen))
                    return -1;
            } else
                ai++;
        }
        if (job_commit(r->j, err, errlen))
            return -1;
        /* the whole pass — build, forward, sampling, output, group commit — is what the ETA must price */
        double pass_s = now_s() - t0;
        calib_observe(&r->cal_run, pass_tokens, pass_att, pass_s);
        observe_memory(r);
        if (r->pass_log) {
            int dec = 0;
            for (int s2 = 0; s2 < ns; s2++)
                dec += r->seqs[s2].n == 1 && r->seqs[s2].pos0 >= r->rows[r->seq_row[s2]].n_prompt;
            fprintf(r->pass_log, "%d,%d,%d,%d,%.6f,%.6f,%llu,%d\n", pass + 1, ns, dec, (int)pass_tokens - dec, pass_s,
                    now_s() - r->t_start, (unsigned long long)plan_rss_now(), kv->n_pages - kv->n_free);
        }
        pass++;
        show_progress(r, pass, now_s() - t0, false);
    }
    return 0;
}

/* ---------------------------------------------------------------- entry points */

static void runner_free(runner *r)
{
    if (r->pass_log)
        fclose(r->pass_log);
    for (size_t i = 0; i < r->n_rows; i++) {
        if (r->be.impl)
            row_release(r, &r->rows[i]);
        row_free(&r->rows[i]);
    }
    free(r->rows);
    free(r->queue);
    free(r->active);
    free(r->logits);
    free(r->seqs);
    free(r->seq_row);
    free(r->seq_choice);
    sample_scratch_free(&r->sc);
    for (int t = 0; r->scs && r->spool && t < pool_threads(r->spool); t++)
        sample_scratch_free(&r->scs[t]);
    free(r->scs);
    pool_free(r->spool);
    free(r->sres);
    free(r->sidx);
    free(r->src);
    free(r->want);
    free(r->cidx);
    if (r->be.impl)
        r->be.close(r->be.impl);
    tokenizer_free(r->tok);
    template_free(r->tmpl);
    model_close(r->m);
}

/* Pass state and the queue of pending rows (longest first; rows that cannot
 * fit the whole cache go to errors.jsonl).  Needs r->m, r->tok, r->be, r->j. */
static int setup_passes(runner *r, char *err, size_t errlen)
{
    /* queue: pending rows, longest first */
    r->queue = malloc((r->n_rows + 1) * sizeof *r->queue);
    r->active = malloc((r->n_rows + 1) * sizeof *r->active);
    int max_seqs = r->max_seqs;
    r->logits = malloc((size_t)max_seqs * (size_t)r->m->vocab * sizeof(float));
    r->seqs = malloc((size_t)max_seqs * sizeof *r->seqs);
    r->seq_row = malloc((size_t)max_seqs * sizeof(int));
    r->seq_choice = malloc((size_t)max_seqs * sizeof(int));
    r->sres = malloc((size_t)max_seqs * sizeof *r->sres);
    r->sidx = malloc((size_t)max_seqs * sizeof *r->sidx);
    r->src = calloc((size_t)max_seqs, sizeof *r->src);
    r->want = malloc((size_t)max_seqs * sizeof *r->want);
    r->cidx = malloc((size_t)max_seqs * sizeof *r->cidx);
    if (sample_scratch_init(&r->sc, r->m->vocab, err, errlen) || pool_create(r->o.threads, 0, &r->spool, err, errlen))
        return -1;
    r->scs = calloc((size_t)pool_threads(r->spool), sizeof *r->scs);
    for (int t = 0; r->scs && t < pool_threads(r->spool); t++)
        if (sample_scratch_init(&r->scs[t], r->m->vocab, err, errlen))
            return -1;
    if (!r->queue || !r->active || !r->logits || !r->seqs || !r->seq_row || !r->seq_choice || !r->sres || !r->sidx ||
        !r->src || !r->scs || !r->want || !r->cidx) {
        util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows);
        return -1;
    }
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING) {
            /* a row must be able to finish alone: prompt plus every token it may generate */
            int32_t need = kv_pages_for(r->be.kv(r->be.impl), (int32_t)(r->rows[i].n_prompt + r->rows[i].max_new)) *
                           r->rows[i].n_choices;
            if (need > r->be.kv(r->be.impl)->n_pages) {
                char msg[SPILL_ERRLEN];
                snprintf(msg, sizeof msg,
                         "This row needs %d KV pages to finish but the cache holds %d; raise --kv-mem or lower max_tokens.", need,
                         r->be.kv(r->be.impl)->n_pages);
                r->rows[i].state = ROW_DONE;
                if (run_append_error_line(r, r->rows[i].custom_id, msg, NULL, "insufficient_memory", err, errlen))
                    return -1;
                continue;
            }
            r->queue[r->q_len++] = i;
        }
    g_sort_runner = r;
    qsort(r->queue, r->q_len, sizeof *r->queue, cmp_longest);
    /* leave room at the head for preempted rows to return to */
    memmove(r->queue + (r->n_rows + 1 - r->q_len), r->queue, r->q_len * sizeof *r->queue);
    r->q_head = r->n_rows + 1 - r->q_len;
    return 0;
}

/* Shared by run and resume once the options are known; `resuming` reopens o.out_dir. */
static int run_job(runner *r, bool resuming)
{
    /* From here on SIGINT/SIGTERM only set a flag: the pass loop checkpoints and exits 75. */
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    char err[SPILL_ERRLEN], path[4096];
    int code = EX_DATAERR_;
    double t_open = now_s();
    r->tty = isatty(STDOUT_FILENO);
    if (model_resolve(r->o.model_spec, path, sizeof path, err, sizeof err) ||
        model_open(path, &r->m, err, sizeof err))
        goto fail;
    if (r->m->format == MODEL_GGUF ? tokenizer_from_gguf(r->m->gguf, &r->tok, err, sizeof err)
                                   : !r->m->tokenizer_path
                                         ? util_errf(err, sizeof err, "%s: tokenizer.json is missing.", r->m->source)
                                         : tokenizer_from_json_file(r->m->tokenizer_path, &r->tok, err, sizeof err))
        goto fail;
    if (r->m->chat_template &&
        template_compile(r->m->chat_template, strlen(r->m->chat_template), "chat template", &r->tmpl, err, sizeof err))
        goto fail;
    model_fingerprint(r->m, r->fingerprint);
    snprintf(r->sys_fp, sizeof r->sys_fp, "fp_%.10s", r->fingerprint);
    run_defaults(&r->o);
    r->page_bytes = kv_page_bytes(r->m->n_layers, r->m->n_kv_heads, r->m->head_dim, r->o.page_tokens);
    if (getrandom(&r->job_seed, sizeof r->job_seed, 0) != sizeof r->job_seed)
        r->job_seed = (uint64_t)time(NULL);

    if (r->o.kv_dtype && (r->o.device == 1 || !spill_gpu_open)) { /* refused before a job exists */
        util_errf(err, sizeof err, "--kv-dtype %s needs the GPU engine (the CPU engine keeps fp32 KV); drop it or "
                                   "run spill-cuda on a GPU.", kv_dtype_name(r->o.kv_dtype));
        code = EX_USAGE_;
        goto fail;
    }
    if (resuming) {
        if (job_open_resume(r->o.out_dir, NULL, &r->j, err, sizeof err))
            goto fail;
        /* one job, one model: mixing two models' answers in one output would be silent corruption */
        const char *fp = json_string_value(json_object_get(json_object_get(job_manifest(r->j), "model"), "fingerprint"));
        if (fp && strcmp(fp, r->fingerprint)) {
            util_errf(err, sizeof err,
                      "%s: the job was started with model fingerprint %.16s but %s now has %.16s; resume it with the "
                      "same model files.",
                      r->o.out_dir, fp, r->o.model_spec, r->fingerprint);
            job_close(r->j, JOB_RUNNING, NULL, 0);
            r->j = NULL;
            goto fail;
        }
    } else {
        json_t *oj = run_opts_json(&r->o);
        json_object_set_new(oj, "model", json_string(r->o.model_spec));
        uint64_t total = 0;
        int rc = run_count_rows(r->o.input, &total, err, sizeof err);
        job_info ji = {"run", r->o.input, oj, r->o.model_spec, r->fingerprint, SPILL_VERSION, total};
        if (rc == 0)
            rc = job_create(r->o.out_dir, &ji, NULL, &r->j, err, sizeof err);
        json_decref(oj);
        if (rc)
            goto fail;
    }
    r->stamp = (out_stamp){job_id(r->j), r->fingerprint, r->m->quant_summary, NULL};
    if (run_load_rows(r, err, sizeof err))
        goto fail_job;
    /* sequences per pass: every active choice (admission keeps them under batch + the largest n) */
    int max_n = 1;
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING && r->rows[i].n_choices > max_n)
            max_n = r->rows[i].n_choices;
    r->max_seqs = r->o.batch + max_n;
    engine_opts eo = {r->o.threads, r->max_seqs + r->o.prefill_chunk, r->max_seqs, r->o.page_tokens, 0, false,
                      r->o.stream_slots, true, r->o.q8 && !r->o.exact, 0, 0, r->o.from_disk, r->o.kv_dtype};
    /* One budget for everything: the plan picks resident or streamed and sizes the KV cache. */
    if (make_plan(r, &eo, r->o.device != 1 && spill_gpu_open, err, sizeof err)) {
        code = EX_USAGE_;
        goto fail_job;
    }
    eo.kv_pages = r->plan.kv_pages;
    eo.stream = r->plan.stream;
    eo.gpu_mem = r->o.gpu_mem;
    eo.kv_dtype = r->o.kv_dtype;
    if (r->o.mem_budget) { /* the GPU engine may pin streamed layers in what the budget leaves */
        uint64_t used = plan_rss_now() + (1ull << 30);
        eo.host_mem = r->o.mem_budget > used ? r->o.mem_budget - used : 1;
    }
    /* Backend: the GPU when this binary has one (unless --cpu), else the CPU. */
    int brc = -1;
    if (r->o.device != 1 && spill_gpu_open) {
        brc = spill_gpu_open(r->m, &eo, r->o.resident_layers, &r->be, err, sizeof err);
        if (brc && r->o.device == 2) {
            code = brc == -75 ? EX_TEMPFAIL_ : EX_SOFTWARE_;
            goto fail_job;
        }
        if (brc)
            fprintf(stderr, "spill: no GPU engine (%s); running on the CPU.\n", err);
    } else if (r->o.device == 2) {
        util_errf(err, sizeof err, "this spill binary was built without CUDA; build build/cuda/spill-cuda (make cuda).");
        code = EX_USAGE_;
        goto fail_job;
    }
    if (brc && r->plan.gpu) { /* the GPU plan sized nothing for host RAM: plan again for the CPU */
        if (make_plan(r, &eo, false, err, sizeof err)) {
            code = EX_USAGE_;
            goto fail_job;
        }
        eo.kv_pages = r->plan.kv_pages;
        eo.stream = r->plan.stream;
    }
    if (brc && r->o.kv_dtype) {
        util_errf(err, sizeof err, "--kv-dtype %s needs the GPU engine (the CPU engine keeps fp32 KV); drop it or "
                                   "run spill-cuda on a GPU.", kv_dtype_name(r->o.kv_dtype));
        code = EX_USAGE_;
        goto fail_job;
    }
    if (brc && engine_backend_cpu(r->m, &eo, &r->be, err, sizeof err)) {
        code = EX_SOFTWARE_;
        goto fail_job;
    }
    {
        char host[128] = "host", key[512];
        gethostname(host, sizeof host - 1);
        /* keyed by model | backend | machine: the same model on another backend or host costs differently */
        /* the backend's kind, without the sizes its plan printed (", KV 12.3 GB") */
        char kind[sizeof r->be.name];
        snprintf(kind, sizeof kind, "%s", r->be.name);
        char *kvp = strstr(kind, ", KV ");
        if (kvp)
            *kvp = 0;
        snprintf(key, sizeof key, "%.16s-%s-%s-b%d", r->fingerprint, host, kind, r->o.batch);
        for (char *k = key; *k; k++)
            if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '-'))
                *k = '_';
        if (calib_path(key, r->cal_path, sizeof r->cal_path) != 0 || calib_load(r->cal_path, &r->cal_stored) != 0)
            memset(&r->cal_stored, 0, sizeof r->cal_stored);
    }
    { /* the backend's pages: fp32 on the CPU, bf16 or int8 in HBM */
        const kv_cache *bkv = r->be.kv(r->be.impl);
        r->page_bytes = kv_page_bytes_as(r->m->n_layers, r->m->n_kv_heads, r->m->head_dim, r->o.page_tokens,
                                         bkv->dtype);
    }
    if (setup_passes(r, err, sizeof err))
        goto fail_job;
    if (job_commit(r->j, err, sizeof err))
        goto fail_job;

    uint64_t already = job_rows_completed(r->j) + job_rows_failed(r->j);
    r->rows_done = job_rows_completed(r->j);
    r->rows_failed = job_rows_failed(r->j);
    if (r->o.pass_log && (r->pass_log = fopen(r->o.pass_log, "w")))
        fprintf(r->pass_log, "pass,seqs,decode_tokens,prefill_tokens,seconds,elapsed,rss_bytes,kv_pages_used\n");
    r->t_start = now_s(); /* the job's clock: rows read, engine loaded; passes start now */
    r->eta_prerun = estimate_left(r, &r->cal_stored);
    char pt[32], wb[32], eta0[32];
    fmt_eta(r->eta_prerun, eta0, sizeof eta0);
    fmt_count(r->prompt_tokens, pt, sizeof pt);
    snprintf(wb, sizeof wb, "%.0f MB", (double)r->m->total_bytes / 1e6);
    char mb[32], bb[32], kb[32], mem[400];
    fmt_bytes(r->plan.total, mb, sizeof mb);
    fmt_bytes(r->o.mem_budget, bb, sizeof bb);
    fmt_bytes((uint64_t)r->be.kv(r->be.impl)->n_pages * r->page_bytes, kb, sizeof kb);
    int kv_pages = r->be.kv(r->be.impl)->n_pages;
    if (r->plan.gpu)
        snprintf(mem, sizeof mem, "KV %s in HBM (%d pages of %d tokens; the batch wants %d)", kb, kv_pages,
                 r->o.page_tokens, r->plan.want_pages);
    else if (r->plan.stream) {
        char rb[32];
        fmt_bytes(r->plan_ring, rb, sizeof rb);
        snprintf(mem, sizeof mem,
                 "memory plan %s of %s budget: weights %s streamed through a %s ring, KV %s (%d pages of %d tokens; "
                 "the batch wants %d)",
                 mb, bb, wb, rb, kb, kv_pages, r->o.page_tokens, r->plan.want_pages);
    } else
        snprintf(mem, sizeof mem,
                 "memory plan %s of %s budget: weights %s resident, KV %s (%d pages of %d tokens; the batch wants %d)",
                 mb, bb, wb, kb, kv_pages, r->o.page_tokens, r->plan.want_pages);
    printf("spill %s: %s (%s, %s, %s) · %llu rows (%llu done) · %s prompt tokens to prefill · batch %d · engine "
           "%s · %s · ETA %s · job %s · ready in %.1f s\n",
           resuming ? "resume" : "run", r->o.model_spec, r->m->arch, r->m->quant_summary, wb,
           (unsigned long long)r->rows_total, (unsigned long long)already, pt, r->o.batch, r->be.name, mem, eta0,
           job_dir(r->j), now_s() - t_open);
    fflush(stdout);

    if (run_passes(r, err, sizeof err))
        goto fail_job;
    show_progress(r, 0, 0, true);
    save_memory_fit(r);
    if (g_stop) {
        calib merged = current_fit(r);
        char e2[SPILL_ERRLEN];
        calib_save(r->cal_path, &merged, e2, sizeof e2);
        if (job_close(r->j, JOB_INTERRUPTED, err, sizeof err)) {
            r->j = NULL;
            goto fail;
        }
        r->j = NULL;
        fprintf(stderr, "spill: interrupted; %llu of %llu rows are saved. Continue with: spill resume %s\n",
                (unsigned long long)(r->rows_done + r->rows_failed), (unsigned long long)r->rows_total, r->o.out_dir);
        code = EX_TEMPFAIL_;
        goto out;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", job_dir(r->j));
    if (job_close(r->j, JOB_DONE, err, sizeof err)) {
        r->j = NULL;
        goto fail;
    }
    r->j = NULL;
    double el = now_s() - r->t_start;
    {
        calib merged = current_fit(r);
        char e2[SPILL_ERRLEN];
        if (calib_save(r->cal_path, &merged, e2, sizeof e2))
            fprintf(stderr, "spill: calibration not saved: %s\n", e2);
        if (r->eta_prerun > 0)
            printf("pre-run ETA %.1f s vs actual %.1f s (%+.0f%%)\n", r->eta_prerun, el,
                   (r->eta_prerun - el) / el * 100);
    }
    {
        char pk[32], bb2[32];
        fmt_bytes(plan_rss_peak(), pk, sizeof pk);
        fmt_bytes(r->o.mem_budget, bb2, sizeof bb2);
        if (r->plan.gpu)
            printf("peak host memory %s (KV and pass buffers in HBM)\n", pk);
        else
            printf("peak memory %s of the %s budget (planned %.0f MB; %llu admission pauses by the live guard)\n", pk,
                   bb2, (double)r->plan.total / 1e6, (unsigned long long)r->guard_pauses);
    }
    if (r->be.io_line) {
        char io[512];
        r->be.io_line(r->be.impl, io, sizeof io);
        printf("weights: %s\n", io);
    }
    printf("done: %llu rows answered, %llu failed, %llu tokens generated in %.1f s (%.1f tok/s), %llu preemptions · "
           "%s/results.jsonl%s\n",
           (unsigned long long)r->rows_done, (unsigned long long)r->rows_failed,
           (unsigned long long)r->tokens_generated, el, el > 0 ? (double)r->tokens_generated / el : 0,
           (unsigned long long)r->preemptions, dir, r->rows_failed ? " (failures in errors.jsonl)" : "");
    code = EX_OK;
    goto out;
fail_job:
    /* Committed rows stay committed; the job stays resumable. */
    if (r->j) {
        char e2[SPILL_ERRLEN];
        if (!job_is_broken(r->j))
            job_close(r->j, JOB_INTERRUPTED, e2, sizeof e2);
        else
            job_close(r->j, JOB_RUNNING, e2, sizeof e2);
        r->j = NULL;
        code = EX_TEMPFAIL_;
    }
fail:
    fprintf(stderr, "spill: %s\n", err);
    if (code == EX_TEMPFAIL_ && r->o.out_dir)
        fprintf(stderr, "spill: the job is resumable: spill resume %s\n", r->o.out_dir);
out:
    runner_free(r);
    return code;
}

int run_main(int argc, char **argv)
{
    runner r = {0};
    if (run_parse_opts(argc, argv, &r.o, false)) {
        fprintf(stderr, "usage: spill run MODEL INPUT.jsonl [-o DIR] [--batch N] [--threads N] [--kv-mem BYTES] "
                        "[--mem-budget BYTES] [--stream|--resident] [--stream-slots N] [--prefill-chunk N] "
                        "[--page-tokens N] [--q8-activations] [--cpu|--gpu] [--gpu-mem BYTES] [--resident-layers N] "
                        "[--from-disk] [--kv-dtype bf16|int8] [--pass-log FILE] [--quiet]\n");
        return EX_USAGE_;
    }
    char dir[4096], id[JOB_ID_MAX], err[SPILL_ERRLEN];
    if (!r.o.out_dir) {
        if (job_new_id(id, sizeof id, err, sizeof err)) {
            fprintf(stderr, "spill: %s\n", err);
            return EX_SOFTWARE_;
        }
        snprintf(dir, sizeof dir, "%s/jobs/%s", util_spill_home(), id);
        r.o.out_dir = dir;
    }
    if (access(r.o.input, R_OK) != 0) {
        fprintf(stderr, "spill: %s: cannot read the input file: %s.\n", r.o.input, strerror(errno));
        return EX_NOINPUT_;
    }
    return run_job(&r, false);
}

int resume_main(int argc, char **argv)
{
    runner r = {0};
    if (run_parse_opts(argc, argv, &r.o, true)) {
        fprintf(stderr, "usage: spill resume JOB_DIR|JOB_ID [--threads N] [--quiet]\n");
        return EX_USAGE_;
    }
    /* A bare id names $SPILL_HOME/jobs/<id>. */
    static char dir[4096], mpath[4200], model[1024], input[4096];
    if (!strchr(r.o.out_dir, '/') && !util_is_dir(r.o.out_dir))
        snprintf(dir, sizeof dir, "%s/jobs/%s", util_spill_home(), r.o.out_dir);
    else
        snprintf(dir, sizeof dir, "%s", r.o.out_dir);
    r.o.out_dir = dir;
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    json_error_t je;
    json_t *man = json_load_file(mpath, 0, &je);
    if (!man) {
        fprintf(stderr, "spill: %s: cannot read the job manifest (%s); is this a job directory?\n", mpath, je.text);
        return EX_NOINPUT_;
    }
    json_t *opt = json_object_get(man, "options");
    const char *ms = json_string_value(json_object_get(opt, "model"));
    const char *in = json_string_value(json_object_get(json_object_get(man, "input"), "path"));
    if (!ms || !in) {
        fprintf(stderr, "spill: %s: the manifest lacks options.model or input.path; it was not written by spill run.\n",
                mpath);
        json_decref(man);
        return EX_DATAERR_;
    }
    snprintf(model, sizeof model, "%s", ms);
    snprintf(input, sizeof input, "%s", in);
    r.o.model_spec = model;
    r.o.input = input;
    if (!r.o.batch)
        r.o.batch = (int)json_integer_value(json_object_get(opt, "batch"));
    if (!r.o.prefill_chunk)
        r.o.prefill_chunk = (int)json_integer_value(json_object_get(opt, "prefill_chunk"));
    if (!r.o.page_tokens)
        r.o.page_tokens = (int)json_integer_value(json_object_get(opt, "page_tokens"));
    if (!r.o.kv_bytes)
        r.o.kv_bytes = (uint64_t)json_integer_value(json_object_get(opt, "kv_bytes"));
    if (!r.o.mem_budget)
        r.o.mem_budget = (uint64_t)json_integer_value(json_object_get(opt, "mem_budget"));
    if (!r.o.gpu_mem)
        r.o.gpu_mem = (uint64_t)json_integer_value(json_object_get(opt, "gpu_mem"));
    if (!r.o.mode)
        r.o.mode = (int)json_integer_value(json_object_get(opt, "mode"));
    if (!r.o.stream_slots)
        r.o.stream_slots = (int)json_integer_value(json_object_get(opt, "stream_slots"));
    r.o.exact |= json_is_true(json_object_get(opt, "exact"));
    r.o.q8 |= json_is_true(json_object_get(opt, "q8_activations"));
    r.o.from_disk |= json_is_true(json_object_get(opt, "from_disk"));
    if (!r.o.kv_dtype)
        r.o.kv_dtype = (int)json_integer_value(json_object_get(opt, "kv_dtype"));
    json_decref(man);
    return run_job(&r, true);
}
