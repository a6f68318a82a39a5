/*
 * template_filters.c — chat templates: the jinja2 filters, tests and the
 * str/dict/list methods templates call, each matching CPython/jinja2 3.1
 * output byte for byte for the inputs chat templates pass (trim, tojson,
 * join, selectattr, map, items, default, indent, dictsort, str.split/strip/
 * startswith, …).
 *
 * Does not own: evaluation, scoping, operators (template_eval.c); value
 * printing and JSON encoding (jinja_value.c).
 *
 * Key decisions:
 *  - Filters that jinja2 implements as generators (select, reject,
 *    selectattr, rejectattr, map, unique, items; reverse of a list) return a
 *    list flagged `gen`: truthy even when empty, no len(), compares by
 *    identity — the observable behaviour templates can hit.  Generators are
 *    evaluated eagerly, so an error inside one surfaces at the filter even if
 *    the result is never consumed (jinja2 would stay silent), and a generator
 *    can be iterated twice (jinja2's would be empty the second time).
 *  - Case mapping uses utf8proc's simple mappings plus the one special case
 *    chat text meets (ß → SS/Ss); Python's full SpecialCasing is out of scope.
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

/* ---------------------------------------------------------------- string helpers */

/* Length of the Python-whitespace code point at p[i], 0 if none. */
static size_t ws_len(const char *p, size_t len, size_t i)
{
    uint32_t c;
    int k = jv_utf8_decode(p + i, len - i, &c);
    return jv_py_isspace(c) ? (size_t)k : 0;
}

/* Code points of a string into a fresh array (caller frees). */
static uint32_t *decode_all(const char *s, size_t len, size_t *n)
{
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    size_t k = 0;
    if (!cp)
        return NULL;
    for (size_t i = 0; i < len;)
        i += (size_t)jv_utf8_decode(s + i, len - i, &cp[k++]);
    *n = k;
    return cp;
}

static bool cp_in(uint32_t c, const uint32_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == c)
            return true;
    return false;
}

/* str.strip/lstrip/rstrip(chars): which = 1 left, 2 right, 3 both; chars NULL = whitespace. */
static int str_strip(ev *e, const node *n, jv s, jv *chars, int which, jv *out)
{
    if (s.t != JV_STR)
        return tev_fail(e, n, "strip expects a string, got %s", jv_type_name(s));
    uint32_t *set = NULL;
    size_t nset = 0;
    bool ws = !chars || chars->t == JV_NONE;
    if (!ws) {
        if (chars->t != JV_STR)
            return tev_fail(e, n, "strip arg must be None or str");
        if (!(set = decode_all(chars->u.s->s, chars->u.s->len, &nset)))
            return tev_fail(e, n, "out of memory");
    }
    const char *p = s.u.s->s;
    size_t a = 0, b = s.u.s->len;
    if (which & 1)
        while (a < b) {
            uint32_t c;
            int k = jv_utf8_decode(p + a, b - a, &c);
            if (ws ? !jv_py_isspace(c) : !cp_in(c, set, nset))
                break;
            a += (size_t)k;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80)
                st--;
            uint32_t c;
            jv_utf8_decode(p + st, b - st, &c);
            if (ws ? !jv_py_isspace(c) : !cp_in(c, set, nset))
                break;
            b = st;
        }
    free(set);
    *out = tev_str(e, p + a, b - a);
    return tev_built(e, n, out);
}

/* Maps each code point: mode 'u' upper, 'l' lower, 't' title, 'c' capitalize. */
static int str_case(ev *e, const node *n, jv s, char mode, jv *out)
{
    jbuf b = {0};
    const char *p = s.u.s->s;
    size_t len = s.u.s->len;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < len;) {
        uint32_t c, r;
        int k = jv_utf8_decode(p + i, len - i, &c);
        i += (size_t)k;
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
        bool cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
        bool up = mode == 'u', title = (mode == 't' && !prev_cased) || (mode == 'c' && first);
        if (up)
            r = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
        else if (title)
            r = (uint32_t)utf8proc_totitle((utf8proc_int32_t)c);
        else
            r = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
        prev_cased = cased;
        first = false;
        if (c == 0xDF && (up || title)) { /* SpecialCasing: ß upper-cases to "SS", title-cases to "Ss" */
            jbuf_puts(&b, up ? "SS" : "Ss");
            continue;
        }
        char enc[4];
        jbuf_put(&b, enc, (size_t)jv_utf8_encode(r, enc));
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return tev_built(e, n, out);
}

static int str_replace(ev *e, const node *n, jv s, jv old, jv new_, int64_t count, jv *out)
{
    if (s.t != JV_STR || old.t != JV_STR || new_.t != JV_STR)
        return tev_fail(e, n, "replace() arguments must be str");
    jbuf b = {.max = e->lim->max_output};
    const char *p = s.u.s->s;
    size_t len = s.u.s->len, ol = old.u.s->len, i = 0;
    int64_t done = 0;
    if (ol == 0) {
        /* Python inserts `new` between every code point and at both ends */
        for (;;) {
            if (count >= 0 && done >= count)
                break;
            jbuf_put(&b, new_.u.s->s, new_.u.s->len);
            done++;
            if (i >= len)
                break;
            size_t k = jv_utf8_offset(p + i, len - i, 1);
            jbuf_put(&b, p + i, k);
            i += k;
        }
        jbuf_put(&b, p + i, len - i);
    } else {
        while (i < len) {
            const char *hit = (count < 0 || done < count) ? memmem(p + i, len - i, old.u.s->s, ol) : NULL;
            if (!hit)
                break;
            jbuf_put(&b, p + i, (size_t)(hit - (p + i)));
            jbuf_put(&b, new_.u.s->s, new_.u.s->len);
            i = (size_t)(hit - p) + ol;
            done++;
        }
        jbuf_put(&b, p + i, len - i);
    }
    if (b.over) {
        jbuf_free(&b);
        return tev_fail(e, n, "replace() result exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    if (tev_tick(e, n, b.n / 64))
        return jbuf_free(&b), -1;
    jbuf_free(&b);
    return tev_built(e, n, out);
}

/* str.split / rsplit (right = true) with Python semantics. */
static int str_split(ev *e, const node *n, jv s, jv *sep, int64_t maxsplit, bool right, jv *out)
{
    const char *p = s.u.s->s;
    size_t len = s.u.s->len;
    jv parts = jv_list(&e->heap, 0, false);
    if (parts.t != JV_LIST)
        return tev_built(e, n, out);
    if (sep && sep->t != JV_NONE && sep->t != JV_STR) {
        jv_unref(parts);
        return tev_fail(e, n, "must be str or None, not %s", jv_type_name(*sep));
    }
    if (!sep || sep->t == JV_NONE) {
        /* whitespace runs; collect from the chosen side */
        size_t *ranges = malloc((len + 1) * 2 * sizeof *ranges), nr = 0;
        if (!ranges)
            return jv_unref(parts), tev_fail(e, n, "out of memory");
        size_t i = 0;
        while (i < len) {
            while (i < len && ws_len(p, len, i))
                i += ws_len(p, len, i);
            if (i >= len)
                break;
            size_t a = i;
            while (i < len && !ws_len(p, len, i))
                i += jv_utf8_offset(p + i, len - i, 1);
            ranges[2 * nr] = a;
            ranges[2 * nr + 1] = i;
            nr++;
        }
        if (maxsplit >= 0 && nr > (size_t)maxsplit + 1) {
            /* merge the tail (or head for rsplit) into one piece keeping inner whitespace */
            if (!right) {
                ranges[2 * maxsplit + 1] = ranges[2 * nr - 1];
                /* the last piece keeps trailing text up to end minus trailing whitespace */
                nr = (size_t)maxsplit + 1;
            } else {
                size_t keep = (size_t)maxsplit + 1, drop = nr - keep;
                ranges[1] = ranges[2 * drop + 1];
                memmove(ranges + 2, ranges + 2 * (drop + 1), (keep - 1) * 2 * sizeof *ranges);
                nr = keep;
            }
        }
        for (size_t k = 0; k < nr; k++)
            jv_list_push(parts, tev_str(e, p + ranges[2 * k], ranges[2 * k + 1] - ranges[2 * k]));
        free(ranges);
    } else {
        const char *sp = sep->u.s->s;
        size_t sl = sep->u.s->len;
        if (!sl)
            return jv_unref(parts), tev_fail(e, n, "empty separator");
        if (!right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, len - i, sp, sl) : NULL;
                if (!hit)
                    break;
                jv_list_push(parts, tev_str(e, p + i, (size_t)(hit - (p + i))));
                i = (size_t)(hit - p) + sl;
                done++;
            }
            jv_list_push(parts, tev_str(e, p + i, len - i));
        } else {
            /* find all split points from the right */
            size_t end = len;
            int64_t done = 0;
            jv rev = jv_list(&e->heap, 0, false);
            while ((maxsplit < 0 || done < maxsplit) && end >= sl) {
                size_t k = end - sl + 1, found = (size_t)-1;
                while (k-- > 0)
                    if (!memcmp(p + k, sp, sl)) {
                        found = k;
                        break;
                    }
                if (found == (size_t)-1)
                    break;
                jv_list_push(rev, tev_str(e, p + found + sl, end - found - sl));
                end = found;
                done++;
            }
            jv_list_push(parts, tev_str(e, p, end));
            if (rev.t == JV_LIST)
                for (size_t k = rev.u.l->n; k-- > 0;)
                    jv_list_push(parts, jv_ref(rev.u.l->v[k]));
            jv_unref(rev);
        }
    }
    *out = parts;
    if (tev_tick(e, n, len / 64))
        return -1;
    return tev_built(e, n, out);
}

/* Python str.splitlines() boundaries. */
static size_t line_break_len(const char *p, size_t len, size_t i)
{
    uint32_t c;
    int k = jv_utf8_decode(p + i, len - i, &c);
    if (c == '\r' && i + 1 < len && p[i + 1] == '\n')
        return 2;
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
        c == 0x2028 || c == 0x2029)
        return (size_t)k;
    return 0;
}

static int str_splitlines(ev *e, const node *n, jv s, jv *out)
{
    const char *p = s.u.s->s;
    size_t len = s.u.s->len, a = 0, i = 0;
    *out = jv_list(&e->heap, 0, false);
    while (i < len && out->t == JV_LIST) {
        size_t k = line_break_len(p, len, i);
        if (k) {
            jv_list_push(*out, tev_str(e, p + a, i - a));
            i += k;
            a = i;
        } else {
            i += jv_utf8_offset(p + i, len - i, 1);
        }
    }
    if (a < len && out->t == JV_LIST)
        jv_list_push(*out, tev_str(e, p + a, len - a));
    return tev_built(e, n, out);
}

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
        if (str_case(e, n, v, name[0] == 'l' ? 'l' : 'u', &t))
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

static bool fname(const char *name, const char *x)
{
    return !strcmp(name, x);
}

/* select/reject/selectattr/rejectattr: keep items whose test (or truthiness) == want. */
static int filter_select(ev *e, const node *n, jv v, cargs *a, bool by_attr, bool want, jv *out)
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

static int filter_join(ev *e, const node *n, jv v, cargs *a, jv *out)
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

static int filter_tojson(ev *e, const node *n, jv v, cargs *a, jv *out)
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

static int filter_indent(ev *e, const node *n, jv v, cargs *a, jv *out)
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
    if (tev_oom_check(e, n) || str_splitlines(e, n, t, &lines)) {
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
        if (str_case(c->e, c->n, a, 'l', &la))
            return c->failed = true, 0;
        if (str_case(c->e, c->n, b, 'l', &lb))
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

static int tev_copy_list(ev *e, const node *n, jv v, jv *out)
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

static int apply_filter_inner(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    if (fname(name, "default") || fname(name, "d")) {
        jv *dv = tev_arg(a, 0, "default_value"), *boolean = tev_arg(a, 1, "boolean");
        bool use = v.t == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        if (use)
            *out = dv ? jv_ref(*dv) : tev_str(e, "", 0);
        else
            *out = jv_ref(v);
        return tev_built(e, n, out);
    }
    if (fname(name, "length") || fname(name, "count")) {
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
    if (fname(name, "string"))
        return tev_to_str(e, n, v, out);
    if (fname(name, "safe"))
        return v.t == JV_STR ? (*out = jv_ref(v), 0) : tev_to_str(e, n, v, out);
    if (fname(name, "trim")) {
        jv s;
        if (tev_to_str(e, n, v, &s))
            return -1;
        int rc = str_strip(e, n, s, tev_arg(a, 0, "chars"), 3, out);
        jv_unref(s);
        return rc;
    }
    if (fname(name, "upper") || fname(name, "lower") || fname(name, "title") || fname(name, "capitalize")) {
        jv s;
        if (tev_to_str(e, n, v, &s))
            return -1;
        int rc = str_case(e, n, s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 't' ? 't' : 'c', out);
        jv_unref(s);
        return rc;
    }
    if (fname(name, "escape") || fname(name, "e")) {
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
    if (fname(name, "replace")) {
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
        int rc = str_replace(e, n, s, so, sn, cnt && is_int(*cnt) ? as_int(*cnt) : -1, out);
        jv_unref(s);
        jv_unref(so);
        jv_unref(sn);
        return rc;
    }
    if (fname(name, "tojson"))
        return filter_tojson(e, n, v, a, out);
    if (fname(name, "join"))
        return filter_join(e, n, v, a, out);
    if (fname(name, "list"))
        return tev_copy_list(e, n, v, out);
    if (fname(name, "items")) {
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
    if (fname(name, "select"))
        return filter_select(e, n, v, a, false, true, out);
    if (fname(name, "reject"))
        return filter_select(e, n, v, a, false, false, out);
    if (fname(name, "selectattr"))
        return filter_select(e, n, v, a, true, true, out);
    if (fname(name, "rejectattr"))
        return filter_select(e, n, v, a, true, false, out);
    if (fname(name, "map")) {
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
    if (fname(name, "first") || fname(name, "last")) {
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
    if (fname(name, "reverse")) {
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
    if (fname(name, "sort")) {
        jv *rev = tev_arg(a, 0, "reverse"), *cs = tev_arg(a, 1, "case_sensitive"), *attr = tev_arg(a, 2, "attribute");
        if (tev_copy_list(e, n, v, out))
            return -1;
        if (sort_list(e, n, *out, attr, cs && jv_truthy(*cs), rev && jv_truthy(*rev), -1))
            return jv_drop(out), -1;
        return 0;
    }
    if (fname(name, "dictsort")) {
        jv *cs = tev_arg(a, 0, "case_sensitive"), *by = tev_arg(a, 1, "by"), *rev = tev_arg(a, 2, "reverse");
        if (v.t != JV_DICT)
            return tev_fail(e, n, "dictsort needs a mapping, got %s", jv_type_name(v));
        int pos = by && by->t == JV_STR && !strcmp(by->u.s->s, "value") ? 1 : 0;
        cargs none = {0};
        if (apply_filter_inner(e, n, "items", v, &none, out))
            return -1;
        if (sort_list(e, n, *out, NULL, cs && jv_truthy(*cs), rev && jv_truthy(*rev), pos))
            return jv_drop(out), -1;
        return 0;
    }
    if (fname(name, "unique")) {
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
                int rc = str_case(e, n, key, 'l', &low);
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
    if (fname(name, "min") || fname(name, "max")) {
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
    if (fname(name, "sum")) {
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
    if (fname(name, "abs")) {
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
    if (fname(name, "int")) {
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
    if (fname(name, "float")) {
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
    if (fname(name, "round")) {
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
    if (fname(name, "indent"))
        return filter_indent(e, n, v, a, out);
    if (fname(name, "attr")) {
        jv *nm = tev_arg(a, 0, "name");
        if (!nm || nm->t != JV_STR)
            return tev_fail(e, n, "attr needs a name");
        return tev_getattr(e, n, v, nm->u.s->s, out);
    }
    return tev_fail(e, n, "filter '%s' is not implemented", name);
}

int tev_filter(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    *out = jv_undef();
    if (tev_tick(e, n, 1))
        return -1;
    int rc = apply_filter_inner(e, n, name, v, a, out);
    if (rc)
        jv_drop(out);
    static const char *const lazy[] = {"select", "reject", "selectattr", "rejectattr", "map", "unique", "items", NULL};
    if (!rc && out->t == JV_LIST && tev_find_name(lazy, name))
        out->u.l->gen = true; /* jinja returns generators */
    if (!rc && out->t == JV_LIST && !strcmp(name, "reverse") && v.t != JV_STR)
        out->u.l->gen = true; /* an iterator */
    return rc;
}

/* ---------------------------------------------------------------- methods */

static int check_str_arg(ev *e, const node *n, jv *v, const char *meth)
{
    if (!v || v->t != JV_STR)
        return tev_fail(e, n, "%s() needs a string argument", meth);
    return 0;
}

static bool has_affix(jv s, jv x, bool end)
{
    if (x.u.s->len > s.u.s->len)
        return false;
    return !memcmp(s.u.s->s + (end ? s.u.s->len - x.u.s->len : 0), x.u.s->s, x.u.s->len);
}

/* str.format with auto/manual numbering and names; no format specs. */
static int str_format(ev *e, const node *n, jv s, cargs *a, jv *out)
{
    jbuf b = {.max = e->lim->max_output};
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    size_t autoi = 0;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') {
            jbuf_putc(&b, '{');
            p += 2;
            continue;
        }
        if (*p == '}' && p + 1 < end && p[1] == '}') {
            jbuf_putc(&b, '}');
            p += 2;
            continue;
        }
        if (*p == '}') {
            jbuf_free(&b);
            return tev_fail(e, n, "Single '}' encountered in format string");
        }
        if (*p != '{') {
            jbuf_putc(&b, *p++);
            continue;
        }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) {
            jbuf_free(&b);
            return tev_fail(e, n, "Single '{' encountered in format string");
        }
        const char *f = p + 1;
        size_t fl = (size_t)(q - f);
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '[', fl) || memchr(f, '.', fl)) {
            jbuf_free(&b);
            return tev_fail(e, n, "str.format fields with conversions or format specs are not supported");
        }
        jv *val = NULL;
        if (!fl)
            val = tev_arg(a, autoi++, NULL);
        else if (f[0] >= '0' && f[0] <= '9')
            val = tev_arg(a, (size_t)strtoul(f, NULL, 10), NULL);
        else {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(fl < 63 ? fl : 63), f);
            for (size_t k = 0; k < a->nkw; k++)
                if (!strcmp(a->kwn[k], nm))
                    val = &a->kw[k];
        }
        if (!val) {
            jbuf_free(&b);
            return tev_fail(e, n, "str.format: no argument for field '{%.*s}'", (int)fl, f);
        }
        jv_to_str(&b, *val);
        p = q + 1;
    }
    if (b.over) {
        jbuf_free(&b);
        return tev_fail(e, n, "format result exceeds the output limit");
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return tev_built(e, n, out);
}

static int str_method(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *x = tev_arg(a, 0, NULL);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool end = m[0] == 'e', r = false;
        if (x && x->t == JV_LIST && x->u.l->tuple) {
            for (size_t i = 0; i < x->u.l->n; i++) {
                if (check_str_arg(e, n, &x->u.l->v[i], m))
                    return -1;
                r = r || has_affix(s, x->u.l->v[i], end);
            }
        } else {
            if (check_str_arg(e, n, x, m))
                return -1;
            r = has_affix(s, *x, end);
        }
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv *sep = tev_arg(a, 0, "sep"), *mx = tev_arg(a, 1, "maxsplit");
        return str_split(e, n, s, sep, mx && is_int(*mx) ? as_int(*mx) : -1, m[0] == 'r', out);
    }
    if (!strcmp(m, "strip"))
        return str_strip(e, n, s, x, 3, out);
    if (!strcmp(m, "lstrip"))
        return str_strip(e, n, s, x, 1, out);
    if (!strcmp(m, "rstrip"))
        return str_strip(e, n, s, x, 2, out);
    if (!strcmp(m, "upper"))
        return str_case(e, n, s, 'u', out);
    if (!strcmp(m, "lower"))
        return str_case(e, n, s, 'l', out);
    if (!strcmp(m, "title"))
        return str_case(e, n, s, 't', out);
    if (!strcmp(m, "capitalize"))
        return str_case(e, n, s, 'c', out);
    if (!strcmp(m, "replace")) {
        jv *nw = tev_arg(a, 1, NULL), *cnt = tev_arg(a, 2, "count");
        if (!x || !nw)
            return tev_fail(e, n, "replace() takes at least 2 arguments");
        return str_replace(e, n, s, *x, *nw, cnt && is_int(*cnt) ? as_int(*cnt) : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        if (check_str_arg(e, n, x, m))
            return -1;
        const char *p = s.u.s->s, *hit = NULL;
        size_t len = s.u.s->len, xl = x->u.s->len;
        if (!strcmp(m, "count")) {
            int64_t c = 0;
            if (!xl)
                c = (int64_t)jv_utf8_count(p, len) + 1;
            else
                for (size_t i = 0; i + xl <= len && (hit = memmem(p + i, len - i, x->u.s->s, xl)); c++)
                    i = (size_t)(hit - p) + xl;
            *out = jv_int(c);
            return 0;
        }
        if (m[0] == 'r') {
            for (size_t k = len + 1 >= xl + 1 ? len - xl + 1 : 0; k-- > 0;)
                if (!memcmp(p + k, x->u.s->s, xl)) {
                    hit = p + k;
                    break;
                }
        } else {
            hit = xl ? memmem(p, len, x->u.s->s, xl) : p;
        }
        if (!hit && m[0] == 'i')
            return tev_fail(e, n, "substring not found");
        *out = jv_int(hit ? (int64_t)jv_utf8_count(p, (size_t)(hit - p)) : -1);
        return 0;
    }
    if (!strcmp(m, "join")) {
        jv items;
        if (!x)
            return tev_fail(e, n, "join() takes exactly one argument");
        if (tev_iterate(e, n, *x, &items))
            return -1;
        jbuf b = {.max = e->lim->max_output};
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (items.u.l->v[i].t != JV_STR) {
                jv_unref(items);
                jbuf_free(&b);
                return tev_fail(e, n, "sequence item %zu: expected str instance, %s found", i,
                                jv_type_name(items.u.l->v[i]));
            }
            if (i)
                jbuf_put(&b, s.u.s->s, s.u.s->len);
            jv_to_str(&b, items.u.l->v[i]);
        }
        jv_unref(items);
        if (b.over) {
            jbuf_free(&b);
            return tev_fail(e, n, "join result exceeds the output limit");
        }
        *out = tev_str(e, b.p ? b.p : "", b.n);
        jbuf_free(&b);
        return tev_built(e, n, out);
    }
    if (!strncmp(m, "is", 2)) {
        bool r = s.u.s->len > 0, any_cased = false, lower = true, upper = true;
        for (size_t i = 0; i < s.u.s->len;) {
            uint32_t c;
            i += (size_t)jv_utf8_decode(s.u.s->s + i, s.u.s->len - i, &c);
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
            bool digit = cat == UTF8PROC_CATEGORY_ND,
                 alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT)
                any_cased = true, lower = false;
            if (cat == UTF8PROC_CATEGORY_LL)
                any_cased = true, upper = false;
            if (!strcmp(m, "isdigit"))
                r = r && digit;
            else if (!strcmp(m, "isalpha"))
                r = r && alpha;
            else if (!strcmp(m, "isalnum"))
                r = r && (alpha || digit);
            else if (!strcmp(m, "isspace"))
                r = r && jv_py_isspace(c);
        }
        if (!strcmp(m, "islower"))
            r = any_cased && lower;
        if (!strcmp(m, "isupper"))
            r = any_cased && upper;
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "splitlines"))
        return str_splitlines(e, n, s, out);
    if (!strcmp(m, "format"))
        return str_format(e, n, s, a, out);
    if (!strcmp(m, "zfill")) {
        if (!x || !is_int(*x))
            return tev_fail(e, n, "zfill() needs an integer width");
        size_t cps = jv_utf8_count(s.u.s->s, s.u.s->len);
        int64_t w = as_int(*x);
        if (w <= (int64_t)cps)
            return *out = jv_ref(s), 0;
        if (w > (int64_t)e->lim->max_output)
            return tev_fail(e, n, "zfill width exceeds the output limit");
        jbuf b = {0};
        size_t sign = s.u.s->len && (s.u.s->s[0] == '-' || s.u.s->s[0] == '+');
        jbuf_put(&b, s.u.s->s, sign);
        for (int64_t i = 0; i < w - (int64_t)cps; i++)
            jbuf_putc(&b, '0');
        jbuf_put(&b, s.u.s->s + sign, s.u.s->len - sign);
        *out = tev_str(e, b.p, b.n);
        jbuf_free(&b);
        return tev_built(e, n, out);
    }
    return tev_fail(e, n, "str has no method '%s'", m);
}

int tev_call_method(ev *e, const node *n, jfunc *f, cargs *a, jv *out)
{
    jv self = f->self;
    const char *m = f->name;
    if (self.t == JV_STR)
        return str_method(e, n, m, self, a, out);
    if (self.t == JV_DICT) {
        cargs none = {0};
        if (!strcmp(m, "items"))
            return apply_filter_inner(e, n, "items", self, &none, out);
        if (!strcmp(m, "keys"))
            return tev_copy_list(e, n, self, out);
        if (!strcmp(m, "values")) {
            *out = jv_list(&e->heap, self.u.d->n, false);
            for (size_t i = 0; i < self.u.d->n && out->t == JV_LIST; i++)
                jv_list_push(*out, jv_ref(self.u.d->v[i]));
            return tev_built(e, n, out);
        }
        if (!strcmp(m, "get")) {
            jv *k = tev_arg(a, 0, NULL), *d = tev_arg(a, 1, NULL);
            if (!k)
                return tev_fail(e, n, "get expected at least 1 argument, got 0");
            jv *v = jv_dict_get(self, *k);
            *out = v ? jv_ref(*v) : d ? jv_ref(*d) : jv_none();
            return 0;
        }
    }
    if (self.t == JV_LIST) {
        jv *x = tev_arg(a, 0, NULL);
        if (!x)
            return tev_fail(e, n, "%s() takes exactly one argument", m);
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (jv_equal(self.u.l->v[i], *x)) {
                if (!strcmp(m, "index"))
                    return *out = jv_int((int64_t)i), 0;
                c++;
            }
        if (!strcmp(m, "index"))
            return tev_fail(e, n, "value is not in list");
        *out = jv_int(c);
        return 0;
    }
    return tev_fail(e, n, "'%s' object has no method '%s'", jv_type_name(self), m);
}
