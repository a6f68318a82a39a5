/*
 * template_eval.c — chat templates, back half: walks the tree built by
 * template.c and renders it with jinja2's semantics (the transformers
 * ImmutableSandboxedEnvironment): scoping, Undefined, Python operators and
 * truthiness, filters, tests, the str/dict/list methods templates call, and
 * the transformers globals (raise_exception, strftime_now, namespace, dict).
 *
 * Does not own: lexing/parsing (template.c), value representation, str()/
 * repr()/json.dumps() formatting (jinja_value.c).
 *
 * Key decisions:
 *  - Scopes are a chain of frames, each a dict.  The template body gets a
 *    root frame above the context; every for-loop iteration gets a fresh
 *    frame (jinja2: a `set` inside a loop is gone at the next iteration and
 *    after the loop — hence namespace()); macros get a frame over the root.
 *  - Undefined follows jinja2's default Undefined: printing gives "",
 *    iteration is empty, `==` is false, but attribute/item access, arithmetic,
 *    ordering and calls raise "'x' is undefined".
 *  - Every error is one sentence "NAME line L, column C: reason" pointing at
 *    the node that failed; raise_exception returns TEMPLATE_ERR_RAISED with
 *    the template's own message.
 *  - Limits: fuel (steps + allocated bytes/64), evaluator recursion
 *    (macro depth ≤ max_depth, total frames ≤ 16×max_depth), output bytes,
 *    live value bytes, range() length.  The sandbox is by construction: only
 *    the methods listed here exist; nothing reaches the host.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "template_ast.h"
#include "util.h"

/* One scope.  Names are template-owned (AST strings) or static, so binding one never allocates
 * a key; most frames hold a loop target and `loop`, which fit the inline slots. */
typedef struct {
    const char *name;
    jv v;
} binding;

typedef struct frame {
    struct frame *parent;
    binding inl[4];
    binding *b; /* (cap) inl or heap */
    size_t n, cap;
} frame;

typedef struct {
    const tmpl_t *t;
    const tmpl_limits *lim;
    jheap heap;
    jbuf out;
    uint64_t steps;
    uint32_t depth, macro_depth;
    frame *root;  /* the template body's frame */
    frame *scope; /* innermost frame: where names resolve and `set` writes */
    jv ctx;       /* the context dict, below every frame */
    char *err;
    size_t errlen;
    int rc;
    bool failed;
    time_t now;
} ev;

typedef struct {
    jv *pos;
    size_t npos;
    const char *const *kwn;
    jv *kw;
    size_t nkw;
} cargs;

enum { X_OK = 0, X_BREAK = 1, X_CONTINUE = 2 };

static int eval(ev *e, const node *n, jv *out);
static int exec_node(ev *e, const node *n);

/* ---------------------------------------------------------------- errors and budgets */

static int fail(ev *e, const node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ev *e, const node *n, const char *fmt, ...)
{
    if (e->failed) return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->failed = true;
    e->rc = -1;
    if (n)
        util_errf(e->err, e->errlen, "%s line %d, column %d: %s", e->t->name, n->line, n->col, msg);
    else
        util_errf(e->err, e->errlen, "%s: %s", e->t->name, msg);
    return -1;
}

static int fail_undef(ev *e, const node *n, jv u)
{
    if (u.u.s) return fail(e, n, "%s", u.u.s->s);
    return fail(e, n, "a value is undefined");
}

static int tick(ev *e, const node *n, uint64_t k)
{
    e->steps += k;
    if (e->heap.oom)
        return fail(e, n, "template values exceed the memory limit of %zu bytes; the template builds values too large",
                    e->lim->max_memory);
    if (e->steps + e->heap.total / 64 > e->lim->max_steps)
        return fail(e, n, "template exceeded its budget of %llu steps; it loops or copies too much",
                    (unsigned long long)e->lim->max_steps);
    return 0;
}

/* Checks a freshly built value: JV_UNDEF without hint from a constructor means out of memory. */
static int oom_check(ev *e, const node *n) { return e->heap.oom ? tick(e, n, 0) : 0; }

static void jv_drop(jv *out);

/* Ends a function that just built *out: on a failed allocation releases it and fails. */
static int built(ev *e, const node *n, jv *out)
{
    if (!e->heap.oom) return 0;
    jv_drop(out);
    return tick(e, n, 0);
}

/* ---------------------------------------------------------------- small helpers */

/* Releases a result slot and leaves it undefined; safe to call twice.  Convention: a function
 * that fails leaves its *out undefined, so callers never release a failed result. */
static void jv_drop(jv *out)
{
    jv_unref(*out);
    *out = jv_undef();
}

static jv mkstr(ev *e, const char *s, size_t len) { return jv_str(&e->heap, s, len); }

static bool is_int(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t as_int(jv v) { return v.t == JV_BOOL ? (int64_t)v.u.b : v.u.i; }
static bool is_num(jv v) { return is_int(v) || v.t == JV_FLOAT; }
static double as_num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)as_int(v); }

/* Python str(v) as a new string value. */
static int to_str(ev *e, const node *n, jv v, jv *out)
{
    if (v.t == JV_STR) {
        *out = jv_ref(v);
        return 0;
    }
    jbuf b = {.max = e->lim->max_output};
    jv_to_str(&b, v);
    if (b.over) {
        jbuf_free(&b);
        return fail(e, n, "a string exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return built(e, n, out);
}

static jv *arg_get(cargs *a, size_t i, const char *name)
{
    if (i < a->npos) return &a->pos[i];
    for (size_t k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return &a->kw[k];
    return NULL;
}

static void cargs_free(cargs *a)
{
    for (size_t i = 0; i < a->npos; i++) jv_unref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jv_unref(a->kw[i]);
    free(a->pos);
    free(a->kw);
}

static int eval_args(ev *e, const node *n, cargs *a)
{
    memset(a, 0, sizeof *a);
    a->pos = calloc(n->nargs + 1, sizeof(jv));
    a->kw = calloc(n->nkw + 1, sizeof(jv));
    if (!a->pos || !a->kw) {
        cargs_free(a);
        return fail(e, n, "out of memory");
    }
    a->kwn = n->kwnames;
    for (size_t i = 0; i < n->nargs; i++, a->npos++)
        if (eval(e, n->args[i], &a->pos[i])) return cargs_free(a), -1;
    for (size_t i = 0; i < n->nkw; i++, a->nkw++)
        if (eval(e, n->kwargs[i], &a->kw[i])) return cargs_free(a), -1;
    return 0;
}

/* Materialises anything iterable as a list (new reference): list/tuple itself, dict keys,
 * string characters, undefined → empty. */
static int iterate(ev *e, const node *n, jv v, jv *out)
{
    switch (v.t) {
    case JV_LIST: *out = jv_ref(v); return 0;
    case JV_UNDEF: *out = jv_list(&e->heap, 0, false); return built(e, n, out);
    case JV_DICT: {
        *out = jv_list(&e->heap, v.u.d->n, false);
        for (size_t i = 0; i < v.u.d->n && out->t == JV_LIST; i++) jv_list_push(*out, jv_ref(v.u.d->k[i]));
        return built(e, n, out);
    }
    case JV_STR: {
        const char *s = v.u.s->s;
        size_t len = v.u.s->len;
        *out = jv_list(&e->heap, utf8_count(s, len), false);
        for (size_t i = 0; i < len && out->t == JV_LIST;) {
            uint32_t c;
            int k = utf8_decode(s + i, len - i, &c);
            jv_list_push(*out, mkstr(e, s + i, (size_t)k));
            i += (size_t)k;
        }
        if (tick(e, n, len)) return jv_drop(out), -1;
        return built(e, n, out);
    }
    default: return fail(e, n, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---------------------------------------------------------------- scope */

static jv *lookup(ev *e, frame *f, const char *name)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->b[i].name, name)) return &f->b[i].v;
    return jv_dict_getc(e->ctx, name);
}

static int assign(ev *e, const node *n, frame *f, const char *name, jv v /* consumed */)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->b[i].name, name)) {
            jv_unref(f->b[i].v);
            f->b[i].v = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t ncap = f->cap * 2;
        binding *nb = malloc(ncap * sizeof *nb);
        if (!nb) {
            jv_unref(v);
            return fail(e, n, "out of memory");
        }
        memcpy(nb, f->b, f->n * sizeof *nb);
        if (f->b != f->inl) free(f->b);
        f->b = nb;
        f->cap = ncap;
    }
    f->b[f->n].name = name;
    f->b[f->n++].v = v;
    return 0;
}

static bool frame_init(ev *e, frame *f, frame *parent)
{
    (void)e;
    f->parent = parent;
    f->b = f->inl;
    f->n = 0;
    f->cap = sizeof f->inl / sizeof *f->inl;
    return true;
}

static void frame_free(frame *f)
{
    for (size_t i = 0; i < f->n; i++) jv_unref(f->b[i].v);
    if (f->b != f->inl) free(f->b);
    f->b = f->inl;
    f->n = 0;
}

/* ---------------------------------------------------------------- attribute / item access */

static const char *const STR_METHODS[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                          "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                                          "count", "index", "join", "isdigit", "isalpha", "isalnum", "isspace",
                                          "islower", "isupper", "splitlines", "format", "zfill", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const LIST_METHODS[] = {"index", "count", NULL};

static const char *find_name(const char *const *list, const char *nm)
{
    for (; *list; list++)
        if (!strcmp(*list, nm)) return *list;
    return NULL;
}

static int loop_attr(ev *e, const node *n, jv loop, const char *name, jv *out);

/* jinja2 `obj.name`: attribute first, then item. */
static int getattr_v(ev *e, const node *n, jv obj, const char *name, jv *out)
{
    const char *m;
    switch (obj.t) {
    case JV_UNDEF: return fail_undef(e, n, obj);
    case JV_DICT:
        if ((m = find_name(DICT_METHODS, name))) {
            *out = jv_func(&e->heap, JF_METHOD, m, jv_ref(obj));
            return built(e, n, out);
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
    case JV_LOOP: return loop_attr(e, n, obj, name, out);
    case JV_STR:
        if ((m = find_name(STR_METHODS, name))) {
            *out = jv_func(&e->heap, JF_METHOD, m, jv_ref(obj));
            return built(e, n, out);
        }
        break;
    case JV_LIST:
        if ((m = find_name(LIST_METHODS, name))) {
            *out = jv_func(&e->heap, JF_METHOD, m, jv_ref(obj));
            return built(e, n, out);
        }
        break;
    case JV_NONE: *out = jv_undef_hint(&e->heap, "'None' has no attribute '%s'", name); return 0;
    default: break;
    }
    *out = jv_undef_hint(&e->heap, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
    return 0;
}

/* Python index normalisation; false when out of range. */
static bool norm_index(int64_t i, size_t len, size_t *out)
{
    if (i < 0) i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len) return false;
    *out = (size_t)i;
    return true;
}

/* jinja2 `obj[key]`: item first, then attribute for string keys. */
static int getitem_v(ev *e, const node *n, jv obj, jv key, jv *out)
{
    size_t i;
    switch (obj.t) {
    case JV_UNDEF: return fail_undef(e, n, obj);
    case JV_DICT: {
        jv *v = jv_dict_get(obj, key);
        if (v) {
            *out = jv_ref(*v);
            return 0;
        }
        if (key.t == JV_STR) return getattr_v(e, n, obj, key.u.s->s, out);
        break;
    }
    case JV_LIST:
        if (is_int(key)) {
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
            size_t cps = utf8_count(obj.u.s->s, obj.u.s->len);
            if (norm_index(as_int(key), cps, &i)) {
                size_t a = utf8_offset(obj.u.s->s, obj.u.s->len, i);
                size_t b = utf8_offset(obj.u.s->s + a, obj.u.s->len - a, 1);
                *out = mkstr(e, obj.u.s->s + a, b);
                return built(e, n, out);
            }
            *out = jv_undef_hint(&e->heap, "str object has no element %lld", (long long)as_int(key));
            return 0;
        }
        break;
    default:
        if (key.t == JV_STR) return getattr_v(e, n, obj, key.u.s->s, out);
        break;
    }
    jbuf kb = {.max = 64};
    jv_repr(&kb, key);
    *out = jv_undef_hint(&e->heap, "'%s object' has no attribute '%s'", jv_type_name(obj), kb.p ? kb.p : "");
    jbuf_free(&kb);
    return 0;
}

/* Python slice indices for a sequence of length len. */
static int slice_indices(ev *e, const node *n, jv start, jv stop, jv step, size_t len, int64_t *a, int64_t *b, int64_t *s)
{
    int64_t L = (int64_t)len;
    *s = 1;
    if (step.t != JV_NONE) {
        if (!is_int(step)) return fail(e, n, "slice indices must be integers or None");
        *s = as_int(step);
        if (*s == 0) return fail(e, n, "slice step cannot be zero");
    }
    for (int k = 0; k < 2; k++) {
        jv v = k ? stop : start;
        int64_t *o = k ? b : a;
        if (v.t == JV_NONE) {
            *o = *s > 0 ? (k ? L : 0) : (k ? -1 : L - 1);
            continue;
        }
        if (!is_int(v)) return fail(e, n, "slice indices must be integers or None");
        int64_t x = as_int(v);
        if (x < 0) {
            x += L;
            if (x < 0) x = *s > 0 ? 0 : -1;
        } else if (x >= L) {
            x = *s > 0 ? L : L - 1;
        }
        *o = x;
    }
    return 0;
}

static int do_slice(ev *e, const node *n, jv obj, jv start, jv stop, jv step, jv *out)
{
    if (obj.t == JV_UNDEF) return fail_undef(e, n, obj);
    if (obj.t != JV_LIST && obj.t != JV_STR) { /* jinja's getitem turns the TypeError into Undefined */
        *out = jv_undef_hint(&e->heap, "'%s' object is not subscriptable", jv_type_name(obj));
        return 0;
    }
    bool is_str = obj.t == JV_STR;
    size_t len = is_str ? utf8_count(obj.u.s->s, obj.u.s->len) : obj.u.l->n;
    int64_t a, b, s;
    if (slice_indices(e, n, start, stop, step, len, &a, &b, &s)) return -1;
    if (tick(e, n, len / 16)) return -1;
    if (!is_str) {
        *out = jv_list(&e->heap, 0, obj.u.l->tuple);
        for (int64_t i = a; out->t == JV_LIST && (s > 0 ? i < b : i > b); i += s) jv_list_push(*out, jv_ref(obj.u.l->v[i]));
        return built(e, n, out);
    }
    /* strings: collect code point offsets once */
    const char *p = obj.u.s->s;
    size_t blen = obj.u.s->len;
    if (s == 1) {
        size_t oa = utf8_offset(p, blen, (size_t)a), ob = b > a ? utf8_offset(p, blen, (size_t)b) : oa;
        *out = mkstr(e, p + oa, ob - oa);
        return built(e, n, out);
    }
    size_t *offs = malloc((len + 1) * sizeof *offs);
    jbuf r = {0};
    if (!offs) return fail(e, n, "out of memory");
    for (size_t i = 0, k = 0; k <= len; k++) {
        offs[k] = i;
        if (i < blen) i += utf8_offset(p + i, blen - i, 1);
    }
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) jbuf_put(&r, p + offs[i], offs[i + 1] - offs[i]);
    *out = mkstr(e, r.p ? r.p : "", r.n);
    free(offs);
    jbuf_free(&r);
    return built(e, n, out);
}

/* ---------------------------------------------------------------- operators */

static int cmp_order(ev *e, const node *n, jv a, jv b, int *res, const char *opname)
{
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b)) *res = as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
        else *res = as_num(a) < as_num(b) ? -1 : as_num(a) > as_num(b) ? 1 : as_num(a) == as_num(b) ? 0 : 2;
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t m = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, m);
        *res = r ? (r < 0 ? -1 : 1) : a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t m = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < m; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return cmp_order(e, n, a.u.l->v[i], b.u.l->v[i], res, opname);
        }
        *res = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return 0;
    }
    if (a.t == JV_UNDEF) return fail_undef(e, n, a);
    if (b.t == JV_UNDEF) return fail_undef(e, n, b);
    return fail(e, n, "'%s' not supported between instances of '%s' and '%s'", opname, jv_type_name(a), jv_type_name(b));
}

static int contains(ev *e, const node *n, jv needle, jv hay, bool *res)
{
    switch (hay.t) {
    case JV_STR:
        if (needle.t != JV_STR)
            return fail(e, n, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        *res = needle.u.s->len == 0 || memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL;
        return tick(e, n, hay.u.s->len / 64);
    case JV_LIST:
        *res = false;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++) *res = jv_equal(needle, hay.u.l->v[i]);
        return tick(e, n, hay.u.l->n);
    case JV_DICT: *res = jv_dict_get(hay, needle) != NULL; return tick(e, n, hay.u.d->n);
    case JV_UNDEF: *res = false; return 0;
    default: return fail(e, n, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare(ev *e, const node *n, int op, jv a, jv b, bool *res)
{
    int c;
    static const char *const names[] = {"==", "!=", "<", "<=", ">", ">="};
    switch (op) {
    case CMP_EQ: *res = jv_equal(a, b); return 0;
    case CMP_NE: *res = !jv_equal(a, b); return 0;
    case CMP_IN: return contains(e, n, a, b, res);
    case CMP_NOTIN:
        if (contains(e, n, a, b, res)) return -1;
        *res = !*res;
        return 0;
    default:
        if (cmp_order(e, n, a, b, &c, names[op])) return -1;
        if (c == 2) *res = false; /* NaN */
        else *res = op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
        return 0;
    }
}

static int repeat(ev *e, const node *n, jv seq, int64_t times, jv *out)
{
    if (times < 0) times = 0;
    if (seq.t == JV_STR) {
        uint64_t total;
        if (!ck_mul_u64(seq.u.s->len, (uint64_t)times, &total) || total > e->lim->max_output)
            return fail(e, n, "string repetition exceeds the output limit of %zu bytes", e->lim->max_output);
        char *buf = malloc(total + 1);
        if (!buf) return fail(e, n, "out of memory");
        for (int64_t i = 0; i < times; i++) memcpy(buf + (size_t)i * seq.u.s->len, seq.u.s->s, seq.u.s->len);
        *out = mkstr(e, buf, total);
        free(buf);
        if (tick(e, n, total / 64)) return -1;
        return built(e, n, out);
    }
    uint64_t total;
    if (!ck_mul_u64(seq.u.l->n, (uint64_t)times, &total) || total > e->lim->max_range * 10)
        return fail(e, n, "list repetition produces too many items");
    if (tick(e, n, total)) return -1;
    *out = jv_list(&e->heap, total, seq.u.l->tuple);
    for (int64_t i = 0; i < times && out->t == JV_LIST; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) jv_list_push(*out, jv_ref(seq.u.l->v[k]));
    return built(e, n, out);
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
            return fail(e, n, "a string exceeds the output limit of %zu bytes", e->lim->max_output);
        }
        *out = mkstr(e, s.p ? s.p : "", s.n);
        jbuf_free(&s);
        if (tick(e, n, s.n / 64)) return -1;
        return built(e, n, out);
    }
    if (a.t == JV_UNDEF) return fail_undef(e, n, a);
    if (b.t == JV_UNDEF) return fail_undef(e, n, b);
    if (is_int(a) && is_int(b)) {
        int64_t x = as_int(a), y = as_int(b), r;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; *out = jv_int(r); return 0;
        case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; *out = jv_int(r); return 0;
        case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; *out = jv_int(r); return 0;
        case OP_DIV:
            if (!y) return fail(e, n, "division by zero");
            *out = jv_float((double)x / (double)y);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if (!y) return fail(e, n, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            {
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) q--, m += y;
                *out = jv_int(op == OP_FLOORDIV ? q : m);
            }
            return 0;
        case OP_POW:
            if (y < 0) {
                if (!x) return fail(e, n, "0.0 cannot be raised to a negative power");
                *out = jv_float(pow((double)x, (double)y));
                return 0;
            }
            r = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(r, x, &r)) goto overflow;
                if (r == 0 || r == 1) break;
                if (r == -1) { r = (y - i - 1) % 2 ? -r : r; break; }
            }
            *out = jv_int(r);
            return 0;
        }
    }
    if (is_num(a) && is_num(b)) {
        double x = as_num(a), y = as_num(b);
        switch (op) {
        case OP_ADD: *out = jv_float(x + y); return 0;
        case OP_SUB: *out = jv_float(x - y); return 0;
        case OP_MUL: *out = jv_float(x * y); return 0;
        case OP_DIV:
            if (y == 0) return fail(e, n, "float division by zero");
            *out = jv_float(x / y);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD: {
            /* CPython float_divmod */
            if (y == 0) return fail(e, n, "float floor division by zero");
            double m = fmod(x, y), d = (x - m) / y, fd;
            if (m != 0 && ((y < 0) != (m < 0))) {
                m += y;
                d -= 1.0;
            }
            if (m == 0) m = copysign(0.0, y);
            if (d != 0) {
                fd = floor(d);
                if (d - fd > 0.5) fd += 1.0;
            } else {
                fd = copysign(0.0, x / y);
            }
            *out = jv_float(op == OP_MOD ? m : fd);
            return 0;
        }
        case OP_POW:
            if (x == 0 && y < 0) return fail(e, n, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(x, y));
            return 0;
        }
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        size_t total;
        if (!ck_add_size(a.u.s->len, b.u.s->len, &total) || total > e->lim->max_output)
            return fail(e, n, "a string exceeds the output limit of %zu bytes", e->lim->max_output);
        char *buf = malloc(total + 1);
        if (!buf) return fail(e, n, "out of memory");
        memcpy(buf, a.u.s->s, a.u.s->len);
        memcpy(buf + a.u.s->len, b.u.s->s, b.u.s->len);
        *out = mkstr(e, buf, total);
        free(buf);
        if (tick(e, n, total / 64)) return -1;
        return built(e, n, out);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        if (tick(e, n, a.u.l->n + b.u.l->n)) return -1;
        *out = jv_list(&e->heap, a.u.l->n + b.u.l->n, a.u.l->tuple);
        for (size_t i = 0; i < a.u.l->n && out->t == JV_LIST; i++) jv_list_push(*out, jv_ref(a.u.l->v[i]));
        for (size_t i = 0; i < b.u.l->n && out->t == JV_LIST; i++) jv_list_push(*out, jv_ref(b.u.l->v[i]));
        return built(e, n, out);
    }
    if (op == OP_MUL && (a.t == JV_STR || a.t == JV_LIST) && is_int(b)) return repeat(e, n, a, as_int(b), out);
    if (op == OP_MUL && (b.t == JV_STR || b.t == JV_LIST) && is_int(a)) return repeat(e, n, b, as_int(a), out);
    if (op == OP_ADD && a.t == JV_STR)
        return fail(e, n, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (op == OP_ADD && a.t == JV_LIST)
        return fail(e, n, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b), jv_type_name(a));
    return fail(e, n, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], jv_type_name(a), jv_type_name(b));
overflow:
    return fail(e, n, "integer overflow in '%s' (spill's templates use 64-bit integers)", sym[op]);
}

static int arith(ev *e, const node *n, int op, jv a, jv b, jv *out)
{
    *out = jv_undef();
    int rc = arith_inner(e, n, op, a, b, out);
    if (rc) jv_drop(out);
    return rc;
}

/* ---------------------------------------------------------------- string helpers */

/* Length of the Python-whitespace code point at p[i], 0 if none. */
static size_t ws_len(const char *p, size_t len, size_t i)
{
    uint32_t c;
    int k = utf8_decode(p + i, len - i, &c);
    return py_isspace_cp(c) ? (size_t)k : 0;
}

/* Code points of a string into a fresh array (caller frees). */
static uint32_t *decode_all(const char *s, size_t len, size_t *n)
{
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    size_t k = 0;
    if (!cp) return NULL;
    for (size_t i = 0; i < len;) i += (size_t)utf8_decode(s + i, len - i, &cp[k++]);
    *n = k;
    return cp;
}

static bool cp_in(uint32_t c, const uint32_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == c) return true;
    return false;
}

/* str.strip/lstrip/rstrip(chars): which = 1 left, 2 right, 3 both; chars NULL = whitespace. */
static int str_strip(ev *e, const node *n, jv s, jv *chars, int which, jv *out)
{
    if (s.t != JV_STR) return fail(e, n, "strip expects a string, got %s", jv_type_name(s));
    uint32_t *set = NULL;
    size_t nset = 0;
    bool ws = !chars || chars->t == JV_NONE;
    if (!ws) {
        if (chars->t != JV_STR) return fail(e, n, "strip arg must be None or str");
        if (!(set = decode_all(chars->u.s->s, chars->u.s->len, &nset))) return fail(e, n, "out of memory");
    }
    const char *p = s.u.s->s;
    size_t a = 0, b = s.u.s->len;
    if (which & 1)
        while (a < b) {
            uint32_t c;
            int k = utf8_decode(p + a, b - a, &c);
            if (ws ? !py_isspace_cp(c) : !cp_in(c, set, nset)) break;
            a += (size_t)k;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            uint32_t c;
            utf8_decode(p + st, b - st, &c);
            if (ws ? !py_isspace_cp(c) : !cp_in(c, set, nset)) break;
            b = st;
        }
    free(set);
    *out = mkstr(e, p + a, b - a);
    return built(e, n, out);
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
        int k = utf8_decode(p + i, len - i, &c);
        i += (size_t)k;
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
        bool cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
        switch (mode) {
        case 'u': r = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c); break;
        case 'l': r = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c); break;
        case 't': r = prev_cased ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)c) : (uint32_t)utf8proc_totitle((utf8proc_int32_t)c); break;
        default: r = first ? (uint32_t)utf8proc_totitle((utf8proc_int32_t)c) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)c); break;
        }
        prev_cased = cased;
        first = false;
        char enc[4];
        jbuf_put(&b, enc, (size_t)utf8_encode(r, enc));
    }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return built(e, n, out);
}

static int str_replace(ev *e, const node *n, jv s, jv old, jv new_, int64_t count, jv *out)
{
    if (s.t != JV_STR || old.t != JV_STR || new_.t != JV_STR) return fail(e, n, "replace() arguments must be str");
    jbuf b = {.max = e->lim->max_output};
    const char *p = s.u.s->s;
    size_t len = s.u.s->len, ol = old.u.s->len, i = 0;
    int64_t done = 0;
    if (ol == 0) {
        /* Python inserts `new` between every code point and at both ends */
        for (;;) {
            if (count >= 0 && done >= count) break;
            jbuf_put(&b, new_.u.s->s, new_.u.s->len);
            done++;
            if (i >= len) break;
            size_t k = utf8_offset(p + i, len - i, 1);
            jbuf_put(&b, p + i, k);
            i += k;
        }
        jbuf_put(&b, p + i, len - i);
    } else {
        while (i < len) {
            const char *hit = (count < 0 || done < count) ? memmem(p + i, len - i, old.u.s->s, ol) : NULL;
            if (!hit) break;
            jbuf_put(&b, p + i, (size_t)(hit - (p + i)));
            jbuf_put(&b, new_.u.s->s, new_.u.s->len);
            i = (size_t)(hit - p) + ol;
            done++;
        }
        jbuf_put(&b, p + i, len - i);
    }
    if (b.over) {
        jbuf_free(&b);
        return fail(e, n, "replace() result exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    if (tick(e, n, b.n / 64)) return jbuf_free(&b), -1;
    jbuf_free(&b);
    return built(e, n, out);
}

/* str.split / rsplit (right = true) with Python semantics. */
static int str_split(ev *e, const node *n, jv s, jv *sep, int64_t maxsplit, bool right, jv *out)
{
    const char *p = s.u.s->s;
    size_t len = s.u.s->len;
    jv parts = jv_list(&e->heap, 0, false);
    if (parts.t != JV_LIST) return built(e, n, out);
    if (sep && sep->t != JV_NONE && sep->t != JV_STR) {
        jv_unref(parts);
        return fail(e, n, "must be str or None, not %s", jv_type_name(*sep));
    }
    if (!sep || sep->t == JV_NONE) {
        /* whitespace runs; collect from the chosen side */
        size_t *ranges = malloc((len + 1) * 2 * sizeof *ranges), nr = 0;
        if (!ranges) return jv_unref(parts), fail(e, n, "out of memory");
        size_t i = 0;
        while (i < len) {
            while (i < len && ws_len(p, len, i)) i += ws_len(p, len, i);
            if (i >= len) break;
            size_t a = i;
            while (i < len && !ws_len(p, len, i)) i += utf8_offset(p + i, len - i, 1);
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
        for (size_t k = 0; k < nr; k++) jv_list_push(parts, mkstr(e, p + ranges[2 * k], ranges[2 * k + 1] - ranges[2 * k]));
        free(ranges);
    } else {
        const char *sp = sep->u.s->s;
        size_t sl = sep->u.s->len;
        if (!sl) return jv_unref(parts), fail(e, n, "empty separator");
        if (!right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, len - i, sp, sl) : NULL;
                if (!hit) break;
                jv_list_push(parts, mkstr(e, p + i, (size_t)(hit - (p + i))));
                i = (size_t)(hit - p) + sl;
                done++;
            }
            jv_list_push(parts, mkstr(e, p + i, len - i));
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
                if (found == (size_t)-1) break;
                jv_list_push(rev, mkstr(e, p + found + sl, end - found - sl));
                end = found;
                done++;
            }
            jv_list_push(parts, mkstr(e, p, end));
            if (rev.t == JV_LIST)
                for (size_t k = rev.u.l->n; k-- > 0;) jv_list_push(parts, jv_ref(rev.u.l->v[k]));
            jv_unref(rev);
        }
    }
    *out = parts;
    if (tick(e, n, len / 64)) return -1;
    return built(e, n, out);
}

/* Python str.splitlines() boundaries. */
static size_t line_break_len(const char *p, size_t len, size_t i)
{
    uint32_t c;
    int k = utf8_decode(p + i, len - i, &c);
    if (c == '\r' && i + 1 < len && p[i + 1] == '\n') return 2;
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
            jv_list_push(*out, mkstr(e, p + a, i - a));
            i += k;
            a = i;
        } else {
            i += utf8_offset(p + i, len - i, 1);
        }
    }
    if (a < len && out->t == JV_LIST) jv_list_push(*out, mkstr(e, p + a, len - a));
    return built(e, n, out);
}

/* ---------------------------------------------------------------- attribute paths (selectattr, map, sort, …) */

/* jinja2 make_attrgetter: "a.b.0" walks getitem per part, digits become ints. */
static int get_path(ev *e, const node *n, jv item, jv path, jv *out)
{
    if (path.t != JV_STR) return getitem_v(e, n, item, path, out);
    const char *p = path.u.s->s;
    jv cur = jv_ref(item);
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        bool digits = l > 0;
        for (size_t i = 0; i < l; i++) digits = digits && p[i] >= '0' && p[i] <= '9';
        jv key = digits ? jv_int(strtoll(p, NULL, 10)) : mkstr(e, p, l), next;
        int rc = getitem_v(e, n, cur, key, &next);
        jv_unref(key);
        jv_unref(cur);
        if (rc) return -1;
        cur = next;
        if (!dot) break;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

/* ---------------------------------------------------------------- tests */

static int apply_test(ev *e, const node *n, const char *name, jv v, jv *arg, bool *res)
{
    if (!strcmp(name, "defined")) *res = v.t != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *res = v.t == JV_UNDEF;
    else if (!strcmp(name, "none")) *res = v.t == JV_NONE;
    else if (!strcmp(name, "boolean")) *res = v.t == JV_BOOL;
    else if (!strcmp(name, "true")) *res = v.t == JV_BOOL && v.u.b;
    else if (!strcmp(name, "false")) *res = v.t == JV_BOOL && !v.u.b;
    else if (!strcmp(name, "integer")) *res = v.t == JV_INT;
    else if (!strcmp(name, "float")) *res = v.t == JV_FLOAT;
    else if (!strcmp(name, "number")) *res = is_num(v);
    else if (!strcmp(name, "string")) *res = v.t == JV_STR;
    else if (!strcmp(name, "mapping")) *res = v.t == JV_DICT;
    else if (!strcmp(name, "iterable")) *res = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (!strcmp(name, "sequence")) *res = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (!strcmp(name, "callable")) *res = v.t == JV_FUNC;
    else if (!strcmp(name, "escaped")) *res = false;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) { /* str(value).islower()/isupper() */
        jv t, sv;
        if (to_str(e, n, v, &sv)) return -1;
        v = sv;
        if (str_case(e, n, v, name[0] == 'l' ? 'l' : 'u', &t)) return jv_unref(sv), -1;
        *res = jv_equal(t, v);
        bool any_cased = false;
        for (size_t i = 0; i < v.u.s->len;) {
            uint32_t c;
            i += (size_t)utf8_decode(v.u.s->s + i, v.u.s->len - i, &c);
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
            any_cased |= cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
        }
        *res = *res && any_cased;
        jv_unref(t);
        jv_unref(sv);
    } else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (!is_int(v)) return fail(e, n, "test '%s' needs an integer, got %s", name, jv_type_name(v));
        *res = (as_int(v) % 2 != 0) == (name[0] == 'o');
    } else if (!strcmp(name, "divisibleby")) {
        if (!arg || !is_int(v) || !is_int(*arg)) return fail(e, n, "test 'divisibleby' needs integers");
        if (!as_int(*arg)) return fail(e, n, "integer division or modulo by zero");
        *res = as_int(v) % as_int(*arg) == 0;
    } else {
        if (!arg) return fail(e, n, "test '%s' needs an argument", name);
        int op;
        if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) op = CMP_EQ;
        else if (!strcmp(name, "ne") || !strcmp(name, "!=")) op = CMP_NE;
        else if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) op = CMP_LT;
        else if (!strcmp(name, "le") || !strcmp(name, "<=")) op = CMP_LE;
        else if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) op = CMP_GT;
        else if (!strcmp(name, "ge") || !strcmp(name, ">=")) op = CMP_GE;
        else if (!strcmp(name, "in")) op = CMP_IN;
        else if (!strcmp(name, "sameas")) {
            *res = v.t == arg->t && (v.t < JV_STR ? jv_equal(v, *arg) : v.u.o == arg->u.o);
            return 0;
        } else return fail(e, n, "no test named '%s'", name);
        return compare(e, n, op, v, *arg, res);
    }
    return 0;
}

/* ---------------------------------------------------------------- filters */

static int apply_filter(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out);

static bool fname(const char *name, const char *x) { return !strcmp(name, x); }

/* select/reject/selectattr/rejectattr: keep items whose test (or truthiness) == want. */
static int filter_select(ev *e, const node *n, jv v, cargs *a, bool by_attr, bool want, jv *out)
{
    jv items;
    size_t first = by_attr ? 1 : 0;
    jv *attr = by_attr ? arg_get(a, 0, NULL) : NULL;
    jv *test = arg_get(a, first, NULL);
    if (!jv_truthy(v)) { /* jinja: `if value:` guards the loop, so falsy inputs give nothing */
        *out = jv_list(&e->heap, 0, false);
        return built(e, n, out);
    }
    if (by_attr && !attr) return fail(e, n, "selectattr/rejectattr need an attribute name");
    if (test && test->t != JV_STR) return fail(e, n, "the test name must be a string");
    if (iterate(e, n, v, &items)) return -1;
    *out = jv_list(&e->heap, 0, false);
    for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST; i++) {
        jv x = items.u.l->v[i], val;
        bool r;
        if (by_attr) {
            if (get_path(e, n, x, *attr, &val)) goto fail;
        } else {
            val = jv_ref(x);
        }
        if (test) {
            int rc = apply_test(e, n, test->u.s->s, val, arg_get(a, first + 1, NULL), &r);
            if (rc) {
                jv_unref(val);
                goto fail;
            }
        } else {
            r = jv_truthy(val);
        }
        jv_unref(val);
        if (r == want) jv_list_push(*out, jv_ref(x));
    }
    jv_unref(items);
    if (tick(e, n, out->t == JV_LIST ? out->u.l->n : 0)) return -1;
    return built(e, n, out);
fail:
    jv_unref(items);
    jv_drop(out);
    return -1;
}

static int filter_join(ev *e, const node *n, jv v, cargs *a, jv *out)
{
    jv items, *sep = arg_get(a, 0, "d"), *attr = arg_get(a, 1, "attribute");
    if (iterate(e, n, v, &items)) return -1;
    jbuf b = {.max = e->lim->max_output};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (i && sep) jv_to_str(&b, *sep);
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
        return fail(e, n, "join result exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    if (tick(e, n, b.n / 64 + 1)) return -1;
    return built(e, n, out);
}

static int filter_tojson(ev *e, const node *n, jv v, cargs *a, jv *out)
{
    jjson_opts o = {.indent = -1};
    jv *ea = arg_get(a, 0, "ensure_ascii"), *ind = arg_get(a, 1, "indent"), *seps = arg_get(a, 2, "separators"),
       *sk = arg_get(a, 3, "sort_keys");
    char ibuf[8], kbuf[8];
    if (ea) o.ensure_ascii = jv_truthy(*ea);
    if (sk) o.sort_keys = jv_truthy(*sk);
    if (ind && ind->t != JV_NONE) {
        if (!is_int(*ind)) return fail(e, n, "tojson indent must be an integer");
        o.indent = as_int(*ind) < 0 ? 0 : as_int(*ind) > 64 ? 64 : (int)as_int(*ind);
    }
    if (seps && seps->t != JV_NONE) {
        if (seps->t != JV_LIST || seps->u.l->n != 2 || seps->u.l->v[0].t != JV_STR || seps->u.l->v[1].t != JV_STR)
            return fail(e, n, "tojson separators must be a pair of strings");
        snprintf(ibuf, sizeof ibuf, "%s", seps->u.l->v[0].u.s->s);
        snprintf(kbuf, sizeof kbuf, "%s", seps->u.l->v[1].u.s->s);
        o.item_sep = ibuf;
        o.key_sep = kbuf;
    }
    jbuf b = {.max = e->lim->max_output};
    char msg[200];
    if (jv_to_json(&b, v, &o, msg, sizeof msg)) {
        jbuf_free(&b);
        return fail(e, n, "%s", msg);
    }
    if (b.over) {
        jbuf_free(&b);
        return fail(e, n, "tojson result exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    if (tick(e, n, b.n / 64 + 1)) return -1;
    return built(e, n, out);
}

/* Python int(str) as jinja's do_int tries it: int(s, base), then int(float(s)). */
static bool parse_pyint(const char *s, int base, int64_t *out)
{
    while (*s && strchr(" \t\n\r\f\v", *s)) s++;
    char buf[80];
    size_t k = 0;
    const char *p = s;
    if (*p == '+' || *p == '-') buf[k++] = *p++;
    if (!*p) return false;
    for (; *p && !strchr(" \t\n\r\f\v", *p); p++) {
        if (*p == '_') continue;
        if (k >= sizeof buf - 1) return false;
        buf[k++] = *p;
    }
    while (*p && strchr(" \t\n\r\f\v", *p)) p++;
    if (*p) return false;
    buf[k] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, base);
    if (*end || end == buf || errno) return false;
    *out = v;
    return true;
}

static bool parse_pyfloat(const char *s, double *out)
{
    while (*s && strchr(" \t\n\r\f\v", *s)) s++;
    if (!*s) return false;
    char *end;
    double d = strtod(s, &end);
    while (*end && strchr(" \t\n\r\f\v", *end)) end++;
    if (*end || end == s) return false;
    *out = d;
    return true;
}

static int filter_indent(ev *e, const node *n, jv v, cargs *a, jv *out)
{
    jv s, *w = arg_get(a, 0, "width"), *first = arg_get(a, 1, "first"), *blank = arg_get(a, 2, "blank");
    if (v.t != JV_STR) return fail(e, n, "unsupported operand type(s) for +=: '%s' and 'str' (indent needs a string)", jv_type_name(v));
    s = jv_ref(v);
    jbuf ind = {0}, b = {.max = e->lim->max_output};
    if (w && w->t == JV_STR) jbuf_put(&ind, w->u.s->s, w->u.s->len);
    else for (int64_t i = 0; i < (w && is_int(*w) ? as_int(*w) : 4) && i < 1024; i++) jbuf_putc(&ind, ' ');
    jv lines;
    /* jinja appends "\n" before splitlines so a trailing newline does not vanish */
    jbuf tmp = {0};
    jbuf_put(&tmp, s.u.s->s, s.u.s->len);
    jbuf_putc(&tmp, '\n');
    jv_unref(s);
    jv t = mkstr(e, tmp.p, tmp.n);
    jbuf_free(&tmp);
    if (oom_check(e, n) || str_splitlines(e, n, t, &lines)) {
        jv_unref(t);
        jbuf_free(&ind);
        return -1;
    }
    jv_unref(t);
    if (first && jv_truthy(*first)) jbuf_put(&b, ind.p ? ind.p : "", ind.n);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jv l = lines.u.l->v[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if ((blank && jv_truthy(*blank)) || l.u.s->len) jbuf_put(&b, ind.p ? ind.p : "", ind.n);
        }
        jbuf_put(&b, l.u.s->s, l.u.s->len);
    }
    jv_unref(lines);
    jbuf_free(&ind);
    if (b.over) {
        jbuf_free(&b);
        return fail(e, n, "indent result exceeds the output limit");
    }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return built(e, n, out);
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
        if (str_case(c->e, c->n, a, 'l', &la)) return c->failed = true, 0;
        if (str_case(c->e, c->n, b, 'l', &lb)) return jv_unref(la), c->failed = true, 0;
        if (cmp_order(c->e, c->n, la, lb, &r, "<")) c->failed = true;
        jv_unref(la);
        jv_unref(lb);
        return r;
    }
    if (cmp_order(c->e, c->n, a, b, &r, "<")) c->failed = true;
    return r;
}

/* Stable merge sort of items by keys (both arrays of n). */
static void msort(sort_ctx *c, jv *items, jv *keys, size_t n, jv *ti, jv *tk, bool reverse)
{
    if (n < 2 || c->failed) return;
    size_t h = n / 2;
    msort(c, items, keys, h, ti, tk, reverse);
    msort(c, items + h, keys + h, n - h, ti, tk, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = key_cmp(c, keys[j], keys[i]);
        bool take_right = reverse ? r > 0 : r < 0;
        if (take_right) ti[k] = items[j], tk[k++] = keys[j++];
        else ti[k] = items[i], tk[k++] = keys[i++];
    }
    while (i < h) ti[k] = items[i], tk[k++] = keys[i++];
    while (j < n) ti[k] = items[j], tk[k++] = keys[j++];
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
        fail(e, n, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < cnt; i++) {
        jv it = list.u.l->v[i];
        if (dict_by >= 0) keys[i] = jv_ref(it.u.l->v[dict_by]);
        else if (attr) {
            if (get_path(e, n, it, *attr, &keys[i])) {
                for (size_t k = 0; k < i; k++) jv_unref(keys[k]);
                goto out;
            }
        } else keys[i] = jv_ref(it);
    }
    sort_ctx c = {e, n, case_sensitive, false};
    if (tick(e, n, cnt * 4)) goto unref;
    msort(&c, list.u.l->v, keys, cnt, ti, tk, reverse);
    rc = c.failed ? -1 : 0;
unref:
    for (size_t k = 0; k < cnt; k++) jv_unref(keys[k]);
out:
    free(keys);
    free(ti);
    free(tk);
    return rc;
}

static int copy_list(ev *e, const node *n, jv v, jv *out)
{
    jv items;
    if (iterate(e, n, v, &items)) return -1;
    *out = jv_list(&e->heap, items.u.l->n, false);
    for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST; i++) jv_list_push(*out, jv_ref(items.u.l->v[i]));
    jv_unref(items);
    return built(e, n, out);
}

static int apply_filter_inner(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    if (fname(name, "default") || fname(name, "d")) {
        jv *dv = arg_get(a, 0, "default_value"), *boolean = arg_get(a, 1, "boolean");
        bool use = v.t == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        if (use) *out = dv ? jv_ref(*dv) : mkstr(e, "", 0);
        else *out = jv_ref(v);
        return built(e, n, out);
    }
    if (fname(name, "length") || fname(name, "count")) {
        switch (v.t) {
        case JV_UNDEF: *out = jv_int(0); return 0;
        case JV_STR: *out = jv_int((int64_t)utf8_count(v.u.s->s, v.u.s->len)); return 0;
        case JV_LIST: *out = jv_int((int64_t)v.u.l->n); return 0;
        case JV_DICT: *out = jv_int((int64_t)v.u.d->n); return 0;
        default: return fail(e, n, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (fname(name, "string")) return to_str(e, n, v, out);
    if (fname(name, "safe")) return v.t == JV_STR ? (*out = jv_ref(v), 0) : to_str(e, n, v, out);
    if (fname(name, "trim")) {
        jv s;
        if (to_str(e, n, v, &s)) return -1;
        int rc = str_strip(e, n, s, arg_get(a, 0, "chars"), 3, out);
        jv_unref(s);
        return rc;
    }
    if (fname(name, "upper") || fname(name, "lower") || fname(name, "title") || fname(name, "capitalize")) {
        jv s;
        if (to_str(e, n, v, &s)) return -1;
        int rc = str_case(e, n, s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 't' ? 't' : 'c', out);
        jv_unref(s);
        return rc;
    }
    if (fname(name, "escape") || fname(name, "e")) {
        jv s;
        if (to_str(e, n, v, &s)) return -1;
        jbuf b = {0};
        for (size_t i = 0; i < s.u.s->len; i++) {
            char c = s.u.s->s[i];
            if (c == '&') jbuf_puts(&b, "&amp;");
            else if (c == '<') jbuf_puts(&b, "&lt;");
            else if (c == '>') jbuf_puts(&b, "&gt;");
            else if (c == '"') jbuf_puts(&b, "&#34;");
            else if (c == '\'') jbuf_puts(&b, "&#39;");
            else jbuf_putc(&b, c);
        }
        jv_unref(s);
        *out = mkstr(e, b.p ? b.p : "", b.n);
        jbuf_free(&b);
        return built(e, n, out);
    }
    if (fname(name, "replace")) {
        jv s, *old = arg_get(a, 0, "old"), *nw = arg_get(a, 1, "new"), *cnt = arg_get(a, 2, "count");
        jv so, sn;
        if (!old || !nw) return fail(e, n, "replace needs old and new strings");
        if (to_str(e, n, v, &s)) return -1;
        if (to_str(e, n, *old, &so)) return jv_unref(s), -1;
        if (to_str(e, n, *nw, &sn)) return jv_unref(s), jv_unref(so), -1;
        int rc = str_replace(e, n, s, so, sn, cnt && is_int(*cnt) ? as_int(*cnt) : -1, out);
        jv_unref(s);
        jv_unref(so);
        jv_unref(sn);
        return rc;
    }
    if (fname(name, "tojson")) return filter_tojson(e, n, v, a, out);
    if (fname(name, "join")) return filter_join(e, n, v, a, out);
    if (fname(name, "list")) return copy_list(e, n, v, out);
    if (fname(name, "items")) {
        if (v.t == JV_UNDEF) {
            *out = jv_list(&e->heap, 0, false);
            return built(e, n, out);
        }
        if (v.t != JV_DICT) return fail(e, n, "Can only get item pairs from a mapping.");
        *out = jv_list(&e->heap, v.u.d->n, false);
        for (size_t i = 0; i < v.u.d->n && out->t == JV_LIST; i++) {
            jv pair = jv_list(&e->heap, 2, true);
            if (pair.t != JV_LIST) break;
            jv_list_push(pair, jv_ref(v.u.d->k[i]));
            jv_list_push(pair, jv_ref(v.u.d->v[i]));
            jv_list_push(*out, pair);
        }
        return built(e, n, out);
    }
    if (fname(name, "select")) return filter_select(e, n, v, a, false, true, out);
    if (fname(name, "reject")) return filter_select(e, n, v, a, false, false, out);
    if (fname(name, "selectattr")) return filter_select(e, n, v, a, true, true, out);
    if (fname(name, "rejectattr")) return filter_select(e, n, v, a, true, false, out);
    if (fname(name, "map")) {
        jv items, *attr = arg_get(a, (size_t)-1, "attribute"), *dflt = arg_get(a, (size_t)-1, "default");
        if (!jv_truthy(v)) {
            *out = jv_list(&e->heap, 0, false);
            return built(e, n, out);
        }
        if (!attr && (!a->npos || a->pos[0].t != JV_STR)) return fail(e, n, "map needs a filter name or attribute=");
        if (iterate(e, n, v, &items)) return -1;
        *out = jv_list(&e->heap, items.u.l->n, false);
        cargs rest = {a->pos + (a->npos ? 1 : 0), a->npos ? a->npos - 1 : 0, NULL, NULL, 0};
        for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST; i++) {
            jv r;
            int rc = attr ? get_path(e, n, items.u.l->v[i], *attr, &r)
                          : apply_filter(e, n, a->pos[0].u.s->s, items.u.l->v[i], &rest, &r);
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
        return built(e, n, out);
    }
    if (fname(name, "first") || fname(name, "last")) {
        jv items;
        if (v.t == JV_STR && fname(name, "last") == false && v.u.s->len == 0) {
            *out = jv_undef_hint(&e->heap, "No first item, sequence was empty.");
            return 0;
        }
        if (iterate(e, n, v, &items)) return -1;
        if (!items.u.l->n) *out = jv_undef_hint(&e->heap, "No %s item, sequence was empty.", name);
        else *out = jv_ref(items.u.l->v[name[0] == 'f' ? 0 : items.u.l->n - 1]);
        jv_unref(items);
        return 0;
    }
    if (fname(name, "reverse")) {
        if (v.t == JV_STR) {
            jv s = jv_int(-1), none = jv_none();
            return do_slice(e, n, v, none, none, s, out);
        }
        if (copy_list(e, n, v, out)) return -1;
        jlist *l = out->u.l;
        for (size_t i = 0; i < l->n / 2; i++) {
            jv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
        return 0;
    }
    if (fname(name, "sort")) {
        jv *rev = arg_get(a, 0, "reverse"), *cs = arg_get(a, 1, "case_sensitive"), *attr = arg_get(a, 2, "attribute");
        if (copy_list(e, n, v, out)) return -1;
        if (sort_list(e, n, *out, attr, cs && jv_truthy(*cs), rev && jv_truthy(*rev), -1)) return jv_drop(out), -1;
        return 0;
    }
    if (fname(name, "dictsort")) {
        jv *cs = arg_get(a, 0, "case_sensitive"), *by = arg_get(a, 1, "by"), *rev = arg_get(a, 2, "reverse");
        if (v.t != JV_DICT) return fail(e, n, "dictsort needs a mapping, got %s", jv_type_name(v));
        int pos = by && by->t == JV_STR && !strcmp(by->u.s->s, "value") ? 1 : 0;
        cargs none = {0};
        if (apply_filter(e, n, "items", v, &none, out)) return -1;
        if (sort_list(e, n, *out, NULL, cs && jv_truthy(*cs), rev && jv_truthy(*rev), pos)) return jv_drop(out), -1;
        return 0;
    }
    if (fname(name, "unique")) {
        jv items, *cs = arg_get(a, 0, "case_sensitive"), *attr = arg_get(a, 1, "attribute");
        if (iterate(e, n, v, &items)) return -1;
        *out = jv_list(&e->heap, 0, false);
        jv seen = jv_list(&e->heap, 0, false);
        for (size_t i = 0; i < items.u.l->n && out->t == JV_LIST && seen.t == JV_LIST; i++) {
            jv key, x = items.u.l->v[i];
            if (attr ? get_path(e, n, x, *attr, &key) : (key = jv_ref(x), 0)) break;
            if (!(cs && jv_truthy(*cs)) && key.t == JV_STR) {
                jv low;
                int rc = str_case(e, n, key, 'l', &low);
                jv_unref(key);
                if (rc) break;
                key = low;
            }
            bool dup;
            contains(e, n, key, seen, &dup);
            if (!dup) {
                jv_list_push(seen, key);
                jv_list_push(*out, jv_ref(x));
            } else {
                jv_unref(key);
            }
        }
        jv_unref(items);
        jv_unref(seen);
        if (e->failed) return jv_drop(out), -1;
        return built(e, n, out);
    }
    if (fname(name, "min") || fname(name, "max")) {
        jv items, *cs = arg_get(a, 0, "case_sensitive"), *attr = arg_get(a, 1, "attribute");
        if (copy_list(e, n, v, &items)) return -1;
        if (sort_list(e, n, items, attr, cs && jv_truthy(*cs), false, -1)) return jv_unref(items), -1;
        if (!items.u.l->n) *out = jv_undef_hint(&e->heap, "No aggregated item, sequence was empty.");
        else *out = jv_ref(items.u.l->v[name[1] == 'i' ? 0 : items.u.l->n - 1]);
        jv_unref(items);
        return 0;
    }
    if (fname(name, "sum")) {
        jv items, *attr = arg_get(a, 0, "attribute"), *start = arg_get(a, 1, "start");
        if (iterate(e, n, v, &items)) return -1;
        jv acc = start ? jv_ref(*start) : jv_int(0);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv x, r;
            if (attr ? get_path(e, n, items.u.l->v[i], *attr, &x) : (x = jv_ref(items.u.l->v[i]), 0)) break;
            int rc = arith(e, n, OP_ADD, acc, x, &r);
            jv_unref(x);
            if (rc) break;
            jv_unref(acc);
            acc = r;
        }
        jv_unref(items);
        if (e->failed) return jv_unref(acc), -1;
        *out = acc;
        return 0;
    }
    if (fname(name, "abs")) {
        if (v.t == JV_FLOAT) *out = jv_float(fabs(v.u.f));
        else if (is_int(v)) {
            if (as_int(v) == INT64_MIN) return fail(e, n, "integer overflow in abs");
            *out = jv_int(as_int(v) < 0 ? -as_int(v) : as_int(v));
        } else return fail(e, n, "bad operand type for abs(): '%s'", jv_type_name(v));
        return 0;
    }
    if (fname(name, "int")) {
        jv *dflt = arg_get(a, 0, "default"), *base = arg_get(a, 1, "base");
        int64_t r;
        double d;
        if (v.t == JV_UNDEF) return fail_undef(e, n, v);
        if (is_int(v)) *out = jv_int(as_int(v));
        else if (v.t == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) *out = jv_int((int64_t)v.u.f);
        else if (v.t == JV_STR && parse_pyint(v.u.s->s, base && is_int(*base) ? (int)as_int(*base) : 10, &r)) *out = jv_int(r);
        else if (v.t == JV_STR && parse_pyfloat(v.u.s->s, &d) && isfinite(d) && fabs(d) < 9.2e18) *out = jv_int((int64_t)d);
        else *out = dflt ? jv_ref(*dflt) : jv_int(0);
        return 0;
    }
    if (fname(name, "float")) {
        jv *dflt = arg_get(a, 0, "default");
        double d;
        if (v.t == JV_UNDEF) return fail_undef(e, n, v);
        if (is_num(v)) *out = jv_float(as_num(v));
        else if (v.t == JV_STR && parse_pyfloat(v.u.s->s, &d)) *out = jv_float(d);
        else *out = dflt ? jv_ref(*dflt) : jv_float(0.0);
        return 0;
    }
    if (fname(name, "round")) {
        jv *prec = arg_get(a, 0, "precision"), *method = arg_get(a, 1, "method");
        if (!is_num(v)) return fail(e, n, "round needs a number, got %s", jv_type_name(v));
        double x = as_num(v), m = pow(10.0, prec && is_int(*prec) ? (double)as_int(*prec) : 0.0);
        const char *md = method && method->t == JV_STR ? method->u.s->s : "common";
        double r;
        if (!strcmp(md, "common") && is_int(v)) return *out = jv_int(as_int(v)), 0; /* Python round(int, k) is int */
        if (!strcmp(md, "common")) r = nearbyint(x * m) / m;
        else if (!strcmp(md, "ceil")) r = ceil(x * m) / m;
        else if (!strcmp(md, "floor")) r = floor(x * m) / m;
        else return fail(e, n, "method must be common, ceil or floor");
        *out = jv_float(r);
        return 0;
    }
    if (fname(name, "indent")) return filter_indent(e, n, v, a, out);
    if (fname(name, "attr")) {
        jv *nm = arg_get(a, 0, "name");
        if (!nm || nm->t != JV_STR) return fail(e, n, "attr needs a name");
        return getattr_v(e, n, v, nm->u.s->s, out);
    }
    return fail(e, n, "filter '%s' is not implemented", name);
}

static int apply_filter(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out)
{
    *out = jv_undef();
    if (tick(e, n, 1)) return -1;
    int rc = apply_filter_inner(e, n, name, v, a, out);
    if (rc) jv_drop(out);
    return rc;
}

/* ---------------------------------------------------------------- methods */

static int check_str_arg(ev *e, const node *n, jv *v, const char *meth)
{
    if (!v || v->t != JV_STR) return fail(e, n, "%s() needs a string argument", meth);
    return 0;
}

static bool has_affix(jv s, jv x, bool end)
{
    if (x.u.s->len > s.u.s->len) return false;
    return !memcmp(s.u.s->s + (end ? s.u.s->len - x.u.s->len : 0), x.u.s->s, x.u.s->len);
}

/* str.format with auto/manual numbering and names; no format specs. */
static int str_format(ev *e, const node *n, jv s, cargs *a, jv *out)
{
    jbuf b = {.max = e->lim->max_output};
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    size_t autoi = 0;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { jbuf_putc(&b, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { jbuf_putc(&b, '}'); p += 2; continue; }
        if (*p == '}') { jbuf_free(&b); return fail(e, n, "Single '}' encountered in format string"); }
        if (*p != '{') { jbuf_putc(&b, *p++); continue; }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) { jbuf_free(&b); return fail(e, n, "Single '{' encountered in format string"); }
        const char *f = p + 1;
        size_t fl = (size_t)(q - f);
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '[', fl) || memchr(f, '.', fl)) {
            jbuf_free(&b);
            return fail(e, n, "str.format fields with conversions or format specs are not supported");
        }
        jv *val = NULL;
        if (!fl) val = arg_get(a, autoi++, NULL);
        else if (f[0] >= '0' && f[0] <= '9') val = arg_get(a, (size_t)strtoul(f, NULL, 10), NULL);
        else {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(fl < 63 ? fl : 63), f);
            for (size_t k = 0; k < a->nkw; k++)
                if (!strcmp(a->kwn[k], nm)) val = &a->kw[k];
        }
        if (!val) { jbuf_free(&b); return fail(e, n, "str.format: no argument for field '{%.*s}'", (int)fl, f); }
        jv_to_str(&b, *val);
        p = q + 1;
    }
    if (b.over) { jbuf_free(&b); return fail(e, n, "format result exceeds the output limit"); }
    *out = mkstr(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return built(e, n, out);
}

static int str_method(ev *e, const node *n, const char *m, jv s, cargs *a, jv *out)
{
    jv *x = arg_get(a, 0, NULL);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool end = m[0] == 'e', r = false;
        if (x && x->t == JV_LIST && x->u.l->tuple) {
            for (size_t i = 0; i < x->u.l->n; i++) {
                if (check_str_arg(e, n, &x->u.l->v[i], m)) return -1;
                r = r || has_affix(s, x->u.l->v[i], end);
            }
        } else {
            if (check_str_arg(e, n, x, m)) return -1;
            r = has_affix(s, *x, end);
        }
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv *sep = arg_get(a, 0, "sep"), *mx = arg_get(a, 1, "maxsplit");
        return str_split(e, n, s, sep, mx && is_int(*mx) ? as_int(*mx) : -1, m[0] == 'r', out);
    }
    if (!strcmp(m, "strip")) return str_strip(e, n, s, x, 3, out);
    if (!strcmp(m, "lstrip")) return str_strip(e, n, s, x, 1, out);
    if (!strcmp(m, "rstrip")) return str_strip(e, n, s, x, 2, out);
    if (!strcmp(m, "upper")) return str_case(e, n, s, 'u', out);
    if (!strcmp(m, "lower")) return str_case(e, n, s, 'l', out);
    if (!strcmp(m, "title")) return str_case(e, n, s, 't', out);
    if (!strcmp(m, "capitalize")) return str_case(e, n, s, 'c', out);
    if (!strcmp(m, "replace")) {
        jv *nw = arg_get(a, 1, NULL), *cnt = arg_get(a, 2, "count");
        if (!x || !nw) return fail(e, n, "replace() takes at least 2 arguments");
        return str_replace(e, n, s, *x, *nw, cnt && is_int(*cnt) ? as_int(*cnt) : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        if (check_str_arg(e, n, x, m)) return -1;
        const char *p = s.u.s->s, *hit = NULL;
        size_t len = s.u.s->len, xl = x->u.s->len;
        if (!strcmp(m, "count")) {
            int64_t c = 0;
            if (!xl) c = (int64_t)utf8_count(p, len) + 1;
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
        if (!hit && m[0] == 'i') return fail(e, n, "substring not found");
        *out = jv_int(hit ? (int64_t)utf8_count(p, (size_t)(hit - p)) : -1);
        return 0;
    }
    if (!strcmp(m, "join")) {
        jv items;
        if (!x) return fail(e, n, "join() takes exactly one argument");
        if (iterate(e, n, *x, &items)) return -1;
        jbuf b = {.max = e->lim->max_output};
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (items.u.l->v[i].t != JV_STR) {
                jv_unref(items);
                jbuf_free(&b);
                return fail(e, n, "sequence item %zu: expected str instance, %s found", i, jv_type_name(items.u.l->v[i]));
            }
            if (i) jbuf_put(&b, s.u.s->s, s.u.s->len);
            jv_to_str(&b, items.u.l->v[i]);
        }
        jv_unref(items);
        if (b.over) { jbuf_free(&b); return fail(e, n, "join result exceeds the output limit"); }
        *out = mkstr(e, b.p ? b.p : "", b.n);
        jbuf_free(&b);
        return built(e, n, out);
    }
    if (!strncmp(m, "is", 2)) {
        bool r = s.u.s->len > 0, any_cased = false, lower = true, upper = true;
        for (size_t i = 0; i < s.u.s->len;) {
            uint32_t c;
            i += (size_t)utf8_decode(s.u.s->s + i, s.u.s->len - i, &c);
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
            bool digit = cat == UTF8PROC_CATEGORY_ND, alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) any_cased = true, lower = false;
            if (cat == UTF8PROC_CATEGORY_LL) any_cased = true, upper = false;
            if (!strcmp(m, "isdigit")) r = r && digit;
            else if (!strcmp(m, "isalpha")) r = r && alpha;
            else if (!strcmp(m, "isalnum")) r = r && (alpha || digit);
            else if (!strcmp(m, "isspace")) r = r && py_isspace_cp(c);
        }
        if (!strcmp(m, "islower")) r = any_cased && lower;
        if (!strcmp(m, "isupper")) r = any_cased && upper;
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "splitlines")) return str_splitlines(e, n, s, out);
    if (!strcmp(m, "format")) return str_format(e, n, s, a, out);
    if (!strcmp(m, "zfill")) {
        if (!x || !is_int(*x)) return fail(e, n, "zfill() needs an integer width");
        size_t cps = utf8_count(s.u.s->s, s.u.s->len);
        int64_t w = as_int(*x);
        if (w <= (int64_t)cps) return *out = jv_ref(s), 0;
        if (w > (int64_t)e->lim->max_output) return fail(e, n, "zfill width exceeds the output limit");
        jbuf b = {0};
        size_t sign = s.u.s->len && (s.u.s->s[0] == '-' || s.u.s->s[0] == '+');
        jbuf_put(&b, s.u.s->s, sign);
        for (int64_t i = 0; i < w - (int64_t)cps; i++) jbuf_putc(&b, '0');
        jbuf_put(&b, s.u.s->s + sign, s.u.s->len - sign);
        *out = mkstr(e, b.p, b.n);
        jbuf_free(&b);
        return built(e, n, out);
    }
    return fail(e, n, "str has no method '%s'", m);
}

static int call_method(ev *e, const node *n, jfunc *f, cargs *a, jv *out)
{
    jv self = f->self;
    const char *m = f->name;
    if (self.t == JV_STR) return str_method(e, n, m, self, a, out);
    if (self.t == JV_DICT) {
        cargs none = {0};
        if (!strcmp(m, "items")) return apply_filter(e, n, "items", self, &none, out);
        if (!strcmp(m, "keys")) return copy_list(e, n, self, out);
        if (!strcmp(m, "values")) {
            *out = jv_list(&e->heap, self.u.d->n, false);
            for (size_t i = 0; i < self.u.d->n && out->t == JV_LIST; i++) jv_list_push(*out, jv_ref(self.u.d->v[i]));
            return built(e, n, out);
        }
        if (!strcmp(m, "get")) {
            jv *k = arg_get(a, 0, NULL), *d = arg_get(a, 1, NULL);
            if (!k) return fail(e, n, "get expected at least 1 argument, got 0");
            jv *v = jv_dict_get(self, *k);
            *out = v ? jv_ref(*v) : d ? jv_ref(*d) : jv_none();
            return 0;
        }
    }
    if (self.t == JV_LIST) {
        jv *x = arg_get(a, 0, NULL);
        if (!x) return fail(e, n, "%s() takes exactly one argument", m);
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (jv_equal(self.u.l->v[i], *x)) {
                if (!strcmp(m, "index")) return *out = jv_int((int64_t)i), 0;
                c++;
            }
        if (!strcmp(m, "index")) return fail(e, n, "value is not in list");
        *out = jv_int(c);
        return 0;
    }
    return fail(e, n, "'%s' object has no method '%s'", jv_type_name(self), m);
}

/* ---------------------------------------------------------------- loop variable */

static int loop_attr(ev *e, const node *n, jv loop, const char *name, jv *out)
{
    jloop *lp = loop.u.lp;
    size_t i = lp->index0, len = lp->length;
    if (!strcmp(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jv_int((int64_t)(len - i));
    else if (!strcmp(name, "revindex0")) *out = jv_int((int64_t)(len - i - 1));
    else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(i + 1 == len);
    else if (!strcmp(name, "length")) *out = jv_int((int64_t)len);
    else if (!strcmp(name, "depth")) *out = jv_int(lp->depth0 + 1);
    else if (!strcmp(name, "depth0")) *out = jv_int(lp->depth0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? jv_ref(lp->items->v[i - 1]) : jv_undef_hint(&e->heap, "there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < len ? jv_ref(lp->items->v[i + 1]) : jv_undef_hint(&e->heap, "there is no next item");
    else if (!strcmp(name, "cycle")) {
        *out = jv_func(&e->heap, JF_CYCLE, "cycle", jv_ref(loop));
        return built(e, n, out);
    } else *out = jv_undef_hint(&e->heap, "'LoopContext' object has no attribute '%s'", name);
    return 0;
}

/* ---------------------------------------------------------------- calls */

static int render_body_to_string(ev *e, const node *body, jv *out);

static int call_macro(ev *e, const node *n, jfunc *f, cargs *a, jv *out)
{
    const node *m = f->macro;
    if (e->macro_depth >= e->lim->max_depth)
        return fail(e, n, "macro calls nest deeper than %u levels (runaway recursion?)", e->lim->max_depth);
    if (a->npos > m->ntargets)
        return fail(e, n, "macro '%s' takes not more than %zu argument(s)", m->name, m->ntargets);
    frame fr, *saved = e->scope;
    if (!frame_init(e, &fr, e->root)) return tick(e, n, 0);
    e->scope = &fr;
    int rc = 0;
    for (size_t i = 0; i < m->ntargets && !rc; i++) {
        jv v, *given = i < a->npos ? &a->pos[i] : NULL;
        for (size_t k = 0; !given && k < a->nkw; k++)
            if (!strcmp(a->kwn[k], m->tnames[i])) given = &a->kw[k];
        if (given) v = jv_ref(*given);
        else if (m->pdefaults[i]) rc = eval(e, m->pdefaults[i], &v);
        else v = jv_undef_hint(&e->heap, "parameter '%s' was not provided", m->tnames[i]);
        if (!rc) rc = assign(e, n, &fr, m->tnames[i], v);
    }
    for (size_t k = 0; !rc && k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->ntargets; i++) known |= !strcmp(a->kwn[k], m->tnames[i]);
        if (!known) rc = fail(e, n, "macro '%s' has no parameter named '%s'", m->name, a->kwn[k]);
    }
    if (!rc) {
        e->macro_depth++;
        rc = render_body_to_string(e, m->a, out);
        e->macro_depth--;
    }
    e->scope = saved;
    frame_free(&fr);
    return rc;
}

static int call_range(ev *e, const node *n, cargs *a, jv *out)
{
    int64_t start = 0, stop, step = 1;
    for (size_t i = 0; i < a->npos; i++)
        if (!is_int(a->pos[i])) return fail(e, n, "range() arguments must be integers, not %s", jv_type_name(a->pos[i]));
    if (a->npos == 1) stop = as_int(a->pos[0]);
    else if (a->npos == 2 || a->npos == 3) {
        start = as_int(a->pos[0]);
        stop = as_int(a->pos[1]);
        if (a->npos == 3) step = as_int(a->pos[2]);
    } else return fail(e, n, "range expected 1 to 3 arguments, got %zu", a->npos);
    if (!step) return fail(e, n, "range() arg 3 must not be zero");
    /* length without overflow: ceil((stop - start) / step) in 128-bit-free form */
    uint64_t count = 0;
    if (step > 0 && start < stop) count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    if (step < 0 && start > stop) count = ((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-(step + 1) + 1ULL) + 1;
    if (count > e->lim->max_range)
        return fail(e, n, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%llu).",
                    (unsigned long long)e->lim->max_range);
    if (tick(e, n, count)) return -1;
    *out = jv_list(&e->heap, count, false);
    for (uint64_t i = 0; i < count && out->t == JV_LIST; i++) jv_list_push(*out, jv_int(start + (int64_t)i * step));
    return built(e, n, out);
}

static int call_value_inner(ev *e, const node *n, jv fn, cargs *a, jv *out)
{
    if (fn.t == JV_UNDEF) return fail_undef(e, n, fn);
    if (fn.t != JV_FUNC) return fail(e, n, "'%s' object is not callable", jv_type_name(fn));
    jfunc *f = fn.u.fn;
    switch (f->kind) {
    case JF_RANGE: return call_range(e, n, a, out);
    case JF_NAMESPACE:
    case JF_DICT: {
        *out = jv_dict(&e->heap, f->kind == JF_NAMESPACE);
        if (oom_check(e, n)) return -1;
        if (a->npos > 1) return fail(e, n, "%s expected at most 1 positional argument", f->name);
        if (a->npos) {
            if (a->pos[0].t != JV_DICT) return fail(e, n, "%s() positional argument must be a mapping", f->name);
            for (size_t i = 0; i < a->pos[0].u.d->n; i++) {
                jv k = a->pos[0].u.d->k[i];
                if (f->kind == JF_NAMESPACE && k.t == JV_STR && k.u.s->s[0] == '_')
                    return fail(e, n, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", k.u.s->s);
                jv_dict_set(*out, jv_ref(k), jv_ref(a->pos[0].u.d->v[i]));
            }
        }
        for (size_t i = 0; i < a->nkw; i++) {
            if (f->kind == JF_NAMESPACE && a->kwn[i][0] == '_')
                return fail(e, n, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", a->kwn[i]);
            jv_dict_set(*out, jv_cstr(&e->heap, a->kwn[i]), jv_ref(a->kw[i]));
        }
        return built(e, n, out);
    }
    case JF_RAISE: {
        jv *msg = arg_get(a, 0, "message");
        jbuf b = {.max = 4096};
        if (msg) jv_to_str(&b, *msg);
        if (!e->failed) {
            e->failed = true;
            e->rc = TEMPLATE_ERR_RAISED;
            snprintf(e->err, e->errlen, "%s", b.p ? b.p : "");
        }
        jbuf_free(&b);
        return -1;
    }
    case JF_STRFTIME: {
        jv *fmt = arg_get(a, 0, "format");
        if (!fmt || fmt->t != JV_STR) return fail(e, n, "strftime_now() needs a format string");
        struct tm tmv;
        if (!localtime_r(&e->now, &tmv)) return fail(e, n, "strftime_now(): the clock is out of range");
        char buf[1024];
        size_t k = fmt->u.s->len ? strftime(buf, sizeof buf, fmt->u.s->s, &tmv) : 0;
        if (!k && fmt->u.s->len) return fail(e, n, "strftime_now(): format produces more than 1 KiB or nothing");
        *out = mkstr(e, buf, k);
        return built(e, n, out);
    }
    case JF_MACRO: return call_macro(e, n, f, a, out);
    case JF_METHOD: return call_method(e, n, f, a, out);
    case JF_CYCLE: {
        if (!a->npos) return fail(e, n, "no items for cycling given");
        *out = jv_ref(a->pos[f->self.u.lp->index0 % a->npos]);
        return 0;
    }
    }
    return fail(e, n, "value is not callable");
}

static int call_value(ev *e, const node *n, jv fn, cargs *a, jv *out)
{
    *out = jv_undef();
    int rc = call_value_inner(e, n, fn, a, out);
    if (rc) jv_drop(out);
    return rc;
}

static jv builtin(ev *e, const char *name)
{
    static const struct { const char *name; jfunc_kind k; } B[] = {
        {"range", JF_RANGE}, {"namespace", JF_NAMESPACE}, {"dict", JF_DICT},
        {"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME}};
    for (size_t i = 0; i < sizeof B / sizeof *B; i++)
        if (!strcmp(name, B[i].name)) return jv_func(&e->heap, B[i].k, B[i].name, jv_none());
    return jv_undef_hint(&e->heap, "'%s' is undefined", name);
}

/* ---------------------------------------------------------------- expressions */

static int eval_inner(ev *e, const node *n, jv *out)
{
    jv a = jv_undef(), b = jv_undef(), c = jv_undef();
    cargs args;
    int rc = 0;
    switch (n->kind) {
    case E_CONST: *out = jv_ref(n->cval); return 0;
    case E_NAME: {
        jv *v = lookup(e, e->scope, n->name);
        *out = v ? jv_ref(*v) : builtin(e, n->name);
        return built(e, n, out);
    }
    case E_ATTR:
        if (eval(e, n->a, &a)) return -1;
        rc = getattr_v(e, n, a, n->name, out);
        break;
    case E_ITEM:
        if (eval(e, n->a, &a) || eval(e, n->b, &b)) rc = -1;
        else rc = getitem_v(e, n, a, b, out);
        break;
    case E_SLICE: {
        jv none = jv_none();
        jv parts[3] = {none, none, none};
        const node *pn[3] = {n->b, n->c, n->d};
        if (eval(e, n->a, &a)) return -1;
        for (int i = 0; i < 3 && !rc; i++)
            if (pn[i]) rc = eval(e, pn[i], &parts[i]);
        if (!rc) rc = do_slice(e, n, a, parts[0], parts[1], parts[2], out);
        for (int i = 0; i < 3; i++) jv_unref(parts[i]);
        break;
    }
    case E_CALL:
        if (eval(e, n->a, &a)) return -1;
        if (eval_args(e, n, &args)) break;
        rc = call_value(e, n, a, &args, out);
        cargs_free(&args);
        break;
    case E_FILTER:
        if (eval(e, n->a, &a)) return -1;
        if (eval_args(e, n, &args)) { rc = -1; break; }
        rc = apply_filter(e, n, n->name, a, &args, out);
        cargs_free(&args);
        break;
    case E_TEST: {
        bool r;
        if (eval(e, n->a, &a)) return -1;
        if (eval_args(e, n, &args)) { rc = -1; break; }
        rc = apply_test(e, n, n->name, a, arg_get(&args, 0, NULL), &r);
        cargs_free(&args);
        if (!rc) *out = jv_bool(n->neg ? !r : r);
        break;
    }
    case E_NOT:
        if (eval(e, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(a));
        break;
    case E_NEG:
    case E_POS:
        if (eval(e, n->a, &a)) return -1;
        if (a.t == JV_UNDEF) rc = fail_undef(e, n, a);
        else if (!is_num(a)) rc = fail(e, n, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(a));
        else if (n->kind == E_POS) *out = a.t == JV_FLOAT ? a : jv_int(as_int(a));
        else if (a.t == JV_FLOAT) *out = jv_float(-a.u.f);
        else if (as_int(a) == INT64_MIN) rc = fail(e, n, "integer overflow in unary minus");
        else *out = jv_int(-as_int(a));
        break;
    case E_BINOP:
        if (eval(e, n->a, &a) || eval(e, n->b, &b)) rc = -1;
        else rc = arith(e, n, n->op, a, b, out);
        break;
    case E_AND:
    case E_OR:
        if (eval(e, n->a, &a)) return -1;
        if (jv_truthy(a) == (n->kind == E_OR)) {
            *out = a;
            return 0;
        }
        jv_unref(a);
        return eval(e, n->b, out);
    case E_COMPARE: {
        bool r = true;
        if (eval(e, n->args[0], &a)) return -1;
        for (size_t i = 1; i < n->nargs && r; i++) {
            if (eval(e, n->args[i], &b)) { rc = -1; break; }
            if (compare(e, n, n->ops[i - 1], a, b, &r)) { rc = -1; break; }
            jv_unref(a);
            a = b;
            b = jv_undef();
        }
        if (!rc) *out = jv_bool(r);
        break;
    }
    case E_COND:
        if (eval(e, n->a, &a)) return -1;
        if (jv_truthy(a)) rc = eval(e, n->b, out);
        else if (n->c) rc = eval(e, n->c, out);
        else *out = jv_undef_hint(&e->heap, "the inline if-expression on line %d evaluated to false and no else section was defined", n->line);
        break;
    case E_LIST:
    case E_TUPLE:
        *out = jv_list(&e->heap, n->nargs, n->kind == E_TUPLE);
        if (oom_check(e, n)) return -1;
        for (size_t i = 0; i < n->nargs && !rc; i++) {
            if (eval(e, n->args[i], &c)) rc = -1;
            else if (!jv_list_push(*out, c)) rc = oom_check(e, n) ? -1 : fail(e, n, "out of memory");
        }
        break;
    case E_DICT:
        *out = jv_dict(&e->heap, false);
        if (oom_check(e, n)) return -1;
        for (size_t i = 0; i + 1 < n->nargs && !rc; i += 2) {
            if (eval(e, n->args[i], &b) || eval(e, n->args[i + 1], &c)) rc = -1;
            else if (b.t == JV_LIST && !b.u.l->tuple) rc = fail(e, n, "unhashable type: 'list'");
            else if (b.t == JV_DICT) rc = fail(e, n, "unhashable type: 'dict'");
            else if (!jv_dict_set(*out, b, c)) rc = oom_check(e, n) ? -1 : fail(e, n, "out of memory");
            if (rc) { jv_unref(b); jv_unref(c); }
            b = c = jv_undef();
        }
        break;
    default: return fail(e, n, "internal error: statement node in expression");
    }
    jv_unref(a);
    jv_unref(b);
    if (rc) {
        jv_unref(*out);
        *out = jv_undef();
    }
    return rc;
}

static int eval(ev *e, const node *n, jv *out)
{
    *out = jv_undef();
    if (e->failed) return -1;
    if (++e->depth > e->lim->max_depth * 16) {
        e->depth--;
        return fail(e, n, "template evaluation nests deeper than %u levels", e->lim->max_depth * 16);
    }
    int rc = tick(e, n, 1) ? -1 : eval_inner(e, n, out);
    e->depth--;
    return rc;
}

/* ---------------------------------------------------------------- statements */

static int emit(ev *e, const node *n, const char *s, size_t len)
{
    if (!jbuf_put(&e->out, s, len))
        return fail(e, n, "rendered output exceeds the limit of %zu bytes", e->lim->max_output);
    return 0;
}

static int render_body_to_string(ev *e, const node *body, jv *out)
{
    jbuf saved = e->out;
    e->out = (jbuf){.max = e->lim->max_output};
    int rc = exec_node(e, body);
    jbuf mine = e->out;
    e->out = saved;
    if (rc >= 0 && !e->failed) {
        *out = mkstr(e, mine.p ? mine.p : "", mine.n);
        rc = oom_check(e, body);
    } else {
        rc = -1;
    }
    jbuf_free(&mine);
    return rc;
}

/* Binds for/set targets: one name takes the value, several unpack it. */
static int bind_targets(ev *e, const node *n, frame *f, jv v /* borrowed */)
{
    if (n->ntargets == 1) return assign(e, n, f, n->tnames[0], jv_ref(v));
    jv items;
    if (iterate(e, n, v, &items)) return -1;
    int rc = 0;
    if (items.u.l->n != n->ntargets)
        rc = fail(e, n, items.u.l->n < n->ntargets ? "not enough values to unpack (expected %zu, got %zu)"
                                                   : "too many values to unpack (expected %zu, got %zu)",
                  n->ntargets, items.u.l->n);
    for (size_t i = 0; i < n->ntargets && !rc; i++) rc = assign(e, n, f, n->tnames[i], jv_ref(items.u.l->v[i]));
    jv_unref(items);
    return rc;
}

static int exec_for(ev *e, const node *n)
{
    jv it, items, sel;
    if (eval(e, n->a, &it)) return -1;
    int rc = iterate(e, n->a, it, &items);
    jv_unref(it);
    if (rc) return -1;
    if (n->b) { /* for x in y if cond: filter first, so loop.length/last see the kept items */
        sel = jv_list(&e->heap, 0, false);
        for (size_t i = 0; i < items.u.l->n && !rc; i++) {
            frame fr;
            jv keep;
            if (!frame_init(e, &fr, e->scope)) { rc = tick(e, n, 0) ? -1 : fail(e, n, "out of memory"); break; }
            frame *saved = e->scope;
            e->scope = &fr;
            rc = bind_targets(e, n, &fr, items.u.l->v[i]);
            if (!rc) rc = eval(e, n->b, &keep);
            e->scope = saved;
            frame_free(&fr);
            if (!rc && jv_truthy(keep)) jv_list_push(sel, jv_ref(items.u.l->v[i]));
            if (!rc) jv_unref(keep);
        }
        jv_unref(items);
        if (rc || oom_check(e, n)) return jv_unref(sel), -1;
        items = sel;
    }
    jloop *lp = jheap_alloc(&e->heap, JV_LOOP, sizeof *lp);
    if (!lp) return jv_unref(items), oom_check(e, n);
    lp->items = items.u.l;
    lp->length = items.u.l->n;
    jv loop = {.t = JV_LOOP};
    loop.u.lp = lp;
    for (size_t i = 0; i < lp->length && !rc; i++) {
        frame fr, *saved = e->scope;
        if (tick(e, n, 1)) { rc = -1; break; }
        if (!frame_init(e, &fr, e->scope)) { rc = tick(e, n, 0) ? -1 : fail(e, n, "out of memory"); break; }
        lp->index0 = i;
        e->scope = &fr;
        rc = bind_targets(e, n, &fr, lp->items->v[i]);
        if (!rc) rc = assign(e, n, &fr, "loop", jv_ref(loop));
        if (!rc) rc = exec_node(e, n->c);
        e->scope = saved;
        frame_free(&fr);
        if (rc == X_CONTINUE) rc = 0;
        if (rc == X_BREAK) {
            rc = 0;
            break;
        }
    }
    size_t len = lp->length;
    jv_unref(loop);
    if (rc) return -1;
    if (!len && n->d) return exec_node(e, n->d);
    return 0;
}

static int exec_set(ev *e, const node *n)
{
    jv v;
    if (eval(e, n->a, &v)) return -1;
    int rc;
    if (n->is_attr) {
        jv *ns = lookup(e, e->scope, n->name);
        if (!ns || ns->t != JV_NS) rc = fail(e, n, "cannot assign attribute on non-namespace object '%s'", n->name);
        else if (n->tnames[0][0] == '_')
            rc = fail(e, n, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.", n->tnames[0]);
        else if (!jv_dict_set(*ns, jv_cstr(&e->heap, n->tnames[0]), jv_ref(v))) rc = oom_check(e, n) ? -1 : fail(e, n, "out of memory");
        else rc = 0;
    } else {
        rc = bind_targets(e, n, e->scope, v);
    }
    jv_unref(v);
    return rc;
}

static int exec_node(ev *e, const node *n)
{
    jv v;
    int rc = 0;
    if (e->failed) return -1;
    if (tick(e, n, 1)) return -1;
    if (++e->depth > e->lim->max_depth * 16) {
        e->depth--;
        return fail(e, n, "template evaluation nests deeper than %u levels", e->lim->max_depth * 16);
    }
    switch (n->kind) {
    case S_BODY:
        for (size_t i = 0; i < n->nargs && !rc; i++) rc = exec_node(e, n->args[i]);
        break;
    case S_TEXT: rc = emit(e, n, n->text, n->textlen); break;
    case S_OUTPUT:
        if (eval(e, n->a, &v)) { rc = -1; break; }
        if (v.t == JV_STR) rc = emit(e, n, v.u.s->s, v.u.s->len);
        else if (!jv_to_str(&e->out, v)) rc = fail(e, n, "rendered output exceeds the limit of %zu bytes", e->lim->max_output);
        jv_unref(v);
        break;
    case S_IF:
        if (eval(e, n->a, &v)) { rc = -1; break; }
        if (jv_truthy(v)) rc = exec_node(e, n->b);
        else if (n->c) rc = exec_node(e, n->c);
        jv_unref(v);
        break;
    case S_FOR: rc = exec_for(e, n); break;
    case S_SET: rc = exec_set(e, n); break;
    case S_SETBLOCK:
        if (render_body_to_string(e, n->a, &v)) { rc = -1; break; }
        if (n->b) { /* {% set x | filter %}: the filter chain was parsed with a NULL input */
            const node *chain[64];
            size_t k = 0;
            for (const node *f = n->b; f && k < 64; f = f->a) chain[k++] = f;
            while (k-- > 0 && !rc) {
                cargs args;
                jv r;
                if (eval_args(e, chain[k], &args)) { rc = -1; break; }
                rc = apply_filter(e, chain[k], chain[k]->name, v, &args, &r);
                cargs_free(&args);
                if (!rc) { jv_unref(v); v = r; }
            }
        }
        if (!rc) rc = assign(e, n, e->scope, n->tnames[0], v);
        else jv_unref(v);
        break;
    case S_MACRO: {
        jv f = jv_func(&e->heap, JF_MACRO, n->name, jv_none());
        if (oom_check(e, n)) { rc = -1; break; }
        f.u.fn->macro = n;
        rc = assign(e, n, e->scope, n->name, f);
        break;
    }
    case S_BREAK: rc = X_BREAK; break;
    case S_CONTINUE: rc = X_CONTINUE; break;
    case S_SCOPE: {
        frame fr, *saved = e->scope;
        if (!frame_init(e, &fr, e->scope)) { rc = tick(e, n, 0) ? -1 : fail(e, n, "out of memory"); break; }
        e->scope = &fr;
        rc = exec_node(e, n->a);
        e->scope = saved;
        frame_free(&fr);
        break;
    }
    default: rc = fail(e, n, "internal error: expression node in statement position");
    }
    e->depth--;
    if (e->failed) return -1;
    return rc;
}

/* ---------------------------------------------------------------- entry */

int tmpl_eval_render(const tmpl_t *t, json_t *context, const tmpl_limits *lim, char **out, size_t *outlen, char *err,
                     size_t errlen)
{
    ev e = {.t = t, .lim = lim, .err = err, .errlen = errlen};
    frame root = {0};
    int rc = -1;
    *out = NULL;
    *outlen = 0;
    e.heap.max_live = lim->max_memory;
    e.out.max = lim->max_output;
    e.now = lim->now ? lim->now : time(NULL);
    e.ctx = jv_undef();
    if (!json_is_object(context)) {
        util_errf(err, errlen, "%s: the render context must be a JSON object", t->name);
        goto out;
    }
    if (jv_from_json(&e.heap, context, 1000, &e.ctx, err, errlen)) goto out;
    if (!frame_init(&e, &root, NULL)) {
        util_errf(err, errlen, "%s: out of memory", t->name);
        goto out;
    }
    e.root = e.scope = &root;
    rc = exec_node(&e, t->root);
    if (rc > 0) rc = 0; /* break/continue cannot escape a loop: the parser forbids it */
    if (!rc && e.failed) rc = -1;
    if (rc) rc = e.rc ? e.rc : -1;
out:
    frame_free(&root);
    jv_unref(e.ctx);
    jheap_clear_namespaces(&e.heap);
    if (!rc) {
        if (!e.out.p && !jbuf_put(&e.out, "", 0)) {
            util_errf(err, errlen, "%s: out of memory", t->name);
            rc = -1;
        } else {
            *out = e.out.p;
            *outlen = e.out.n;
            return 0;
        }
    }
    jbuf_free(&e.out);
    return rc;
}
