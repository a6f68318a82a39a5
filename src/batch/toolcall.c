/*
 * toolcall.c — function-calling conventions: detection from the chat template,
 * the tools a tool_choice shows, and the parser from answer text to calls.
 *
 * Which convention applies is read from the model's own chat template, never
 * from its name: the template is what taught the model the format, and a
 * fine-tune of one family on another's template follows the template.  The
 * markers, checked in this order:
 *   "[TOOL_CALLS]"                                   → mistral
 *   "<tool_call>"                                    → hermes (Hermes 2/3, Qwen2.5, Qwen3)
 *   "<|python_tag|>" or "<|start_header_id|>ipython" → llama3 (3.1 / 3.2 / 3.3)
 * Anything else (Granite's <|tool_call|>, DeepSeek's <｜tool▁calls▁begin｜>, a
 * template without tools) is TC_STYLE_NONE: tools are still rendered by the
 * template, the answer is returned as text.
 *
 * Text read per convention (ws = JSON white space; a CALL is a JSON object with
 * a string "name" and an "arguments" object — also "parameters" for Llama — or
 * a string holding one; a missing one is {}):
 *   hermes   (text? "<tool_call>" ws CALL ws ("</tool_call>" | end))+ text?
 *            content = every byte outside the calls, trimmed.
 *   llama3   text? "<|python_tag|>" CALL (ws? ";"? ws? CALL)* ws?   content = the text before the tag
 *            | ws? CALL (ws? ";"? ws? CALL)* ws?                    (the whole answer is the call; no content)
 *   mistral  text? "[TOOL_CALLS]" ws? "[" CALL ("," CALL)* "]" ws?  (v0.3 / Nemo; an "id" key is ignored)
 *            | text? ("[TOOL_CALLS]" NAME ("[CALL_ID]" ID)? "[ARGS]" OBJECT ws?)+   (v11 tokenizers)
 *            content = the text before the first marker.
 * A text that does not match (a call cut short, JSON that does not parse, a
 * name that is not one of the rendered tools) holds no calls: it is the answer's
 * content as it stands, and the caller keeps finish_reason "stop".  Names are
 * checked because Llama's bare-JSON form would otherwise take any JSON answer
 * with a "name" for a call.  Arguments are re-serialised compactly (valid JSON
 * whatever spacing the model chose), keys in the model's order.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "toolcall.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

/* ---- detection ----------------------------------------------------------------------------------------- */

tc_style toolcall_style(const char *t)
{
    if (!t)
        return TC_STYLE_NONE;
    if (strstr(t, "[TOOL_CALLS]"))
        return TC_STYLE_MISTRAL;
    if (strstr(t, "<tool_call>"))
        return TC_STYLE_HERMES;
    if (strstr(t, "<|python_tag|>") || strstr(t, "<|start_header_id|>ipython"))
        return TC_STYLE_LLAMA3;
    return TC_STYLE_NONE;
}

const char *toolcall_style_name(tc_style st)
{
    static const char *const names[] = {"none", "hermes", "llama3", "mistral"};
    return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "none";
}

const char *const *toolcall_markers(tc_style st)
{
    static const char *const hermes[] = {"<tool_call>", "</tool_call>", NULL};
    static const char *const llama[] = {"<|python_tag|>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", NULL};
    static const char *const none[] = {NULL};
    return st == TC_STYLE_HERMES ? hermes : st == TC_STYLE_LLAMA3 ? llama : st == TC_STYLE_MISTRAL ? mistral : none;
}

/* ---- tool_choice --------------------------------------------------------------------------------------- */

static const char *tool_name(const json_t *tool)
{
    return json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
}

json_t *toolcall_rendered_tools(json_t *tools, tc_choice choice, const char *name, bool *oom)
{
    *oom = false;
    if (!tools || !json_array_size(tools) || choice == TC_CHOICE_NONE)
        return NULL;
    if (choice != TC_CHOICE_NAMED)
        return json_incref(tools);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *n = tool_name(t);
        if (n && name && !strcmp(n, name)) {
            json_t *one = json_array();
            if (!one || json_array_append(one, t)) {
                json_decref(one);
                *oom = true;
                return NULL;
            }
            return one;
        }
    }
    return NULL; /* request.c refuses a name that is not among the tools */
}

/* ---- parsing ------------------------------------------------------------------------------------------- */

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const char *s, size_t len, size_t p)
{
    while (p < len && is_ws(s[p]))
        p++;
    return p;
}

static bool starts(const char *s, size_t len, size_t p, const char *lit)
{
    size_t n = strlen(lit);
    return p <= len && len - p >= n && memcmp(s + p, lit, n) == 0;
}

static const char *find(const char *s, size_t len, size_t from, const char *lit)
{
    return from <= len ? memmem(s + from, len - from, lit, strlen(lit)) : NULL;
}

/* One JSON object or array starting at s[p] (white space before it allowed); *end = the byte after it.  NULL
 * when none parses there. */
static json_t *json_at(const char *s, size_t len, size_t p, size_t *end)
{
    p = skip_ws(s, len, p);
    if (p >= len || (s[p] != '{' && s[p] != '['))
        return NULL;
    json_error_t e;
    json_t *v = json_loadb(s + p, len - p, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &e);
    if (v)
        *end = p + (size_t)e.position;
    return v;
}

static bool name_known(const json_t *tools, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *n = tool_name(t);
        if (n && !strcmp(n, name))
            return true;
    }
    return false;
}

typedef struct acc {
    const json_t *tools;
    tc_parsed *out;
    size_t cap;
    bool oom;
} acc;

/* Appends the call (name, args object); false when it is not a valid call (or memory ran out: a->oom). */
static bool add_call(acc *a, const char *name, const json_t *args)
{
    if (!name || !*name || !name_known(a->tools, name))
        return false;
    json_t *parsed = NULL;
    if (!args)
        args = parsed = json_object();
    else if (json_is_string(args)) { /* arguments given as JSON text */
        parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_REJECT_DUPLICATES, NULL);
        args = parsed;
    }
    if (!json_is_object(args)) {
        json_decref(parsed);
        return false;
    }
    if (a->out->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        tc_call *c = realloc(a->out->calls, cap * sizeof *c);
        if (!c) {
            json_decref(parsed);
            return !(a->oom = true);
        }
        a->out->calls = c;
        a->cap = cap;
    }
    char *text = json_dumps(args, JSON_COMPACT);
    char *n = strdup(name);
    json_decref(parsed);
    if (!text || !n) {
        free(text), free(n);
        return !(a->oom = true);
    }
    a->out->calls[a->out->n++] = (tc_call){n, text};
    return true;
}

/* A CALL object: {"name": S, "arguments"|"parameters": {…}|S}. */
static bool add_call_obj(acc *a, const json_t *o)
{
    if (!json_is_object(o))
        return false;
    const json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    return add_call(a, json_string_value(json_object_get(o, "name")), args);
}

/* Content += s[from, to). */
static bool add_text(acc *a, char **buf, size_t *n, const char *s, size_t from, size_t to)
{
    if (to <= from)
        return true;
    char *b = realloc(*buf, *n + (to - from) + 1);
    if (!b)
        return !(a->oom = true);
    memcpy(b + *n, s + from, to - from);
    *n += to - from;
    b[*n] = 0;
    *buf = b;
    return true;
}

static bool parse_hermes(acc *a, const char *s, size_t len, char **content, size_t *cl)
{
    size_t p = 0;
    const char *m;
    while ((m = find(s, len, p, "<tool_call>"))) {
        size_t at = (size_t)(m - s), end;
        if (!add_text(a, content, cl, s, p, at))
            return false;
        json_t *o = json_at(s, len, at + strlen("<tool_call>"), &end);
        bool ok = add_call_obj(a, o);
        json_decref(o);
        if (!ok)
            return false;
        p = skip_ws(s, len, end);
        if (starts(s, len, p, "</tool_call>"))
            p += strlen("</tool_call>");
        else if (p != len) /* only the very end may leave a call unclosed */
            return false;
    }
    return a->out->n > 0 && add_text(a, content, cl, s, p, len);
}

/* CALL (ws? ";"? ws? CALL)* ws? up to the end. */
static bool parse_call_run(acc *a, const char *s, size_t len, size_t p)
{
    for (;;) {
        size_t end;
        json_t *o = json_at(s, len, p, &end);
        bool ok = add_call_obj(a, o);
        json_decref(o);
        if (!ok)
            return false;
        p = skip_ws(s, len, end);
        if (p < len && s[p] == ';')
            p = skip_ws(s, len, p + 1);
        if (p == len)
            return true;
    }
}

static bool parse_llama(acc *a, const char *s, size_t len, char **content, size_t *cl)
{
    const char *m = find(s, len, 0, "<|python_tag|>");
    if (m) {
        size_t at = (size_t)(m - s);
        return add_text(a, content, cl, s, 0, at) && parse_call_run(a, s, len, at + strlen("<|python_tag|>"));
    }
    return parse_call_run(a, s, len, 0);
}

static bool parse_mistral(acc *a, const char *s, size_t len, char **content, size_t *cl)
{
    const char *m = find(s, len, 0, "[TOOL_CALLS]");
    if (!m)
        return false;
    size_t p = (size_t)(m - s);
    if (!add_text(a, content, cl, s, 0, p))
        return false;
    p += strlen("[TOOL_CALLS]");
    size_t q = skip_ws(s, len, p), end;
    if (q < len && s[q] == '[') { /* v0.3 / Nemo: a JSON list of calls */
        json_t *l = json_at(s, len, q, &end);
        bool ok = json_is_array(l) && json_array_size(l) > 0;
        size_t i;
        json_t *o;
        json_array_foreach(l, i, o)
        {
            if (ok)
                ok = add_call_obj(a, o);
        }
        json_decref(l);
        return ok && skip_ws(s, len, end) == len;
    }
    for (;;) { /* v11: name[ARGS]{…}, optionally name[CALL_ID]id[ARGS]{…}, repeated after [TOOL_CALLS] */
        const char *args = find(s, len, p, "[ARGS]");
        if (!args)
            return false;
        size_t ae = (size_t)(args - s), ne = ae;
        const char *cid = find(s, len, p, "[CALL_ID]");
        if (cid && (size_t)(cid - s) < ae)
            ne = (size_t)(cid - s);
        while (ne > p && is_ws(s[ne - 1]))
            ne--;
        p = skip_ws(s, len, p);
        char *name = ne > p ? strndup(s + p, ne - p) : NULL;
        json_t *o = json_at(s, len, ae + strlen("[ARGS]"), &end);
        bool ok = name && json_is_object(o) && add_call(a, name, o);
        if (!name && ne > p)
            a->oom = true;
        free(name);
        json_decref(o);
        if (!ok)
            return false;
        p = skip_ws(s, len, end);
        if (p == len)
            return true;
        if (!starts(s, len, p, "[TOOL_CALLS]"))
            return false;
        p += strlen("[TOOL_CALLS]");
    }
}

void toolcall_parsed_free(tc_parsed *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        free(p->calls[i].name), free(p->calls[i].arguments);
    free(p->calls);
    free(p->content);
    memset(p, 0, sizeof *p);
}

int toolcall_parse(tc_style st, const char *text, size_t len, const json_t *tools, bool parallel, tc_parsed *out)
{
    memset(out, 0, sizeof *out);
    if (!tools || !json_array_size(tools) || st == TC_STYLE_NONE || !text)
        return 0;
    acc a = {tools, out, 0, false};
    char *content = NULL;
    size_t cl = 0;
    bool ok = st == TC_STYLE_HERMES ? parse_hermes(&a, text, len, &content, &cl)
              : st == TC_STYLE_LLAMA3 ? parse_llama(&a, text, len, &content, &cl)
                                      : parse_mistral(&a, text, len, &content, &cl);
    if (!ok || a.oom) {
        free(content);
        toolcall_parsed_free(out);
        return a.oom ? -1 : 0;
    }
    while (!parallel && out->n > 1) {
        out->n--;
        free(out->calls[out->n].name), free(out->calls[out->n].arguments);
    }
    size_t b = 0, e = cl; /* trimmed; empty → no content */
    while (b < e && is_ws(content[b]))
        b++;
    while (e > b && is_ws(content[e - 1]))
        e--;
    if (e > b) {
        memmove(content, content + b, e - b);
        content[e - b] = 0;
        out->content = content;
        out->content_len = e - b;
    } else
        free(content);
    return 1;
}

/* ---- ids, forced choices, row state ---------------------------------------------------------------------- */

void toolcall_id(const char *custom_id, int choice, size_t k, char out[TC_ID_LEN])
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned int hl = 0;
    char tail[48];
    int tn = snprintf(tail, sizeof tail, "#%d#%zu", choice, k);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || !EVP_DigestInit_ex(c, EVP_sha256(), NULL) || !EVP_DigestUpdate(c, custom_id, strlen(custom_id)) ||
        !EVP_DigestUpdate(c, tail, (size_t)tn) || !EVP_DigestFinal_ex(c, h, &hl))
        memset(h, 0, sizeof h), hl = 32; /* OpenSSL cannot fail on sha256 short of memory: ids stay well-formed */
    EVP_MD_CTX_free(c);
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++)
        out[5 + i] = digits[h[i % hl] % 62]; /* a slight bias toward the first 8 digits: ids, not keys */
    out[29] = 0;
}

json_t *toolcall_forced_schema(tc_style st, const json_t *tools, tc_choice choice, bool parallel, const char **prefix,
                               const char **suffix)
{
    *prefix = st == TC_STYLE_HERMES ? "<tool_call>\n" : st == TC_STYLE_MISTRAL ? "[TOOL_CALLS]" : "";
    *suffix = st == TC_STYLE_HERMES ? "\n</tool_call>" : "";
    if (st == TC_STYLE_NONE || !tools || (choice != TC_CHOICE_REQUIRED && choice != TC_CHOICE_NAMED))
        return NULL;
    const char *akey = st == TC_STYLE_LLAMA3 ? "parameters" : "arguments";
    json_t *any = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *params = json_object_get(json_object_get(t, "function"), "parameters"), *any_object = NULL;
        if (!params) /* OpenAI: omitting parameters defines a function with an empty parameter list */
            params = any_object = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties", "additionalProperties", 0);
        json_t *one = json_pack("{s:s, s:{s:{s:s}, s:O}, s:[s, s], s:b}", "type", "object", "properties", "name",
                                "const", tool_name(t), akey, params, "required", "name", akey,
                                "additionalProperties", 0);
        json_decref(any_object);
        if (one && st == TC_STYLE_MISTRAL) /* Mistral's calls may carry a 9-character id (the template's own) */
            json_object_set_new(json_object_get(one, "properties"), "id",
                                json_pack("{s:s, s:i, s:i}", "type", "string", "minLength", 9, "maxLength", 9));
        if (!one || json_array_append_new(any, one)) {
            json_decref(any);
            return NULL;
        }
    }
    json_t *call;
    if (json_array_size(any) == 1) {
        call = json_incref(json_array_get(any, 0));
        json_decref(any);
    } else
        call = json_pack("{s:o}", "anyOf", any);
    if (st != TC_STYLE_MISTRAL || !call)
        return call;
    /* Mistral v0.3 / Nemo: a list of calls after [TOOL_CALLS] (v11 tokenizers read it too) */
    json_t *list = json_pack("{s:s, s:o, s:i}", "type", "array", "items", call, "minItems", 1);
    if (list && !parallel && json_object_set_new(list, "maxItems", json_integer(1)))
        json_decref(list), list = NULL;
    return list;
}

void toolcall_row_free(tc_row *t)
{
    if (!t)
        return;
    json_decref(t->tools);
    memset(t, 0, sizeof *t);
}
