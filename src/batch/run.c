/*
 * run.c — `spill run` and `spill resume`: the job's top.
 *
 * Reads top to bottom as a job runs: open the model, tokenizer and template;
 * create (or reopen) the durable job; read the rows; plan the memory; open
 * the backend; then loop over passes — the scheduler builds a pass, the
 * backend runs it, the runner draws and applies every token, writes the rows
 * that finished and commits once per pass — and finish: the final state, the
 * calibration and the summary lines.
 *
 * Owns: the pass loop (one group commit per pass), SIGINT/SIGTERM
 * (checkpoint and exit 75), the open/plan/finish of a job, and when the user
 * sees what (the lines themselves are drawn by run_report.c).
 *
 * Beside it: run_answer.c (a token applied to a choice: end ids, log-probs,
 * detokenized text through the stop matcher, limits; a finished row written
 * through job.c), sched.c (rows and their life, queue, admission, preemption,
 * building a pass, the ETA replay), plan.c (the memory plan, observed every
 * pass), run_rows.c (input lines into rows), run_opts.c (every setting, read
 * once), run_internal.h (the runner).  Does not own: the forward pass
 * (engine/, cuda/), sampling maths (sample.c), stop-string matching
 * (stop.c), line formats (output.c), the on-disk job protocol (job.c).
 *
 * Key decision: the runner drives whichever backend the binary has
 * (engine.h spill_backend: the CPU engine, or the GPU engine that
 * build/cuda/spill-cuda registers) through the same loop, and the loop's
 * per-token path allocates nothing once a choice's text has reached its size
 * (the text buffer grows geometrically and the stop matcher writes straight
 * into it).
 *
 * Kept across jobs (issue 17, `spill worker`, run_worker.c): a process that
 * calls run_keep_enable keeps the opened weights (after --quant), tokenizer
 * and chat template of its last job in g_keep, and the next job whose
 * resolved model path and --quant ask are the same borrows them instead of
 * opening them again; runner_free leaves what g_keep holds.  The backend is
 * still opened per job (its KV arena is sized by each job's plan), but the
 * GPU engine's pinned copy of the streamed layers is kept too (host_share_keep):
 * the next job of the same model maps it instead of reading it again.  `spill
 * run` alone never enables it, so it behaves exactly as before.  g_stop is
 * cleared when a job starts: a worker's SIGINT ends the current job
 * (checkpointed, exit 75) and the next job starts clean.
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
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "mpi_run.h"
#include "npy.h"
#include "run_internal.h"
#include "../serve/progress.h"
#include "runs.h"
#include "../engine/host_share.h"
#include "../engine/probe.h"
#include "../base/util.h"
#include "../model/arch.h"
#include "../text/prompt.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

/* The worker's keep (the opening comment): what the last job opened, for the next job of the same model. */
static struct {
    bool on;
    char path[4096], quant_ask[64]; /* the key: the resolved weights path and the --quant asked ("" none) */
    model_desc *m;
    tokenizer *tok;
    tmpl_t *tmpl;
    char quant_name[32];
    const char *quant; /* r->o.quant after run_quant_apply (a static name, or NULL) */
    int opens;         /* models opened while keeping (the worker's log says each) */
} g_keep;

void run_keep_enable(void)
{
    g_keep.on = true;
    host_share_keep(true); /* and the GPU engine's pinned copy of the streamed layers (engine/host_share.h) */
}

int run_keep_opens(void)
{
    return g_keep.opens;
}

void run_keep_free(void)
{
    host_share_drop_kept();
    tokenizer_free(g_keep.tok);
    template_free(g_keep.tmpl);
    model_close(g_keep.m);
    g_keep.tok = NULL, g_keep.tmpl = NULL, g_keep.m = NULL;
}

/* Borrows the kept model for this job when its key matches; true when it did (r->m, tok, tmpl, quant set). */
static bool keep_take(runner *r, const char *path)
{
    if (!g_keep.on || !g_keep.m || strcmp(g_keep.path, path) || strcmp(g_keep.quant_ask, r->o.quant ? r->o.quant : ""))
        return false;
    r->m = g_keep.m, r->tok = g_keep.tok, r->tmpl = g_keep.tmpl;
    r->o.quant = g_keep.quant;
    snprintf(r->quant_name, sizeof r->quant_name, "%s", g_keep.quant_name);
    return true;
}

/* Keeps what this job opened (a job's own open, never a borrowed one) in place of what was kept before. */
static void keep_put(runner *r, const char *path, const char *quant_ask)
{
    if (!g_keep.on || r->m == g_keep.m)
        return;
    run_keep_free();
    snprintf(g_keep.path, sizeof g_keep.path, "%s", path);
    snprintf(g_keep.quant_ask, sizeof g_keep.quant_ask, "%s", quant_ask);
    g_keep.m = r->m, g_keep.tok = r->tok, g_keep.tmpl = r->tmpl;
    g_keep.quant = r->o.quant;
    snprintf(g_keep.quant_name, sizeof g_keep.quant_name, "%s", r->quant_name);
}

double run_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- display */

/* The fit to use now: the stored one merged with this run's passes. */
calib run_current_fit(const runner *r)
{
    calib c = r->cal_stored;
    calib_merge(&c, &r->cal_run);
    return c;
}

/* ---------------------------------------------------------------- the loop */

/* One sampling task: logits row cidx[j] of this pass. */
static void draw_task(void *ctx, int64_t j, int tid)
{
    runner *r = ctx;
    int k = r->cidx[j], q = r->sidx[k];
    row *w = &r->rows[r->s.seq_row[q]];
    choice *ch = &w->ch[r->s.seq_choice[q]];
    char err[SPILL_ERRLEN];
    float *lg = r->logits + (size_t)k * (size_t)r->m->vocab;
    if (ch->gs && r->tgt[k] < 0) {
        /* structured output: the logits outside the grammar become -inf before the row's own sampler, so its
         * temperature / top_p / … act on the allowed tokens and the reported log-probs are those of the
         * constrained distribution (what the answer was drawn from) */
        uint64_t *allow = r->gmask + (size_t)tid * token_mask_words(r->tm);
        token_mask_get(r->tm, tid, w->grammar, ch->gs, allow);
        token_mask_apply(allow, lg, r->m->vocab);
    }
    if (r->tgt[k] >= 0) /* teacher forcing: the prompt token's log-prob, never a draw */
        r->src[k] = sample_score(lg, r->m->vocab, r->tgt[k], w->score_top, &r->sres[k], err, sizeof err);
    else if (r->s.seq_spec[q] > 0) { /* position j of a speculating step: drawn as if proposals 1..j were kept */
        int j = (int)(r->lpos[k] - r->s.seqs[q].pos0);
        r->src[k] = sample_next_ahead(lg, r->m->vocab, &w->sp, &ch->ss, ch->spec + 1, j, &r->scs[tid], &r->sres[k],
                                      err, sizeof err);
    } else
        r->src[k] = sample_next(lg, r->m->vocab, &w->sp, &ch->ss, &r->scs[tid], &r->sres[k], err, sizeof err);
}

/* Runs the pass's forward and fills r->sres / r->src for every logits row (nl of them): greedy rows picked by
 * the backend where it can (forward_pick), the others drawn here in parallel.  0, or the backend's code. */
static int forward_and_draw(runner *r, int ns, int nl, char *err, size_t errlen)
{
    sched *s = &r->s;
    int nc = 0, frc;
    if (r->be.forward_pick) {
        /* Greedy rows (temperature 0, no bias or penalty, one choice) are picked where the logits are,
         * with sample_next's ties and log-probs: only their token and log-probs come back; so are scored
         * prompt tokens (their target's log-prob).  Rows whose logits are kept (--full-logits) come back whole. */
        bool any_tgt = false;
        for (int k = 0; k < nl; k++) {
            const row *w = &r->rows[s->seq_row[r->sidx[k]]];
            const sample_params *sp = &w->sp;
            bool greedy = sp->temperature == 0 && sp->n_logit_bias == 0 && sp->frequency_penalty == 0 &&
                          sp->presence_penalty == 0 && (sp->repetition_penalty == 0 || sp->repetition_penalty == 1) &&
                          w->n_choices == 1 && !w->grammar; /* grammar rows are masked here */
            if (w->full_logits)
                r->want[k] = -2;
            else if (r->tgt[k] >= 0)
                r->want[k] = w->score_top, any_tgt = true;
            else
                r->want[k] = !greedy ? -2 : sp->logprobs ? sp->n_top_logprobs : -1;
        }
        frc = r->be.forward_pick(r->be.impl, s->seqs, ns, r->want, any_tgt ? r->tgt : NULL, r->sres, r->logits, err,
                                 errlen);
        for (int k = 0; !frc && k < nl; k++)
            if (r->want[k] < -1)
                r->cidx[nc++] = k;
            else
                r->src[k] = r->sres[k].token < 0 ? -1 : 0;
    } else {
        frc = r->be.forward(r->be.impl, s->seqs, ns, r->logits, err, errlen);
        for (int k = 0; k < nl; k++)
            r->cidx[nc++] = k;
    }
    if (frc)
        return frc;
    /* Draw the other rows' next tokens in parallel (each row owns its RNG and counts, each thread its
     * scratch: the draws are the same whatever thread takes which row). */
    pool_run(r->spool, draw_task, r, nc);
    return 0;
}

/* A speculating decode step (sequence q, its logits rows li .. li + k): the draw after its fed token is kept,
 * and so is each next one while the token drawn equals the proposal the pass fed after it (the row would have
 * fed that very token; its logits row is then the one a plain pass would compute), until the choice ends; the
 * KV of the positions not kept is rolled back and the choice's RNG skips the kept tokens' draws.  Exact: each
 * position was drawn as the plain run draws that token (sample_next_ahead), so greedy rows keep the plain run's
 * tokens and sampled rows follow the rejection rule for a point-mass proposal (sample.c). */
static int apply_spec(runner *r, int q, int li, char *err, size_t errlen)
{
    sched *s = &r->s;
    row *w = &r->rows[s->seq_row[q]];
    choice *ch = &w->ch[s->seq_choice[q]];
    int k = s->seq_spec[q], j = 0;
    for (;; j++) {
        if (r->src[li + j])
            return util_errf(err, errlen, "row %s: no token could be drawn (every logit is NaN or -inf).",
                             w->custom_id);
        sched_spec_keep(s, q, j);
        int32_t tok = r->sres[li + j].token;
        if (run_accept_token(r, w, ch, &r->sres[li + j], err, errlen))
            return -1;
        if (ch->done || j == k || tok != ch->spec[j + 1])
            break;
    }
    sample_skip(&ch->ss, &w->sp, j + 1);
    r->dec_steps++;
    r->dec_tokens += (uint64_t)j + 1;
    r->spec_accepted += (uint64_t)j;
    r->spec_hist[j + 1]++;
    return sched_spec_settle(s, q, err, errlen);
}

static int run_passes(runner *r, char *err, size_t errlen)
{
    int pass = 0;
    sched *s = &r->s;
    /* /v1/embeddings rows first, in prefill-only passes of their own (run_embed.c says why) */
    if (run_embed_phase(r, &g_stop, err, errlen))
        return -1;
    while (!g_stop) {
#ifdef SPILL_MPI
        /* several ranks: rows from rank 0 when this rank's queue ran dry; 1 = rank 0 asks everyone to stop */
        int mr = r->mpi ? mpi_run_refill(r, err, errlen) : 0;
        if (mr < 0)
            return -1;
        if (mr > 0)
            g_stop = SIGTERM;
#endif
        if (!sched_pending(s) || g_stop)
            break;
        if (sched_admit(s, err, errlen))
            return -1;
        double t0 = run_now_s(), draft_s = r->dr.secs;
        /* --speculate draft: every decoding choice's proposals, in k batched draft steps (draft.h) */
        if (r->dr.kv && draft_propose(&r->dr, s, err, errlen))
            return -1;
        draft_s = r->dr.secs - draft_s;
        int ns = sched_build_pass(s, err, errlen);
        if (ns < 0)
            return -1;
        if (ns == 0)
            continue; /* a stalled prefill gave up its newest row: admit again */
        double pass_tokens, pass_att;
        sched_pass_work(s, &pass_tokens, &pass_att);
        for (int q = 0; q < ns; q++) { /* each row's passes and first admission (its stamp's latency_s) */
            row *w = &r->rows[s->seq_row[q]];
            if (w->last_pass != pass + 1)
                w->passes++, w->last_pass = pass + 1;
            if (w->t_admit == 0)
                w->t_admit = t0;
        }
        int nl = 0;
        for (int q = 0; q < ns; q++) {
            const fwd_seq *sq = &s->seqs[q];
            if (!sq->want_logits)
                continue;
            const row *w = &r->rows[s->seq_row[q]];
            for (int32_t i = sq->all_logits ? sq->logits_skip : sq->n - 1; i < sq->n; i++) {
                int32_t p = sq->pos0 + i;
                r->sidx[nl] = q;
                r->lpos[nl] = p;
                /* a prompt position of a scored row predicts the prompt's next token */
                r->tgt[nl] = w->score_from > 0 && p + 1 >= w->score_from && p + 1 < w->n_prompt ? w->prompt[p + 1] : -1;
                nl++;
            }
        }
        int frc = forward_and_draw(r, ns, nl, err, errlen);
        if (frc)
            return frc;
        sched_finish_pass(s);
        /* apply the draws in sequence order */
        for (int li = 0; li < nl; li++) {
            int q = r->sidx[li];
            if (s->seq_spec[q] > 0) {
                if (apply_spec(r, q, li, err, errlen))
                    return -1;
                li += s->seq_spec[q];
                continue;
            }
            if (s->seq_spec[q] == 0)
                r->dec_steps++, r->dec_tokens++, r->spec_hist[1]++;
            row *w = &r->rows[s->seq_row[q]];
            choice *ch = &w->ch[s->seq_choice[q]];
            const float *lg = r->logits + (size_t)li * (size_t)r->m->vocab;
            bool prompt_done = s->seq_choice[q] == 0 && s->seqs[q].n > 0 && ch->fed == w->n_prompt &&
                               ch->n_gen == 0 && ch->next < 0;
            sample_result sr = r->sres[li];
            if (r->src[li])
                return util_errf(err, errlen, "row %s: no token could be drawn (every logit is NaN or -inf).",
                                 w->custom_id);
            if (r->tgt[li] >= 0) { /* a scored prompt token */
                if (run_record_score(r, w, r->lpos[li] + 1, &sr, lg, err, errlen))
                    return -1;
                continue;
            }
            if (w->max_new == 0) { /* echo with max_tokens 0 / --score: the prompt was all there was to do */
                for (int c = 0; c < w->n_choices; c++)
                    w->ch[c].done = true, w->ch[c].finish = OUT_FINISH_LENGTH;
                continue;
            }
            if (w->full_logits && run_keep_logits(r, w, ch->n_gen, lg, err, errlen))
                return -1;
            if (run_accept_token(r, w, ch, &sr, err, errlen))
                return -1;
            /* n > 1: the other choices share the prompt's prefill — a copy of its KV pages, and their first
             * token drawn from the same logits with their own RNG. */
            for (int c = 1; prompt_done && c < w->n_choices; c++) {
                int sh = sched_share_prompt(s, w, c, err, errlen);
                if (sh < 0)
                    return -1;
                if (sh == 0) /* no pages: this choice prefills itself later, like a newcomer */
                    continue;
                choice *o = &w->ch[c];
                if (sample_next(lg, r->m->vocab, &w->sp, &o->ss, &r->sc, &sr, err, errlen) ||
                    run_accept_token(r, w, o, &sr, err, errlen))
                    return -1;
            }
        }
        /* rows whose every choice is done are written */
        for (size_t ai = 0; ai < s->n_active;) {
            row *w = &r->rows[s->active[ai]];
            bool all = true;
            for (int c = 0; c < w->n_choices; c++)
                all &= w->ch[c].done;
            if (all) {
                if (run_finish_row(r, ai, err, errlen))
                    return -1;
            } else
                ai++;
        }
        if (job_commit(r->j, err, errlen))
            return -1;
        if (s->cfg.kv_check && sched_check(s, err, errlen))
            return -1;
        /* the whole pass — build, forward, sampling, output, group commit — is what the ETA must price */
        double pass_s = run_now_s() - t0;
        calib_observe(&r->cal_run, pass_tokens, pass_att, pass_s);
        sched_observe_pass(s, pass_s - draft_s); /* the prompt budget prices the target's pass alone */
        plan_observe(&r->mem, s->kv->n_pages - s->kv->n_free, sched_seq_tokens(s));
        if (r->pass_log) {
            int dec = 0;
            for (int q = 0; q < ns; q++)
                dec += s->seq_spec[q] >= 0 ? s->seqs[q].n : 0; /* decode steps, speculated tokens included */
            fprintf(r->pass_log, "%d,%d,%d,%d,%.6f,%.6f,%llu,%d\n", pass + 1, ns, dec, (int)pass_tokens - dec, pass_s,
                    run_now_s() - r->t_start, (unsigned long long)plan_rss_now(), s->kv->n_pages - s->kv->n_free);
        }
        pass++;
        run_show_progress(r, pass, run_now_s() - t0, false);
    }
    return 0;
}

/* ---------------------------------------------------------------- open, plan, finish */

static void runner_free(runner *r)
{
    status_server_stop(r->status); /* before the pass log and the pre-run line it reads go */
    r->status = NULL;
    if (r->pass_log)
        fclose(r->pass_log);
    sched_free(&r->s);
    draft_close(&r->dr); /* after the scheduler, which freed the choices' draft pages */
    for (size_t i = 0; i < r->n_rows; i++) {
        if (r->rows[i].lf) { /* an unfinished row's logits file stays as .part, rewritten on resume */
            npy_abort(r->rows[i].lf);
            free(r->rows[i].lf);
        }
        sched_row_free(&r->rows[i]);
    }
    free(r->rows);
    token_mask_close(r->tm);
    free(r->gmask);
    grammar_set_free(&r->grams);
    free(r->logits);
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
    free(r->lpos);
    free(r->tgt);
    if (r->be.impl)
        r->be.close(r->be.impl);
    run_embed_free(r);
    bool kept = g_keep.m && r->m == g_keep.m; /* the worker keeps them for its next job */
    if (!kept) {
        tokenizer_free(r->tok);
        template_free(r->tmpl);
    }
    run_adapters_free(r); /* after the backend, which borrowed the set */
    if (!kept)
        model_close(r->m);
}

/* --full-logits: the files' total (exact for --score, at most max_tokens per row otherwise), refused above
 * --max-logits-bytes or the job directory's free disk; the pre-run line states it.  0, or -1 with a sentence. */
static int check_logits_room(runner *r, char *err, size_t errlen)
{
    /* DIR/logits, which is also where every rank of several writes (its rows' files need no merge) */
    if (util_pathf(r->logits_dir, sizeof r->logits_dir, "%s/logits", r->o.out_dir))
        return util_errf(err, errlen, "%s/logits: the path is too long.", r->o.out_dir);
    uint64_t total = 0, rows = 0;
    for (size_t i = 0; i < r->n_rows; i++) {
        const row *w = &r->rows[i];
        if (w->state != ROW_PENDING)
            continue;
        int64_t n = r->o.score ? w->n_prompt - w->score_from : w->max_new;
        total += npy_bytes(n, r->m->vocab);
        rows++;
    }
    struct statvfs sv;
    uint64_t avail = statvfs(job_dir(r->j), &sv) == 0 ? (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize : UINT64_MAX;
    const char *how = r->o.score ? "" : "up to ";
    char tb[32], ab[32], cb[32];
    run_fmt_bytes(total, tb, sizeof tb);
    run_fmt_bytes(avail, ab, sizeof ab);
    run_fmt_bytes(r->o.max_logits_bytes, cb, sizeof cb);
    if (r->o.max_logits_bytes && total > r->o.max_logits_bytes)
        return util_errf(err, errlen,
                         "--full-logits would write %s%s for %llu rows (tokens x %d vocab x 2 bytes), above "
                         "--max-logits-bytes %s; lower max_tokens, split the input or raise the cap.",
                         how, tb, (unsigned long long)rows, r->m->vocab, cb);
    if (total > avail)
        return util_errf(err, errlen,
                         "--full-logits would write %s%s for %llu rows (tokens x %d vocab x 2 bytes), but %s has "
                         "%s free; lower max_tokens, split the input or free disk.",
                         how, tb, (unsigned long long)rows, r->m->vocab, job_dir(r->j), ab);
    if (!r->o.quiet)
        fprintf(stderr, "spill: --full-logits: %s%s for %llu rows in %s (%s free)\n", how, tb,
                (unsigned long long)rows, r->logits_dir, ab);
    return 0;
}

#ifndef SPILL_GIT
#define SPILL_GIT "unknown"
#endif

/* The first "model name" of /proc/cpuinfo, or "". */
static void cpu_model(char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            snprintf(out, cap, "%s", v);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    if (f)
        fclose(f);
}

/* What the run store keeps about this run besides what job.c writes: the command line, quant, adapters, the
 * build and the hardware (the machine's probe from the calibration store, when one was taken). */
static int record_run_info(runner *r, char *err, size_t errlen)
{
    bool resumed = json_object_get(job_manifest(r->j), "argv") != NULL;
    json_t *argv = json_array();
    json_array_append_new(argv, json_string("spill"));
    json_array_append_new(argv, json_string(resumed ? "resume" : r->o.cmd == 1 ? "distill" : "run"));
    for (int i = 0; argv && i < r->argc; i++)
        json_array_append_new(argv, json_string(r->argv[i]));
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    json_t *hw = json_pack("{s:s,s:i,s:I,s:s}", "cpu", cpu, "cores", (int)sysconf(_SC_NPROCESSORS_ONLN), "ram_bytes",
                           (json_int_t)((uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE)),
                           "backend", r->be.name);
    char pp[4200];
    probe_result pr;
    char e2[SPILL_ERRLEN];
    if (hw && !util_pathf(pp, sizeof pp, "%s/calibration/probe.json", util_spill_home()) && util_is_file(pp) &&
        probe_load(pp, &pr, e2, sizeof e2) == 0)
        json_object_set_new(hw, "probe", json_pack("{s:s,s:f,s:f,s:f,s:b}", "time", pr.time, "disk_read_gbs",
                                                   pr.read_gbs, "disk_write_gbs", pr.write_gbs, "matmul_gflops",
                                                   pr.matmul_gflops, "direct_io", pr.direct));
    json_t *ad = r->default_adapter
                     ? json_pack("{s:s,s:s}", "id", r->adapter_spec, "hash", run_adapter_hash(r, r->default_adapter))
                     : json_null();
    json_t *ads = json_array();
    for (int i = 0; ads && i < r->lora.n; i++)
        json_array_append_new(ads, json_pack("{s:s,s:s,s:s}", "name", r->lora.ad[i]->name, "path", r->lora.ad[i]->path,
                                             "hash", r->lora.ad[i]->hash));
    json_t *build = json_pack("{s:s,s:s,s:s}", "version", SPILL_VERSION, "git", SPILL_GIT, "backend",
                              spill_gpu_open ? "cuda" : "cpu");
    if (!argv || !hw || !ad || !ads || !build) {
        json_decref(argv), json_decref(hw), json_decref(ad), json_decref(ads), json_decref(build);
        return util_errf(err, errlen, "out of memory recording the run's manifest.");
    }
    return job_set_info(r->j, resumed ? "resume_argv" : "argv", argv, err, errlen) ||
           job_set_info(r->j, "quant", json_string(r->m->quant_summary), err, errlen) ||
           job_set_info(r->j, "adapter", ad, err, errlen) || job_set_info(r->j, "adapters", ads, err, errlen) ||
           job_set_info(r->j, "build", build, err, errlen) || job_set_info(r->j, "hardware", hw, err, errlen);
}

/* Prompt tokens this process's rows mapped from the prefix cache (each row's last admission: its cached_tokens). */
uint64_t run_cached_tokens(const runner *r)
{
    uint64_t n = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        n += (uint64_t)r->rows[i].cached;
    return n;
}

/* The run's throughput, into the manifest before its last commit. */
static void record_throughput(runner *r, double el)
{
    char e2[SPILL_ERRLEN];
    uint64_t toks = r->tokens_generated ? r->tokens_generated : r->tokens_scored;
    if (r->j)
        job_set_info(r->j, "throughput",
                     json_pack("{s:f,s:I,s:I,s:I,s:I,s:f}", "seconds", el, "tokens_generated",
                               (json_int_t)r->tokens_generated, "tokens_scored", (json_int_t)r->tokens_scored,
                               "prompt_tokens", (json_int_t)r->prompt_tokens, "cached_tokens",
                               (json_int_t)run_cached_tokens(r), "tok_s", el > 0 ? (double)toks / el : 0),
                     e2, sizeof e2);
}

/* Sequences and logits rows one pass may carry for r->batch rows in flight. */
static void size_batch(runner *r)
{
    int max_n = 1; /* sequences per pass: every active choice (admission keeps them under batch + the largest n) */
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING && r->rows[i].n_choices > max_n)
            max_n = r->rows[i].n_choices;
    r->max_seqs = r->batch + max_n;
    /* scored prompts (echo with log-probs, --score) return a logits row per token: up to a prompt chunk's
     * worth more per pass, within 256 MiB of logits on the CPU (whose pass is its FLOPs anyway) and 1 GiB on
     * the GPU (HBM, and the pinned copy the host rows come back in), at least one more row */
    bool scoring = false;
    for (size_t i = 0; i < r->n_rows && !scoring; i++)
        scoring = r->rows[i].state == ROW_PENDING && r->rows[i].score_from > 0;
    int extra = 0;
    if (scoring) {
        bool gpu = r->o.device != 1 && spill_gpu_open;
        int64_t cap = (int64_t)(gpu ? 1u << 30 : 256u << 20) / ((int64_t)r->m->vocab * 4);
        extra = (int)(cap < r->o.prefill_chunk ? cap : r->o.prefill_chunk);
        extra = extra < 1 ? 1 : extra;
    }
    /* speculative passes: up to --spec-k more rows for each decode step, within the same caps */
    if (r->o.speculate == 1 || r->o.speculate == 3) {
        bool gpu = r->o.device != 1 && spill_gpu_open;
        int64_t cap = (int64_t)(gpu ? 1u << 30 : 256u << 20) / ((int64_t)r->m->vocab * 4);
        int64_t want = (int64_t)r->max_seqs * r->o.spec_k;
        extra += (int)(want < cap ? want : cap);
    }
    r->max_logit_rows = r->max_seqs + extra;
}

static int cmp_i32_asc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* KV pages the plan counts for pending row w at toks positions per choice: with the prefix cache its choices > 0
 * map choice 0's full prompt pages and a row of a group maps the prefix its predecessor holds (share_hint), so
 * a shared page is counted once.  alone: the row by itself (no predecessor to map from). */
static int32_t plan_row_pages(const runner *r, const row *w, int64_t toks, bool alone)
{
    int32_t P = r->o.page_tokens > 0 ? r->o.page_tokens : 16;
    int64_t pg = (toks + P - 1) / P * w->n_choices;
    if (r->o.prefix_cache != 2) {
        pg -= (int64_t)(w->n_choices - 1) * ((w->n_prompt - 1) / P);
        if (!alone)
            pg -= w->share_hint / P;
    }
    pg = pg < 1 ? 1 : pg;
    return pg > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)pg;
}

/* How many pending rows `pages` KV pages hold at once at their planned lengths (prompt + expect_new, each
 * choice): taken shortest first (the most that can ever be in flight), or in queue order, longest first (the
 * first batch).  At least 1, at most r->batch. */
int run_fit_rows(const runner *r, int64_t pages, bool longest_first)
{
    int32_t *need = malloc((r->n_rows + 1) * sizeof *need);
    if (!need)
        return r->batch;
    size_t n = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING) {
            const row *w = &r->rows[i];
            need[n++] = plan_row_pages(r, w, (int64_t)w->n_prompt + (w->expect_new ? w->expect_new : w->max_new),
                                       false);
        }
    qsort(need, n, sizeof *need, cmp_i32_asc);
    int64_t used = 0;
    int k = 0;
    for (size_t i = 0; i < n && k < r->batch; i++) {
        int32_t v = need[longest_first ? n - 1 - i : i];
        if (used + v > pages && k > 0)
            break;
        used += v;
        k++;
    }
    free(need);
    return k < 1 ? 1 : k;
}

/* The memory plan for this job (plan.h) from the pending rows' KV needs and the engine about to open. */
static int make_plan(runner *r, const engine_opts *eo, bool gpu, char *err, size_t errlen)
{
    int32_t want, min_pages, largest = 1;
    int32_t *need = malloc((r->n_rows + 1) * sizeof *need);
    if (!need)
        return util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows);
    size_t nn = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING) {
            /* --batch: every token a row may generate; from memory: its planned length (expect_new) */
            const row *w = &r->rows[i];
            int64_t toks = (int64_t)w->n_prompt + (r->o.batch || !w->expect_new ? w->max_new : w->expect_new);
            need[nn++] = plan_row_pages(r, w, toks, false);
            int32_t a = plan_row_pages(r, w, toks, true);
            largest = a > largest ? a : largest;
        }
    plan_kv_want(need, nn, r->batch, &want, &min_pages);
    free(need);
    int32_t P = r->o.page_tokens > 0 ? r->o.page_tokens : 16, emb = run_embed_longest(r, NULL);
    largest = (emb + P - 1) / P > largest ? (emb + P - 1) / P : largest; /* an embedding input is held whole */
    min_pages = largest; /* the longest row alone, with nothing to map */
    want = want < largest ? largest : want;
    /* the embedding phase runs before the generation rows: a pass's inputs held together, not on top */
    int32_t emb_want = run_embed_want_pages(r, P, r->max_seqs);
    want = want < emb_want ? emb_want : want;
    /* a draft model: its weights and pass buffers beside the target's, a draft page beside every KV page */
    uint64_t draft_fixed = 0, draft_page = 0, page = r->mem.page_bytes;
    if (r->dr.m) {
        int threads = r->o.threads > 0 ? r->o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        draft_mem(&r->dr, eo, threads < 1 ? 1 : threads, &draft_fixed, &draft_page);
        r->mem.page_bytes += draft_page;
    }
    mem_job_in in = {r->m, eo, r->fingerprint, r->o.mem_budget, r->o.kv_bytes, r->o.threads, r->o.mode,
                     r->o.page_tokens, r->o.kv_dtype, r->max_logit_rows, want, min_pages, r->grams.n > 0,
                     draft_fixed};
    int rc = plan_job(&r->mem, &in, gpu, err, errlen);
    r->mem.page_bytes = page;
    return rc;
}

/* The prefix cache's queue order, computed before the plan for its share hints (sched_init orders the same
 * rows the same way).  0, or -1 with a sentence. */
static int share_hints(runner *r, char *err, size_t errlen)
{
    if (r->o.prefix_cache == 2)
        return 0;
    size_t *order = malloc((r->n_rows + 1) * sizeof *order), n;
    int rc = order ? sched_order(r->rows, r->n_rows, r->o.page_tokens, true, order, &n) : -1;
    free(order);
    r->shared_expect = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING)
            r->shared_expect += (uint64_t)r->rows[i].share_hint;
    return rc ? util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows) : 0;
}

/* Opens the backend the plan was made for: the GPU when this binary has one (unless --cpu), else the CPU (a GPU
 * plan is made again for host RAM).  0, or -1 with a sentence and *code the exit code. */
static int open_backend(runner *r, engine_opts *eo, int *code, char *err, size_t errlen)
{
    int brc = -1;
    if (r->o.device != 1 && spill_gpu_open) {
        brc = spill_gpu_open(r->m, eo, r->o.resident_layers, &r->be, err, errlen);
        if (brc && r->o.device == 2) {
            *code = brc == ENGINE_EDEVICE ? SPILL_EX_TEMPFAIL : SPILL_EX_SOFTWARE;
            return -1;
        }
        if (brc)
            fprintf(stderr, "spill: no GPU engine (%s); running on the CPU.\n", err);
    } else if (r->o.device == 2) {
        *code = SPILL_EX_USAGE;
        return util_errf(err, errlen, "this spill binary was built without CUDA; build build/cuda/spill-cuda (make cuda).");
    }
    if (!brc)
        return 0;
    if (r->mem.plan.gpu) { /* the GPU plan sized nothing for host RAM: plan again for the CPU */
        if (make_plan(r, eo, false, err, errlen)) {
            *code = SPILL_EX_USAGE;
            return -1;
        }
        eo->kv_pages = r->mem.plan.kv_pages;
        eo->stream = r->mem.plan.stream;
    }
    if (r->o.kv_dtype) {
        *code = SPILL_EX_USAGE;
        return util_errf(err, errlen, "--kv-dtype %s needs the GPU engine (the CPU engine keeps fp32 KV); drop it or "
                                      "run spill-cuda on a GPU.", kv_dtype_name(r->o.kv_dtype));
    }
    if (engine_backend_cpu(r->m, eo, &r->be, err, errlen)) {
        *code = SPILL_EX_SOFTWARE;
        return -1;
    }
    return 0;
}

/* The stored pass-cost fit, keyed by model | backend | machine | batch: the same model on another backend or
 * host costs differently. */
static void load_calibration(runner *r)
{
    char host[128] = "host", key[512];
    gethostname(host, sizeof host - 1);
    /* the backend's kind, without the sizes its plan printed (", KV 12.3 GB") */
    char kind[sizeof r->be.name];
    snprintf(kind, sizeof kind, "%s", r->be.name);
    char *kvp = strstr(kind, ", KV ");
    if (kvp)
        *kvp = 0;
    if (r->o.batch)
        snprintf(key, sizeof key, "%.16s-%s-%s-b%d", r->fingerprint, host, kind, r->o.batch);
    else /* batch from memory: one fit whatever the job's row count */
        snprintf(key, sizeof key, "%.16s-%s-%s-bmem", r->fingerprint, host, kind);
    for (char *k = key; *k; k++)
        if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '-'))
            *k = '_';
    if (calib_path(key, r->cal_path, sizeof r->cal_path) != 0 || calib_load(r->cal_path, &r->cal_stored) != 0)
        memset(&r->cal_stored, 0, sizeof r->cal_stored);
}

/* Pass buffers, the rows that cannot fit the whole cache (to errors.jsonl), and the scheduler over the rest.
 * Needs r->m, r->tok, r->be, r->j. */
static int setup_passes(runner *r, char *err, size_t errlen)
{
    size_t max_seqs = (size_t)r->max_logit_rows; /* logits rows: one per sequence, plus scored prompt chunks' */
    r->logits = malloc(max_seqs * (size_t)r->m->vocab * sizeof(float));
    r->sres = malloc(max_seqs * sizeof *r->sres);
    r->sidx = malloc(max_seqs * sizeof *r->sidx);
    r->src = calloc(max_seqs, sizeof *r->src);
    r->want = malloc(max_seqs * sizeof *r->want);
    r->cidx = malloc(max_seqs * sizeof *r->cidx);
    r->lpos = malloc(max_seqs * sizeof *r->lpos);
    r->tgt = malloc(max_seqs * sizeof *r->tgt);
    if (sample_scratch_init(&r->sc, r->m->vocab, err, errlen) || pool_create(r->o.threads, 0, &r->spool, err, errlen))
        return -1;
    r->scs = calloc((size_t)pool_threads(r->spool), sizeof *r->scs);
    for (int t = 0; r->scs && t < pool_threads(r->spool); t++)
        if (sample_scratch_init(&r->scs[t], r->m->vocab, err, errlen))
            return -1;
    if (!r->logits || !r->sres || !r->sidx || !r->src || !r->scs || !r->want || !r->cidx || !r->lpos || !r->tgt)
        return util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows);
    if (r->grams.n) { /* structured output: the vocabulary's masks, their cache capped (the plan counts it) */
        if (token_mask_open(r->tok, r->m->vocab, r->m->stop_ids, r->m->n_stop, pool_threads(r->spool),
                            TOKEN_MASK_CACHE_BYTES, &r->tm, err, errlen))
            return -1;
        r->gmask = malloc((size_t)pool_threads(r->spool) * token_mask_words(r->tm) * sizeof *r->gmask);
        if (!r->gmask)
            return util_errf(err, errlen, "out of memory for the token masks.");
    }
    /* several ranks: each checks the rows rank 0 hands it, against its own cache (mpi_run.c) */
    for (size_t i = 0; !r->n_ranks && i < r->n_rows; i++)
        if (r->rows[i].state == ROW_PENDING && run_fail_unfit(r, i, err, errlen) < 0)
            return -1;
    /* the prompt tokens per pass adapt when the user left them and the layers stream (the backend's streams
     * flag): a resident pass costs its compute, with no copy to hide it behind, so the cap stays the constant */
    bool adapt = r->o.prefill_auto && r->be.streams;
    sched_cfg sc = {&r->be, r->tok, r->m->vocab, r->job_seed, r->batch, r->max_seqs, r->o.prefill_chunk,
                    r->mem.plan.guard, r->max_logit_rows, r->o.batch == 0, r->o.prefix_cache != 2,
                    r->o.settings.kv_check, r->o.speculate == 1 || r->o.speculate == 3 ? r->o.spec_k : 0, adapt,
                    r->dr.kv};
    return sched_init(&r->s, &sc, r->rows, r->n_rows, err, errlen);
}

int run_fail_unfit(runner *r, size_t i, char *err, size_t errlen)
{
    const kv_cache *kv = r->be.kv(r->be.impl);
    row *w = &r->rows[i];
    int32_t need = sched_row_pages(kv, w, r->o.prefix_cache != 2);
    if (need <= kv->n_pages)
        return 0;
    char msg[SPILL_ERRLEN];
    snprintf(msg, sizeof msg,
             "This row needs %d KV pages to finish but the cache holds %d; raise --kv-mem or lower max_tokens.", need,
             kv->n_pages);
    w->state = ROW_DONE;
    if (w->group_n > 1) { /* a prompt list's line fails whole, once */
        row *g = &r->rows[w->group_first];
        if (g->group_failed)
            return 1;
        g->group_failed = true;
        for (int k = 0; k < g->group_n; k++)
            r->rows[w->group_first + (size_t)k].state = ROW_DONE;
    }
    return run_append_error_line(r, w->custom_id, msg, NULL, "insufficient_memory", err, errlen) ? -1 : 1;
}

/* Creates the job (run), or reopens it and checks it was started with this model (resume: stored not NULL). */
static int open_job(runner *r, const job_stored *stored, char *err, size_t errlen)
{
    if (stored) {
        if (job_open_resume(r->o.out_dir, NULL, &r->j, err, errlen))
            return -1;
        /* one job, one model: mixing two models' answers in one output would be silent corruption */
        const char *fp = stored->model_fingerprint;
        if (fp && strcmp(fp, r->fingerprint)) {
            util_errf(err, errlen,
                      "%s: the job was started with model fingerprint %.16s but %s now has %.16s; resume it with the "
                      "same model files.",
                      r->o.out_dir, fp, r->o.model_spec, r->fingerprint);
            job_close(r->j, JOB_RUNNING, NULL, 0);
            r->j = NULL;
            return -1;
        }
        return 0;
    }
    json_t *oj = run_opts_json(&r->o);
    uint64_t total = 0;
    int rc = oj ? run_count_rows(r->o.input, &total, err, errlen) : util_errf(err, errlen, "out of memory.");
    job_info ji = {r->o.cmd == 1 ? "distill" : "run", r->o.input, oj, r->o.model_spec, r->fingerprint, SPILL_VERSION, total};
    if (rc == 0)
        rc = job_create(r->o.out_dir, &ji, NULL, &r->j, err, errlen);
    json_decref(oj);
    return rc;
}

int run_open_job(runner *r, const job_stored *stored, char *err, size_t errlen)
{
    int rc = open_job(r, stored, err, errlen);
    if (rc == 0)
        snprintf(r->run_id, sizeof r->run_id, "%s", job_id(r->j));
    return rc;
}

/* --status-port: the job's page on 127.0.0.1 (progress.h), its URL with the key printed once, after the pre-run
 * line it shows (the passes go to DIR/passes.csv when no --pass-log was named: set before the log opens).  A port that cannot be bound is said and the job goes on without
 * the page: the rows matter more than the view. */
static void start_status(runner *r)
{
    char key[40], e2[SPILL_ERRLEN];
    r->status = status_server_start(r->o.status_port, job_dir(r->j), r->o.pass_log, r->ready_line, r->rows_total, key,
                                    sizeof key, e2, sizeof e2);
    if (!r->status)
        fprintf(stderr, "spill: %s The job goes on without its status page.\n", e2);
    else
        fprintf(stderr, "spill: status page at http://127.0.0.1:%d/#key=%s\n", r->o.status_port, key);
}

int run_open_weights(runner *r, const char *path, char *err, size_t errlen)
{
    return model_open(path, &r->m, err, errlen) || run_quant_apply(r, path, err, errlen) ? -1 : 0;
}

#ifdef SPILL_MPI
/* The rank-0 end wait's progress line (mpi_run_finish). */
static void tick_progress(runner *r)
{
    run_show_progress(r, 0, 0, false);
}
#endif

/* Shared by run and resume once the options are known; `stored` (resume) reopens o.out_dir.  Returns the exit
 * code. */
static int run_job(runner *r, const job_stored *stored)
{
    char err[SPILL_ERRLEN], path[4096], e2[SPILL_ERRLEN];
    int code = SPILL_EX_DATAERR;
    double t_open = run_now_s();
    g_stop = 0; /* a worker's earlier job may have been stopped */
    r->tty = isatty(STDOUT_FILENO);
    /* launched by mpirun or srun: one rank of several (mpi_run.c); a binary without MPI refuses that */
    if (mpi_run_init(r, err, sizeof err)) {
        code = SPILL_EX_USAGE;
        goto fail;
    }
    spill_gpu_index = r->host_rank; /* a host's ranks drive its GPUs in turn (engine.h) */

    /* open: the model (MODEL, or the base of BASE+ADAPTER; a hub model is downloaded here, where Ctrl-C still
     * stops the process and keeps what arrived), its tokenizer and template */
    char base[4096];
    int rr = 0;
    if (run_adapters_open(r, base, sizeof base, err, sizeof err) ||
        (rr = model_resolve(base, path, sizeof path, err, sizeof err))) {
        code = rr ? model_resolve_exit(rr) : code;
        goto fail;
    }
    /* --quant's copy is written before the handlers too: Ctrl-C stops it, and its file appears whole or not at all */
    int orc;
    char quant_ask[64];
    snprintf(quant_ask, sizeof quant_ask, "%s", r->o.quant ? r->o.quant : "");
    bool borrowed = !r->mpi && keep_take(r, path);
#ifdef SPILL_MPI
    if (borrowed)
        orc = 0;
    else if (r->mpi) /* ranks sharing $SPILL_HOME write a --quant copy one at a time: the first writes it, the others find it */
        orc = mpi_run_in_turn(r, path, err, sizeof err);
    else
#endif
        orc = borrowed ? 0 : run_open_weights(r, path, err, sizeof err);
    if (orc)
        goto fail;
    if (g_keep.on && !borrowed) {
        g_keep.opens++;
        fprintf(stderr, "spill worker %d: model opened: %s\n", (int)getpid(), path);
    }
    /* From here on SIGINT/SIGTERM only set a flag: the pass loop checkpoints and exits 75. */
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!borrowed &&
        (prompt_open_tokenizer(r->m, &r->tok, err, sizeof err) || prompt_open_template(r->m, &r->tmpl, err, sizeof err)))
        goto fail;
    if (!r->mpi)
        keep_put(r, path, quant_ask);
    model_fingerprint(r->m, r->fingerprint);
    snprintf(r->sys_fp, sizeof r->sys_fp, "fp_%.10s", r->fingerprint);
    run_defaults(&r->o);
    r->mem.page_bytes = kv_page_bytes(r->m->n_layers, r->m->n_kv_heads, r->m->head_dim, r->o.page_tokens);
    if (getrandom(&r->job_seed, sizeof r->job_seed, 0) != sizeof r->job_seed)
        r->job_seed = (uint64_t)time(NULL);
    /* Set-up errors a user fixes on the command line or with another model are refused before a job exists. */
    if (r->o.kv_dtype && (r->o.device == 1 || !spill_gpu_open)) {
        util_errf(err, sizeof err, "--kv-dtype %s needs the GPU engine (the CPU engine keeps fp32 KV); drop it or "
                                   "run spill-cuda on a GPU.", kv_dtype_name(r->o.kv_dtype));
        code = SPILL_EX_USAGE;
        goto fail;
    }
    if (r->o.device == 2 && !spill_gpu_open) {
        util_errf(err, sizeof err, "this spill binary was built without CUDA; build build/cuda/spill-cuda (make cuda).");
        code = SPILL_EX_USAGE;
        goto fail;
    }
    /* the engine that will run it: --gpu's, else the CPU's (the GPU engine falls back to it); the command
     * line's adapter is checked against it before a job exists */
    if (model_arch_resolve(r->m, r->o.device == 2 ? ARCH_ENGINE_CUDA : ARCH_ENGINE_CPU, &r->al, err, sizeof err) ||
        run_adapters_default(r, err, sizeof err) || run_embed_open(r, path, err, sizeof err)) {
        code = SPILL_EX_DATAERR;
        goto fail;
    }

    /* --speculate draft: the draft model, its vocabulary the target's (checked here, before a job exists) */
    if (r->o.speculate == 3) {
        if (draft_open_model(&r->dr, r->o.draft_spec, r->m, r->tok, &code, err, sizeof err))
            goto fail;
    }

    /* the job and its rows */
    int jrc;
#ifdef SPILL_MPI
    if (r->mpi) /* rank 0 opens DIR's job (folding earlier ranks' rows in), the others their DIR/ranks/<k> */
        jrc = mpi_run_open(r, stored, err, sizeof err);
    else
#endif
        jrc = run_open_job(r, stored, err, sizeof err);
    if (jrc)
        goto fail;
    r->stamp = (out_stamp){r->run_id, r->fingerprint, r->quant_name, NULL, 0, 0, NULL};
    if (run_load_rows(r, err, sizeof err) || run_adapters_write(r, err, sizeof err))
        goto fail_job;
    if (r->n_renamed && !r->o.quiet)
        fprintf(stderr,
                "spill: %llu rows name body.model \"%s\"%s; their answers name the model that ran, %s (the requested "
                "name is kept in each row's spill.requested_model).\n",
                (unsigned long long)r->n_renamed, r->renamed_example, r->renamed_many ? " (or another)" : "",
                r->o.model_spec);

    /* plan: one budget for everything picks resident or streamed and sizes the KV cache; then the engine */
    /* rows in flight: --batch, or from memory up to every pending row (RUN_MAX_BATCH at most), cut below to what
     * the plan's KV pages hold */
    size_t n_pending = 0, n_gen = 0, n_emb = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        n_gen += r->rows[i].state == ROW_PENDING;
    run_embed_longest(r, &n_emb);
    n_pending = n_gen + n_emb; /* embedding inputs share passes too (run_embed.c), each a sequence */
    r->batch = r->o.batch ? r->o.batch : n_pending < 1 ? 1 : n_pending > RUN_MAX_BATCH ? RUN_MAX_BATCH : (int)n_pending;
    size_batch(r);
    if (share_hints(r, err, sizeof err))
        goto fail_job;
    if (r->o.full_logits && check_logits_room(r, err, sizeof err)) {
        code = SPILL_EX_USAGE;
        goto fail_job;
    }
    engine_opts eo = {.threads = r->o.threads,
                      .max_logit_rows = r->max_logit_rows,
                      .lora = r->lora.n ? &r->lora : NULL,
                      .max_pass_tokens = r->max_seqs + r->o.prefill_chunk,
                      .max_pass_seqs = r->max_seqs,
                      .page_tokens = r->o.page_tokens,
                      .stream_slots = r->o.stream_slots,
                      .direct_io = true,
                      .q8_activations = r->o.q8 && !r->o.exact,
                      .from_disk = r->o.from_disk,
                      .kv_dtype = r->o.kv_dtype,
                      .gpu_profile = r->o.settings.cuda_prof,
                      .gpu_attention_fp32 = r->o.settings.cuda_att_fp32,
                      .gpu_pin_alloc = r->o.settings.cuda_pin_alloc,
                      /* the host's one shared copy where another process may stream the same layers (MPI
                       * ranks on one host; a worker's next job); a lone job keeps its own (pinned faster with
                       * huge pages, and nothing outlives a kill -9) unless SPILL_CUDA_PIN=shared */
                      .gpu_pin_private = r->o.settings.cuda_pin_private ||
                                         (!r->o.settings.cuda_pin_shared && r->n_ranks < 2 && !g_keep.on),
                      .shm_dir = r->o.settings.shm_dir[0] ? r->o.settings.shm_dir : NULL};
    if (make_plan(r, &eo, r->o.device != 1 && spill_gpu_open, err, sizeof err)) {
        code = SPILL_EX_USAGE;
        goto fail_job;
    }
    if (!r->o.batch && !r->mem.plan.gpu) {
        /* host RAM: the plan gave the KV its pages; the most rows they hold at once (shortest first) is the
         * most a pass carries, and pass buffers sized for fewer sequences leave more for the KV */
        int fit = run_fit_rows(r, r->mem.plan.kv_pages, false);
        if (fit < r->batch && n_gen > 0) { /* (embedding inputs are admitted as their pages free up) */
            r->batch = fit;
            size_batch(r);
            eo.max_logit_rows = r->max_logit_rows;
            eo.max_pass_tokens = r->max_seqs + r->o.prefill_chunk;
            eo.max_pass_seqs = r->max_seqs;
            if (make_plan(r, &eo, false, err, sizeof err)) {
                code = SPILL_EX_USAGE;
                goto fail_job;
            }
        }
    }
    eo.kv_pages = r->mem.plan.kv_pages;
    eo.stream = r->mem.plan.stream;
    eo.gpu_mem = r->o.gpu_mem;
    eo.host_mem = plan_host_mem(r->o.mem_budget); /* the GPU engine may pin streamed layers in what is left */
    if (open_backend(r, &eo, &code, err, sizeof err))
        goto fail_job;
    load_calibration(r);
    { /* the backend's pages: fp32 on the CPU, bf16 or int8 in HBM */
        const kv_cache *bkv = r->be.kv(r->be.impl);
        r->mem.page_bytes = kv_page_bytes_as(r->m->n_layers, r->m->n_kv_heads, r->m->head_dim, r->o.page_tokens,
                                             bkv->dtype);
        /* the draft: one page of its own beside each of the target's (what the plan priced) */
        if (r->dr.m) {
            int32_t dpages = bkv->n_pages;
            if (r->mem.plan.gpu) {
                /* the target's pages are in HBM and the GPU plan never priced the draft's, which live in host RAM
                 * beside the pinned layers: at most half of what the budget has left (a choice without a draft
                 * page proposes nothing that pass) */
                uint64_t dpb = kv_page_bytes(r->dr.m->n_layers, r->dr.m->n_kv_heads, r->dr.m->head_dim,
                                             r->o.page_tokens);
                uint64_t rss = plan_rss_now(), left = r->o.mem_budget > rss ? (r->o.mem_budget - rss) / 2 : 0;
                if (dpb && (uint64_t)dpages * dpb > left)
                    dpages = left / dpb < 2 ? 2 : (int32_t)(left / dpb);
            }
            if (draft_open_engine(&r->dr, &eo, dpages, err, sizeof err)) {
                code = SPILL_EX_SOFTWARE;
                goto fail_job;
            }
            r->mem.page_bytes += r->dr.kv->n_pages ? kv_page_bytes(r->dr.m->n_layers, r->dr.m->n_kv_heads,
                                                                   r->dr.m->head_dim, r->o.page_tokens) : 0;
        }
        r->first_batch = r->o.batch ? r->o.batch : run_fit_rows(r, bkv->n_pages, true);
    }
    code = SPILL_EX_SOFTWARE; /* what is left to fail before the passes is memory or the disk */
    if (setup_passes(r, err, sizeof err) || record_run_info(r, err, sizeof err) || job_commit(r->j, err, sizeof err))
        goto fail_job;
    if (!stored && r->rank == 0) { /* found by its id from anywhere: $SPILL_HOME/runs/<id> when it lives elsewhere */
        int rg = runs_register(job_dir(r->j), job_id(r->j), e2, sizeof e2);
        if (rg < 0)
            fprintf(stderr, "spill: the run is not in the run index (%s); resume it by its directory.\n", e2);
        else if (rg > 0)
            fprintf(stderr, "spill: another run already has the id %s; resume this one by its directory, %s.\n",
                    job_id(r->j), job_dir(r->j));
    }
    uint64_t already = job_rows_completed(r->j) + job_rows_failed(r->j);
#ifdef SPILL_MPI
    /* several ranks: rank 0's job goes on collecting (at the end), each rank writes its rows to its own
     * DIR/ranks/<k>, and the queue waits for the rows rank 0 hands out */
    if (r->mpi && mpi_run_start(r, err, sizeof err))
        goto fail_job;
#endif
    r->rows_done = job_rows_completed(r->j);
    r->rows_failed = job_rows_failed(r->j);
    if (r->o.status_port && r->rank == 0 && !r->o.pass_log) { /* the status page's charts read the passes */
        snprintf(r->status_csv, sizeof r->status_csv, "%s/passes.csv", job_dir(r->j));
        r->o.pass_log = r->status_csv;
    }
    if (r->o.pass_log && (r->pass_log = fopen(r->o.pass_log, "w"))) {
        setvbuf(r->pass_log, NULL, _IOLBF, 0); /* a line per pass, readable as it lands (the status page) */
        fprintf(r->pass_log, "pass,seqs,decode_tokens,prefill_tokens,seconds,elapsed,rss_bytes,kv_pages_used\n");
    }
    r->t_start = run_now_s(); /* the job's clock: rows read, engine loaded; passes start now */
    /* several ranks: no replay prices rows that other ranks will take */
    r->eta_prerun = r->n_ranks ? -1 : sched_estimate(&r->s, &r->cal_stored);
    run_print_ready(r, stored != NULL, t_open, already);
    if (r->o.status_port && r->rank == 0)
        start_status(r);

    /* the passes */
    r->started = true;
    if (run_passes(r, err, sizeof err))
        goto fail_job;
    if (!r->n_ranks)
        run_show_progress(r, 0, 0, true);

    /* finish */
    if (r->host_rank == 0 && plan_save_fit(&r->mem, e2, sizeof e2))
        fprintf(stderr, "spill: memory calibration not saved: %s\n", e2);
    calib merged = run_current_fit(r);
    record_throughput(r, run_now_s() - r->t_start);
#ifdef SPILL_MPI
    if (r->mpi) { /* this rank's rows are committed; rank 0 waits for every rank, merges and closes DIR's job */
        if (r->host_rank == 0)
            calib_save(r->cal_path, &merged, e2, sizeof e2);
        int fr = mpi_run_finish(r, g_stop != 0, tick_progress, err, sizeof err);
        r->j = NULL;
        if (fr < 0) {
            code = SPILL_EX_TEMPFAIL;
            goto fail;
        }
        run_show_progress(r, 0, 0, true);
        if (fr > 0) {
            if (r->rank == 0)
                fprintf(stderr, "spill: interrupted; %llu of %llu rows are saved. Continue with: mpirun spill resume %s\n",
                        (unsigned long long)(r->rows_done + r->rows_failed), (unsigned long long)r->rows_total,
                        r->o.out_dir);
            code = SPILL_EX_TEMPFAIL;
            goto out;
        }
        run_print_done(r, r->o.out_dir, run_now_s() - r->t_start);
        code = SPILL_EX_OK;
        goto out;
    }
#endif
    if (g_stop) {
        calib_save(r->cal_path, &merged, e2, sizeof e2);
        int rc = job_close(r->j, JOB_INTERRUPTED, err, sizeof err);
        r->j = NULL;
        if (rc)
            goto fail;
        fprintf(stderr, "spill: interrupted; %llu of %llu rows are saved. Continue with: spill resume %s\n",
                (unsigned long long)(r->rows_done + r->rows_failed), (unsigned long long)r->rows_total, r->o.out_dir);
        code = SPILL_EX_TEMPFAIL;
        goto out;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", job_dir(r->j));
    int rc = job_close(r->j, JOB_DONE, err, sizeof err);
    r->j = NULL;
    if (rc)
        goto fail;
    double el = run_now_s() - r->t_start;
    if (calib_save(r->cal_path, &merged, e2, sizeof e2))
        fprintf(stderr, "spill: calibration not saved: %s\n", e2);
    run_print_done(r, dir, el);
    code = SPILL_EX_OK;
    goto out;
fail_job:
    if (r->j && !r->started && !job_is_broken(r->j) && code != SPILL_EX_TEMPFAIL) {
        /* A set-up error (the plan, the engine): it would fail the same way on resume, so it is not resumable.
         * A job made by this command never started: it goes (its rows' error lines with it); a resumed one stays
         * as it was, to be resumed once the cause is fixed. */
        if (stored)
            job_close(r->j, JOB_INTERRUPTED, e2, sizeof e2);
        else
            job_discard(r->j);
        r->j = NULL;
    }
    if (r->j) { /* committed rows stay committed; the job stays resumable */
        job_close(r->j, job_is_broken(r->j) ? JOB_RUNNING : JOB_INTERRUPTED, e2, sizeof e2);
        r->j = NULL;
        code = SPILL_EX_TEMPFAIL;
    }
fail:
    if (r->n_ranks)
        fprintf(stderr, "spill: rank %d: %s\n", r->rank, err);
    else
        fprintf(stderr, "spill: %s\n", err);
    if (code == SPILL_EX_TEMPFAIL && r->o.out_dir && r->rank == 0)
        fprintf(stderr, "spill: the job is resumable: spill resume %s\n", r->o.out_dir);
out:
#ifdef SPILL_MPI
    /* before the runner goes: rank 0's end of the job, the merge's job and the ranks' last word */
    if (r->mpi)
        mpi_run_end(r, code);
#endif
    runner_free(r);
    return code;
}

static int start_main(int argc, char **argv, int cmd)
{
    runner r = {0};
    r.o.cmd = cmd;
    r.o.distill_k = -1;
    r.argc = argc, r.argv = argv; /* after the command name: the manifest prepends it */
    if (run_parse_opts(argc, argv, &r.o, false)) {
        fprintf(stderr, cmd == 1 ? "usage: spill distill MODEL INPUT.jsonl [OPTIONS]   (spill distill --help lists every "
                                   "option)\n"
                                 : "usage: spill run MODEL INPUT.jsonl [OPTIONS]   (spill run --help lists every option)\n");
        return SPILL_EX_USAGE;
    }
    char dir[4096], id[JOB_ID_MAX], err[SPILL_ERRLEN];
    if (!r.o.out_dir) {
        if (job_new_id(id, sizeof id, err, sizeof err)) {
            fprintf(stderr, "spill: %s\n", err);
            return SPILL_EX_SOFTWARE;
        }
        snprintf(dir, sizeof dir, "%s/jobs/%s", util_spill_home(), id);
        r.o.out_dir = dir;
    }
    if (access(r.o.input, R_OK) != 0) {
        fprintf(stderr, "spill: %s: cannot read the input file: %s.\n", r.o.input, strerror(errno));
        return SPILL_EX_NOINPUT;
    }
    return run_job(&r, NULL);
}

int run_main(int argc, char **argv)
{
    return start_main(argc, argv, 0);
}

int distill_main(int argc, char **argv)
{
    return start_main(argc, argv, 1);
}

int resume_main(int argc, char **argv)
{
    runner r = {0};
    if (run_parse_opts(argc, argv, &r.o, true)) {
        fprintf(stderr, "usage: spill resume JOB_DIR|JOB_ID [OPTIONS]   (spill resume --help lists every option)\n");
        return SPILL_EX_USAGE;
    }
    char dir[4096], err[SPILL_ERRLEN];
    job_stored st;
    int rc = run_resume_opts(&r.o, dir, sizeof dir, &st, err, sizeof err);
    if (rc) {
        fprintf(stderr, "spill: %s\n", err);
        return rc == -2 ? SPILL_EX_DATAERR : SPILL_EX_NOINPUT;
    }
    if (st.done) { /* nothing to do: say so, successfully */
        printf("job %s is already complete: %llu rows answered, %llu failed; the output is in %s/results.jsonl%s.\n",
               dir, (unsigned long long)st.rows_completed, (unsigned long long)st.rows_failed, dir,
               st.rows_failed ? " (failures in errors.jsonl)" : "");
        job_stored_free(&st);
        return SPILL_EX_OK;
    }
    r.argc = argc, r.argv = argv;
    int code = run_job(&r, &st);
    job_stored_free(&st);
    return code;
}
