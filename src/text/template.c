/*
 * template.c — chat templates, front door: the public API in template.h
 * (compile, render, chat_template_render/apply) and source normalisation.
 * Lexing lives in template_lex.c, parsing in template_parse.c, evaluation in
 * template_eval.c/template_ops.c/template_filters.c/template_methods.c,
 * values in jinja_value.c.  template_compile normalises the source, then
 * calls the lexer and the parser, which never call back here.
 *
 * Source normalisation (jinja2 3.1, the transformers environment): newlines
 * \r\n, \r and \n all become \n; one trailing \n is dropped
 * (keep_trailing_newline=False).  The source must be valid UTF-8 without NUL
 * bytes.
 *
 * Key decision: a compiled template is immutable (string constants are
 * immortal values), so threads may render it concurrently.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template_ast.h"
#include "../base/util.h"

/* ---------------------------------------------------------------- API */

void template_limits_default(tmpl_limits *lim)
{
    lim->max_steps = 50000000;
    lim->max_depth = 256;
    lim->max_output = (size_t)16 << 20;
    lim->max_range = 100000;
    lim->max_memory = (size_t)256 << 20;
    lim->now = 0;
}

void template_free(tmpl_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nblocks; i++)
        free(t->blocks[i]);
    free(t->blocks);
    free(t->name);
    free(t);
}

int template_compile(const char *src, size_t len, const char *name, tmpl_t **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *nm = name ? name : "template";
    if (!util_utf8_valid(src, len))
        return util_errf(err, errlen, "%s: source is not valid UTF-8; re-encode it", nm);
    if (memchr(src, 0, len))
        return util_errf(err, errlen, "%s: source contains a NUL byte", nm);
    tmpl_t *t = calloc(1, sizeof *t);
    parser p = {0};
    int rc = -1;
    if (!t || !(t->name = strdup(nm))) {
        util_errf(err, errlen, "%s: out of memory", nm);
        goto out_free;
    }
    /* normalise newlines, drop one trailing \n */
    char *s = tmpl_alloc(t, len + 1);
    size_t n = 0;
    if (!s)
        goto out_oom;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    p.t = t;
    p.src = s;
    p.n = n;
    p.err = err;
    p.errlen = errlen;
    size_t nl = 1;
    for (size_t i = 0; i < n; i++)
        nl += s[i] == '\n';
    p.lines = malloc(nl * sizeof *p.lines);
    if (!p.lines)
        goto out_oom;
    p.lines[0] = 0;
    p.nlines = 1;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n')
            p.lines[p.nlines++] = i + 1;
    if (tmpl_lex(&p))
        goto out_free;
    t->root = tmpl_parse(&p);
    if (!t->root)
        goto out_free;
    *out = t;
    t = NULL;
    rc = 0;
    goto out_free;
out_oom:
    util_errf(err, errlen, "%s: out of memory", nm);
out_free:
    free(p.tok);
    free(p.lines);
    template_free(t);
    return rc;
}

#define CTX_MAX_DEPTH 1000 /* JSON nesting accepted in the render context */

static int ctx_from_object(jheap *h, void *arg, jv *ctx, char *err, size_t errlen)
{
    json_t *context = arg;
    if (!json_is_object(context))
        return util_errf(err, errlen, "the template render context must be a JSON object");
    return jv_from_json(h, context, CTX_MAX_DEPTH, ctx, err, errlen);
}

int template_render(const tmpl_t *t, json_t *context, const tmpl_limits *lim, char **out, size_t *outlen, char *err,
                    size_t errlen)
{
    tmpl_limits def;
    if (!lim) {
        template_limits_default(&def);
        lim = &def;
    }
    return tmpl_eval_render(t, ctx_from_object, context, lim, out, outlen, err, errlen);
}

typedef struct {
    const tmpl_t *t;
    json_t *messages, *tools, *extra;
    bool add_generation_prompt;
} chat_args;

/* Sets ctx[key] = value (consumed); -1 with a sentence when out of memory. */
static int ctx_set(jheap *h, jv ctx, const char *key, jv value, char *err, size_t errlen)
{
    if (value.t == JV_UNDEF || !jv_dict_set(ctx, jv_cstr(h, key), value))
        return util_errf(err, errlen, "the chat context exceeds the template memory limit");
    return 0;
}

/* One message as transformers hands it to the template: _alias_reasoning_fields turns a message
 * carrying reasoning under reasoning_content/thinking/reasoning into
 * {"thinking": r, **message, "reasoning_content": r} (dict order matters for tojson/items). */
static int chat_message(jheap *h, json_t *m, jv *out, char *err, size_t errlen)
{
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    json_t *r = NULL;
    for (int k = 0; k < 3 && !r; k++) {
        json_t *v = json_object_get(m, fields[k]);
        if (v && !json_is_null(v))
            r = v;
    }
    if (!r)
        return jv_from_json(h, m, CTX_MAX_DEPTH, out, err, errlen);
    jv msg, rv, aliased = jv_dict(h, false);
    if (aliased.t != JV_DICT)
        return util_errf(err, errlen, "the chat context exceeds the template memory limit");
    if (jv_from_json(h, m, CTX_MAX_DEPTH, &msg, err, errlen))
        return jv_unref(aliased), -1;
    if (jv_from_json(h, r, CTX_MAX_DEPTH, &rv, err, errlen))
        return jv_unref(aliased), jv_unref(msg), -1;
    int rc = ctx_set(h, aliased, "thinking", jv_ref(rv), err, errlen);
    for (size_t i = 0; !rc && i < msg.u.d->n; i++)
        if (!jv_dict_set(aliased, jv_ref(msg.u.d->k[i]), jv_ref(msg.u.d->v[i])))
            rc = util_errf(err, errlen, "the chat context exceeds the template memory limit");
    if (!rc)
        rc = ctx_set(h, aliased, "reasoning_content", jv_ref(rv), err, errlen);
    jv_unref(rv);
    jv_unref(msg);
    if (rc)
        return jv_unref(aliased), -1;
    *out = aliased;
    return 0;
}

/* transformers' render(messages=…, tools=…, documents=…, add_generation_prompt=…, **special_tokens, **kwargs),
 * built straight from the caller's JSON without touching it (no reference counts change, so
 * callers may share their JSON between threads). */
static int chat_ctx(jheap *h, void *arg, jv *ctx, char *err, size_t errlen)
{
    chat_args *a = arg;
    jv msgs = jv_list(h, json_array_size(a->messages), false), v;
    size_t i;
    json_t *m;
    *ctx = jv_dict(h, false);
    if (ctx->t != JV_DICT || msgs.t != JV_LIST) {
        jv_unref(msgs);
        return util_errf(err, errlen, "the chat context exceeds the template memory limit");
    }
    json_array_foreach(a->messages, i, m)
    {
        if (chat_message(h, m, &v, err, errlen))
            return jv_unref(msgs), -1;
        if (!jv_list_push(msgs, v)) {
            jv_unref(msgs);
            return util_errf(err, errlen, "the chat context exceeds the template memory limit");
        }
    }
    if (ctx_set(h, *ctx, "messages", msgs, err, errlen))
        return -1;
    if (!a->tools)
        v = jv_none();
    else if (jv_from_json(h, a->tools, CTX_MAX_DEPTH, &v, err, errlen))
        return -1;
    if (ctx_set(h, *ctx, "tools", v, err, errlen) || ctx_set(h, *ctx, "documents", jv_none(), err, errlen) ||
        ctx_set(h, *ctx, "add_generation_prompt", jv_bool(a->add_generation_prompt), err, errlen))
        return -1;
    const char *key;
    json_t *val;
    json_object_foreach(a->extra, key, val)
    {
        if (!strcmp(key, "messages") || !strcmp(key, "tools") || !strcmp(key, "add_generation_prompt"))
            return util_errf(err, errlen, "%s: extra key '%s' collides with a reserved template variable; rename it",
                             a->t->name, key);
        if (jv_from_json(h, val, CTX_MAX_DEPTH, &v, err, errlen) || ctx_set(h, *ctx, key, v, err, errlen))
            return -1;
    }
    return 0;
}

int chat_template_apply(const tmpl_t *t, json_t *messages, json_t *tools, json_t *extra, bool add_generation_prompt,
                        time_t now, char **out, size_t *outlen, char *err, size_t errlen)
{
    size_t i;
    json_t *m;
    *out = NULL;
    *outlen = 0;
    if (!json_is_array(messages))
        return util_errf(err, errlen, "%s: messages must be a JSON array", t->name);
    json_array_foreach(messages, i, m) if (!json_is_object(m)) return util_errf(
        err, errlen, "%s: message %zu is not a JSON object", t->name, i);
    if (extra && !json_is_object(extra))
        return util_errf(err, errlen, "%s: extra must be a JSON object", t->name);
    chat_args a = {t, messages, tools, extra, add_generation_prompt};
    tmpl_limits lim;
    template_limits_default(&lim);
    lim.now = now;
    return tmpl_eval_render(t, chat_ctx, &a, &lim, out, outlen, err, errlen);
}

int chat_template_render(const char *src, size_t len, json_t *messages, json_t *tools, json_t *extra,
                         bool add_generation_prompt, time_t now, char **out, size_t *outlen, char *err, size_t errlen)
{
    tmpl_t *t = NULL;
    *out = NULL;
    *outlen = 0;
    if (template_compile(src, len, "chat template", &t, err, errlen))
        return -1;
    int rc = chat_template_apply(t, messages, tools, extra, add_generation_prompt, now, out, outlen, err, errlen);
    template_free(t);
    return rc;
}
