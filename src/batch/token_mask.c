/*
 * token_mask.c — grammar state → allowed tokens, for every row of a job.
 *
 * Owns: the vocabulary's byte strings in sorted order, the walk that feeds them to a grammar state, and the
 * cache of masks.  Does not own: the grammar (grammar.c), the logits or the sampler (run.c, sample.c).
 *
 * The walk (token_mask_compute): tokens sorted by their bytes, each with lcp = the bytes it shares with the
 * token before.  One state per depth is kept: states[d] = the state after the current token's first d bytes.
 * A token starts from states[lcp] (its prefix was already fed for the token before) and feeds only its own
 * suffix; when a byte at depth r is refused, every following token sharing those r + 1 bytes is skipped
 * without a feed.  The cost is one feed per distinct prefix the grammar accepts (plus one per refused
 * branch) — a trie walk without building a trie: ~10^5 feeds for a 49k vocabulary inside a free string, a
 * few hundred after '{' where only a few bytes are allowed.
 *
 * The cache: masks keyed by (grammar id, the state's canonical bytes), in an open-addressing table of fixed
 * size that is emptied whole when three quarters full (simple, and rare: rows of one schema meet a few
 * hundred distinct states; a state in the middle of a free string is the same state for every row and every
 * character).  At batch 1,000+ nearly every lookup is a hit, so a step costs one hash, one compare and one
 * copy of V/8 bytes per row.  Hits copy the mask out under the lock, so an entry may be evicted at any time;
 * misses compute outside the lock (two threads may compute the same state once each: harmless).
 *
 * Markers (a wrap's "<tool_call>", "[TOOL_CALLS]"): where the state stands at one and the vocabulary has a
 * token of exactly its bytes, that token alone is allowed (even a special one, which the walk otherwise
 * never allows), and along the walk no token may reach a marker's start with bytes left, so the marker is
 * never spelled in pieces: the model sees the token its template taught it.
 *
 * Left out: splitting tokens into context-independent and context-dependent sets per automaton position
 * (XGrammar's scheme) — it makes misses cheaper, and misses are not what a pass pays for here (measured:
 * tests/test_grammar.c's timing lines, bench in the report).
 */
#include "token_mask.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/util.h"

typedef struct tm_tok {
    const uint8_t *b; /* borrowed from the tokenizer */
    uint32_t len;
    int32_t id;
} tm_tok;

typedef struct tm_key {
    uint64_t hash, gid;
    int32_t used, n_allowed;
} tm_key;

struct token_mask {
    const tokenizer *tok; /* borrowed: marker lookups (grammar_wrap) */
    int V;
    size_t words;
    tm_tok *toks;    /* (n_toks) sorted by bytes */
    uint32_t *lcp;   /* (n_toks) bytes shared with the token before (0 for the first) */
    int32_t n_toks, max_len;
    int32_t *stop;   /* (n_stop) ids < V */
    size_t n_stop;
    int threads;
    gstate **walk;   /* (threads) each (max_len + 1) states */
    pthread_mutex_t mu;
    size_t cap, count; /* cache slots (a power of two), and those used */
    tm_key *keys;      /* (cap) */
    gstate *states;    /* (cap) */
    uint64_t *masks;   /* (cap, words) */
    token_mask_stats st;
};

static int tok_cmp(const void *pa, const void *pb)
{
    const tm_tok *a = pa, *b = pb;
    int c = memcmp(a->b, b->b, a->len < b->len ? a->len : b->len);
    if (c)
        return c;
    return a->len != b->len ? (a->len > b->len) - (a->len < b->len) : (a->id > b->id) - (a->id < b->id);
}

/* Cache slots for cache_bytes: a power of two, at least 64, whose entries fit in cache_bytes. */
static size_t cache_slots(size_t words, size_t cache_bytes)
{
    size_t per = sizeof(tm_key) + sizeof(gstate) + words * sizeof(uint64_t), cap = 64;
    while (cap * 2 * per <= cache_bytes)
        cap *= 2;
    return cap;
}

size_t token_mask_plan_bytes(int V, int threads, size_t cache_bytes)
{
    size_t words = ((size_t)(V > 0 ? V : 0) + 63) / 64, t = (size_t)(threads > 0 ? threads : 1);
    size_t per = sizeof(tm_key) + sizeof(gstate) + words * sizeof(uint64_t);
    return cache_slots(words, cache_bytes) * per + (size_t)V * (sizeof(tm_tok) + sizeof(uint32_t)) +
           t * (257 * sizeof(gstate) + words * sizeof(uint64_t)) + sizeof(token_mask);
}

size_t token_mask_bytes(const token_mask *tm)
{
    size_t per = sizeof(tm_key) + sizeof(gstate) + tm->words * sizeof(uint64_t);
    return tm->cap * per + (size_t)tm->n_toks * (sizeof(tm_tok) + sizeof(uint32_t)) +
           (size_t)tm->threads * ((size_t)(tm->max_len + 1) * sizeof(gstate) + tm->words * sizeof(uint64_t)) +
           sizeof *tm;
}

int token_mask_open(const tokenizer *tok, int V, const int32_t *stop_ids, size_t n_stop, int threads,
                    size_t cache_bytes, token_mask **out, char *err, size_t errlen)
{
    *out = NULL;
    token_mask *tm = calloc(1, sizeof *tm);
    if (!tm)
        return util_errf(err, errlen, "out of memory for the token masks.");
    pthread_mutex_init(&tm->mu, NULL);
    tm->tok = tok;
    tm->V = V;
    tm->words = ((size_t)V + 63) / 64;
    tm->threads = threads > 0 ? threads : 1;
    size_t nv = tokenizer_vocab_size(tok);
    if (nv > (size_t)V)
        nv = (size_t)V;
    tm->toks = malloc((nv ? nv : 1) * sizeof *tm->toks);
    tm->lcp = malloc((nv ? nv : 1) * sizeof *tm->lcp);
    tm->stop = malloc((n_stop ? n_stop : 1) * sizeof *tm->stop);
    if (!tm->toks || !tm->lcp || !tm->stop)
        goto out_oom;
    for (size_t i = 0; i < n_stop; i++)
        if (stop_ids[i] >= 0 && stop_ids[i] < V)
            tm->stop[tm->n_stop++] = stop_ids[i];
    for (size_t i = 0; i < nv; i++) {
        size_t len;
        const uint8_t *b = tokenizer_token_bytes(tok, (int32_t)i, &len);
        bool is_stop = false;
        for (size_t k = 0; k < tm->n_stop; k++)
            is_stop |= tm->stop[k] == (int32_t)i;
        if (!b || !len || len > UINT32_MAX || is_stop || tokenizer_is_special(tok, (int32_t)i))
            continue;
        tm->toks[tm->n_toks++] = (tm_tok){b, (uint32_t)len, (int32_t)i};
        if ((int32_t)len > tm->max_len)
            tm->max_len = (int32_t)len;
    }
    qsort(tm->toks, (size_t)tm->n_toks, sizeof *tm->toks, tok_cmp);
    for (int32_t i = 0; i < tm->n_toks; i++) {
        uint32_t l = 0;
        if (i > 0) {
            const tm_tok *a = &tm->toks[i - 1], *b = &tm->toks[i];
            while (l < a->len && l < b->len && a->b[l] == b->b[l])
                l++;
        }
        tm->lcp[i] = l;
    }
    tm->walk = calloc((size_t)tm->threads, sizeof *tm->walk);
    if (!tm->walk)
        goto out_oom;
    for (int t = 0; t < tm->threads; t++)
        if (!(tm->walk[t] = malloc(((size_t)tm->max_len + 1) * sizeof(gstate))))
            goto out_oom;
    tm->cap = cache_slots(tm->words, cache_bytes);
    tm->keys = calloc(tm->cap, sizeof *tm->keys);
    tm->states = malloc(tm->cap * sizeof *tm->states);
    tm->masks = malloc(tm->cap * tm->words * sizeof *tm->masks);
    if (!tm->keys || !tm->states || !tm->masks)
        goto out_oom;
    tm->st.n_tokens = tm->n_toks;
    tm->st.max_len = tm->max_len;
    tm->st.cache_entries = tm->cap * 3 / 4;
    *out = tm;
    return 0;
out_oom:
    token_mask_close(tm);
    return util_errf(err, errlen, "out of memory for the token masks of a %d-token vocabulary.", V);
}

void token_mask_close(token_mask *tm)
{
    if (!tm)
        return;
    for (int t = 0; tm->walk && t < tm->threads; t++)
        free(tm->walk[t]);
    free(tm->walk);
    free(tm->toks);
    free(tm->lcp);
    free(tm->stop);
    free(tm->keys);
    free(tm->states);
    free(tm->masks);
    pthread_mutex_destroy(&tm->mu);
    free(tm);
}

size_t token_mask_words(const token_mask *tm)
{
    return tm->words;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The token whose bytes are exactly the marker state s stands at (special or not, never a stop id), or -1
 * when s is at no marker or the vocabulary spells it only in pieces. */
static int32_t marker_token(const token_mask *tm, const grammar *g, const gstate *s)
{
    const uint8_t *mt;
    size_t ml, bl;
    if (!gstate_marker(g, s, &mt, &ml))
        return -1;
    int32_t id = tokenizer_token_id(tm->tok, (const char *)mt, ml);
    const uint8_t *b = id >= 0 && id < tm->V ? tokenizer_token_bytes(tm->tok, id, &bl) : NULL;
    if (!b || bl != ml || memcmp(b, mt, ml))
        return -1;
    for (size_t k = 0; k < tm->n_stop; k++)
        if (tm->stop[k] == id)
            return -1;
    return id;
}

int32_t token_mask_compute(token_mask *tm, int tid, const grammar *g, const gstate *s, uint64_t *allow)
{
    memset(allow, 0, tm->words * sizeof *allow);
    bool marks = grammar_has_markers(g);
    int32_t mid = marks ? marker_token(tm, g, s) : -1;
    if (mid >= 0) { /* a marker the vocabulary has as one token: that token alone (it may be special) */
        allow[mid >> 6] |= 1ull << (mid & 63);
        return 1;
    }
    gstate *st = tm->walk[tid];
    gstate_copy(&st[0], s);
    uint32_t rej = UINT32_MAX; /* the depth where the last walked token's bytes were refused */
    int32_t n = 0;
    for (int32_t i = 0; i < tm->n_toks; i++) {
        const tm_tok *t = &tm->toks[i];
        uint32_t d = tm->lcp[i];
        if (d > rej)
            continue; /* shares the refused prefix */
        for (; d < t->len; d++) {
            if (marks && d > 0 && marker_token(tm, g, &st[d]) >= 0)
                break; /* the token would spell, in pieces, a marker that has its own token */
            gstate_copy(&st[d + 1], &st[d]);
            if (gstate_feed(g, &st[d + 1], t->b[d]))
                break;
        }
        if (d < t->len) {
            rej = d;
            continue;
        }
        rej = UINT32_MAX;
        allow[t->id >> 6] |= 1ull << (t->id & 63);
        n++;
    }
    if (n == 0 || gstate_can_end(g, s))
        for (size_t k = 0; k < tm->n_stop; k++) {
            int32_t id = tm->stop[k];
            n += !(allow[id >> 6] >> (id & 63) & 1);
            allow[id >> 6] |= 1ull << (id & 63);
        }
    return n;
}

static uint64_t state_hash(uint64_t gid, const gstate *s)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t n = gstate_bytes(s);
    uint64_t h = 1469598103934665603ull ^ gid;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* The slot of (hash, gid, s), or the empty slot where it would go.  Under the lock. */
static size_t find_slot(const token_mask *tm, uint64_t h, uint64_t gid, const gstate *s, bool *hit)
{
    size_t i = h & (tm->cap - 1), n = gstate_bytes(s);
    for (;;) {
        const tm_key *k = &tm->keys[i];
        if (!k->used) {
            *hit = false;
            return i;
        }
        if (k->hash == h && k->gid == gid && tm->states[i].depth == s->depth && !memcmp(&tm->states[i], s, n)) {
            *hit = true;
            return i;
        }
        i = (i + 1) & (tm->cap - 1);
    }
}

int32_t token_mask_get(token_mask *tm, int tid, const grammar *g, const gstate *s, uint64_t *allow)
{
    uint64_t gid = grammar_id(g), h = state_hash(gid, s);
    bool hit;
    pthread_mutex_lock(&tm->mu);
    size_t i = find_slot(tm, h, gid, s, &hit);
    if (hit) {
        memcpy(allow, tm->masks + i * tm->words, tm->words * sizeof *allow);
        int32_t n = tm->keys[i].n_allowed;
        tm->st.hits++;
        pthread_mutex_unlock(&tm->mu);
        return n;
    }
    pthread_mutex_unlock(&tm->mu);
    double t0 = now_s();
    int32_t n = token_mask_compute(tm, tid, g, s, allow);
    double dt = now_s() - t0;
    pthread_mutex_lock(&tm->mu);
    tm->st.misses++;
    tm->st.miss_s += dt;
    if (tm->count + 1 > tm->cap * 3 / 4) {
        memset(tm->keys, 0, tm->cap * sizeof *tm->keys);
        tm->count = 0;
        tm->st.resets++;
    }
    i = find_slot(tm, h, gid, s, &hit);
    if (!hit) {
        tm->keys[i] = (tm_key){h, gid, 1, n};
        gstate_copy(&tm->states[i], s);
        memcpy(tm->masks + i * tm->words, allow, tm->words * sizeof *allow);
        tm->count++;
    }
    pthread_mutex_unlock(&tm->mu);
    return n;
}

void token_mask_apply(const uint64_t *allow, float *logits, int V)
{
    for (int w = 0; w * 64 < V; w++) {
        uint64_t m = allow[w];
        if (m == ~0ull)
            continue;
        int end = V - w * 64 < 64 ? V - w * 64 : 64;
        float *l = logits + (size_t)w * 64;
        if (m == 0) { /* most words outside strings: a plain fill the compiler vectorises */
            for (int j = 0; j < end; j++)
                l[j] = -INFINITY;
            continue;
        }
        for (int j = 0; j < end; j++)
            if (!(m >> j & 1))
                l[j] = -INFINITY;
    }
}

void token_mask_get_stats(token_mask *tm, token_mask_stats *out)
{
    pthread_mutex_lock(&tm->mu);
    *out = tm->st;
    pthread_mutex_unlock(&tm->mu);
}
