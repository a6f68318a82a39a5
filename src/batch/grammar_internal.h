/*
 * grammar_internal.h — what grammar.c (the automaton) and grammar_compile.c (schema → nodes) share: the node,
 * property and literal records, the compiled grammar, and the kind / phase enums of a frame.  Only those two
 * files include it; grammar.h is the interface.
 */
#ifndef SPILL_GRAMMAR_INTERNAL_H
#define SPILL_GRAMMAR_INTERNAL_H

#include "grammar.h"
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
    uint8_t types;                /* T_* a value may have (literal nodes: ignored) */
    uint8_t format;               /* FMT_* */
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
    int64_t mult;          /* integer multipleOf (0: none) */
    bool has_rlo, has_rhi; /* number bounds, in units of 10^-RDIGITS (exact; see num_feed_real) */
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

static inline bool has_bit(const uint64_t *m, unsigned b)
{
    return m[b >> 6] >> (b & 63) & 1;
}

/* grammar.c's number checks, which compiling also asks (is a bounded integer or number writable at all?):
 * some integer in [a, z] lies in nd's range on its multiple; some completion of a number's digits so far
 * (sign neg, N of k digits, dot and m fraction digits; k = -1: nothing written yet) lands in nd's bounds. */
bool grammar_int_range_has(const gnode *nd, i128 a, i128 z);
bool grammar_real_viable(const gnode *nd, bool neg, uint64_t N, int k, bool dot, int m);

#endif
