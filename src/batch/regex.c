/*
 * regex.c — JSON Schema `pattern` → byte DFA (regex.h).
 *
 * Owns: the parser of the supported subset, a Thompson NFA over byte sets, the subset construction into a
 * DFA over byte classes, and the pruning of states that cannot reach a match.  Does not own: how the DFA
 * sits inside a JSON string (grammar.c: the frame's m is the DFA state).
 *
 * Decisions:
 *  - The language is the pattern's matches that a JSON string can carry without escapes: '"', '\' and the
 *    control bytes are in no byte set, so a pattern that needs them can only match otherwise (or is
 *    refused when it cannot match at all).  A subset of the matches is still only valid strings.
 *  - Code points: the NFA reads UTF-8.  '.', [^…] and a literal non-ASCII character are its byte sequences
 *    (well-formed only: no overlongs, surrogates or values past U+10FFFF); classes may list ASCII only.
 *    \d \w \s are ASCII ([0-9], [A-Za-z0-9_], space), and \D \W \S and a negated class that lists one of
 *    them stay ASCII: Python's re (what jsonschema's validators use) gives them Unicode meanings, and the
 *    ASCII part is what both agree on.
 *  - A search, as JSON Schema specifies: an alternative without ^ may start anywhere (any text before it),
 *    one without $ may end anywhere.
 *  - Counted repetition is expanded (the atom parsed again for each copy), bounded by RX_MAX_NFA.
 * Left out: DFA minimisation (the grammar's states are DFA states; equal futures in two states only cost a
 * second cached mask).
 */
#include "regex.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

typedef struct nst {
    int32_t eps[2]; /* ε edges (-1: none) */
    int32_t to;     /* the byte edge's target (-1: none) */
    uint64_t set[4];
} nst;

typedef struct frag {
    int32_t s, e; /* start, and the end state (no edges yet) */
} frag;

typedef struct rxp {
    const char *p;
    size_t i;
    nst *st;
    int32_t ns, cap;
    char *err;
    size_t errlen;
    bool failed;
} rxp;

static const frag NOFRAG = {-1, -1};

__attribute__((format(printf, 2, 3))) static frag rfail(rxp *c, const char *fmt, ...)
{
    if (!c->failed && c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    c->failed = true;
    return NOFRAG;
}

static int32_t nnew(rxp *c)
{
    if (c->ns >= RX_MAX_NFA) {
        rfail(c, "the pattern needs more than %d automaton states (counted repetitions are expanded); simplify it.",
              RX_MAX_NFA);
        return -1;
    }
    if (c->ns == c->cap) {
        int32_t nc = c->cap ? c->cap * 2 : 64;
        nst *q = realloc(c->st, (size_t)nc * sizeof *q);
        if (!q) {
            rfail(c, "out of memory compiling the pattern.");
            return -1;
        }
        c->st = q;
        c->cap = nc;
    }
    c->st[c->ns] = (nst){{-1, -1}, -1, {0, 0, 0, 0}};
    return c->ns++;
}

static void eps(rxp *c, int32_t from, int32_t to)
{
    nst *s = &c->st[from];
    s->eps[s->eps[0] < 0 ? 0 : 1] = to; /* a fragment's end has no edges; no state gets more than two */
}

static bool writable(unsigned b)
{
    return b >= 0x20 && b != '"' && b != '\\';
}

static void set_add(uint64_t *m, unsigned b)
{
    if (b < 256 && (b >= 0x80 || writable(b)))
        m[b >> 6] |= 1ull << (b & 63);
}

static frag set_frag(rxp *c, const uint64_t *set)
{
    int32_t s = nnew(c), e = s < 0 ? -1 : nnew(c);
    if (e < 0)
        return NOFRAG;
    memcpy(c->st[s].set, set, sizeof c->st[s].set);
    c->st[s].to = e;
    return (frag){s, e};
}

static frag range_frag(rxp *c, unsigned lo, unsigned hi)
{
    uint64_t set[4] = {0};
    for (unsigned b = lo; b <= hi; b++)
        set[b >> 6] |= 1ull << (b & 63);
    return set_frag(c, set);
}

static frag cat(rxp *c, frag a, frag b)
{
    if (a.s < 0 || b.s < 0)
        return NOFRAG;
    eps(c, a.e, b.s);
    return (frag){a.s, b.e};
}

static frag alt2(rxp *c, frag a, frag b)
{
    if (a.s < 0 || b.s < 0)
        return NOFRAG;
    int32_t s = nnew(c), e = s < 0 ? -1 : nnew(c);
    if (e < 0)
        return NOFRAG;
    eps(c, s, a.s), eps(c, s, b.s);
    eps(c, a.e, e), eps(c, b.e, e);
    return (frag){s, e};
}

static frag empty(rxp *c)
{
    int32_t s = nnew(c);
    return s < 0 ? NOFRAG : (frag){s, s};
}

static frag star(rxp *c, frag a)
{
    if (a.s < 0)
        return NOFRAG;
    int32_t s = nnew(c), e = s < 0 ? -1 : nnew(c);
    if (e < 0)
        return NOFRAG;
    eps(c, s, a.s), eps(c, s, e);
    eps(c, a.e, a.s), eps(c, a.e, e);
    return (frag){s, e};
}

static frag opt(rxp *c, frag a)
{
    return alt2(c, a, empty(c));
}

/* Any well-formed multibyte UTF-8 character. */
static frag non_ascii(rxp *c)
{
    static const uint8_t seq[8][4][2] = {
        {{0xC2, 0xDF}, {0x80, 0xBF}}, {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
        {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}}, {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
        {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}}, {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}, {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
    };
    frag all = NOFRAG;
    for (int k = 0; k < 8; k++) {
        frag f = range_frag(c, seq[k][0][0], seq[k][0][1]);
        for (int j = 1; j < 4 && seq[k][j][0]; j++)
            f = cat(c, f, range_frag(c, seq[k][j][0], seq[k][j][1]));
        all = k ? alt2(c, all, f) : f;
    }
    return all;
}

/* An ASCII set, plus every non-ASCII character when with_non_ascii. */
static frag cls_frag(rxp *c, const uint64_t *ascii, bool with_non_ascii)
{
    frag f = set_frag(c, ascii);
    return with_non_ascii ? alt2(c, f, non_ascii(c)) : f;
}

/* The bytes of code point cp (valid, not a surrogate) as a chain. */
static frag cp_frag(rxp *c, uint32_t cp)
{
    uint8_t b[4];
    int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 1)
        b[0] = (uint8_t)cp;
    else if (n == 2)
        b[0] = (uint8_t)(0xC0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 63));
    else if (n == 3)
        b[0] = (uint8_t)(0xE0 | cp >> 12), b[1] = (uint8_t)(0x80 | (cp >> 6 & 63)), b[2] = (uint8_t)(0x80 | (cp & 63));
    else
        b[0] = (uint8_t)(0xF0 | cp >> 18), b[1] = (uint8_t)(0x80 | (cp >> 12 & 63)),
        b[2] = (uint8_t)(0x80 | (cp >> 6 & 63)), b[3] = (uint8_t)(0x80 | (cp & 63));
    frag f = NOFRAG;
    for (int k = 0; k < n; k++) {
        uint64_t set[4] = {0};
        set_add(set, b[k]);
        f = k ? cat(c, f, set_frag(c, set)) : set_frag(c, set);
    }
    return f;
}

/* A UTF-8 character of the pattern at c->i: its code point, or -1 (malformed). */
static int32_t take_utf8(rxp *c)
{
    const uint8_t *p = (const uint8_t *)c->p + c->i;
    uint32_t cp;
    int n;
    if (p[0] < 0x80)
        cp = p[0], n = 1;
    else if (p[0] >= 0xC2 && p[0] <= 0xDF)
        cp = p[0] & 31, n = 2;
    else if (p[0] >= 0xE0 && p[0] <= 0xEF)
        cp = p[0] & 15, n = 3;
    else if (p[0] >= 0xF0 && p[0] <= 0xF4)
        cp = p[0] & 7, n = 4;
    else
        return -1;
    for (int k = 1; k < n; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return -1;
        cp = cp << 6 | (p[k] & 63);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    c->i += (size_t)n;
    return (int32_t)cp;
}

static int hexv(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* The shorthand class of letter k (d w s D W S) into set (ASCII); false for another letter. */
static bool shorthand(char k, uint64_t *set)
{
    uint64_t m[4] = {0};
    char low = (char)(k | 0x20);
    if (low != 'd' && low != 'w' && low != 's')
        return false;
    for (unsigned b = 0; b < 128; b++) {
        bool in = low == 'd'   ? b >= '0' && b <= '9'
                  : low == 'w' ? (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_'
                               : b == ' ' || (b >= 9 && b <= 13);
        if (in != (k != low))
            set_add(m, b);
    }
    for (int w = 0; w < 4; w++)
        set[w] |= m[w];
    return true;
}

/*
 * An escape after '\' at c->i: a code point (*cp >= 0) or a class into set (*cp = -1).  false with the
 * sentence for what is refused.
 */
static bool escape(rxp *c, int32_t *cp, uint64_t *set)
{
    char k = c->p[c->i];
    if (!k)
        return rfail(c, "the pattern ends with a lone backslash."), false;
    c->i++;
    *cp = -1;
    if (shorthand(k, set))
        return true;
    if (k >= '1' && k <= '9')
        return rfail(c, "backreferences (\\%c) cannot be enforced by constrained decoding.", k), false;
    if (k == 'b' || k == 'B')
        return rfail(c, "word boundaries (\\%c) are not supported in patterns.", k), false;
    if (k == 'p' || k == 'P' || k == 'k' || k == 'c')
        return rfail(c, "\\%c is not supported in patterns.", k), false;
    static const char CTRL[] = "nrtfv0";
    static const uint8_t CTRLV[] = {'\n', '\r', '\t', '\f', '\v', 0};
    const char *ct = strchr(CTRL, k);
    if (ct)
        return *cp = CTRLV[ct - CTRL], true;
    if (k == 'u' || k == 'x') {
        int nd = k == 'u' ? 4 : 2;
        uint32_t v = 0;
        for (int j = 0; j < nd; j++) {
            int h = hexv(c->p[c->i]);
            if (h < 0)
                return rfail(c, "\\%c needs %d hex digits.", k, nd), false;
            v = v * 16 + (uint32_t)h;
            c->i++;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rfail(c, "\\u%04X is a surrogate, which a pattern cannot match alone.", (unsigned)v), false;
        return *cp = (int32_t)v, true;
    }
    if ((unsigned char)k < 0x80 && !((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z') || (k >= '0' && k <= '9')))
        return *cp = (unsigned char)k, true; /* an escaped punctuation character is itself */
    return rfail(c, "the escape \\%c is not one JSON Schema patterns define.", k), false;
}

static frag parse_class(rxp *c)
{
    uint64_t set[4] = {0};
    bool neg = c->p[c->i] == '^', shorthands = false;
    if (neg)
        c->i++;
    for (;;) {
        char ch = c->p[c->i];
        if (!ch)
            return rfail(c, "a class [ is not closed.");
        if (ch == ']') {
            c->i++;
            break;
        }
        int32_t lo;
        if (ch == '\\') {
            c->i++;
            uint64_t sh[4] = {0};
            if (!escape(c, &lo, sh))
                return NOFRAG;
            if (lo < 0) {
                for (int w = 0; w < 4; w++)
                    set[w] |= sh[w];
                shorthands = true;
                continue;
            }
        } else if ((lo = take_utf8(c)) < 0)
            return rfail(c, "the pattern is not valid UTF-8.");
        int32_t hi = lo;
        if (c->p[c->i] == '-' && c->p[c->i + 1] && c->p[c->i + 1] != ']') {
            c->i++;
            if (c->p[c->i] == '\\') {
                c->i++;
                uint64_t sh[4] = {0};
                if (!escape(c, &hi, sh))
                    return NOFRAG;
                if (hi < 0)
                    return rfail(c, "a class range cannot end with a shorthand such as \\d.");
            } else if ((hi = take_utf8(c)) < 0)
                return rfail(c, "the pattern is not valid UTF-8.");
            if (hi < lo)
                return rfail(c, "a class range runs backwards.");
        }
        if (hi >= 0x80)
            return rfail(c, "classes may list ASCII characters only (use . or alternatives for others).");
        for (int32_t b = lo; b <= hi; b++)
            set_add(set, (unsigned)b);
    }
    if (!neg)
        return cls_frag(c, set, false);
    uint64_t comp[4] = {0};
    for (unsigned b = 0; b < 128; b++)
        if (!(set[b >> 6] >> (b & 63) & 1))
            set_add(comp, b);
    return cls_frag(c, comp, !shorthands);
}

static frag parse_alt(rxp *c, bool top, int depth);

static frag parse_atom(rxp *c, int depth)
{
    char ch = c->p[c->i];
    if (ch == '(') {
        c->i++;
        if (c->p[c->i] == '?') {
            if (c->p[c->i + 1] != ':')
                return rfail(c, "lookarounds, named groups and flags ((?…) other than (?:…)) are not supported in "
                                "patterns.");
            c->i += 2;
        }
        frag f = parse_alt(c, false, depth + 1);
        if (c->failed)
            return NOFRAG;
        if (c->p[c->i] != ')')
            return rfail(c, "a group ( is not closed.");
        c->i++;
        return f;
    }
    if (ch == '[') {
        c->i++;
        return parse_class(c);
    }
    if (ch == '.') {
        c->i++;
        uint64_t set[4] = {0};
        for (unsigned b = 0; b < 128; b++)
            if (b != '\n')
                set_add(set, b);
        return cls_frag(c, set, true);
    }
    if (ch == '^' || ch == '$')
        return rfail(c, "%c is supported only at the start (^) or end ($) of the pattern or of its top-level "
                        "alternatives.", ch);
    if (ch == '*' || ch == '+' || ch == '?')
        return rfail(c, "%c has nothing to repeat.", ch);
    if (ch == ')')
        return rfail(c, "a ) has no ( before it.");
    int32_t cp;
    if (ch == '\\') {
        c->i++;
        uint64_t set[4] = {0};
        if (!escape(c, &cp, set))
            return NOFRAG;
        if (cp < 0)
            return cls_frag(c, set, false);
    } else if ((cp = take_utf8(c)) < 0)
        return rfail(c, "the pattern is not valid UTF-8.");
    return cp_frag(c, (uint32_t)cp);
}

/* {m}, {m,}, {m,n} at c->i: true with the bounds (*hi -1: unbounded), c->i past it; false (c->i kept) when
 * the brace is not a quantifier (then it is a literal, as in Python's re). */
static bool braces(rxp *c, long *lo, long *hi)
{
    const char *p = c->p + c->i + 1;
    char *end;
    if (*p < '0' || *p > '9')
        return false;
    *lo = strtol(p, &end, 10);
    *hi = *lo;
    if (*end == ',') {
        p = end + 1;
        if (*p == '}')
            *hi = -1, end = (char *)p;
        else if (*p >= '0' && *p <= '9')
            *hi = strtol(p, &end, 10);
        else
            return false;
    }
    if (*end != '}')
        return false;
    c->i = (size_t)(end + 1 - c->p);
    return true;
}

static frag parse_piece(rxp *c, int depth)
{
    size_t at = c->i;
    frag a = parse_atom(c, depth);
    if (c->failed)
        return NOFRAG;
    char q = c->p[c->i];
    long lo, hi;
    frag r;
    if (q == '*')
        c->i++, r = star(c, a);
    else if (q == '+') {
        c->i++;
        size_t q_at = c->i;
        c->i = at; /* a second copy of the atom for a*: parsed again */
        frag b = parse_atom(c, depth);
        c->i = q_at;
        r = cat(c, a, star(c, b));
    } else if (q == '?')
        c->i++, r = opt(c, a);
    else if (q == '{' && braces(c, &lo, &hi)) {
        if ((hi >= 0 && hi < lo) || lo > 1000 || hi > 1000)
            return rfail(c, "a counted repetition {%ld,%ld} must have 0 <= m <= n <= 1000.", lo, hi);
        size_t q_at = c->i;
        r = lo > 0 ? a : empty(c);
        for (long k = 1; k < (hi < 0 ? lo + 1 : hi) && !c->failed; k++) {
            c->i = at;
            frag b = parse_atom(c, depth);
            if (k < lo)
                r = cat(c, r, b);
            else
                r = cat(c, r, hi < 0 ? star(c, b) : opt(c, b));
        }
        if (lo == 0 && hi < 0)
            r = star(c, a);
        else if (lo == 0 && hi > 0) /* a? then the optional copies above */
            r = cat(c, opt(c, a), r);
        else if (lo == 0)
            r = empty(c);
        c->i = q_at;
    } else
        return a;
    if (c->p[c->i] == '?') /* lazy: the same language */
        c->i++;
    if (c->p[c->i] == '*' || c->p[c->i] == '+' || c->p[c->i] == '?' ||
        (c->p[c->i] == '{' && braces(c, &lo, &hi)))
        return rfail(c, "a quantifier follows another; group the first one.");
    return r;
}

static frag any_text(rxp *c)
{
    uint64_t set[4] = {0};
    for (unsigned b = 0; b < 128; b++)
        set_add(set, b);
    return star(c, cls_frag(c, set, true));
}

static frag parse_concat(rxp *c, bool top, int depth)
{
    bool start = false, end = false;
    if (top && c->p[c->i] == '^')
        c->i++, start = true;
    frag f = empty(c);
    for (;;) {
        char ch = c->p[c->i];
        if (!ch || ch == '|' || (ch == ')' && depth > 0) || c->failed)
            break;
        if (top && ch == '$' && (!c->p[c->i + 1] || c->p[c->i + 1] == '|')) {
            c->i++, end = true;
            break;
        }
        f = cat(c, f, parse_piece(c, depth));
    }
    if (top && !start)
        f = cat(c, any_text(c), f);
    if (top && !end)
        f = cat(c, f, any_text(c));
    return c->failed ? NOFRAG : f;
}

static frag parse_alt(rxp *c, bool top, int depth)
{
    if (depth > 64)
        return rfail(c, "the pattern nests groups deeper than 64.");
    frag f = parse_concat(c, top, depth);
    while (!c->failed && c->p[c->i] == '|') {
        c->i++;
        f = alt2(c, f, parse_concat(c, top, depth));
    }
    return f;
}

/* ---------------------------------------------------------------- NFA → DFA */

typedef struct sets {
    int32_t words, n, cap;
    uint64_t *bits;  /* (cap, words) */
    int32_t *table;  /* open addressing: DFA state + 1, 0 empty */
    size_t tcap;
} sets;

static uint64_t set_hash(const uint64_t *b, int32_t w)
{
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < w; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

static void closure(const rxp *c, uint64_t *b, int32_t *stack)
{
    int32_t sp = 0;
    for (int32_t q = 0; q < c->ns; q++)
        if (b[q >> 6] >> (q & 63) & 1)
            stack[sp++] = q;
    while (sp) {
        const nst *s = &c->st[stack[--sp]];
        for (int k = 0; k < 2; k++) {
            int32_t t = s->eps[k];
            if (t >= 0 && !(b[t >> 6] >> (t & 63) & 1)) {
                b[t >> 6] |= 1ull << (t & 63);
                stack[sp++] = t;
            }
        }
    }
}

/* The DFA state of set b (new when unseen): its index, or -1 when the cap is reached / memory ran out. */
static int32_t intern(sets *S, const uint64_t *b)
{
    uint64_t h = set_hash(b, S->words);
    size_t i = h & (S->tcap - 1);
    for (; S->table[i]; i = (i + 1) & (S->tcap - 1))
        if (!memcmp(S->bits + (size_t)(S->table[i] - 1) * (size_t)S->words, b, (size_t)S->words * 8))
            return S->table[i] - 1;
    if (S->n >= RX_MAX_DFA)
        return -1;
    if (S->n == S->cap) {
        int32_t nc = S->cap * 2;
        uint64_t *nb = realloc(S->bits, (size_t)nc * (size_t)S->words * 8);
        if (!nb)
            return -1;
        S->bits = nb;
        S->cap = nc;
    }
    memcpy(S->bits + (size_t)S->n * (size_t)S->words, b, (size_t)S->words * 8);
    S->table[i] = S->n + 1;
    return S->n++;
}

int rx_compile(const char *pattern, rx_dfa *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    rxp c = {pattern, 0, NULL, 0, 0, err, errlen, false};
    frag f = parse_alt(&c, true, 0);
    if (!c.failed && c.p[c.i])
        rfail(&c, "a ) has no ( before it.");
    if (c.failed) {
        free(c.st);
        return -1;
    }
    int32_t final = f.e;
    /* byte classes: bytes that every set treats alike */
    uint8_t cls[256]; /* continuation bytes apart from the start: minrem counts characters by the class */
    for (int b = 0; b < 256; b++)
        cls[b] = (b & 0xC0) == 0x80;
    int ncls = 2;
    for (int32_t q = 0; q < c.ns; q++) {
        if (c.st[q].to < 0)
            continue;
        int map[512];
        for (int k = 0; k < 512; k++)
            map[k] = -1;
        int nn = 0;
        for (unsigned b = 0; b < 256; b++) {
            int key = cls[b] * 2 + (int)(c.st[q].set[b >> 6] >> (b & 63) & 1);
            if (map[key] < 0)
                map[key] = nn++;
            cls[b] = (uint8_t)map[key];
        }
        ncls = nn;
    }
    int rep[256];
    for (int k = 0; k < ncls; k++)
        rep[k] = -1;
    for (int b = 255; b >= 0; b--)
        rep[cls[b]] = b;
    sets S = {(c.ns + 63) / 64, 0, 64, NULL, NULL, 0};
    S.tcap = 4096;
    while (S.tcap < 2 * RX_MAX_DFA)
        S.tcap *= 2;
    S.bits = malloc((size_t)S.cap * (size_t)S.words * 8);
    S.table = calloc(S.tcap, sizeof *S.table);
    uint64_t *cur = calloc((size_t)S.words, 8);
    int32_t *stack = malloc((size_t)c.ns * sizeof *stack * 2 + 8);
    int32_t *cnext = NULL; /* (states, ncls) */
    size_t ccap = 0;
    int rc = -1;
    if (!S.bits || !S.table || !cur || !stack) {
        util_errf(err, errlen, "out of memory compiling the pattern.");
        goto out_free;
    }
    cur[f.s >> 6] |= 1ull << (f.s & 63);
    closure(&c, cur, stack);
    intern(&S, cur);
    for (int32_t d = 0; d < S.n; d++) {
        if ((size_t)(d + 1) * (size_t)ncls > ccap) {
            size_t nc = ccap ? ccap * 2 : (size_t)ncls * 64;
            int32_t *q = realloc(cnext, nc * sizeof *q);
            if (!q) {
                util_errf(err, errlen, "out of memory compiling the pattern.");
                goto out_free;
            }
            cnext = q, ccap = nc;
        }
        for (int k = 0; k < ncls; k++) {
            unsigned b = (unsigned)rep[k];
            memset(cur, 0, (size_t)S.words * 8);
            bool any = false;
            const uint64_t *from = S.bits + (size_t)d * (size_t)S.words;
            for (int32_t q = 0; q < c.ns; q++)
                if (from[q >> 6] >> (q & 63) & 1 && c.st[q].to >= 0 && c.st[q].set[b >> 6] >> (b & 63) & 1) {
                    int32_t t = c.st[q].to;
                    cur[t >> 6] |= 1ull << (t & 63);
                    any = true;
                }
            int32_t nx = -1;
            if (any) {
                closure(&c, cur, stack);
                if ((nx = intern(&S, cur)) < 0) {
                    util_errf(err, errlen, "the pattern needs more than %d automaton states; simplify it.", RX_MAX_DFA);
                    goto out_free;
                }
            }
            cnext[(size_t)d * (size_t)ncls + (size_t)k] = nx;
        }
    }
    int32_t n = S.n;
    size_t un = (size_t)(n > 0 ? n : 1);
    out->n = n;
    out->next = malloc(un * 256 * sizeof *out->next);
    out->accept = calloc(un, 1);
    out->minrem = malloc(un * sizeof *out->minrem);
    if (!out->next || !out->accept || !out->minrem) {
        util_errf(err, errlen, "out of memory compiling the pattern.");
        goto out_free;
    }
    for (int32_t d = 0; d < n; d++) {
        out->accept[d] = S.bits[(size_t)d * (size_t)S.words + (size_t)(final >> 6)] >> (final & 63) & 1;
        out->minrem[d] = out->accept[d] ? 0 : -1;
    }
    /* fewest characters to a match (a continuation byte costs none), relaxed to a fixpoint: small automata */
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t d = 0; d < n; d++)
            for (int k = 0; k < ncls; k++) {
                int32_t t = cnext[(size_t)d * (size_t)ncls + (size_t)k];
                if (t < 0 || out->minrem[t] < 0)
                    continue;
                int32_t v = out->minrem[t] + ((rep[k] & 0xC0) != 0x80);
                if (out->minrem[d] < 0 || v < out->minrem[d])
                    out->minrem[d] = v, changed = true;
            }
    }
    if (out->minrem[0] < 0) {
        util_errf(err, errlen, "no string the pattern matches can be written in JSON without escapes (spill's "
                               "constrained decoding writes none in a pattern string).");
        goto out_free;
    }
    for (int32_t d = 0; d < n; d++)
        for (unsigned b = 0; b < 256; b++) {
            int32_t t = cnext[(size_t)d * (size_t)ncls + cls[b]];
            out->next[(size_t)d * 256 + b] = t >= 0 && out->minrem[t] >= 0 ? t : -1;
        }
    rc = 0;
out_free:
    free(c.st);
    free(S.bits);
    free(S.table);
    free(cur);
    free(stack);
    free(cnext);
    if (rc)
        rx_free(out);
    return rc;
}

void rx_free(rx_dfa *d)
{
    if (!d)
        return;
    free(d->next);
    free(d->accept);
    free(d->minrem);
    memset(d, 0, sizeof *d);
}
