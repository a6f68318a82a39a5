/*
 * template_eval.c — chat templates, back half: walks the tree built by
 * template_parse.c and renders it with jinja2's semantics (the transformers
 * ImmutableSandboxedEnvironment): budgets and errors, scoping, expressions,
 * calls (macros, range, namespace, dict, raise_exception, strftime_now),
 * statements and the render entry point.
 *
 * Does not own: lexing (template_lex.c), parsing (template_parse.c), attribute
 * access and operators (template_ops.c), filters/tests/methods
 * (template_filters.c), value representation and str()/repr()/json.dumps()
 * (jinja_value.c).
 *
 * Key decisions:
 *  - Scopes are a chain of frames of (name, value) bindings whose names are
 *    template-owned, so binding never allocates a key.  The body gets a root
 *    frame above the context; every for-loop iteration gets a fresh frame
 *    (jinja2: a `set` inside a loop is gone at the next iteration and after
 *    the loop — hence namespace()); macros get a frame over the root.
 *  - Undefined follows jinja2's default Undefined: printing gives "",
 *    iteration is empty, `==` is false, but attribute/item access, arithmetic,
 *    ordering and calls raise "'x' is undefined".  A missing attribute or
 *    index of a defined value is an Undefined carrying jinja2's hint.
 *  - Every error is one sentence "NAME line L, column C: reason" pointing at
 *    the node that failed; raise_exception returns TEMPLATE_ERR_RAISED with
 *    the template's own message.
 *  - Limits: fuel (steps + allocated bytes/64), evaluator recursion
 *    (macro depth ≤ max_depth, total frames ≤ 16×max_depth), output bytes,
 *    live value bytes, range() length.  The sandbox is by construction: only
 *    the methods listed here exist; nothing reaches the host.
 *  - Jinja's compile-time constant folding is not reproduced: a literal-only
 *    expression that jinja2 folds (e.g. `(1.5)[1:]` → '') errors here.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template_eval.h"
#include "../base/util.h"

enum { X_OK = 0, X_BREAK = 1, X_CONTINUE = 2 };

static int eval(ev *e, const node *n, jv *out);
static int exec_node(ev *e, const node *n);

/* ---------------------------------------------------------------- errors and budgets */

int tev_fail(ev *e, const node *n, const char *fmt, ...)
{
    if (e->failed)
        return -1;
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

int tev_fail_undef(ev *e, const node *n, jv u)
{
    if (u.u.s)
        return tev_fail(e, n, "%s", u.u.s->s);
    return tev_fail(e, n, "a value is undefined");
}

int tev_tick(ev *e, const node *n, uint64_t k)
{
    e->steps += k;
    if (e->heap.too_deep)
        return tev_fail(e, n, "template values nest deeper than %d levels (lists/dicts inside each other)",
                        JV_MAX_NEST);
    if (e->heap.oom)
        return tev_fail(e, n,
                        "template values exceed the memory limit of %zu bytes; the template builds values too large",
                        e->lim->max_memory);
    if (e->steps + e->heap.total / 64 > e->lim->max_steps)
        return tev_fail(e, n, "template exceeded its budget of %llu steps; it loops or copies too much",
                        (unsigned long long)e->lim->max_steps);
    return 0;
}

/* Checks a freshly built value: JV_UNDEF without hint from a constructor means out of memory. */
int tev_oom_check(ev *e, const node *n)
{
    return e->heap.oom || e->heap.too_deep ? tev_tick(e, n, 0) : 0;
}

/* Ends a function that just built *out: on a failed allocation releases it and fails. */
int tev_built(ev *e, const node *n, jv *out)
{
    if (!e->heap.oom && !e->heap.too_deep)
        return 0;
    jv_drop(out);
    return tev_tick(e, n, 0);
}

/* ---------------------------------------------------------------- small helpers */

jv tev_str(ev *e, const char *s, size_t len)
{
    return jv_str(&e->heap, s, len);
}

/* Python str(v) as a new string value. */
int tev_to_str(ev *e, const node *n, jv v, jv *out)
{
    if (v.t == JV_STR) {
        *out = jv_ref(v);
        return 0;
    }
    jbuf b = {.max = e->lim->max_output};
    jv_to_str(&b, v);
    if (b.over) {
        jbuf_free(&b);
        return tev_fail(e, n, "a string exceeds the output limit of %zu bytes", e->lim->max_output);
    }
    *out = tev_str(e, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return tev_built(e, n, out);
}

jv *tev_arg(cargs *a, size_t i, const char *name)
{
    if (i < a->npos)
        return &a->pos[i];
    for (size_t k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name))
            return &a->kw[k];
    return NULL;
}

static void cargs_free(cargs *a)
{
    for (size_t i = 0; i < a->npos; i++)
        jv_unref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++)
        jv_unref(a->kw[i]);
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
        return tev_fail(e, n, "out of memory");
    }
    a->kwn = n->kwnames;
    for (size_t i = 0; i < n->nargs; i++, a->npos++)
        if (eval(e, n->args[i], &a->pos[i]))
            return cargs_free(a), -1;
    for (size_t i = 0; i < n->nkw; i++, a->nkw++)
        if (eval(e, n->kwargs[i], &a->kw[i]))
            return cargs_free(a), -1;
    return 0;
}

/* Materialises anything iterable as a list (new reference): list/tuple itself, dict keys,
 * string characters, undefined → empty. */
int tev_iterate(ev *e, const node *n, jv v, jv *out)
{
    switch (v.t) {
    case JV_LIST:
        *out = jv_ref(v);
        return 0;
    case JV_UNDEF:
        *out = jv_list(&e->heap, 0, false);
        return tev_built(e, n, out);
    case JV_DICT: {
        *out = jv_list(&e->heap, v.u.d->n, false);
        for (size_t i = 0; i < v.u.d->n && out->t == JV_LIST; i++)
            jv_list_push(*out, jv_ref(v.u.d->k[i]));
        return tev_built(e, n, out);
    }
    case JV_STR: {
        const char *s = v.u.s->s;
        size_t len = v.u.s->len;
        *out = jv_list(&e->heap, jv_utf8_count(s, len), false);
        for (size_t i = 0; i < len && out->t == JV_LIST;) {
            uint32_t c;
            int k = jv_utf8_decode(s + i, len - i, &c);
            jv_list_push(*out, tev_str(e, s + i, (size_t)k));
            i += (size_t)k;
        }
        if (tev_tick(e, n, len))
            return jv_drop(out), -1;
        return tev_built(e, n, out);
    }
    default:
        return tev_fail(e, n, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---------------------------------------------------------------- scope */

static jv *lookup(ev *e, frame *f, const char *name)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->b[i].name, name))
                return &f->b[i].v;
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
            return tev_fail(e, n, "out of memory");
        }
        memcpy(nb, f->b, f->n * sizeof *nb);
        if (f->b != f->inl)
            free(f->b);
        f->b = nb;
        f->cap = ncap;
    }
    f->b[f->n].name = name;
    f->b[f->n++].v = v;
    return 0;
}

/* Starts a frame's names that jinja2 starts undefined (see analyse_frame in template_parse.c). */
static int bind_undef(ev *e, const node *owner, frame *f)
{
    for (size_t i = 0; i < owner->nundef; i++)
        if (assign(e, owner, f, owner->undef[i], jv_undef_hint(&e->heap, "'%s' is undefined", owner->undef[i])))
            return -1;
    return 0;
}

static bool frame_init(ev *e, frame *f, frame *parent)
{
    f->id = ++e->frames;
    f->parent = parent;
    f->b = f->inl;
    f->n = 0;
    f->cap = sizeof f->inl / sizeof *f->inl;
    return true;
}

static void frame_free(frame *f)
{
    for (size_t i = 0; i < f->n; i++)
        jv_unref(f->b[i].v);
    if (f->b != f->inl)
        free(f->b);
    f->b = f->inl;
    f->n = 0;
}

/* ---------------------------------------------------------------- calls */

/* Renders `body` into a string in a child frame of the current scope (macro bodies and
 * `{% set x %}` blocks); owner carries the frame's undefined-at-start names. */
static int render_body_to_string(ev *e, const node *owner, const node *body, jv *out);

static int call_macro(ev *e, const node *n, jfunc *f, cargs *a, jv *out)
{
    const node *m = f->macro;
    if (e->macro_depth >= e->lim->max_depth)
        return tev_fail(e, n, "macro calls nest deeper than %u levels (runaway recursion?)", e->lim->max_depth);
    if (a->npos > m->ntargets)
        return tev_fail(e, n, "macro '%s' takes not more than %zu argument(s)", m->name, m->ntargets);
    /* jinja2 macros close over the frame they were defined in and read it at call time; that
     * frame is usable only while it is alive, i.e. somewhere on the current scope chain */
    frame fr, *saved = e->scope, *parent = e->root;
    for (frame *q = e->scope; q; q = q->parent)
        if ((const void *)q == f->env && q->id == f->env_id) {
            parent = q;
            break;
        }
    if (!frame_init(e, &fr, parent))
        return tev_tick(e, n, 0);
    e->scope = &fr;
    int rc = 0;
    for (size_t i = 0; i < m->ntargets && !rc; i++) {
        jv v, *given = i < a->npos ? &a->pos[i] : NULL;
        for (size_t k = 0; !given && k < a->nkw; k++)
            if (!strcmp(a->kwn[k], m->tnames[i]))
                given = &a->kw[k];
        if (given)
            v = jv_ref(*given);
        else if (m->pdefaults[i])
            rc = eval(e, m->pdefaults[i], &v);
        else
            v = jv_undef_hint(&e->heap, "parameter '%s' was not provided", m->tnames[i]);
        if (!rc)
            rc = assign(e, n, &fr, m->tnames[i], v);
    }
    for (size_t k = 0; !rc && k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->ntargets; i++)
            known |= !strcmp(a->kwn[k], m->tnames[i]);
        if (!known)
            rc = tev_fail(e, n, "macro '%s' has no parameter named '%s'", m->name, a->kwn[k]);
    }
    if (!rc) {
        e->macro_depth++;
        rc = render_body_to_string(e, m, m->a, out);
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
        if (!is_int(a->pos[i]))
            return tev_fail(e, n, "range() arguments must be integers, not %s", jv_type_name(a->pos[i]));
    if (a->npos == 1)
        stop = as_int(a->pos[0]);
    else if (a->npos == 2 || a->npos == 3) {
        start = as_int(a->pos[0]);
        stop = as_int(a->pos[1]);
        if (a->npos == 3)
            step = as_int(a->pos[2]);
    } else
        return tev_fail(e, n, "range expected 1 to 3 arguments, got %zu", a->npos);
    if (!step)
        return tev_fail(e, n, "range() arg 3 must not be zero");
    /* length without overflow: ceil((stop - start) / step) in 128-bit-free form */
    uint64_t count = 0;
    if (step > 0 && start < stop)
        count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    if (step < 0 && start > stop)
        count = ((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-(step + 1) + 1ULL) + 1;
    if (count > e->lim->max_range)
        return tev_fail(e, n, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%llu).",
                        (unsigned long long)e->lim->max_range);
    if (tev_tick(e, n, count))
        return -1;
    *out = jv_list(&e->heap, count, false);
    for (uint64_t i = 0; i < count && out->t == JV_LIST; i++)
        jv_list_push(*out, jv_int(start + (int64_t)i * step));
    return tev_built(e, n, out);
}

static int call_value_inner(ev *e, const node *n, jv fn, cargs *a, jv *out)
{
    if (fn.t == JV_UNDEF)
        return tev_fail_undef(e, n, fn);
    if (fn.t != JV_FUNC)
        return tev_fail(e, n, "'%s' object is not callable", jv_type_name(fn));
    jfunc *f = fn.u.fn;
    switch (f->kind) {
    case JF_RANGE:
        return call_range(e, n, a, out);
    case JF_NAMESPACE:
    case JF_DICT: {
        *out = jv_dict(&e->heap, f->kind == JF_NAMESPACE);
        if (tev_oom_check(e, n))
            return -1;
        if (a->npos > 1)
            return tev_fail(e, n, "%s expected at most 1 positional argument", f->name);
        if (a->npos) {
            if (a->pos[0].t != JV_DICT)
                return tev_fail(e, n, "%s() positional argument must be a mapping", f->name);
            for (size_t i = 0; i < a->pos[0].u.d->n; i++) {
                jv k = a->pos[0].u.d->k[i];
                if (f->kind == JF_NAMESPACE && k.t == JV_STR && k.u.s->s[0] == '_')
                    return tev_fail(
                        e, n,
                        "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.",
                        k.u.s->s);
                jv_dict_set(*out, jv_ref(k), jv_ref(a->pos[0].u.d->v[i]));
            }
        }
        for (size_t i = 0; i < a->nkw; i++) {
            if (f->kind == JF_NAMESPACE && a->kwn[i][0] == '_')
                return tev_fail(
                    e, n, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.",
                    a->kwn[i]);
            jv_dict_set(*out, jv_cstr(&e->heap, a->kwn[i]), jv_ref(a->kw[i]));
        }
        return tev_built(e, n, out);
    }
    case JF_RAISE: {
        jv *msg = tev_arg(a, 0, "message");
        jbuf b = {.max = 4096};
        if (msg)
            jv_to_str(&b, *msg);
        if (!e->failed) {
            e->failed = true;
            e->rc = TEMPLATE_ERR_RAISED;
            snprintf(e->err, e->errlen, "%s", b.p ? b.p : "");
        }
        jbuf_free(&b);
        return -1;
    }
    case JF_STRFTIME: {
        jv *fmt = tev_arg(a, 0, "format");
        if (!fmt || fmt->t != JV_STR)
            return tev_fail(e, n, "strftime_now() needs a format string");
        struct tm tmv;
        if (!localtime_r(&e->now, &tmv))
            return tev_fail(e, n, "strftime_now(): the clock is out of range");
        char buf[1024];
        size_t k = fmt->u.s->len ? strftime(buf, sizeof buf, fmt->u.s->s, &tmv) : 0;
        if (!k && fmt->u.s->len)
            return tev_fail(e, n, "strftime_now(): format produces more than 1 KiB or nothing");
        *out = tev_str(e, buf, k);
        return tev_built(e, n, out);
    }
    case JF_MACRO:
        return call_macro(e, n, f, a, out);
    case JF_METHOD:
        return tev_call_method(e, n, f, a, out);
    case JF_CYCLE: {
        if (!a->npos)
            return tev_fail(e, n, "no items for cycling given");
        *out = jv_ref(a->pos[f->self.u.lp->index0 % a->npos]);
        return 0;
    }
    }
    return tev_fail(e, n, "value is not callable");
}

static int call_value(ev *e, const node *n, jv fn, cargs *a, jv *out)
{
    *out = jv_undef();
    int rc = call_value_inner(e, n, fn, a, out);
    if (rc)
        jv_drop(out);
    return rc;
}

static jv builtin(ev *e, const char *name)
{
    static const struct {
        const char *name;
        jfunc_kind k;
    } B[] = {{"range", JF_RANGE},
             {"namespace", JF_NAMESPACE},
             {"dict", JF_DICT},
             {"raise_exception", JF_RAISE},
             {"strftime_now", JF_STRFTIME}};
    for (size_t i = 0; i < sizeof B / sizeof *B; i++)
        if (!strcmp(name, B[i].name))
            return jv_func(&e->heap, B[i].k, B[i].name, jv_none());
    return jv_undef_hint(&e->heap, "'%s' is undefined", name);
}

/* ---------------------------------------------------------------- expressions */

static int eval_inner(ev *e, const node *n, jv *out)
{
    jv a = jv_undef(), b = jv_undef(), c = jv_undef();
    cargs args;
    int rc = 0;
    switch (n->kind) {
    case E_CONST:
        *out = jv_ref(n->cval);
        return 0;
    case E_NAME: {
        jv *v = lookup(e, e->scope, n->name);
        *out = v ? jv_ref(*v) : builtin(e, n->name);
        return tev_built(e, n, out);
    }
    case E_ATTR:
        if (eval(e, n->a, &a))
            return -1;
        rc = tev_getattr(e, n, a, n->name, out);
        break;
    case E_ITEM:
        if (eval(e, n->a, &a) || eval(e, n->b, &b))
            rc = -1;
        else
            rc = tev_getitem(e, n, a, b, out);
        break;
    case E_SLICE: {
        jv none = jv_none();
        jv parts[3] = {none, none, none};
        const node *pn[3] = {n->b, n->c, n->d};
        if (eval(e, n->a, &a))
            return -1;
        for (int i = 0; i < 3 && !rc; i++)
            if (pn[i])
                rc = eval(e, pn[i], &parts[i]);
        if (!rc)
            rc = tev_slice(e, n, a, parts[0], parts[1], parts[2], out);
        for (int i = 0; i < 3; i++)
            jv_unref(parts[i]);
        break;
    }
    case E_CALL:
        if (eval(e, n->a, &a))
            return -1;
        if (eval_args(e, n, &args))
            break;
        rc = call_value(e, n, a, &args, out);
        cargs_free(&args);
        break;
    case E_FILTER:
        if (eval(e, n->a, &a))
            return -1;
        if (eval_args(e, n, &args)) {
            rc = -1;
            break;
        }
        rc = tev_filter(e, n, n->name, a, &args, out);
        cargs_free(&args);
        break;
    case E_TEST: {
        bool r;
        if (eval(e, n->a, &a))
            return -1;
        if (eval_args(e, n, &args)) {
            rc = -1;
            break;
        }
        rc = tev_test(e, n, n->name, a, tev_arg(&args, 0, NULL), &r);
        cargs_free(&args);
        if (!rc)
            *out = jv_bool(n->neg ? !r : r);
        break;
    }
    case E_NOT:
        if (eval(e, n->a, &a))
            return -1;
        *out = jv_bool(!jv_truthy(a));
        break;
    case E_NEG:
    case E_POS:
        if (eval(e, n->a, &a))
            return -1;
        if (a.t == JV_UNDEF)
            rc = tev_fail_undef(e, n, a);
        else if (!is_num(a))
            rc = tev_fail(e, n, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(a));
        else if (n->kind == E_POS)
            *out = a.t == JV_FLOAT ? a : jv_int(as_int(a));
        else if (a.t == JV_FLOAT)
            *out = jv_float(-a.u.f);
        else if (as_int(a) == INT64_MIN)
            rc = tev_fail(e, n, "integer overflow in unary minus");
        else
            *out = jv_int(-as_int(a));
        break;
    case E_BINOP:
        if (eval(e, n->a, &a) || eval(e, n->b, &b))
            rc = -1;
        else
            rc = tev_arith(e, n, n->op, a, b, out);
        break;
    case E_AND:
    case E_OR:
        if (eval(e, n->a, &a))
            return -1;
        if (jv_truthy(a) == (n->kind == E_OR)) {
            *out = a;
            return 0;
        }
        jv_unref(a);
        return eval(e, n->b, out);
    case E_COMPARE: {
        bool r = true;
        if (eval(e, n->args[0], &a))
            return -1;
        for (size_t i = 1; i < n->nargs && r; i++) {
            if (eval(e, n->args[i], &b)) {
                rc = -1;
                break;
            }
            if (tev_compare(e, n, n->ops[i - 1], a, b, &r)) {
                rc = -1;
                break;
            }
            jv_unref(a);
            a = b;
            b = jv_undef();
        }
        if (!rc)
            *out = jv_bool(r);
        break;
    }
    case E_COND:
        if (eval(e, n->a, &a))
            return -1;
        if (jv_truthy(a))
            rc = eval(e, n->b, out);
        else if (n->c)
            rc = eval(e, n->c, out);
        else
            *out = jv_undef_hint(
                &e->heap, "the inline if-expression on line %d evaluated to false and no else section was defined",
                n->line);
        break;
    case E_LIST:
    case E_TUPLE:
        *out = jv_list(&e->heap, n->nargs, n->kind == E_TUPLE);
        if (tev_oom_check(e, n))
            return -1;
        for (size_t i = 0; i < n->nargs && !rc; i++) {
            if (eval(e, n->args[i], &c))
                rc = -1;
            else if (!jv_list_push(*out, c))
                rc = tev_oom_check(e, n) ? -1 : tev_fail(e, n, "out of memory");
        }
        break;
    case E_DICT:
        *out = jv_dict(&e->heap, false);
        if (tev_oom_check(e, n))
            return -1;
        for (size_t i = 0; i + 1 < n->nargs && !rc; i += 2) {
            if (eval(e, n->args[i], &b) || eval(e, n->args[i + 1], &c))
                rc = -1;
            else if (tev_unhashable(b))
                rc = tev_fail(e, n, "unhashable type: '%s'", jv_type_name(b));
            else if (!jv_dict_set(*out, b, c))
                rc = tev_oom_check(e, n) ? -1 : tev_fail(e, n, "out of memory");
            if (rc) {
                jv_unref(b);
                jv_unref(c);
            }
            b = c = jv_undef();
        }
        break;
    default:
        return tev_fail(e, n, "internal error: statement node in expression");
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
    if (e->failed)
        return -1;
    if (++e->depth > e->lim->max_depth * 16) {
        e->depth--;
        return tev_fail(e, n, "template evaluation nests deeper than %u levels", e->lim->max_depth * 16);
    }
    int rc = tev_tick(e, n, 1) ? -1 : eval_inner(e, n, out);
    e->depth--;
    return rc;
}

/* ---------------------------------------------------------------- statements */

static int emit(ev *e, const node *n, const char *s, size_t len)
{
    if (!jbuf_put(&e->out, s, len))
        return tev_fail(e, n, "rendered output exceeds the limit of %zu bytes", e->lim->max_output);
    return 0;
}

static int render_body_to_string(ev *e, const node *owner, const node *body, jv *out)
{
    jbuf saved = e->out;
    frame fr, *scope = e->scope;
    if (!frame_init(e, &fr, e->scope))
        return tev_tick(e, body, 0);
    e->scope = &fr;
    e->out = (jbuf){.max = e->lim->max_output};
    int rc = bind_undef(e, owner, &fr);
    if (!rc)
        rc = exec_node(e, body);
    jbuf mine = e->out;
    e->out = saved;
    e->scope = scope;
    frame_free(&fr);
    if (rc >= 0 && !e->failed) {
        *out = tev_str(e, mine.p ? mine.p : "", mine.n);
        rc = tev_oom_check(e, body);
    } else {
        rc = -1;
    }
    jbuf_free(&mine);
    return rc;
}

/* Binds for/set targets: one name takes the value, several unpack it. */
static int bind_targets(ev *e, const node *n, frame *f, jv v /* borrowed */)
{
    if (n->ntargets == 1)
        return assign(e, n, f, n->tnames[0], jv_ref(v));
    jv items;
    if (tev_iterate(e, n, v, &items))
        return -1;
    int rc = 0;
    if (items.u.l->n != n->ntargets)
        rc = tev_fail(e, n,
                      items.u.l->n < n->ntargets ? "not enough values to unpack (expected %zu, got %zu)"
                                                 : "too many values to unpack (expected %zu, got %zu)",
                      n->ntargets, items.u.l->n);
    for (size_t i = 0; i < n->ntargets && !rc; i++)
        rc = assign(e, n, f, n->tnames[i], jv_ref(items.u.l->v[i]));
    jv_unref(items);
    return rc;
}

/* Runs a body in a child frame of the current scope (for-else), binding its undefined-at-start
 * names. */
static int exec_scoped(ev *e, const node *body)
{
    frame fr, *saved = e->scope;
    if (!frame_init(e, &fr, e->scope))
        return tev_tick(e, body, 0);
    e->scope = &fr;
    int rc = bind_undef(e, body, &fr);
    if (!rc)
        rc = exec_node(e, body);
    e->scope = saved;
    frame_free(&fr);
    return rc;
}

static int exec_for(ev *e, const node *n)
{
    jv it, items, sel;
    if (eval(e, n->a, &it))
        return -1;
    int rc = tev_iterate(e, n->a, it, &items);
    jv_unref(it);
    if (rc)
        return -1;
    if (n->b) { /* for x in y if cond: filter first, so loop.length/last see the kept items */
        sel = jv_list(&e->heap, 0, false);
        for (size_t i = 0; i < items.u.l->n && !rc; i++) {
            frame fr;
            jv keep;
            if (!frame_init(e, &fr, e->scope)) {
                rc = tev_tick(e, n, 0) ? -1 : tev_fail(e, n, "out of memory");
                break;
            }
            frame *saved = e->scope;
            e->scope = &fr;
            rc = bind_targets(e, n, &fr, items.u.l->v[i]);
            if (!rc)
                rc = eval(e, n->b, &keep);
            e->scope = saved;
            frame_free(&fr);
            if (!rc && jv_truthy(keep))
                jv_list_push(sel, jv_ref(items.u.l->v[i]));
            if (!rc)
                jv_unref(keep);
        }
        jv_unref(items);
        if (rc || tev_oom_check(e, n))
            return jv_unref(sel), -1;
        items = sel;
    }
    jloop *lp = jheap_alloc(&e->heap, JV_LOOP, sizeof *lp);
    if (!lp)
        return jv_unref(items), tev_oom_check(e, n);
    lp->items = items.u.l;
    lp->length = items.u.l->n;
    jv loop = {.t = JV_LOOP};
    loop.u.lp = lp;
    for (size_t i = 0; i < lp->length && !rc; i++) {
        frame fr, *saved = e->scope;
        if (tev_tick(e, n, 1)) {
            rc = -1;
            break;
        }
        if (!frame_init(e, &fr, e->scope)) {
            rc = tev_tick(e, n, 0) ? -1 : tev_fail(e, n, "out of memory");
            break;
        }
        lp->index0 = i;
        e->scope = &fr;
        rc = bind_undef(e, n, &fr);
        if (!rc)
            rc = bind_targets(e, n, &fr, lp->items->v[i]);
        if (!rc)
            rc = assign(e, n, &fr, "loop", jv_ref(loop));
        if (!rc)
            rc = exec_node(e, n->c);
        e->scope = saved;
        frame_free(&fr);
        if (rc == X_CONTINUE)
            rc = 0;
        if (rc == X_BREAK) {
            rc = 0;
            break;
        }
    }
    size_t len = lp->length;
    jv_unref(loop);
    if (rc)
        return -1;
    if (!len && n->d)
        return exec_scoped(e, n->d);
    return 0;
}

static int exec_set(ev *e, const node *n)
{
    jv v;
    if (eval(e, n->a, &v))
        return -1;
    int rc;
    if (n->is_attr) {
        jv *ns = lookup(e, e->scope, n->name);
        if (!ns || ns->t != JV_NS)
            rc = tev_fail(e, n, "cannot assign attribute on non-namespace object '%s'", n->name);
        else if (n->tnames[0][0] == '_')
            rc = tev_fail(e, n,
                          "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.",
                          n->tnames[0]);
        else if (!jv_dict_set(*ns, jv_cstr(&e->heap, n->tnames[0]), jv_ref(v)))
            rc = tev_oom_check(e, n) ? -1 : tev_fail(e, n, "out of memory");
        else
            rc = 0;
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
    if (e->failed)
        return -1;
    if (tev_tick(e, n, 1))
        return -1;
    if (++e->depth > e->lim->max_depth * 16) {
        e->depth--;
        return tev_fail(e, n, "template evaluation nests deeper than %u levels", e->lim->max_depth * 16);
    }
    switch (n->kind) {
    case S_BODY:
        for (size_t i = 0; i < n->nargs && !rc; i++)
            rc = exec_node(e, n->args[i]);
        break;
    case S_TEXT:
        rc = emit(e, n, n->text, n->textlen);
        break;
    case S_OUTPUT:
        if (eval(e, n->a, &v)) {
            rc = -1;
            break;
        }
        if (v.t == JV_STR)
            rc = emit(e, n, v.u.s->s, v.u.s->len);
        else if (!jv_to_str(&e->out, v))
            rc = tev_fail(e, n, "rendered output exceeds the limit of %zu bytes", e->lim->max_output);
        jv_unref(v);
        break;
    case S_IF:
        if (eval(e, n->a, &v)) {
            rc = -1;
            break;
        }
        if (jv_truthy(v))
            rc = exec_node(e, n->b);
        else if (n->c)
            rc = exec_node(e, n->c);
        jv_unref(v);
        break;
    case S_FOR:
        rc = exec_for(e, n);
        break;
    case S_SET:
        rc = exec_set(e, n);
        break;
    case S_SETBLOCK:
        if (render_body_to_string(e, n, n->a, &v)) {
            rc = -1;
            break;
        }
        if (n->b) { /* {% set x | filter %}: the filter chain was parsed with a NULL input */
            const node *chain[64];
            size_t k = 0;
            for (const node *f = n->b; f && k < 64; f = f->a)
                chain[k++] = f;
            while (k-- > 0 && !rc) {
                cargs args;
                jv r;
                if (eval_args(e, chain[k], &args)) {
                    rc = -1;
                    break;
                }
                rc = tev_filter(e, chain[k], chain[k]->name, v, &args, &r);
                cargs_free(&args);
                if (!rc) {
                    jv_unref(v);
                    v = r;
                }
            }
        }
        if (!rc)
            rc = assign(e, n, e->scope, n->tnames[0], v);
        else
            jv_unref(v);
        break;
    case S_MACRO: {
        jv f = jv_func(&e->heap, JF_MACRO, n->name, jv_none());
        if (tev_oom_check(e, n)) {
            rc = -1;
            break;
        }
        f.u.fn->macro = n;
        f.u.fn->env = e->scope;
        f.u.fn->env_id = e->scope->id;
        rc = assign(e, n, e->scope, n->name, f);
        break;
    }
    case S_BREAK:
        rc = X_BREAK;
        break;
    case S_CONTINUE:
        rc = X_CONTINUE;
        break;
    case S_SCOPE: {
        frame fr, *saved = e->scope;
        if (!frame_init(e, &fr, e->scope)) {
            rc = tev_tick(e, n, 0) ? -1 : tev_fail(e, n, "out of memory");
            break;
        }
        e->scope = &fr;
        rc = bind_undef(e, n, &fr);
        if (!rc)
            rc = exec_node(e, n->a);
        e->scope = saved;
        frame_free(&fr);
        break;
    }
    default:
        rc = tev_fail(e, n, "internal error: expression node in statement position");
    }
    e->depth--;
    if (e->failed)
        return -1;
    return rc;
}

/* ---------------------------------------------------------------- entry */

int tmpl_eval_render(const tmpl_t *t, tmpl_ctx_fn build, void *arg, const tmpl_limits *lim, char **out, size_t *outlen,
                     char *err, size_t errlen)
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
    if (build(&e.heap, arg, &e.ctx, err, errlen))
        goto out;
    if (!frame_init(&e, &root, NULL)) {
        util_errf(err, errlen, "%s: out of memory", t->name);
        goto out;
    }
    e.root = e.scope = &root;
    if (bind_undef(&e, t->root, &root))
        goto out;
    rc = exec_node(&e, t->root);
    if (rc > 0)
        rc = 0; /* break/continue cannot escape a loop: the parser forbids it */
    if (!rc && e.failed)
        rc = -1;
    if (rc)
        rc = e.rc ? e.rc : -1;
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
