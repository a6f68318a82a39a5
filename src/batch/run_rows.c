/*
 * run_rows.c — the runner's input: JSONL request lines into rows (parsed by
 * request.c, rendered through the chat template, tokenized, their sampling
 * parameters checked; /v1/embeddings rows go to run_embed.c's phase).  A bad line becomes one error line in errors.jsonl
 * and loses nothing else; rows a resumed job already answered are skipped.
 * Unique custom_ids are check.c's rule and its hash set (check_ids).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "run_internal.h"
#include "../base/util.h"
#include "../text/prompt.h"

int run_append_error_line(runner *r, const char *custom_id, const char *message, const char *param,
                          const char *code, char *err, size_t errlen)
{
    return run_append_status_line(r, custom_id, 400, message, param, code, err, errlen);
}

int run_append_status_line(runner *r, const char *custom_id, int status, const char *message, const char *param,
                           const char *code, char *err, size_t errlen)
{
    out_http_error he = {custom_id, status, message, status >= 500 ? "server_error" : "invalid_request_error",
                         param, code, &r->stamp};
    char *line;
    size_t len;
    if (output_http_error_line(&he, NULL, &line, &len, err, errlen))
        return -1;
    int rc = job_append_error(r->j, line, len, err, errlen);
    free(line);
    if (rc == 0)
        r->rows_failed++;
    return rc;
}

/* Renders and tokenizes one request into prompt ids through the shared prompt path (text/prompt.h, what
 * `spill template` and `spill tokenize` show).  Returns 0, or 1 with a per-row message in msg (the row
 * fails, the job goes on). */
/* spill distill --score: the prompt is the conversation before its final assistant message (with the
 * generation prompt), the answer what the template renders after it, through the first end-of-turn id.  The
 * row's ids are prompt + answer, scored from the answer's first token.  0, or 1 with a per-row message. */
static int build_scored(runner *r, request *q, row *w, char *msg, size_t msglen)
{
    char err[SPILL_ERRLEN];
    prompt_src ps = {r->m, r->tok, r->tmpl};
    size_t nm = q->messages ? json_array_size(q->messages) : 0;
    json_t *last = nm ? json_array_get(q->messages, nm - 1) : NULL;
    const char *role = last ? json_string_value(json_object_get(last, "role")) : NULL;
    if (q->endpoint != REQ_EP_CHAT || !role || strcmp(role, "assistant") || nm < 2) {
        snprintf(msg, msglen, "--score scores the final assistant message of a chat row; this row %s (for a "
                              "completions prompt, use echo with max_tokens 0).",
                 q->endpoint != REQ_EP_CHAT ? "is a completions request" : "does not end with an assistant message "
                                                                           "after at least one other message");
        return 1;
    }
    if (!r->tmpl) {
        snprintf(msg, msglen, "The model %s has no chat template, so a conversation cannot be scored.",
                 r->o.model_spec);
        return 1;
    }
    json_t *head = json_array();
    for (size_t i = 0; head && i + 1 < nm; i++)
        if (json_array_append(head, json_array_get(q->messages, i)))
            json_decref(head), head = NULL;
    if (!head)
        return snprintf(msg, msglen, "Out of memory."), -1;
    int32_t *pids = NULL, *fids = NULL;
    size_t np = 0, nf = 0;
    int rc = prompt_chat(&ps, head, q->tools, true, 0, NULL, NULL, &pids, &np, err, sizeof err);
    json_decref(head);
    if (rc == 0)
        rc = prompt_chat(&ps, q->messages, q->tools, false, 0, NULL, NULL, &fids, &nf, err, sizeof err);
    if (rc) {
        snprintf(msg, msglen, "The chat template rejected this conversation: %.400s", err);
        free(pids), free(fids);
        return 1;
    }
    bool prefix = nf > np && memcmp(fids, pids, np * sizeof *pids) == 0;
    if (!prefix) {
        snprintf(msg, msglen, "The chat template renders this conversation so that its prompt (%zu tokens) is not "
                              "a prefix of the whole (%zu tokens), so its final answer cannot be scored alone.",
                 np, nf);
        free(pids), free(fids);
        return 1;
    }
    size_t end = nf; /* through the first end-of-turn id after the prompt */
    for (size_t i = np; i < nf && end == nf; i++)
        for (size_t k = 0; k < r->m->n_stop; k++)
            if (fids[i] == r->m->stop_ids[k])
                end = i + 1;
    free(pids);
    if ((int64_t)end > r->m->ctx_len) {
        snprintf(msg, msglen, "The conversation is %zu tokens, but this model's context is %d tokens; shorten it.",
                 end, r->m->ctx_len);
        free(fids);
        return 1;
    }
    w->prompt = fids;
    w->n_prompt = (int32_t)end;
    w->score_from = (int32_t)np;
    w->score_top = r->o.distill_k > 0 ? r->o.distill_k : 0;
    w->max_new = 0;
    return 0;
}

/* A fine-tuning line's final assistant turn is its reference answer, not part of the prompt: the messages
 * before it (a new reference); the messages themselves for every other row.  NULL when out of memory. */
static json_t *prompt_messages(const request *q)
{
    size_t nm = json_array_size(q->messages);
    json_t *last = json_array_get(q->messages, nm - 1);
    bool ft = q->kind == REQ_KIND_FINETUNE || q->kind == REQ_KIND_EVAL_FINETUNE;
    if (!ft || nm < 2 || strcmp(json_string_value(json_object_get(last, "role")) ?: "", "assistant"))
        return json_incref(q->messages);
    json_t *head = json_array();
    for (size_t i = 0; head && i + 1 < nm; i++)
        if (json_array_append(head, json_array_get(q->messages, i)))
            json_decref(head), head = NULL;
    return head;
}

/* The row's function calling: the tools its tool_choice shows the template (into *rendered, a new reference
 * or NULL) and, when the template teaches a convention spill parses, the row's call state; a `required` or
 * named choice becomes the row's grammar (the convention's prefix, the call's JSON, its suffix), replacing a
 * response_format.  0; 1 with a per-row message when a tool's parameters cannot be enforced; -1 when out of
 * memory. */
static int tool_state(runner *r, const request *q, row *w, json_t **rendered, char *msg, size_t msglen)
{
    bool oom;
    *rendered = toolcall_rendered_tools(q->tools, q->tool_choice, q->tool_choice_name, &oom);
    if (oom)
        return -1;
    tc_style st = toolcall_style(r->m->chat_template);
    if (!*rendered || st == TC_STYLE_NONE)
        return 0;
    w->tc.style = st;
    w->tc.tools = json_incref(*rendered);
    w->tc.parallel = q->parallel_tool_calls;
    const char *const *mk = toolcall_markers(st);
    for (int i = 0; mk[i] && w->tc.n_markers < TC_MAX_MARKERS; i++) {
        int32_t id = tokenizer_token_id(r->tok, mk[i], strlen(mk[i]));
        if (id >= 0 && tokenizer_is_special(r->tok, id)) {
            w->tc.marker_ids[w->tc.n_markers] = id;
            w->tc.marker_text[w->tc.n_markers++] = mk[i];
        }
    }
    if (q->tool_choice != TC_CHOICE_REQUIRED && q->tool_choice != TC_CHOICE_NAMED)
        return 0;
    grammar_wrap gw = {NULL, NULL, mk};
    json_t *schema = toolcall_forced_schema(st, *rendered, q->tool_choice, q->parallel_tool_calls, &gw.prefix,
                                            &gw.suffix);
    if (!schema)
        return -1;
    char err[SPILL_ERRLEN];
    int rc = grammar_set_get_wrapped(&r->grams, schema, &gw, "body.tool_choice", &w->grammar, err, sizeof err);
    json_decref(schema);
    if (rc == 0)
        return 0;
    /* name the tool whose parameters the grammar refused, by its own path */
    size_t i;
    json_t *t;
    json_array_foreach(q->tools, i, t)
    {
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        json_t *params = json_object_get(json_object_get(t, "function"), "parameters");
        grammar *g = NULL;
        char path[64];
        snprintf(path, sizeof path, "body.tools[%zu].function.parameters", i);
        if (params && (q->tool_choice == TC_CHOICE_REQUIRED || !strcmp(name ?: "", q->tool_choice_name ?: "")) &&
            grammar_compile(params, path, &g, NULL, 0, err, sizeof err))
            break;
        grammar_free(g);
    }
    snprintf(msg, msglen, "tool_choice forces a call, which spill enforces by constrained decoding, but %.400s", err);
    return 1;
}

/* prompt: a completions row's prompt (the request's, or one element of its prompt list). */
static int build_prompt(runner *r, request *q, json_t *prompt, row *w, char *msg, size_t msglen, const char **code)
{
    char err[SPILL_ERRLEN];
    size_t n = 0;
    prompt_src ps = {r->m, r->tok, r->tmpl};
    *code = "invalid_request";
    if (r->o.score)
        return build_scored(r, q, w, msg, msglen);
    if (q->endpoint == REQ_EP_CHAT) {
        if (!r->tmpl) {
            snprintf(msg, msglen, "The model %s has no chat template; send this row to /v1/completions instead.",
                     r->o.model_spec);
            return 1;
        }
        json_t *tools = NULL, *msgs = prompt_messages(q);
        int trc = msgs ? tool_state(r, q, w, &tools, msg, msglen) : -1;
        if (trc) {
            json_decref(msgs);
            json_decref(tools);
            return trc < 0 ? (snprintf(msg, msglen, "Out of memory."), -1) : 1;
        }
        int rc = prompt_chat(&ps, msgs, tools, true, 0, NULL, NULL, &w->prompt, &n, err, sizeof err);
        json_decref(msgs);
        json_decref(tools);
        if (rc == PROMPT_ERR_TEMPLATE) {
            snprintf(msg, msglen, "The chat template rejected this conversation: %.400s", err);
            return 1;
        }
        if (rc) {
            snprintf(msg, msglen, "%s", err);
            return 1;
        }
    } else {
        if (prompt_completion(&ps, prompt, &w->prompt, &n, err, sizeof err)) {
            snprintf(msg, msglen, "%s", err);
            return 1;
        }
    }
    if (n == 0) {
        snprintf(msg, msglen, "The prompt is empty after templating; give a non-empty prompt.");
        return 1;
    }
    if ((int64_t)n >= r->m->ctx_len) {
        *code = "context_length_exceeded";
        snprintf(msg, msglen,
                 "The prompt is %zu tokens, but this model's context is %d tokens; shorten it to leave room for the "
                 "answer.",
                 n, r->m->ctx_len);
        return 1;
    }
    w->n_prompt = (int32_t)n;
    int64_t room = r->m->ctx_len - (int64_t)n;
    w->max_new = q->s.max_tokens < 0 || q->s.max_tokens > room ? room : q->s.max_tokens;
    w->expect_new = q->s.max_tokens >= 0 || w->max_new < RUN_EXPECT_NEW ? w->max_new : RUN_EXPECT_NEW;
    if (q->endpoint == REQ_EP_COMPLETIONS && q->s.echo) {
        /* echo: the prompt's text goes before the answer; with logprobs, every prompt token after the first
         * gets its log-prob from the prefill (the first has none) */
        json_t *p = json_is_array(prompt) && json_array_size(prompt) == 1 ? json_array_get(prompt, 0) : prompt;
        if (json_is_string(p))
            w->echo = strndup(json_string_value(p), json_string_length(p)), w->echo_len = json_string_length(p);
        else if (tokenizer_decode(r->tok, w->prompt, n, false, &w->echo, &w->echo_len, err, sizeof err))
            return snprintf(msg, msglen, "%s", err), 1;
        if (!w->echo)
            return snprintf(msg, msglen, "Out of memory."), -1;
        if (w->sp.logprobs)
            w->score_from = 1, w->score_top = w->sp.n_top_logprobs;
    }
    return 0;
}

/* Copies what the runner needs out of a parsed request (which is then freed). */
static int take_request(runner *r, request *q, row *w, char *msg, size_t msglen)
{
    int arc = run_adapter_for_row(r, q->model, &w->adapter, msg, msglen);
    if (arc)
        return arc;
    /* body.model in the answer names the model that ran, as the command line gave it (or the BASE+ADAPTER the
     * row picked); the request's own name is kept in the stamp */
    if (w->adapter == r->default_adapter)
        w->model = strdup(r->o.model_spec);
    else if (w->adapter == 0)
        w->model = strdup(r->base_spec);
    else if (strchr(q->model, '+'))
        w->model = strdup(q->model);
    else {
        size_t n = strlen(r->base_spec) + strlen(q->model) + 2;
        if ((w->model = malloc(n)))
            snprintf(w->model, n, "%s+%s", r->base_spec, q->model);
    }
    if (!w->model)
        return snprintf(msg, msglen, "Out of memory."), -1;
    if (q->model && strcmp(q->model, w->model)) {
        if (!(w->requested = strdup(q->model)))
            return snprintf(msg, msglen, "Out of memory."), -1;
        if (r->n_renamed++ == 0)
            snprintf(r->renamed_example, sizeof r->renamed_example, "%s", q->model);
        else if (strcmp(r->renamed_example, q->model))
            r->renamed_many = true;
    }
    w->endpoint = q->endpoint;
    w->n_choices = q->s.n;
    w->has_seed = q->s.has_seed;
    w->seed = q->s.seed;
    w->n_stop = q->s.n_stop;
    for (int i = 0; i < q->s.n_stop; i++) {
        w->stop[i] = strndup(q->s.stop[i], q->s.stop_len[i]);
        w->stop_len[i] = q->s.stop_len[i];
        if (!w->stop[i])
            return snprintf(msg, msglen, "Out of memory."), -1;
    }
    w->bias_id = q->s.logit_bias_id;
    w->bias = q->s.logit_bias;
    q->s.logit_bias_id = NULL;
    q->s.logit_bias = NULL;
    w->sp = (sample_params){
        .temperature = (float)q->s.temperature,
        .top_p = (float)q->s.top_p,
        .top_k = q->s.top_k,
        .min_p = (float)q->s.min_p,
        .repetition_penalty = (float)q->s.repetition_penalty,
        .frequency_penalty = (float)q->s.frequency_penalty,
        .presence_penalty = (float)q->s.presence_penalty,
        .n_logit_bias = q->s.n_logit_bias,
        .logit_bias_id = w->bias_id,
        .logit_bias = w->bias,
        .logprobs = q->s.logprobs,
        .n_top_logprobs = q->s.logprobs ? q->s.top_logprobs : 0,
    };
    if (r->o.cmd == 1) { /* distill: every answer token carries its log-prob and K alternatives (--logprobs K,
                          * else the row's own top_logprobs) */
        w->sp.logprobs = true;
        if (r->o.distill_k >= 0)
            w->sp.n_top_logprobs = r->o.distill_k;
    }
    w->full_logits = r->o.full_logits;
    if (w->full_logits && w->n_choices > 1) {
        snprintf(msg, msglen, "--full-logits writes one logits file per row, but this row asks for n = %d choices; "
                              "set n to 1.", w->n_choices);
        return 1;
    }
    q->s.n_logit_bias = 0;
    char err[SPILL_ERRLEN];
    if (q->json_out && grammar_set_get(&r->grams, q->json_schema, "response_format", &w->grammar, err, sizeof err)) {
        snprintf(msg, msglen, "%s", err);
        return 1;
    }
    if (sample_params_check(&w->sp, r->m->vocab, err, sizeof err)) {
        snprintf(msg, msglen, "%s", err);
        return 1;
    }
    return 0;
}

/* Counts the rows of the input (non-blank lines) so the job knows its total before it starts. */
int run_count_rows(const char *path, uint64_t *n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return util_errf(err, errlen, "%s: cannot open: %s.", path, strerror(errno));
    jsonl_reader rd;
    int rc = jsonl_open(&rd, f, path, 0, err, errlen);
    const char *line;
    size_t len;
    *n = 0;
    while (rc == 0) {
        jsonl_status st = jsonl_next(&rd, &line, &len, err, errlen);
        if (st == JSONL_EOF)
            break;
        if (st == JSONL_IO_ERROR)
            rc = -1;
        else if (st == JSONL_TOO_LONG || len > 0)
            (*n)++;
    }
    jsonl_close(&rd);
    fclose(f);
    return rc;
}

/* A zeroed row at r->rows[r->n_rows] (not counted yet), the array grown when full; NULL when memory runs out. */
static row *grow_rows(runner *r, size_t *cap)
{
    if (r->n_rows == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        row *nr = realloc(r->rows, nc * sizeof *nr);
        if (!nr)
            return NULL;
        r->rows = nr;
        *cap = nc;
    }
    row *w = &r->rows[r->n_rows];
    memset(w, 0, sizeof *w);
    return w;
}

/* Reads the whole input: parses, templates and tokenizes every row not done yet;
 * bad rows go to errors.jsonl at once. */
int run_load_rows(runner *r, char *err, size_t errlen)
{
    FILE *f = fopen(r->o.input, "rb");
    if (!f)
        return util_errf(err, errlen, "%s: cannot open: %s.", r->o.input, strerror(errno));
    jsonl_reader rd;
    if (jsonl_open(&rd, f, r->o.input, 0, err, errlen)) {
        fclose(f);
        return -1;
    }
    int rc = 0;
    size_t cap = 0;
    check_ids ids = {0};
    const char *line;
    size_t len;
    for (;;) {
        jsonl_status st = jsonl_next(&rd, &line, &len, err, errlen);
        if (st == JSONL_EOF)
            break;
        if (st == JSONL_IO_ERROR) {
            rc = -1;
            break;
        }
        if (st == JSONL_LINE && len == 0)
            continue; /* blank lines carry no row */
        row *w = grow_rows(r, &cap);
        if (!w) {
            rc = util_errf(err, errlen, "out of memory reading %s.", r->o.input);
            break;
        }
        w->line = rd.lineno;
        char msg[SPILL_ERRLEN], cid[64], pbuf[sizeof ((request *)0)->err_param];
        const char *code = "invalid_request", *param = NULL;
        request q = {0};
        int bad = 0;
        if (st == JSONL_TOO_LONG) {
            snprintf(msg, sizeof msg, "%s line %zu: the line is longer than %u bytes; split the request.", r->o.input,
                     rd.lineno, REQ_MAX_LINE_BYTES);
            bad = 1;
        } else if (request_parse_line(line, len, rd.lineno, r->o.input, &q, msg, sizeof msg)) {
            code = q.err_code ? q.err_code : "invalid_request";
            /* copied: request_free(&q) below zeroes the request before the error line is written */
            snprintf(pbuf, sizeof pbuf, "%s", q.err_param);
            param = pbuf[0] ? pbuf : NULL;
            bad = 1;
        }
        snprintf(cid, sizeof cid, "line-%zu", rd.lineno);
        const char *id = q.custom_id ? q.custom_id : cid;
        /* A custom_id seen before cannot own a second line: name the duplicate by its line.  Every row's id
         * (its custom_id, or line-N) goes into the set: a later line may repeat it. */
        long long prev = check_ids_add(&ids, id, rd.lineno);
        if (prev > 0 && !bad) {
            snprintf(msg, sizeof msg, "%s line %zu: custom_id '%s' was already used on line %lld; custom_ids must be unique.",
                     r->o.input, rd.lineno, id, prev);
            code = "duplicate_custom_id";
            id = cid;
            bad = 1;
            prev = check_ids_add(&ids, id, rd.lineno);
        }
        if (prev < 0) {
            request_free(&q);
            rc = util_errf(err, errlen, "out of memory reading %s.", r->o.input);
            break;
        }
        w->custom_id = strdup(id);
        r->n_rows++;
        r->rows_total++;
        if (job_is_done(r->j, w->custom_id)) {
            w->state = ROW_DONE;
            request_free(&q);
            continue;
        }
        if (!bad && q.endpoint == REQ_EP_EMBEDDINGS) { /* the embedding phase's (run_embed.c), not the scheduler's */
            bad = take_request(r, &q, w, msg, sizeof msg);
            if (!bad)
                bad = run_embed_add(r, r->n_rows - 1, &q, msg, sizeof msg, &code);
            request_free(&q);
            w->state = ROW_DONE;
            if (bad < 0) {
                rc = util_errf(err, errlen, "%s", msg);
                break;
            }
            if (bad && r->rank == 0 && run_append_error_line(r, w->custom_id, msg, NULL, code, err, errlen)) {
                rc = -1;
                break;
            }
            continue;
        }
        /* A completions prompt list becomes one row per prompt (the line's members, answered as one line with
         * choices k*n .. k*n+n-1 from member k); the first member holds the line's custom_id and state. */
        size_t first = r->n_rows - 1, members = !bad && q.endpoint == REQ_EP_COMPLETIONS && q.n_prompts > 1
                                                    ? q.n_prompts : 1;
        json_t *plist = members > 1 ? q.prompt : NULL;
        if (members > 1 && r->o.full_logits) {
            snprintf(msg, sizeof msg, "--full-logits writes one logits file per row, but this row's prompt is a list of "
                                      "%zu prompts; give one prompt per row.", members);
            bad = 1;
        }
        for (size_t k = 0; !bad && k < members; k++) {
            if (k > 0) { /* the next member: the line parsed again (take_request moves what it keeps out of q) */
                if (!(w = grow_rows(r, &cap))) {
                    bad = -1, snprintf(msg, sizeof msg, "out of memory reading %s.", r->o.input);
                    break;
                }
                request_free(&q);
                if (request_parse_line(line, len, rd.lineno, r->o.input, &q, msg, sizeof msg) ||
                    !(w->custom_id = strdup(r->rows[first].custom_id))) {
                    bad = -1, snprintf(msg, sizeof msg, "out of memory reading %s.", r->o.input);
                    break;
                }
                w->line = rd.lineno;
                r->n_rows++;
                plist = q.prompt;
            }
            bad = take_request(r, &q, w, msg, sizeof msg);
            if (!bad)
                bad = build_prompt(r, &q, plist ? json_array_get(plist, k) : q.prompt, w, msg, sizeof msg, &code);
            if (!bad) { /* repetition_penalty counts the prompt's tokens too (vLLM) */
                w->sp.prompt = w->prompt;
                w->sp.n_prompt = (size_t)w->n_prompt;
            }
            if (!bad && members > 1) {
                w->choice_base = (int)k * w->n_choices;
                w->group_n = (int)members;
                w->group_first = first;
            }
            if (bad > 0 && members > 1) { /* name the prompt of the list that failed */
                char m2[sizeof msg];
                snprintf(m2, sizeof m2, "body.prompt[%zu]: %.470s", k, msg);
                memcpy(msg, m2, sizeof msg);
            }
        }
        request_free(&q);
        if (members > 1 && bad) { /* one prompt of the list fails the line: its members go, the first stays */
            for (size_t i = first + 1; i < r->n_rows; i++)
                sched_row_free(&r->rows[i]);
            r->n_rows = first + 1;
            w = &r->rows[first];
            w->group_n = 0;
        }
        if (bad < 0) {
            rc = util_errf(err, errlen, "%s", msg);
            break;
        }
        if (bad) {
            w->state = ROW_DONE;
            /* several ranks: every rank reads every line, rank 0 alone writes the bad ones' error lines */
            if (r->rank == 0 && run_append_error_line(r, w->custom_id, msg, param, code, err, errlen)) {
                rc = -1;
                break;
            }
            continue;
        }
        r->rows[first].group_left = (int)members;
        for (size_t i = first; i < r->n_rows; i++) {
            r->rows[i].state = ROW_PENDING;
            r->prompt_tokens += (uint64_t)r->rows[i].n_prompt;
        }
    }
    check_ids_free(&ids);
    jsonl_close(&rd);
    fclose(f);
    return rc;
}
