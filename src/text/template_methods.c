/*
 * template_methods.c — chat templates: the str/dict/list methods templates
 * call (`s.strip()`, `s.split(',')`, `d.items()`, `d.get(k)`, `l.index(x)`,
 * …), each matching CPython 3 output byte for byte for the inputs chat
 * templates pass, and the string helpers the filters share with them (strip,
 * case mapping, replace, splitlines).
 *
 * Does not own: attribute access, which binds a method to its object
 * (template_ops.c, through tev_method_name); filters and tests
 * (template_filters.c); evaluation (template_eval.c).
 *
 * Key decisions:
 *  - One table (METHODS) names every method by the type it is bound to:
 *    tev_method_name answers attribute lookups from it and tev_call_method
 *    dispatches through it, so a method exists exactly when it is listed.
 *  - Case mapping uses utf8proc's simple mappings plus the one special case
 *    chat text meets (ß → SS/Ss); Python's full SpecialCasing is out of scope.
 *  - str.format supports auto/manual numbering and names, no format specs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "template_eval.h"

/* ---------------------------------------------------------------- string helpers (shared with the filters) */

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
int tev_str_strip(ev *e, const node *n, jv s, jv *chars, int which, jv *out)
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
int tev_str_case(ev *e, const node *n, jv s, char mode, jv *out)
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

int tev_str_replace(ev *e, const node *n, jv s, jv old, jv new_, int64_t count, jv *out)
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

int tev_str_splitlines(ev *e, const node *n, jv s, jv *out)
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

/* ---------------------------------------------------------------- str methods */

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

/* startswith(prefix), endswith(suffix): a string or a tuple of strings. */
static int m_affix(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *x = tev_arg(a, 0, NULL);
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

/* split(sep=None, maxsplit=-1), rsplit */
static int m_split(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *sep = tev_arg(a, 0, "sep"), *mx = tev_arg(a, 1, "maxsplit");
    return str_split(e, n, s, sep, mx && is_int(*mx) ? as_int(*mx) : -1, m[0] == 'r', out);
}

/* strip(chars=None), lstrip, rstrip */
static int m_strip(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    return tev_str_strip(e, n, s, tev_arg(a, 0, NULL), m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3, out);
}

/* upper, lower, title, capitalize */
static int m_case(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    return tev_str_case(e, n, s, m[0] == 'u' ? 'u' : m[0] == 'l' ? 'l' : m[0] == 't' ? 't' : 'c', out);
}

/* replace(old, new, count=-1) */
static int m_replace(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *x = tev_arg(a, 0, NULL), *nw = tev_arg(a, 1, NULL), *cnt = tev_arg(a, 2, "count");
    if (!x || !nw)
        return tev_fail(e, n, "replace() takes at least 2 arguments");
    return tev_str_replace(e, n, s, *x, *nw, cnt && is_int(*cnt) ? as_int(*cnt) : -1, out);
}

/* find(sub), rfind, index (find that fails when absent), count(sub): positions in code points. */
static int m_find(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *x = tev_arg(a, 0, NULL);
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

/* join(iterable): every item must be a string. */
static int m_join(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv items, *x = tev_arg(a, 0, NULL);
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

/* isdigit, isalpha, isalnum, isspace, islower, isupper: Unicode categories as CPython reads them. */
static int m_is(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    bool r = s.u.s->len > 0, any_cased = false, lower = true, upper = true;
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t c;
        i += (size_t)jv_utf8_decode(s.u.s->s + i, s.u.s->len - i, &c);
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
        bool digit = cat == UTF8PROC_CATEGORY_ND, alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
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

/* splitlines() */
static int m_splitlines(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    return tev_str_splitlines(e, n, s, out);
}

/* format(*args, **kwargs): str.format with auto/manual numbering and names; no format specs. */
static int m_format(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
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

/* zfill(width) */
static int m_zfill(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *x = tev_arg(a, 0, NULL);
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

/* ---------------------------------------------------------------- dict and list methods */

/* dict.items(): a fresh list of pairs (not a generator, unlike the items filter). */
static int m_items(ev *e, const node *n, const char *m, jv self, cargs *a, jv *out)
{
    return tev_items(e, n, self, out);
}

/* dict.keys() */
static int m_keys(ev *e, const node *n, const char *m, jv self, cargs *a, jv *out)
{
    return tev_copy_list(e, n, self, out);
}

/* dict.values() */
static int m_values(ev *e, const node *n, const char *m, jv self, cargs *a, jv *out)
{
    *out = jv_list(&e->heap, self.u.d->n, false);
    for (size_t i = 0; i < self.u.d->n && out->t == JV_LIST; i++)
        jv_list_push(*out, jv_ref(self.u.d->v[i]));
    return tev_built(e, n, out);
}

/* dict.get(key, default=None) */
static int m_get(ev *e, const node *n, const char *m, jv self, cargs *a, jv *out)
{
    jv *k = tev_arg(a, 0, NULL), *d = tev_arg(a, 1, NULL);
    if (!k)
        return tev_fail(e, n, "get expected at least 1 argument, got 0");
    jv *v = jv_dict_get(self, *k);
    *out = v ? jv_ref(*v) : d ? jv_ref(*d) : jv_none();
    return 0;
}

/* list.index(x), list.count(x) */
static int m_list_find(ev *e, const node *n, const char *m, jv self, cargs *a, jv *out)
{
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

/* ---------------------------------------------------------------- the method tables */

typedef int (*method_fn)(ev *e, const node *n, const char *m, jv self, cargs *a, jv *out);

/* Every method a template may call, by the type it is bound to (several names share a function). */
static const struct method_def {
    jv_type type;
    const char *name;
    method_fn fn;
} METHODS[] = {
    {JV_STR, "startswith", m_affix}, {JV_STR, "endswith", m_affix},   {JV_STR, "split", m_split},
    {JV_STR, "rsplit", m_split},     {JV_STR, "strip", m_strip},      {JV_STR, "lstrip", m_strip},
    {JV_STR, "rstrip", m_strip},     {JV_STR, "upper", m_case},       {JV_STR, "lower", m_case},
    {JV_STR, "title", m_case},       {JV_STR, "capitalize", m_case},  {JV_STR, "replace", m_replace},
    {JV_STR, "find", m_find},        {JV_STR, "rfind", m_find},       {JV_STR, "count", m_find},
    {JV_STR, "index", m_find},       {JV_STR, "join", m_join},        {JV_STR, "isdigit", m_is},
    {JV_STR, "isalpha", m_is},       {JV_STR, "isalnum", m_is},       {JV_STR, "isspace", m_is},
    {JV_STR, "islower", m_is},       {JV_STR, "isupper", m_is},       {JV_STR, "splitlines", m_splitlines},
    {JV_STR, "format", m_format},    {JV_STR, "zfill", m_zfill},      {JV_DICT, "items", m_items},
    {JV_DICT, "keys", m_keys},       {JV_DICT, "values", m_values},   {JV_DICT, "get", m_get},
    {JV_LIST, "index", m_list_find}, {JV_LIST, "count", m_list_find},
};

static const struct method_def *find_method(jv_type type, const char *name)
{
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].type == type && !strcmp(METHODS[i].name, name))
            return &METHODS[i];
    return NULL;
}

const char *tev_method_name(jv_type type, const char *name)
{
    const struct method_def *d = find_method(type, name);
    return d ? d->name : NULL;
}

int tev_call_method(ev *e, const node *n, jfunc *f, cargs *a, jv *out)
{
    const struct method_def *d = find_method(f->self.t, f->name);
    if (!d)
        return tev_fail(e, n, "'%s' object has no method '%s'", jv_type_name(f->self), f->name);
    return d->fn(e, n, f->name, f->self, a, out);
}
