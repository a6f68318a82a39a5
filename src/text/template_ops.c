/*
 * template_ops.c — chat templates: what jinja2's runtime does for attribute
 * and item access (`a.b`, `a[b]`, slices, the `loop` variable) and for the
 * Python operators (== < in + - * / // % ** ~), with CPython's results and
 * TypeErrors.
 *
 * Key decisions: `a.b` tries the attribute first (dict methods, str
 * methods) then the item; `a[b]` the item first; a missing one is an
 * Undefined carrying jinja2's hint, while access on an Undefined raises.
 * Slices bypass that (jinja2 compiles them to a plain subscript), so slicing
 * a non-sequence is a TypeError.  Integers are 64-bit: where Python would
 * grow a big integer, spill fails with an overflow error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template_eval.h"
#include "../base/util.h"

/* ---------------------------------------------------------------- loop variable */

static int loop_attr(ev *e, const node *n, jv loop, const char *name, jv *out)
{
    jloop *lp = loop.u.lp;
    size_t i = lp->index0, len = lp->length;
    if (!strcmp(name, "index"))
        *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0"))
        *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex"))
        *out = jv_int((int64_t)(len - i));
    else if (!strcmp(name, "revindex0"))
        *out = jv_int((int64_t)(len - i - 1));
    else if (!strcmp(name, "first"))
        *out = jv_bool(i == 0);
    else if (!strcmp(name, "last"))
        *out = jv_bool(i + 1 == len);
    else if (!strcmp(name, "length"))
        *out = jv_int((int64_t)len);
    else if (!strcmp(name, "depth"))
        *out = jv_int(lp->depth0 + 1);
    else if (!strcmp(name, "depth0"))
        *out = jv_int(lp->depth0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? jv_ref(lp->items->v[i - 1]) : jv_undef_hint(&e->heap, "there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < len ? jv_ref(lp->items->v[i + 1]) : jv_undef_hint(&e->heap, "there is no next item");
    else if (!strcmp(name, "cycle")) {
        *out = jv_func(&e->heap, JF_CYCLE, "cycle", jv_ref(loop));
        return tev_built(e, n, out);
    } else
        *out = jv_undef_hint(&e->heap, "'LoopContext' object has no attribute '%s'", name);
    return 0;
}

/* ---------------------------------------------------------------- attribute / item access */

/* jinja2 `obj.name`: attribute first, then item. */
int tev_getattr(ev *e, const node *n, jv obj, const char *name, jv *out)
{
    const char *m;
    switch (obj.t) {
    case JV_UNDEF:
        return tev_fail_undef(e, n, obj);
    case JV_DICT:
        if ((m = tev_method_name(JV_DICT, name))) {
            *out = jv_func(&e->heap, JF_METHOD, m, jv_ref(obj));
            return tev_built(e, n, out);
        }
        {
            jv *v = jv_dict_getc(obj, name);
            if (v) {
                *out = jv_ref(*v);
                return 0;
            }
        }
        *out = jv_undef_hint(&e->heap, "'dict object' has no attribute '%s'", name);
        return 0;
    case JV_NS: {
        jv *v = jv_dict_getc(obj, name);
        *out = v ? jv_ref(*v) : jv_undef_hint(&e->heap, "'Namespace' object has no attribute '%s'", name);
        return 0;
    }
    case JV_LOOP:
        return loop_attr(e, n, obj, name, out);
    case JV_STR:
        if ((m = tev_method_name(JV_STR, name))) {
            *out = jv_func(&e->heap, JF_METHOD, m, jv_ref(obj));
            return tev_built(e, n, out);
        }
        break;
    case JV_LIST:
        if ((m = tev_method_name(JV_LIST, name))) {
            *out = jv_func(&e->heap, JF_METHOD, m, jv_ref(obj));
            return tev_built(e, n, out);
        }
        break;
    case JV_NONE:
        *out = jv_undef_hint(&e->heap, "'None' has no attribute '%s'", name);
        return 0;
    default:
        break;
    }
    *out = jv_undef_hint(&e->heap, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
    return 0;
}

/* Python index normalisation; false when out of range. */
static bool norm_index(int64_t i, size_t len, size_t *out)
{
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return false;
    *out = (size_t)i;
    return true;
}

/* jinja2 `obj[key]`: item first, then attribute for string keys. */
int tev_getitem(ev *e, const node *n, jv obj, jv key, jv *out)
{
    size_t i;
    switch (obj.t) {
    case JV_UNDEF:
        return tev_fail_undef(e, n, obj);
    case JV_DICT: {
        jv *v = jv_dict_get(obj, key);
        if (v) {
            *out = jv_ref(*v);
            return 0;
        }
        if (key.t == JV_STR)
            return tev_getattr(e, n, obj, key.u.s->s, out);
        break;
    }
    case JV_LIST:
        if (is_int(key) && !obj.u.l->gen) {
            if (norm_index(as_int(key), obj.u.l->n, &i)) {
                *out = jv_ref(obj.u.l->v[i]);
                return 0;
            }
            *out = jv_undef_hint(&e->heap, "%s object has no element %lld", jv_type_name(obj), (long long)as_int(key));
            return 0;
        }
        break;
    case JV_STR:
        if (is_int(key)) {
            size_t cps = jv_utf8_count(obj.u.s->s, obj.u.s->len);
            if (norm_index(as_int(key), cps, &i)) {
                size_t a = jv_utf8_offset(obj.u.s->s, obj.u.s->len, i);
                size_t b = jv_utf8_offset(obj.u.s->s + a, obj.u.s->len - a, 1);
                *out = tev_str(e, obj.u.s->s + a, b);
                return tev_built(e, n, out);
            }
            *out = jv_undef_hint(&e->heap, "str object has no element %lld", (long long)as_int(key));
            return 0;
        }
        break;
    default:
        if (key.t == JV_STR)
            return tev_getattr(e, n, obj, key.u.s->s, out);
        break;
    }
    jbuf kb = {.max = 64};
    jv_repr(&kb, key);
    *out = jv_undef_hint(&e->heap, "'%s object' has no attribute '%s'", jv_type_name(obj), kb.p ? kb.p : "");
    jbuf_free(&kb);
    return 0;
}

/* Python slice indices for a sequence of length len. */
static int slice_indices(ev *e, const node *n, jv start, jv stop, jv step, size_t len, int64_t *a, int64_t *b,
                         int64_t *s)
{
    int64_t L = (int64_t)len;
    *s = 1;
    if (step.t != JV_NONE) {
        if (!is_int(step))
            return tev_fail(e, n, "slice indices must be integers or None");
        *s = as_int(step);
        if (*s == 0)
            return tev_fail(e, n, "slice step cannot be zero");
    }
    for (int k = 0; k < 2; k++) {
        jv v = k ? stop : start;
        int64_t *o = k ? b : a;
        if (v.t == JV_NONE) {
            *o = *s > 0 ? (k ? L : 0) : (k ? -1 : L - 1);
            continue;
        }
        if (!is_int(v))
            return tev_fail(e, n, "slice indices must be integers or None");
        int64_t x = as_int(v);
        if (x < 0) {
            x += L;
            if (x < 0)
                x = *s > 0 ? 0 : -1;
        } else if (x >= L) {
            x = *s > 0 ? L : L - 1;
        }
        *o = x;
    }
    return 0;
}

int tev_slice(ev *e, const node *n, jv obj, jv start, jv stop, jv step, jv *out)
{
    if (obj.t == JV_UNDEF)
        return tev_fail_undef(e, n, obj);
    /* slices bypass jinja's environment.getitem, so a non-sequence is a TypeError (not Undefined) */
    if ((obj.t != JV_LIST && obj.t != JV_STR) || (obj.t == JV_LIST && obj.u.l->gen))
        return tev_fail(e, n, "'%s' object is not subscriptable", jv_type_name(obj));
    bool is_str = obj.t == JV_STR;
    size_t len = is_str ? jv_utf8_count(obj.u.s->s, obj.u.s->len) : obj.u.l->n;
    int64_t a = 0, b = 0, s = 1;
    if (slice_indices(e, n, start, stop, step, len, &a, &b, &s))
        return -1;
    if (tev_tick(e, n, len / 16))
        return -1;
    if (!is_str) {
        *out = jv_list(&e->heap, 0, obj.u.l->tuple);
        for (int64_t i = a; out->t == JV_LIST && (s > 0 ? i < b : i > b); i += s)
            jv_list_push(*out, jv_ref(obj.u.l->v[i]));
        return tev_built(e, n, out);
    }
    /* strings: collect code point offsets once */
    const char *p = obj.u.s->s;
    size_t blen = obj.u.s->len;
    if (s == 1) {
        size_t oa = jv_utf8_offset(p, blen, (size_t)a), ob = b > a ? jv_utf8_offset(p, blen, (size_t)b) : oa;
        *out = tev_str(e, p + oa, ob - oa);
        return tev_built(e, n, out);
    }
    size_t *offs = malloc((len + 1) * sizeof *offs);
    jbuf r = {0};
    if (!offs)
        return tev_fail(e, n, "out of memory");
    for (size_t i = 0, k = 0; k <= len; k++) {
        offs[k] = i;
        if (i < blen)
            i += jv_utf8_offset(p + i, blen - i, 1);
    }
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
        jbuf_put(&r, p + offs[i], offs[i + 1] - offs[i]);
    *out = tev_str(e, r.p ? r.p : "", r.n);
    free(offs);
    jbuf_free(&r);
    return tev_built(e, n, out);
}

/* ---------------------------------------------------------------- operators */

int tev_order(ev *e, const node *n, jv a, jv b, int *res, const char *opname)
{
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            *res = as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
        else
            *res = as_num(a) < as_num(b) ? -1 : as_num(a) > as_num(b) ? 1 : as_num(a) == as_num(b) ? 0 : 2;
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t m = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, m);
        *res = r ? (r < 0 ? -1 : 1) : a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->gen && !b.u.l->gen) {
        size_t m = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < m; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i]))
                continue;
            return tev_order(e, n, a.u.l->v[i], b.u.l->v[i], res, opname);
        }
        *res = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return 0;
    }
    if (a.t == JV_UNDEF)
        return tev_fail_undef(e, n, a);
    if (b.t == JV_UNDEF)
        return tev_fail_undef(e, n, b);
    return tev_fail(e, n, "'%s' not supported between instances of '%s' and '%s'", opname, jv_type_name(a),
                    jv_type_name(b));
}

/* Python hashability: lists and dicts (and tuples holding them) cannot be dict keys. */
bool tev_unhashable(jv v)
{
    if (v.t == JV_DICT)
        return true;
    if (v.t != JV_LIST || v.u.l->gen)
        return false;
    if (!v.u.l->tuple)
        return true;
    for (size_t i = 0; i < v.u.l->n; i++)
        if (tev_unhashable(v.u.l->v[i]))
            return true;
    return false;
}

int tev_contains(ev *e, const node *n, jv needle, jv hay, bool *res)
{
    switch (hay.t) {
    case JV_STR:
        if (needle.t != JV_STR)
            return tev_fail(e, n, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        *res = needle.u.s->len == 0 || memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL;
        return tev_tick(e, n, hay.u.s->len / 64);
    case JV_LIST:
        *res = false;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++)
            *res = jv_equal(needle, hay.u.l->v[i]);
        return tev_tick(e, n, hay.u.l->n);
    case JV_DICT:
        if (tev_unhashable(needle))
            return tev_fail(e, n, "unhashable type: '%s'", jv_type_name(needle));
        *res = jv_dict_get(hay, needle) != NULL;
        return tev_tick(e, n, hay.u.d->n);
    case JV_UNDEF:
        *res = false;
        return 0;
    default:
        return tev_fail(e, n, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

int tev_compare(ev *e, const node *n, int op, jv a, jv b, bool *res)
{
    int c;
    static const char *const names[] = {"==", "!=", "<", "<=", ">", ">="};
    switch (op) {
    case CMP_EQ:
        *res = jv_equal(a, b);
        return 0;
    case CMP_NE:
        *res = !jv_equal(a, b);
        return 0;
    case CMP_IN:
        return tev_contains(e, n, a, b, res);
    case CMP_NOTIN:
        if (tev_contains(e, n, a, b, res))
            return -1;
        *res = !*res;
        return 0;
    default:
        if (tev_order(e, n, a, b, &c, names[op]))
            return -1;
        if (c == 2)
            *res = false; /* NaN */
        else
            *res = op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
        return 0;
    }
}

static int repeat(ev *e, const node *n, jv seq, int64_t times, jv *out)
{
    if (times < 0)
        times = 0;
    if (seq.t == JV_STR) {
        uint64_t total;
        if (!ck_mul_u64(seq.u.s->len, (uint64_t)times, &total) || total > e->lim->max_output)
            return tev_fail(e, n, "string repetition exceeds the output limit of %zu bytes", e->lim->max_output);
        char *buf = malloc(total + 1);
        if (!buf)
            return tev_fail(e, n, "out of memory");
        for (int64_t i = 0; i < times; i++)
            memcpy(buf + (size_t)i * seq.u.s->len, seq.u.s->s, seq.u.s->len);
        *out = tev_str(e, buf, total);
        free(buf);
        if (tev_tick(e, n, total / 64))
            return -1;
        return tev_built(e, n, out);
    }
    uint64_t total;
    if (!ck_mul_u64(seq.u.l->n, (uint64_t)times, &total) || total > e->lim->max_range * 10)
        return tev_fail(e, n, "list repetition produces too many items");
    if (tev_tick(e, n, total))
        return -1;
    *out = jv_list(&e->heap, total, seq.u.l->tuple);
    for (int64_t i = 0; i < times && out->t == JV_LIST; i++)
        for (size_t k = 0; k < seq.u.l->n; k++)
            jv_list_push(*out, jv_ref(seq.u.l->v[k]));
    return tev_built(e, n, out);
}

static int arith_inner(ev *e, const node *n, int op, jv a, jv b, jv *out)
{
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == OP_CONCAT) {
        jbuf s = {.max = e->lim->max_output};
        jv_to_str(&s, a);
        jv_to_str(&s, b);
        if (s.over) {
            jbuf_free(&s);
            return tev_fail(e, n, "a string exceeds the output limit of %zu bytes", e->lim->max_output);
        }
        *out = tev_str(e, s.p ? s.p : "", s.n);
        jbuf_free(&s);
        if (tev_tick(e, n, s.n / 64))
            return -1;
        return tev_built(e, n, out);
    }
    if (a.t == JV_UNDEF)
        return tev_fail_undef(e, n, a);
    if (b.t == JV_UNDEF)
        return tev_fail_undef(e, n, b);
    if (is_int(a) && is_int(b)) {
        int64_t x = as_int(a), y = as_int(b), r;
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &r))
                goto overflow;
            *out = jv_int(r);
            return 0;
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &r))
                goto overflow;
            *out = jv_int(r);
            return 0;
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &r))
                goto overflow;
            *out = jv_int(r);
            return 0;
        case OP_DIV:
            if (!y)
                return tev_fail(e, n, "division by zero");
            *out = jv_float((double)x / (double)y);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if (!y)
                return tev_fail(e, n, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                goto overflow;
            {
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0)))
                    q--, m += y;
                *out = jv_int(op == OP_FLOORDIV ? q : m);
            }
            return 0;
        case OP_POW:
            if (y < 0) {
                if (!x)
                    return tev_fail(e, n, "0.0 cannot be raised to a negative power");
                *out = jv_float(pow((double)x, (double)y));
                return 0;
            }
            r = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(r, x, &r))
                    goto overflow;
                if (r == 0 || r == 1)
                    break;
                if (r == -1) {
                    r = (y - i - 1) % 2 ? -r : r;
                    break;
                }
            }
            *out = jv_int(r);
            return 0;
        }
    }
    if (is_num(a) && is_num(b)) {
        double x = as_num(a), y = as_num(b);
        switch (op) {
        case OP_ADD:
            *out = jv_float(x + y);
            return 0;
        case OP_SUB:
            *out = jv_float(x - y);
            return 0;
        case OP_MUL:
            *out = jv_float(x * y);
            return 0;
        case OP_DIV:
            if (y == 0)
                return tev_fail(e, n, "float division by zero");
            *out = jv_float(x / y);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD: {
            /* CPython float_divmod */
            if (y == 0)
                return tev_fail(e, n, "float floor division by zero");
            double m = fmod(x, y), d = (x - m) / y, fd;
            if (m != 0 && ((y < 0) != (m < 0))) {
                m += y;
                d -= 1.0;
            }
            if (m == 0)
                m = copysign(0.0, y);
            if (d != 0) {
                fd = floor(d);
                if (d - fd > 0.5)
                    fd += 1.0;
            } else {
                fd = copysign(0.0, x / y);
            }
            *out = jv_float(op == OP_MOD ? m : fd);
            return 0;
        }
        case OP_POW:
            if (x == 0 && y < 0)
                return tev_fail(e, n, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(x, y));
            return 0;
        }
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        size_t total;
        if (!ck_add_size(a.u.s->len, b.u.s->len, &total) || total > e->lim->max_output)
            return tev_fail(e, n, "a string exceeds the output limit of %zu bytes", e->lim->max_output);
        char *buf = malloc(total + 1);
        if (!buf)
            return tev_fail(e, n, "out of memory");
        memcpy(buf, a.u.s->s, a.u.s->len);
        memcpy(buf + a.u.s->len, b.u.s->s, b.u.s->len);
        *out = tev_str(e, buf, total);
        free(buf);
        if (tev_tick(e, n, total / 64))
            return -1;
        return tev_built(e, n, out);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->gen &&
        !b.u.l->gen) {
        if (tev_tick(e, n, a.u.l->n + b.u.l->n))
            return -1;
        *out = jv_list(&e->heap, a.u.l->n + b.u.l->n, a.u.l->tuple);
        for (size_t i = 0; i < a.u.l->n && out->t == JV_LIST; i++)
            jv_list_push(*out, jv_ref(a.u.l->v[i]));
        for (size_t i = 0; i < b.u.l->n && out->t == JV_LIST; i++)
            jv_list_push(*out, jv_ref(b.u.l->v[i]));
        return tev_built(e, n, out);
    }
    if (op == OP_MUL && (a.t == JV_STR || (a.t == JV_LIST && !a.u.l->gen)) && is_int(b))
        return repeat(e, n, a, as_int(b), out);
    if (op == OP_MUL && (b.t == JV_STR || (b.t == JV_LIST && !b.u.l->gen)) && is_int(a))
        return repeat(e, n, b, as_int(a), out);
    if (op == OP_ADD && a.t == JV_STR)
        return tev_fail(e, n, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (op == OP_ADD && a.t == JV_LIST)
        return tev_fail(e, n, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b),
                        jv_type_name(a));
    return tev_fail(e, n, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], jv_type_name(a),
                    jv_type_name(b));
overflow:
    return tev_fail(e, n, "integer overflow in '%s' (spill's templates use 64-bit integers)", sym[op]);
}

int tev_arith(ev *e, const node *n, int op, jv a, jv b, jv *out)
{
    *out = jv_undef();
    int rc = arith_inner(e, n, op, a, b, out);
    if (rc)
        jv_drop(out);
    return rc;
}
