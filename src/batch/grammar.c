/*
 * grammar.c — JSON schema → byte-level pushdown automaton for constrained decoding (structured output).
 *
 * Owns: compiling a schema into nodes (one per schema object; $ref shares the target's node, so recursive
 * schemas are finite), and the state machine that accepts, one byte at a time, exactly the prefixes of
 * compact JSON texts valid against it.  Does not own: tokens (token_mask.c walks the vocabulary with
 * gstate_feed), the request fields (request.c), sampling (sample.c).
 *
 * The state is a stack of frames (grammar.h): the root, each open object / array, and on top the key or
 * scalar being written.  A frame records only what decides the future (the node, a phase, a count the
 * schema bounds, a candidate range), so that equal futures have equal bytes and token_mask.c can cache the
 * allowed tokens per state: strings without length bounds do not count their characters, arrays count items
 * only up to the bound that matters, integers track their value only when they have bounds.
 *
 * Decisions:
 *  - White space: none, except one optional space after ':' and after ',' (what json.dumps writes; small
 *    models follow it more readily than fully compact text).  No space or newline anywhere else, so a model
 *    cannot spend its tokens on blank lines, and the text ends with the top-level value: after it only an
 *    end-of-turn token is allowed (gstate_done / gstate_can_end).
 *  - Object keys come in the schema's order (OpenAI's structured outputs do the same): after property i the
 *    next key is one of i+1 … the first required one not yet written, and '}' closes only when no required
 *    property is left.  Without additionalProperties (or with false) no other key is allowed — fewer keys is
 *    still valid JSON Schema, and a small model stops sooner; additionalProperties true or a schema allows
 *    extra keys anywhere (json_object and {} have only those).  Extra keys cannot be one of the object's
 *    property names (so no value escapes its property's schema) and have no backslash escapes.
 *  - Strings are byte-exact: valid UTF-8 only (overlongs and surrogates refused byte by byte, so a multibyte
 *    character split over tokens is fine), no control bytes, escapes \" \\ \/ \b \f \n \r \t \uXXXX except
 *    surrogates and \u0000 (which jansson refuses).  minLength / maxLength count code points.
 *  - Numbers are bounded so every text parses with jansson and a row cannot spin on digits: at most 18
 *    integer digits (an int64), 16 fraction digits, 2 exponent digits; no "-0" (though "-0.5").  Integer
 *    minimum / maximum / multipleOf are exact: a digit is allowed only when some completion lands in the
 *    range on a multiple.  Bounds on numbers (type number) are exact too, at a price: such a number has at
 *    most 15 digits and no exponent, so the text is N·10^-m with N < 10^15 — decimals that map to distinct
 *    doubles in order — and comparing it exactly with the shortest decimal of the bound's double agrees with
 *    a validator comparing doubles (num_feed_real).  multipleOf on non-integers is refused (10^-m steps do
 *    not meet a binary multiple exactly).
 *  - pattern: a regular-expression subset compiled into a byte DFA (regex.c), the string written without
 *    escapes; with maxLength, a byte is allowed only while the shortest match still fits (regex.h minrem);
 *    with minLength it is refused (the lengths of matches are not an interval).  Formats email, ipv4, ipv6
 *    (the full eight-group form), hostname are patterns of their RFCs (email: dot-atoms of letters, digits
 *    and _%+-, then a host name).
 *  - uniqueItems: enforced when the items are an enum / const of at most 64 values (the array frame keeps a
 *    mask of the values used); otherwise refused, unless maxItems <= 1 makes it hold anyway — unique strings
 *    or objects would need every item in the state.
 *  - allOf: object schemas only, merged into one object schema before compiling (merge_all_of); anything
 *    else in a part is refused.  prefixItems: the tuple's nodes, then items (false: no more).
 *  - enum / const values are matched as their compact serialisations (a sorted list, the candidates a
 *    contiguous range): any JSON value may be listed.  true / false / null are two such built-in lists.
 *  - anyOf / oneOf: allowed when the branches start with different bytes (string vs null, object vs array,
 *    …), which covers nullable fields; the first byte picks the branch, so no state ever holds two branches.
 *    With disjoint first bytes at most one branch matches, so oneOf is anyOf.  Objects that all start with
 *    the same required property holding an enum / const, with no value in two branches (a discriminated
 *    union, such as the call objects of a forced tool_choice), are one object whose tag's value picks the
 *    branch (discriminate): still one branch per state, decided by the first key's value.
 *  - A wrap (grammar_compile_wrapped): literal text before and after the value, matched in the root frame
 *    byte by byte; the text ends with the suffix.  Its markers ("<tool_call>", "[TOOL_CALLS]") are bytes
 *    here like any others; that a marker must be one token is token_mask.c's rule (gstate_marker).
 *  - formats: date (YYYY-MM-DD, the day within its month), time (hh:mm:ssZ), date-time (the two joined by
 *    T), uuid by templates; email, ipv4, ipv6, hostname by patterns; others are refused.  Formats take no
 *    escapes and no length bounds (refused together).
 *  - Depth: GRAMMAR_MAX_DEPTH frames; free values (json_object) cannot open a container beyond it.
 */
#include "grammar.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "regex.h"

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_OBJ = 32, T_ARR = 64, T_ALL = 127 };
enum { FMT_NONE, FMT_DATE, FMT_TIME, FMT_DATETIME, FMT_UUID, FMT_EMAIL, FMT_IPV4, FMT_IPV6, FMT_HOSTNAME, FMT_COUNT };
enum { FR_ROOT, FR_OBJ, FR_ARR, FR_KEY, FR_STR, FR_NUM, FR_LIT };
enum { RT_PREFIX, RT_VAL, RT_SUFFIX, RT_DONE };
enum { OB_OPEN, OB_COMMA, OB_KEY, OB_COLON, OB_AFTER_COLON, OB_VAL, OB_AFTER_VAL };
enum { AR_OPEN, AR_COMMA, AR_VAL, AR_AFTER_VAL };
enum { ST_CHAR, ST_UTF8, ST_ESC, ST_U1, ST_U2, ST_U3, ST_U4 };
enum { NS_START, NS_MINUS, NS_ZERO, NS_INT, NS_DOT, NS_FRAC, NS_E, NS_ESIGN, NS_EXP };

#define INT_DIGITS 18
#define FRAC_DIGITS 16
#define EXP_DIGITS 2
#define INT_LIMIT 999999999999999999LL /* the largest magnitude of INT_DIGITS digits */

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
/* Y year digit, M month, D day, h hour, m minute, s second (pairs), X hex digit, anything else itself */
static const char *const FMT_TMPL[FMT_COUNT] = {NULL, "YYYY-MM-DD", "hh:mm:ssZ", "YYYY-MM-DDThh:mm:ssZ",
                                                "XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX"};
/* numbers with bounds: at most RDIGITS digits (past a leading 0), no exponent, compared in units of 10^-RDIGITS */
#define RDIGITS 15
#define RU ((i128)1000000000000000LL)
#define RBIG (RU * RU * 10) /* past every value a bounded number can write */

typedef __int128 i128;

typedef struct gprop {
    uint32_t off, len; /* the name's JSON-escaped bytes in g->text */
    int32_t node;
    bool required;
} gprop;

typedef struct glit {
    uint32_t off, len; /* a literal's compact serialisation in g->text */
} glit;

typedef struct gnode {
    uint8_t types;  /* T_* a value may have (literal nodes: ignored) */
    uint8_t format; /* FMT_* */
    int32_t lit0, n_lit;          /* enum / const: sorted literals lit0 … lit0+n_lit-1 (n_lit > 0: only those) */
    int32_t alt0, n_alt;          /* anyOf: branch nodes in g->alts (n_alt > 0: only those) */
    int32_t disc0;                /* a discriminated anyOf of objects (n_disc > 0): its one property is the tag, */
    int32_t n_disc;               /* g->alts[disc0 + j] the branch of the tag's literal lit0 + j */
    int32_t prop0, n_prop, extra; /* object: properties, and the node of extra keys' values (-1: none) */
    int32_t items, min_items, max_items; /* array (max -1: unbounded) */
    int32_t min_len, max_len;            /* string, in code points (max -1: unbounded) */
    int32_t rx;                          /* pattern (or a format written as one): g->rx[rx - 1]; 0 none */
    int32_t tup0, n_tup;                 /* array: prefixItems' nodes in g->alts */
    bool unique;                         /* array: uniqueItems over literal items (a used-literal mask) */
    bool has_lo, has_hi;                 /* integer bounds */
    int64_t lo, hi;
    int64_t mult;                        /* integer multipleOf (0: none) */
    bool has_rlo, has_rhi;               /* number bounds, in units of 10^-RDIGITS (exact; see num_feed_real) */
    i128 rlo, rhi;
    uint64_t first[4]; /* bytes a value may start with */
} gnode;

struct grammar {
    uint64_t id;
    gnode *nodes;
    int32_t n_nodes, cap_nodes;
    gprop *props;
    int32_t n_props, cap_props;
    int32_t *alts;
    int32_t n_alts, cap_alts;
    glit *lits;
    int32_t n_lits, cap_lits;
    char *text;
    size_t text_len, text_cap;
    rx_dfa *rx; /* (n_rx) patterns' automata */
    int32_t n_rx, cap_rx;
    int32_t root, any, lit_bool, lit_null;
    /* a wrapped grammar (grammar_compile_wrapped): literal text before and after the value, and the marker
     * spans inside them (the root frame's n counts the bytes matched) */
    char *wrap[2]; /* [0] prefix, [1] suffix, NUL-terminated, or NULL */
    uint32_t wrap_len[2];
    int32_t n_marks;
    struct {
        uint8_t part;      /* 0 prefix, 1 suffix */
        uint32_t pos, len; /* where the marker starts in its part */
    } marks[GRAMMAR_MAX_MARKS];
};

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
        int rc = !t || grow((void **)&g->lits, &g->cap_lits, g->n_lits + 1, sizeof(glit)) ||
                 add_text(g, t, len, &off);
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

static const char *const ANNOTATIONS[] = {"title",   "description", "default",    "examples", "$schema",
                                          "$id",     "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs",   "definitions", NULL};
static const char *const KEYWORDS[] = {"type",      "properties",       "required",         "additionalProperties",
                                       "items",     "minItems",         "maxItems",         "enum",
                                       "const",     "minLength",        "maxLength",        "format",
                                       "minimum",   "maximum",          "exclusiveMinimum", "exclusiveMaximum",
                                       "anyOf",     "oneOf",            "multipleOf",       "pattern",
                                       "uniqueItems", "allOf",          "prefixItems",      NULL};

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

static bool int_range_has(const gnode *nd, i128 a, i128 z);
static bool real_viable(const gnode *nd, bool neg, uint64_t N, int k, bool dot, int m);

static int compile_array(cctx *c, const json_t *s, const char *path, int depth, int32_t nd)
{
    grammar *g = c->g;
    json_t *it = json_object_get(s, "items"), *pi = json_object_get(s, "prefixItems"),
           *uq = json_object_get(s, "uniqueItems");
    int32_t child = g->any;
    if (it && json_is_array(it))
        return cfail(c, sub(path, "items").s, "is a list (the old tuple form); write it as prefixItems (and items: "
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
            return cfail(c, sub(path, "uniqueItems").s, "can be enforced only when items is an enum or const of at "
                                                        "most 64 values (and there are no prefixItems); list the "
                                                        "values or remove uniqueItems.");
        if (nd_p->min_items > in->n_lit)
            return cfail(c, sub(path, "uniqueItems").s, "with minItems %d needs more distinct items than the %d "
                                                        "values items allows.", nd_p->min_items, in->n_lit);
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
            return cfail(c, fp.s, "%s is not a format spill can enforce; use date, time, date-time, uuid, email, "
                                  "ipv4, ipv6 or hostname, or remove it.", json_is_string(f) ? json_string_value(f)
                                                                                           : "this value");
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
            return cfail(c, rp.s, "cannot be combined with minLength (maxLength is fine); put the length into the "
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
    bool down = neg ? up : !up; /* rounding of the magnitude */
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
            return cfail(c, mp.s, "on numbers that are not integers cannot be enforced exactly; use \"type\": "
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
            i128 v = i == 0 ? rbound(b, true) : i == 1 ? rbound(b, false) : i == 2 ? rbound(b, false) + 1
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
    if (nd_p->mult && !int_range_has(nd_p, nd_p->has_lo ? nd_p->lo : -INT_LIMIT, nd_p->has_hi ? nd_p->hi : INT_LIMIT))
        return cfail(c, sub(path, "multipleOf").s, "leaves no integer within the bounds.");
    if ((nd_p->has_rlo || nd_p->has_rhi) && !real_viable(nd_p, false, 0, -1, false, 0) &&
        !real_viable(nd_p, true, 0, -1, false, 0))
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
                           cfail(c, sub(pp.s, rk).s, "the keyword \"%s\" beside $ref is not supported; move it into "
                                                    "the referenced schema.", rk), NULL;
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
            bool ok = in_list(k, OBJ) && (i == 0 || strcmp(k, "allOf")) && (strcmp(k, "type") || (json_is_string(v) &&
                                                                                            !strcmp(json_string_value(v), "object")));
            if (!ok && !in_list(k, ANNOTATIONS))
                return json_decref(props), json_decref(req), json_decref(allowed),
                       cfail(c, sub(pp.s, k).s, "allOf is supported for object schemas (type object, properties, "
                                                "required, additionalProperties); merge \"%s\" into one schema by "
                                                "hand.", k), NULL;
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
                       cfail(c, sub(sub(pp.s, "properties").s, k).s, "is also in another allOf part with a different "
                                                                    "schema; give it one schema."), NULL;
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
                       cfail(c, ap.s, "requires \"%s\", which a part with additionalProperties false does not "
                                      "list, so no object fits.", json_string_value(v)), NULL;
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
                return cfail(c, sub(path, k).s, "the keyword \"%s\" beside $ref is not supported; move it into the "
                                               "referenced schema.", k);
        }
        const json_t *t = resolve_ref(c->doc, json_string_value(ref));
        if (!t)
            return cfail(c, sub(path, "$ref").s, "\"%s\" does not name a schema in this document (only local "
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
            return cfail(c, sub(path, k).s, "the keyword \"%s\" is not supported by spill's constrained decoding; "
                                            "remove it.", k);
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
                return cfail(c, sub(path, k).s, "the keyword \"%s\" beside %s is not supported; move it into each "
                                               "branch.", k, altk);
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
                return cfail(c, tp.s, "must be one of null, boolean, integer, number, string, object, array (or a "
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
        if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
            json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum"))
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

static bool has_bit(const uint64_t *m, unsigned b)
{
    return m[b >> 6] >> (b & 63) & 1;
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

/* ---------------------------------------------------------------- the automaton */

#define TOP(s) (&(s)->f[(s)->depth - 1])

static int push(gstate *s, int32_t node, uint8_t kind, uint8_t phase)
{
    if (s->depth >= GRAMMAR_MAX_DEPTH)
        return -1;
    s->f[s->depth++] = (gframe){node, kind, phase, 0, 0, 0, 0, 0};
    return 0;
}

void gstate_init(const grammar *g, gstate *s)
{
    s->depth = 0;
    s->pad = 0;
    push(s, g->root, FR_ROOT, g->wrap[0] ? RT_PREFIX : RT_VAL);
}

int gstate_marker(const grammar *g, const gstate *s, const uint8_t **text, size_t *len)
{
    if (s->depth != 1 || (s->f[0].phase != RT_PREFIX && s->f[0].phase != RT_SUFFIX))
        return 0;
    int part = s->f[0].phase == RT_SUFFIX;
    for (int32_t i = 0; i < g->n_marks; i++)
        if (g->marks[i].part == part && g->marks[i].pos == s->f[0].n) {
            *text = (const uint8_t *)g->wrap[part] + g->marks[i].pos;
            *len = g->marks[i].len;
            return 1;
        }
    return 0;
}

bool grammar_has_markers(const grammar *g)
{
    return g->n_marks > 0;
}

/* The root's literal text (phase RT_PREFIX or RT_SUFFIX, n bytes matched): 0 when c is its next byte. */
static int wrap_feed(const grammar *g, gframe *f, uint8_t c)
{
    int part = f->phase == RT_SUFFIX;
    if (f->n >= g->wrap_len[part] || (uint8_t)g->wrap[part][f->n] != c)
        return -1;
    if (++f->n == g->wrap_len[part])
        f->phase = part ? RT_DONE : RT_VAL, f->n = 0;
    return 0;
}

bool gstate_done(const gstate *s)
{
    return s->depth == 1 && s->f[0].phase == RT_DONE;
}

/* A value just closed (its frame popped): the frame below moves on. */
static void value_done(const grammar *g, gstate *s)
{
    gframe *p = TOP(s);
    if (p->kind == FR_ROOT)
        p->phase = g->wrap[1] ? RT_SUFFIX : RT_DONE;
    else if (p->kind == FR_OBJ) {
        const gnode *nd = &g->nodes[p->node];
        if (nd->n_disc && p->m == 1) { /* a discriminated anyOf's tag: its literal picks the branch */
            const gframe *lit = &s->f[s->depth]; /* the frame just popped */
            p->node = g->alts[nd->disc0 + ((int32_t)lit->m - g->nodes[g->props[nd->prop0].node].lit0)];
        }
        p->phase = OB_AFTER_VAL;
    }
    else { /* FR_ARR: count items only as far as a bound or prefixItems needs */
        const gnode *nd = &g->nodes[p->node];
        uint32_t cap = (uint32_t)(nd->max_items >= 0 ? nd->max_items : nd->min_items);
        if (cap < (uint32_t)nd->n_tup)
            cap = (uint32_t)nd->n_tup;
        if (p->n < cap)
            p->n++;
        if (nd->unique) /* the literal just written may not come again */
            p->x |= 1ull << ((int32_t)s->f[s->depth].m - g->nodes[nd->items].lit0);
        p->phase = AR_AFTER_VAL;
    }
}

/* Literal frames: candidates [m, x) of the sorted list share their first n bytes.  0 when b continues one of
 * them, 1 when none. */
static int lit_feed(const grammar *g, const gstate *s, gframe *f, uint8_t b)
{
    uint32_t lo = UINT32_MAX, hi = 0, pos = f->n;
    /* an item of a uniqueItems array: the literals used before are out (the array frame's mask) */
    const gframe *a = s->depth >= 2 ? &s->f[s->depth - 2] : NULL;
    uint64_t used = 0;
    int32_t base = 0;
    if (a && a->kind == FR_ARR && g->nodes[a->node].unique) {
        used = a->x;
        base = g->nodes[g->nodes[a->node].items].lit0;
    }
    for (uint32_t i = f->m; i < (uint32_t)f->x; i++)
        if (!(used >> ((int32_t)i - base) & 1) && g->lits[i].len > pos && (uint8_t)g->text[g->lits[i].off + pos] == b) {
            if (lo == UINT32_MAX)
                lo = i;
            hi = i + 1;
        }
    if (lo == UINT32_MAX)
        return 1;
    f->m = lo, f->x = hi, f->n = pos + 1;
    return 0;
}

/* Some integer in [a, z] lies in the node's bounds and is a multiple of its multipleOf. */
static bool int_range_has(const gnode *nd, i128 a, i128 z)
{
    if (nd->has_lo && a < nd->lo)
        a = nd->lo;
    if (nd->has_hi && z > nd->hi)
        z = nd->hi;
    if (a > z)
        return false;
    if (!nd->mult)
        return true;
    i128 m = nd->mult, r = a % m;
    i128 first = r == 0 ? a : a < 0 ? a - r : a + (m - r); /* the first multiple >= a */
    return first <= z;
}

/* Some integer of k digits starting with P (negative when neg) — P itself or P followed by more digits, up
 * to INT_DIGITS — lies in the node's bounds (and is a multiple of multipleOf). */
static bool int_viable(const gnode *nd, bool neg, int64_t P, int k)
{
    i128 p10 = 1;
    int jmax = P == 0 ? 0 : INT_DIGITS - k;
    for (int j = 0; j <= jmax; j++, p10 *= 10) {
        i128 a = (i128)P * p10, z = a + p10 - 1;
        if (neg ? int_range_has(nd, -z, -a) : int_range_has(nd, a, z))
            return true;
    }
    return false;
}

static i128 pow10i(int e)
{
    i128 v = 1;
    while (e-- > 0)
        v *= 10;
    return v;
}

/* Some multiple of step in [a, z] lies in [lo, hi] (a a multiple of step). */
static bool real_hits(i128 a, i128 z, i128 step, i128 lo, i128 hi)
{
    if (lo > a)
        a += (lo - a + step - 1) / step * step;
    return a <= z && a <= hi;
}

/*
 * Numbers with bounds (type number): exact.  A number writes at most RDIGITS digits (past a leading 0) and
 * no exponent, so every text is N · 10^-m with fewer than 10^15 in N: such decimals map to distinct doubles in
 * the same order, and comparing one with the shortest decimal of a bound's double (rbound) gives what a
 * validator comparing doubles gives.  Bounds are in units of 10^-RDIGITS; a digit is allowed only when some
 * completion of the text lands in them.  The frame: x = N (the digits), n = integer digits (0 for "0" or none
 * yet), a = fraction digits, b = the sign.  Some completion of the text so far (dot: after the '.', m
 * fraction digits; k = -1: nothing written yet) is within the bounds.
 */
static bool real_viable(const gnode *nd, bool neg, uint64_t N, int k, bool dot, int m)
{
    i128 lo = nd->has_rlo ? nd->rlo : -RBIG, hi = nd->has_rhi ? nd->rhi : RBIG;
    if (neg) { /* the magnitude's range */
        i128 t = -lo;
        lo = -hi, hi = t;
    }
    if (dot) { /* N·10^-m and up to RDIGITS - k - m more digits */
        i128 a = (i128)N * pow10i(RDIGITS - m);
        return real_hits(a, a + pow10i(RDIGITS - m) - pow10i(k), pow10i(k), lo, hi);
    }
    if (k <= 0 && real_hits(0, RU - 1, 1, lo, hi)) /* "0" and a fraction (or nothing yet: 0.…) */
        return true;
    if (k == 0)
        return false;
    uint64_t P = k < 0 ? 0 : N;
    int k0 = k < 0 ? 0 : k;
    for (int j = k < 0 ? 1 : 0; k0 + j <= RDIGITS; j++) {
        if (k < 0 && j == 0)
            continue;
        /* k0 + j integer digits: [P·10^j, (P+1)·10^j) (P = 0, nothing yet: from 10^(j-1)), steps of 10^(k0+j) units */
        i128 a = k < 0 ? pow10i(j - 1) * RU : (i128)P * pow10i(j) * RU, z = k < 0 ? pow10i(j) * RU : ((i128)P + 1) * pow10i(j) * RU;
        if (real_hits(a, z - pow10i(k0 + j), pow10i(k0 + j), lo, hi))
            return true;
    }
    return false;
}

static bool real_can_end(const gnode *nd, const gframe *f)
{
    if (f->phase != NS_ZERO && f->phase != NS_INT && f->phase != NS_FRAC)
        return false;
    if (f->phase == NS_ZERO && f->b)
        return false; /* "-0" */
    i128 v = (i128)f->x * pow10i(RDIGITS - (f->phase == NS_FRAC ? f->a : 0));
    if (f->b)
        v = -v;
    return (!nd->has_rlo || v >= nd->rlo) && (!nd->has_rhi || v <= nd->rhi);
}

static int num_feed_real(const gnode *nd, gframe *f, uint8_t b)
{
    bool digit = b >= '0' && b <= '9';
    uint64_t d = (uint64_t)(b - '0');
    switch (f->phase) {
    case NS_START:
        if (b == '-') {
            if (!real_viable(nd, true, 0, -1, false, 0))
                return -1;
            f->phase = NS_MINUS, f->b = 1;
            return 0;
        }
        /* fall through */
    case NS_MINUS:
        if (!digit)
            return f->phase == NS_START ? -1 : 1;
        if (!real_viable(nd, f->b, d, d ? 1 : 0, false, 0))
            return -1;
        f->phase = d ? NS_INT : NS_ZERO, f->n = d ? 1 : 0, f->x = d;
        return 0;
    case NS_ZERO:
    case NS_INT:
        if (digit && f->phase == NS_INT) {
            if (f->n >= RDIGITS)
                return 1;
            if (!real_viable(nd, f->b, f->x * 10 + d, (int)f->n + 1, false, 0))
                return -1;
            f->x = f->x * 10 + d, f->n++;
            return 0;
        }
        if (b == '.') {
            if (f->n >= RDIGITS || !real_viable(nd, f->b, f->x, (int)f->n, true, 0))
                return f->n >= RDIGITS ? 1 : -1;
            return f->phase = NS_DOT, f->a = 0, 0;
        }
        return 1;
    case NS_DOT:
    case NS_FRAC:
        if (digit && f->n + f->a < RDIGITS) {
            if (!real_viable(nd, f->b, f->x * 10 + d, (int)f->n, true, f->a + 1))
                return -1;
            f->x = f->x * 10 + d, f->a++, f->phase = NS_FRAC;
            return 0;
        }
        return f->phase == NS_DOT ? -1 : 1;
    }
    return 1;
}

static bool num_can_end(const gnode *nd, const gframe *f)
{
    if (nd->has_rlo || nd->has_rhi)
        return real_can_end(nd, f);
    if (f->phase != NS_ZERO && f->phase != NS_INT && f->phase != NS_FRAC && f->phase != NS_EXP)
        return false;
    if (f->phase == NS_ZERO && f->b)
        return false; /* "-0": a number must continue it ("-0.5") */
    if (!nd->has_lo && !nd->has_hi && !nd->mult)
        return true;
    int64_t v = f->b ? -(int64_t)f->x : (int64_t)f->x;
    return (!nd->has_lo || v >= nd->lo) && (!nd->has_hi || v <= nd->hi) && (!nd->mult || v % nd->mult == 0);
}

/* Number frames: 0 when b continues the number, 1 when it cannot (the caller may end the number), -1 when b
 * is a digit the bounds or the length limit refuse. */
static int num_feed(const grammar *g, gframe *f, uint8_t b)
{
    const gnode *nd = &g->nodes[f->node];
    if (nd->has_rlo || nd->has_rhi)
        return num_feed_real(nd, f, b);
    bool real = (nd->types & T_NUM) != 0, bounded = nd->has_lo || nd->has_hi || nd->mult;
    bool digit = b >= '0' && b <= '9';
    int d = b - '0';
    switch (f->phase) {
    case NS_START:
        if (b == '-') {
            if (bounded && !int_range_has(nd, -INT_LIMIT, -1))
                return -1;
            f->phase = NS_MINUS, f->b = 1;
            return 0;
        }
        /* fall through */
    case NS_MINUS:
        if (!digit || (d == 0 && f->phase == NS_MINUS && !real)) /* "-0" only starts "-0.5" */
            return f->phase == NS_START ? -1 : 1;
        if (bounded && !int_viable(nd, f->b, d, 1))
            return -1;
        f->phase = d == 0 ? NS_ZERO : NS_INT, f->a = 1;
        f->x = bounded ? (uint64_t)d : 0;
        return 0;
    case NS_ZERO:
    case NS_INT:
        if (digit && f->phase == NS_INT) {
            if (f->a >= INT_DIGITS)
                return 1;
            int64_t P = (int64_t)f->x * 10 + d;
            if (bounded && !int_viable(nd, f->b, P, f->a + 1))
                return -1;
            f->a++;
            f->x = bounded ? (uint64_t)P : 0;
            return 0;
        }
        if (real && b == '.')
            return f->phase = NS_DOT, f->a = 0, 0;
        if (real && (b == 'e' || b == 'E'))
            return f->phase = NS_E, f->a = 0, 0;
        return 1;
    case NS_DOT:
        return digit ? (f->phase = NS_FRAC, f->a = 1, 0) : 1;
    case NS_FRAC:
        if (digit && f->a < FRAC_DIGITS)
            return f->a++, 0;
        if (b == 'e' || b == 'E')
            return f->phase = NS_E, f->a = 0, 0;
        return 1;
    case NS_E:
        if (b == '+' || b == '-')
            return f->phase = NS_ESIGN, 0;
        /* fall through */
    case NS_ESIGN:
        return digit ? (f->phase = NS_EXP, f->a = 1, 0) : 1;
    case NS_EXP:
        return digit && f->a < EXP_DIGITS ? (f->a++, 0) : 1;
    }
    return 1;
}

/* UTF-8 inside a string or key (phase ST_CHAR / ST_UTF8, a = continuation bytes left, b = the next one's
 * range): 0 with *starts set when b begins a character, -1 for a byte that cannot come here. */
static int utf8_feed(gframe *f, uint8_t c, bool *starts)
{
    static const uint8_t LO[5] = {0x80, 0xA0, 0x80, 0x90, 0x80}, HI[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    *starts = false;
    if (f->phase == ST_UTF8) {
        if (c < LO[f->b] || c > HI[f->b])
            return -1;
        f->b = 0;
        if (--f->a == 0)
            f->phase = ST_CHAR;
        return 0;
    }
    *starts = true;
    if (c < 0x20)
        return -1;
    if (c < 0x80)
        return 0;
    uint8_t need, cls = 0;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 2, cls = c == 0xE0 ? 1 : c == 0xED ? 2 : 0;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 3, cls = c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0;
    else
        return -1;
    f->phase = ST_UTF8, f->a = need, f->b = cls;
    return 0;
}

static int days_in(int y, int m)
{
    static const int D[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
        return 29;
    return m >= 1 && m <= 12 ? D[m - 1] : 31;
}

static bool pair_ok(char cls, uint64_t x, int v)
{
    int year = (int)(x & 0xFFFF), month = (int)(x >> 16 & 0xFF);
    switch (cls) {
    case 'M': return v >= 1 && v <= 12;
    case 'D': return v >= 1 && v <= days_in(year, month);
    case 'h': return v <= 23;
    default: return v <= 59;
    }
}

/* Format strings: position f->m of the template, fields in f->x (year bits 0-15, month 16-23, the pending
 * first digit of a pair 24-31).  0 or -1. */
static int fmt_feed(gframe *f, int fmt, uint8_t c)
{
    const char *t = FMT_TMPL[fmt];
    char k = t[f->m];
    if (!k)
        return -1;
    int d = c >= '0' && c <= '9' ? c - '0' : -1;
    if (k == 'Y') {
        if (d < 0)
            return -1;
        uint64_t year = (f->x & 0xFFFF) * 10 + (uint64_t)d;
        if (t[f->m + 1] != 'Y' && year == 0) /* Python's dates start at year 1 */
            return -1;
        f->x = (f->x & ~0xFFFFull) | year;
    } else if (k == 'X') {
        if (d < 0 && !((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return -1;
    } else if (strchr("MDhms", k)) {
        if (d < 0)
            return -1;
        if (f->m == 0 || t[f->m - 1] != k) { /* first digit: some second digit must complete it */
            bool ok = false;
            for (int e = 0; e <= 9 && !ok; e++)
                ok = pair_ok(k, f->x, d * 10 + e);
            if (!ok)
                return -1;
            f->x = (f->x & ~(0xFFull << 24)) | (uint64_t)d << 24;
        } else {
            int v = (int)(f->x >> 24 & 0xFF) * 10 + d;
            if (!pair_ok(k, f->x, v))
                return -1;
            if (k == 'M')
                f->x = (f->x & ~(0xFFull << 16)) | (uint64_t)v << 16;
        }
    } else if (c != (uint8_t)k)
        return -1;
    f->m++;
    return 0;
}

/* A pattern string (nd->rx): m = the automaton's state, n = characters when maxLength bounds it (a byte is
 * allowed only while the shortest match from its state still fits). */
static int rx_feed(const grammar *g, gstate *s, gframe *f, const gnode *nd, uint8_t c)
{
    const rx_dfa *d = &g->rx[nd->rx - 1];
    if (c == '"') {
        if (!d->accept[f->m])
            return -1;
        s->depth--;
        value_done(g, s);
        return 0;
    }
    int32_t t = d->next[(size_t)f->m * 256 + c];
    if (t < 0)
        return -1;
    if (nd->max_len >= 0) {
        uint32_t n = f->n + ((c & 0xC0) != 0x80);
        if ((int64_t)n + d->minrem[t] > nd->max_len)
            return -1;
        f->n = n;
    }
    f->m = (uint32_t)t;
    return 0;
}

static int str_feed(const grammar *g, gstate *s, gframe *f, uint8_t c)
{
    const gnode *nd = &g->nodes[f->node];
    if (nd->rx)
        return rx_feed(g, s, f, nd, c);
    bool counted = nd->min_len > 0 || nd->max_len >= 0;
    switch (f->phase) {
    case ST_CHAR:
        if (c == '"') {
            if (nd->format ? FMT_TMPL[nd->format][f->m] != 0 : counted && f->n < (uint32_t)nd->min_len)
                return -1;
            s->depth--;
            value_done(g, s);
            return 0;
        }
        if (nd->format)
            return fmt_feed(f, nd->format, c);
        if (counted && nd->max_len >= 0 && f->n >= (uint32_t)nd->max_len)
            return -1;
        if (c == '\\')
            f->phase = ST_ESC;
        else {
            bool starts;
            if (utf8_feed(f, c, &starts))
                return -1;
        }
        if (counted && (nd->max_len >= 0 || f->n < (uint32_t)nd->min_len))
            f->n++;
        return 0;
    case ST_UTF8: {
        bool starts;
        return utf8_feed(f, c, &starts);
    }
    case ST_ESC:
        if (c == 'u')
            return f->phase = ST_U1, f->x = 0, 0;
        if (!strchr("\"\\/bfnrt", c) || !c)
            return -1;
        f->phase = ST_CHAR;
        return 0;
    default: { /* \uXXXX: no surrogates, no \u0000 */
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0)
            return -1;
        f->x = f->x * 16 + (uint64_t)v;
        if (f->phase == ST_U2 && (f->x & 0xF8) == 0xD8)
            return -1;
        if (f->phase == ST_U4) {
            if (f->x == 0)
                return -1;
            f->phase = ST_CHAR, f->x = 0;
        } else
            f->phase++;
        return 0;
    }
    }
}

/* The last property index a key may name after `next` (the first required one from next on, else the last). */
static int32_t key_limit(const grammar *g, const gnode *nd, uint32_t next)
{
    for (int32_t j = (int32_t)next; j < nd->n_prop; j++)
        if (g->props[nd->prop0 + j].required)
            return j;
    return nd->n_prop - 1;
}

static bool obj_may_close(const grammar *g, const gnode *nd, uint32_t next)
{
    for (int32_t j = (int32_t)next; j < nd->n_prop; j++)
        if (g->props[nd->prop0 + j].required)
            return false;
    return true;
}

static uint64_t range_mask(int32_t lo, int32_t hi)
{
    uint64_t m = 0;
    for (int32_t j = lo; j <= hi; j++)
        m |= 1ull << j;
    return m;
}

static int key_start(const grammar *g, gstate *s, gframe *o)
{
    const gnode *nd = &g->nodes[o->node];
    bool free_keys = nd->extra >= 0;
    if (!free_keys && (int32_t)o->n >= nd->n_prop)
        return -1;
    uint64_t x = free_keys ? range_mask(0, nd->n_prop - 1) : range_mask((int32_t)o->n, key_limit(g, nd, o->n));
    if (push(s, o->node, FR_KEY, ST_CHAR))
        return -1;
    TOP(s)->x = x;
    return 0;
}

/* Keys: n bytes typed, x = the properties whose escaped names still match them. */
static int key_feed(const grammar *g, gstate *s, gframe *f, uint8_t c)
{
    const gnode *nd = &g->nodes[f->node];
    bool free_keys = nd->extra >= 0;
    if (f->phase == ST_CHAR && c == '"') {
        int32_t hit = -1;
        for (int32_t j = 0; j < nd->n_prop; j++)
            if (f->x >> j & 1 && g->props[nd->prop0 + j].len == f->n)
                hit = j;
        gframe *o = &s->f[s->depth - 2];
        if (hit >= 0) {
            if (hit < (int32_t)o->n || hit > key_limit(g, nd, o->n))
                return -1; /* a property out of order, or written already */
        } else if (!free_keys)
            return -1;
        s->depth--;
        o->phase = OB_COLON;
        o->m = (uint32_t)(hit + 1);
        if (hit >= 0)
            o->n = (uint32_t)hit + 1;
        return 0;
    }
    uint64_t nx = 0;
    for (int32_t j = 0; j < nd->n_prop; j++) {
        const gprop *p = &g->props[nd->prop0 + j];
        if (f->x >> j & 1 && p->len > f->n && (uint8_t)g->text[p->off + f->n] == c)
            nx |= 1ull << j;
    }
    if (!free_keys) {
        if (!nx)
            return -1;
    } else {
        bool starts;
        if (c == '\\' || utf8_feed(f, c, &starts))
            return -1;
    }
    f->x = nx;
    f->n = nx ? f->n + 1 : 0; /* with no name left to match, the length no longer matters (canonical states) */
    return 0;
}

static int value_start(const grammar *g, gstate *s, int32_t node, uint8_t c);

static int obj_feed(const grammar *g, gstate *s, gframe *f, uint8_t c)
{
    const gnode *nd = &g->nodes[f->node];
    switch (f->phase) {
    case OB_OPEN:
        if (c == '}' && obj_may_close(g, nd, f->n)) {
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return c == '"' ? key_start(g, s, f) : -1;
    case OB_COMMA:
        if (c == ' ')
            return f->phase = OB_KEY, 0;
        /* fall through */
    case OB_KEY:
        return c == '"' ? key_start(g, s, f) : -1;
    case OB_COLON:
        return c == ':' ? (f->phase = OB_AFTER_COLON, 0) : -1;
    case OB_AFTER_COLON:
        if (c == ' ')
            return f->phase = OB_VAL, 0;
        /* fall through */
    case OB_VAL:
        return value_start(g, s, f->m ? g->props[nd->prop0 + (int32_t)f->m - 1].node : nd->extra, c);
    default: /* OB_AFTER_VAL */
        if (c == ',' && ((int32_t)f->n < nd->n_prop || nd->extra >= 0))
            return f->phase = OB_COMMA, 0;
        if (c == '}' && obj_may_close(g, nd, f->n)) {
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return -1;
    }
}

/* The node of item i (prefixItems, then items; -1: none may come). */
static int32_t item_node(const grammar *g, const gnode *nd, uint32_t i)
{
    return i < (uint32_t)nd->n_tup ? g->alts[nd->tup0 + (int32_t)i] : nd->items;
}

/* Another item may follow f's n items. */
static bool arr_more(const grammar *g, const gnode *nd, const gframe *f)
{
    if (nd->max_items >= 0 && f->n >= (uint32_t)nd->max_items)
        return false;
    if (nd->unique && __builtin_popcountll(f->x) >= g->nodes[nd->items].n_lit)
        return false;
    return item_node(g, nd, f->n) >= 0;
}

static int arr_feed(const grammar *g, gstate *s, gframe *f, uint8_t c)
{
    const gnode *nd = &g->nodes[f->node];
    switch (f->phase) {
    case AR_OPEN:
        if (c == ']') {
            if (nd->min_items > 0)
                return -1;
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return !arr_more(g, nd, f) ? -1 : value_start(g, s, item_node(g, nd, f->n), c);
    case AR_COMMA:
        if (c == ' ')
            return f->phase = AR_VAL, 0;
        /* fall through */
    case AR_VAL:
        return value_start(g, s, item_node(g, nd, f->n), c);
    default: /* AR_AFTER_VAL */
        if (c == ',' && arr_more(g, nd, f))
            return f->phase = AR_COMMA, 0;
        if (c == ']' && f->n >= (uint32_t)nd->min_items) {
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return -1;
    }
}

static int lit_start(const grammar *g, gstate *s, int32_t node, uint8_t c)
{
    const gnode *nd = &g->nodes[node];
    if (push(s, node, FR_LIT, 0))
        return -1;
    gframe *f = TOP(s);
    f->m = (uint32_t)nd->lit0;
    f->x = (uint64_t)(nd->lit0 + nd->n_lit);
    return lit_feed(g, s, f, c) ? -1 : 0;
}

/* The first byte of a value of `node` (the frame below has asked for one). */
static int value_start(const grammar *g, gstate *s, int32_t node, uint8_t c)
{
    for (int hops = 0; g->nodes[node].n_alt; hops++) {
        const gnode *nd = &g->nodes[node];
        int32_t pick = -1;
        for (int32_t j = 0; j < nd->n_alt && pick < 0; j++)
            if (has_bit(g->nodes[g->alts[nd->alt0 + j]].first, c))
                pick = g->alts[nd->alt0 + j];
        if (pick < 0 || hops > 64)
            return -1;
        node = pick;
    }
    const gnode *nd = &g->nodes[node];
    if (!has_bit(nd->first, c))
        return -1;
    if (nd->n_lit)
        return lit_start(g, s, node, c);
    switch (c) {
    case '{': return push(s, node, FR_OBJ, OB_OPEN);
    case '[': return push(s, node, FR_ARR, AR_OPEN);
    case '"': return push(s, node, FR_STR, ST_CHAR);
    case 't':
    case 'f': return lit_start(g, s, g->lit_bool, c);
    case 'n': return lit_start(g, s, g->lit_null, c);
    default:
        if (push(s, node, FR_NUM, NS_START))
            return -1;
        return num_feed(g, TOP(s), c) ? -1 : 0;
    }
}

static bool scalar_can_end(const grammar *g, const gframe *f)
{
    if (f->kind == FR_LIT)
        return f->m < (uint32_t)f->x && g->lits[f->m].len == f->n; /* the shortest candidate sorts first */
    return f->kind == FR_NUM && num_can_end(&g->nodes[f->node], f);
}

int gstate_feed(const grammar *g, gstate *s, uint8_t c)
{
    for (;;) {
        gframe *f = TOP(s);
        int rc;
        switch (f->kind) {
        case FR_ROOT:
            if (f->phase == RT_PREFIX || f->phase == RT_SUFFIX)
                return wrap_feed(g, f, c);
            return f->phase == RT_VAL ? value_start(g, s, g->root, c) : -1;
        case FR_OBJ: return obj_feed(g, s, f, c);
        case FR_ARR: return arr_feed(g, s, f, c);
        case FR_KEY: return key_feed(g, s, f, c);
        case FR_STR: return str_feed(g, s, f, c);
        case FR_NUM: rc = num_feed(g, f, c); break;
        default: rc = lit_feed(g, s, f, c); break;
        }
        if (rc <= 0)
            return rc;
        /* the number or literal cannot take c: it ends here, and c goes to the frame below */
        if (!scalar_can_end(g, f))
            return -1;
        s->depth--;
        value_done(g, s);
    }
}

int gstate_feed_bytes(const grammar *g, gstate *s, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (gstate_feed(g, s, b[i]))
            return -1;
    return 0;
}

bool gstate_can_end(const grammar *g, const gstate *s)
{
    if (gstate_done(s))
        return true;
    return s->depth == 2 && !g->wrap[1] && scalar_can_end(g, &s->f[1]);
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
