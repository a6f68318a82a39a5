/*
 * template_eval.h — internal: the evaluator state and the helpers shared by
 * template_eval.c (budgets, scopes, statements), template_ops.c (attribute
 * access, operators), template_filters.c (filters, tests) and
 * template_methods.c (str/dict/list methods, string helpers).  Not part of
 * the public API.
 *
 * Result convention for every `jv *out` below: on success *out holds a new
 * reference the caller releases; on failure *out is left undefined (nothing
 * to release) and the error is recorded in the ev (first error wins).
 */
#ifndef SPILL_TEMPLATE_EVAL_H
#define SPILL_TEMPLATE_EVAL_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "template_ast.h"

/* One scope.  Names are template-owned (AST strings) or static, so binding one never allocates
 * a key; most frames hold a loop target and `loop`, which fit the inline slots. */
typedef struct {
    const char *name;
    jv v;
} binding;

typedef struct frame {
    struct frame *parent;
    uint64_t id; /* unique per render: frames live on the C stack, addresses get reused */
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
    uint64_t frames; /* frame ids handed out */
    frame *root;     /* the template body's frame */
    frame *scope;    /* innermost frame: where names resolve and `set` writes */
    jv ctx;          /* the context dict, below every frame */
    char *err;
    size_t errlen;
    int rc;
    bool failed;
    time_t now;
} ev;

/* Keyword and positional arguments of a call, filter or test. */
typedef struct {
    jv *pos;
    size_t npos;
    const char *const *kwn;
    jv *kw;
    size_t nkw;
} cargs;

static inline bool is_int(jv v)
{
    return v.t == JV_INT || v.t == JV_BOOL;
} /* Python bools are ints */
static inline int64_t as_int(jv v)
{
    return v.t == JV_BOOL ? (int64_t)v.u.b : v.u.i;
}
static inline bool is_num(jv v)
{
    return is_int(v) || v.t == JV_FLOAT;
}
static inline double as_num(jv v)
{
    return v.t == JV_FLOAT ? v.u.f : (double)as_int(v);
}

/* Releases a result slot and leaves it undefined; safe to call twice. */
static inline void jv_drop(jv *out)
{
    jv_unref(*out);
    *out = jv_undef();
}

/* ---- errors and budgets (template_eval.c) */
/* Records "NAME line L, column C: msg" (first error wins) and returns -1. */
int tev_fail(ev *e, const node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Fails with an Undefined's own hint ("'x' is undefined"). */
int tev_fail_undef(ev *e, const node *n, jv u);
/* Charges k steps; fails when fuel or memory is exhausted. */
int tev_tick(ev *e, const node *n, uint64_t k);
/* Fails if an allocation failed since the last check. */
int tev_oom_check(ev *e, const node *n);
/* Ends a function that just built *out: on a failed allocation drops it and fails. */
int tev_built(ev *e, const node *n, jv *out);

/* ---- values (template_eval.c; getattr/getitem/slice in template_ops.c) */
jv tev_str(ev *e, const char *s, size_t len);
/* Python str(v). */
int tev_to_str(ev *e, const node *n, jv v, jv *out);
/* Positional argument i, else keyword `name` (NULL: positional only); NULL when absent. */
jv *tev_arg(cargs *a, size_t i, const char *name);
/* Anything iterable as a list (list itself, dict keys, string characters, undefined → empty). */
int tev_iterate(ev *e, const node *n, jv v, jv *out);
/* jinja `obj.name` (attribute, then item) and `obj[key]` (item, then attribute). */
int tev_getattr(ev *e, const node *n, jv obj, const char *name, jv *out);
int tev_getitem(ev *e, const node *n, jv obj, jv key, jv *out);
/* Python obj[start:stop:step]; JV_NONE parts are omitted. */
int tev_slice(ev *e, const node *n, jv obj, jv start, jv stop, jv step, jv *out);

/* ---- operators (template_ops.c) */
/* Python ordering: *res = -1/0/1 (2 for NaN); TypeError for unordered types. */
int tev_order(ev *e, const node *n, jv a, jv b, int *res, const char *opname);
bool tev_unhashable(jv v);
int tev_contains(ev *e, const node *n, jv needle, jv hay, bool *res);
int tev_compare(ev *e, const node *n, int op /* cmpop */, jv a, jv b, bool *res);
int tev_arith(ev *e, const node *n, int op /* binop */, jv a, jv b, jv *out);

/* ---- filters and tests (template_filters.c) */
/* `v|name(a)`; fails naming the filter when there is none of that name. */
int tev_filter(ev *e, const node *n, const char *name, jv v, cargs *a, jv *out);
/* `v is name(arg)`; arg NULL when the test takes none. */
int tev_test(ev *e, const node *n, const char *name, jv v, jv *arg, bool *res);
/* The items of anything iterable as a fresh (non-generator) list. */
int tev_copy_list(ev *e, const node *n, jv v, jv *out);
/* A mapping's (key, value) pairs as a fresh (non-generator) list of tuples; undefined gives []. */
int tev_items(ev *e, const node *n, jv v, jv *out);

/* ---- methods and string helpers (template_methods.c) */
/* The method table's own name string when values of `type` have a method `name`, else NULL
 * (what attribute access binds into a JF_METHOD function). */
const char *tev_method_name(jv_type type, const char *name);
/* Calls a bound str/dict/list method (f->kind == JF_METHOD). */
int tev_call_method(ev *e, const node *n, jfunc *f, cargs *a, jv *out);
/* str.strip/lstrip/rstrip(chars): which = 1 left, 2 right, 3 both; chars NULL = whitespace. */
int tev_str_strip(ev *e, const node *n, jv s, jv *chars, int which, jv *out);
/* Maps each code point: mode 'u' upper, 'l' lower, 't' title, 'c' capitalize. */
int tev_str_case(ev *e, const node *n, jv s, char mode, jv *out);
/* str.replace(old, new, count); count < 0 = all. */
int tev_str_replace(ev *e, const node *n, jv s, jv old, jv new_, int64_t count, jv *out);
/* str.splitlines() with Python's line boundaries. */
int tev_str_splitlines(ev *e, const node *n, jv s, jv *out);

#endif
