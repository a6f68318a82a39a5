/*
 * template_filters.c — chat templates: the jinja2 filters and tests, each
 * matching jinja2 3.1 output byte for byte for the inputs chat templates pass
 * (trim, tojson, join, selectattr, map, items, default, indent, dictsort, …).
 *
 * Does not own: evaluation, scoping, operators (template_eval.c,
 * template_ops.c); the str/dict/list methods and the string helpers shared
 * with them (template_methods.c); value printing and JSON encoding
 * (jinja_value.c).
 *
 * Key decisions:
 *  - One table (FILTERS) maps each filter name to its function, so adding a
 *    filter is a function and a line (and its name in template_parse.c's
 *    compile-time list).
 *  - Filters that jinja2 implements as generators (select, reject,
 *    selectattr, rejectattr, map, unique, items; reverse of a list) return a
 *    list flagged `gen`: truthy even when empty, no len(), compares by
 *    identity — the observable behaviour templates can hit.  Generators are
 *    evaluated eagerly, so an error inside one surfaces at the filter even if
 *    the result is never consumed (jinja2 would stay silent), and a generator
 *    can be iterated twice (jinja2's would be empty the second time).
 *  - Python %-formatting (`'%s' % x`, the `format` filter) is not supported.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "template_eval.h"
#include "../base/util.h"

/* ---------------------------------------------------------------- attribute paths (selectattr, map, sort, …) */

/* jinja2 make_attrgetter: "a.b.0" walks getitem per part, digits become ints. */
static int get_path(ev *e, const node *n, jv item, jv path, jv *out)
{
    if (path.t != JV_STR)
        return tev_getitem(e, n, item, path, out);
    const char *p = path.u.s->s;
    jv cur = jv_ref(item);
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        bool digits = l > 0;
        for (size_t i = 0; i < l; i++)
            digits = digits && p[i] >= '0' && p[i] <= '9';
        jv key = digits ? jv_int(strtoll(p, NULL, 10)) : tev_str(e, p, l), next;
        int rc = tev_getitem(e, n, cur, key, &next);
        jv_unref(key);
        jv_unref(cur);
        if (rc)
            return -1;
        cur = next;
        if (!dot)
            break;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

/* ---------------------------------------------------------------- tests */

int tev_test(ev *e, const node *n, const char *name, jv v, jv *arg, bool *res)
{
    if (!strcmp(name, "defined"))
        *res = v.t != JV_UNDEF;
    else if (!strcmp(name, "undefined"))
        *res = v.t == JV_UNDEF;
    else if (!strcmp(name, "none"))
        *res = v.t == JV_NONE;
    else if (!strcmp(name, "boolean"))
        *res = v.t == JV_BOOL;
    else if (!strcmp(name, "true"))
        *res = v.t == JV_BOOL && v.u.b;
    else if (!strcmp(name, "false"))
        *res = v.t == JV_BOOL && !v.u.b;
    else if (!strcmp(name, "integer"))
        *res = v.t == JV_INT;
    else if (!strcmp(name, "float"))
        *res = v.t == JV_FLOAT;
    else if (!strcmp(name, "number"))
        *res = is_num(v);
    else if (!strcmp(name, "string"))
        *res = v.t == JV_STR;
    else if (!strcmp(name, "mapping"))
        *res = v.t == JV_DICT;
    else if (!strcmp(name, "iterable"))
        *res = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (!strcmp(name, "sequence"))
        *res = v.t == JV_STR || (v.t == JV_LIST && !v.u.l->gen) || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (!strcmp(name, "callable"))
        *res = v.t == JV_FUNC || v.t == JV_UNDEF; /* Undefined has __call__ */
    else if (!strcmp(name, "escaped"))
        *res = false;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) { /* str(value).islower()/isupper() */
        jv t, sv;
        if (tev_to_str(e, n, v, &sv))
            return -1;
        v = sv;
        if (tev_str_case(e, n, v, name[0] == 'l' ? 'l' : 'u', &t))
            return jv_unref(sv), -1;
        *res = jv_equal(t, v);
        bool any_cased = false;
        for (size_t i = 0; i < v.u.s->len;) {
            uint32_t c;
            i += (size_t)jv_utf8_decode(v.u.s->s + i, v.u.s->len - i, &c);
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
            any_cased |= cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
        }
        *res = *res && any_cased;
        jv_unref(t);
        jv_unref(sv);
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        /* jinja: value % 2 == 1, value % 2 == 0, value % num == 0 (Python %, floats allowed) */
        jv m, two = jv_int(2);
        bool div = name[0] == 'd';
        if (div && !arg)
            return tev_fail(e, n, "test 'divisibleby' needs an argument");
        if (tev_arith(e, n, OP_MOD, v, div ? *arg : two, &m))
            return -1;
        *res = jv_equal(m, jv_int(name[0] == 'o' ? 1 : 0));
        jv_unref(m);
    } else {
        if (!arg)
            return tev_fail(e, n, "test '%s' needs an argument", name);
        int op;
        if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
            op = CMP_EQ;
        else if (!strcmp(name, "ne") || !strcmp(name, "!="))
            op = CMP_NE;
        else if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<"))
            op = CMP_LT;
        else if (!strcmp(name, "le") || !strcmp(name, "<="))
            op = CMP_LE;
        else if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">"))
            op = CMP_GT;
        else if (!strcmp(name, "ge") || !strcmp(name, ">="))
            op = CMP_GE;
        else if (!strcmp(name, "in"))
            op = CMP_IN;
        else if (!strcmp(name, "sameas")) {
            *res = v.t == arg->t && (v.t < JV_STR ? jv_equal(v, *arg) : v.u.o == arg->u.o);
            return 0;
        } else
            return tev_fail(e, n, "no test named '%s'", name);
        return tev_compare(e, n, op, v, *arg, res);
    }
    return 0;
}

/* ---------------------------------------------------------------- filters */

/* A filter: `v|name(a)`.  name is the name it was called by (aliases share a function). */
typedef int (*filter_fn)(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out);

static bool fname(const char *name, const char *x)
{
    return !strcmp(name, x);
}

/* select/reject/selectattr/rejectattr: keep items whose test (or truthiness) == want. */
static int select_items(ev *e, const node *n, jv v, cargs *a, bool by_attr, bool want, jv *out)
{
    jv items;
    size_t first = by_attr ? 1 : 0;
    jv *attr = by_attr ? tev_arg(a, 0, NULL) : NULL;
    jv *test = tev_arg(a, first, NULL);
    if (!jv_truthy(v)) { /* jinja: `if value:` guards the loop, so falsy inputs give nothing */
        *out = jv_list(&e->heap, 0, false);
        return tev_built(e, n, out);
    }
    if (by_attr && !attr)
        return tev_fail(e, n, "selectattr/rejectattr need an attribute name");
    if (test && test->t != JV_STR)
        return tev_fail(e, n, "the test name must be a string");
    if (tev_iterate(e, n, v, &items))
        return -1;
    *out = jv_list(&e->heap, 0, false);
    for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST; i++) {
        jv x = items.u.l->v[i], val;
        bool r;
        if (by_attr) {
            if (get_path(e, n, x, *attr, &val))
                goto fail;
        } else {
            val = jv_ref(x);
        }
        if (test) {
            int rc = tev_test(e, n, test->u.s->s, val, tev_arg(a, first + 1, NULL), &r);
            if (rc) {
                jv_unref(val);
                goto fail;
            }
        } else {
            r = jv_truthy(val);
        }
        jv_unref(val);
        if (r == want)
            jv_list_push(*out, jv_ref(x));
    }
    jv_unref(items);
    if (tev_tick(e, n, out->t == JV_LIST ? out->u.l->n : 0))
        return -1;
    return tev_built(e, n, out);
fail:
    jv_unref(items);
    jv_drop(out);
    return -1;
}

static int filter_join(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv items, *sep = tev_arg(a, 0, "d"), *attr = tev_arg(a, 1, "attribute");
    if (tev_iterate(e, n, v, &items))
        return -1;
    jbuf b = {.max = e->lim->max_output};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (i && sep)
            jv_to_str(&b, *sep);
        if (attr) {
            jv x;
            if (get_path(e, n, items.u.l->v[i], *attr, &x)) {
                jv_unref(items);
                jbuf_free(&b);
                return -1;
            }
            jv_to_str(&b, x);
            jv_unref(x);
        } else {
            jv_to_str(&b, items.u.l->v[i]);
        }
    }
    jv_unref(items);
    if (b.over) {
        jbuf_free(&b);
        return tev_fail(e, n, "join result exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    if (tev_tick(e, n, b.n / 64 + 1))
        return -1;
    return tev_built(e, n, out);
}

static int filter_tojson(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jjson_opts o = {.indent = -1};
    jv *ea = tev_arg(a, 0, "ensure_ascii"), *ind = tev_arg(a, 1, "indent"), *seps = tev_arg(a, 2, "separators"),
       *sk = tev_arg(a, 3, "sort_keys");
    char ibuf[8], kbuf[8];
    if (ea)
        o.ensure_ascii = jv_truthy(*ea);
    if (sk)
        o.sort_keys = jv_truthy(*sk);
    if (ind && ind->t != JV_NONE) {
        if (!is_int(*ind))
            return tev_fail(e, n, "tojson indent must be an integer");
        o.indent = as_int(*ind) < 0 ? 0 : as_int(*ind) > 64 ? 64 : (int)as_int(*ind);
    }
    if (seps && seps->t != JV_NONE) {
        if (seps->t != JV_LIST || seps->u.l->n != 2 || seps->u.l->v[0].t != JV_STR || seps->u.l->v[1].t != JV_STR)
            return tev_fail(e, n, "tojson separators must be a pair of strings");
        snprintf(ibuf, sizeof ibuf, "%s", seps->u.l->v[0].u.s->s);
        snprintf(kbuf, sizeof kbuf, "%s", seps->u.l->v[1].u.s->s);
        o.item_sep = ibuf;
        o.key_sep = kbuf;
    }
    jbuf b = {.max = e->lim->max_output};
    char msg[200];
    if (jv_to_json(&b, v, &o, msg, sizeof msg)) {
        jbuf_free(&b);
        return tev_fail(e, n, "%s", msg);
    }
    if (b.over) {
        jbuf_free(&b);
        return tev_fail(e, n, "tojson result exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    if (tev_tick(e, n, b.n / 64 + 1))
        return -1;
    return tev_built(e, n, out);
}

/* Python int(str) as jinja's do_int tries it: int(s, base), then int(float(s)). */
static bool parse_pyint(const char *s, int base, int64_t *out)
{
    while (*s && strchr(" \t\n\r\f\v", *s))
        s++;
    char buf[80];
    size_t k = 0;
    const char *p = s;
    if (*p == '+' || *p == '-')
        buf[k++] = *p++;
    if (!*p)
        return false;
    for (; *p && !strchr(" \t\n\r\f\v", *p); p++) {
        if (*p == '_')
            continue;
        if (k >= sizeof buf - 1)
            return false;
        buf[k++] = *p;
    }
    while (*p && strchr(" \t\n\r\f\v", *p))
        p++;
    if (*p)
        return false;
    buf[k] = 0;
    if (base != 0 && (base < 2 || base > 36))
        return false; /* Python: ValueError, jinja falls back to the default */
    char *end = buf;
    errno = 0;
    long long v = strtoll(buf, &end, base);
    if (*end || end == buf || errno)
        return false;
    *out = v;
    return true;
}

static bool parse_pyfloat(const char *s, double *out)
{
    while (*s && strchr(" \t\n\r\f\v", *s))
        s++;
    if (!*s)
        return false;
    char *end;
    double d = strtod(s, &end);
    while (*end && strchr(" \t\n\r\f\v", *end))
        end++;
    if (*end || end == s)
        return false;
    *out = d;
    return true;
}

static int filter_indent(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv s, *w = tev_arg(a, 0, "width"), *first = tev_arg(a, 1, "first"), *blank = tev_arg(a, 2, "blank");
    if (v.t != JV_STR)
        return tev_fail(e, n, "unsupported operand type(s) for +=: '%s' and 'str' (indent needs a string)",
                        jv_type_name(v));
    s = jv_ref(v);
    jbuf ind = {0}, b = {.max = e->lim->max_output};
    if (w && w->t == JV_STR)
        jbuf_put(&ind, w->u.s->s, w->u.s->len);
    else
        for (int64_t i = 0; i < (w && is_int(*w) ? as_int(*w) : 4) && i < 1024; i++)
            jbuf_putc(&ind, ' ');
    jv lines;
    /* jinja appends "\n" before splitlines so a trailing newline does not vanish */
    jbuf tmp = {0};
    jbuf_put(&tmp, s.u.s->s, s.u.s->len);
    jbuf_putc(&tmp, '\n');
    jv_unref(s);
    jv t = tev_str(e, tmp.p, tmp.n);
    jbuf_free(&tmp);
    if (tev_oom_check(e, n) || tev_str_splitlines(e, n, t, &lines)) {
        jv_unref(t);
        jbuf_free(&ind);
        return -1;
    }
    jv_unref(t);
    if (first && jv_truthy(*first))
        jbuf_put(&b, ind.p ? ind.p : "", ind.n);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jv l = lines.u.l->v[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if ((blank && jv_truthy(*blank)) || l.u.s->len)
                jbuf_put(&b, ind.p ? ind.p : "", ind.n);
        }
        jbuf_put(&b, l.u.s->s, l.u.s->len);
    }
    jv_unref(lines);
    jbuf_free(&ind);
    if (b.over) {
        jbuf_free(&b);
        return tev_fail(e, n, "indent result exceeds the output limit");
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return tev_built(e, n, out);
}

/* Sort key comparison for sort/dictsort/min/max: case-insensitive on strings unless asked. */
typedef struct {
    ev *e;
    const node *n;
    bool case_sensitive;
    bool failed;
} sort_ctx;

static int key_cmp(sort_ctx *c, jv a, jv b)
{
    int r = 0;
    if (!c->case_sensitive && a.t == JV_STR && b.t == JV_STR) {
        jv la, lb;
        if (tev_str_case(c->e, c->n, a, 'l', &la))
            return c->failed = true, 0;
        if (tev_str_case(c->e, c->n, b, 'l', &lb))
            return jv_unref(la), c->failed = true, 0;
        if (tev_order(c->e, c->n, la, lb, &r, "<"))
            c->failed = true;
        jv_unref(la);
        jv_unref(lb);
        return r;
    }
    if (tev_order(c->e, c->n, a, b, &r, "<"))
        c->failed = true;
    return r;
}

/* Stable merge sort of items by keys (both arrays of n). */
static void msort(sort_ctx *c, jv *items, jv *keys, size_t n, jv *ti, jv *tk, bool reverse)
{
    if (n < 2 || c->failed)
        return;
    size_t h = n / 2;
    msort(c, items, keys, h, ti, tk, reverse);
    msort(c, items + h, keys + h, n - h, ti, tk, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = key_cmp(c, keys[j], keys[i]);
        bool take_right = reverse ? r > 0 : r < 0;
        if (take_right)
            ti[k] = items[j], tk[k++] = keys[j++];
        else
            ti[k] = items[i], tk[k++] = keys[i++];
    }
    while (i < h)
        ti[k] = items[i], tk[k++] = keys[i++];
    while (j < n)
        ti[k] = items[j], tk[k++] = keys[j++];
    memcpy(items, ti, n * sizeof *items);
    memcpy(keys, tk, n * sizeof *keys);
}

/* Sorts `list` (a fresh list we own) by key(item); key = attribute path or the item itself. */
static int sort_list(ev *e, const node *n, jv list, jv *attr, bool case_sensitive, bool reverse, int dict_by)
{
    size_t cnt = list.u.l->n;
    jv *keys = calloc(cnt + 1, sizeof *keys), *ti = calloc(cnt + 1, sizeof *ti), *tk = calloc(cnt + 1, sizeof *tk);
    int rc = -1;
    if (!keys || !ti || !tk) {
        tev_fail(e, n, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < cnt; i++) {
        jv it = list.u.l->v[i];
        if (dict_by >= 0)
            keys[i] = jv_ref(it.u.l->v[dict_by]);
        else if (attr) {
            if (get_path(e, n, it, *attr, &keys[i])) {
                for (size_t k = 0; k < i; k++)
                    jv_unref(keys[k]);
                goto out;
            }
        } else
            keys[i] = jv_ref(it);
    }
    sort_ctx c = {e, n, case_sensitive, false};
    if (tev_tick(e, n, cnt * 4))
        goto unref;
    msort(&c, list.u.l->v, keys, cnt, ti, tk, reverse);
    rc = c.failed ? -1 : 0;
unref:
    for (size_t k = 0; k < cnt; k++)
        jv_unref(keys[k]);
out:
    free(keys);
    free(ti);
    free(tk);
    return rc;
}

int tev_copy_list(ev *e, const node *n, jv v, jv *out)
{
    jv items;
    if (tev_iterate(e, n, v, &items))
        return -1;
    *out = jv_list(&e->heap, items.u.l->n, false);
    for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST; i++)
        jv_list_push(*out, jv_ref(items.u.l->v[i]));
    jv_unref(items);
    return tev_built(e, n, out);
}

/* default(default_value='', boolean=False), alias d: the value, or default_value when it is undefined
 * (or falsy, with boolean) */
static int filter_default(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *dv = tev_arg(a, 0, "default_value"), *boolean = tev_arg(a, 1, "boolean");
    bool use = v.t == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
    if (use)
        *out = dv ? jv_ref(*dv) : tev_str(e, "", 0);
    else
        *out = jv_ref(v);
    return tev_built(e, n, out);
}

/* length, alias count: len() — code points of a string, items of a list or dict; 0 for undefined;
 * generators have no len() */
static int filter_length(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    switch (v.t) {
    case JV_UNDEF:
        *out = jv_int(0);
        return 0;
    case JV_STR:
        *out = jv_int((int64_t)jv_utf8_count(v.u.s->s, v.u.s->len));
        return 0;
    case JV_LIST:
        if (v.u.l->gen)
            break;
        *out = jv_int((int64_t)v.u.l->n);
        return 0;
    case JV_DICT:
        *out = jv_int((int64_t)v.u.d->n);
        return 0;
    default:
        break;
    }
    return tev_fail(e, n, "object of type '%s' has no len()", jv_type_name(v));
}

/* string: Python str(value) */
static int filter_string(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return tev_to_str(e, n, v, out);
}

/* safe: the string itself (there is no autoescaping to mark it against) */
static int filter_safe(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return v.t == JV_STR ? (*out = jv_ref(v), 0) : tev_to_str(e, n, v, out);
}

/* trim(chars=None): str(value).strip(chars) */
static int filter_trim(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv s;
    if (tev_to_str(e, n, v, &s))
        return -1;
    int rc = tev_str_strip(e, n, s, tev_arg(a, 0, "chars"), 3, out);
    jv_unref(s);
    return rc;
}

/* upper, lower, title, capitalize: the str method of str(value) */
static int filter_upper(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv s;
    if (tev_to_str(e, n, v, &s))
        return -1;
    int rc = tev_str_case(e, n, s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 't' ? 't' : 'c', out);
    jv_unref(s);
    return rc;
}

/* escape, alias e: markupsafe's HTML escaping of & < > " ' in str(value) */
static int filter_escape(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv s;
    if (tev_to_str(e, n, v, &s))
        return -1;
    jbuf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        if (c == '&')
            jbuf_puts(&b, "&amp;");
        else if (c == '<')
            jbuf_puts(&b, "&lt;");
        else if (c == '>')
            jbuf_puts(&b, "&gt;");
        else if (c == '"')
            jbuf_puts(&b, "&#34;");
        else if (c == '\'')
            jbuf_puts(&b, "&#39;");
        else
            jbuf_putc(&b, c);
    }
    jv_unref(s);
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return tev_built(e, n, out);
}

/* replace(old, new, count=None) on str(value) */
static int filter_replace(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv s, *old = tev_arg(a, 0, "old"), *nw = tev_arg(a, 1, "new"), *cnt = tev_arg(a, 2, "count");
    jv so, sn;
    if (!old || !nw)
        return tev_fail(e, n, "replace needs old and new strings");
    if (tev_to_str(e, n, v, &s))
        return -1;
    if (tev_to_str(e, n, *old, &so))
        return jv_unref(s), -1;
    if (tev_to_str(e, n, *nw, &sn))
        return jv_unref(s), jv_unref(so), -1;
    int rc = tev_str_replace(e, n, s, so, sn, cnt && is_int(*cnt) ? as_int(*cnt) : -1, out);
    jv_unref(s);
    jv_unref(so);
    jv_unref(sn);
    return rc;
}

/* list: the items of anything iterable, as a fresh list */
static int filter_list(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return tev_copy_list(e, n, v, out);
}

/* items: a mapping's (key, value) pairs as tuples; undefined gives an empty list */
static int filter_items(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    if (v.t == JV_UNDEF) {
        *out = jv_list(&e->heap, 0, false);
        return tev_built(e, n, out);
    }
    if (v.t != JV_DICT)
        return tev_fail(e, n, "Can only get item pairs from a mapping.");
    *out = jv_list(&e->heap, v.u.d->n, false);
    for (size_t i = 0; i < v.u.d->n && out->t == JV_LIST; i++) {
        jv pair = jv_list(&e->heap, 2, true);
        if (pair.t != JV_LIST)
            break;
        jv_list_push(pair, jv_ref(v.u.d->k[i]));
        jv_list_push(pair, jv_ref(v.u.d->v[i]));
        jv_list_push(*out, pair);
    }
    return tev_built(e, n, out);
}

/* select(test, *args), reject, selectattr(attr, test, *args), rejectattr */
static int filter_select(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return select_items(e, n, v, a, false, true, out);
}

static int filter_reject(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return select_items(e, n, v, a, false, false, out);
}

static int filter_selectattr(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return select_items(e, n, v, a, true, true, out);
}

static int filter_rejectattr(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    return select_items(e, n, v, a, true, false, out);
}

/* map(filter_name, *args) or map(attribute=path, default=None); a falsy value maps to [] */
static int filter_map(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv items, *attr = tev_arg(a, (size_t)-1, "attribute"), *dflt = tev_arg(a, (size_t)-1, "default");
    if (!jv_truthy(v)) {
        *out = jv_list(&e->heap, 0, false);
        return tev_built(e, n, out);
    }
    if (!attr && (!a->npos || a->pos[0].t != JV_STR))
        return tev_fail(e, n, "map needs a filter name or attribute=");
    if (tev_iterate(e, n, v, &items))
        return -1;
    *out = jv_list(&e->heap, items.u.l->n, false);
    cargs rest = {a->pos + (a->npos ? 1 : 0), a->npos ? a->npos - 1 : 0, NULL, NULL, 0};
    for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST; i++) {
        jv r;
        int rc = attr ? get_path(e, n, items.u.l->v[i], *attr, &r)
                      : tev_filter(e, n, a->pos[0].u.s->s, items.u.l->v[i], &rest, &r);
        if (rc) {
            jv_unref(items);
            jv_drop(out);
            return -1;
        }
        if (attr && dflt && r.t == JV_UNDEF) {
            jv_unref(r);
            r = jv_ref(*dflt);
        }
        jv_list_push(*out, r);
    }
    jv_unref(items);
    return tev_built(e, n, out);
}

/* first, last: the first / last item; undefined (with jinja2's hint) when empty; last of a
 * generator is a TypeError */
static int filter_first(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv items;
    if (fname(name, "last") && v.t == JV_LIST && v.u.l->gen)
        return tev_fail(e, n, "'generator' object is not reversible");
    if (v.t == JV_STR && fname(name, "last") == false && v.u.s->len == 0) {
        *out = jv_undef_hint(&e->heap, "No first item, sequence was empty.");
        return 0;
    }
    if (tev_iterate(e, n, v, &items))
        return -1;
    if (!items.u.l->n)
        *out = jv_undef_hint(&e->heap, "No %s item, sequence was empty.", name);
    else
        *out = jv_ref(items.u.l->v[name[0] == 'f' ? 0 : items.u.l->n - 1]);
    jv_unref(items);
    return 0;
}

/* reverse: a string reversed, or the items in reverse order */
static int filter_reverse(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    if (v.t == JV_STR) {
        jv s = jv_int(-1), none = jv_none();
        return tev_slice(e, n, v, none, none, s, out);
    }
    if (tev_copy_list(e, n, v, out))
        return -1;
    jlist *l = out->u.l;
    for (size_t i = 0; i < l->n / 2; i++) {
        jv t = l->v[i];
        l->v[i] = l->v[l->n - 1 - i];
        l->v[l->n - 1 - i] = t;
    }
    return 0;
}

/* sort(reverse=False, case_sensitive=False, attribute=None): a stable sort, as Python's sorted() */
static int filter_sort(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *rev = tev_arg(a, 0, "reverse"), *cs = tev_arg(a, 1, "case_sensitive"), *attr = tev_arg(a, 2, "attribute");
    if (tev_copy_list(e, n, v, out))
        return -1;
    if (sort_list(e, n, *out, attr, cs && jv_truthy(*cs), rev && jv_truthy(*rev), -1))
        return jv_drop(out), -1;
    return 0;
}

/* dictsort(case_sensitive=False, by='key', reverse=False): a mapping's pairs sorted by key or value */
static int filter_dictsort(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *cs = tev_arg(a, 0, "case_sensitive"), *by = tev_arg(a, 1, "by"), *rev = tev_arg(a, 2, "reverse");
    if (v.t != JV_DICT)
        return tev_fail(e, n, "dictsort needs a mapping, got %s", jv_type_name(v));
    int pos = by && by->t == JV_STR && !strcmp(by->u.s->s, "value") ? 1 : 0;
    cargs none = {0};
    if (filter_items(e, n, "items", v, &none, out))
        return -1;
    if (sort_list(e, n, *out, NULL, cs && jv_truthy(*cs), rev && jv_truthy(*rev), pos))
        return jv_drop(out), -1;
    return 0;
}

/* unique(case_sensitive=False, attribute=None): first occurrences, in order */
static int filter_unique(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv items, *cs = tev_arg(a, 0, "case_sensitive"), *attr = tev_arg(a, 1, "attribute");
    if (tev_iterate(e, n, v, &items))
        return -1;
    *out = jv_list(&e->heap, 0, false);
    jv seen = jv_list(&e->heap, 0, false);
    for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST && seen.t == JV_LIST; i++) {
        jv key, x = items.u.l->v[i];
        if (attr ? get_path(e, n, x, *attr, &key) : (key = jv_ref(x), 0))
            break;
        if (!(cs && jv_truthy(*cs)) && key.t == JV_STR) {
            jv low;
            int rc = tev_str_case(e, n, key, 'l', &low);
            jv_unref(key);
            if (rc)
                break;
            key = low;
        }
        bool dup;
        tev_contains(e, n, key, seen, &dup);
        if (!dup) {
            jv_list_push(seen, key);
            jv_list_push(*out, jv_ref(x));
        } else {
            jv_unref(key);
        }
    }
    jv_unref(items);
    jv_unref(seen);
    if (e->failed)
        return jv_drop(out), -1;
    return tev_built(e, n, out);
}

/* min, max (case_sensitive=False, attribute=None): undefined (with a hint) when empty */
static int filter_min(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv items, *cs = tev_arg(a, 0, "case_sensitive"), *attr = tev_arg(a, 1, "attribute");
    if (tev_copy_list(e, n, v, &items))
        return -1;
    if (sort_list(e, n, items, attr, cs && jv_truthy(*cs), false, -1))
        return jv_unref(items), -1;
    if (!items.u.l->n)
        *out = jv_undef_hint(&e->heap, "No aggregated item, sequence was empty.");
    else
        *out = jv_ref(items.u.l->v[name[1] == 'i' ? 0 : items.u.l->n - 1]);
    jv_unref(items);
    return 0;
}

/* sum(attribute=None, start=0): Python + over the items */
static int filter_sum(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv items, *attr = tev_arg(a, 0, "attribute"), *start = tev_arg(a, 1, "start");
    if (tev_iterate(e, n, v, &items))
        return -1;
    jv acc = start ? jv_ref(*start) : jv_int(0);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv x, r;
        if (attr ? get_path(e, n, items.u.l->v[i], *attr, &x) : (x = jv_ref(items.u.l->v[i]), 0))
            break;
        int rc = tev_arith(e, n, OP_ADD, acc, x, &r);
        jv_unref(x);
        if (rc)
            break;
        jv_unref(acc);
        acc = r;
    }
    jv_unref(items);
    if (e->failed)
        return jv_unref(acc), -1;
    *out = acc;
    return 0;
}

/* abs: Python abs() of a number */
static int filter_abs(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    if (v.t == JV_FLOAT)
        *out = jv_float(fabs(v.u.f));
    else if (is_int(v)) {
        if (as_int(v) == INT64_MIN)
            return tev_fail(e, n, "integer overflow in abs");
        *out = jv_int(as_int(v) < 0 ? -as_int(v) : as_int(v));
    } else
        return tev_fail(e, n, "bad operand type for abs(): '%s'", jv_type_name(v));
    return 0;
}

/* int(default=0, base=10): Python int() of a number or string, the default when it fails */
static int filter_int(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *dflt = tev_arg(a, 0, "default"), *base = tev_arg(a, 1, "base");
    int64_t r;
    double d;
    if (v.t == JV_UNDEF)
        return tev_fail_undef(e, n, v);
    if (is_int(v))
        *out = jv_int(as_int(v));
    else if (v.t == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18)
        *out = jv_int((int64_t)v.u.f);
    else if (v.t == JV_STR && parse_pyint(v.u.s->s, base && is_int(*base) ? (int)as_int(*base) : 10, &r))
        *out = jv_int(r);
    else if (v.t == JV_STR && parse_pyfloat(v.u.s->s, &d) && isfinite(d) && fabs(d) < 9.2e18)
        *out = jv_int((int64_t)d);
    else
        *out = dflt ? jv_ref(*dflt) : jv_int(0);
    return 0;
}

/* float(default=0.0): Python float() of a number or string, the default when it fails */
static int filter_float(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *dflt = tev_arg(a, 0, "default");
    double d;
    if (v.t == JV_UNDEF)
        return tev_fail_undef(e, n, v);
    if (is_num(v))
        *out = jv_float(as_num(v));
    else if (v.t == JV_STR && parse_pyfloat(v.u.s->s, &d))
        *out = jv_float(d);
    else
        *out = dflt ? jv_ref(*dflt) : jv_float(0.0);
    return 0;
}

/* round(precision=0, method='common'): Python round (ties to even), ceil or floor */
static int filter_round(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *prec = tev_arg(a, 0, "precision"), *method = tev_arg(a, 1, "method");
    if (!is_num(v))
        return tev_fail(e, n, "round needs a number, got %s", jv_type_name(v));
    double x = as_num(v), m = pow(10.0, prec && is_int(*prec) ? (double)as_int(*prec) : 0.0);
    const char *md = method && method->t == JV_STR ? method->u.s->s : "common";
    double r;
    if (!strcmp(md, "common") && is_int(v))
        return *out = jv_int(as_int(v)), 0; /* Python round(int, k) is int */
    if (!strcmp(md, "common"))
        r = nearbyint(x * m) / m;
    else if (!strcmp(md, "ceil"))
        r = ceil(x * m) / m;
    else if (!strcmp(md, "floor"))
        r = floor(x * m) / m;
    else
        return tev_fail(e, n, "method must be common, ceil or floor");
    *out = jv_float(r);
    return 0;
}

/* attr(name): obj.name, as tev_getattr resolves it */
static int filter_attr(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    jv *nm = tev_arg(a, 0, "name");
    if (!nm || nm->t != JV_STR)
        return tev_fail(e, n, "attr needs a name");
    return tev_getattr(e, n, v, nm->u.s->s, out);
}

/* Every filter by name (aliases share a function).  gen: jinja2 returns a generator, so the result
 * list is flagged `gen` (truthy when empty, no len(), compares by identity); reverse does for lists
 * only (a string reverses to a string). */
enum { GEN_NEVER, GEN_ALWAYS, GEN_UNLESS_STR };
static const struct filter_def {
    const char *name;
    filter_fn fn;
    int gen;
} FILTERS[] = {
    {"abs", filter_abs, GEN_NEVER},           {"attr", filter_attr, GEN_NEVER},
    {"capitalize", filter_upper, GEN_NEVER},  {"count", filter_length, GEN_NEVER},
    {"d", filter_default, GEN_NEVER},         {"default", filter_default, GEN_NEVER},
    {"dictsort", filter_dictsort, GEN_NEVER}, {"e", filter_escape, GEN_NEVER},
    {"escape", filter_escape, GEN_NEVER},     {"first", filter_first, GEN_NEVER},
    {"float", filter_float, GEN_NEVER},       {"indent", filter_indent, GEN_NEVER},
    {"int", filter_int, GEN_NEVER},           {"items", filter_items, GEN_ALWAYS},
    {"join", filter_join, GEN_NEVER},         {"last", filter_first, GEN_NEVER},
    {"length", filter_length, GEN_NEVER},     {"list", filter_list, GEN_NEVER},
    {"lower", filter_upper, GEN_NEVER},       {"map", filter_map, GEN_ALWAYS},
    {"max", filter_min, GEN_NEVER},           {"min", filter_min, GEN_NEVER},
    {"reject", filter_reject, GEN_ALWAYS},    {"rejectattr", filter_rejectattr, GEN_ALWAYS},
    {"replace", filter_replace, GEN_NEVER},   {"reverse", filter_reverse, GEN_UNLESS_STR},
    {"round", filter_round, GEN_NEVER},       {"safe", filter_safe, GEN_NEVER},
    {"select", filter_select, GEN_ALWAYS},    {"selectattr", filter_selectattr, GEN_ALWAYS},
    {"sort", filter_sort, GEN_NEVER},         {"string", filter_string, GEN_NEVER},
    {"sum", filter_sum, GEN_NEVER},           {"title", filter_upper, GEN_NEVER},
    {"tojson", filter_tojson, GEN_NEVER},     {"trim", filter_trim, GEN_NEVER},
    {"unique", filter_unique, GEN_ALWAYS},    {"upper", filter_upper, GEN_NEVER},
};

int tev_filter(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    *out = jv_undef();
    if (tev_tick(e, n, 1))
        return -1;
    const struct filter_def *f = NULL;
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0] && !f; i++)
        if (!strcmp(FILTERS[i].name, name))
            f = &FILTERS[i];
    if (!f)
        return tev_fail(e, n, "filter '%s' is not implemented", name);
    int rc = f->fn(e, n, name, v, a, out);
    if (rc)
        jv_drop(out);
    else if (out->t == JV_LIST && (f->gen == GEN_ALWAYS || (f->gen == GEN_UNLESS_STR && v.t != JV_STR)))
        out->u.l->gen = true;
    return rc;
}

int tev_items(ev *e, const node *n, jv v, jv *out)
{
    cargs none = {0};
    return filter_items(e, n, "items", v, &none, out);
}
