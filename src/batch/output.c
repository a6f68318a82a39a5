/*
 * output.c — builds the lines of results.jsonl and errors.jsonl (see
 * output.h for the shapes; formats.md §1.2, §1.6 for OpenAI's).
 *
 * Owns: the exact JSON of every output line, the ids in it, turning raw token
 * bytes into JSON strings.  Does not: write files (job.c), decide whether a
 * row failed (the runner), detokenize (tokenizer.c).
 *
 * Decisions:
 *  - spill's stamp is a top-level "spill" key of the line, next to "error",
 *    not a key inside the body: it then sits in the same place in success,
 *    HTTP-error and non-HTTP-error lines (the last have no body), and the body
 *    stays a pure chat.completion / text_completion that a strict schema
 *    validator accepts.  Readers of BatchRequestOutput (openai-python users,
 *    vLLM's pydantic models) ignore unknown top-level keys.
 *  - Token strings: a token's bytes that are valid UTF-8 are the string; a
 *    token that is not (a byte-fallback piece of a multi-byte character) is
 *    written as "bytes:" followed by \xNN for each byte — the form OpenAI's API
 *    uses — and the exact bytes are in "bytes".  Generated text is decoded
 *    with each invalid sequence (maximal subpart) replaced by U+FFFD, exactly
 *    as Python's bytes.decode(errors="replace") does.
 *  - Logprobs are float32 in the engine; each is written as the shortest
 *    decimal that reads back to the same float32 (-0.01, not
 *    -0.0099999997764825821), by rounding through that decimal and dumping
 *    with 9 significant digits, which round-trips every float32.  -inf (the
 *    token is outside the candidates) becomes OpenAI's sentinel -9999.0; NaN
 *    or +inf is a caller error.
 *  - Legacy /v1/completions logprobs: "text_offset" counts Unicode code points
 *    (Python len() of the decoded text, as vLLM computes it) from the start of
 *    the choice's text; "top_logprobs" is one {token: logprob} object per
 *    position, keeping the first (best) candidate when two decode to the same
 *    string.
 *  - Ids: prefix + 24 characters of [A-Za-z0-9], rejection-sampled from
 *    random bytes so every character is uniform (143 bits).
 */
#include "output.h"
#include "../base/util.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define ID_CHARS 24

static const char *const finish_names[] = {"stop", "length", "tool_calls", "content_filter"};

/* ------------------------------------------------------------------ ids */

static int fill_random(const out_ids *ids, void *buf, size_t n)
{
    if (ids && ids->fill)
        return ids->fill(ids->ctx, buf, n);
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int output_new_id(const out_ids *ids, const char *prefix, char *out, size_t cap, char *err, size_t errlen)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t plen = strlen(prefix), need;
    if (!ck_add_size(plen, ID_CHARS + 1, &need) || need > cap)
        return util_errf(err, errlen, "id buffer of %zu bytes cannot hold \"%s\" and %d characters.", cap, prefix,
                         ID_CHARS);
    memcpy(out, prefix, plen);
    size_t n = 0;
    while (n < ID_CHARS) {
        unsigned char rnd[32];
        errno = 0;
        if (fill_random(ids, rnd, sizeof rnd) != 0)
            return util_errf(err, errlen, "cannot read random bytes for an output id: %s.",
                             errno ? strerror(errno) : "the id source failed");
        for (size_t i = 0; i < sizeof rnd && n < ID_CHARS; i++)
            if (rnd[i] < 248) /* 248 = 4 * 62: keeping only these makes rnd % 62 uniform */
                out[plen + n++] = alphabet[rnd[i] % 62];
    }
    out[plen + n] = 0;
    return 0;
}

/* ------------------------------------------------------------------ strings */

/* Length of the well-formed UTF-8 sequence at s (n bytes available), 0 if none. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t k = s[0] >= 0xC0 && s[0] <= 0xDF   ? 2
               : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
               : s[0] >= 0xF0 && s[0] <= 0xF7 ? 4
                                              : 0;
    return k && k <= n && util_utf8_valid((const char *)s, k) ? k : 0;
}

/*
 * Bytes an invalid sequence at s covers: the lead byte plus the continuation
 * bytes that could still have completed it ("maximal subpart", Unicode
 * §3.9 / WHATWG), so one U+FFFD replaces them as Python's
 * decode(errors="replace") does.
 */
static size_t utf8_bad_span(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the first continuation byte */
    if (c >= 0xC2 && c <= 0xDF)
        k = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        k = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        k = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 1;
    size_t i = 1;
    while (i <= k && i < n && s[i] >= (i == 1 ? lo : 0x80) && s[i] <= (i == 1 ? hi : 0xBF))
        i++;
    return i;
}

/* Generated text as a JSON string; invalid sequences become U+FFFD. */
static json_t *json_text(const char *s, size_t n)
{
    if (!s)
        return json_string("");
    if (util_utf8_valid(s, n))
        return json_stringn(s, n);
    size_t cap;
    if (!ck_mul_size(n, 3, &cap)) /* each replaced byte grows to 3 bytes at most */
        return NULL;
    char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (k) {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += utf8_bad_span(u + i, n - i);
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

/* A token's string: the bytes when valid UTF-8, else "bytes:\xNN\xNN…". */
static json_t *json_token(const char *s, size_t n)
{
    if (!s) /* a token that decodes to nothing (check_result refused NULL with n > 0) */
        s = "";
    if (util_utf8_valid(s, n))
        return json_stringn(s, n);
    size_t cap;
    if (!ck_mul_size(n, 4, &cap) || !ck_add_size(cap, 7, &cap))
        return NULL;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    size_t o = (size_t)snprintf(buf, cap, "bytes:");
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", (unsigned char)s[i]);
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

static json_t *json_bytes(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((unsigned char)s[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Shortest decimal that reads back as the same float32 (see the header comment). */
static json_t *json_logprob(float f)
{
    if (isinf(f) && f < 0)
        return json_real(-9999.0);
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f)
            break;
    }
    return json_real(strtod(buf, NULL));
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static size_t code_points(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* ------------------------------------------------------------------ checks */

static int check_lp(float f, const char *where, size_t ci, size_t ti, char *err, size_t errlen)
{
    if (isnan(f) || (isinf(f) && f > 0))
        return util_errf(err, errlen, "output: choice %zu, token %zu: %s is %s; logprobs must be finite or -inf.", ci,
                         ti, where, isnan(f) ? "NaN" : "+inf");
    return 0;
}

static bool str_ok(const char *s)
{
    return s && util_utf8_valid(s, strlen(s));
}

static int check_result(const out_result *r, bool chat, char *err, size_t errlen)
{
    if (!r->custom_id || !util_utf8_valid(r->custom_id, strlen(r->custom_id)))
        return util_errf(err, errlen, "output: custom_id is missing or not valid UTF-8.");
    if (!r->model || !util_utf8_valid(r->model, strlen(r->model)))
        return util_errf(err, errlen, "output: row \"%.80s\": model name is missing or not valid UTF-8.", r->custom_id);
    if (r->n_choices == 0 || !r->choices)
        return util_errf(err, errlen, "output: row \"%.80s\" has no choices.", r->custom_id);
    for (size_t c = 0; c < r->n_choices; c++) {
        const out_choice *ch = &r->choices[c];
        if ((unsigned)ch->finish > OUT_FINISH_CONTENT_FILTER || (!chat && ch->finish == OUT_FINISH_TOOL_CALLS))
            return util_errf(err, errlen, "output: row \"%.80s\", choice %zu: finish reason %d is not valid for %s.",
                             r->custom_id, c, (int)ch->finish, chat ? "chat completions" : "completions");
        if (ch->n_tool_calls && (!chat || !ch->tool_calls))
            return util_errf(err, errlen, "output: row \"%.80s\", choice %zu: tool calls need a chat answer and "
                             "a call array.", r->custom_id, c);
        for (size_t t = 0; t < ch->n_tool_calls; t++) {
            const out_tool_call *tc = &ch->tool_calls[t];
            if (!str_ok(tc->id) || !str_ok(tc->name) || !str_ok(tc->arguments))
                return util_errf(err, errlen, "output: row \"%.80s\", choice %zu, tool call %zu: id, name and "
                                 "arguments must be UTF-8 strings.", r->custom_id, c, t);
        }
        if (!ch->logprobs)
            continue;
        if (ch->n_tokens && !ch->tokens)
            return util_errf(err, errlen, "output: row \"%.80s\", choice %zu: %zu tokens but no token array.",
                             r->custom_id, c, ch->n_tokens);
        for (size_t t = 0; t < ch->n_tokens; t++) {
            const out_token *tk = &ch->tokens[t];
            bool null_bytes = (!tk->bytes && tk->len) || (tk->n_top && !tk->top);
            for (size_t a = 0; !null_bytes && a < tk->n_top; a++)
                null_bytes = !tk->top[a].bytes && tk->top[a].len;
            if (null_bytes)
                return util_errf(err, errlen, "output: row \"%.80s\", choice %zu, token %zu: NULL bytes with a length.",
                                 r->custom_id, c, t);
            if (check_lp(tk->logprob, "logprob", c, t, err, errlen) != 0)
                return -1;
            for (size_t a = 0; a < tk->n_top; a++)
                if (check_lp(tk->top[a].logprob, "a top_logprobs entry", c, t, err, errlen) != 0)
                    return -1;
        }
        for (size_t t = 1; ch->echo && t < ch->n_echo; t++) { /* the first echo token's log-prob is null */
            const out_token *tk = &ch->echo_tokens[t];
            if (check_lp(tk->logprob, "an echoed prompt token's logprob", c, t, err, errlen) != 0)
                return -1;
            for (size_t a = 0; a < tk->n_top; a++)
                if (check_lp(tk->top[a].logprob, "an echoed prompt token's top_logprobs entry", c, t, err, errlen))
                    return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ lines */

static json_t *stamp_json(const out_stamp *s)
{
    json_t *o = json_object();
    if (o && (json_object_set_new(o, "run_id", str_or_null(s->run_id)) ||
              json_object_set_new(o, "model_fingerprint", str_or_null(s->model_fingerprint)) ||
              json_object_set_new(o, "quant", str_or_null(s->quant)) ||
              json_object_set_new(o, "adapter", str_or_null(s->adapter)) ||
              (s->passes > 0 && json_object_set_new(o, "latency_s", json_real(round(s->latency_s * 1e4) / 1e4))) ||
              (s->passes > 0 && json_object_set_new(o, "passes", json_integer(s->passes))) ||
              (s->requested_model && json_object_set_new(o, "requested_model", json_string(s->requested_model))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/*
 * json_dumps, minus a jansson 2.14 bug: when growing its output buffer fails
 * while writing an object key, json_dumps drops the key and still succeeds
 * (dump.c ignores dump_string's result for keys), so an out-of-memory moment
 * could put a malformed line in results.jsonl.  json_dumpb into a buffer of
 * the measured size never grows a buffer; its other allocation (the loop
 * check) reports failure properly.
 */
static char *dump_line(const json_t *o)
{
    const size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(9);
    size_t n = json_dumpb(o, NULL, 0, flags);
    char *buf = n ? malloc(n + 1) : NULL;
    if (!buf)
        return NULL;
    if (json_dumpb(o, buf, n, flags) != n) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/* The three ids of one success or HTTP-error line, drawn in this order. */
typedef struct line_ids {
    char line[64];    /* batch_req_… */
    char request[64]; /* req_… */
    char body[64];    /* chatcmpl-… / cmpl-… */
} line_ids;

static int draw_ids(const out_ids *ids, const char *body_prefix, line_ids *out, char *err, size_t errlen)
{
    if (output_new_id(ids, "batch_req_", out->line, sizeof out->line, err, errlen) != 0)
        return -1;
    if (!body_prefix)
        return 0;
    if (output_new_id(ids, "req_", out->request, sizeof out->request, err, errlen) != 0)
        return -1;
    if (*body_prefix && output_new_id(ids, body_prefix, out->body, sizeof out->body, err, errlen) != 0)
        return -1;
    return 0;
}

/*
 * Assembles {"id","custom_id","response","error"[,"spill"]} and dumps it.
 * Steals response and error (either may be json_null()); NULL means an
 * allocation failed upstream and gives the out-of-memory sentence.
 */
static int finish_line(const char *line_id, const char *custom_id, json_t *response, json_t *error,
                       const out_stamp *stamp, char **line, size_t *len, char *err, size_t errlen)
{
    json_t *o = json_object();
    int bad = !o || !response || !error;
    bad |= json_object_set_new(o, "id", json_string(line_id));
    bad |= json_object_set_new(o, "custom_id", json_string(custom_id));
    bad |= json_object_set(o, "response", response);
    bad |= json_object_set(o, "error", error);
    if (stamp)
        bad |= json_object_set_new(o, "spill", stamp_json(stamp));
    char *text = bad ? NULL : dump_line(o);
    json_decref(o);
    json_decref(response);
    json_decref(error);
    if (!text)
        return util_errf(err, errlen, "output: out of memory building the line of row \"%.80s\".", custom_id);
    *line = text;
    *len = strlen(text);
    return 0;
}

/* {"status_code","request_id","body"}; steals body; NULL when out of memory. */
static json_t *response_json(int status, const char *request_id, json_t *body)
{
    json_t *o = json_object();
    if (!o || !body || json_object_set_new(o, "status_code", json_integer(status)) ||
        json_object_set_new(o, "request_id", json_string(request_id))) {
        json_decref(o);
        json_decref(body);
        return NULL;
    }
    if (json_object_set_new(o, "body", body)) { /* consumes body, also on failure */
        json_decref(o);
        return NULL;
    }
    return o;
}

/* [{token, logprob, bytes}, …] */
static json_t *alts_json(const out_alt *alts, size_t n)
{
    json_t *top = json_array();
    int bad = !top;
    for (size_t a = 0; !bad && a < n; a++) {
        json_t *alt = json_object();
        bad |= !alt;
        bad |= json_object_set_new(alt, "token", json_token(alts[a].bytes, alts[a].len));
        bad |= json_object_set_new(alt, "logprob", json_logprob(alts[a].logprob));
        bad |= json_object_set_new(alt, "bytes", json_bytes(alts[a].bytes, alts[a].len));
        bad |= json_array_append_new(top, alt);
    }
    if (bad) {
        json_decref(top);
        return NULL;
    }
    return top;
}

static json_t *chat_logprobs(const out_choice *ch)
{
    json_t *content = json_array(), *o = json_object();
    int bad = !content || !o;
    for (size_t t = 0; !bad && t < ch->n_tokens; t++) {
        const out_token *tk = &ch->tokens[t];
        json_t *e = json_object(), *top = alts_json(tk->top, tk->n_top < OUT_OPENAI_MAX_TOP ? tk->n_top
                                                                                            : OUT_OPENAI_MAX_TOP);
        bad |= !e || !top;
        bad |= json_object_set_new(e, "token", json_token(tk->bytes, tk->len));
        bad |= json_object_set_new(e, "logprob", json_logprob(tk->logprob));
        bad |= json_object_set_new(e, "bytes", json_bytes(tk->bytes, tk->len));
        bad |= json_object_set_new(e, "top_logprobs", top);
        if (!bad && tk->n_top > OUT_OPENAI_MAX_TOP)
            bad |= json_object_set_new(e, "more_top_logprobs",
                                       alts_json(tk->top + OUT_OPENAI_MAX_TOP, tk->n_top - OUT_OPENAI_MAX_TOP));
        bad |= json_array_append_new(content, e);
    }
    bad |= json_object_set_new(o, "content", content);
    bad |= json_object_set_new(o, "refusal", json_null());
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *completion_logprobs(const out_choice *ch)
{
    json_t *o = json_object(), *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int bad = !o || !tokens || !lps || !tops || !offs;
    size_t offset = 0;
    /* echo: the prompt's tokens first (the first has no log-prob and no alternatives), then the answer's */
    size_t ne = ch->echo ? ch->n_echo : 0;
    for (size_t t = 0; !bad && t < ne + ch->n_tokens; t++) {
        const out_token *tk = t < ne ? &ch->echo_tokens[t] : &ch->tokens[t - ne];
        if (t == 0 && ne) {
            bad |= json_array_append_new(tokens, json_token(tk->bytes, tk->len));
            bad |= json_array_append_new(lps, json_null());
            bad |= json_array_append_new(tops, json_null());
            bad |= json_array_append_new(offs, json_integer(0));
            offset += code_points(tk->bytes, tk->len);
            continue;
        }
        json_t *top = json_object();
        bad |= !top;
        for (size_t a = 0; !bad && a < tk->n_top; a++) {
            json_t *key = json_token(tk->top[a].bytes, tk->top[a].len);
            bad |= !key;
            if (!bad && !json_object_getn(top, json_string_value(key), json_string_length(key)))
                bad |= json_object_setn_new(top, json_string_value(key), json_string_length(key),
                                            json_logprob(tk->top[a].logprob));
            json_decref(key);
        }
        bad |= json_array_append_new(tokens, json_token(tk->bytes, tk->len));
        bad |= json_array_append_new(lps, json_logprob(tk->logprob));
        bad |= json_array_append_new(tops, top);
        bad |= json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += code_points(tk->bytes, tk->len);
    }
    bad |= json_object_set_new(o, "tokens", tokens);
    bad |= json_object_set_new(o, "token_logprobs", lps);
    bad |= json_object_set_new(o, "top_logprobs", tops);
    bad |= json_object_set_new(o, "text_offset", offs);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* message.tool_calls: [{"id","type":"function","function":{"name","arguments"}}]. */
static json_t *tool_calls_json(const out_choice *ch)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < ch->n_tool_calls; i++) {
        const out_tool_call *t = &ch->tool_calls[i];
        if (json_array_append_new(a, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", t->id, "type", "function",
                                               "function", "name", t->name, "arguments", t->arguments))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* The chat.completion or text_completion body. */
static json_t *body_json(const out_result *r, bool chat, const char *id)
{
    json_t *b = json_object(), *choices = json_array(), *usage = json_object();
    int bad = !b || !choices || !usage;
    bad |= json_object_set_new(b, "id", json_string(id));
    bad |= json_object_set_new(b, "object", json_string(chat ? "chat.completion" : "text_completion"));
    bad |= json_object_set_new(b, "created", json_integer((json_int_t)r->created));
    bad |= json_object_set_new(b, "model", json_string(r->model));
    bad |= json_object_set_new(b, "system_fingerprint", str_or_null(r->system_fingerprint));
    for (size_t c = 0; !bad && c < r->n_choices; c++) {
        const out_choice *ch = &r->choices[c];
        json_t *co = json_object();
        json_t *lp = !ch->logprobs ? json_null() : chat ? chat_logprobs(ch) : completion_logprobs(ch);
        bad |= !co;
        if (chat) {
            json_t *msg = json_object();
            bad |= !msg;
            bad |= json_object_set_new(msg, "role", json_string("assistant"));
            bad |= json_object_set_new(msg, "content",
                                       ch->n_tool_calls && !ch->len ? json_null() : json_text(ch->text, ch->len));
            bad |= json_object_set_new(msg, "refusal", json_null());
            if (ch->n_tool_calls)
                bad |= json_object_set_new(msg, "tool_calls", tool_calls_json(ch));
            bad |= json_object_set_new(co, "index", json_integer((json_int_t)c));
            bad |= json_object_set_new(co, "message", msg);
        } else {
            if (ch->echo) { /* echo: the prompt's text, then the answer's */
                char *t = malloc(ch->echo_len + ch->len + 1);
                bad |= !t;
                if (t) {
                    memcpy(t, ch->echo, ch->echo_len);
                    memcpy(t + ch->echo_len, ch->text, ch->len);
                    bad |= json_object_set_new(co, "text", json_text(t, ch->echo_len + ch->len));
                    free(t);
                }
            } else
                bad |= json_object_set_new(co, "text", json_text(ch->text, ch->len));
            bad |= json_object_set_new(co, "index", json_integer((json_int_t)c));
        }
        bad |= json_object_set_new(co, "logprobs", lp);
        bad |= json_object_set_new(co, "finish_reason", json_string(finish_names[ch->finish]));
        bad |= json_array_append_new(choices, co);
    }
    bad |= json_object_set_new(b, "choices", choices);
    bad |= json_object_set_new(usage, "prompt_tokens", json_integer((json_int_t)r->prompt_tokens));
    bad |= json_object_set_new(usage, "completion_tokens", json_integer((json_int_t)r->completion_tokens));
    bad |=
        json_object_set_new(usage, "total_tokens", json_integer((json_int_t)(r->prompt_tokens + r->completion_tokens)));
    bad |= json_object_set_new(usage, "prompt_tokens_details",
                               json_pack("{s:I}", "cached_tokens", (json_int_t)r->cached_tokens));
    bad |= json_object_set_new(b, "usage", usage);
    if (bad) {
        json_decref(b);
        return NULL;
    }
    return b;
}

static int success_line(const out_result *r, bool chat, const out_ids *ids, char **line, size_t *len, char *err,
                        size_t errlen)
{
    *line = NULL;
    *len = 0;
    line_ids id;
    if (check_result(r, chat, err, errlen) != 0 || draw_ids(ids, chat ? "chatcmpl-" : "cmpl-", &id, err, errlen) != 0)
        return -1;
    json_t *resp = response_json(200, id.request, body_json(r, chat, id.body));
    return finish_line(id.line, r->custom_id, resp, json_null(), r->stamp, line, len, err, errlen);
}

int output_chat_line(const out_result *r, const out_ids *ids, char **line, size_t *len, char *err, size_t errlen)
{
    return success_line(r, true, ids, line, len, err, errlen);
}

int output_completion_line(const out_result *r, const out_ids *ids, char **line, size_t *len, char *err, size_t errlen)
{
    return success_line(r, false, ids, line, len, err, errlen);
}

static int add_int(json_t *dst, json_t *src, const char *key)
{
    json_t *a = json_object_get(dst, key), *b = json_object_get(src, key);
    if (!json_is_integer(a) || !json_is_integer(b))
        return -1;
    return json_integer_set(a, json_integer_value(a) + json_integer_value(b));
}

static int max_num(json_t *dst, json_t *src, const char *key)
{
    json_t *a = json_object_get(dst, key), *b = json_object_get(src, key);
    if (!b)
        return 0;
    if (!a || json_number_value(b) > json_number_value(a))
        return json_object_set(dst, key, b);
    return 0;
}

int output_merge_lines(char *const *lines, const size_t *lens, size_t n, char **line, size_t *len, char *err,
                       size_t errlen)
{
    *line = NULL;
    json_t *m = NULL, *choices = NULL, *usage = NULL;
    int bad = n == 0;
    for (size_t k = 0; !bad && k < n; k++) {
        json_t *o = json_loadb(lines[k], lens[k], JSON_ALLOW_NUL, NULL);
        json_t *body = json_object_get(json_object_get(o, "response"), "body");
        json_t *ch = json_object_get(body, "choices"), *us = json_object_get(body, "usage");
        bad |= !json_is_array(ch) || !json_is_object(us);
        if (bad) {
            json_decref(o);
            break;
        }
        if (k == 0) {
            m = o, choices = ch, usage = us;
            continue;
        }
        size_t i;
        json_t *c;
        json_array_foreach(ch, i, c) bad |= json_array_append(choices, c);
        bad |= add_int(usage, us, "prompt_tokens") || add_int(usage, us, "completion_tokens") ||
               add_int(usage, us, "total_tokens");
        json_t *pd = json_object_get(usage, "prompt_tokens_details"), *od = json_object_get(us, "prompt_tokens_details");
        if (!bad && json_is_object(pd) && json_is_object(od))
            bad |= add_int(pd, od, "cached_tokens");
        json_t *st = json_object_get(m, "spill"), *so = json_object_get(o, "spill");
        if (!bad && json_is_object(st) && json_is_object(so))
            bad |= max_num(st, so, "latency_s") || max_num(st, so, "passes");
        if (o != m)
            json_decref(o);
    }
    size_t i;
    json_t *c;
    json_array_foreach(choices, i, c) bad |= json_object_set_new(c, "index", json_integer((json_int_t)i));
    char *text = bad ? NULL : dump_line(m);
    json_decref(m);
    if (!text)
        return util_errf(err, errlen, "output: the answers of a prompt list could not be joined into one line.");
    *line = text;
    *len = strlen(text);
    return 0;
}

static bool opt_ok(const char *s)
{
    return !s || util_utf8_valid(s, strlen(s));
}

/* RFC 4648 base64 of n bytes into out (4 * ceil(n / 3) characters and a NUL). */
static void base64_encode(const uint8_t *b, size_t n, char *out)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        out[o++] = A[v >> 18 & 63];
        out[o++] = A[v >> 12 & 63];
        out[o++] = i + 1 < n ? A[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? A[v & 63] : '=';
    }
    out[o] = 0;
}

/* One embedding as OpenAI sends it: a float list, or base64 of the little-endian float32 bytes (what the
 * openai client decodes with numpy.frombuffer(…, dtype="float32")). */
static json_t *embedding_json(const float *v, size_t dim, bool b64)
{
    if (!b64) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < dim; i++)
            if (json_array_append_new(a, json_real(v[i]))) {
                json_decref(a);
                return NULL;
            }
        return a;
    }
    uint8_t *bytes = malloc(dim * 4 + 1);
    char *text = malloc((dim * 4 + 2) / 3 * 4 + 1);
    json_t *s = NULL;
    if (bytes && text) {
        for (size_t i = 0; i < dim; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++) /* little-endian whatever the host */
                bytes[i * 4 + (size_t)k] = (uint8_t)(u >> (8 * k));
        }
        base64_encode(bytes, dim * 4, text);
        s = json_string(text);
    }
    free(bytes);
    free(text);
    return s;
}

int output_embedding_line(const out_embedding *e, const out_ids *ids, char **line, size_t *len, char *err,
                          size_t errlen)
{
    *line = NULL;
    *len = 0;
    if (!str_ok(e->custom_id) || !str_ok(e->model))
        return util_errf(err, errlen, "output: an embedding row needs a custom_id and a model.");
    for (size_t i = 0; i < e->n * e->dim; i++)
        if (!isfinite(e->vecs[i]))
            return util_errf(err, errlen, "output: row \"%.80s\": input %zu's embedding holds a NaN or infinite value.",
                             e->custom_id, i / e->dim);
    line_ids id;
    if (draw_ids(ids, "", &id, err, errlen) != 0)
        return -1;
    json_t *data = json_array(), *body = json_object();
    int bad = !data || !body;
    for (size_t i = 0; !bad && i < e->n; i++) {
        json_t *o = json_object();
        bad |= !o || json_object_set_new(o, "object", json_string("embedding")) ||
               json_object_set_new(o, "index", json_integer((json_int_t)i)) ||
               json_object_set_new(o, "embedding", embedding_json(e->vecs + i * e->dim, e->dim, e->base64));
        bad |= json_array_append_new(data, o);
    }
    json_t *usage = json_object();
    bad |= !usage || json_object_set_new(usage, "prompt_tokens", json_integer((json_int_t)e->prompt_tokens)) ||
           json_object_set_new(usage, "total_tokens", json_integer((json_int_t)e->prompt_tokens));
    bad |= !body || json_object_set_new(body, "object", json_string("list")) || json_object_set(body, "data", data) ||
           json_object_set_new(body, "model", json_string(e->model)) || json_object_set(body, "usage", usage);
    json_decref(data);
    json_decref(usage);
    if (bad) {
        json_decref(body);
        return util_errf(err, errlen, "output: out of memory building the line of row \"%.80s\".", e->custom_id);
    }
    json_t *resp = response_json(200, id.request, body);
    return finish_line(id.line, e->custom_id, resp, json_null(), e->stamp, line, len, err, errlen);
}

int output_score_line(const out_score *s, char **line, size_t *len, char *err, size_t errlen)
{
    if (!s->custom_id || !util_utf8_valid(s->custom_id, strlen(s->custom_id)) || !s->model ||
        !util_utf8_valid(s->model, strlen(s->model)))
        return util_errf(err, errlen, "output: a score row's custom_id or model is missing or not valid UTF-8.");
    json_t *o = json_object(), *sc = json_object(), *pids = json_array(), *aids = json_array(),
           *toks = json_array(), *lps = json_array(), *tops = json_array();
    int bad = !o || !sc || !pids || !aids || !toks || !lps || !tops;
    bool any_top = false;
    double sum = 0;
    for (size_t i = 0; !bad && i < s->n_prompt; i++)
        bad |= json_array_append_new(pids, json_integer(s->prompt_ids[i]));
    for (size_t i = 0; !bad && i < s->n_answer; i++) {
        const out_token *tk = &s->answer[i];
        if (check_lp(tk->logprob, "logprob", 0, i, err, errlen)) {
            bad = 2;
            break;
        }
        sum += tk->logprob;
        any_top |= tk->n_top > 0;
        bad |= json_array_append_new(aids, json_integer(s->answer_ids[i]));
        bad |= json_array_append_new(toks, json_text(tk->bytes, tk->len));
        bad |= json_array_append_new(lps, json_logprob(tk->logprob));
        bad |= json_array_append_new(tops, alts_json(tk->top, tk->n_top));
    }
    if (!bad) {
        bad |= json_object_set_new(sc, "prompt_ids", pids);
        bad |= json_object_set_new(sc, "answer_ids", aids);
        bad |= json_object_set_new(sc, "answer_tokens", toks);
        bad |= json_object_set_new(sc, "logprobs", lps);
        bad |= json_object_set_new(sc, "sum", json_real(sum));
        bad |= json_object_set_new(sc, "mean", s->n_answer ? json_real(sum / (double)s->n_answer) : json_null());
        pids = aids = toks = lps = NULL;
        if (any_top)
            bad |= json_object_set_new(sc, "top_logprobs", tops);
        else
            json_decref(tops);
        tops = NULL;
        bad |= json_object_set_new(o, "custom_id", json_string(s->custom_id));
        bad |= json_object_set_new(o, "model", json_string(s->model));
        bad |= json_object_set_new(o, "score", sc);
        sc = NULL;
        if (s->stamp)
            bad |= json_object_set_new(o, "spill", stamp_json(s->stamp));
    }
    json_decref(pids), json_decref(aids), json_decref(toks), json_decref(lps), json_decref(tops), json_decref(sc);
    char *d = bad ? NULL : dump_line(o);
    json_decref(o);
    if (bad == 2)
        return -1;
    if (!d)
        return util_errf(err, errlen, "output: out of memory building the score of row %.80s.", s->custom_id);
    *line = d;
    *len = strlen(d);
    return 0;
}

int output_http_error_line(const out_http_error *e, const out_ids *ids, char **line, size_t *len, char *err,
                           size_t errlen)
{
    *line = NULL;
    *len = 0;
    if (!str_ok(e->custom_id))
        return util_errf(err, errlen, "output: custom_id is missing or not valid UTF-8.");
    if (e->status_code < 400 || e->status_code > 599 || !str_ok(e->message) || !opt_ok(e->type) || !opt_ok(e->param) ||
        !opt_ok(e->code))
        return util_errf(err, errlen,
                         "output: row \"%.80s\": an HTTP error line needs a status in 400..599 and a UTF-8 message "
                         "(got status %d).",
                         e->custom_id, e->status_code);
    line_ids id;
    if (draw_ids(ids, "", &id, err, errlen) != 0)
        return -1;
    json_t *inner = json_object(), *body = json_object();
    int bad = !inner || !body;
    bad |= json_object_set_new(inner, "message", json_string(e->message));
    bad |= json_object_set_new(inner, "type", json_string(e->type ? e->type : "invalid_request_error"));
    bad |= json_object_set_new(inner, "param", str_or_null(e->param && *e->param ? e->param : NULL)); /* "" = none */
    bad |= json_object_set_new(inner, "code", str_or_null(e->code));
    bad |= json_object_set_new(body, "error", inner);
    if (bad) {
        json_decref(body);
        body = NULL;
    }
    json_t *resp = response_json(e->status_code, id.request, body);
    return finish_line(id.line, e->custom_id, resp, json_null(), e->stamp, line, len, err, errlen);
}

int output_error_line(const char *custom_id, const char *code, const char *message, const out_stamp *stamp,
                      const out_ids *ids, char **line, size_t *len, char *err, size_t errlen)
{
    *line = NULL;
    *len = 0;
    if (!str_ok(custom_id) || !str_ok(code) || !str_ok(message))
        return util_errf(err, errlen,
                         "output: an error line needs a UTF-8 custom_id, code and message (row \"%.80s\").",
                         custom_id ? custom_id : "(null)");
    line_ids id;
    if (draw_ids(ids, NULL, &id, err, errlen) != 0)
        return -1;
    json_t *e = json_object();
    if (e && (json_object_set_new(e, "code", json_string(code)) ||
              json_object_set_new(e, "message", json_string(message)))) {
        json_decref(e);
        e = NULL;
    }
    return finish_line(id.line, custom_id, json_null(), e, stamp, line, len, err, errlen);
}
