/*
 * run_answer.c — a row's tokens into its answer: each drawn token applied to its choice (end ids, stop strings
 * through the matcher, log-probs, limits), prompt scores and kept logits, tool calls parsed from the text, and a
 * finished row written through the job store (each n > 1 member, refusals).  Moved out of run.c, whose pass loop
 * calls run_accept_token and run_finish_row.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "run_internal.h"
#include "../base/util.h"

/* Makes room for n more bytes and the NUL in the choice's text, doubling from 256: once the text has reached
 * its size, a token costs no allocation.  0, or -1 when memory runs out. */
static int text_reserve(choice *c, size_t n)
{
    if (c->text_len + n + 1 <= c->text_cap)
        return 0;
    size_t cap = c->text_cap ? c->text_cap : 256;
    while (cap < c->text_len + n + 1)
        cap *= 2;
    char *t = realloc(c->text, cap);
    if (!t)
        return -1;
    c->text = t;
    c->text_cap = cap;
    return 0;
}

/* Pushes detokenized text through the stop matcher straight into the choice's text.
 * Returns 1 when a stop string matched, 0 to go on, -1 with a sentence. */
static int emit(choice *c, const char *t, size_t tl, char *err, size_t errlen)
{
    size_t cap = stop_out_cap(&c->sm, tl), ol;
    if (cap == SIZE_MAX || text_reserve(c, cap))
        return util_errf(err, errlen, "out of memory emitting text.");
    int m = stop_push(&c->sm, t, tl, c->text + c->text_len, cap, &ol, err, errlen);
    if (m >= 0) {
        c->text_len += ol;
        c->text[c->text_len] = 0;
    }
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
        if (cap == SIZE_MAX || text_reserve(c, cap))
            return util_errf(err, errlen, "out of memory emitting text.");
        if (stop_finish(&c->sm, c->text + c->text_len, cap, &ol, err, errlen))
            return -1;
        c->text_len += ol;
        c->text[c->text_len] = 0;
    }
    c->done = true;
    c->finish = m == 1 ? OUT_FINISH_STOP : why;
    return 0;
}

/* Applies one sampled token to a choice: end ids, log-probs, text, stop strings, limits. */
int run_accept_token(runner *r, row *w, choice *c, const sample_result *sr, char *err, size_t errlen)
{
    int32_t tok = sr->token;
    for (size_t i = 0; i < r->m->n_stop; i++)
        if (r->m->stop_ids[i] == tok)
            return finish_choice(c, OUT_FINISH_STOP, err, errlen);
    if (sample_observe(&c->ss, tok, err, errlen))
        return -1;
    if (c->gs) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(r->tok, tok, &bl);
        if (!b || gstate_feed_bytes(w->grammar, c->gs, b, bl))
            return util_errf(err, errlen, "row %s: internal error: token %d was drawn outside the row's grammar.",
                             w->custom_id, tok);
    }
    if (c->lp) {
        if (sched_lp_room(c, w->sp.n_top_logprobs, err, errlen))
            return -1;
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
    if (r->s.cfg.spec_k) { /* the proposer reads the row's tokens */
        if (sched_gen_room(c, err, errlen))
            return -1;
        c->gen[c->n_gen] = tok;
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
    for (int k = 0; m == 0 && k < w->tc.n_markers; k++) /* a call marker the detokenizer skips as special */
        if (w->tc.marker_ids[k] == tok)
            m = emit(c, w->tc.marker_text[k], strlen(w->tc.marker_text[k]), err, errlen);
    if (m < 0)
        return -1;
    if (m == 1) {
        c->done = true;
        c->finish = OUT_FINISH_STOP;
    } else if (c->gs && gstate_done(c->gs)) /* the JSON value is closed: nothing but an end token could follow */
        return finish_choice(c, OUT_FINISH_STOP, err, errlen);
    else if (c->n_gen >= w->max_new || c->fed + 1 >= r->m->ctx_len)
        return finish_choice(c, OUT_FINISH_LENGTH, err, errlen);
    return 0;
}

/* A scored prompt token (prompt index at) of row w: its log-prob and alternatives, and with --full-logits
 * (--score) its logits row. */
int run_record_score(runner *r, row *w, int32_t at, const sample_result *sr, const float *lg, char *err,
                     size_t errlen)
{
    int32_t n = w->n_prompt - w->score_from, i = at - w->score_from;
    size_t top = (size_t)(w->score_top > 0 ? w->score_top : 1);
    if (!w->plp) {
        w->plp = calloc((size_t)n, sizeof *w->plp);
        w->palts = calloc((size_t)n * top, sizeof *w->palts);
        if (!w->plp || !w->palts)
            return util_errf(err, errlen, "out of memory for the log-probs of row %s's %d prompt tokens.",
                             w->custom_id, n);
    }
    size_t bl;
    const uint8_t *b = tokenizer_token_bytes(r->tok, w->prompt[at], &bl);
    out_alt *alts = w->palts + (size_t)i * top;
    for (int k = 0; k < sr->n_top; k++) {
        size_t al;
        const uint8_t *ab = tokenizer_token_bytes(r->tok, sr->top_id[k], &al);
        alts[k] = (out_alt){(const char *)ab, ab ? al : 0, sr->top_logprob[k]};
    }
    w->plp[i] = (out_token){(const char *)b, b ? bl : 0, sr->logprob, (size_t)sr->n_top, alts};
    r->tokens_scored++;
    return w->full_logits ? run_keep_logits(r, w, i, lg, err, errlen) : 0;
}

/* --full-logits: logits row `index` of row w's answer into its .npy (opened on the first). */
int run_keep_logits(runner *r, row *w, int32_t index, const float *lg, char *err, size_t errlen)
{
    if (!w->lf) {
        char name[200];
        npy_safe_name(w->custom_id, name, sizeof name);
        w->lf = malloc(sizeof *w->lf);
        if (!w->lf)
            return util_errf(err, errlen, "out of memory opening row %s's logits file.", w->custom_id);
        if (npy_open(w->lf, r->logits_dir, name, r->m->vocab, err, errlen)) {
            free(w->lf);
            w->lf = NULL;
            return -1;
        }
    }
    if (index == 0) /* a row that starts again (preempted, recomputed) rewrites its file from the top */
        w->lf->n_rows = 0;
    return npy_write_row(w->lf, index, lg, err, errlen);
}

/* --score: the row's score line (custom_id, prompt and answer ids, log-probs, sum, mean). */
static int score_line(runner *r, const row *w, const out_stamp *stamp, char **line, size_t *len, char *err,
                      size_t errlen)
{
    int32_t na = w->n_prompt - w->score_from;
    if (na > 0 && !w->plp)
        return util_errf(err, errlen, "row %s: its answer was never scored.", w->custom_id);
    out_score sc = {w->custom_id, w->model, w->prompt, (size_t)w->score_from, w->prompt + w->score_from,
                    (size_t)na, w->plp, stamp};
    return output_score_line(&sc, line, len, err, errlen);
}

/* The tool calls of a row's choices (toolcall.h), owned while its answer line is built. */
typedef struct answer_calls {
    tc_parsed *parsed;    /* (n_choices) */
    out_tool_call **out;  /* (n_choices) each (parsed[c].n) */
    char (**ids)[TC_ID_LEN];
} answer_calls;

static void answer_calls_free(answer_calls *a, int n_choices)
{
    for (int c = 0; a->parsed && c < n_choices; c++) {
        toolcall_parsed_free(&a->parsed[c]);
        free(a->out[c]);
        free(a->ids[c]);
    }
    free(a->parsed), free(a->out), free(a->ids);
    memset(a, 0, sizeof *a);
}

/* Parses each choice's text by the row's call convention: a choice that holds calls gets them, the text
 * around them as its content and finish_reason "tool_calls" (a cut-short answer keeps "length"); any other
 * keeps its text and finish reason.  0, or -1 when memory runs out. */
static int run_tool_calls(row *w, out_choice *oc, answer_calls *a)
{
    size_t n = (size_t)w->n_choices;
    a->parsed = calloc(n, sizeof *a->parsed);
    a->out = calloc(n, sizeof *a->out);
    a->ids = calloc(n, sizeof *a->ids);
    if (!a->parsed || !a->out || !a->ids)
        return -1;
    for (size_t c = 0; c < n; c++) {
        tc_parsed *p = &a->parsed[c];
        int rc = toolcall_parse(w->tc.style, oc[c].text, oc[c].len, w->tc.tools, w->tc.parallel, p);
        if (rc <= 0) {
            if (rc < 0)
                return -1;
            continue;
        }
        a->out[c] = calloc(p->n, sizeof *a->out[c]);
        a->ids[c] = calloc(p->n, sizeof *a->ids[c]);
        if (!a->out[c] || !a->ids[c])
            return -1;
        for (size_t k = 0; k < p->n; k++) {
            toolcall_id(w->custom_id, (int)c, k, a->ids[c][k]);
            a->out[c][k] = (out_tool_call){a->ids[c][k], p->calls[k].name, p->calls[k].arguments};
        }
        oc[c].text = p->content ? p->content : "";
        oc[c].len = p->content_len;
        oc[c].n_tool_calls = p->n;
        oc[c].tool_calls = a->out[c];
        if (oc[c].finish == OUT_FINISH_STOP)
            oc[c].finish = OUT_FINISH_TOOL_CALLS;
    }
    return 0;
}

/* An answer the store refuses (or that cannot be built, err) fails its row alone: the next pass, and a resume,
 * must not meet it again.  0, or -1 when errors.jsonl cannot be written either. */
static int refuse_row(runner *r, const char *custom_id, char *err, size_t errlen)
{
    char msg[SPILL_ERRLEN + 64];
    snprintf(msg, sizeof msg, "spill could not write this row's answer: %s", err);
    return run_append_status_line(r, custom_id, 500, msg, NULL, "output_refused", err, errlen);
}

/* A member of a completions prompt list is done (line: its answer line, owned; NULL when it could not be built,
 * the reason in err): kept until the line's last member, which writes the joined line.  One failed member fails
 * the line (once, in errors.jsonl).  Retires the row. */
static int finish_member(runner *r, size_t ai, char *line, size_t len, char *err, size_t errlen)
{
    row *w = &r->rows[r->s.active[ai]];
    row *g = &r->rows[w->group_first];
    int rc = 0;
    if (!line && !g->group_failed) {
        g->group_failed = true;
        rc = refuse_row(r, g->custom_id, err, errlen);
    }
    w->gline = line, w->glen = len;
    if (--g->group_left == 0 && !g->group_failed) {
        size_t n = (size_t)g->group_n;
        char **lines = malloc(n * sizeof *lines), *joined = NULL;
        size_t *lens = malloc(n * sizeof *lens), jl = 0;
        int mrc = !lines || !lens ? util_errf(err, errlen, "out of memory joining the answers of row %s.",
                                              g->custom_id)
                                  : 0;
        for (size_t k = 0; !mrc && k < n; k++)
            lines[k] = r->rows[w->group_first + k].gline, lens[k] = r->rows[w->group_first + k].glen;
        if (!mrc)
            mrc = output_merge_lines(lines, lens, n, &joined, &jl, err, errlen);
        free(lines), free(lens);
        if (!mrc) {
            rc = job_append_result(r->j, joined, jl, err, errlen);
            free(joined);
            if (rc == -1) /* the write failed: the job is broken and stops */
                return -1;
        }
        if (mrc || rc) /* refused by the store, or not joined: the line fails, the job goes on */
            rc = refuse_row(r, g->custom_id, err, errlen);
        else
            r->rows_done++;
    }
    if (g->group_failed || g->group_left == 0)
        for (size_t k = 0; k < (size_t)g->group_n; k++) {
            row *m = &r->rows[w->group_first + k];
            if (m->state == ROW_DONE || m == w) {
                free(m->gline);
                m->gline = NULL;
            }
        }
    sched_retire_row(&r->s, ai);
    return rc;
}

/* Writes the finished row at s.active[ai] (its answer, or a 500 line when the store refuses it) and retires it. */
int run_finish_row(runner *r, size_t ai, char *err, size_t errlen)
{
    row *w = &r->rows[r->s.active[ai]];
    out_choice *oc = calloc(w->n_choices > 0 ? (size_t)w->n_choices : 1, sizeof *oc);
    /* echo with log-probs: every prompt token, the first without a log-prob */
    out_token *et = w->echo && w->sp.logprobs ? calloc((size_t)w->n_prompt, sizeof *et) : NULL;
    if (!oc || (w->echo && w->sp.logprobs && !et)) {
        free(oc);
        return util_errf(err, errlen, "out of memory writing row %s.", w->custom_id);
    }
    if (et) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(r->tok, w->prompt[0], &bl);
        et[0] = (out_token){(const char *)b, b ? bl : 0, 0, 0, NULL};
        for (int32_t i = 1; i < w->n_prompt; i++)
            et[i] = w->plp ? w->plp[i - 1] : (out_token){0};
    }
    uint64_t completion = 0;
    for (int c = 0; c < w->n_choices; c++) {
        choice *ch = &w->ch[c];
        calib_finish(&r->cal_run, ch->n_gen, (double)w->max_new);
        oc[c] = (out_choice){ch->text ? ch->text : "", ch->text_len, ch->finish, w->sp.logprobs,
                             (size_t)ch->n_gen, ch->lp, w->echo, w->echo_len, et ? (size_t)w->n_prompt : 0, et,
                             0, NULL};
        completion += (uint64_t)ch->n_gen;
    }
    answer_calls calls = {0};
    if (w->tc.tools && run_tool_calls(w, oc, &calls) < 0) {
        free(oc), free(et);
        return util_errf(err, errlen, "out of memory parsing the tool calls of row %s.", w->custom_id);
    }
    out_stamp stamp = r->stamp; /* the row's adapter's full hash, its latency and passes */
    stamp.adapter = run_adapter_hash(r, w->adapter);
    stamp.latency_s = w->t_admit > 0 ? run_now_s() - w->t_admit : 0;
    stamp.passes = w->passes;
    stamp.requested_model = w->requested;
    out_result res = {w->custom_id, w->model, r->sys_fp, (int64_t)time(NULL), (size_t)w->n_choices, oc,
                      (uint64_t)w->n_prompt, completion, &stamp, (uint64_t)w->cached};
    char *line;
    size_t len;
    int rc = 0;
    if (w->lf) { /* the logits file is durable before the row counts as done */
        rc = npy_finish(w->lf, w->lf->n_rows, err, errlen);
        free(w->lf);
        w->lf = NULL;
        if (rc) {
            free(oc), free(et);
            answer_calls_free(&calls, w->n_choices);
            return -1; /* the disk failed: the job stops, resumable */
        }
    }
    rc = r->o.score ? score_line(r, w, &stamp, &line, &len, err, errlen)
         : w->endpoint == REQ_EP_CHAT ? output_chat_line(&res, NULL, &line, &len, err, errlen)
                                      : output_completion_line(&res, NULL, &line, &len, err, errlen);
    free(oc);
    free(et);
    answer_calls_free(&calls, w->n_choices);
    if (w->group_n > 1)
        return finish_member(r, ai, rc == 0 ? line : NULL, len, err, errlen);
    if (rc == 0) {
        rc = job_append_result(r->j, line, len, err, errlen);
        free(line);
        if (rc == -1) /* the write failed: the job is broken and stops */
            return -1;
    }
    if (rc) {
        if (refuse_row(r, w->custom_id, err, errlen))
            return -1;
    } else
        r->rows_done++;
    sched_retire_row(&r->s, ai);
    return 0;
}

