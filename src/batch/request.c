/*
 * request.c — input rows: the streaming JSONL line reader and the one-line
 * parser/validator behind `spill check`, `spill run` and the gateway.
 *
 * Owns: splitting a byte stream into lines, and every rule that can be judged
 * from one line alone.  Does not own: rules that need other lines (duplicate
 * custom_id, one url / model / line format per file, row count) — check.c —
 * and nothing here knows a tokenizer or a model (token ids in prompts and
 * logit_bias are range-checked against int32 only; the job checks them
 * against the vocabulary).
 *
 * Byte layout read (one line):
 *   file  := line* ; line := bytes up to '\n' (or EOF), with one trailing '\r'
 *            dropped (CRLF files).  Lines are numbered from 1.
 *   A line of only spaces/tabs (or nothing) is SKIPPED, not an error: vLLM's
 *   run_batch skips them too, and editors leave them at the end of files; they
 *   still count for line numbers.  Decision recorded in check.h.
 *   Every other line: ≤ 16 MiB, valid UTF-8 (no overlongs, no surrogates), one
 *   JSON object (jansson json_loadb, duplicate keys rejected, \u0000 rejected,
 *   nothing after the object).  A UTF-8 byte-order mark is rejected with its
 *   own sentence rather than silently skipped: OpenAI's parser rejects it too.
 *
 * Line formats (the key set decides):
 *   batch       {"custom_id":S, "method":"POST", "url":U, "body":{…}} (+ "expected" = eval)
 *   fine-tuning {"messages":[…], "tools"?, "parallel_tool_calls"?, "functions"?, "custom_id"?} (+ "expected")
 *   A line with any of body/url/method is a batch line; else one with messages
 *   is a fine-tuning line; else one with custom_id is a (broken) batch line.
 *
 * Body rules follow OpenAI's CreateChatCompletionRequest / CreateCompletionRequest / CreateEmbeddingRequest
 * (formats.md §1.5; embeddings: input with the completions prompt's four shapes, ≤ 2,048 inputs, no empty
 * string, encoding_format, dimensions, user).  Unknown fields are rejected, as OpenAI does ("Unrecognized
 * request argument").  Fields that change nothing in a batch run are accepted
 * and ignored (user, metadata, store, service_tier, stream:false, …); fields
 * spill cannot honour are rejected with a sentence saying so rather than
 * silently ignored: stream:true, non-function tools, image/audio/file content parts, audio output, predicted outputs,
 * suffix, best_of > 1.  A null value means "use the default" everywhere.
 * response_format json_object / json_schema (and vLLM's guided_json) are honoured by constrained decoding:
 * the schema is compiled here to judge it (grammar.h), and a keyword the grammar cannot enforce fails the
 * row with a sentence naming it and its path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "request.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "grammar.h"

#define JSONL_CHUNK (64u << 10)

/* ---- error sentences --------------------------------------------------------------------------------- */

typedef struct pctx {
    const char *file;
    size_t line;
    request *out;
    char *err;
    size_t errlen;
    const char *pre; /* "body" for batch lines, "" for fine-tuning lines */
} pctx;

/* Records code/param/level in the request and writes "FILE line N: <fmt>" into err.  Returns -1. */
__attribute__((format(printf, 5, 6))) static int fail(pctx *c, bool file_level, const char *code, const char *param,
                                                      const char *fmt, ...)
{
    c->out->err_code = code;
    c->out->err_file_level = file_level;
    snprintf(c->out->err_param, sizeof c->out->err_param, "%s", param ? param : "");
    if (c->err && c->errlen) {
        int n = snprintf(c->err, c->errlen, "%s line %zu: ", c->file, c->line);
        if (n >= 0 && (size_t)n < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

/* A value as a sentence shows it: scalars as compact JSON cut to ~60 bytes, composites by kind. */
typedef struct shown {
    char s[80];
} shown;

static size_t utf8_cut(const char *s, size_t n)
{
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--;
    return n;
}

static shown show(const json_t *v)
{
    shown r;
    if (json_is_object(v)) {
        snprintf(r.s, sizeof r.s, "an object");
        return r;
    }
    if (json_is_array(v)) {
        snprintf(r.s, sizeof r.s, json_array_size(v) ? "an array" : "an empty array");
        return r;
    }
    char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!d) {
        snprintf(r.s, sizeof r.s, "a value");
        return r;
    }
    size_t n = strlen(d);
    if (n > 60) {
        n = utf8_cut(d, 56);
        snprintf(r.s, sizeof r.s, "%.*s\xE2\x80\xA6%s", (int)n, d, json_is_string(v) ? "\"" : "");
    } else {
        snprintf(r.s, sizeof r.s, "%s", d);
    }
    free(d);
    return r;
}

/* A JSON path built as "<pre>.<key>", "<pre>[i]"; control bytes in keys become '?' so sentences stay on one line. */
typedef struct jpath {
    char s[160];
} jpath;

static jpath pkey(const char *pre, const char *key)
{
    jpath p;
    int n = snprintf(p.s, sizeof p.s, "%s%s%s", pre, *pre ? "." : "", key);
    size_t end = n < 0 ? 0 : ((size_t)n < sizeof p.s ? (size_t)n : sizeof p.s - 1);
    for (size_t i = 0; i < end; i++)
        if ((unsigned char)p.s[i] < 0x20 || p.s[i] == 0x7f)
            p.s[i] = '?';
    if ((size_t)n >= sizeof p.s)
        p.s[utf8_cut(p.s, sizeof p.s - 1)] = 0;
    return p;
}

static jpath pidx(const char *pre, size_t i)
{
    jpath p;
    int n = snprintf(p.s, sizeof p.s, "%s[%zu]", pre, i);
    if (n < 0 || (size_t)n >= sizeof p.s) /* a path this deep is cut, never overrun */
        p.s[utf8_cut(p.s, sizeof p.s - 1)] = 0;
    return p;
}

/* ---- typed field readers ----------------------------------------------------------------------------- */

/* Reads an optional number in [lo, hi]; absent or null leaves *out.  Row-level errors. */
static int opt_num(pctx *c, const json_t *obj, const char *pre, const char *key, double lo, double hi, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 0;
    jpath p = pkey(pre, key);
    if (!json_is_number(v))
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be a number between %g and %g.", p.s,
                    show(v).s, lo, hi);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be between %g and %g.", p.s, show(v).s, lo,
                    hi);
    *out = x;
    return 0;
}

/*
 * Reads an optional whole number in [lo, hi]; absent or null leaves *out and
 * *present.  A real with an integral value (100.0) is accepted, as OpenAI's
 * request layer does.  `range` words the bound for the sentence.
 */
static int opt_int(pctx *c, const json_t *obj, const char *pre, const char *key, int64_t lo, int64_t hi,
                   const char *range, int64_t *out, bool *present)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 0;
    jpath p = pkey(pre, key);
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9.2e18) {
        x = (int64_t)json_real_value(v);
    } else {
        /* "a whole number between 0 and 20" / "a whole number, at least 1" / "a whole number" */
        const char *sep = !*range ? "" : strncmp(range, "between", 7) == 0 ? " " : ", ";
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be a whole number%s%s.", p.s, show(v).s,
                    sep, range);
    }
    if (x < lo || x > hi)
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be %s.", p.s, show(v).s, range);
    *out = x;
    if (present)
        *present = true;
    return 0;
}

static int opt_bool(pctx *c, const json_t *obj, const char *pre, const char *key, bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 0;
    jpath p = pkey(pre, key);
    if (!json_is_boolean(v))
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be true or false.", p.s, show(v).s);
    *out = json_is_true(v);
    return 0;
}

/* An optional string (null allowed); fails on any other type. */
static int opt_str(pctx *c, const json_t *obj, const char *pre, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_string(v))
        return 0;
    jpath p = pkey(pre, key);
    return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be a string.", p.s, show(v).s);
}

static bool in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

/* Fails on the first key of obj not in `allowed`; `what` completes "is not a field of <what>". */
static int only_keys(pctx *c, const json_t *obj, const char *pre, const char *const *allowed, bool file_level,
                     const char *what)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v)
    {
        if (!in_list(k, allowed)) {
            jpath p = pkey(pre, k);
            return fail(c, file_level, "invalid_request", p.s, "%s is not a field of %s that spill accepts; remove it.",
                        p.s, what);
        }
    }
    return 0;
}

/* ---- messages ---------------------------------------------------------------------------------------- */

static const char *const ROLES[] = {"developer", "system", "user", "assistant", "tool", "function", NULL};

/*
 * content: a string, or a non-empty array of parts.  Text parts are
 * {"type":"text","text":S}; assistants may also send {"type":"refusal","refusal":S}.
 * Image, audio and file parts are named and refused (spill runs text models).
 */
static int check_content(pctx *c, const json_t *content, const char *path, bool assistant)
{
    if (json_is_string(content))
        return 0;
    if (!json_is_array(content))
        return fail(c, false, "invalid_request", path, "%s is %s, but it must be a string or a list of text parts.",
                    path, show(content).s);
    if (json_array_size(content) == 0)
        return fail(c, false, "invalid_request", path, "%s is an empty list; give a string or at least one text part.",
                    path);
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        jpath pp = pidx(path, i);
        if (!json_is_object(part))
            return fail(c, false, "invalid_request", pp.s,
                        "%s is %s, but each content part must be an object like {\"type\": \"text\", \"text\": \"…\"}.",
                        pp.s, show(part).s);
        json_t *type = json_object_get(part, "type");
        jpath pt = pkey(pp.s, "type");
        if (!json_is_string(type))
            return fail(c, false, "invalid_request", pt.s, "%s is %s, but it must be the string \"text\".", pt.s,
                        type ? show(type).s : "missing");
        const char *t = json_string_value(type);
        if (strcmp(t, "image_url") == 0 || strcmp(t, "input_image") == 0 || strcmp(t, "input_audio") == 0 ||
            strcmp(t, "file") == 0 || strcmp(t, "input_file") == 0)
            return fail(c, false, "invalid_request", pp.s,
                        "%s is a part of type \"%s\", which is not supported by text models; send text parts only.",
                        pp.s, t);
        const char *field = NULL;
        if (strcmp(t, "text") == 0)
            field = "text";
        else if (assistant && strcmp(t, "refusal") == 0)
            field = "refusal";
        else
            return fail(c, false, "invalid_request", pt.s, "%s is %s, but it must be \"text\"%s.", pt.s, show(type).s,
                        assistant ? " or \"refusal\"" : "");
        static const char *const text_keys[] = {"type", "text", NULL};
        static const char *const refusal_keys[] = {"type", "refusal", NULL};
        if (only_keys(c, part, pp.s, field[0] == 't' ? text_keys : refusal_keys, false, "a content part"))
            return -1;
        json_t *text = json_object_get(part, field);
        jpath px = pkey(pp.s, field);
        if (!json_is_string(text))
            return fail(c, false, "invalid_request", px.s, "%s is %s, but a %s part needs a string %s.", px.s,
                        text ? show(text).s : "missing", t, field);
    }
    return 0;
}

/* tool_calls: [{"id":S,"type":"function","function":{"name":S,"arguments":S(JSON text)}}], non-empty. */
static int check_tool_calls(pctx *c, const json_t *tc, const char *path)
{
    if (!json_is_array(tc) || json_array_size(tc) == 0)
        return fail(c, false, "invalid_request", path, "%s is %s, but it must be a non-empty list of tool calls.", path,
                    show(tc).s);
    size_t i;
    json_t *call;
    json_array_foreach(tc, i, call)
    {
        jpath pc = pidx(path, i);
        static const char *const keys[] = {"id", "type", "function", NULL};
        if (!json_is_object(call))
            return fail(c, false, "invalid_request", pc.s, "%s is %s, but a tool call must be an object.", pc.s,
                        show(call).s);
        if (only_keys(c, call, pc.s, keys, false, "a tool call"))
            return -1;
        json_t *id = json_object_get(call, "id"), *type = json_object_get(call, "type");
        json_t *fn = json_object_get(call, "function");
        jpath pi = pkey(pc.s, "id"), pt = pkey(pc.s, "type"), pf = pkey(pc.s, "function");
        if (!json_is_string(id))
            return fail(c, false, "invalid_request", pi.s, "%s is %s, but a tool call needs a string id.", pi.s,
                        id ? show(id).s : "missing");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return fail(c, false, "invalid_request", pt.s, "%s is %s, but it must be \"function\".", pt.s,
                        type ? show(type).s : "missing");
        if (!json_is_object(fn))
            return fail(c, false, "invalid_request", pf.s,
                        "%s is %s, but it must be an object with a name and JSON-encoded arguments.", pf.s,
                        fn ? show(fn).s : "missing");
        static const char *const fkeys[] = {"name", "arguments", NULL};
        if (only_keys(c, fn, pf.s, fkeys, false, "a tool call's function"))
            return -1;
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        jpath pn = pkey(pf.s, "name"), pa = pkey(pf.s, "arguments");
        if (!json_is_string(name) || !json_string_length(name))
            return fail(c, false, "invalid_request", pn.s, "%s is %s, but it must be the function's name.", pn.s,
                        name ? show(name).s : "missing");
        if (!json_is_string(args))
            return fail(c, false, "invalid_request", pa.s,
                        "%s is %s, but it must be a string holding the arguments as JSON (e.g. \"{\\\"x\\\": 1}\").",
                        pa.s, args ? show(args).s : "missing");
    }
    return 0;
}

/* One message of `messages`; `ft` allows the fine-tuning "weight" field on assistant messages. */
static int check_message(pctx *c, const json_t *m, const char *path, bool ft)
{
    if (!json_is_object(m))
        return fail(c, false, "invalid_request", path,
                    "%s is %s, but each message must be an object with a role and content.", path, show(m).s);
    json_t *role = json_object_get(m, "role");
    jpath pr = pkey(path, "role");
    if (!role)
        return fail(c, false, "invalid_request", pr.s,
                    "%s is missing; give each message a role (system, user, assistant, tool, …).", pr.s);
    if (!json_is_string(role) || !in_list(json_string_value(role), ROLES))
        return fail(c, false, "invalid_request", pr.s,
                    "%s is %s, but it must be one of developer, system, user, assistant, tool or function.", pr.s,
                    show(role).s);
    const char *r = json_string_value(role);
    bool assistant = strcmp(r, "assistant") == 0;
    static const char *const k_plain[] = {"role", "content", "name", NULL};
    static const char *const k_asst[] = {"role", "content", "name", "refusal", "tool_calls", "function_call", NULL};
    static const char *const k_asst_ft[] = {"role",       "content",       "name",   "refusal",
                                            "tool_calls", "function_call", "weight", NULL};
    static const char *const k_tool[] = {"role", "content", "tool_call_id", NULL};
    static const char *const k_func[] = {"role", "content", "name", NULL};
    const char *const *keys = assistant                    ? (ft ? k_asst_ft : k_asst)
                              : strcmp(r, "tool") == 0     ? k_tool
                              : strcmp(r, "function") == 0 ? k_func
                                                           : k_plain;
    char what[48];
    snprintf(what, sizeof what, "%s %s message", assistant ? "an" : "a", r);
    if (assistant && json_object_get(m, "audio"))
        return fail(c, false, "invalid_request", pkey(path, "audio").s,
                    "%s refers to earlier audio output, which text models cannot use; remove it.",
                    pkey(path, "audio").s);
    if (only_keys(c, m, path, keys, false, what))
        return -1;
    if (opt_str(c, m, path, "name"))
        return -1;

    json_t *content = json_object_get(m, "content");
    jpath pcn = pkey(path, "content");
    if (assistant) {
        json_t *tc = json_object_get(m, "tool_calls"), *fc = json_object_get(m, "function_call");
        if (tc && !json_is_null(tc) && check_tool_calls(c, tc, pkey(path, "tool_calls").s))
            return -1;
        if (fc && !json_is_null(fc)) {
            jpath pf = pkey(path, "function_call");
            if (!json_is_object(fc) || !json_is_string(json_object_get(fc, "name")) ||
                !json_is_string(json_object_get(fc, "arguments")))
                return fail(c, false, "invalid_request", pf.s,
                            "%s is %s, but it must be an object with string name and arguments.", pf.s, show(fc).s);
        }
        if (opt_str(c, m, path, "refusal"))
            return -1;
        bool calls = (tc && !json_is_null(tc)) || (fc && !json_is_null(fc));
        if ((!content || json_is_null(content)) && !calls)
            return fail(c, false, "invalid_request", pcn.s,
                        "%s is %s; an assistant message needs content unless it has tool_calls.", pcn.s,
                        content ? "null" : "missing");
        if (content && !json_is_null(content) && check_content(c, content, pcn.s, true))
            return -1;
        json_t *w = json_object_get(m, "weight");
        if (w && !(json_is_integer(w) && (json_integer_value(w) == 0 || json_integer_value(w) == 1))) {
            jpath pw = pkey(path, "weight");
            return fail(c, false, "invalid_request", pw.s, "%s is %s, but it must be 0 or 1.", pw.s, show(w).s);
        }
        return 0;
    }
    if (strcmp(r, "function") == 0) {
        json_t *name = json_object_get(m, "name");
        if (!json_is_string(name))
            return fail(c, false, "invalid_request", pkey(path, "name").s,
                        "%s is missing; a function message needs the function's name.", pkey(path, "name").s);
        if (content && !json_is_null(content) && !json_is_string(content))
            return fail(c, false, "invalid_request", pcn.s, "%s is %s, but it must be a string.", pcn.s,
                        show(content).s);
        return 0;
    }
    if (strcmp(r, "tool") == 0) {
        json_t *id = json_object_get(m, "tool_call_id");
        jpath pi = pkey(path, "tool_call_id");
        if (!json_is_string(id) || !json_string_length(id))
            return fail(c, false, "invalid_request", pi.s,
                        "%s is %s; a tool message needs the id of the tool call it answers.", pi.s,
                        id ? show(id).s : "missing");
    }
    if (!content || json_is_null(content))
        return fail(c, false, "invalid_request", pcn.s,
                    "%s is %s; %s needs content (a string or a list of text parts).", pcn.s,
                    content ? "null" : "missing", what);
    return check_content(c, content, pcn.s, false);
}

static int check_messages(pctx *c, const json_t *msgs, const char *path, bool ft)
{
    if (!msgs)
        return fail(c, false, "invalid_request", path, "%s is missing; a chat request needs a list of messages.", path);
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(c, false, "invalid_request", path, "%s is %s, but it must be a non-empty list of messages.", path,
                    show(msgs).s);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (check_message(c, m, pidx(path, i).s, ft))
            return -1;
    }
    return 0;
}

/* ---- tools ------------------------------------------------------------------------------------------- */

/* {"name":S, "description"?:S, "parameters"?:{…}, "strict"?:bool} — the function half of a tool or `functions[i]`. */
static int check_function_def(pctx *c, const json_t *fn, const char *path)
{
    static const char *const keys[] = {"name", "description", "parameters", "strict", NULL};
    if (!json_is_object(fn))
        return fail(c, false, "invalid_request", path, "%s is %s, but it must be an object with the function's name.",
                    path, fn ? show(fn).s : "missing");
    if (only_keys(c, fn, path, keys, false, "a function definition"))
        return -1;
    json_t *name = json_object_get(fn, "name");
    jpath pn = pkey(path, "name");
    if (!json_is_string(name))
        return fail(c, false, "invalid_request", pn.s, "%s is %s, but a function needs a string name.", pn.s,
                    name ? show(name).s : "missing");
    /* OpenAI: ^[a-zA-Z0-9_-]{1,64}$ */
    const char *s = json_string_value(name);
    size_t n = json_string_length(name);
    bool ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
             s[i] == '_' || s[i] == '-';
    if (!ok)
        return fail(c, false, "invalid_request", pn.s,
                    "%s is %s, but a function name must be 1 to 64 letters, digits, '_' or '-'.", pn.s, show(name).s);
    if (opt_str(c, fn, path, "description"))
        return -1;
    json_t *params = json_object_get(fn, "parameters");
    if (params && !json_is_object(params))
        return fail(c, false, "invalid_request", pkey(path, "parameters").s,
                    "%s is %s, but it must be a JSON Schema object.", pkey(path, "parameters").s, show(params).s);
    bool strict = false;
    return opt_bool(c, fn, path, "strict", &strict);
}

/* tools: [{"type":"function","function":{…}}]; functions (deprecated): [{name,…}]; rendered by the chat template. */
static int check_tools(pctx *c, const json_t *obj, const char *pre, request *out)
{
    json_t *tools = json_object_get(obj, "tools");
    if (tools && !json_is_null(tools)) {
        jpath pt = pkey(pre, "tools");
        if (!json_is_array(tools))
            return fail(c, false, "invalid_request", pt.s, "%s is %s, but it must be a list of tools.", pt.s,
                        show(tools).s);
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t)
        {
            jpath pi = pidx(pt.s, i);
            if (!json_is_object(t))
                return fail(c, false, "invalid_request", pi.s, "%s is %s, but a tool must be an object.", pi.s,
                            show(t).s);
            json_t *type = json_object_get(t, "type");
            if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
                return fail(c, false, "invalid_request", pkey(pi.s, "type").s,
                            "%s is %s, but spill supports only \"function\" tools.", pkey(pi.s, "type").s,
                            type ? show(type).s : "missing");
            static const char *const keys[] = {"type", "function", NULL};
            if (only_keys(c, t, pi.s, keys, false, "a function tool"))
                return -1;
            if (check_function_def(c, json_object_get(t, "function"), pkey(pi.s, "function").s))
                return -1;
        }
        out->tools = tools;
    }
    json_t *fns = json_object_get(obj, "functions");
    if (fns && !json_is_null(fns)) {
        jpath pf = pkey(pre, "functions");
        if (!json_is_array(fns))
            return fail(c, false, "invalid_request", pf.s, "%s is %s, but it must be a list of functions.", pf.s,
                        show(fns).s);
        size_t i;
        json_t *f;
        json_array_foreach(fns, i, f)
        {
            if (check_function_def(c, f, pidx(pf.s, i).s))
                return -1;
        }
    }
    out->parallel_tool_calls = true;
    return opt_bool(c, obj, pre, "parallel_tool_calls", &out->parallel_tool_calls);
}

/*
 * tool_choice: "auto" | "none" | "required" | {"type":"function","function":{"name":N}}; required and a
 * named function need tools, and the name must be one of them.  Both are enforced by constrained decoding: the
 * row's grammar is the family's call text around the forced tool's arguments (run_rows.c's tool_state,
 * toolcall_forced_schema); a named choice shows the template that tool alone.
 */
static int parse_tool_choice(pctx *c, const json_t *body, request *out)
{
    json_t *tc = json_object_get(body, "tool_choice");
    jpath p = pkey(c->pre, "tool_choice");
    if (!tc || json_is_null(tc))
        return 0;
    const char *s = json_string_value(tc);
    if (s && !strcmp(s, "auto"))
        return 0;
    if (s && !strcmp(s, "none")) {
        out->tool_choice = TC_CHOICE_NONE;
        return 0;
    }
    if (s && strcmp(s, "required"))
        return fail(c, false, "invalid_request", p.s,
                    "%s is %s, but it must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                    "\"function\": {\"name\": \"…\"}}.",
                    p.s, show(tc).s);
    if (!s) {
        json_t *type = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
        json_t *name = json_object_get(fn, "name");
        static const char *const keys[] = {"type", "function", NULL};
        if (!json_is_object(tc) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
            !json_is_string(name) || json_object_size(fn) != 1)
            return fail(c, false, "invalid_request", p.s,
                        "%s is %s, but a named choice must look like {\"type\": \"function\", \"function\": "
                        "{\"name\": \"…\"}}.",
                        p.s, show(tc).s);
        if (only_keys(c, tc, p.s, keys, false, "a named tool choice"))
            return -1;
        out->tool_choice_name = json_string_value(name);
    }
    out->tool_choice = s ? TC_CHOICE_REQUIRED : TC_CHOICE_NAMED;
    if (!out->tools || !json_array_size(out->tools))
        return fail(c, false, "invalid_request", p.s, "%s is %s, but the request has no tools to call; add tools or "
                    "remove %s.", p.s, show(tc).s, p.s);
    if (out->tool_choice == TC_CHOICE_NAMED) {
        size_t i;
        json_t *t;
        json_array_foreach(out->tools, i, t)
        {
            if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                        out->tool_choice_name))
                return 0;
        }
        jpath pn = pkey(pkey(p.s, "function").s, "name");
        return fail(c, false, "invalid_request", pn.s, "%s is \"%.64s\", which is not the name of any of the "
                    "request's tools.", pn.s, out->tool_choice_name);
    }
    return 0;
}

/* ---- sampling parameters ----------------------------------------------------------------------------- */

static int parse_stop(pctx *c, const json_t *body, req_sampling *s)
{
    json_t *v = json_object_get(body, "stop");
    if (!v || json_is_null(v))
        return 0;
    jpath p = pkey(c->pre, "stop");
    if (json_is_string(v)) {
        if (!json_string_length(v))
            return fail(c, false, "invalid_request", p.s,
                        "%s is an empty string; give a non-empty stop sequence or remove it.", p.s);
        s->stop[0] = json_string_value(v);
        s->stop_len[0] = json_string_length(v);
        s->n_stop = 1;
        return 0;
    }
    if (!json_is_array(v))
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be a string or a list of up to 4 strings.",
                    p.s, show(v).s);
    if (json_array_size(v) > REQ_MAX_STOP)
        return fail(c, false, "invalid_request", p.s, "%s has %zu sequences, but at most %d are allowed.", p.s,
                    json_array_size(v), REQ_MAX_STOP);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        jpath pi = pidx(p.s, i);
        if (!json_is_string(e) || !json_string_length(e))
            return fail(c, false, "invalid_request", pi.s,
                        "%s is %s, but each stop sequence must be a non-empty string.", pi.s, show(e).s);
        s->stop[i] = json_string_value(e);
        s->stop_len[i] = json_string_length(e);
    }
    s->n_stop = (int)json_array_size(v);
    return 0;
}

/* logit_bias: {"<token id>": bias in [-100, 100]} → two owned arrays in the order written. */
static int parse_logit_bias(pctx *c, const json_t *body, req_sampling *s)
{
    json_t *v = json_object_get(body, "logit_bias");
    if (!v || json_is_null(v))
        return 0;
    jpath p = pkey(c->pre, "logit_bias");
    if (!json_is_object(v))
        return fail(c, false, "invalid_request", p.s,
                    "%s is %s, but it must be an object mapping token ids to a whole-number bias between -100 and 100.",
                    p.s, show(v).s);
    size_t n = json_object_size(v), bytes;
    if (n == 0)
        return 0;
    if (!ck_mul_size(n, sizeof(int32_t), &bytes))
        return fail(c, false, "invalid_request", p.s, "%s has too many entries.", p.s);
    s->logit_bias_id = malloc(bytes);
    s->logit_bias = malloc(bytes); /* sizeof(float) == sizeof(int32_t) */
    if (!s->logit_bias_id || !s->logit_bias)
        return fail(c, false, "invalid_request", p.s, "%s: out of memory for %zu entries.", p.s, n);
    const char *k;
    json_t *b;
    size_t i = 0;
    json_object_foreach(v, k, b)
    {
        jpath pe = pkey(p.s, k);
        size_t kl = strlen(k);
        bool digits = kl >= 1 && kl <= 10;
        uint64_t id = 0;
        for (size_t j = 0; digits && j < kl; j++) {
            digits = k[j] >= '0' && k[j] <= '9';
            id = id * 10 + (uint64_t)(k[j] - '0');
        }
        if (!digits || id > INT32_MAX)
            return fail(c, false, "invalid_request", pe.s,
                        "%s: the key \"%s\" is not a token id; logit_bias keys must be token ids written as decimal "
                        "strings.",
                        p.s, pe.s + strlen(p.s) + 1);
        int64_t bias = 0; /* OpenAI's schema: integer values */
        if (json_is_null(b))
            return fail(c, false, "invalid_request", pe.s,
                        "%s is null, but it must be a whole number between -100 and 100.", pe.s);
        if (opt_int(c, v, p.s, k, -100, 100, "between -100 and 100", &bias, NULL))
            return -1;
        s->logit_bias_id[i] = (int32_t)id;
        s->logit_bias[i] = (float)bias;
        i++;
    }
    s->n_logit_bias = n;
    return 0;
}

/* Parameters both endpoints share. */
static int parse_common_sampling(pctx *c, const json_t *body, req_sampling *s)
{
    const char *pre = c->pre;
    int64_t n = 1;
    if (opt_num(c, body, pre, "temperature", 0, 2, &s->temperature) ||
        opt_num(c, body, pre, "top_p", 0, 1, &s->top_p) ||
        opt_int(c, body, pre, "n", 1, 128, "between 1 and 128", &n, NULL) ||
        opt_int(c, body, pre, "seed", INT64_MIN, INT64_MAX, "", &s->seed, &s->has_seed) ||
        opt_num(c, body, pre, "frequency_penalty", -2, 2, &s->frequency_penalty) ||
        opt_num(c, body, pre, "presence_penalty", -2, 2, &s->presence_penalty) || parse_stop(c, body, s) ||
        parse_logit_bias(c, body, s))
        return -1;
    int64_t tk = -1; /* vLLM's extension: -1 (or 0) keeps every token */
    if (opt_int(c, body, pre, "top_k", -1, 1 << 24, "-1 (off) or a number of tokens", &tk, NULL))
        return -1;
    s->top_k = tk > 0 ? (int)tk : 0;
    s->repetition_penalty = 1;
    if (opt_num(c, body, pre, "min_p", 0, 1, &s->min_p) ||
        opt_num(c, body, pre, "repetition_penalty", 0, 100, &s->repetition_penalty))
        return -1;
    if (s->repetition_penalty == 0)
        return fail(c, false, "invalid_request", pkey(pre, "repetition_penalty").s,
                    "%s is 0, but it must be above 0 (1 turns it off).", pkey(pre, "repetition_penalty").s);
    s->n = (int)n;
    return 0;
}

/* Fields that change nothing in a batch run, shared by both endpoints: check their types, then ignore them. */
static int check_ignored(pctx *c, const json_t *body)
{
    const char *pre = c->pre;
    bool st = false;
    if (opt_bool(c, body, pre, "stream", &st))
        return -1;
    if (st)
        return fail(c, false, "invalid_request", pkey(pre, "stream").s,
                    "%s is true, but batch rows cannot stream; remove it or set it to false.", pkey(pre, "stream").s);
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so))
        return fail(c, false, "invalid_request", pkey(pre, "stream_options").s,
                    "%s is set, but it applies only to streaming, which batch rows do not use; remove it.",
                    pkey(pre, "stream_options").s);
    if (opt_str(c, body, pre, "user"))
        return -1;
    json_t *md = json_object_get(body, "metadata");
    if (md && !json_is_null(md)) {
        jpath p = pkey(pre, "metadata");
        if (!json_is_object(md))
            return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be an object of string values.", p.s,
                        show(md).s);
        const char *k;
        json_t *v;
        json_object_foreach(md, k, v)
        {
            if (!json_is_string(v))
                return fail(c, false, "invalid_request", pkey(p.s, k).s,
                            "%s is %s, but metadata values must be strings.", pkey(p.s, k).s, show(v).s);
        }
    }
    return 0;
}

static const char *const CHAT_FIELDS[] = {"model",
                                          "messages",
                                          "top_k",
                                          "min_p",
                                          "repetition_penalty",
                                          "max_tokens",
                                          "max_completion_tokens",
                                          "temperature",
                                          "top_p",
                                          "n",
                                          "stop",
                                          "seed",
                                          "logprobs",
                                          "top_logprobs",
                                          "frequency_penalty",
                                          "presence_penalty",
                                          "logit_bias",
                                          "tools",
                                          "tool_choice",
                                          "parallel_tool_calls",
                                          "functions",
                                          "function_call",
                                          "response_format",
                                          "guided_json",
                                          "stream",
                                          "stream_options",
                                          "user",
                                          "metadata",
                                          "store",
                                          "service_tier",
                                          "prompt_cache_key",
                                          "safety_identifier",
                                          "reasoning_effort",
                                          "verbosity",
                                          "modalities",
                                          NULL};

/* Known OpenAI chat fields spill cannot honour, with the reason. */
static const char *const CHAT_REFUSED[][2] = {
    {"audio", "audio output needs an audio model"},
    {"prediction", "predicted outputs are not supported"},
    {"web_search_options", "web search is not available in spill"},
};

/*
 * response_format (OpenAI: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
 * "strict", "description"}}) and vLLM's guided_json (a schema object): the schema is compiled here once to
 * judge it (an unsupported keyword fails the row with a sentence naming it); the job compiles it again, once
 * per distinct schema (grammar_set_get).
 */
static int parse_response_format(pctx *c, const json_t *body, request *out)
{
    const char *pre = c->pre;
    json_t *rf = json_object_get(body, "response_format"), *gj = json_object_get(body, "guided_json");
    jpath p = pkey(pre, "response_format"), pg = pkey(pre, "guided_json");
    const json_t *schema = NULL;
    const char *spath = NULL;
    char sp[sizeof p.s + 32];
    if (gj && !json_is_null(gj)) {
        if (rf && !json_is_null(rf))
            return fail(c, false, "invalid_request", pg.s, "%s and %s are both set; set only one of them.", pg.s, p.s);
        if (!json_is_object(gj))
            return fail(c, false, "invalid_request", pg.s, "%s is %s, but it must be a JSON schema object.", pg.s,
                        show(gj).s);
        schema = gj;
        spath = pg.s;
    } else if (rf && !json_is_null(rf)) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        const char *ts = json_string_value(t);
        if (!ts || (strcmp(ts, "text") && strcmp(ts, "json_object") && strcmp(ts, "json_schema")))
            return fail(c, false, "invalid_request", p.s,
                        "%s is %s, but it must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                        "{\"type\": \"json_schema\", \"json_schema\": {\"name\": …, \"schema\": {…}}}.",
                        p.s, show(rf).s);
        static const char *const RF_KEYS[] = {"type", "json_schema", NULL};
        if (only_keys(c, rf, p.s, RF_KEYS, false, "a response_format"))
            return -1;
        json_t *js = json_object_get(rf, "json_schema");
        jpath pj = pkey(p.s, "json_schema");
        if (strcmp(ts, "json_schema")) {
            if (js)
                return fail(c, false, "invalid_request", pj.s, "%s is set, but the type is \"%s\"; remove it.", pj.s,
                            ts);
            if (!strcmp(ts, "text"))
                return 0;
            out->json_out = true; /* json_object: any object */
            return 0;
        }
        if (!json_is_object(js))
            return fail(c, false, "invalid_request", pj.s,
                        "%s is %s, but it must be an object like {\"name\": \"answer\", \"schema\": {…}}.", pj.s,
                        show(js ? js : json_null()).s);
        static const char *const JS_KEYS[] = {"name", "schema", "strict", "description", NULL};
        if (only_keys(c, js, pj.s, JS_KEYS, false, "a json_schema"))
            return -1;
        json_t *nm = json_object_get(js, "name"), *sc = json_object_get(js, "schema");
        if (!json_is_string(nm) || !json_string_length(nm))
            return fail(c, false, "invalid_request", pkey(pj.s, "name").s,
                        "%s is missing or not a non-empty string; name the schema (letters, digits, _ and -).",
                        pkey(pj.s, "name").s);
        if (opt_bool(c, js, pj.s, "strict", &(bool){false}) || opt_str(c, js, pj.s, "description"))
            return -1;
        if (!json_is_object(sc))
            return fail(c, false, "invalid_request", pkey(pj.s, "schema").s,
                        "%s is %s, but it must be a JSON schema object.", pkey(pj.s, "schema").s,
                        show(sc ? sc : json_null()).s);
        schema = sc;
        snprintf(sp, sizeof sp, "%s.schema", pj.s);
        spath = sp;
    } else
        return 0;
    grammar *g;
    char where[200], msg[512];
    if (grammar_compile(schema, spath, &g, where, sizeof where, msg, sizeof msg))
        return fail(c, false, "invalid_request", where[0] ? where : spath, "%s", msg);
    grammar_free(g);
    out->json_out = true;
    out->json_schema = (json_t *)schema;
    return 0;
}

static int parse_chat_body(pctx *c, const json_t *body, request *out)
{
    const char *pre = c->pre;
    req_sampling *s = &out->s;
    for (size_t i = 0; i < sizeof CHAT_REFUSED / sizeof CHAT_REFUSED[0]; i++)
        if (json_object_get(body, CHAT_REFUSED[i][0]))
            return fail(c, false, "invalid_request", pkey(pre, CHAT_REFUSED[i][0]).s, "%s is set, but %s; remove it.",
                        pkey(pre, CHAT_REFUSED[i][0]).s, CHAT_REFUSED[i][1]);
    if (only_keys(c, body, pre, CHAT_FIELDS, false, "a chat-completions request"))
        return -1;
    json_t *msgs = json_object_get(body, "messages");
    if (check_messages(c, msgs, pkey(pre, "messages").s, false))
        return -1;
    out->messages = msgs;

    int64_t mt = -1, mct = -1;
    if (opt_int(c, body, pre, "max_tokens", 1, INT64_MAX, "at least 1", &mt, NULL) ||
        opt_int(c, body, pre, "max_completion_tokens", 1, INT64_MAX, "at least 1", &mct, NULL))
        return -1;
    if (mt >= 0 && mct >= 0 && mt != mct)
        return fail(c, false, "invalid_request", pkey(pre, "max_completion_tokens").s,
                    "%s is %lld but %s is %lld; set only one of them (max_tokens is the older name).",
                    pkey(pre, "max_completion_tokens").s, (long long)mct, pkey(pre, "max_tokens").s, (long long)mt);
    s->max_tokens = mct >= 0 ? mct : mt;
    if (parse_common_sampling(c, body, s) || opt_bool(c, body, pre, "logprobs", &s->logprobs))
        return -1;
    int64_t tl = 0;
    bool has_tl = false;
    if (opt_int(c, body, pre, "top_logprobs", 0, 20, "between 0 and 20", &tl, &has_tl))
        return -1;
    if (has_tl && !s->logprobs)
        return fail(c, false, "invalid_request", pkey(pre, "top_logprobs").s,
                    "%s is set, but %s is not true; set \"logprobs\": true to get top log-probs.",
                    pkey(pre, "top_logprobs").s, pkey(pre, "logprobs").s);
    s->top_logprobs = (int)tl;

    if (check_tools(c, body, pre, out) || check_ignored(c, body))
        return -1;
    if (parse_tool_choice(c, body, out))
        return -1;
    json_t *fc = json_object_get(body, "function_call");
    if (fc && !json_is_null(fc) &&
        !(json_is_string(fc) && (!strcmp(json_string_value(fc), "auto") || !strcmp(json_string_value(fc), "none"))))
        return fail(c, false, "invalid_request", pkey(pre, "function_call").s,
                    "%s is %s, but forcing a function call needs constrained decoding, which spill does not support; "
                    "use \"auto\", \"none\" or remove it.",
                    pkey(pre, "function_call").s, show(fc).s);
    if (parse_response_format(c, body, out))
        return -1;
    json_t *mod = json_object_get(body, "modalities");
    if (mod && !json_is_null(mod)) {
        json_t *m0 = json_array_get(mod, 0);
        if (!json_is_array(mod) || json_array_size(mod) != 1 || !json_is_string(m0) ||
            strcmp(json_string_value(m0), "text") != 0)
            return fail(c, false, "invalid_request", pkey(pre, "modalities").s,
                        "%s is %s, but spill only produces text; use [\"text\"] or remove it.",
                        pkey(pre, "modalities").s, show(mod).s);
    }
    bool store = false;
    if (opt_bool(c, body, pre, "store", &store))
        return -1;
    static const char *const strs[] = {"service_tier", "prompt_cache_key", "safety_identifier", "reasoning_effort",
                                       "verbosity"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (opt_str(c, body, pre, strs[i]))
            return -1;
    return 0;
}

static const char *const COMPLETION_FIELDS[] = {"model",
                                                "prompt",
                                                "top_k",
                                                "min_p",
                                                "repetition_penalty",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "n",
                                                "stop",
                                                "seed",
                                                "logprobs",
                                                "echo",
                                                "suffix",
                                                "best_of",
                                                "frequency_penalty",
                                                "presence_penalty",
                                                "logit_bias",
                                                "guided_json",
                                                "stream",
                                                "stream_options",
                                                "user",
                                                NULL};

/* prompt (completions) or input (embeddings), field `key`: string | [string] | [int] | [[int]] (each token list
 * non-empty, ids in 0..2^31-1).  `need` words the sentence for a missing field. */
static int check_prompt(pctx *c, const json_t *pr, const char *key, const char *need, request *out)
{
    jpath p = pkey(c->pre, key);
    if (!pr)
        return fail(c, false, "invalid_request", p.s, "%s is missing; %s.", p.s, need);
    if (json_is_string(pr)) {
        out->n_prompts = 1;
        return 0;
    }
    const char *shape = "a string, a list of strings, a list of token ids or a list of token-id lists";
    if (!json_is_array(pr) || json_array_size(pr) == 0)
        return fail(c, false, "invalid_request", p.s, "%s is %s, but it must be %s.", p.s, show(pr).s, shape);
    json_t *first = json_array_get(pr, 0);
    int form = json_is_string(first) ? 0 : json_is_integer(first) ? 1 : json_is_array(first) ? 2 : -1;
    static const char *const elem[] = {"a string", "a token id (a whole number from 0)",
                                       "a non-empty list of token ids"};
    size_t i;
    json_t *e;
    json_array_foreach(pr, i, e)
    {
        jpath pi = pidx(p.s, i);
        if (form < 0)
            return fail(c, false, "invalid_request", pi.s, "%s is %s, but %s must be %s.", pi.s, show(e).s, p.s, shape);
        bool ok = form == 0   ? json_is_string(e)
                  : form == 1 ? json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) <= INT32_MAX
                              : json_is_array(e) && json_array_size(e) > 0;
        if (!ok)
            return fail(c, false, "invalid_request", pi.s, "%s is %s, but like %s[0] it must be %s.", pi.s, show(e).s,
                        p.s, elem[form]);
        if (form == 2) {
            size_t j;
            json_t *t;
            json_array_foreach(e, j, t)
            {
                if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
                    jpath pj = pidx(pi.s, j);
                    return fail(c, false, "invalid_request", pj.s, "%s is %s, but it must be %s.", pj.s, show(t).s,
                                elem[1]);
                }
            }
        }
    }
    out->n_prompts = form == 1 ? 1 : json_array_size(pr);
    return 0;
}

static int parse_completions_body(pctx *c, const json_t *body, request *out)
{
    const char *pre = c->pre;
    req_sampling *s = &out->s;
    if (only_keys(c, body, pre, COMPLETION_FIELDS, false, "a completions request"))
        return -1;
    json_t *pr = json_object_get(body, "prompt");
    if (check_prompt(c, pr, "prompt", "a completions request needs a prompt", out))
        return -1;
    out->prompt = pr;
    s->max_tokens = 16;
    int64_t lp = 0;
    bool has_lp = false;
    /* max_tokens 0 is legal with echo (legacy completions: score the prompt without generating) */
    if (opt_int(c, body, pre, "max_tokens", 0, INT64_MAX, "at least 0", &s->max_tokens, NULL) ||
        parse_common_sampling(c, body, s) || opt_int(c, body, pre, "logprobs", 0, 5, "between 0 and 5", &lp, &has_lp) ||
        opt_bool(c, body, pre, "echo", &s->echo) || check_ignored(c, body))
        return -1;
    if (s->max_tokens == 0 && !s->echo)
        return fail(c, false, "invalid_request", pkey(pre, "max_tokens").s,
                    "%s is 0, which generates nothing; set it to at least 1, or set echo to true to score the "
                    "prompt alone.", pkey(pre, "max_tokens").s);
    s->logprobs = has_lp;
    s->top_logprobs = (int)lp;
    json_t *suffix = json_object_get(body, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return fail(c, false, "invalid_request", pkey(pre, "suffix").s,
                    "%s is %s, but spill does not support insertion (suffix); remove it.", pkey(pre, "suffix").s,
                    show(suffix).s);
    int64_t best_of = 1;
    if (opt_int(c, body, pre, "best_of", 1, 20, "between 1 and 20", &best_of, NULL))
        return -1;
    if (best_of != 1)
        return fail(c, false, "invalid_request", pkey(pre, "best_of").s,
                    "%s is %lld, but spill does not support best_of above 1; use n to get several choices.",
                    pkey(pre, "best_of").s, (long long)best_of);
    return parse_response_format(c, body, out); /* vLLM's guided_json */
}

/* OpenAI's CreateEmbeddingRequest: at most 2,048 inputs a request, none of them empty. */
#define EMB_MAX_INPUTS 2048
static const char *const EMBEDDING_FIELDS[] = {"model", "input", "encoding_format", "dimensions", "user", NULL};

/* body of a /v1/embeddings row: input (check_prompt's shapes, no empty string), encoding_format float|base64,
 * dimensions ≥ 1 (whether the model allows it is the job's to say: it knows the model), user (ignored). */
static int parse_embeddings_body(pctx *c, const json_t *body, request *out)
{
    const char *pre = c->pre;
    if (only_keys(c, body, pre, EMBEDDING_FIELDS, false, "an embeddings request"))
        return -1;
    json_t *in = json_object_get(body, "input");
    if (check_prompt(c, in, "input", "an embeddings request needs an input (a string, a list of strings, a list "
                                     "of token ids or a list of token-id lists)", out))
        return -1;
    out->prompt = in;
    jpath p = pkey(pre, "input");
    if (out->n_prompts > EMB_MAX_INPUTS)
        return fail(c, false, "invalid_request", p.s, "%s holds %zu inputs, but a request takes at most %d; split it "
                                                      "over several rows.", p.s, out->n_prompts, EMB_MAX_INPUTS);
    for (size_t i = 0; i < (json_is_array(in) ? json_array_size(in) : 1); i++) {
        const json_t *e = json_is_array(in) ? json_array_get(in, i) : in;
        if (json_is_string(e) && json_string_length(e) == 0) {
            jpath pi = json_is_array(in) ? pidx(p.s, i) : p;
            return fail(c, false, "invalid_request", pi.s, "%s is an empty string, which has nothing to embed; give "
                                                          "it some text or drop it.", pi.s);
        }
    }
    json_t *enc = json_object_get(body, "encoding_format");
    if (enc && !json_is_null(enc)) {
        jpath pe = pkey(pre, "encoding_format");
        if (!json_is_string(enc) ||
            (strcmp(json_string_value(enc), "float") && strcmp(json_string_value(enc), "base64")))
            return fail(c, false, "invalid_request", pe.s, "%s is %s, but it must be \"float\" or \"base64\".", pe.s,
                        show(enc).s);
        out->emb_base64 = !strcmp(json_string_value(enc), "base64");
    }
    if (opt_int(c, body, pre, "dimensions", 1, INT32_MAX, "at least 1", &out->emb_dims, NULL))
        return -1;
    return opt_str(c, body, pre, "user");
}

/* ---- line → request ---------------------------------------------------------------------------------- */

/* Offset of the first byte that is not part of well-formed UTF-8, or len if all are. */
static size_t utf8_bad_offset(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, cp = c & 0x07;
        } else {
            return i;
        }
        if (n >= len - i)
            return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += n + 1;
    }
    return len;
}

/*
 * jansson's message made fit for a sentence: control bytes become '?' (one
 * line), and so does any byte of a UTF-8 sequence that jansson's "near '…'"
 * excerpt cut in half (the sentence stays valid UTF-8).
 */
static void clean_text(char *t)
{
    size_t n = strlen(t);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] < 0x20 || t[i] == 0x7f)
            t[i] = '?';
    for (size_t bad; (bad = utf8_bad_offset((const unsigned char *)t, n)) < n;)
        t[bad] = '?';
}

static int parse_json(pctx *c, const char *line, size_t len)
{
    if (len >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0)
        return fail(c, true, "invalid_json_line", NULL,
                    "the line starts with a UTF-8 byte-order mark, which is not valid JSON; save the file as UTF-8 "
                    "without BOM.");
    size_t bad = utf8_bad_offset((const unsigned char *)line, len);
    if (bad < len)
        return fail(c, true, "invalid_json_line", NULL,
                    "byte %zu of the line is not valid UTF-8; save the file as UTF-8.", bad + 1);
    json_error_t je;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        clean_text(je.text);
        const char *near = strstr(je.text, " near '");
        size_t tl = strlen(je.text);
        if (json_error_code(&je) == json_error_duplicate_key && near && tl && je.text[tl - 1] == '\'')
            return fail(c, true, "invalid_json_line", NULL,
                        "the key %.*s appears twice in one JSON object (column %d); remove one of them.",
                        (int)(strlen(near + 7) - 1), near + 7, je.column);
        if (json_error_code(&je) == json_error_null_character)
            return fail(c, true, "invalid_json_line", NULL,
                        "a string holds \\u0000 (a NUL character, column %d), which spill does not accept; remove "
                        "it.",
                        je.column);
        return fail(c, true, "invalid_json_line", NULL,
                    "the line is not valid JSON (%s, column %d); each line must be one complete JSON object.", je.text,
                    je.column);
    }
    c->out->root = root;
    if (!json_is_object(root))
        return fail(c, true, "invalid_json_line", NULL,
                    "the line is a JSON array, but each line must be one JSON object (one request).");
    return 0;
}

static int set_custom_id(pctx *c, const char *id)
{
    c->out->custom_id = strdup(id);
    if (!c->out->custom_id)
        return fail(c, true, "invalid_request", "custom_id", "out of memory copying custom_id.");
    return 0;
}

/* custom_id: required (batch) or optional (fine-tuning); a non-empty string, file-level. */
static int parse_custom_id(pctx *c, const json_t *root, bool required)
{
    json_t *id = json_object_get(root, "custom_id");
    if (!id && !required) {
        char buf[32];
        snprintf(buf, sizeof buf, "row-%zu", c->line);
        return set_custom_id(c, buf);
    }
    if (!id)
        return fail(c, true, "invalid_request", "custom_id",
                    "custom_id is missing; every batch line needs a unique custom_id string.");
    if (!json_is_string(id))
        return fail(c, true, "invalid_request", "custom_id", "custom_id is %s, but it must be a string.", show(id).s);
    if (json_string_length(id) == 0)
        return fail(c, true, "invalid_request", "custom_id",
                    "custom_id is empty; give every line a unique, non-empty custom_id.");
    return set_custom_id(c, json_string_value(id));
}

static int parse_expected(pctx *c, const json_t *root)
{
    json_t *e = json_object_get(root, "expected");
    if (!e)
        return 0;
    if (json_is_null(e))
        return fail(c, true, "invalid_request", "expected",
                    "expected is null; give the expected answer (a string, or the JSON value your metric reads).");
    c->out->expected = e;
    return 0;
}

static int parse_batch_line(pctx *c, json_t *root, request *out)
{
    bool eval = json_object_get(root, "expected") != NULL;
    out->kind = eval ? REQ_KIND_EVAL_BATCH : REQ_KIND_BATCH;
    if (parse_custom_id(c, root, true))
        return -1;
    json_t *method = json_object_get(root, "method");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST") != 0)
        return fail(c, true, "invalid_request", "method", "method is %s, but batch requests must use \"POST\".",
                    method ? show(method).s : "missing");
    json_t *url = json_object_get(root, "url");
    if (!json_is_string(url))
        return fail(c, true, "invalid_request", "url",
                    "url is %s, but it must be \"/v1/chat/completions\", \"/v1/completions\" or \"/v1/embeddings\".",
                    url ? show(url).s : "missing");
    const char *u = json_string_value(url);
    static const char *const later[] = {"/v1/responses", NULL};
    static const char *const other[] = {"/v1/moderations", "/v1/images/generations", "/v1/images/edits", "/v1/videos",
                                        NULL};
    if (strcmp(u, "/v1/chat/completions") == 0)
        out->endpoint = REQ_EP_CHAT;
    else if (strcmp(u, "/v1/completions") == 0)
        out->endpoint = REQ_EP_COMPLETIONS;
    else if (strcmp(u, "/v1/embeddings") == 0)
        out->endpoint = REQ_EP_EMBEDDINGS;
    else if (in_list(u, later))
        return fail(c, true, "invalid_request", "url",
                    "url is %s, which spill recognises but does not support yet; use \"/v1/chat/completions\", "
                    "\"/v1/completions\" or \"/v1/embeddings\".",
                    show(url).s);
    else if (in_list(u, other))
        return fail(c, true, "invalid_request", "url",
                    "url is %s, an OpenAI batch endpoint that spill does not serve (it runs text models); use "
                    "\"/v1/chat/completions\", \"/v1/completions\" or \"/v1/embeddings\".",
                    show(url).s);
    else
        return fail(c, true, "invalid_request", "url",
                    "url is %s, but it must be \"/v1/chat/completions\", \"/v1/completions\" or \"/v1/embeddings\".",
                    show(url).s);
    out->url = u;
    static const char *const keys[] = {"custom_id", "method", "url", "body", "expected", NULL};
    if (only_keys(c, root, "", keys, true, "a batch line (custom_id, method, url, body, and expected in eval files)"))
        return -1;
    json_t *body = json_object_get(root, "body");
    if (!json_is_object(body))
        return fail(c, true, "invalid_request", "body", "body is %s, but it must be the request object.",
                    body ? show(body).s : "missing");
    out->body = body;
    if (parse_expected(c, root))
        return -1;
    json_t *model = json_object_get(body, "model");
    if (model && !(json_is_string(model) && json_string_length(model)))
        return fail(c, true, "invalid_request", "body.model", "body.model is %s, but it must be the model's name.",
                    show(model).s);
    if (!model && !eval)
        return fail(c, true, "invalid_request", "body.model",
                    "body.model is missing; every batch line must name the same model.");
    out->model = model ? json_string_value(model) : NULL;
    c->pre = "body";
    if (out->endpoint == REQ_EP_EMBEDDINGS && eval)
        return fail(c, true, "invalid_request", "expected",
                    "an embeddings line has an \"expected\" field, but an eval scores text answers; drop expected "
                    "or send the row to a text endpoint.");
    return out->endpoint == REQ_EP_CHAT          ? parse_chat_body(c, body, out)
           : out->endpoint == REQ_EP_EMBEDDINGS ? parse_embeddings_body(c, body, out)
                                                : parse_completions_body(c, body, out);
}

static int parse_finetune_line(pctx *c, json_t *root, request *out)
{
    out->kind = json_object_get(root, "expected") ? REQ_KIND_EVAL_FINETUNE : REQ_KIND_FINETUNE;
    out->endpoint = REQ_EP_CHAT;
    out->url = "/v1/chat/completions";
    out->body = root;
    if (parse_custom_id(c, root, false))
        return -1;
    static const char *const keys[] = {"messages", "tools", "parallel_tool_calls", "functions", "custom_id",
                                       "expected", NULL};
    if (only_keys(c, root, "", keys, true,
                  "a fine-tuning chat line (messages, tools, parallel_tool_calls, functions, custom_id, expected)"))
        return -1;
    if (parse_expected(c, root))
        return -1;
    c->pre = "";
    json_t *msgs = json_object_get(root, "messages");
    if (check_messages(c, msgs, "messages", true))
        return -1;
    out->messages = msgs;
    return check_tools(c, root, "", out);
}

int request_parse_line(const char *line, size_t len, size_t lineno, const char *file, request *out, char *err,
                       size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->line = lineno;
    out->s = (req_sampling){.max_tokens = -1, .temperature = 1, .top_p = 1, .n = 1};
    if (err && errlen)
        err[0] = 0;
    pctx c = {.file = file ? file : "input", .line = lineno, .out = out, .err = err, .errlen = errlen, .pre = ""};
    if (parse_json(&c, line, len))
        return -1;
    json_t *root = out->root;
    bool batchish = json_object_get(root, "body") || json_object_get(root, "url") || json_object_get(root, "method");
    json_t *msgs = json_object_get(root, "messages");
    if (batchish && msgs)
        return fail(&c, true, "invalid_request", "messages",
                    "the line has both top-level messages and a batch body; put messages inside body (batch line) or "
                    "drop custom_id/method/url/body (fine-tuning line).");
    if (batchish || (!msgs && json_object_get(root, "custom_id")))
        return parse_batch_line(&c, root, out);
    if (msgs)
        return parse_finetune_line(&c, root, out);
    return fail(&c, true, "invalid_request", NULL,
                "the line is neither an OpenAI batch request (custom_id, method, url, body) nor a chat line "
                "(messages); see `spill check` in the docs for the formats.");
}

void request_free(request *r)
{
    if (!r)
        return;
    json_decref(r->root);
    free(r->custom_id);
    free(r->s.logit_bias_id);
    free(r->s.logit_bias);
    memset(r, 0, sizeof *r);
}

const char *request_kind_name(req_kind kind, req_endpoint ep)
{
    bool compl = ep == REQ_EP_COMPLETIONS;
    switch (kind) {
    case REQ_KIND_BATCH:
        return ep == REQ_EP_EMBEDDINGS ? "embedding batch" : compl ? "completion batch" : "chat-completion batch";
    case REQ_KIND_FINETUNE:
        return "fine-tuning chat";
    case REQ_KIND_EVAL_BATCH:
        return compl ? "eval (completion batch)" : "eval (chat-completion batch)";
    case REQ_KIND_EVAL_FINETUNE:
        return "eval (fine-tuning chat)";
    default:
        return "unknown";
    }
}

/* ---- streaming line reader --------------------------------------------------------------------------- */

int jsonl_open(jsonl_reader *r, FILE *f, const char *name, size_t max_line, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->f = f;
    r->name = name;
    r->max_line = max_line ? max_line : REQ_MAX_LINE_BYTES;
    r->cap = 4096;
    r->buf = malloc(r->cap);
    r->chunk = malloc(JSONL_CHUNK);
    if (!r->buf || !r->chunk) {
        jsonl_close(r);
        return util_errf(err, errlen, "%s: out of memory allocating the line buffer.", name);
    }
    return 0;
}

/* Appends n bytes to the line; the buffer grows geometrically up to max_line + 1. */
static int line_append(jsonl_reader *r, const char *p, size_t n)
{
    size_t need = r->len + n + 1;
    if (need > r->cap) {
        size_t cap = r->cap;
        while (cap < need)
            cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        if (cap > r->max_line + 1)
            cap = r->max_line + 1;
        char *nb = realloc(r->buf, cap);
        if (!nb)
            return -1;
        r->buf = nb;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, p, n);
    r->len += n;
    return 0;
}

jsonl_status jsonl_next(jsonl_reader *r, const char **line, size_t *len, char *err, size_t errlen)
{
    r->len = 0;
    r->line_offset = r->offset;
    bool too_long = false, any = false;
    for (;;) {
        if (r->cpos == r->clen) {
            if (r->eof)
                break;
            r->clen = fread(r->chunk, 1, JSONL_CHUNK, r->f);
            r->cpos = 0;
            if (r->clen == 0) {
                if (ferror(r->f)) {
                    util_errf(err, errlen, "%s: read failed at byte %llu: %s; check the disk and try again.", r->name,
                              (unsigned long long)r->offset, strerror(errno));
                    return JSONL_IO_ERROR;
                }
                r->eof = true;
                break;
            }
        }
        any = true;
        const char *start = r->chunk + r->cpos;
        size_t avail = r->clen - r->cpos;
        const char *nl = memchr(start, '\n', avail);
        size_t take = nl ? (size_t)(nl - start) : avail;
        if (!too_long) {
            if (take > r->max_line - r->len) {
                too_long = true;
            } else if (line_append(r, start, take)) {
                util_errf(err, errlen, "%s line %zu: out of memory buffering the line.", r->name, r->lineno + 1);
                return JSONL_IO_ERROR;
            }
        }
        size_t used = take + (nl ? 1 : 0);
        r->cpos += used;
        r->offset += used;
        if (nl)
            break;
    }
    if (!any)
        return JSONL_EOF;
    r->lineno++;
    if (too_long)
        return JSONL_TOO_LONG;
    if (r->len && r->buf[r->len - 1] == '\r')
        r->len--;
    r->buf[r->len] = 0;
    *line = r->buf;
    *len = r->len;
    return JSONL_LINE;
}

void jsonl_close(jsonl_reader *r)
{
    if (!r)
        return;
    free(r->buf);
    free(r->chunk);
    r->buf = r->chunk = NULL;
    r->cap = r->len = 0;
}
