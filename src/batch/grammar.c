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

#include <string.h>

#include "grammar_internal.h"

/* Y year digit, M month, D day, h hour, m minute, s second (pairs), X hex digit, anything else itself */
static const char *const FMT_TMPL[FMT_COUNT] = {NULL, "YYYY-MM-DD", "hh:mm:ssZ", "YYYY-MM-DDThh:mm:ssZ",
                                                "XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX"};

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
        if (nd->n_disc && p->m == 1) {           /* a discriminated anyOf's tag: its literal picks the branch */
            const gframe *lit = &s->f[s->depth]; /* the frame just popped */
            p->node = g->alts[nd->disc0 + ((int32_t)lit->m - g->nodes[g->props[nd->prop0].node].lit0)];
        }
        p->phase = OB_AFTER_VAL;
    } else { /* FR_ARR: count items only as far as a bound or prefixItems needs */
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
bool grammar_int_range_has(const gnode *nd, i128 a, i128 z)
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
        if (neg ? grammar_int_range_has(nd, -z, -a) : grammar_int_range_has(nd, a, z))
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
bool grammar_real_viable(const gnode *nd, bool neg, uint64_t N, int k, bool dot, int m)
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
        i128 a = k < 0 ? pow10i(j - 1) * RU : (i128)P * pow10i(j) * RU,
             z = k < 0 ? pow10i(j) * RU : ((i128)P + 1) * pow10i(j) * RU;
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
            if (!grammar_real_viable(nd, true, 0, -1, false, 0))
                return -1;
            f->phase = NS_MINUS, f->b = 1;
            return 0;
        }
        /* fall through */
    case NS_MINUS:
        if (!digit)
            return f->phase == NS_START ? -1 : 1;
        if (!grammar_real_viable(nd, f->b, d, d ? 1 : 0, false, 0))
            return -1;
        f->phase = d ? NS_INT : NS_ZERO, f->n = d ? 1 : 0, f->x = d;
        return 0;
    case NS_ZERO:
    case NS_INT:
        if (digit && f->phase == NS_INT) {
            if (f->n >= RDIGITS)
                return 1;
            if (!grammar_real_viable(nd, f->b, f->x * 10 + d, (int)f->n + 1, false, 0))
                return -1;
            f->x = f->x * 10 + d, f->n++;
            return 0;
        }
        if (b == '.') {
            if (f->n >= RDIGITS || !grammar_real_viable(nd, f->b, f->x, (int)f->n, true, 0))
                return f->n >= RDIGITS ? 1 : -1;
            return f->phase = NS_DOT, f->a = 0, 0;
        }
        return 1;
    case NS_DOT:
    case NS_FRAC:
        if (digit && f->n + f->a < RDIGITS) {
            if (!grammar_real_viable(nd, f->b, f->x * 10 + d, (int)f->n, true, f->a + 1))
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
            if (bounded && !grammar_int_range_has(nd, -INT_LIMIT, -1))
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
    case 'M':
        return v >= 1 && v <= 12;
    case 'D':
        return v >= 1 && v <= days_in(year, month);
    case 'h':
        return v <= 23;
    default:
        return v <= 59;
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
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
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
    case '{':
        return push(s, node, FR_OBJ, OB_OPEN);
    case '[':
        return push(s, node, FR_ARR, AR_OPEN);
    case '"':
        return push(s, node, FR_STR, ST_CHAR);
    case 't':
    case 'f':
        return lit_start(g, s, g->lit_bool, c);
    case 'n':
        return lit_start(g, s, g->lit_null, c);
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
        case FR_OBJ:
            return obj_feed(g, s, f, c);
        case FR_ARR:
            return arr_feed(g, s, f, c);
        case FR_KEY:
            return key_feed(g, s, f, c);
        case FR_STR:
            return str_feed(g, s, f, c);
        case FR_NUM:
            rc = num_feed(g, f, c);
            break;
        default:
            rc = lit_feed(g, s, f, c);
            break;
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
