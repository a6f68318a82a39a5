/*
 * token_mask.h — which tokens of the vocabulary a grammar state accepts, as a bitset of V bits, cached per
 * (grammar, state) and shared by every row of a job.  grammar.h owns the states; sampling applies the mask
 * (token_mask_apply: −inf outside it) before the row's normal sampler.
 *
 *     token_mask_open(tok, V, stop_ids, n_stop, threads, cache_bytes, &tm, …)   once per job (per tokenizer)
 *     per row per step:  token_mask_get(tm, tid, g, &state, allow)  then  token_mask_apply(allow, logits, V)
 *
 * Thread safety: token_mask_get may run on `threads` threads at once, each with its own tid.
 */
#ifndef SPILL_TOKEN_MASK_H
#define SPILL_TOKEN_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "../text/tokenizer.h"
#include "grammar.h"

typedef struct token_mask token_mask;

typedef struct token_mask_stats {
    uint64_t hits, misses; /* token_mask_get calls answered from the cache, and computed */
    uint64_t resets;       /* times the full cache was emptied to make room */
    double miss_s;         /* seconds spent computing masks (summed over threads) */
    int32_t n_tokens;      /* tokens a grammar can use (V minus special, empty and unknown ids) */
    int32_t max_len;       /* the longest token's bytes */
    size_t cache_entries;  /* masks the cache holds at most */
} token_mask_stats;

/*
 * Indexes the vocabulary of tok for a model of V logits (ids >= the tokenizer's size are never allowed):
 * token byte strings sorted, with each one's common prefix with the one before, so one pass over the list
 * visits every distinct prefix once (a trie walk without the trie).  Special tokens and tokens without bytes
 * are never allowed inside the grammar; stop_ids (n_stop, the model's end-of-turn set) are allowed exactly
 * when the state can end.  cache_bytes bounds the mask cache (at least 64 masks are kept).  0, or -1 with a
 * sentence.
 */
int token_mask_open(const tokenizer *tok, int V, const int32_t *stop_ids, size_t n_stop, int threads,
                    size_t cache_bytes, token_mask **out, char *err, size_t errlen);

/* The mask cache a job opens (run.c) and the memory plan counts (plan.c): a cap, with the cache emptied
 * whole when three quarters full.  A 500-row job of six schemas on a 49k vocabulary met ~6,000 states
 * (about 42 MB of masks). */
#define TOKEN_MASK_CACHE_BYTES ((size_t)128 << 20)

/* The most bytes token_mask_open(…, V, …, threads, cache_bytes, …) and the runner's per-thread masks hold:
 * the cache's slots (at most cache_bytes), the sorted vocabulary, the walks (tokens of up to 256 bytes
 * assumed) and one mask per thread.  For the memory plan, before the masks are opened. */
size_t token_mask_plan_bytes(int V, int threads, size_t cache_bytes);

/* What an open one holds (its allocations; the cache slots count whole, touched or not). */
size_t token_mask_bytes(const token_mask *tm);

/* Safe on NULL. */
void token_mask_close(token_mask *tm);

/* 64-bit words of one mask: ceil(V / 64). */
size_t token_mask_words(const token_mask *tm);

/*
 * Fills allow (token_mask_words words; bit i of word i/64 = token i) with the tokens whose bytes state s of
 * grammar g accepts, plus the stop ids when s can end; from the cache when (g, s) was seen, else computed
 * and cached.  Should nothing be allowed (a grammar the vocabulary cannot spell), the stop ids are, so the
 * row ends rather than fails.  Returns the number of allowed tokens.  tid in [0, threads).
 */
int32_t token_mask_get(token_mask *tm, int tid, const grammar *g, const gstate *s, uint64_t *allow);

/* The same, never cached (benchmarks, tests). */
int32_t token_mask_compute(token_mask *tm, int tid, const grammar *g, const gstate *s, uint64_t *allow);

/* Sets logits (V) outside allow to −inf. */
void token_mask_apply(const uint64_t *allow, float *logits, int V);

void token_mask_get_stats(token_mask *tm, token_mask_stats *out);

#endif
