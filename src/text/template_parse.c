/*
 * template_parse.c — chat templates: the recursive-descent parser turning the
 * lexer's tokens (template_lex.c) into the tree in template_ast.h.
 *
 * Key decisions: the parser mirrors jinja2/parser.py function by function
 * (precedence, left-associative `**`, unary minus binding tighter than `**`,
 * filters applying after unary minus, `x is test arg` without parentheses,
 * `for x in y if cond`) because byte-identical output depends on those
 * quirks.  Unknown filters, tests and tags are compile errors, like jinja2's
 * TemplateAssertionError/TemplateSyntaxError.  Nesting is bounded (parser
 * recursion PARSE_MAX_NEST, tree depth AST_MAX_DEPTH) so hostile sources
 * cannot overflow the C stack here or in the evaluator.  Not supported
 * (compile error naming the construct): {% call %}, {% filter %},
 * {% include/import/extends/block/with %}, recursive loops, star-args.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template_ast.h"

/* ---------------------------------------------------------------- parser helpers */

static token *cur(parser *p)
{
    return &p->tok[p->pos];
}
static token *peek(parser *p, size_t k)
{
    return &p->tok[p->pos + k < p->ntok ? p->pos + k : p->ntok - 1];
}
static bool is_op(const token *k, const char *op)
{
    return k->t == T_OP && k->len == strlen(op) && !memcmp(k->s, op, k->len);
}
static bool is_name(const token *k, const char *nm)
{
    return k->t == T_NAME && k->len == strlen(nm) && !memcmp(k->s, nm, k->len);
}

static const char *describe(const token *k, char *buf, size_t cap)
{
    switch (k->t) {
    case T_EOF:
        return "end of template";
    case T_DATA:
        return "template data";
    case T_VAR_BEGIN:
        return "begin of print statement";
    case T_VAR_END:
        return "end of print statement";
    case T_BLOCK_BEGIN:
        return "begin of statement block";
    case T_BLOCK_END:
        return "end of statement block";
    case T_STRING:
        return "string";
    case T_INT:
        return "integer";
    case T_FLOAT:
        return "float";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(k->len > 40 ? 40 : k->len), k->s);
        return buf;
    }
}

static int expect_fail(parser *p, const char *what)
{
    char b[64];
    return tmpl_fail_at(p, cur(p)->off, "expected %s, got %s", what, describe(cur(p), b, sizeof b));
}

static int expect_op(parser *p, const char *op)
{
    if (!is_op(cur(p), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return expect_fail(p, w);
    }
    p->pos++;
    return 0;
}

static int expect_type(parser *p, tok_type t, const char *what)
{
    if (cur(p)->t != t)
        return expect_fail(p, what);
    p->pos++;
    return 0;
}

static const char *tok_name(parser *p, const token *k)
{
    return tmpl_strndup(p->t, k->s, k->len);
}

static node *mk(parser *p, node_kind kind, size_t off)
{
    node *n = tmpl_alloc(p->t, sizeof *n);
    if (!n) {
        tmpl_fail_at(p, off, "out of memory while parsing the template");
        return NULL;
    }
    n->kind = kind;
    tmpl_linecol(p, off, &n->line, &n->col);
    return n;
}

/* Growable node list used while parsing. */
typedef struct {
    node **v;
    size_t n, cap;
} nvec;

static int nv_push(parser *p, nvec *v, node *x)
{
    if (v->n == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 4;
        node **nv = tmpl_alloc(p->t, ncap * sizeof *nv);
        if (!nv)
            return tmpl_fail_at(p, cur(p)->off, "out of memory while parsing the template");
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = ncap;
    }
    v->v[v->n++] = x;
    return 0;
}

/* depth(n) = 1 + deepest child expression; bounded so evaluating the tree cannot exhaust the C
 * stack even for left-deep chains like 1+1+…+1 that the parser builds without recursing. */
static int setdepth(parser *p, node *n, size_t off)
{
    uint32_t d = 0;
    node *kids[4] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++)
        if (kids[i] && kids[i]->depth > d)
            d = kids[i]->depth;
    for (size_t i = 0; i < n->nargs; i++)
        if (n->args[i] && n->args[i]->depth > d)
            d = n->args[i]->depth;
    for (size_t i = 0; i < n->nkw; i++)
        if (n->kwargs[i]->depth > d)
            d = n->kwargs[i]->depth;
    n->depth = d + 1;
    if (n->depth > AST_MAX_DEPTH)
        return tmpl_fail_at(p, off, "expression nests deeper than %d levels", AST_MAX_DEPTH);
    return 0;
}

static int enter(parser *p)
{
    if (++p->nest > PARSE_MAX_NEST)
        return tmpl_fail_at(p, cur(p)->off, "template nests deeper than %d levels", PARSE_MAX_NEST);
    return 0;
}

/* ---------------------------------------------------------------- expressions */

static node *parse_expression(parser *p, bool with_condexpr);
static node *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens);
static node *parse_unary(parser *p, bool with_filter);
static node *parse_primary(parser *p);
static node *parse_postfix(parser *p, node *n);

static bool known_filter(const char *nm);
static bool known_test(const char *nm);

/* ( args, kw=v ) after the '(' token at cur; fills n->args / n->kwargs. */
static int parse_call_args(parser *p, node *n)
{
    nvec args = {0}, kws = {0};
    const char **kwn = NULL;
    size_t nkwn = 0, capkwn = 0;
    if (expect_op(p, "("))
        return -1;
    while (!is_op(cur(p), ")")) {
        if (args.n || nkwn) {
            if (expect_op(p, ","))
                return -1;
            if (is_op(cur(p), ")"))
                break;
        }
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            return tmpl_fail_at(p, cur(p)->off,
                                "*args and **kwargs in calls are not supported by spill's template engine");
        if (cur(p)->t == T_NAME && is_op(peek(p, 1), "=")) {
            if (nkwn == capkwn) {
                capkwn = capkwn ? capkwn * 2 : 4;
                const char **nk = tmpl_alloc(p->t, capkwn * sizeof *nk);
                if (!nk)
                    return tmpl_fail_at(p, cur(p)->off, "out of memory while parsing the template");
                if (nkwn)
                    memcpy(nk, kwn, nkwn * sizeof *nk);
                kwn = nk;
            }
            kwn[nkwn++] = tok_name(p, cur(p));
            p->pos += 2;
            node *v = parse_expression(p, true);
            if (!v || nv_push(p, &kws, v))
                return -1;
        } else {
            if (nkwn)
                return tmpl_fail_at(p, cur(p)->off, "positional argument follows keyword argument");
            node *v = parse_expression(p, true);
            if (!v || nv_push(p, &args, v))
                return -1;
        }
    }
    p->pos++;
    n->args = args.v;
    n->nargs = args.n;
    n->kwargs = kws.v;
    n->kwnames = kwn;
    n->nkw = kws.n;
    return 0;
}

static node *parse_filter(parser *p, node *n, bool start_inline)
{
    while (is_op(cur(p), "|") || start_inline) {
        if (!start_inline)
            p->pos++;
        start_inline = false;
        token *k = cur(p);
        if (k->t != T_NAME)
            return expect_fail(p, "filter name"), NULL;
        node *f = mk(p, E_FILTER, k->off);
        if (!f)
            return NULL;
        f->name = tok_name(p, k);
        p->pos++;
        while (is_op(cur(p), ".") && peek(p, 1)->t == T_NAME)
            return tmpl_fail_at(p, cur(p)->off, "dotted filter names are not supported"), NULL;
        if (!known_filter(f->name))
            return tmpl_fail_at(p, k->off, "no filter named '%s'", f->name), NULL;
        if (is_op(cur(p), "(") && parse_call_args(p, f))
            return NULL;
        f->a = n;
        if (setdepth(p, f, k->off))
            return NULL;
        n = f;
    }
    return n;
}

static node *parse_test(parser *p, node *n)
{
    size_t off = cur(p)->off;
    p->pos++; /* 'is' */
    node *t = mk(p, E_TEST, off);
    if (!t)
        return NULL;
    if (is_name(cur(p), "not")) {
        t->neg = true;
        p->pos++;
    }
    token *k = cur(p);
    if (k->t != T_NAME && !(k->t == T_OP && (is_op(k, "==") || is_op(k, "!=") || is_op(k, "<") || is_op(k, ">") ||
                                             is_op(k, "<=") || is_op(k, ">="))))
        return expect_fail(p, "test name"), NULL;
    t->name = tok_name(p, k);
    p->pos++;
    if (!known_test(t->name))
        return tmpl_fail_at(p, k->off, "no test named '%s'", t->name), NULL;
    token *c = cur(p);
    if (is_op(c, "(")) {
        if (parse_call_args(p, t))
            return NULL;
    } else if ((c->t == T_NAME || c->t == T_STRING || c->t == T_INT || c->t == T_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is"))
            return tmpl_fail_at(p, c->off, "you cannot chain multiple tests with is"), NULL;
        node *arg = parse_primary(p);
        if (!arg || !(arg = parse_postfix(p, arg)))
            return NULL;
        t->args = tmpl_alloc(p->t, sizeof *t->args);
        if (!t->args)
            return NULL;
        t->args[0] = arg;
        t->nargs = 1;
    }
    t->a = n;
    if (setdepth(p, t, off))
        return NULL;
    return t;
}

static node *parse_subscribed(parser *p)
{
    size_t off = cur(p)->off;
    node *parts[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), ":")) {
        p->pos++;
    } else {
        node *e = parse_expression(p, true);
        if (!e)
            return NULL;
        if (!is_op(cur(p), ":"))
            return e;
        p->pos++;
        parts[0] = e;
    }
    if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !is_op(cur(p), ",")) {
        if (!(parts[1] = parse_expression(p, true)))
            return NULL;
    }
    if (is_op(cur(p), ":")) {
        p->pos++;
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !(parts[2] = parse_expression(p, true)))
            return NULL;
    }
    node *s = mk(p, E_SLICE, off);
    if (!s)
        return NULL;
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static node *parse_postfix(parser *p, node *n)
{
    for (;;) {
        token *k = cur(p);
        if (is_op(k, ".")) {
            p->pos++;
            token *a = cur(p);
            node *x;
            if (a->t == T_NAME) {
                if (!(x = mk(p, E_ATTR, a->off)))
                    return NULL;
                x->name = tok_name(p, a);
            } else if (a->t == T_INT) {
                if (!(x = mk(p, E_ITEM, a->off)))
                    return NULL;
                node *c = mk(p, E_CONST, a->off);
                if (!c)
                    return NULL;
                c->cval = jv_int(a->i);
                c->depth = 1;
                x->b = c;
            } else {
                return expect_fail(p, "name or number after '.'"), NULL;
            }
            p->pos++;
            x->a = n;
            if (setdepth(p, x, a->off))
                return NULL;
            n = x;
        } else if (is_op(k, "[")) {
            p->pos++;
            node *idx = parse_subscribed(p);
            if (!idx)
                return NULL;
            if (is_op(cur(p), ","))
                return tmpl_fail_at(p, cur(p)->off, "tuple subscripts are not supported"), NULL;
            if (expect_op(p, "]"))
                return NULL;
            node *x;
            if (idx->kind == E_SLICE) {
                x = idx;
            } else {
                if (!(x = mk(p, E_ITEM, k->off)))
                    return NULL;
                x->b = idx;
            }
            x->a = n;
            if (setdepth(p, x, k->off))
                return NULL;
            n = x;
        } else if (is_op(k, "(")) {
            node *x = mk(p, E_CALL, k->off);
            if (!x || parse_call_args(p, x))
                return NULL;
            x->a = n;
            if (setdepth(p, x, k->off))
                return NULL;
            n = x;
        } else {
            return n;
        }
    }
}

static node *parse_filter_expr(parser *p, node *n)
{
    for (;;) {
        token *k = cur(p);
        if (is_op(k, "|")) {
            if (!(n = parse_filter(p, n, false)))
                return NULL;
        } else if (is_name(k, "is")) {
            if (!(n = parse_test(p, n)))
                return NULL;
        } else if (is_op(k, "(")) {
            node *x = mk(p, E_CALL, k->off);
            if (!x || parse_call_args(p, x))
                return NULL;
            x->a = n;
            if (setdepth(p, x, k->off))
                return NULL;
            n = x;
        } else {
            return n;
        }
    }
}

static node *parse_primary(parser *p)
{
    token *k = cur(p);
    node *n = NULL;
    if (enter(p))
        return NULL;
    if (k->t == T_NAME) {
        if (is_name(k, "true") || is_name(k, "True") || is_name(k, "false") || is_name(k, "False")) {
            if ((n = mk(p, E_CONST, k->off)))
                n->cval = jv_bool(k->s[0] == 't' || k->s[0] == 'T');
        } else if (is_name(k, "none") || is_name(k, "None")) {
            if ((n = mk(p, E_CONST, k->off)))
                n->cval = jv_none();
        } else if ((n = mk(p, E_NAME, k->off))) {
            n->name = tok_name(p, k);
        }
        p->pos++;
    } else if (k->t == T_STRING) {
        /* adjacent literals concatenate: "a" "b" */
        size_t total = 0, i = p->pos;
        while (p->tok[i].t == T_STRING)
            total += p->tok[i++].len;
        char *buf = tmpl_alloc(p->t, total + 1);
        size_t w = 0;
        if (buf)
            while (cur(p)->t == T_STRING) {
                memcpy(buf + w, cur(p)->s, cur(p)->len);
                w += cur(p)->len;
                p->pos++;
            }
        if (buf && (n = mk(p, E_CONST, k->off))) {
            jstr *c = tmpl_alloc(p->t, sizeof(jstr) + total + 1);
            if (!c)
                return tmpl_fail_at(p, k->off, "out of memory while parsing the template"), NULL;
            c->h.rc = -1; /* immortal: owned by the template, shared by concurrent renders */
            c->h.kind = JV_STR;
            c->len = total;
            memcpy(c->s, buf, total);
            n->cval.t = JV_STR;
            n->cval.u.s = c;
        }
    } else if (k->t == T_INT || k->t == T_FLOAT) {
        if ((n = mk(p, E_CONST, k->off)))
            n->cval = k->t == T_INT ? jv_int(k->i) : jv_float(k->f);
        p->pos++;
    } else if (is_op(k, "(")) {
        p->pos++;
        n = parse_tuple(p, false, true, NULL, true);
        if (n && expect_op(p, ")"))
            n = NULL;
    } else if (is_op(k, "[") || is_op(k, "{")) {
        bool dict = is_op(k, "{");
        const char *close = dict ? "}" : "]";
        nvec items = {0};
        p->pos++;
        while (!is_op(cur(p), close)) {
            if (items.n && expect_op(p, ","))
                return NULL;
            if (is_op(cur(p), close))
                break;
            node *e = parse_expression(p, true);
            if (!e || nv_push(p, &items, e))
                return NULL;
            if (dict) {
                if (expect_op(p, ":"))
                    return NULL;
                if (!(e = parse_expression(p, true)) || nv_push(p, &items, e))
                    return NULL;
            }
        }
        p->pos++;
        if ((n = mk(p, dict ? E_DICT : E_LIST, k->off))) {
            n->args = items.v;
            n->nargs = items.n;
        }
    } else {
        char b[64];
        tmpl_fail_at(p, k->off, "unexpected %s", describe(k, b, sizeof b));
        return NULL;
    }
    p->nest--;
    if (n && setdepth(p, n, k->off))
        return NULL;
    return n;
}

static node *parse_unary(parser *p, bool with_filter)
{
    token *k = cur(p);
    node *n;
    if (enter(p))
        return NULL;
    if (is_op(k, "-") || is_op(k, "+")) {
        p->pos++;
        node *x = parse_unary(p, false);
        if (!x || !(n = mk(p, is_op(k, "-") ? E_NEG : E_POS, k->off)))
            return NULL;
        n->a = x;
        if (setdepth(p, n, k->off))
            return NULL;
    } else {
        n = parse_primary(p);
    }
    if (n)
        n = parse_postfix(p, n);
    if (n && with_filter)
        n = parse_filter_expr(p, n);
    p->nest--;
    return n;
}

static node *binop_node(parser *p, node_kind kind, int op, node *l, node *r, size_t off)
{
    node *n = mk(p, kind, off);
    if (!n)
        return NULL;
    n->op = op;
    n->a = l;
    n->b = r;
    return setdepth(p, n, off) ? NULL : n;
}

static node *parse_pow(parser *p)
{
    node *l = parse_unary(p, true);
    while (l && is_op(cur(p), "**")) {
        size_t off = cur(p)->off;
        p->pos++;
        node *r = parse_unary(p, true);
        l = r ? binop_node(p, E_BINOP, OP_POW, l, r, off) : NULL;
    }
    return l;
}

static node *parse_math2(parser *p)
{
    node *l = parse_pow(p);
    for (;;) {
        token *k = cur(p);
        int op = is_op(k, "*")    ? OP_MUL
                 : is_op(k, "/")  ? OP_DIV
                 : is_op(k, "//") ? OP_FLOORDIV
                 : is_op(k, "%")  ? OP_MOD
                                  : -1;
        if (!l || op < 0)
            return l;
        p->pos++;
        node *r = parse_pow(p);
        l = r ? binop_node(p, E_BINOP, op, l, r, k->off) : NULL;
    }
}

static node *parse_concat(parser *p)
{
    node *l = parse_math2(p);
    while (l && is_op(cur(p), "~")) {
        size_t off = cur(p)->off;
        p->pos++;
        node *r = parse_math2(p);
        l = r ? binop_node(p, E_BINOP, OP_CONCAT, l, r, off) : NULL;
    }
    return l;
}

static node *parse_math1(parser *p)
{
    node *l = parse_concat(p);
    for (;;) {
        token *k = cur(p);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : -1;
        if (!l || op < 0)
            return l;
        p->pos++;
        node *r = parse_concat(p);
        l = r ? binop_node(p, E_BINOP, op, l, r, k->off) : NULL;
    }
}

static node *parse_compare(parser *p)
{
    node *first = parse_math1(p);
    if (!first)
        return NULL;
    nvec operands = {0};
    int ops[64];
    size_t nops = 0, off = cur(p)->off;
    if (nv_push(p, &operands, first))
        return NULL;
    for (;;) {
        token *k = cur(p);
        int op;
        if (is_op(k, "=="))
            op = CMP_EQ;
        else if (is_op(k, "!="))
            op = CMP_NE;
        else if (is_op(k, "<"))
            op = CMP_LT;
        else if (is_op(k, "<="))
            op = CMP_LE;
        else if (is_op(k, ">"))
            op = CMP_GT;
        else if (is_op(k, ">="))
            op = CMP_GE;
        else if (is_name(k, "in"))
            op = CMP_IN;
        else if (is_name(k, "not") && is_name(peek(p, 1), "in"))
            op = CMP_NOTIN, p->pos++;
        else
            break;
        p->pos++;
        if (nops == 64)
            return tmpl_fail_at(p, k->off, "more than 64 chained comparisons"), NULL;
        ops[nops++] = op;
        node *r = parse_math1(p);
        if (!r || nv_push(p, &operands, r))
            return NULL;
    }
    if (!nops)
        return first;
    node *n = mk(p, E_COMPARE, off);
    if (!n)
        return NULL;
    n->args = operands.v;
    n->nargs = operands.n;
    n->ops = tmpl_alloc(p->t, nops * sizeof(int));
    if (!n->ops)
        return NULL;
    memcpy(n->ops, ops, nops * sizeof(int));
    return setdepth(p, n, off) ? NULL : n;
}

static node *parse_not(parser *p)
{
    token *k = cur(p);
    if (is_name(k, "not")) {
        if (enter(p))
            return NULL;
        p->pos++;
        node *x = parse_not(p);
        p->nest--;
        node *n = x ? mk(p, E_NOT, k->off) : NULL;
        if (!n)
            return NULL;
        n->a = x;
        return setdepth(p, n, k->off) ? NULL : n;
    }
    return parse_compare(p);
}

static node *parse_and(parser *p)
{
    node *l = parse_not(p);
    while (l && is_name(cur(p), "and")) {
        size_t off = cur(p)->off;
        p->pos++;
        node *r = parse_not(p);
        l = r ? binop_node(p, E_AND, 0, l, r, off) : NULL;
    }
    return l;
}

static node *parse_or(parser *p)
{
    node *l = parse_and(p);
    while (l && is_name(cur(p), "or")) {
        size_t off = cur(p)->off;
        p->pos++;
        node *r = parse_and(p);
        l = r ? binop_node(p, E_OR, 0, l, r, off) : NULL;
    }
    return l;
}

static node *parse_condexpr(parser *p)
{
    node *e1 = parse_or(p);
    while (e1 && is_name(cur(p), "if")) {
        size_t off = cur(p)->off;
        p->pos++;
        node *e2 = parse_or(p), *e3 = NULL;
        if (!e2)
            return NULL;
        if (is_name(cur(p), "else")) {
            p->pos++;
            if (enter(p))
                return NULL;
            e3 = parse_condexpr(p);
            p->nest--;
            if (!e3)
                return NULL;
        }
        node *n = mk(p, E_COND, off);
        if (!n)
            return NULL;
        n->a = e2;
        n->b = e1;
        n->c = e3;
        if (setdepth(p, n, off))
            return NULL;
        e1 = n;
    }
    return e1;
}

static node *parse_expression(parser *p, bool with_condexpr)
{
    if (enter(p))
        return NULL;
    node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    p->nest--;
    return n;
}

static bool tuple_end(parser *p, const char *extra_end)
{
    token *k = cur(p);
    return k->t == T_VAR_END || k->t == T_BLOCK_END || k->t == T_EOF || is_op(k, ")") ||
           (extra_end && is_name(k, extra_end));
}

static node *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens)
{
    size_t off = cur(p)->off;
    nvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n && expect_op(p, ","))
            return NULL;
        if (tuple_end(p, extra_end))
            break;
        node *e = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!e || nv_push(p, &items, e))
            return NULL;
        if (is_op(cur(p), ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n)
            return items.v[0];
        if (!explicit_parens) {
            char b[64];
            return tmpl_fail_at(p, cur(p)->off, "expected an expression, got %s", describe(cur(p), b, sizeof b)), NULL;
        }
    }
    node *n = mk(p, E_TUPLE, off);
    if (!n)
        return NULL;
    n->args = items.v;
    n->nargs = items.n;
    return setdepth(p, n, off) ? NULL : n;
}

/* ---------------------------------------------------------------- statements */

static node *subparse(parser *p, const char *const *end_tags);

static int expect_block_end(parser *p)
{
    return expect_type(p, T_BLOCK_END, "end of statement block");
}

/* Parses the body up to one of end_tags; leaves cur at the end tag's name. */
static node *parse_body(parser *p, const char *const *end_tags, const char *opener, size_t open_off)
{
    node *b = subparse(p, end_tags);
    if (!b)
        return NULL;
    if (cur(p)->t == T_EOF) {
        tmpl_fail_at(p, open_off, "unexpected end of template: the '%s' block is never closed (expected '%s')", opener,
                     end_tags[0]);
        return NULL;
    }
    return b;
}

/* Names (or a tuple of names) assigned by for/set.  ns.attr allowed when with_ns. */
static int parse_targets(parser *p, node *n, const char *extra_end, bool with_ns)
{
    if (with_ns && cur(p)->t == T_NAME && is_op(peek(p, 1), ".") && peek(p, 2)->t == T_NAME) {
        n->name = tok_name(p, cur(p));
        n->tnames = tmpl_alloc(p->t, sizeof *n->tnames);
        if (!n->tnames)
            return -1;
        n->tnames[0] = tok_name(p, peek(p, 2));
        n->ntargets = 1;
        n->is_attr = true;
        p->pos += 3;
        return 0;
    }
    size_t cap = 0;
    for (;;) {
        if (n->ntargets && !is_op(cur(p), ","))
            break;
        if (n->ntargets)
            p->pos++;
        if (extra_end && is_name(cur(p), extra_end))
            break;
        if (cur(p)->t != T_NAME || is_name(cur(p), "true") || is_name(cur(p), "false") || is_name(cur(p), "none"))
            return expect_fail(p, "a variable name to assign to");
        if (n->ntargets == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nt = tmpl_alloc(p->t, cap * sizeof *nt);
            if (!nt)
                return -1;
            if (n->ntargets)
                memcpy(nt, n->tnames, n->ntargets * sizeof *nt);
            n->tnames = nt;
        }
        n->tnames[n->ntargets++] = tok_name(p, cur(p));
        p->pos++;
    }
    return 0;
}

static node *parse_if(parser *p, size_t off)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    node *top = mk(p, S_IF, off), *n = top;
    if (!n)
        return NULL;
    for (;;) {
        if (!(n->a = parse_tuple(p, false, false, NULL, false)) || expect_block_end(p))
            return NULL;
        if (!(n->b = parse_body(p, ends, "if", off)))
            return NULL;
        token *k = cur(p);
        p->pos++;
        if (is_name(k, "elif")) {
            node *e = mk(p, S_IF, k->off);
            if (!e)
                return NULL;
            n->c = e;
            n = e;
            continue;
        }
        if (is_name(k, "else")) {
            if (expect_block_end(p) || !(n->c = parse_body(p, endif, "if", off)))
                return NULL;
            p->pos++;
        }
        return expect_block_end(p) ? NULL : top;
    }
}

static node *parse_for(parser *p, size_t off)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    node *n = mk(p, S_FOR, off);
    if (!n || parse_targets(p, n, "in", false))
        return NULL;
    if (!is_name(cur(p), "in"))
        return expect_fail(p, "'in'"), NULL;
    p->pos++;
    if (!(n->a = parse_tuple(p, false, false, "recursive", false)))
        return NULL;
    if (is_name(cur(p), "if")) {
        p->pos++;
        if (!(n->b = parse_expression(p, true)))
            return NULL;
    }
    if (is_name(cur(p), "recursive"))
        return tmpl_fail_at(p, cur(p)->off, "recursive for loops are not supported"), NULL;
    if (expect_block_end(p))
        return NULL;
    p->loops++;
    n->c = parse_body(p, ends, "for", off);
    p->loops--;
    if (!n->c)
        return NULL;
    if (is_name(cur(p), "else")) {
        p->pos++;
        if (expect_block_end(p) || !(n->d = parse_body(p, endfor, "for", off)))
            return NULL;
    }
    p->pos++;
    return expect_block_end(p) ? NULL : n;
}

static node *parse_set(parser *p, size_t off)
{
    static const char *const endset[] = {"endset", NULL};
    node *n = mk(p, S_SET, off);
    if (!n || parse_targets(p, n, NULL, true))
        return NULL;
    if (is_op(cur(p), "=")) {
        p->pos++;
        if (!(n->a = parse_tuple(p, false, true, NULL, false)) || expect_block_end(p))
            return NULL;
        return n;
    }
    if (n->is_attr || n->ntargets != 1)
        return expect_fail(p, "'='"), NULL;
    n->kind = S_SETBLOCK;
    node *f = NULL;
    if (is_op(cur(p), "|")) {
        if (!(f = parse_filter(p, NULL, false)))
            return NULL;
    }
    if (expect_block_end(p))
        return NULL;
    int loops = p->loops;
    p->loops = 0;
    n->a = parse_body(p, endset, "set", off);
    p->loops = loops;
    if (!n->a)
        return NULL;
    n->b = f;
    p->pos++;
    return expect_block_end(p) ? NULL : n;
}

static node *parse_macro(parser *p, size_t off)
{
    static const char *const endmacro[] = {"endmacro", NULL};
    node *n = mk(p, S_MACRO, off);
    if (!n)
        return NULL;
    if (cur(p)->t != T_NAME)
        return expect_fail(p, "macro name"), NULL;
    n->name = tok_name(p, cur(p));
    p->pos++;
    if (expect_op(p, "("))
        return NULL;
    size_t cap = 0;
    while (!is_op(cur(p), ")")) {
        if (n->ntargets && expect_op(p, ","))
            return NULL;
        if (is_op(cur(p), ")"))
            break;
        if (cur(p)->t != T_NAME)
            return expect_fail(p, "parameter name"), NULL;
        if (n->ntargets == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nt = tmpl_alloc(p->t, cap * sizeof *nt);
            node **nd = tmpl_alloc(p->t, cap * sizeof *nd);
            if (!nt || !nd)
                return NULL;
            if (n->ntargets) {
                memcpy(nt, n->tnames, n->ntargets * sizeof *nt);
                memcpy(nd, n->pdefaults, n->ntargets * sizeof *nd);
            }
            n->tnames = nt;
            n->pdefaults = nd;
        }
        n->tnames[n->ntargets] = tok_name(p, cur(p));
        p->pos++;
        n->pdefaults[n->ntargets] = NULL;
        if (is_op(cur(p), "=")) {
            p->pos++;
            if (!(n->pdefaults[n->ntargets] = parse_expression(p, true)))
                return NULL;
        } else if (n->ntargets && n->pdefaults[n->ntargets - 1]) {
            return tmpl_fail_at(p, cur(p)->off, "non-default argument follows default argument"), NULL;
        }
        n->ntargets++;
    }
    p->pos++;
    if (expect_block_end(p))
        return NULL;
    int loops = p->loops;
    p->loops = 0;
    n->a = parse_body(p, endmacro, "macro", off);
    p->loops = loops;
    if (!n->a)
        return NULL;
    p->pos++;
    return expect_block_end(p) ? NULL : n;
}

static node *parse_statement(parser *p)
{
    token *k = cur(p);
    size_t off = k->off;
    if (k->t != T_NAME)
        return expect_fail(p, "a tag name"), NULL;
    p->pos++;
    if (is_name(k, "if"))
        return parse_if(p, off);
    if (is_name(k, "for"))
        return parse_for(p, off);
    if (is_name(k, "set"))
        return parse_set(p, off);
    if (is_name(k, "macro"))
        return parse_macro(p, off);
    if (is_name(k, "break") || is_name(k, "continue")) {
        if (!p->loops)
            return tmpl_fail_at(p, off, "'%.*s' outside a for loop", (int)k->len, k->s), NULL;
        node *n = mk(p, is_name(k, "break") ? S_BREAK : S_CONTINUE, off);
        return !n || expect_block_end(p) ? NULL : n;
    }
    if (is_name(k, "generation")) {
        static const char *const endgen[] = {"endgeneration", NULL};
        node *n = mk(p, S_SCOPE, off);
        if (!n || expect_block_end(p) || !(n->a = parse_body(p, endgen, "generation", off)))
            return NULL;
        p->pos++;
        return expect_block_end(p) ? NULL : n;
    }
    return tmpl_fail_at(p, off, "unknown or unsupported tag '%.*s'", (int)(k->len > 40 ? 40 : k->len), k->s), NULL;
}

static node *subparse(parser *p, const char *const *end_tags)
{
    nvec body = {0};
    size_t off = cur(p)->off;
    if (enter(p))
        return NULL;
    for (;;) {
        token *k = cur(p);
        if (k->t == T_EOF)
            break;
        if (k->t == T_DATA) {
            node *n = mk(p, S_TEXT, k->off);
            if (!n || nv_push(p, &body, n))
                return NULL;
            n->text = k->s;
            n->textlen = k->len;
            p->pos++;
        } else if (k->t == T_VAR_BEGIN) {
            p->pos++;
            node *n = mk(p, S_OUTPUT, k->off);
            if (!n || !(n->a = parse_tuple(p, false, true, NULL, false)))
                return NULL;
            if (expect_type(p, T_VAR_END, "end of print statement") || nv_push(p, &body, n))
                return NULL;
        } else if (k->t == T_BLOCK_BEGIN) {
            p->pos++;
            if (end_tags)
                for (const char *const *e = end_tags; *e; e++)
                    if (is_name(cur(p), *e))
                        goto done;
            node *n = parse_statement(p);
            if (!n || nv_push(p, &body, n))
                return NULL;
        } else {
            char b[64];
            return tmpl_fail_at(p, k->off, "unexpected %s", describe(k, b, sizeof b)), NULL;
        }
    }
    if (end_tags) {
        tmpl_fail_at(p, cur(p)->off, "unexpected end of template, expected '%s'", end_tags[0]);
        return NULL;
    }
done:
    p->nest--;
    node *b = mk(p, S_BODY, off);
    if (!b)
        return NULL;
    b->args = body.v;
    b->nargs = body.n;
    return b;
}

/* ---------------------------------------------------------------- filters/tests known at compile time */

static bool in_list(const char *nm, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(nm, *list))
            return true;
    return false;
}

static bool known_filter(const char *nm)
{
    static const char *const names[] = {
        "abs",     "attr",    "capitalize", "count",  "d",      "default",    "dictsort", "e",
        "escape",  "first",   "float",      "indent", "int",    "items",      "join",     "last",
        "length",  "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
        "replace", "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",
        "sum",     "title",   "tojson",     "trim",   "unique", "upper",      NULL};
    return in_list(nm, names);
}

static bool known_test(const char *nm)
{
    static const char *const names[] = {"boolean",     "callable", "defined",  "divisibleby", "eq",   "equalto",
                                        "escaped",     "even",     "false",    "float",       "ge",   "gt",
                                        "greaterthan", "in",       "integer",  "iterable",    "le",   "lower",
                                        "lessthan",    "lt",       "mapping",  "ne",          "none", "number",
                                        "odd",         "sameas",   "sequence", "string",      "true", "undefined",
                                        "upper",       "==",       "!=",       "<",           "<=",   ">",
                                        ">=",          NULL};
    return in_list(nm, names);
}

/* ---------------------------------------------------------------- scope analysis */

/* jinja2 (idtracking.py) decides, per frame and before running it, how each name the frame
 * touches starts.  First touch a load → read through to the enclosing frames / the context.
 * First touch a store → if an enclosing frame references the name, start from its value;
 * otherwise start undefined, even when the context has the name.  So a loop that runs before a
 * top-level `set x` sees x undefined.  Frames: the template body, each for-loop body and
 * for-else, macro body, `{% set x %}` block and `{% generation %}` block.  Branches follow
 * jinja2's branch_update: a name first stored inside an if/elif/else branch reads through.
 * The result is, per frame node, the names to bind to undefined on entry (n->undef). */
enum { SYM_RESOLVE = 1, SYM_UNDEFINED = 2 };

typedef struct {
    const char *name;
    int kind;
    bool stored;
} sym;

typedef struct symtab {
    sym *v;
    size_t n, cap;
    bool oom;
    const struct symtab *parent; /* the enclosing frame's finished analysis */
} symtab;

static sym *sym_find(const symtab *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->v[i].name, name))
            return &t->v[i];
    return NULL;
}

static sym *sym_add(symtab *t, const char *name, int kind)
{
    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        sym *nv = realloc(t->v, ncap * sizeof *nv);
        if (!nv) {
            t->oom = true;
            return NULL;
        }
        t->v = nv;
        t->cap = ncap;
    }
    t->v[t->n] = (sym){name, kind, false};
    return &t->v[t->n++];
}

static void sym_load(symtab *t, const char *name)
{
    if (!sym_find(t, name))
        sym_add(t, name, SYM_RESOLVE);
}

/* First touch a store: undefined unless an enclosing frame references the name (then it
 * starts as that frame's value, which the runtime's scope chain already gives). */
static void sym_store(symtab *t, const char *name)
{
    sym *s = sym_find(t, name);
    if (!s) {
        bool outer = false;
        for (const symtab *q = t->parent; q && !outer; q = q->parent)
            outer = sym_find(q, name) != NULL;
        s = sym_add(t, name, outer ? SYM_RESOLVE : SYM_UNDEFINED);
    }
    if (s)
        s->stored = true;
}

static bool sym_copy(symtab *dst, const symtab *src)
{
    dst->v = malloc((src->n + 1) * sizeof *dst->v);
    dst->n = dst->cap = src->n;
    dst->oom = !dst->v;
    dst->parent = src->parent;
    if (dst->v && src->n)
        memcpy(dst->v, src->v, src->n * sizeof *dst->v);
    return !dst->oom;
}

static void scan_expr(symtab *t, const node *n)
{
    if (!n)
        return;
    if (n->kind == E_NAME)
        sym_load(t, n->name);
    scan_expr(t, n->a);
    scan_expr(t, n->b);
    scan_expr(t, n->c);
    scan_expr(t, n->d);
    for (size_t i = 0; i < n->nargs; i++)
        scan_expr(t, n->args[i]);
    for (size_t i = 0; i < n->nkw; i++)
        scan_expr(t, n->kwargs[i]);
}

static void scan_stmt(symtab *t, const node *n);

/* Merges three branch copies into t (jinja2 Symbols.branch_update): a name first stored inside
 * a branch reads through. */
static void branch_update(symtab *t, symtab br[3])
{
    size_t before = t->n;
    bool *was_stored = calloc(before + 1, sizeof *was_stored);
    if (!was_stored) {
        t->oom = true;
        return;
    }
    for (size_t i = 0; i < before; i++)
        was_stored[i] = t->v[i].stored;
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < br[b].n; i++) {
            sym *s = sym_find(t, br[b].v[i].name);
            if (!s)
                s = sym_add(t, br[b].v[i].name, br[b].v[i].kind);
            if (!s || !br[b].v[i].stored)
                continue;
            size_t at = (size_t)(s - t->v);
            if (!(at < before && was_stored[at]))
                s->kind = SYM_RESOLVE;
            s->stored = true;
        }
    free(was_stored);
}

/* One jinja2 If node: test, body, a list of elif nodes (each an If without elif/else), else.
 * The tree nests elifs as S_IF in `c`; elif_node marks one visited as a list element. */
static void scan_if(symtab *t, const node *n, bool elif_node)
{
    symtab br[3] = {{0}};
    scan_expr(t, n->a);
    for (int b = 0; b < 3; b++)
        if (!sym_copy(&br[b], t))
            t->oom = true;
    if (!t->oom) {
        scan_stmt(&br[0], n->b);
        const node *c = n->c;
        if (!elif_node) {
            for (; c && c->kind == S_IF; c = c->c)
                scan_if(&br[1], c, true);
            if (c)
                scan_stmt(&br[2], c);
        }
        branch_update(t, br);
    }
    for (int b = 0; b < 3; b++) {
        t->oom |= br[b].oom;
        free(br[b].v);
    }
}

/* What a frame's own statements load and store; bodies of nested frames are skipped. */
static void scan_stmt(symtab *t, const node *n)
{
    if (!n)
        return;
    switch (n->kind) {
    case S_BODY:
        for (size_t i = 0; i < n->nargs; i++)
            scan_stmt(t, n->args[i]);
        break;
    case S_OUTPUT:
        scan_expr(t, n->a);
        break;
    case S_IF:
        scan_if(t, n, false);
        break;
    case S_FOR:
        scan_expr(t, n->a);
        break; /* target, filter, body and else are other frames */
    case S_SET:
        scan_expr(t, n->a);
        if (n->is_attr)
            sym_load(t, n->name);
        else
            for (size_t i = 0; i < n->ntargets; i++)
                sym_store(t, n->tnames[i]);
        break;
    case S_SETBLOCK:
        sym_store(t, n->tnames[0]);
        break;
    case S_MACRO:
        sym_store(t, n->name);
        break;
    default:
        break; /* text, break/continue, {% generation %} */
    }
}

static int analyse_frame(parser *p, node *owner, const node *body, const symtab *parent, const char *const *params,
                         size_t nparams);

/* Analyses every frame nested directly in `n` (a statement of the frame `self`). */
static int analyse_children(parser *p, node *n, const symtab *self)
{
    if (!n)
        return 0;
    switch (n->kind) {
    case S_BODY:
        for (size_t i = 0; i < n->nargs; i++)
            if (analyse_children(p, n->args[i], self))
                return -1;
        return 0;
    case S_IF:
        return analyse_children(p, n->b, self) || analyse_children(p, n->c, self) ? -1 : 0;
    case S_FOR:
        /* the body frame stores the targets and `loop` first; else is a frame of its own */
        if (analyse_frame(p, n, n->c, self, n->tnames, n->ntargets))
            return -1;
        return n->d ? analyse_frame(p, n->d, n->d, self, NULL, 0) : 0;
    case S_MACRO:
        return analyse_frame(p, n, n->a, self, n->tnames, n->ntargets);
    case S_SETBLOCK:
    case S_SCOPE:
        return analyse_frame(p, n, n->a, self, NULL, 0);
    default:
        return 0;
    }
}

static int analyse_frame(parser *p, node *owner, const node *body, const symtab *parent, const char *const *params,
                         size_t nparams)
{
    symtab t = {.parent = parent};
    for (size_t i = 0; i < nparams; i++)
        sym_store(&t, params[i]);
    scan_stmt(&t, body);
    size_t k = 0;
    for (size_t i = 0; i < t.n; i++) {
        bool param = false;
        for (size_t j = 0; j < nparams; j++)
            param |= !strcmp(params[j], t.v[i].name);
        k += t.v[i].kind == SYM_UNDEFINED && !param;
    }
    if (!t.oom && k) {
        owner->undef = tmpl_alloc(p->t, k * sizeof *owner->undef);
        if (!owner->undef)
            t.oom = true;
        for (size_t i = 0; !t.oom && i < t.n; i++) {
            bool param = false;
            for (size_t j = 0; j < nparams; j++)
                param |= !strcmp(params[j], t.v[i].name);
            if (t.v[i].kind == SYM_UNDEFINED && !param)
                owner->undef[owner->nundef++] = t.v[i].name;
        }
    }
    int rc = t.oom ? tmpl_fail_at(p, 0, "out of memory while analysing the template") : 0;
    if (!rc)
        rc = analyse_children(p, (node *)body, &t);
    free(t.v);
    return rc;
}

node *tmpl_parse(parser *p)
{
    node *root = subparse(p, NULL);
    if (root && analyse_frame(p, root, root, NULL, NULL, 0))
        return NULL;
    return root;
}
