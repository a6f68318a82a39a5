/*
 * grammar_compile.c — a JSON schema compiled into grammar.c's nodes, and the job's set of compiled grammars
 * (one per distinct schema and wrap).
 *
 * Owns: the nodes (one per schema object; $ref shares the target's node, so recursive schemas are finite),
 * $ref resolution, allOf merging, discriminated unions, first-byte sets, the wrap's literal text, and the
 * one-sentence refusals of what the automaton cannot enforce.  Does not own: walking the nodes byte by byte
 * (grammar.c, whose opening comment records the language accepted and the decisions behind it).
 */
#include "grammar.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "grammar_internal.h"

static const char *const FMT_NAME[FMT_COUNT] = {NULL,    "date", "time", "date-time", "uuid",
                                                "email", "ipv4", "ipv6", "hostname"};
/* formats written as patterns (regex.c), with the longest text their RFC allows */
#define RX_LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define RX_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
static const char *const FMT_RX[FMT_COUNT] = {
    [FMT_EMAIL] = "^[A-Za-z0-9_%+-]+(\\.[A-Za-z0-9_%+-]+)*@" RX_LABEL "(\\." RX_LABEL ")+$",
    [FMT_IPV4] = "^" RX_OCTET "(\\." RX_OCTET "){3}$",
    [FMT_IPV6] = "^[0-9A-Fa-f]{1,4}(:[0-9A-Fa-f]{1,4}){7}$",
    [FMT_HOSTNAME] = "^" RX_LABEL "(\\." RX_LABEL ")*$",
};
static const int32_t FMT_RX_MAX[FMT_COUNT] = {[FMT_EMAIL] = 254, [FMT_HOSTNAME] = 253};

static _Atomic uint64_t g_next_id = 1;

/* ---------------------------------------------------------------- compiling */

typedef struct cctx {
    grammar *g;
    const json_t *doc;   /* the whole schema, for $ref */
    const json_t **memo; /* (n_memo) schema objects compiled, and their nodes */
    int32_t *memo_node;
    int32_t n_memo, cap_memo;
    int32_t *alt_node; /* (n_alt_paths) anyOf nodes and their paths (for first_sets' sentence), owned */
    char **alt_path;
    int32_t n_alt_paths, cap_alt_paths;
    char *where, *err;
    size_t wlen, errlen;
    json_t *temps;    /* schemas made while compiling (allOf merges), alive to the end */
    const char *root; /* the document's path (a $ref target's sentences start with it) */
} cctx;

__attribute__((format(printf, 3, 4))) static int cfail(cctx *c, const char *path, const char *fmt, ...)
{
    if (c->where && c->wlen)
        snprintf(c->where, c->wlen, "%s", path);
    if (c->err && c->errlen) {
        int n = snprintf(c->err, c->errlen, "%s: ", path);
        if (n >= 0 && (size_t)n < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static int grow(void **p, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static int add_text(grammar *g, const char *s, size_t n, uint32_t *off)
{
    if (g->text_len + n > UINT32_MAX)
        return -1;
    if (g->text_len + n > g->text_cap) {
        size_t nc = g->text_cap ? g->text_cap * 2 : 1024;
        while (nc < g->text_len + n)
            nc *= 2;
        char *t = realloc(g->text, nc);
        if (!t)
            return -1;
        g->text = t;
        g->text_cap = nc;
    }
    memcpy(g->text + g->text_len, s, n);
    *off = (uint32_t)g->text_len;
    g->text_len += n;
    return 0;
}

static int32_t new_node(grammar *g)
{
    if (g->n_nodes >= GRAMMAR_MAX_NODES || grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(gnode)))
        return -1;
    gnode *nd = &g->nodes[g->n_nodes];
    memset(nd, 0, sizeof *nd);
    nd->extra = nd->items = -1;
    nd->max_items = nd->max_len = -1;
    return g->n_nodes++;
}

static int lit_cmp(const grammar *g, const glit *a, const glit *b)
{
    int c = memcmp(g->text + a->off, g->text + b->off, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* Appends the literals (compact serialisations of vals, n of them) as node nd's sorted, unique list. */
static int add_literals(grammar *g, int32_t nd, const json_t *const *vals, size_t n)
{
    int32_t lit0 = g->n_lits;
    for (size_t i = 0; i < n; i++) {
        char *t = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
        uint32_t off;
        size_t len = t ? strlen(t) : 0;
        int rc = !t || grow((void **)&g->lits, &g->cap_lits, g->n_lits + 1, sizeof(glit)) || add_text(g, t, len, &off);
        free(t);
        if (rc)
            return -1;
        glit l = {off, (uint32_t)len};
        int32_t at = lit0;
        while (at < g->n_lits && lit_cmp(g, &g->lits[at], &l) < 0)
            at++;
        if (at < g->n_lits && lit_cmp(g, &g->lits[at], &l) == 0)
            continue; /* a duplicate */
        memmove(g->lits + at + 1, g->lits + at, (size_t)(g->n_lits - at) * sizeof *g->lits);
        g->lits[at] = l;
        g->n_lits++;
    }
    g->nodes[nd].lit0 = lit0;
    g->nodes[nd].n_lit = g->n_lits - lit0;
    return 0;
}

static uint8_t value_types(const json_t *v)
{
    if (json_is_string(v))
        return T_STR;
    if (json_is_integer(v))
        return T_INT | T_NUM;
    if (json_is_real(v)) {
        double d = json_real_value(v);
        return d == floor(d) ? T_INT | T_NUM : T_NUM;
    }
    if (json_is_boolean(v))
        return T_BOOL;
    if (json_is_null(v))
        return T_NULL;
    return json_is_object(v) ? T_OBJ : T_ARR;
}

static bool in_list(const char *k, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(k, *list))
            return true;
    return false;
}

static const char *const ANNOTATIONS[] = {"title", "description", "default",    "examples", "$schema",
                                          "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs", "definitions", NULL};
static const char *const KEYWORDS[] = {"type",        "properties", "required",         "additionalProperties",
                                       "items",       "minItems",   "maxItems",         "enum",
                                       "const",       "minLength",  "maxLength",        "format",
                                       "minimum",     "maximum",    "exclusiveMinimum", "exclusiveMaximum",
                                       "anyOf",       "oneOf",      "multipleOf",       "pattern",
                                       "uniqueItems", "allOf",      "prefixItems",      NULL};

typedef struct spath {
    char s[512];
} spath;

static spath sub(const char *p, const char *key)
{
    spath r;
    int n = snprintf(r.s, sizeof r.s, "%s.%s", p, key);
    if (n < 0 || (size_t)n >= sizeof r.s) /* a path this long is cut; the sentence still names its start */
        r.s[sizeof r.s - 1] = 0;
    return r;
}

static spath subi(const char *p, size_t i)
{
    spath r;
    int n = snprintf(r.s, sizeof r.s, "%s[%zu]", p, i);
    if (n < 0 || (size_t)n >= sizeof r.s)
        r.s[sizeof r.s - 1] = 0;
    return r;
}

/* The schema a "#…" JSON pointer names in the document, or NULL. */
static const json_t *resolve_ref(const json_t *doc, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const json_t *at = doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/')
            return NULL;
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1'))
                ch = *p++ == '0' ? '~' : '/';
            if (n + 1 >= sizeof tok)
                return NULL;
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(at))
            at = json_object_get(at, tok);
        else if (json_is_array(at)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            at = *end || !n ? NULL : json_array_get(at, i);
        } else
            return NULL;
        if (!at)
            return NULL;
    }
    return at;
}

static int compile_node(cctx *c, const json_t *s, const char *path, int depth, int32_t *out);

static int get_count(cctx *c, const json_t *s, const char *key, const char *path, int32_t *v)
{
    json_t *x = json_object_get(s, key);
    if (!x)
        return 0;
    spath p = sub(path, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX / 2)
        return cfail(c, p.s, "must be a whole number from 0.");
    *v = (int32_t)json_integer_value(x);
    return 0;
}

static int compile_object(cctx *c, const json_t *s, const char *path, int depth, int32_t nd)
{
    grammar *g = c->g;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return cfail(c, sub(path, "properties").s, "must be an object of schemas.");
    size_t np = props ? json_object_size(props) : 0;
    if (np > GRAMMAR_MAX_PROPS)
        return cfail(c, sub(path, "properties").s, "has %zu properties, but constrained decoding takes at most %d.", np,
                     GRAMMAR_MAX_PROPS);
    if (req && !json_is_array(req))
        return cfail(c, sub(path, "required").s, "must be a list of property names.");
    int32_t prop0 = g->n_props;
    if (grow((void **)&g->props, &g->cap_props, g->n_props + (int32_t)np, sizeof(gprop)))
        return cfail(c, path, "out of memory.");
    g->n_props += (int32_t)np;
    g->nodes[nd].prop0 = prop0;
    g->nodes[nd].n_prop = (int32_t)np;
    const char *k;
    json_t *v;
    int32_t i = 0;
    json_object_foreach(props, k, v)
    {
        json_t *ks = json_string(k);
        char *t = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        uint32_t off = 0;
        size_t tl = t ? strlen(t) : 0;
        int rc = t && tl >= 2 ? add_text(g, t + 1, tl - 2, &off) : -1; /* the escaped name without its quotes */
        free(t);
        if (rc)
            return cfail(c, path, "out of memory.");
        g->props[prop0 + i] = (gprop){off, (uint32_t)(tl - 2), -1, false};
        spath pp = sub(sub(path, "properties").s, k);
        int32_t child;
        if (compile_node(c, v, pp.s, depth + 1, &child))
            return -1;
        g->props[prop0 + i].node = child;
        i++;
    }
    size_t ri;
    json_array_foreach(req, ri, v)
    {
        spath rp = subi(sub(path, "required").s, ri);
        if (!json_is_string(v))
            return cfail(c, rp.s, "must be a property name.");
        int32_t idx = -1, n = 0;
        const char *pk;
        json_t *pv;
        json_object_foreach(props, pk, pv)
        {
            if (!strcmp(pk, json_string_value(v)))
                idx = n;
            n++;
        }
        if (idx < 0)
            return cfail(c, rp.s, "names \"%s\", which is not in properties; add it there or remove it.",
                         json_string_value(v));
        g->props[prop0 + idx].required = true;
    }
    if (!ap)
        g->nodes[nd].extra = np ? -1 : g->any; /* decision: no extra keys beside listed properties */
    else if (json_is_false(ap))
        g->nodes[nd].extra = -1;
    else if (json_is_true(ap))
        g->nodes[nd].extra = g->any;
    else {
        int32_t child;
        if (compile_node(c, ap, sub(path, "additionalProperties").s, depth + 1, &child))
            return -1;
        g->nodes[nd].extra = child;
    }
    return 0;
}

/*
 * anyOf whose branches are all objects whose first property has the same name, is required, and is an
 * enum / const whose values no two branches share (a discriminated union: the call objects of a `required`
 * tool_choice, {"type": "circle", …} | {"type": "square", …}): node nd becomes an object with that one
 * property, whose literal value picks the branch — value_done switches the open object's node to it, with
 * the tag written.  0 (converted or left as it is: first_sets judges an anyOf that stays), -1 out of memory.
 */
static int discriminate(grammar *g, int32_t nd)
{
    int32_t alt0 = g->nodes[nd].alt0, n = g->nodes[nd].n_alt, total = 0;
    const gprop *k0 = NULL;
    for (int32_t i = 0; i < n; i++) {
        const gnode *b = &g->nodes[g->alts[alt0 + i]];
        if (b->types != T_OBJ || b->n_lit || b->n_alt || b->n_disc || b->n_prop < 1)
            return 0;
        const gprop *k = &g->props[b->prop0];
        if (!k->required || k->node < 0 || !g->nodes[k->node].n_lit)
            return 0;
        if (k0 && (k->len != k0->len || memcmp(g->text + k->off, g->text + k0->off, k->len)))
            return 0;
        k0 = k;
        total += g->nodes[k->node].n_lit;
    }
    int32_t lnode = new_node(g), lit0 = g->n_lits;
    if (lnode < 0 || grow((void **)&g->lits, &g->cap_lits, g->n_lits + total, sizeof(glit)) ||
        grow((void **)&g->alts, &g->cap_alts, g->n_alts + total, sizeof(int32_t)) ||
        grow((void **)&g->props, &g->cap_props, g->n_props + 1, sizeof(gprop)))
        return -1;
    int32_t disc0 = g->n_alts;
    for (int32_t i = 0; i < n; i++) { /* insertion into the sorted list; the table moves with it */
        int32_t br = g->alts[alt0 + i];
        const gnode *tag = &g->nodes[g->props[g->nodes[br].prop0].node];
        for (int32_t j = 0; j < tag->n_lit; j++) {
            glit l = g->lits[tag->lit0 + j];
            int32_t at = lit0;
            while (at < g->n_lits && lit_cmp(g, &g->lits[at], &l) < 0)
                at++;
            if (at < g->n_lits && lit_cmp(g, &g->lits[at], &l) == 0) {
                g->n_lits = lit0; /* two branches share a tag value: left as an anyOf */
                return 0;
            }
            memmove(g->lits + at + 1, g->lits + at, (size_t)(g->n_lits - at) * sizeof *g->lits);
            memmove(g->alts + disc0 + (at - lit0) + 1, g->alts + disc0 + (at - lit0),
                    (size_t)(g->n_lits - at) * sizeof *g->alts);
            g->lits[at] = l;
            g->alts[disc0 + (at - lit0)] = br;
            g->n_lits++;
        }
    }
    g->n_alts += total;
    g->nodes[lnode].lit0 = lit0;
    g->nodes[lnode].n_lit = total;
    gprop key = *k0;
    key.node = lnode;
    g->props[g->n_props] = key;
    gnode *u = &g->nodes[nd];
    u->types = T_OBJ;
    u->n_alt = 0;
    u->prop0 = g->n_props++;
    u->n_prop = 1;
    u->extra = -1;
    u->disc0 = disc0;
    u->n_disc = total;
    return 0;
}

static int compile_array(cctx *c, const json_t *s, const char *path, int depth, int32_t nd)
{
    grammar *g = c->g;
    json_t *it = json_object_get(s, "items"), *pi = json_object_get(s, "prefixItems"),
           *uq = json_object_get(s, "uniqueItems");
    int32_t child = g->any;
    if (it && json_is_array(it))
        return cfail(c, sub(path, "items").s,
                     "is a list (the old tuple form); write it as prefixItems (and items: "
                     "false for no more items).");
    if (pi) {
        spath pp = sub(path, "prefixItems");
        if (!json_is_array(pi) || !json_array_size(pi) || json_array_size(pi) > GRAMMAR_MAX_PROPS)
            return cfail(c, pp.s, "must be a list of 1 to %d schemas.", GRAMMAR_MAX_PROPS);
        int32_t n = (int32_t)json_array_size(pi), tup0 = g->n_alts;
        if (grow((void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof(int32_t)))
            return cfail(c, path, "out of memory.");
        g->n_alts += n;
        for (int32_t i = 0; i < n; i++) {
            int32_t t;
            if (compile_node(c, json_array_get(pi, (size_t)i), subi(pp.s, (size_t)i).s, depth + 1, &t))
                return -1;
            g->alts[tup0 + i] = t;
        }
        g->nodes[nd].tup0 = tup0;
        g->nodes[nd].n_tup = n;
    }
    if (json_is_false(it))
        child = -1; /* no items past prefixItems */
    else if (it && compile_node(c, it, sub(path, "items").s, depth + 1, &child))
        return -1;
    gnode *nd_p = &g->nodes[nd];
    nd_p->items = child;
    if (get_count(c, s, "minItems", path, &nd_p->min_items) || get_count(c, s, "maxItems", path, &nd_p->max_items))
        return -1;
    if (child < 0 && (nd_p->max_items < 0 || nd_p->max_items > nd_p->n_tup))
        nd_p->max_items = nd_p->n_tup;
    if (nd_p->max_items >= 0 && nd_p->max_items < nd_p->min_items)
        return cfail(c, sub(path, json_object_get(s, "maxItems") ? "maxItems" : "items").s,
                     "allows fewer items than minItems, so no array fits.");
    if (uq && !json_is_boolean(uq))
        return cfail(c, sub(path, "uniqueItems").s, "must be true or false.");
    if (json_is_true(uq) && (nd_p->max_items < 0 || nd_p->max_items > 1)) {
        /* decision: enforced where the items are an enum or const (a mask of the values used); unique strings,
         * numbers or objects would need every item kept in the state */
        const gnode *in = child >= 0 ? &g->nodes[child] : NULL;
        if (nd_p->n_tup || !in || !in->n_lit || in->n_alt || in->n_lit > 64)
            return cfail(c, sub(path, "uniqueItems").s,
                         "can be enforced only when items is an enum or const of at "
                         "most 64 values (and there are no prefixItems); list the "
                         "values or remove uniqueItems.");
        if (nd_p->min_items > in->n_lit)
            return cfail(c, sub(path, "uniqueItems").s,
                         "with minItems %d needs more distinct items than the %d "
                         "values items allows.",
                         nd_p->min_items, in->n_lit);
        nd_p->unique = true;
    }
    return 0;
}

static int compile_string(cctx *c, const json_t *s, const char *path, int32_t nd)
{
    grammar *g = c->g;
    gnode *nd_p = &g->nodes[nd];
    if (get_count(c, s, "minLength", path, &nd_p->min_len) || get_count(c, s, "maxLength", path, &nd_p->max_len))
        return -1;
    if (nd_p->max_len >= 0 && nd_p->max_len < nd_p->min_len)
        return cfail(c, sub(path, "maxLength").s, "is below minLength, so no string fits.");
    json_t *f = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    const char *rx = NULL;
    spath rp = sub(path, "pattern");
    if (f) {
        spath fp = sub(path, "format");
        int fmt = 0;
        for (int i = 1; i < FMT_COUNT && json_is_string(f); i++)
            if (!strcmp(json_string_value(f), FMT_NAME[i]))
                fmt = i;
        if (!fmt)
            return cfail(c, fp.s,
                         "%s is not a format spill can enforce; use date, time, date-time, uuid, email, "
                         "ipv4, ipv6 or hostname, or remove it.",
                         json_is_string(f) ? json_string_value(f) : "this value");
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return cfail(c, fp.s, "cannot be combined with minLength or maxLength; a format fixes the length.");
        if (pat)
            return cfail(c, rp.s, "cannot be combined with format; keep one of them.");
        if (FMT_RX[fmt]) {
            rx = FMT_RX[fmt];
            nd_p->max_len = FMT_RX_MAX[fmt] ? FMT_RX_MAX[fmt] : -1;
            rp = fp;
        } else
            nd_p->format = (uint8_t)fmt;
    }
    if (pat) {
        if (!json_is_string(pat))
            return cfail(c, rp.s, "must be a regular expression (a string).");
        if (json_object_get(s, "minLength"))
            return cfail(c, rp.s,
                         "cannot be combined with minLength (maxLength is fine); put the length into the "
                         "pattern, such as .{3,}.");
        rx = json_string_value(pat);
    }
    if (!rx)
        return 0;
    char e[300];
    if (grow((void **)&g->rx, &g->cap_rx, g->n_rx + 1, sizeof(rx_dfa)))
        return cfail(c, rp.s, "out of memory.");
    if (rx_compile(rx, &g->rx[g->n_rx], e, sizeof e))
        return cfail(c, rp.s, "%s", e);
    g->n_rx++;
    nd_p = &g->nodes[nd];
    nd_p->rx = g->n_rx;
    if (nd_p->max_len >= 0 && g->rx[g->n_rx - 1].minrem[0] > nd_p->max_len)
        return cfail(c, rp.s, "matches no string of at most maxLength (%d) characters.", nd_p->max_len);
    return 0;
}

/* A number bound in units of 10^-RDIGITS, rounded down (up: false) or up: exact for integers; for reals, of
 * the shortest decimal that reads back as the same double (what a validator compares the text's double
 * against: see num_feed_real). */
static i128 rbound(const json_t *b, bool up)
{
    if (json_is_integer(b)) {
        json_int_t v = json_integer_value(b);
        return v > 10000000000000000LL ? RBIG : v < -10000000000000000LL ? -RBIG : (i128)v * RU;
    }
    double d = json_real_value(b);
    char buf[48];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    snprintf(buf, sizeof buf, "%.*e", p - 1, d);
    bool neg = buf[0] == '-';
    i128 m = 0;
    const char *q = buf + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            m = m * 10 + (*q - '0');
    int scale = (*q == 'e' ? atoi(q + 1) : 0) - (p - 1) + RDIGITS; /* |d| = m * 10^(scale - RDIGITS) */
    bool down = neg ? up : !up;                                    /* rounding of the magnitude */
    i128 mag;
    if (scale >= 0) {
        mag = m;
        for (int k = 0; k < scale && mag < RBIG; k++)
            mag *= 10;
        if (mag > RBIG)
            mag = RBIG;
    } else {
        i128 div = 1;
        for (int k = 0; k < -scale && div < RBIG; k++)
            div *= 10;
        mag = m / div + (!down && m % div ? 1 : 0);
    }
    return neg ? -mag : mag;
}

static int compile_bounds(cctx *c, const json_t *s, const char *path, int32_t nd)
{
    grammar *g = c->g;
    gnode *nd_p = &g->nodes[nd];
    uint8_t types = nd_p->types;
    json_t *mo = json_object_get(s, "multipleOf");
    if (mo && (types & (T_INT | T_NUM))) {
        spath mp = sub(path, "multipleOf");
        double d = json_number_value(mo);
        if (!json_is_number(mo) || !(d > 0))
            return cfail(c, mp.s, "must be a number above 0.");
        if (types & T_NUM)
            return cfail(c, mp.s,
                         "on numbers that are not integers cannot be enforced exactly; use \"type\": "
                         "\"integer\" or remove it.");
        if (d != floor(d) || d > (double)INT_LIMIT)
            return cfail(c, mp.s, "must be a whole number up to %lld on an integer.", (long long)INT_LIMIT);
        nd_p->mult = (int64_t)d;
    }
    static const char *const BOUNDS[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        json_t *b = json_object_get(s, BOUNDS[i]);
        if (!b)
            continue;
        spath bp = sub(path, BOUNDS[i]);
        if (!json_is_number(b))
            return cfail(c, bp.s, "must be a number.");
        if (types & T_NUM) {
            i128 v = i == 0   ? rbound(b, true)
                     : i == 1 ? rbound(b, false)
                     : i == 2 ? rbound(b, false) + 1
                              : rbound(b, true) - 1;
            if (i == 0 || i == 2) {
                if (!nd_p->has_rlo || v > nd_p->rlo)
                    nd_p->rlo = v, nd_p->has_rlo = true;
            } else if (!nd_p->has_rhi || v < nd_p->rhi)
                nd_p->rhi = v, nd_p->has_rhi = true;
            continue;
        }
        double d = json_number_value(b);
        if (!(types & T_INT))
            continue;
        double lim = (double)INT_LIMIT;
        if (i == 0 || i == 2) {
            double lo = i == 0 ? ceil(d) : floor(d) + 1;
            lo = lo < -lim ? -lim : lo > lim ? lim + 1 : lo;
            if (!nd_p->has_lo || (int64_t)lo > nd_p->lo)
                nd_p->lo = (int64_t)lo, nd_p->has_lo = true;
        } else {
            double hi = i == 1 ? floor(d) : ceil(d) - 1;
            hi = hi > lim ? lim : hi < -lim ? -lim - 1 : hi;
            if (!nd_p->has_hi || (int64_t)hi < nd_p->hi)
                nd_p->hi = (int64_t)hi, nd_p->has_hi = true;
        }
    }
    if (nd_p->has_lo && nd_p->has_hi && nd_p->lo > nd_p->hi)
        return cfail(c, path, "its integer bounds leave no value.");
    if (nd_p->mult &&
        !grammar_int_range_has(nd_p, nd_p->has_lo ? nd_p->lo : -INT_LIMIT, nd_p->has_hi ? nd_p->hi : INT_LIMIT))
        return cfail(c, sub(path, "multipleOf").s, "leaves no integer within the bounds.");
    if ((nd_p->has_rlo || nd_p->has_rhi) && !grammar_real_viable(nd_p, false, 0, -1, false, 0) &&
        !grammar_real_viable(nd_p, true, 0, -1, false, 0))
        return cfail(c, path, "its number bounds leave no value of at most %d digits.", RDIGITS);
    return 0;
}

/* allOf of object schemas, merged into one schema (a new reference; NULL with the sentence): properties in
 * order of appearance (a name in two parts must have the same schema), required joined, and where a part
 * has additionalProperties false only its own property names stay (a required one it forbids leaves no
 * object).  The schema's own keywords beside allOf are one more part. */
static json_t *merge_all_of(cctx *c, const json_t *s, const char *path)
{
    json_t *all = json_object_get(s, "allOf");
    spath ap = sub(path, "allOf");
    if (!json_is_array(all) || !json_array_size(all))
        return cfail(c, ap.s, "must be a non-empty list of schemas."), NULL;
    static const char *const OBJ[] = {"type", "properties", "required", "additionalProperties", "allOf", NULL};
    json_t *props = json_object(), *req = json_array(), *allowed = NULL;
    bool any_true = false;
    json_t *out = NULL;
    if (!props || !req)
        goto out_oom;
    for (size_t i = 0; i <= json_array_size(all); i++) {
        const json_t *part = i == 0 ? s : json_array_get(all, i - 1);
        spath pp = i == 0 ? (spath){{0}} : subi(ap.s, i - 1);
        if (i == 0)
            snprintf(pp.s, sizeof pp.s, "%s", path);
        const json_t *ref = json_object_get(part, "$ref");
        if (i > 0 && ref) {
            const char *rk;
            json_t *rv;
            json_object_foreach((json_t *)part, rk, rv)
            {
                if (strcmp(rk, "$ref") && !in_list(rk, ANNOTATIONS))
                    return json_decref(props), json_decref(req), json_decref(allowed),
                           cfail(c, sub(pp.s, rk).s,
                                 "the keyword \"%s\" beside $ref is not supported; move it into "
                                 "the referenced schema.",
                                 rk),
                           NULL;
            }
        }
        if (i > 0 && json_is_string(ref)) {
            part = resolve_ref(c->doc, json_string_value(ref));
            if (!part)
                return json_decref(props), json_decref(req), json_decref(allowed),
                       cfail(c, sub(pp.s, "$ref").s, "does not name a schema in this document."), NULL;
        }
        if (!json_is_object(part))
            return json_decref(props), json_decref(req), json_decref(allowed),
                   cfail(c, pp.s, "must be a schema object."), NULL;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)part, k, v)
        {
            bool ok = in_list(k, OBJ) && (i == 0 || strcmp(k, "allOf")) &&
                      (strcmp(k, "type") || (json_is_string(v) && !strcmp(json_string_value(v), "object")));
            if (!ok && !in_list(k, ANNOTATIONS))
                return json_decref(props), json_decref(req), json_decref(allowed),
                       cfail(c, sub(pp.s, k).s,
                             "allOf is supported for object schemas (type object, properties, "
                             "required, additionalProperties); merge \"%s\" into one schema by "
                             "hand.",
                             k),
                       NULL;
        }
        json_t *pr = json_object_get(part, "properties"), *rq = json_object_get(part, "required"),
               *ad = json_object_get(part, "additionalProperties");
        if (pr && !json_is_object(pr))
            return json_decref(props), json_decref(req), json_decref(allowed),
                   cfail(c, sub(pp.s, "properties").s, "must be an object of schemas."), NULL;
        json_object_foreach(pr, k, v)
        {
            json_t *had = json_object_get(props, k);
            if (had && !json_equal(had, v))
                return json_decref(props), json_decref(req), json_decref(allowed),
                       cfail(c, sub(sub(pp.s, "properties").s, k).s,
                             "is also in another allOf part with a different "
                             "schema; give it one schema."),
                       NULL;
            if (!had && json_object_set(props, k, v))
                goto out_oom;
        }
        size_t j;
        json_array_foreach(rq, j, v)
        {
            if (json_array_append(req, v))
                goto out_oom;
        }
        if (ad && !json_is_boolean(ad))
            return json_decref(props), json_decref(req), json_decref(allowed),
                   cfail(c, sub(pp.s, "additionalProperties").s, "inside allOf must be true or false."), NULL;
        any_true |= json_is_true(ad);
        if (json_is_false(ad)) { /* only this part's names may appear */
            json_t *names = json_object();
            if (!names)
                goto out_oom;
            json_object_foreach(pr, k, v)
            {
                if ((!allowed || json_object_get(allowed, k)) && json_object_set(names, k, json_true()))
                    goto out_oom;
            }
            json_decref(allowed);
            allowed = names;
        }
    }
    if (allowed) {
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(props, tmp, k, v)
        {
            if (!json_object_get(allowed, k))
                json_object_del(props, k);
        }
        size_t j;
        json_array_foreach(req, j, v)
        {
            if (!json_object_get(allowed, json_string_value(v)))
                return json_decref(props), json_decref(req), json_decref(allowed),
                       cfail(c, ap.s,
                             "requires \"%s\", which a part with additionalProperties false does not "
                             "list, so no object fits.",
                             json_string_value(v)),
                       NULL;
        }
    }
    out = json_pack("{s:s, s:o, s:o}", "type", "object", "properties", props, "required", req);
    props = req = NULL;
    if (out && (allowed || any_true) && json_object_set_new(out, "additionalProperties", json_boolean(!allowed)))
        json_decref(out), out = NULL;
    json_decref(allowed);
    if (!out)
        return cfail(c, path, "out of memory."), NULL;
    return out;
out_oom:
    json_decref(props), json_decref(req), json_decref(allowed);
    return cfail(c, path, "out of memory."), NULL;
}

static int compile_node(cctx *c, const json_t *s, const char *path, int depth, int32_t *out)
{
    grammar *g = c->g;
    if (depth > 64)
        return cfail(c, path, "the schema nests deeper than 64 levels.");
    if (json_is_true(s)) {
        *out = g->any;
        return 0;
    }
    if (!json_is_object(s))
        return cfail(c, path, "must be a schema object%s.", json_is_false(s) ? " (false allows no value)" : "");
    for (int32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i] == s) {
            *out = c->memo_node[i];
            return 0;
        }
    const char *k;
    json_t *v;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref))
            return cfail(c, sub(path, "$ref").s, "must be a string like \"#/$defs/name\".");
        json_object_foreach((json_t *)s, k, v)
        {
            if (strcmp(k, "$ref") && !in_list(k, ANNOTATIONS))
                return cfail(c, sub(path, k).s,
                             "the keyword \"%s\" beside $ref is not supported; move it into the "
                             "referenced schema.",
                             k);
        }
        const json_t *t = resolve_ref(c->doc, json_string_value(ref));
        if (!t)
            return cfail(c, sub(path, "$ref").s,
                         "\"%s\" does not name a schema in this document (only local "
                         "references such as \"#/$defs/name\" are supported).",
                         json_string_value(ref));
        if (t == s)
            return cfail(c, sub(path, "$ref").s, "refers to itself.");
        spath tp; /* the target's own path: the document's root path and the pointer ("#/$defs/n" → ROOT.$defs.n) */
        int tn = snprintf(tp.s, sizeof tp.s, "%s", c->root);
        for (const char *q = json_string_value(ref) + 1; *q && tn > 0 && (size_t)tn + 1 < sizeof tp.s; q++)
            tp.s[tn++] = *q == '/' ? '.' : *q;
        tp.s[tn > 0 && (size_t)tn < sizeof tp.s ? tn : 0] = 0;
        return compile_node(c, t, tp.s, depth + 1, out);
    }
    json_object_foreach((json_t *)s, k, v)
    {
        if (!in_list(k, KEYWORDS) && !in_list(k, ANNOTATIONS))
            return cfail(c, sub(path, k).s,
                         "the keyword \"%s\" is not supported by spill's constrained decoding; "
                         "remove it.",
                         k);
    }
    if (json_object_get(s, "allOf")) {
        json_t *m = merge_all_of(c, s, path);
        if (!m || json_array_append_new(c->temps, m)) /* kept to the end: the memo holds its address */
            return m ? cfail(c, path, "out of memory.") : -1;
        if (compile_node(c, m, path, depth + 1, out))
            return -1;
        if (grow((void **)&c->memo, &c->cap_memo, c->n_memo + 1, sizeof *c->memo))
            return cfail(c, path, "out of memory.");
        int32_t *mn = realloc(c->memo_node, (size_t)c->cap_memo * sizeof *mn);
        if (!mn)
            return cfail(c, path, "out of memory.");
        c->memo_node = mn;
        c->memo[c->n_memo] = s;
        c->memo_node[c->n_memo++] = *out;
        return 0;
    }
    int32_t nd = new_node(g);
    if (nd < 0 || grow((void **)&c->memo, &c->cap_memo, c->n_memo + 1, sizeof *c->memo))
        return cfail(c, path, "the schema has more than %d parts.", GRAMMAR_MAX_NODES);
    int32_t cap = c->cap_memo;
    int32_t *mn = realloc(c->memo_node, (size_t)cap * sizeof *mn);
    if (!mn)
        return cfail(c, path, "out of memory.");
    c->memo_node = mn;
    c->memo[c->n_memo] = s;
    c->memo_node[c->n_memo++] = nd;
    *out = nd;

    json_t *alt = json_object_get(s, "anyOf");
    const char *altk = "anyOf";
    if (!alt)
        alt = json_object_get(s, "oneOf"), altk = "oneOf";
    if (alt) {
        json_object_foreach((json_t *)s, k, v)
        {
            if (strcmp(k, altk) && !in_list(k, ANNOTATIONS))
                return cfail(c, sub(path, k).s,
                             "the keyword \"%s\" beside %s is not supported; move it into each "
                             "branch.",
                             k, altk);
        }
        spath ap = sub(path, altk);
        if (!json_is_array(alt) || json_array_size(alt) == 0)
            return cfail(c, ap.s, "must be a non-empty list of schemas.");
        if (grow((void **)&c->alt_node, &c->cap_alt_paths, c->n_alt_paths + 1, sizeof *c->alt_node))
            return cfail(c, path, "out of memory.");
        char **np = realloc(c->alt_path, (size_t)c->cap_alt_paths * sizeof *np);
        if (!np || !(np[c->n_alt_paths] = strdup(ap.s))) {
            if (np)
                c->alt_path = np;
            return cfail(c, path, "out of memory.");
        }
        c->alt_path = np;
        c->alt_node[c->n_alt_paths++] = nd;
        size_t n = json_array_size(alt);
        int32_t alt0 = g->n_alts;
        if (grow((void **)&g->alts, &g->cap_alts, g->n_alts + (int32_t)n, sizeof(int32_t)))
            return cfail(c, path, "out of memory.");
        g->n_alts += (int32_t)n;
        g->nodes[nd].alt0 = alt0;
        g->nodes[nd].n_alt = (int32_t)n;
        for (size_t i = 0; i < n; i++) {
            int32_t child;
            if (compile_node(c, json_array_get(alt, i), subi(ap.s, i).s, depth + 1, &child))
                return -1;
            g->alts[alt0 + (int32_t)i] = child;
        }
        if (n > 1 && discriminate(g, nd))
            return cfail(c, path, "out of memory.");
        return 0;
    }

    /* type: one name or a list; absent: what the other keywords imply, else anything */
    uint8_t types = 0;
    json_t *ty = json_object_get(s, "type");
    static const char *const TNAME[] = {"null", "boolean", "integer", "number", "string", "object", "array"};
    if (ty) {
        spath tp = sub(path, "type");
        size_t n = json_is_array(ty) ? json_array_size(ty) : 1;
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_is_array(ty) ? json_array_get(ty, i) : ty;
            int b = -1;
            for (int j = 0; json_is_string(t) && j < 7; j++)
                if (!strcmp(json_string_value(t), TNAME[j]))
                    b = j;
            if (b < 0)
                return cfail(c, tp.s,
                             "must be one of null, boolean, integer, number, string, object, array (or a "
                             "list of them).");
            types |= (uint8_t)(1u << b);
        }
        if (!types)
            return cfail(c, tp.s, "is an empty list; name at least one type.");
    } else {
        if (json_object_get(s, "properties") || json_object_get(s, "required") ||
            json_object_get(s, "additionalProperties"))
            types |= T_OBJ;
        if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems") ||
            json_object_get(s, "prefixItems") || json_object_get(s, "uniqueItems"))
            types |= T_ARR;
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "format") ||
            json_object_get(s, "pattern"))
            types |= T_STR;
        if (json_object_get(s, "multipleOf"))
            types |= T_INT; /* an integer multiple is a multiple (numbers in general are not enforced) */
        if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
            json_object_get(s, "exclusiveMaximum"))
            types |= T_NUM;
        if (!types)
            types = T_ALL;
    }
    if (types & T_NUM)
        types &= (uint8_t)~T_INT; /* every integer is a number */
    gnode *nd_p = &g->nodes[nd];
    nd_p->types = types;

    json_t *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
    if (en && co)
        return cfail(c, path, "has both enum and const; keep one of them.");
    if (en || co) {
        spath ep = sub(path, en ? "enum" : "const");
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return cfail(c, ep.s, "must be a non-empty list of values.");
        size_t n = en ? json_array_size(en) : 1, kept = 0;
        const json_t **vals = malloc(n * sizeof *vals);
        if (!vals)
            return cfail(c, path, "out of memory.");
        for (size_t i = 0; i < n; i++) {
            const json_t *x = en ? json_array_get(en, i) : co;
            if (value_types(x) & types)
                vals[kept++] = x;
        }
        int rc = kept ? add_literals(g, nd, vals, kept) : 0;
        free(vals);
        if (rc)
            return cfail(c, path, "out of memory.");
        if (!kept)
            return cfail(c, ep.s, "has no value of the schema's type, so nothing can be written.");
        return 0;
    }

    if (types & T_OBJ && compile_object(c, s, path, depth, nd))
        return -1;
    if (types & T_ARR && compile_array(c, s, path, depth, nd))
        return -1;
    if (types & T_STR && compile_string(c, s, path, nd))
        return -1;
    return compile_bounds(c, s, path, nd);
}

static void set_bit(uint64_t *m, unsigned b)
{
    m[b >> 6] |= 1ull << (b & 63);
}

/* First-byte sets: literal and typed nodes directly, anyOf nodes as the union of their branches (a fixpoint:
 * branches may be anyOf nodes, even the node itself through $ref). */
static int first_sets(cctx *c)
{
    grammar *g = c->g;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        gnode *nd = &g->nodes[i];
        if (nd->n_alt)
            continue;
        if (nd->n_lit) {
            for (int32_t j = 0; j < nd->n_lit; j++)
                set_bit(nd->first, (uint8_t)g->text[g->lits[nd->lit0 + j].off]);
            continue;
        }
        if (nd->types & T_NULL)
            set_bit(nd->first, 'n');
        if (nd->types & T_BOOL)
            set_bit(nd->first, 't'), set_bit(nd->first, 'f');
        if (nd->types & (T_INT | T_NUM)) {
            set_bit(nd->first, '-');
            for (int d = '0'; d <= '9'; d++)
                set_bit(nd->first, (unsigned)d);
        }
        if (nd->types & T_STR)
            set_bit(nd->first, '"');
        if (nd->types & T_OBJ)
            set_bit(nd->first, '{');
        if (nd->types & T_ARR)
            set_bit(nd->first, '[');
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < g->n_nodes; i++) {
            gnode *nd = &g->nodes[i];
            for (int32_t j = 0; j < nd->n_alt; j++)
                for (int w = 0; w < 4; w++) {
                    uint64_t u = nd->first[w] | g->nodes[g->alts[nd->alt0 + j]].first[w];
                    changed |= u != nd->first[w];
                    nd->first[w] = u;
                }
        }
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const gnode *nd = &g->nodes[i];
        for (int32_t a = 0; a < nd->n_alt; a++)
            for (int32_t b = a + 1; b < nd->n_alt; b++)
                for (int w = 0; w < 4; w++)
                    if (g->nodes[g->alts[nd->alt0 + a]].first[w] & g->nodes[g->alts[nd->alt0 + b]].first[w]) {
                        const char *p = "anyOf";
                        for (int32_t k = 0; k < c->n_alt_paths; k++)
                            if (c->alt_node[k] == i)
                                p = c->alt_path[k];
                        return cfail(c, p,
                                     "branches %d and %d can start with the same character (two strings, two "
                                     "objects, …); spill's constrained decoding needs branches of different types, "
                                     "such as a string and null.",
                                     (int)a, (int)b);
                    }
    }
    return 0;
}

int grammar_compile(const json_t *schema, const char *path, grammar **out, char *where, size_t wlen, char *err,
                    size_t errlen)
{
    return grammar_compile_wrapped(schema, NULL, path, out, where, wlen, err, errlen);
}

/* The wrap's prefix and suffix, and where its markers occur in them (each occurrence, left to right). */
static int set_wrap(grammar *g, const grammar_wrap *w)
{
    const char *part[2] = {w->prefix, w->suffix};
    for (int k = 0; k < 2; k++) {
        if (!part[k] || !*part[k])
            continue;
        size_t n = strlen(part[k]);
        if (n > UINT32_MAX / 2 || !(g->wrap[k] = strdup(part[k])))
            return -1;
        g->wrap_len[k] = (uint32_t)n;
        for (size_t at = 0; at < n;) {
            size_t best = n, blen = 0;
            for (const char *const *m = w->markers; m && *m; m++) {
                const char *hit = **m ? strstr(part[k] + at, *m) : NULL;
                if (hit && (size_t)(hit - part[k]) < best)
                    best = (size_t)(hit - part[k]), blen = strlen(*m);
            }
            if (best == n)
                break;
            if (g->n_marks == GRAMMAR_MAX_MARKS)
                return -1;
            g->marks[g->n_marks].part = (uint8_t)k;
            g->marks[g->n_marks].pos = (uint32_t)best;
            g->marks[g->n_marks++].len = (uint32_t)blen;
            at = best + blen;
        }
    }
    return 0;
}

int grammar_compile_wrapped(const json_t *schema, const grammar_wrap *wrap, const char *path, grammar **out,
                            char *where, size_t wlen, char *err, size_t errlen)
{
    *out = NULL;
    if (where && wlen)
        where[0] = 0;
    grammar *g = calloc(1, sizeof *g);
    if (!g)
        return util_errf(err, errlen, "out of memory compiling a schema.");
    g->id = atomic_fetch_add(&g_next_id, 1);
    cctx c = {g, schema, NULL, NULL, 0, 0, NULL, NULL, 0, 0, where, err, wlen, errlen, json_array(), path};
    int rc = -1;
    int32_t any = new_node(g), lb = new_node(g), ln = new_node(g);
    if (any < 0 || lb < 0 || ln < 0 || !c.temps) {
        util_errf(err, errlen, "out of memory compiling a schema.");
        goto out_free;
    }
    g->any = any;
    g->nodes[any].types = T_ALL;
    g->nodes[any].extra = any;
    g->nodes[any].items = any;
    json_t *tf[2] = {json_true(), json_false()}, *nl = json_null();
    g->lit_bool = lb, g->lit_null = ln;
    if (add_literals(g, lb, (const json_t *const *)tf, 2) || add_literals(g, ln, (const json_t *const *)&nl, 1)) {
        util_errf(err, errlen, "out of memory compiling a schema.");
        goto out_free;
    }
    if (!schema) { /* json_object: any object */
        int32_t r = new_node(g);
        if (r < 0)
            goto out_free;
        g->nodes[r].types = T_OBJ;
        g->nodes[r].extra = any;
        g->root = r;
    } else if (compile_node(&c, schema, path, 0, &g->root))
        goto out_free;
    if (first_sets(&c))
        goto out_free;
    if (wrap && set_wrap(g, wrap)) {
        util_errf(err, errlen, "%s: the text around the value has more than %d markers (or memory ran out).", path,
                  GRAMMAR_MAX_MARKS);
        goto out_free;
    }
    rc = 0;
out_free:
    json_decref(c.temps);
    free(c.memo);
    free(c.memo_node);
    for (int32_t i = 0; i < c.n_alt_paths; i++)
        free(c.alt_path[i]);
    free(c.alt_path);
    free(c.alt_node);
    if (rc) {
        grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void grammar_free(grammar *g)
{
    if (!g)
        return;
    free(g->nodes);
    free(g->props);
    free(g->alts);
    free(g->lits);
    free(g->text);
    for (int32_t i = 0; i < g->n_rx; i++)
        rx_free(&g->rx[i]);
    free(g->rx);
    free(g->wrap[0]);
    free(g->wrap[1]);
    free(g);
}

uint64_t grammar_id(const grammar *g)
{
    return g->id;
}

/* ---------------------------------------------------------------- the job's set */

int grammar_set_get(grammar_set *set, const json_t *schema, const char *path, const grammar **out, char *err,
                    size_t errlen)
{
    return grammar_set_get_wrapped(set, schema, NULL, path, out, err, errlen);
}

/* The set's key: the canonical schema text, after the wrap's parts (each NUL-separated, so no two wraps or
 * schemas share a key); "" for json_object. */
static char *set_key(const json_t *schema, const grammar_wrap *w)
{
    char *t = schema ? json_dumps(schema, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : strdup("");
    if (!t || !w)
        return t;
    size_t n = strlen(t) + 8;
    n += w->prefix ? strlen(w->prefix) : 0;
    n += w->suffix ? strlen(w->suffix) : 0;
    for (const char *const *m = w->markers; m && *m; m++)
        n += strlen(*m) + 1;
    char *k = malloc(n);
    if (k) {
        int at = snprintf(k, n, "\x01%s\x02%s\x02", w->prefix ? w->prefix : "", w->suffix ? w->suffix : "");
        for (const char *const *m = w->markers; m && *m; m++)
            at += snprintf(k + at, n - (size_t)at, "%s\x03", *m);
        snprintf(k + at, n - (size_t)at, "%s", t);
    }
    free(t);
    return k;
}

int grammar_set_get_wrapped(grammar_set *set, const json_t *schema, const grammar_wrap *wrap, const char *path,
                            const grammar **out, char *err, size_t errlen)
{
    char *key = set_key(schema, wrap);
    if (!key)
        return util_errf(err, errlen, "out of memory reading a schema.");
    for (size_t i = 0; i < set->n; i++)
        if (!strcmp(set->key[i], key)) {
            free(key);
            *out = set->g[i];
            return 0;
        }
    if (set->n == set->cap) {
        size_t nc = set->cap ? set->cap * 2 : 8;
        grammar **ng = realloc(set->g, nc * sizeof *ng);
        if (ng)
            set->g = ng;
        char **nk = ng ? realloc(set->key, nc * sizeof *nk) : NULL;
        if (nk)
            set->key = nk;
        if (!ng || !nk) {
            free(key);
            return util_errf(err, errlen, "out of memory reading a schema.");
        }
        set->cap = nc;
    }
    grammar *g;
    if (grammar_compile_wrapped(schema, wrap, path, &g, NULL, 0, err, errlen)) {
        free(key);
        return -1;
    }
    set->g[set->n] = g;
    set->key[set->n++] = key;
    *out = g;
    return 0;
}

void grammar_set_free(grammar_set *set)
{
    for (size_t i = 0; i < set->n; i++) {
        grammar_free(set->g[i]);
        free(set->key[i]);
    }
    free(set->g);
    free(set->key);
    memset(set, 0, sizeof *set);
}
