/*
 * run_report.c — what `spill run` prints about a job: the progress line (drawn in place on a terminal, one line a
 * few seconds otherwise; rank 0's for the whole job under MPI), the pre-run line (what was opened, the plan, the
 * ETA) and the end summary (rows, tokens, tok/s, memory, the weights' I/O, speculation, grammar, prefix cache).
 * Moved out of run.c, which keeps the loop; these read the runner and print, nothing else.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_internal.h"
#include "mpi_run.h"
#include "../serve/progress.h"
#include "../base/util.h"

void run_fmt_count(uint64_t v, char *out, size_t cap)
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

void run_fmt_eta(double s, char *out, size_t cap)
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

void run_fmt_bytes(uint64_t b, char *out, size_t cap)
{
    if (b >= 1000000000ull)
        snprintf(out, cap, "%.2f GB", (double)b / 1e9);
    else if (b >= 100000000ull)
        snprintf(out, cap, "%.0f MB", (double)b / 1e6);
    else
        snprintf(out, cap, "%.1f MB", (double)b / 1e6);
}

void run_show_progress(runner *r, int pass, double pass_s, bool final)
{
    if ((r->o.quiet && !final) || r->rank > 0) /* several ranks: rank 0 shows the whole job */
        return;
    double el = run_now_s() - r->t_start;
    uint64_t finished = r->rows_done + r->rows_failed, generated = r->tokens_generated;
    size_t in_flight = r->s.n_active;
    /* the estimate replays the rest of the job: at most once a second, counted down in between */
    double eta;
    if (final || r->eta_at == 0 || el - r->eta_at >= 1.0) {
        calib fit = run_current_fit(r);
        r->eta_val = sched_estimate(&r->s, &fit);
        r->eta_at = el;
    }
    eta = r->eta_val < 0 ? r->eta_val : fmax(0, r->eta_val - (el - r->eta_at));
    char ranks[32] = "";
#ifdef SPILL_MPI
    if (r->mpi) { /* every rank's rows, tokens and batch; the ETA from the rows/s of this attempt */
        mpi_run_totals(r, el, &finished, &generated, &in_flight, &eta);
        snprintf(ranks, sizeof ranks, " · %d ranks", r->n_ranks);
    }
#endif
    char rows[32], total[32], tps[32], etas[32];
    run_fmt_count(finished, rows, sizeof rows);
    run_fmt_count(r->rows_total, total, sizeof total);
    run_fmt_count((uint64_t)(el > 0 ? (double)generated / el : 0), tps, sizeof tps);
    run_fmt_eta(final ? 0 : eta, etas, sizeof etas);
    double mem = (double)plan_rss_now() / 1e9, budget = (double)r->o.mem_budget / 1e9;
    char line[512];
    snprintf(line, sizeof line,
             "rows %s/%s%s · pass %d (%.2f s) · %s tok/s · ETA %s · %s · batch %zu · mem %.2f/%.2f GB", rows, total,
             ranks, pass, pass_s, tps, etas, r->quant_name, in_flight, mem, budget);
    if (r->s.cfg.spec_k) /* speculative passes: decode tokens kept per decode step so far */
        snprintf(line + strlen(line), sizeof line - strlen(line), " · %.2f tok/row/pass",
                 r->dec_steps ? (double)r->dec_tokens / (double)r->dec_steps : 1.0);
    if (r->s.preemptions)
        snprintf(line + strlen(line), sizeof line - strlen(line), " · %llu preempted",
                 (unsigned long long)r->s.preemptions);
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
        for (size_t i = 0; i < r->s.n_active && shown < TAIL_SLOTS; i++, shown++) {
            row *w = &r->rows[r->s.active[i]];
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

/* The memory plan and the pre-run line's memory clause. */
void run_fmt_memory(const runner *r, char *mem, size_t cap)
{
    char mb[32], bb[32], kb[32], wb[32];
    snprintf(wb, sizeof wb, "%.0f MB", (double)r->m->total_bytes / 1e6);
    run_fmt_bytes(r->mem.plan.total, mb, sizeof mb);
    run_fmt_bytes(r->o.mem_budget, bb, sizeof bb);
    run_fmt_bytes((uint64_t)r->s.kv->n_pages * r->mem.page_bytes, kb, sizeof kb);
    int kv_pages = r->s.kv->n_pages;
    if (r->mem.plan.gpu)
        snprintf(mem, cap, "KV %s in HBM (%d pages of %d tokens; the batch wants %d)", kb, kv_pages,
                 r->o.page_tokens, r->mem.plan.want_pages);
    else if (r->mem.plan.stream) {
        char rb[32];
        run_fmt_bytes(r->mem.ring, rb, sizeof rb);
        snprintf(mem, cap,
                 "memory plan %s of %s budget: weights %s streamed through a %s ring, KV %s (%d pages of %d tokens; "
                 "the batch wants %d)",
                 mb, bb, wb, rb, kb, kv_pages, r->o.page_tokens, r->mem.plan.want_pages);
    } else
        snprintf(mem, cap,
                 "memory plan %s of %s budget: weights %s resident, KV %s (%d pages of %d tokens; the batch wants %d)",
                 mb, bb, wb, kb, kv_pages, r->o.page_tokens, r->mem.plan.want_pages);
}

/* How the prompt tokens per pass are chosen, for the pre-run line (done false) and the end summary (done
 * true: the last budget and the carrying passes against the clean pass, as measured). */
void run_fmt_chunk(const runner *r, bool done, char *out, size_t cap)
{
    const chunk_ctl *c = &r->s.chunk;
    char n[32], l[32];
    run_fmt_count((uint64_t)c->cap, n, sizeof n);
    run_fmt_count((uint64_t)c->last, l, sizeof l);
    int k;
    if (c->adaptive)
        k = done ? snprintf(out, cap, "prompt tokens per pass: adaptive, %.3gx the clean pass (last %s, at most %s)",
                            c->ratio, l, n)
                 : snprintf(out, cap, "prompt tokens per pass: adaptive, %.3gx the clean pass (at most %s)", c->ratio,
                            n);
    else
        k = snprintf(out, cap, "prompt tokens per pass: %s (%s)", n,
                     !r->o.prefill_auto ? "--prefill-chunk" : "weights resident: nothing to hide prompt work behind");
    if (done && c->measured && k > 0 && (size_t)k < cap)
        snprintf(out + k, cap - (size_t)k,
                 "; %llu passes carried prompt tokens, %.2fx the clean pass (%.3f s) on average, %.2fx at most; "
                 "%llu probes",
                 (unsigned long long)c->measured, c->ratio_sum / (double)c->measured, c->clean_s, c->ratio_max,
                 (unsigned long long)c->probes);
}

/* The line printed once the job is ready, before the first pass. */
void run_print_ready(runner *r, bool resuming, double t_open, uint64_t already)
{
    if (r->rank > 0) /* several ranks: rank 0 speaks for the job */
        return;
    char pt[32], wb[32], eta0[32], mem[400];
    run_fmt_eta(r->eta_prerun, eta0, sizeof eta0);
    run_fmt_count(r->prompt_tokens, pt, sizeof pt);
    snprintf(wb, sizeof wb, "%.0f MB", (double)r->m->total_bytes / 1e6);
    run_fmt_memory(r, mem, sizeof mem);
    char bt[320];
    if (r->o.batch)
        snprintf(bt, sizeof bt, "batch %d (--batch)", r->o.batch);
    else {
        bool unbounded = false;
        for (size_t i = 0; i < r->n_rows && !unbounded; i++)
            unbounded = r->rows[i].state == ROW_PENDING && r->rows[i].expect_new &&
                        r->rows[i].expect_new < r->rows[i].max_new;
        int most = run_fit_rows(r, r->s.kv->n_pages, false);
        char up[64] = "";
        if (most > r->first_batch)
            snprintf(up, sizeof up, ", up to %d as shorter ones come", most);
        char ub[80] = "";
        if (unbounded)
            snprintf(ub, sizeof ub, "; rows without max_tokens planned at %d new tokens", RUN_EXPECT_NEW);
        snprintf(bt, sizeof bt, "batch %d from memory (the KV pages hold %d of these rows at their planned lengths%s%s)",
                 r->first_batch, r->first_batch, up, ub);
    }
    char px[96] = "";
    if (r->o.prefix_cache == 2)
        snprintf(px, sizeof px, " (prefix cache off)");
    else if (r->shared_expect) {
        char sx[32];
        run_fmt_count(r->shared_expect, sx, sizeof sx);
        snprintf(px, sizeof px, " (%s of them expected from the prefix cache)", sx);
    }
    char ck[200];
    run_fmt_chunk(r, false, ck, sizeof ck);
    snprintf(r->ready_line, sizeof r->ready_line,
             "spill %s: %s (%s, %s: %s, %s) · %llu rows (%llu done) · %s prompt tokens to prefill%s · %s · %s · "
             "engine %s · %s · ETA %s · job %s · ready in %.1f s",
             resuming ? "resume" : "run", r->o.model_spec, r->m->arch, r->quant_name, r->m->quant_summary, wb,
             (unsigned long long)r->rows_total, (unsigned long long)already, pt, px, bt, ck, r->be.name, mem, eta0,
             r->o.out_dir, run_now_s() - t_open);
    printf("%s\n", r->ready_line);
    fflush(stdout);
}

/* The summary after a job that ran to its end (el: seconds of passes). */
void run_print_done(runner *r, const char *dir, double el)
{
    if (r->rank > 0)
        return;
    if (r->eta_prerun > 0)
        printf("pre-run ETA %.1f s vs actual %.1f s (%+.0f%%)\n", r->eta_prerun, el, (r->eta_prerun - el) / el * 100);
    char pk[32], bb[32];
    run_fmt_bytes(plan_rss_peak(), pk, sizeof pk);
    run_fmt_bytes(r->o.mem_budget, bb, sizeof bb);
    if (r->mem.plan.gpu)
        printf("peak host memory %s (KV and pass buffers in HBM)\n", pk);
    else
        printf("peak memory %s of the %s budget (planned %.0f MB; %llu admission pauses by the live guard)\n", pk, bb,
               (double)r->mem.plan.total / 1e6, (unsigned long long)r->s.guard_pauses);
    if (r->be.io_line) {
        char io[512];
        r->be.io_line(r->be.impl, io, sizeof io);
        printf("weights: %s\n", io);
    }
    if (r->tm) {
        token_mask_stats ms;
        token_mask_get_stats(r->tm, &ms);
        printf("grammar: %zu schemas, %llu masks from the cache, %llu computed in %.2f s (%.1f ms each), %llu cache "
               "resets, masks %.0f MB at most\n",
               r->grams.n, (unsigned long long)ms.hits, (unsigned long long)ms.misses, ms.miss_s,
               ms.misses ? 1e3 * ms.miss_s / (double)ms.misses : 0.0, (unsigned long long)ms.resets,
               (double)token_mask_bytes(r->tm) / 1e6);
    }
    if (r->s.cfg.prefix) {
        int32_t ix, idle;
        uint64_t ev;
        kv_prefix_stats(r->s.kv, &ix, &idle, &ev);
        uint64_t cached = run_cached_tokens(r);
        printf("prefix cache: %llu prompt tokens mapped instead of computed (%.1f%% of %llu; %llu with the "
               "recomputes of preempted rows), %d KV pages saved at most, %d pages indexed at the end, %llu taken "
               "back, %llu passes a row waited for its prefix\n",
               (unsigned long long)cached, r->prompt_tokens ? 100.0 * (double)cached / (double)r->prompt_tokens : 0.0,
               (unsigned long long)r->prompt_tokens, (unsigned long long)r->s.prefix_tokens, r->s.pages_saved_peak,
               ix, (unsigned long long)ev, (unsigned long long)r->s.prefix_waits);
    }
    char how[300] = "lookup";
    if (r->dr.m)
        snprintf(how, sizeof how, "draft %s", r->o.draft_spec);
    if (r->s.cfg.spec_k)
        printf("speculation (%s, k <= %d): %.2f tokens per row per pass over %llu decode steps, %llu of %llu "
               "proposed tokens accepted (%.1f%%)\n",
               how, r->s.cfg.spec_k, r->dec_steps ? (double)r->dec_tokens / (double)r->dec_steps : 0.0,
               (unsigned long long)r->dec_steps, (unsigned long long)r->spec_accepted,
               (unsigned long long)r->s.spec_proposed,
               r->s.spec_proposed ? 100.0 * (double)r->spec_accepted / (double)r->s.spec_proposed : 0.0);
    if (r->s.cfg.spec_k && r->dec_steps) { /* the distribution behind the mean */
        char hist[600] = "";
        for (int n = 1; n <= r->s.cfg.spec_k + 1 && n < SPEC_K_MAX + 2; n++)
            if (r->spec_hist[n])
                snprintf(hist + strlen(hist), sizeof hist - strlen(hist), "%s%d: %.1f%%", hist[0] ? ", " : "", n,
                         100.0 * (double)r->spec_hist[n] / (double)r->dec_steps);
        printf("tokens kept per row per pass: %s\n", hist);
    }
    if (r->dr.m)
        printf("draft model: %llu forwards in %.1f s, %llu tokens proposed\n", (unsigned long long)r->dr.forwards,
               r->dr.secs, (unsigned long long)r->dr.proposed);
    char ck[400];
    run_fmt_chunk(r, true, ck, sizeof ck);
    printf("%s\n", ck);
    bool scored = r->tokens_generated == 0 && r->tokens_scored > 0; /* --score, echo with max_tokens 0 */
    uint64_t toks = scored ? r->tokens_scored : r->tokens_generated;
    printf("done: %llu rows answered, %llu failed, %llu tokens %s in %.1f s (%.1f tok/s), %llu preemptions · "
           "%s/results.jsonl%s\n",
           (unsigned long long)r->rows_done, (unsigned long long)r->rows_failed, (unsigned long long)toks,
           scored ? "scored" : "generated", el, el > 0 ? (double)toks / el : 0,
           (unsigned long long)r->s.preemptions, dir, r->rows_failed ? " (failures in errors.jsonl)" : "");
}
