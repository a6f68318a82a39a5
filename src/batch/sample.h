/*
 * sample.h — picking the next token of one row (or one of its `n` choices)
 * from that row's fp32 logits, with OpenAI's sampling semantics, and the
 * log-probs OpenAI's `logprobs` / spill's `--logprobs K` report.
 *
 * Three objects, three lifetimes:
 *   sample_params   what the request asked for (borrowed logit_bias arrays);
 *                   one per row, read-only while sampling.
 *   sample_state    per row AND per choice: the RNG and the counts of tokens
 *                   generated so far (for the penalties).  Allocated once at
 *                   admission, never in the per-token path.
 *   sample_scratch  per worker thread, sized once for the vocabulary V; any
 *                   row may use it, one row at a time.
 *
 * Per token:  sample_next(logits, V, params, state, scratch, &res, …)  then
 *             sample_observe(state, res.token, …)  once the token is kept.
 *
 * Reproducibility: a row's draws come only from its own state, so the same
 * (seed, stream) and the same logits give the same tokens whatever other rows
 * share the pass and in whatever order the rows are sampled (see sample.c).
 */
#ifndef SPILL_SAMPLE_H
#define SPILL_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SAMPLE_MAX_TOP 64               /* most top log-probs per token (OpenAI shape up to 20; distillation 64) */
#define SAMPLE_LOGPROB_FLOOR (-9999.0f) /* OpenAI's sentinel: no reported log-prob is below it (never -inf) */

/*
 * The request's sampling fields, after OpenAI's defaults (request.h's
 * req_sampling maps one to one; top_k is spill's extension).
 */
typedef struct sample_params {
    float temperature;            /* 0 = greedy (argmax); else in (0, 2] by OpenAI's rule, any > 0 works */
    float top_p;                  /* nucleus mass in [0, 1]; >= 1 = off; 0 keeps only the most likely token */
    int top_k;                    /* 0 = off (OpenAI has no top_k: none is applied by default) */
    float frequency_penalty;      /* subtracted × count of the token in this row's generated tokens */
    float presence_penalty;       /* subtracted once if that count > 0 */
    size_t n_logit_bias;          /* entries in the two arrays below */
    const int32_t *logit_bias_id; /* (n_logit_bias) borrowed; in [0, V) (sample_params_check) */
    const float *logit_bias;      /* (n_logit_bias) borrowed; added to the logit; ±100 bans / forces */
    bool logprobs;                /* fill sample_result.logprob (costs one more exp pass over V) */
    int n_top_logprobs;           /* 0..SAMPLE_MAX_TOP alternatives to report per token (needs logprobs) */
    /* vLLM's extensions */
    float min_p;                  /* 0 = off; else keep tokens whose probability is >= min_p x the most likely's */
    float repetition_penalty;     /* 0 or 1 = off; else every token of the prompt or generated so far has its logit
                                     divided by it when positive, multiplied when negative (once per token) */
    const int32_t *prompt;        /* (n_prompt) borrowed: the row's prompt ids, for repetition_penalty */
    size_t n_prompt;
} sample_params;

/* Per row/choice state.  Fields are private to sample.c; embed it, never copy a live one. */
typedef struct sample_state {
    uint64_t rng[4]; /* xoshiro256** state */
    int32_t *ids;    /* (cap) distinct generated token ids, in first-seen order */
    int32_t *counts; /* (cap) how often ids[i] was generated */
    int32_t *slot;   /* (2^slot_bits) open-addressing index into ids, -1 = empty */
    uint32_t slot_bits;
    int32_t n, cap; /* distinct tokens seen, and the most it can hold */
    int V;
} sample_state;

#define SAMPLE_BUCKETS 2032 /* weight histogram: 16 buckets per halving down to the smallest float */

/* Per worker scratch, sized for one vocabulary.  Private fields. */
typedef struct sample_scratch {
    int V;
    float *z;                       /* (V) working logits of the row being sampled */
    float *e;                       /* (V) weights exp((z - max z) / T) */
    uint64_t *cand;                 /* (V) candidate keys (weight bits, id) for top-k / top-p */
    double hmass[SAMPLE_BUCKETS];   /* weight per histogram bucket */
    int32_t hcount[SAMPLE_BUCKETS]; /* ids per histogram bucket */
} sample_scratch;

/* What sample_next picked, and the log-probs of the UNMODIFIED model distribution. */
typedef struct sample_result {
    int32_t token; /* always in [0, V) */
    float logprob; /* log-softmax(logits)[token], >= SAMPLE_LOGPROB_FLOOR; 0 without params->logprobs */
    int n_top;     /* params->n_top_logprobs with params->logprobs, else 0 */
    int32_t top_id[SAMPLE_MAX_TOP];    /* (n_top) most likely ids, descending; ties → lower id first */
    float top_logprob[SAMPLE_MAX_TOP]; /* (n_top) their log-probs, same floor */
} sample_result;

/*
 * Checks params against a vocabulary of V tokens: temperature >= 0 and
 * finite, top_p in [0, 1], top_k >= 0, penalties finite, biases finite,
 * n_top_logprobs in [0, min(SAMPLE_MAX_TOP, V)].  Returns 0, or -1 with one
 * sentence naming the field.  sample_next assumes params passed this.
 */
int sample_params_check(const sample_params *p, int V, char *err, size_t errlen);

/*
 * Prepares the state of one choice.  The RNG is keyed by (seed, stream):
 * for a request with a seed pass (seed, choice index); without one, a
 * job-level random value and a stream unique to the row and choice.
 * max_generated bounds how many tokens this choice will generate (max_tokens,
 * or the context room left); the penalty counts are allocated for
 * min(max_generated, V) distinct ids, and only when a penalty is non-zero.
 * Returns 0, or -1 (out of memory / bad bound) with a sentence; *st is then
 * safe to pass to sample_state_free.
 */
int sample_state_init(sample_state *st, const sample_params *p, uint64_t seed, uint64_t stream, int V,
                      int64_t max_generated, char *err, size_t errlen);

/* Frees what the state owns and zeroes it; safe on a zeroed or failed state. */
void sample_state_free(sample_state *st);

/*
 * Records that `token` was generated (counts feed the penalties of the next
 * steps).  A no-op when the row has no penalties.  Fails (-1, sentence) only
 * when more distinct ids arrive than max_generated promised.
 */
int sample_observe(sample_state *st, int32_t token, char *err, size_t errlen);

/* Allocates scratch for vocabularies up to V tokens.  -1 with a sentence on failure. */
int sample_scratch_init(sample_scratch *sc, int V, char *err, size_t errlen);
void sample_scratch_free(sample_scratch *sc);

/*
 * Picks the next token from logits (V) of one row:
 *   z = logits + logit_bias − count·frequency_penalty − [count>0]·presence_penalty
 *   temperature == 0: argmax z (ties → lowest id), no RNG draw;
 *   else p = softmax(z / T), restricted to the top_k most likely (if set),
 *   then to the smallest most-likely prefix of mass >= top_p (renormalised),
 *   and one draw from the state's RNG picks from what remains.
 * NaN logits count as -inf.  out->logprob/top_* are log-softmax(logits) of the
 * raw logits (before bias, penalties, temperature), as vLLM's default and
 * OpenAI report.  Cost O(V) plus a sort of the top-p/top-k candidates only.
 * Returns 0; or -1 with a sentence when no token is drawable (every logit NaN
 * or -inf, or V larger than the scratch), out->token then 0.
 */
int sample_next(const float *logits, int V, const sample_params *p, sample_state *st, sample_scratch *sc,
                sample_result *out, char *err, size_t errlen);

/*
 * Speculative verification (see sample.c): the draw sample_next would make for these logits once the choice had
 * also generated ahead[0..n_ahead) (the penalties count them, and the draw is the RNG's (n_ahead + 1)-th value
 * from the state), without changing st, so the positions of one decode step may be drawn in parallel.  The
 * caller keeps the positions whose draw equals the next proposal, then calls sample_skip with the number kept.
 * Returns as sample_next.
 */
int sample_next_ahead(const float *logits, int V, const sample_params *p, const sample_state *st,
                      const int32_t *ahead, int n_ahead, sample_scratch *sc, sample_result *out, char *err,
                      size_t errlen);

/* Advances st's RNG past the draws of n sampled steps (none for temperature 0): after a speculative step kept n
 * tokens drawn by sample_next_ahead. */
void sample_skip(sample_state *st, const sample_params *p, int n);

/*
 * Teacher forcing (scoring, echo): out->token = target, out->logprob its log-softmax of the raw logits and the
 * n_top most likely alternatives, with sample_next's numerics (the GPU's target pick matches it).  -1 with a
 * sentence for a target outside [0, V) or logits that are all NaN / -inf (out->token then -1).
 */
int sample_score(const float *logits, int V, int32_t target, int n_top, sample_result *out, char *err,
                 size_t errlen);

/*
 * The distribution sample_next would draw from for these logits and this
 * state, written to probs (V): one-hot at the argmax for temperature 0,
 * else the renormalised kept probabilities (0 outside the kept set).  Same
 * code path as sample_next, no RNG draw; for tests and diagnostics.
 * Returns 0, or -1 with a sentence (as sample_next).
 */
int sample_dist(const float *logits, int V, const sample_params *p, const sample_state *st, sample_scratch *sc,
                float *probs, char *err, size_t errlen);

#endif
