/*
 * template_ast.h — internal: the syntax tree shared by the parser (template.c)
 * and the evaluator (template_eval.c).  Not part of the public API.
 *
 * Every node records the line and column (1-based, bytes) of the token that
 * starts it, so runtime errors can point at the template source.  All nodes
 * and strings are owned by the compiled template (tmpl_t) and live until
 * template_free.
 */
#ifndef SPILL_TEMPLATE_AST_H
#define SPILL_TEMPLATE_AST_H

#include <stddef.h>
#include <stdint.h>

#include "jinja_value.h"
#include "template.h"

typedef enum {
    /* expressions */
    E_CONST,   /* cval: none/bool/int/float/str (string owned by the node's heap-free const) */
    E_NAME,    /* name */
    E_ATTR,    /* a.name */
    E_ITEM,    /* a[b] */
    E_SLICE,   /* a[b:c:d], missing parts NULL */
    E_CALL,    /* a(args, kw=…) */
    E_FILTER,  /* a|name(args) ; a NULL inside {% filter %} (unused) */
    E_TEST,    /* a is [not] name(args) ; neg */
    E_NOT,
    E_NEG,
    E_POS,
    E_BINOP,   /* op: a OP b */
    E_AND,
    E_OR,
    E_COMPARE, /* a op1 b op2 c … chained: ops[], args[] (n = number of operands) */
    E_COND,    /* b if a else c (c may be NULL → undefined) */
    E_LIST,
    E_TUPLE,
    E_DICT,    /* args = k0, v0, k1, v1, … */
    /* statements */
    S_BODY,    /* list of statements in args */
    S_TEXT,    /* text, textlen */
    S_OUTPUT,  /* {{ a }} */
    S_IF,      /* if a: b else c */
    S_FOR,     /* for targets(name list in args… see below) */
    S_SET,     /* set target = a */
    S_SETBLOCK,/* set name %}b{% endset */
    S_MACRO,
    S_CALLBLOCK,
    S_BREAK,
    S_CONTINUE,
    S_SCOPE,   /* {% generation %}/{% with %} body rendered in a child scope */
} node_kind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT } binop;
typedef enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } cmpop;

typedef struct node node;
struct node {
    node_kind kind;
    int line, col;
    const char *name;  /* identifiers; owned by the template's string pool */
    node *a, *b, *c, *d;
    node **args;       /* positional args / list items / statements (nargs) */
    size_t nargs;
    const char **kwnames; /* keyword names for kwargs (nkw) */
    node **kwargs;
    size_t nkw;
    int op;            /* binop for E_BINOP; cmpop list in ops for E_COMPARE */
    int *ops;
    bool neg;          /* E_TEST: is not */
    jv cval;           /* E_CONST value; strings allocated from the template's const heap */
    const char *text;  /* S_TEXT */
    size_t textlen;
    /* S_FOR: targets in tnames (ntargets, >1 means unpacking), iterable a, filter b, body c, else d.
     * S_SET: targets in tnames (or attr target: name=ns var, attr=tnames[0] when is_attr), value a.
     * S_MACRO: name, params tnames with defaults kwargs-like (pdefaults, NULL if none), body a. */
    const char **tnames;
    size_t ntargets;
    bool is_attr;
    node **pdefaults;
};

struct tmpl_t {
    char *name;
    node *root;
    /* arena of nodes and strings: a simple list of blocks */
    void **blocks;
    size_t nblocks, capblocks;
};

/* Evaluator entry point (template_eval.c). */
int tmpl_eval_render(const tmpl_t *t, json_t *context, const tmpl_limits *lim, char **out, size_t *outlen, char *err,
                     size_t errlen);

#endif
