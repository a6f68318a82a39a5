/*
 * template_ast.h — internal: the syntax tree shared by the lexer
 * (template_lex.c), the parser (template_parse.c), the front door
 * (template.c) and the evaluator (template_eval.c), plus the token stream
 * between lexer and parser.  Not part of the public API.
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
    E_CONST,  /* cval: none/bool/int/float/str (strings are immortal, template-owned) */
    E_NAME,   /* name */
    E_ATTR,   /* a.name */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d], missing parts NULL */
    E_CALL,   /* a(args, kw=…) */
    E_FILTER, /* a|name(args); a NULL in a `{% set x | f %}` block's filter chain */
    E_TEST,   /* a is [not] name(args) ; neg */
    E_NOT,
    E_NEG,
    E_POS,
    E_BINOP, /* op: a OP b */
    E_AND,
    E_OR,
    E_COMPARE, /* a op1 b op2 c … chained: ops[], args[] (n = number of operands) */
    E_COND,    /* b if a else c (c may be NULL → undefined) */
    E_LIST,
    E_TUPLE,
    E_DICT, /* args = k0, v0, k1, v1, … */
    /* statements */
    S_BODY,     /* list of statements in args */
    S_TEXT,     /* text, textlen */
    S_OUTPUT,   /* {{ a }} */
    S_IF,       /* if a: b else c */
    S_FOR,      /* see the field comment below */
    S_SET,      /* set target = a */
    S_SETBLOCK, /* set name %}b{% endset */
    S_MACRO,
    S_BREAK,
    S_CONTINUE,
    S_SCOPE, /* {% generation %} body a, rendered in a child scope */
} node_kind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT } binop;
typedef enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } cmpop;

typedef struct node node;
struct node {
    node_kind kind;
    int line, col;
    uint32_t depth;   /* expressions: 1 + deepest child (bounded by AST_MAX_DEPTH) */
    const char *name; /* identifier (template-owned) */
    node *a, *b, *c, *d;
    node **args; /* positional args / list items / statements (nargs) */
    size_t nargs;
    const char **kwnames; /* keyword names for kwargs (nkw) */
    node **kwargs;
    size_t nkw;
    int op; /* binop for E_BINOP; cmpop list in ops for E_COMPARE */
    int *ops;
    bool neg;         /* E_TEST: is not */
    jv cval;          /* E_CONST value */
    const char *text; /* S_TEXT */
    size_t textlen;
    /* S_FOR: targets in tnames (ntargets, >1 means unpacking), iterable a, filter b, body c, else d.
     * S_SET: targets in tnames (or attr target: name=ns var, attr=tnames[0] when is_attr), value a.
     * S_SETBLOCK: target tnames[0], body a, filter chain b (or NULL).
     * S_MACRO: name, parameters tnames with default expressions pdefaults[i] (NULL if none), body a. */
    const char **tnames;
    size_t ntargets;
    bool is_attr;
    node **pdefaults;
    /* Frame nodes (the root S_BODY, S_FOR, for-else body, S_MACRO, S_SETBLOCK, S_SCOPE): names
     * bound to undefined when the frame starts, as jinja2 does (template_parse.c, analyse_frame). */
    const char **undef;
    size_t nundef;
};

struct tmpl_t {
    char *name;
    node *root;
    /* every node and string of the template: calloc'd blocks freed by template_free */
    void **blocks;
    size_t nblocks, capblocks;
};

/* ---- front end: the lexer (template_lex.c) and the parser (template_parse.c) */

#define PARSE_MAX_NEST 256 /* parser recursion: parens, nested blocks, unary chains */
#define AST_MAX_DEPTH 1000 /* tree depth incl. left-deep operator chains, bounds evaluator recursion */

typedef enum {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP
} tok_type;

typedef struct {
    tok_type t;
    size_t off;    /* byte offset in the normalised source */
    const char *s; /* T_DATA/T_STRING: decoded text (arena); T_NAME/T_OP: source bytes */
    size_t len;
    int64_t i;
    double f;
} token;

typedef struct {
    tmpl_t *t;
    const char *src;
    size_t n;
    size_t *lines; /* byte offset of each line start */
    size_t nlines;
    token *tok;
    size_t ntok, captok;
    size_t pos; /* parser cursor */
    int nest;   /* parser recursion depth */
    int loops;  /* enclosing for loops, for break/continue */
    char *err;
    size_t errlen;
} parser;

/* Template-owned allocation (template_lex.c; freed by template_free); NULL when out of memory. */
void *tmpl_alloc(tmpl_t *t, size_t size);
char *tmpl_strndup(tmpl_t *t, const char *s, size_t n);
/* 1-based line and byte column of a source offset. */
void tmpl_linecol(const parser *p, size_t off, int *line, int *col);
/* Writes "NAME line L, column C: msg" into the parser's err and returns -1. */
int tmpl_fail_at(parser *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Lexes p->src (p->n bytes, newlines already normalised, p->lines filled) into p->tok, ending with T_EOF
 * (template_lex.c); 0, or -1 with "NAME line L, column C: reason" in p->err. */
int tmpl_lex(parser *p);
/* Parses the whole token stream into an S_BODY tree (template_parse.c); NULL (err set) on a syntax error. */
node *tmpl_parse(parser *p);

/* Builds the render context (a JV_DICT of globals) on the render's heap; 0 or -1 with err. */
typedef int (*tmpl_ctx_fn)(jheap *h, void *arg, jv *ctx, char *err, size_t errlen);

/* Evaluator entry point (template_eval.c): builds the context with `build`, renders t. */
int tmpl_eval_render(const tmpl_t *t, tmpl_ctx_fn build, void *arg, const tmpl_limits *lim, char **out, size_t *outlen,
                     char *err, size_t errlen);

#endif
