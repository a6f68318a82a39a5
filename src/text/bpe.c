/*
 * bpe.c — the BPE model: one pre-token in, ids out.
 *
 * Owns: the hash maps (piece -> id, id pair -> merge) and the merge loop.
 * Does not own: vocabularies' strings (tokenizer.c's arena), normalization,
 * splitting, added tokens.
 *
 * Key decision: the merge loop is tokenizers' Word::merge_all, not the naive
 * "rescan all pairs after each merge" loop, which is O(n^2) per pre-token
 * (50,000 '_' took seconds in implementations that did that).  Symbols live
 * in an array linked by prev/next; every adjacent pair with a merge rule sits
 * in a (4-ary) min-heap keyed by (rank, position).  Popping an entry whose
 * symbols have changed since it was pushed is detected by re-looking-up the
 * pair and comparing the merged id, exactly as the reference does, so ties
 * and stale entries resolve identically: lowest rank first, then leftmost.
 */
#include "bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t hash_bytes(const char *s, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    return h;
}

static size_t cap_for(size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2 + 16)
        cap <<= 1;
    return cap;
}

int tk_strmap_init(strmap *m, size_t expected)
{
    m->cap = cap_for(expected);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

int32_t tk_strmap_get(const strmap *m, const char *s, size_t len)
{
    if (!m->slots)
        return -1;
    uint32_t h = hash_bytes(s, len);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const strmap_slot *e = &m->slots[i];
        if (!e->s)
            return -1;
        if (e->hash == h && e->len == len && memcmp(e->s, s, len) == 0)
            return e->val;
    }
}

static int strmap_grow(strmap *m)
{
    strmap bigger = {calloc(m->cap * 2, sizeof(strmap_slot)), m->cap * 2, m->n};
    if (!bigger.slots)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].s)
            continue;
        size_t j = m->slots[i].hash & (bigger.cap - 1);
        while (bigger.slots[j].s)
            j = (j + 1) & (bigger.cap - 1);
        bigger.slots[j] = m->slots[i];
    }
    free(m->slots);
    *m = bigger;
    return 0;
}

int tk_strmap_put(strmap *m, const char *s, size_t len, int32_t val)
{
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m) != 0)
        return -1;
    uint32_t h = hash_bytes(s, len);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        strmap_slot *e = &m->slots[i];
        if (!e->s) {
            *e = (strmap_slot){s, (uint32_t)len, h, val};
            m->n++;
            return 0;
        }
        if (e->hash == h && e->len == len && memcmp(e->s, s, len) == 0) {
            e->val = val;
            return 0;
        }
    }
}

void tk_strmap_free(strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

int tk_pairmap_init(pairmap *m, size_t expected)
{
    m->cap = cap_for(expected);
    m->n = 0;
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        m->slots[i].key = UINT64_MAX;
    return 0;
}

const pairmap_slot *tk_pairmap_get(const pairmap *m, int32_t a, int32_t b)
{
    if (!m->slots)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = hash_u64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key)
            return &m->slots[i];
        if (m->slots[i].key == UINT64_MAX)
            return NULL;
    }
}

int tk_pairmap_put(pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id)
{
    if ((m->n + 1) * 2 > m->cap) {
        pairmap bigger;
        if (tk_pairmap_init(&bigger, m->cap) != 0)
            return -1;
        for (size_t i = 0; i < m->cap; i++) {
            if (m->slots[i].key == UINT64_MAX)
                continue;
            size_t j = hash_u64(m->slots[i].key) & (bigger.cap - 1);
            while (bigger.slots[j].key != UINT64_MAX)
                j = (j + 1) & (bigger.cap - 1);
            bigger.slots[j] = m->slots[i];
            bigger.n++;
        }
        free(m->slots);
        *m = bigger;
    }
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = hash_u64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key || m->slots[i].key == UINT64_MAX) {
            if (m->slots[i].key == UINT64_MAX)
                m->n++;
            m->slots[i] = (pairmap_slot){key, rank, new_id};
            return 0;
        }
    }
}

void tk_pairmap_free(pairmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

int tk_ivec_push(ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ---- the merge loop ---------------------------------------------------- */

typedef struct {
    int32_t id;
    int32_t prev, next; /* symbol indices, -1 at the ends */
    uint32_t len;       /* bytes of the original text covered; 0 = merged away */
} symbol;

typedef struct {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} cand;

static bool cand_less(const cand *a, const cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

/* A 4-ary min-heap: half the depth of a binary one, and the four children
 * share a cache line, which is what long pre-tokens (1 MB of one class) pay for. */
static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (!cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0];
    cand last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t first = 4 * i + 1, best;
        if (first >= *n)
            break;
        best = first;
        size_t end = first + 4 < *n ? first + 4 : *n;
        for (size_t k = first + 1; k < end; k++)
            if (cand_less(&h[k], &h[best]))
                best = k;
        if (!cand_less(&h[best], &last))
            break;
        h[i] = h[best];
        i = best;
    }
    if (*n)
        h[i] = last;
    return top;
}

static size_t utf8_char_len(uint8_t c)
{
    return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}

/* Looks up one character, with the continuing-subword prefix / end-of-word
 * suffix decorations tokenizers applies before the lookup. */
static int32_t lookup_char(const bpe *m, const char *c, size_t clen, bool first, bool last, char *scratch,
                           size_t scratch_cap)
{
    if ((first || !m->prefix) && (!last || !m->suffix))
        return tk_strmap_get(&m->vocab, c, clen);
    size_t n = 0;
    if (!first && m->prefix) {
        size_t pl = strlen(m->prefix);
        if (pl + clen + 1 > scratch_cap)
            return -1;
        memcpy(scratch, m->prefix, pl);
        n = pl;
    }
    memcpy(scratch + n, c, clen);
    n += clen;
    if (last && m->suffix) {
        size_t sl = strlen(m->suffix);
        if (n + sl > scratch_cap)
            return -1;
        memcpy(scratch + n, m->suffix, sl);
        n += sl;
    }
    return tk_strmap_get(&m->vocab, scratch, n);
}

int bpe_encode(const bpe *m, const char *s, size_t len, ivec *out)
{
    if (len == 0)
        return 0;
    if (m->ignore_merges) {
        int32_t id = tk_strmap_get(&m->vocab, s, len);
        if (id >= 0)
            return tk_ivec_push(out, id);
    }
    /* One symbol per character at most, plus up to 4 byte-fallback symbols per character. */
    size_t max_syms = len;
    /* Most pre-tokens are short: keep them off the allocator. */
    symbol sym_stack[64];
    cand heap_stack[128];
    symbol *sym = max_syms <= 64 ? sym_stack : malloc(max_syms * sizeof *sym);
    cand *heap = NULL;
    int rc = -1;
    if (!sym)
        return -1;
    size_t ns = 0;
    int32_t unk_pending = -1; /* fused unk: id pending, with its byte length */
    uint32_t unk_len = 0;
    char scratch[256];
#define ADD_SYM(ID, LEN)                                                                                               \
    do {                                                                                                               \
        sym[ns] = (symbol){(ID), (int32_t)ns - 1, (int32_t)ns + 1, (LEN)};                                             \
        ns++;                                                                                                          \
    } while (0)
    for (size_t i = 0; i < len;) {
        size_t cl = utf8_char_len((uint8_t)s[i]);
        if (cl > len - i)
            cl = len - i;
        bool first = i == 0, last = i + cl == len;
        int32_t id = lookup_char(m, s + i, cl, first, last, scratch, sizeof scratch);
        if (id >= 0) {
            if (unk_pending >= 0) {
                ADD_SYM(unk_pending, unk_len);
                unk_pending = -1;
            }
            ADD_SYM(id, (uint32_t)cl);
        } else {
            bool done = false;
            if (m->byte_fallback) {
                /* The reference looks the decorated string's bytes up; decorations are
                 * only ever set on byte-level vocabularies, which never use byte_fallback. */
                bool all = true;
                for (size_t k = 0; k < cl; k++)
                    all = all && m->byte_id[(uint8_t)s[i + k]] >= 0;
                if (all) {
                    /* Note: tokenizers does not flush a pending unk here; neither do we. */
                    for (size_t k = 0; k < cl; k++)
                        ADD_SYM(m->byte_id[(uint8_t)s[i + k]], 1);
                    done = true;
                }
            }
            if (!done && m->unk_id >= 0) {
                if (unk_pending >= 0 && m->fuse_unk) {
                    unk_len += (uint32_t)cl;
                } else {
                    if (unk_pending >= 0)
                        ADD_SYM(unk_pending, unk_len);
                    unk_pending = m->unk_id;
                    unk_len = (uint32_t)cl;
                }
            }
        }
        i += cl;
    }
    if (unk_pending >= 0)
        ADD_SYM(unk_pending, unk_len);
#undef ADD_SYM
    if (ns == 0) {
        rc = 0;
        goto out;
    }
    sym[ns - 1].next = -1;

    size_t heap_cap = ns + 1;
    heap = heap_cap <= 128 ? heap_stack : malloc(heap_cap * sizeof *heap);
    if (!heap)
        goto out;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const pairmap_slot *p = tk_pairmap_get(&m->merges, sym[i].id, sym[i + 1].id);
        if (p)
            heap_push(heap, &nh, (cand){p->rank, (uint32_t)i, p->new_id});
    }
    /* Each merge removes one symbol and pushes at most two candidates, so the
     * heap never holds more than 2 * ns entries; grow lazily. */
    while (nh > 0) {
        cand top = heap_pop(heap, &nh);
        symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        symbol *right = &sym[cur->next];
        const pairmap_slot *p = tk_pairmap_get(&m->merges, cur->id, right->id);
        if (!p || p->new_id != top.new_id)
            continue;
        cur->id = top.new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0)
            sym[cur->next].prev = (int32_t)top.pos;
        if (nh + 2 > heap_cap) {
            cand *h2 = heap == heap_stack ? malloc((heap_cap * 2 + 2) * sizeof *heap)
                                          : realloc(heap, (heap_cap * 2 + 2) * sizeof *heap);
            if (!h2)
                goto out;
            if (heap == heap_stack)
                memcpy(h2, heap_stack, nh * sizeof *heap);
            heap = h2;
            heap_cap = heap_cap * 2 + 2;
        }
        if (cur->prev >= 0) {
            const pairmap_slot *q = tk_pairmap_get(&m->merges, sym[cur->prev].id, cur->id);
            if (q)
                heap_push(heap, &nh, (cand){q->rank, (uint32_t)cur->prev, q->new_id});
        }
        if (cur->next >= 0) {
            const pairmap_slot *q = tk_pairmap_get(&m->merges, cur->id, sym[cur->next].id);
            if (q)
                heap_push(heap, &nh, (cand){q->rank, top.pos, q->new_id});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (sym[i].len != 0 && tk_ivec_push(out, sym[i].id) != 0)
            goto out;
    rc = 0;
out:
    if (heap != heap_stack)
        free(heap);
    if (sym != sym_stack)
        free(sym);
    return rc;
}

void bpe_free(bpe *m)
{
    tk_strmap_free(&m->vocab);
    tk_pairmap_free(&m->merges);
    free(m->prefix);
    free(m->suffix);
    m->prefix = m->suffix = NULL;
}
