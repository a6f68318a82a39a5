/*
 * tok_pipeline.c — the stages of the tokenizer pipeline that transform text:
 * regexes (PCRE2), normalizers, pre-tokenizers, decoders, and the added-token
 * trie, as nodes built from tokenizer.json or from a GGUF vocabulary.
 *
 * Owns: what each node does to text, matching tokenizers' semantics step for
 * step (NormalizedString::split behaviours, onig's find_iter empty-match rule,
 * ByteLevel's byte alphabet, Metaspace prepend schemes, ByteFallback's
 * U+FFFD-per-byte rule).  Does not own: building nodes (tokenizer.c,
 * tok_gguf.c), the BPE model (bpe.c).
 *
 * Regexes: PCRE2 with UTF+UCP, JIT-compiled once per pattern.  tokenizers
 * uses Oniguruma (and the Rust regex crate for Whitespace); where their
 * classes differ from PCRE2's (\s, \w) the pattern is rewritten with explicit
 * classes, and the fixture corpus checks every whitespace kind.  Safety: a
 * pattern whose repeated group itself contains a repeat or an alternation
 * (`(a+)+`, `(a|aa)*`) is refused at load time with a sentence, and every
 * match runs under PCRE2 match/depth/heap limits, so no input can make a
 * match run away.  The known pre-tokenizer patterns have no nested repeats
 * and run in time linear in the input.
 */
#include <stdio.h>

#include "tok_internal.h"

#define RX_MATCH_LIMIT 20000000u
#define RX_DEPTH_LIMIT 100000u
#define RX_HEAP_LIMIT_KB (64u * 1024u)

/* ---- small buffers ---------------------------------------------------- */






/* Length of the valid UTF-8 sequence at s, or 0 if the bytes there are not
 * one; *bad gets the length of the maximal invalid subpart in that case
 * (Unicode "substitution of maximal subparts", as Rust and Python do). */
static size_t u8valid(const uint8_t *s, size_t len, size_t *bad)
{
    uint8_t c = s[0];
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k < n; k++) {
        if (k >= len || s[k] < (k == 1 ? lo : 0x80) || s[k] > (k == 1 ? hi : 0xBF)) {
            *bad = k;
            return 0;
        }
    }
    return n;
}

/* Copies [s, s+len) into b, replacing invalid UTF-8 with U+FFFD. */
int tk_sb_add_lossy(sbuf *b, const char *s, size_t len)
{
    size_t i = 0, run = 0;
    while (i < len) {
        size_t bad = 0, n = u8valid((const uint8_t *)s + i, len - i, &bad);
        if (n) {
            i += n;
            continue;
        }
        if (sb_add(b, s + run, i - run) != 0 || sb_add(b, "\xEF\xBF\xBD", 3) != 0)
            return -1;
        i += bad;
        run = i;
    }
    return sb_add(b, s + run, len - run);
}

/* Rust char::is_whitespace (the White_Space property). */
bool tk_is_ws(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool is_numeric(uint32_t c)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* Rust is_alphanumeric() || '_', approximated by the L and N categories plus
 * combining marks (Other_Alphabetic is mostly marks); only single_word uses it. */
bool tk_is_word(uint32_t c)
{
    if (c == '_')
        return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || is_numeric(c) ||
           k == UTF8PROC_CATEGORY_MC;
}

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order. */
uint32_t tk_byte_to_cp[256];
int16_t tk_cp_to_byte[0x144];

void tk_byte_table_init(void)
{
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
        return;
    uint32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        tk_byte_to_cp[b] = keep ? (uint32_t)b : 0x100 + extra++;
    }
    for (int i = 0; i < 0x144; i++)
        tk_cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        tk_cp_to_byte[tk_byte_to_cp[b]] = (int16_t)b;
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

/* ---- regexes and patterns --------------------------------------------- */


/* Refuses repeated groups whose body repeats or alternates (exponential
 * backtracking).  Returns 0 or -1 with a sentence. */
static int rx_check_safe(const char *p, size_t len, const char *where, char *err, size_t errlen)
{
    struct {
        bool rep, alt;
    } st[64];
    int sp = 0;
    st[0].rep = st[0].alt = false;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        bool quant_follows = false;
        if (c == '\\') {
            if (i + 1 < len && p[i + 1] == 'Q') {
                const char *e = memmem(p + i, len - i, "\\E", 2);
                i = e ? (size_t)(e - p) + 1 : len;
                continue;
            }
            i++;
            if (i + 1 < len && strchr("pPxNgk", p[i]) && (p[i + 1] == '{' || p[i + 1] == '<')) {
                char close = p[i + 1] == '{' ? '}' : '>';
                const char *e = memchr(p + i, close, len - i);
                i = e ? (size_t)(e - p) : len;
            }
        } else if (c == '[') {
            i++;
            if (i < len && p[i] == '^')
                i++;
            if (i < len && p[i] == ']')
                i++;
            for (; i < len && p[i] != ']'; i++) {
                if (p[i] == '\\')
                    i++;
                else if (p[i] == '[' && i + 1 < len && p[i + 1] == ':') {
                    const char *e = memmem(p + i, len - i, ":]", 2);
                    i = e ? (size_t)(e - p) + 1 : len;
                }
            }
        } else if (c == '(') {
            if (i + 2 < len && p[i + 1] == '?' && p[i + 2] == '#') {
                const char *e = memchr(p + i, ')', len - i);
                i = e ? (size_t)(e - p) : len;
                continue;
            }
            if (++sp >= 64)
                return util_errf(err, errlen, "%s: regex nests groups more than 63 deep; simplify the pattern.",
                                 where);
            st[sp].rep = st[sp].alt = false;
            continue;
        } else if (c == '|') {
            st[sp].alt = true;
            continue;
        } else if (c == ')') {
            if (sp == 0)
                continue;
            bool inner = st[sp].rep || st[sp].alt;
            sp--;
            size_t j = i + 1;
            bool many = false;
            if (j < len && (p[j] == '*' || p[j] == '+'))
                many = true;
            else if (j < len && p[j] == '{') {
                const char *e = memchr(p + j, '}', len - j);
                if (e) {
                    const char *comma = memchr(p + j, ',', (size_t)(e - p) - j);
                    many = comma ? (e - comma > 1 ? atoi(comma + 1) > 1 : true) : atoi(p + j + 1) > 1;
                }
            }
            if (many && inner)
                return util_errf(err, errlen,
                                 "%s: regex repeats a group that itself repeats or alternates (like (a+)+), "
                                 "which can take exponential time; rewrite it without the nested repeat.",
                                 where);
            if (inner || many)
                st[sp].rep = true;
            continue;
        }
        size_t j = i + 1;
        if (j < len && (p[j] == '*' || p[j] == '+'))
            quant_follows = true;
        else if (j < len && p[j] == '{' && j + 1 < len && p[j + 1] >= '0' && p[j + 1] <= '9')
            quant_follows = true;
        if (quant_follows)
            st[sp].rep = true;
    }
    return 0;
}

/* Oniguruma's \s is the White_Space property; PCRE2's (UCP) adds U+180E.
 * Oniguruma's \w is Letter|Mark|Number|Connector_Punctuation; PCRE2
 * 10.42's is Letter|Number|'_'.  Spell them out so both engines agree
 * (the corpus checks every whitespace kind and many scripts). */
#define WS_SET "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

#define WORD_SET "\\p{L}\\p{M}\\p{N}\\p{Pc}"

static int rx_rewrite(const char *p, size_t len, sbuf *o)
{
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        int r;
        if (p[i] == '\\' && i + 1 < len) {
            char c = p[i + 1];
            if (c == 's')
                r = sb_add(o, in_class ? WS_SET : "[" WS_SET "]", strlen(WS_SET) + (in_class ? 0 : 2));
            else if (c == 'S' && !in_class)
                r = sb_add(o, "[^" WS_SET "]", strlen(WS_SET) + 3);
            else if (c == 'w')
                r = sb_add(o, in_class ? WORD_SET : "[" WORD_SET "]", strlen(WORD_SET) + (in_class ? 0 : 2));
            else if (c == 'W' && !in_class)
                r = sb_add(o, "[^" WORD_SET "]", strlen(WORD_SET) + 3);
            else
                r = sb_add(o, p + i, 2);
            i++;
        } else {
            if (p[i] == '[' && !in_class) {
                in_class = true;
                r = sb_add(o, p + i, 1);
                /* a leading ']' (or '^]') is a literal, not the end */
                if (i + 1 < len && p[i + 1] == '^') {
                    r = r || sb_add(o, p + ++i, 1);
                }
                if (i + 1 < len && p[i + 1] == ']')
                    r = r || sb_add(o, p + ++i, 1);
            } else if (p[i] == '[' && in_class && i + 1 < len && p[i + 1] == ':') {
                const char *e = memmem(p + i, len - i, ":]", 2);
                size_t n = e ? (size_t)(e - (p + i)) + 2 : len - i;
                r = sb_add(o, p + i, n);
                i += n - 1;
            } else {
                if (p[i] == ']' && in_class)
                    in_class = false;
                r = sb_add(o, p + i, 1);
            }
        }
        if (r != 0)
            return -1;
    }
    return sb_add(o, "", 0);
}

int tk_pattern_compile(pattern *pt, const char *src, size_t len, bool regex, const char *where, char *err,
                           size_t errlen)
{
    memset(pt, 0, sizeof *pt);
    if (!regex) {
        pt->literal = malloc(len + 1);
        if (!pt->literal)
            return util_errf(err, errlen, "%s: out of memory.", where);
        memcpy(pt->literal, src, len);
        pt->literal[len] = 0;
        pt->literal_len = len;
        return 0;
    }
    if (rx_check_safe(src, len, where, err, errlen) != 0)
        return -1;
    int ec;
    PCRE2_SIZE eo;
    sbuf rw = {0};
    if (rx_rewrite(src, len, &rw) != 0) {
        free(rw.p);
        return util_errf(err, errlen, "%s: out of memory.", where);
    }
    pt->code = pcre2_compile((PCRE2_SPTR)rw.p, rw.n, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    free(rw.p);
    if (!pt->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return util_errf(err, errlen, "%s: regex does not compile at character %zu: %s.", where, (size_t)eo,
                         (const char *)msg);
    }
    pcre2_jit_compile(pt->code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return 0;
}

void tk_pattern_free(pattern *pt)
{
    if (pt->code)
        pcre2_code_free(pt->code);
    free(pt->literal);
}


void tk_rx_ctx_init(rx_ctx *c)
{
    memset(c, 0, sizeof *c);
}

/* Creates the match context on first use, so encodes and decodes that run no
 * regex pay nothing; the JIT stack only when the default one ran out. */
static int rx_ctx_ready(rx_ctx *c, bool big_stack)
{
    if (!c->mctx) {
        c->mctx = pcre2_match_context_create(NULL);
        c->md = pcre2_match_data_create(1, NULL);
        if (!c->mctx || !c->md)
            return -1;
        pcre2_set_match_limit(c->mctx, RX_MATCH_LIMIT);
        pcre2_set_depth_limit(c->mctx, RX_DEPTH_LIMIT);
        pcre2_set_heap_limit(c->mctx, RX_HEAP_LIMIT_KB);
    }
    if (big_stack && !c->jit) {
        c->jit = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
        if (!c->jit)
            return -1;
        pcre2_jit_stack_assign(c->mctx, NULL, c->jit);
    }
    return 0;
}

void tk_rx_ctx_free(rx_ctx *c)
{
    if (c->md)
        pcre2_match_data_free(c->md);
    if (c->jit)
        pcre2_jit_stack_free(c->jit);
    if (c->mctx)
        pcre2_match_context_free(c->mctx);
}

/* One match/non-match stretch of a subject. */
typedef struct {
    size_t a, b;
    bool match;
} span;

typedef struct {
    span *v;
    size_t n, cap;
} spans;

static int spans_add(spans *s, size_t a, size_t b, bool m)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        span *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (span){a, b, m};
    return 0;
}

/* tokenizers' Pattern::find_matches: the subject cut into alternating
 * non-match / match spans covering it whole.  Empty matches right after the
 * previous match are skipped (the onig crate's find_iter rule). */
static int find_matches(const pattern *pt, rx_ctx *rc, const char *s, size_t len, spans *out, char *err,
                        size_t errlen)
{
    out->n = 0;
    if (len == 0)
        return spans_add(out, 0, 0, false);
    size_t prev = 0;
    if (pt->literal) {
        if (pt->literal_len == 0)
            return spans_add(out, 0, len, false);
        for (size_t i = 0; i + pt->literal_len <= len;) {
            const char *hit = memmem(s + i, len - i, pt->literal, pt->literal_len);
            if (!hit)
                break;
            size_t a = (size_t)(hit - s);
            if (a > prev && spans_add(out, prev, a, false) != 0)
                return -1;
            if (spans_add(out, a, a + pt->literal_len, true) != 0)
                return -1;
            prev = i = a + pt->literal_len;
        }
    } else {
        size_t pos = 0;
        bool have_last = false;
        size_t last_end = 0;
        while (pos <= len) {
            if (rx_ctx_ready(rc, false) != 0)
                return util_errf(err, errlen, "out of memory matching a tokenizer regex.");
            int r = pcre2_match(pt->code, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, rc->md, rc->mctx);
            if (r == PCRE2_ERROR_JIT_STACKLIMIT && !rc->jit) {
                if (rx_ctx_ready(rc, true) != 0)
                    return util_errf(err, errlen, "out of memory matching a tokenizer regex.");
                r = pcre2_match(pt->code, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, rc->md, rc->mctx);
            }
            if (r == PCRE2_ERROR_NOMATCH)
                break;
            if (r < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(r, msg, sizeof msg);
                return util_errf(err, errlen, "tokenizer regex failed on this input (%s); the pattern is too "
                                              "costly for it.",
                                 (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(rc->md);
            size_t a = ov[0], b = ov[1];
            if (a == b && have_last && last_end == b) {
                if (pos >= len)
                    break;
                uint32_t cp;
                pos += u8dec(s + pos, len - pos, &cp);
                continue;
            }
            pos = b;
            have_last = true;
            last_end = b;
            if (a != prev && spans_add(out, prev, a, false) != 0)
                return -1;
            if (spans_add(out, a, b, true) != 0)
                return -1;
            prev = b;
        }
    }
    if (prev != len && spans_add(out, prev, len, false) != 0)
        return -1;
    return 0;
}

/* ---- pipeline nodes --------------------------------------------------- */



void tk_node_free(node *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n_kids; i++)
        tk_node_free(&n->kids[i]);
    free(n->kids);
    if (n->has_pat)
        tk_pattern_free(&n->pat);
    free(n->str);
}




/* ---- added-token trie ------------------------------------------------- */

int tk_trie_init(trie *t)
{
    memset(t, 0, sizeof *t);
    if (tk_pairmap_init(&t->edges, 64) != 0)
        return -1;
    t->cap_nodes = 64;
    t->terminal = malloc(t->cap_nodes * sizeof *t->terminal);
    if (!t->terminal)
        return -1;
    t->terminal[0] = -1;
    t->n_nodes = 1;
    return 0;
}

int tk_trie_add(trie *t, const char *s, size_t len, int32_t idx)
{
    int32_t cur = 0;
    if (len)
        t->first[(uint8_t)s[0]] = 1;
    for (size_t i = 0; i < len; i++) {
        const pairmap_slot *e = tk_pairmap_get(&t->edges, cur, (uint8_t)s[i]);
        if (e) {
            cur = e->new_id;
            continue;
        }
        if (t->n_nodes == t->cap_nodes) {
            int32_t *tt = realloc(t->terminal, t->cap_nodes * 2 * sizeof *tt);
            if (!tt)
                return -1;
            t->terminal = tt;
            t->cap_nodes *= 2;
        }
        int32_t nn = (int32_t)t->n_nodes++;
        t->terminal[nn] = -1;
        if (tk_pairmap_put(&t->edges, cur, (uint8_t)s[i], 0, nn) != 0)
            return -1;
        cur = nn;
    }
    t->terminal[cur] = idx;
    return 0;
}

/* Longest added token starting at s[i]; returns its index or -1, *end set. */
int32_t tk_trie_longest(const trie *t, const char *s, size_t len, size_t i, size_t *end)
{
    int32_t cur = 0, best = -1;
    if (i >= len || !t->first[(uint8_t)s[i]])
        return -1;
    for (size_t j = i; j < len; j++) {
        const pairmap_slot *e = tk_pairmap_get(&t->edges, cur, (uint8_t)s[j]);
        if (!e)
            break;
        cur = e->new_id;
        if (t->terminal[cur] >= 0) {
            best = t->terminal[cur];
            *end = j + 1;
        }
    }
    return best;
}

void tk_trie_free(trie *t)
{
    tk_pairmap_free(&t->edges);
    free(t->terminal);
}

/* ---- piece lists ------------------------------------------------------ */


int tk_pl_add(plist *l, const char *s, size_t len, int32_t token, bool at_start)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        piece *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    size_t off = l->text.n;
    if (sb_add(&l->text, s, len) != 0)
        return -1;
    l->v[l->n++] = (piece){off, len, token, at_start};
    return 0;
}

void tk_pl_free(plist *l)
{
    free(l->text.p);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static void pl_reset(plist *l)
{
    l->text.n = 0;
    l->n = 0;
}


/* ---- normalizers ------------------------------------------------------ */

int tk_nz_apply(const node *n, rx_ctx *rc, sbuf *s, char *err, size_t errlen);

static int replace_all(const pattern *pt, const char *content, size_t clen, rx_ctx *rc, sbuf *s, char *err,
                       size_t errlen)
{
    spans sp = {0};
    sbuf o = {0};
    int rcode = -1;
    if (find_matches(pt, rc, s->p ? s->p : "", s->n, &sp, err, errlen) != 0)
        goto out;
    for (size_t i = 0; i < sp.n; i++) {
        int r = sp.v[i].match ? sb_add(&o, content, clen) : sb_add(&o, s->p + sp.v[i].a, sp.v[i].b - sp.v[i].a);
        if (r != 0) {
            util_errf(err, errlen, "out of memory while normalizing.");
            goto out;
        }
        /* a pattern matching everywhere (even empty) with a long content could
         * grow the text quadratically: refuse past a generous bound */
        if (o.n > 16 * s->n + ((size_t)1 << 20)) {
            util_errf(err, errlen, "a Replace pattern grows the text more than 16-fold; the tokenizer's Replace "
                                   "rule is unusable on this input.");
            goto out;
        }
    }
    if (sb_add(&o, "", 0) != 0)
        goto out;
    free(s->p);
    *s = o;
    o.p = NULL;
    rcode = 0;
out:
    free(o.p);
    free(sp.v);
    return rcode;
}

int tk_nz_apply(const node *n, rx_ctx *rc, sbuf *s, char *err, size_t errlen)
{
    switch (n->kind) {
    case NZ_SEQ:
        for (size_t i = 0; i < n->n_kids; i++)
            if (tk_nz_apply(&n->kids[i], rc, s, err, errlen) != 0)
                return -1;
        return 0;
    case NZ_NFC:
    case NZ_NFD:
    case NZ_NFKC:
    case NZ_NFKD: {
        if (s->n == 0)
            return 0;
        int opt = UTF8PROC_STABLE;
        opt |= (n->kind == NZ_NFC || n->kind == NZ_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (n->kind == NZ_NFKC || n->kind == NZ_NFKD)
            opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *o = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s->p, (utf8proc_ssize_t)s->n, &o,
                                          (utf8proc_option_t)opt);
        if (r < 0)
            return util_errf(err, errlen, "unicode normalization failed: %s.", utf8proc_errmsg(r));
        free(s->p);
        s->p = (char *)o;
        s->n = (size_t)r;
        s->cap = (size_t)r + 1;
        return 0;
    }
    case NZ_LOWER: {
        sbuf o = {0};
        for (size_t i = 0; i < s->n;) {
            uint32_t cp;
            i += u8dec(s->p + i, s->n - i, &cp);
            int r = cp == 0x130 ? sb_add(&o, "i\xCC\x87", 3) : sb_cp(&o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
            if (r != 0) {
                free(o.p);
                return util_errf(err, errlen, "out of memory while normalizing.");
            }
        }
        if (sb_add(&o, "", 0) != 0) {
            free(o.p);
            return util_errf(err, errlen, "out of memory while normalizing.");
        }
        free(s->p);
        *s = o;
        return 0;
    }
    case NZ_STRIP: {
        size_t a = 0, b = s->n;
        while (n->flag_a && a < b) {
            uint32_t cp;
            size_t k = u8dec(s->p + a, b - a, &cp);
            if (!tk_is_ws(cp))
                break;
            a += k;
        }
        while (n->flag_b && b > a) {
            size_t k = b - 1;
            while (k > a && ((uint8_t)s->p[k] & 0xC0) == 0x80)
                k--;
            uint32_t cp;
            u8dec(s->p + k, b - k, &cp);
            if (!tk_is_ws(cp))
                break;
            b = k;
        }
        memmove(s->p, s->p + a, b - a);
        s->n = b - a;
        if (s->p)
            s->p[s->n] = 0;
        return 0;
    }
    case NZ_PREPEND: {
        if (s->n == 0)
            return 0;
        sbuf o = {0};
        if (sb_add(&o, n->str, n->str_len) != 0 || sb_add(&o, s->p, s->n) != 0) {
            free(o.p);
            return util_errf(err, errlen, "out of memory while normalizing.");
        }
        free(s->p);
        *s = o;
        return 0;
    }
    case NZ_REPLACE:
        return replace_all(&n->pat, n->str, n->str_len, rc, s, err, errlen);
    }
    return 0;
}

/* ---- pre-tokenizers --------------------------------------------------- */

const char TK_GPT2_SPLIT[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char TK_LLAMA3_SPLIT[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TK_QWEN2_SPLIT[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TK_TEKKEN_SPLIT[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TK_GPT4O_SPLIT[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* The Whitespace pre-tokenizer uses the Rust regex crate, whose \w is
 * Alphabetic|Mark|Decimal_Number|Connector_Punctuation|Join_Control
 * (Alphabetic = letters, letter numbers, and the circled/squared letters). */
#define RUST_WORD "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}\\x{1f130}-\\x{1f149}\\x{1f150}-\\x{1f169}\\x{1f170}-\\x{1f189}"
const char TK_WHITESPACE_SPLIT[] = "[" RUST_WORD "]+|[^" RUST_WORD "\\s]+";
const char TK_WS_CLASS[] = "[\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]";
const char TK_PUNCT_CLASS[] = "[\\p{P}!-/:-@\\[-`{-~]";

/* Splits every piece of in by pattern/behaviour (tokenizers'
 * NormalizedString::split) into out; empty results are dropped. */
static int split_pieces(const pattern *pt, int behavior, bool invert, rx_ctx *rc, const plist *in, plist *out,
                        char *err, size_t errlen)
{
    spans sp = {0}, m = {0};
    int rcode = -1;
    for (size_t i = 0; i < in->n; i++) {
        const piece *p = &in->v[i];
        const char *s = PSTR(in, i);
        if (p->token >= 0) {
            if (tk_pl_add(out, s, p->len, p->token, p->at_start) != 0)
                goto oom;
            continue;
        }
        if (find_matches(pt, rc, s, p->len, &sp, err, errlen) != 0)
            goto out;
        m.n = 0;
        for (size_t k = 0; k < sp.n; k++) {
            span x = sp.v[k];
            if (invert)
                x.match = !x.match;
            bool prev_match = k > 0 && (invert ? !sp.v[k - 1].match : sp.v[k - 1].match);
            int r = 0;
            switch (behavior) {
            case B_ISOLATED:
                r = spans_add(&m, x.a, x.b, false);
                break;
            case B_REMOVED:
                r = spans_add(&m, x.a, x.b, x.match);
                break;
            case B_CONTIGUOUS:
                if (x.match == prev_match && m.n > 0)
                    m.v[m.n - 1].b = x.b;
                else
                    r = spans_add(&m, x.a, x.b, false);
                break;
            case B_MERGED_PREV:
                if (x.match && !prev_match && m.n > 0)
                    m.v[m.n - 1].b = x.b;
                else
                    r = spans_add(&m, x.a, x.b, false);
                break;
            case B_MERGED_NEXT:
                r = spans_add(&m, x.a, x.b, x.match);
                break;
            }
            if (r != 0)
                goto oom;
        }
        if (behavior == B_MERGED_NEXT) {
            /* Walk right to left: a match not preceded (on its right) by a match
             * glues onto the span after it. */
            spans r = {0};
            bool prev = false;
            for (size_t k = m.n; k-- > 0;) {
                span x = m.v[k];
                if (x.match && !prev && r.n > 0)
                    r.v[r.n - 1].a = x.a;
                else if (spans_add(&r, x.a, x.b, false) != 0) {
                    free(r.v);
                    goto oom;
                }
                prev = x.match;
            }
            m.n = 0;
            for (size_t k = r.n; k-- > 0;)
                if (spans_add(&m, r.v[k].a, r.v[k].b, false) != 0) {
                    free(r.v);
                    goto oom;
                }
            free(r.v);
        }
        bool first = true;
        for (size_t k = 0; k < m.n; k++) {
            if (m.v[k].match || m.v[k].b == m.v[k].a)
                continue;
            if (tk_pl_add(out, s + m.v[k].a, m.v[k].b - m.v[k].a, -1, p->at_start && m.v[k].a == 0) != 0)
                goto oom;
            first = false;
        }
        (void)first;
    }
    rcode = 0;
    goto out;
oom:
    util_errf(err, errlen, "out of memory while pre-tokenizing.");
out:
    free(sp.v);
    free(m.v);
    return rcode;
}


int tk_pt_apply(const node *n, rx_ctx *rc, plist *cur, plist *tmp, char *err, size_t errlen);

/* Runs one splitting step on cur (result back in cur; tmp is scratch). */
static int split_step(const pattern *pt, int behavior, bool invert, rx_ctx *rc, plist *cur, plist *tmp, char *err,
                      size_t errlen)
{
    pl_reset(tmp);
    if (split_pieces(pt, behavior, invert, rc, cur, tmp, err, errlen) != 0)
        return -1;
    plist t = *cur;
    *cur = *tmp;
    *tmp = t;
    return 0;
}

static int digits_step(bool individual, plist *cur, plist *tmp, char *err, size_t errlen)
{
    pl_reset(tmp);
    for (size_t i = 0; i < cur->n; i++) {
        const piece *p = &cur->v[i];
        const char *s = PSTR(cur, i);
        if (p->token >= 0) {
            if (tk_pl_add(tmp, s, p->len, p->token, p->at_start) != 0)
                goto oom;
            continue;
        }
        size_t a = 0;
        int prev = -1; /* 1 digit, 0 other */
        for (size_t k = 0; k < p->len;) {
            uint32_t cp;
            size_t cl = u8dec(s + k, p->len - k, &cp);
            int d = is_numeric(cp);
            bool cut = k > 0 && (d != prev || (individual && d));
            if (cut) {
                if (tk_pl_add(tmp, s + a, k - a, -1, p->at_start && a == 0) != 0)
                    goto oom;
                a = k;
            }
            prev = d;
            k += cl;
        }
        if (p->len > a && tk_pl_add(tmp, s + a, p->len - a, -1, p->at_start && a == 0) != 0)
            goto oom;
    }
    plist t = *cur;
    *cur = *tmp;
    *tmp = t;
    return 0;
oom:
    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
}

int tk_pt_apply(const node *n, rx_ctx *rc, plist *cur, plist *tmp, char *err, size_t errlen)
{
    switch (n->kind) {
    case PT_SEQ:
        for (size_t i = 0; i < n->n_kids; i++)
            if (tk_pt_apply(&n->kids[i], rc, cur, tmp, err, errlen) != 0)
                return -1;
        return 0;
    case PT_SPLIT:
    case PT_WHITESPACE:
    case PT_WSSPLIT:
    case PT_PUNCT:
        return split_step(&n->pat, n->behavior, n->invert, rc, cur, tmp, err, errlen);
    case PT_DIGITS:
        return digits_step(n->flag_a, cur, tmp, err, errlen);
    case PT_BYTELEVEL: {
        if (n->flag_a) { /* add_prefix_space, per piece */
            pl_reset(tmp);
            for (size_t i = 0; i < cur->n; i++) {
                const piece *p = &cur->v[i];
                const char *s = PSTR(cur, i);
                bool pre = p->token < 0 && (p->len == 0 || s[0] != ' ');
                size_t off = tmp->text.n;
                if (pre && sb_add(&tmp->text, " ", 1) != 0)
                    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
                if (tk_pl_add(tmp, s, p->len, p->token, p->at_start) != 0)
                    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
                tmp->v[tmp->n - 1].off = off;
                tmp->v[tmp->n - 1].len += pre;
            }
            plist t = *cur;
            *cur = *tmp;
            *tmp = t;
        }
        if (n->flag_b && split_step(&n->pat, B_ISOLATED, false, rc, cur, tmp, err, errlen) != 0)
            return -1;
        pl_reset(tmp);
        for (size_t i = 0; i < cur->n; i++) {
            const piece *p = &cur->v[i];
            const uint8_t *s = (const uint8_t *)PSTR(cur, i);
            if (p->token >= 0) {
                if (tk_pl_add(tmp, (const char *)s, p->len, p->token, p->at_start) != 0)
                    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
                continue;
            }
            size_t off = tmp->text.n;
            for (size_t k = 0; k < p->len; k++)
                if (sb_cp(&tmp->text, tk_byte_to_cp[s[k]]) != 0)
                    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
            if (tk_pl_add(tmp, "", 0, -1, p->at_start) != 0)
                return util_errf(err, errlen, "out of memory while pre-tokenizing.");
            tmp->v[tmp->n - 1].off = off;
            tmp->v[tmp->n - 1].len = tmp->text.n - off;
        }
        plist t = *cur;
        *cur = *tmp;
        *tmp = t;
        return 0;
    }
    case PT_METASPACE: {
        char rep[4];
        size_t rl = (size_t)utf8proc_encode_char((utf8proc_int32_t)n->cp, (utf8proc_uint8_t *)rep);
        pl_reset(tmp);
        for (size_t i = 0; i < cur->n; i++) {
            const piece *p = &cur->v[i];
            const char *s = PSTR(cur, i);
            if (p->token >= 0) {
                if (tk_pl_add(tmp, s, p->len, p->token, p->at_start) != 0)
                    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
                continue;
            }
            size_t off = tmp->text.n;
            bool starts = p->len >= rl && memcmp(s, rep, rl) == 0;
            bool starts_space = p->len > 0 && s[0] == ' ';
            bool pre = !(starts || starts_space) &&
                       (n->scheme == PS_ALWAYS || (n->scheme == PS_FIRST && p->at_start));
            if (pre && sb_add(&tmp->text, rep, rl) != 0)
                return util_errf(err, errlen, "out of memory while pre-tokenizing.");
            for (size_t k = 0; k < p->len; k++) {
                int r = s[k] == ' ' ? sb_add(&tmp->text, rep, rl) : sb_add(&tmp->text, s + k, 1);
                if (r != 0)
                    return util_errf(err, errlen, "out of memory while pre-tokenizing.");
            }
            if (tk_pl_add(tmp, "", 0, -1, p->at_start) != 0)
                return util_errf(err, errlen, "out of memory while pre-tokenizing.");
            tmp->v[tmp->n - 1].off = off;
            tmp->v[tmp->n - 1].len = tmp->text.n - off;
        }
        plist t = *cur;
        *cur = *tmp;
        *tmp = t;
        if (n->flag_a)
            return split_step(&n->pat, B_MERGED_NEXT, false, rc, cur, tmp, err, errlen);
        return 0;
    }
    }
    return 0;
}

/* ---- decoders --------------------------------------------------------- */


void tk_sl_free(slist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].p);
    free(l->v);
    memset(l, 0, sizeof *l);
}

int tk_sl_push(slist *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        sbuf *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = (sbuf){0};
    if (sb_add(&l->v[l->n], s, len) != 0)
        return -1;
    l->n++;
    return 0;
}

/* Applies decoder n to the token list in place.  raw: produce raw bytes
 * (token_bytes), i.e. no lossy UTF-8 repair, no Strip, no first-token rule. */
int tk_dc_apply(const node *n, rx_ctx *rc, slist *l, bool raw, char *err, size_t errlen)
{
    slist o = {0};
    switch (n->kind) {
    case DC_SEQ:
        for (size_t i = 0; i < n->n_kids; i++)
            if (tk_dc_apply(&n->kids[i], rc, l, raw, err, errlen) != 0)
                return -1;
        return 0;
    case DC_BYTELEVEL: {
        sbuf all = {0};
        for (size_t i = 0; i < l->n; i++) {
            const sbuf *t = &l->v[i];
            size_t start = all.n;
            bool ok = true;
            for (size_t k = 0; k < t->n && ok;) {
                uint32_t cp;
                k += u8dec(t->p + k, t->n - k, &cp);
                if (cp < 0x144 && tk_cp_to_byte[cp] >= 0) {
                    uint8_t b = (uint8_t)tk_cp_to_byte[cp];
                    if (sb_add(&all, &b, 1) != 0)
                        goto oom_all;
                } else
                    ok = false;
            }
            if (!ok) {
                all.n = start;
                if (sb_add(&all, t->p, t->n) != 0)
                    goto oom_all;
            }
        }
        if (raw) {
            if (tk_sl_push(&o, all.p ? all.p : "", all.n) != 0)
                goto oom_all;
        } else {
            sbuf fixed = {0};
            if (tk_sb_add_lossy(&fixed, all.p ? all.p : "", all.n) != 0 || tk_sl_push(&o, fixed.p ? fixed.p : "", fixed.n) != 0) {
                free(fixed.p);
                goto oom_all;
            }
            free(fixed.p);
        }
        free(all.p);
        tk_sl_free(l);
        *l = o;
        return 0;
    oom_all:
        free(all.p);
        goto oom;
    }
    case DC_BYTEFALLBACK: {
        sbuf bytes = {0};
        size_t nbytes = 0;
        for (size_t i = 0; i <= l->n; i++) {
            const sbuf *t = i < l->n ? &l->v[i] : NULL;
            int byte = -1;
            if (t && t->n == 6 && memcmp(t->p, "<0x", 3) == 0 && t->p[5] == '>') {
                char hex[3] = {t->p[3], t->p[4], 0};
                char *end;
                bool plus_ok = hex[0] != '-' && hex[0] != ' ';
                long v = strtol(hex, &end, 16);
                if (plus_ok && *end == 0 && v >= 0 && v < 256 && !(hex[0] == '+' && hex[1] == '+'))
                    byte = (int)v;
            }
            if (byte >= 0) {
                uint8_t b = (uint8_t)byte;
                if (sb_add(&bytes, &b, 1) != 0)
                    goto oom_bf;
                nbytes++;
                continue;
            }
            if (nbytes) {
                if (raw || util_utf8_valid(bytes.p, bytes.n)) {
                    if (tk_sl_push(&o, bytes.p, bytes.n) != 0)
                        goto oom_bf;
                } else {
                    for (size_t k = 0; k < nbytes; k++)
                        if (tk_sl_push(&o, "\xEF\xBF\xBD", 3) != 0)
                            goto oom_bf;
                }
                bytes.n = 0;
                nbytes = 0;
            }
            if (t && tk_sl_push(&o, t->p ? t->p : "", t->n) != 0)
                goto oom_bf;
        }
        free(bytes.p);
        tk_sl_free(l);
        *l = o;
        return 0;
    oom_bf:
        free(bytes.p);
        goto oom;
    }
    case DC_FUSE: {
        sbuf all = {0};
        for (size_t i = 0; i < l->n; i++)
            if (sb_add(&all, l->v[i].p ? l->v[i].p : "", l->v[i].n) != 0) {
                free(all.p);
                goto oom;
            }
        if (tk_sl_push(&o, all.p ? all.p : "", all.n) != 0) {
            free(all.p);
            goto oom;
        }
        free(all.p);
        tk_sl_free(l);
        *l = o;
        return 0;
    }
    case DC_STRIP:
        if (raw)
            return 0;
        for (size_t i = 0; i < l->n; i++) {
            sbuf *t = &l->v[i];
            /* count characters from each end equal to the content character */
            size_t a = 0, cnt = 0;
            while (cnt < n->start && a < t->n) {
                uint32_t cp;
                size_t k = u8dec(t->p + a, t->n - a, &cp);
                if (cp != n->cp)
                    break;
                a += k;
                cnt++;
            }
            size_t b = t->n;
            cnt = 0;
            while (cnt < n->stop && b > a) {
                size_t k = b - 1;
                while (k > a && ((uint8_t)t->p[k] & 0xC0) == 0x80)
                    k--;
                uint32_t cp;
                u8dec(t->p + k, b - k, &cp);
                if (cp != n->cp)
                    break;
                b = k;
                cnt++;
            }
            memmove(t->p, t->p + a, b - a);
            t->n = b - a;
            t->p[t->n] = 0;
        }
        return 0;
    case DC_REPLACE:
        for (size_t i = 0; i < l->n; i++) {
            if (!l->v[i].p && sb_add(&l->v[i], "", 0) != 0)
                goto oom;
            if (replace_all(&n->pat, n->str, n->str_len, rc, &l->v[i], err, errlen) != 0)
                return -1;
        }
        return 0;
    case DC_METASPACE:
        for (size_t i = 0; i < l->n; i++) {
            sbuf nt = {0};
            const sbuf *t = &l->v[i];
            for (size_t k = 0; k < t->n;) {
                uint32_t cp;
                size_t cl = u8dec(t->p + k, t->n - k, &cp);
                int r = 0;
                if (cp == n->cp) {
                    if (!(i == 0 && !raw && n->scheme != PS_NEVER))
                        r = sb_add(&nt, " ", 1);
                } else
                    r = sb_add(&nt, t->p + k, cl);
                if (r != 0) {
                    free(nt.p);
                    goto oom;
                }
                k += cl;
            }
            if (sb_add(&nt, "", 0) != 0) {
                free(nt.p);
                goto oom;
            }
            free(l->v[i].p);
            l->v[i] = nt;
        }
        return 0;
    case DC_BPE:
        for (size_t i = 0; i < l->n; i++) {
            sbuf *t = &l->v[i];
            if (!t->p && sb_add(t, "", 0) != 0)
                goto oom;
            pattern lit = {.literal = n->str, .literal_len = n->str_len};
            bool last = i + 1 == l->n && !raw;
            if (replace_all(&lit, last ? "" : " ", last ? 0 : 1, rc, t, err, errlen) != 0)
                return -1;
        }
        return 0;
    }
    return 0;
oom:
    tk_sl_free(&o);
    return util_errf(err, errlen, "out of memory while decoding.");
}

