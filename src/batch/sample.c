/*
 * sample.c — next-token selection for one row, with OpenAI's semantics.
 *
 * Owns: turning one row's fp32 logits (V) into one token id, the per-choice
 * RNG, the per-choice token counts behind the penalties, and the log-probs
 * reported with the token.  Does not own: the logits (the forward pass),
 * stop strings (stop.c), end-of-sequence ids (the job), threading (the
 * caller gives each worker its own sample_scratch).
 *
 * Order of operations, in fp32 logits promoted to double where they combine:
 *   1. z = logits; NaN and -inf become -inf (never drawn), +inf becomes
 *      FLT_MAX so max and exp stay finite.
 *   2. z[id] += logit_bias[id]                            (sparse)
 *   3. z[j]  -= c[j]·frequency_penalty + [c[j]>0]·presence_penalty  (sparse:
 *      OpenAI's documented formula, c = counts in this choice's generated
 *      tokens; the prompt does not count)
 *   4. temperature 0: argmax z, ties → lowest id, no RNG draw.
 *   5. else w = expf((float)((z − max z) / T))  (fp32 weights, double sums)
 *   6. top_k (spill extension, 0 = off; no implicit 50 as in transformers),
 *      then top_p on the renormalised top_k set: the smallest most-likely
 *      prefix whose mass is >= top_p (at least one token) — vLLM's and
 *      transformers' order.
 *   7. one uniform draw in [0, 1) from the choice's own RNG, inverted over
 *      the kept weights.
 *
 * Log-probs (key decision): reported from log_softmax of the RAW logits,
 * before logit_bias, penalties, temperature and truncation.  This is vLLM's
 * default (logprobs_mode "raw_logprobs"; its sampler: "use the original
 * logits, before any penalties or temperature scaling"), and it matches
 * what users observe of OpenAI's API: returned log-probs do not move with
 * temperature, and since the 2024 logit-bias model-stealing disclosure
 * (Carlini et al.) logit_bias reportedly does not move them either (not
 * checked against a live endpoint).  It is also what distillation wants:
 * the teacher's own distribution.
 * Values are floored at -9999 (OpenAI's sentinel), so no -inf reaches JSON.
 *
 * Top-p and top-k without a full sort: the pass that computes the weights
 * also fills a histogram of them (16 buckets per halving of the weight,
 * from the float's bits).  Walking it from the top tells which buckets hold
 * the kept set: where the count reaches top_k, or one bucket past where the
 * mass reaches top_p.  Only ids in those buckets are gathered — every id
 * left out is strictly less likely than every id gathered — so the sort
 * costs O(n log n) in the nucleus size (plus one bucket), not in V; top_k
 * first selects its k ids in O(n) (quickselect).  Should rounding leave
 * the gathered mass short of top_p, a second round gathers every id.  Ids
 * are ordered by 64-bit keys (weight bits, then id) so every order is total
 * and no sort needs a context pointer (qsort_r is not portable).
 *
 * RNG: xoshiro256** seeded through splitmix64 from (seed, stream); every
 * sampled (temperature > 0) step draws exactly one 64-bit value.  Nothing is
 * shared between rows, so batch composition and the order in which rows are
 * sampled cannot change a row's tokens.
 *
 * Speculative positions (sample_next_ahead): a decode step that also fed k
 * proposed tokens x1..xk has a logits row per position.  Position j draws
 * what sample_next would once the choice had generated x1..xj: the
 * penalties count them and the draw is the stream's (j+1)-th value from
 * here, without moving the state; the runner keeps positions while the draw
 * equals the next proposal, then sample_skip advances the state past the
 * draws of the tokens kept.  For a proposer that is a point mass on x this
 * IS the standard rejection rule: x is kept with probability p(x) (the draw
 * is x), otherwise the token kept is the draw, which is distributed as p with
 * x removed and renormalised; after k kept proposals the last position's
 * draw is the bonus token.  Each kept token is the one the row would draw
 * without speculation from the same logits with the same RNG value, so a
 * seeded row's answer depends on its seed only, whatever k and the batch.
 *
 * Determinism: all sums are doubles accumulated in a fixed order (index
 * order for the softmax normaliser, key order for kept masses); no threads,
 * no vector reductions, no -ffast-math, no FP contraction in ISO C11 mode.
 * The same logits on the same binary and libm give bit-identical picks; a
 * different libm may round expf() differently in the last place, which can
 * change a pick only when a draw lands within ~1e-7 of a boundary.
 *
 * Cost per row (V = 262,144, one core of the dev box): greedy ~2 ms, plain
 * sampling ~7 ms (expf dominates), top_p 0.9 on a flat distribution ~17 ms
 * (sorting a ~20k-id nucleus); log-probs add ~8 ms.  The caller spreads
 * rows over threads, one scratch each.
 */
#include "sample.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

/* ---- RNG -------------------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* ---- ordering keys ---------------------------------------------------------------------------------------- */

/* Key that sorts ascending as (w descending, id ascending), for weights w >= 0. */
static uint64_t weight_key(float w, int32_t id)
{
    uint32_t b;
    memcpy(&b, &w, 4);
    return ((uint64_t)(0xFFFFFFFFu - b) << 32) | (uint32_t)id;
}

/* Same for any float v (not NaN): sorts as (v descending, id ascending); -0 ties with +0. */
static uint64_t value_key(float v, int32_t id)
{
    uint32_t b;
    if (v == 0)
        v = 0;
    memcpy(&b, &v, 4);
    uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u); /* ascending uint order = ascending float order */
    return ((uint64_t)(~ord) << 32) | (uint32_t)id;
}

/*
 * Histogram bucket of a weight w in (0, 1]: 0 for w = 1, growing as w
 * shrinks, 16 buckets per halving (the float's exponent and top 4 mantissa
 * bits).  Monotone: a lower bucket never holds a smaller weight.
 */
static int weight_bucket(float w)
{
    uint32_t b;
    memcpy(&b, &w, 4);
    return (int)((0x3F800000u - b) >> 19);
}

static int32_t key_id(uint64_t k)
{
    return (int32_t)(k & 0xFFFFFFFFu);
}

static int key_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void swap_key(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/*
 * Reorders a (n distinct keys) so that a[0..k) hold its k smallest keys, in
 * no particular order.  Quickselect with a median-of-three pivot: average
 * O(n).  Invariant: lo <= k <= hi, a[0..lo) < a[lo..n), a[0..hi) < a[hi..n).
 */
static void select_smallest(uint64_t *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        if (a[mid] < a[lo])
            swap_key(&a[mid], &a[lo]);
        if (a[last] < a[lo])
            swap_key(&a[last], &a[lo]);
        if (a[last] < a[mid])
            swap_key(&a[last], &a[mid]);
        swap_key(&a[mid], &a[last]); /* the median becomes the pivot at a[last] */
        uint64_t pivot = a[last];
        size_t s = lo;
        for (size_t i = lo; i < last; i++)
            if (a[i] < pivot)
                swap_key(&a[i], &a[s++]);
        swap_key(&a[s], &a[last]);
        if (s == k)
            return;
        if (s < k)
            lo = s + 1;
        else
            hi = s;
    }
}

/* ---- params, state, scratch ------------------------------------------------------------------------------- */

int sample_params_check(const sample_params *p, int V, char *err, size_t errlen)
{
    if (V <= 0)
        return util_errf(err, errlen, "sampling: vocabulary size %d is not positive; load the model's vocabulary first",
                         V);
    if (!isfinite(p->temperature) || p->temperature < 0)
        return util_errf(err, errlen, "sampling: temperature %g is not a finite number >= 0; use 0 (greedy) to 2",
                         p->temperature);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return util_errf(err, errlen, "sampling: top_p %g is outside [0, 1]; use 1 to turn nucleus sampling off",
                         p->top_p);
    if (p->top_k < 0)
        return util_errf(err, errlen, "sampling: top_k %d is negative; use 0 to turn it off", p->top_k);
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return util_errf(
            err, errlen,
            "sampling: frequency_penalty %g / presence_penalty %g must be finite numbers (OpenAI: -2 to 2)",
            p->frequency_penalty, p->presence_penalty);
    if (p->n_logit_bias > 0 && (!p->logit_bias_id || !p->logit_bias))
        return util_errf(err, errlen,
                         "sampling: logit_bias has %zu entries but no arrays; pass both id and bias arrays",
                         p->n_logit_bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_id[i] < 0 || p->logit_bias_id[i] >= V)
            return util_errf(err, errlen,
                             "sampling: logit_bias token id %d is outside this model's vocabulary [0, %d); remove it",
                             (int)p->logit_bias_id[i], V);
        if (!isfinite(p->logit_bias[i]))
            return util_errf(err, errlen, "sampling: logit_bias for token %d is not a finite number; use -100 to 100",
                             (int)p->logit_bias_id[i]);
    }
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return util_errf(err, errlen, "sampling: min_p %g is outside [0, 1]; use 0 to turn it off", p->min_p);
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty < 0)
        return util_errf(err, errlen, "sampling: repetition_penalty %g must be a number > 0 (1 = off)",
                         p->repetition_penalty);
    int max_top = V < SAMPLE_MAX_TOP ? V : SAMPLE_MAX_TOP;
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > max_top)
        return util_errf(err, errlen, "sampling: top_logprobs %d is outside [0, %d]; ask for at most %d alternatives",
                         p->n_top_logprobs, max_top, max_top);
    return 0;
}

int sample_state_init(sample_state *st, const sample_params *p, uint64_t seed, uint64_t stream, int V,
                      int64_t max_generated, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    st->V = V;
    /* splitmix64 of the stream is a bijection, so one seed gives every stream its own key */
    uint64_t x = stream, key = seed ^ splitmix64(&x);
    for (int i = 0; i < 4; i++)
        st->rng[i] = splitmix64(&key);

    bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
    if (p->frequency_penalty == 0 && p->presence_penalty == 0 && !rep)
        return 0;
    if (V <= 0)
        return util_errf(err, errlen, "sampling: vocabulary size %d is not positive; load the model's vocabulary first",
                         V);
    if (max_generated <= 0)
        return util_errf(
            err, errlen,
            "sampling: a row with frequency/presence penalties needs a positive bound on generated tokens (got %lld); "
            "pass max_tokens or the context room left",
            (long long)max_generated);
    int64_t cap = max_generated < V ? max_generated : V;
    uint32_t bits = 1;
    while (((uint64_t)1 << bits) < 2 * (uint64_t)cap)
        bits++;
    size_t n_slot = (size_t)1 << bits, bytes_slot, bytes_ids;
    if (!ck_mul_size(n_slot, sizeof(int32_t), &bytes_slot) || !ck_mul_size((size_t)cap, sizeof(int32_t), &bytes_ids))
        return util_errf(err, errlen, "sampling: penalty table for %lld tokens overflows; lower max_tokens",
                         (long long)cap);
    st->ids = malloc(bytes_ids);
    st->counts = malloc(bytes_ids);
    st->slot = malloc(bytes_slot);
    if (!st->ids || !st->counts || !st->slot) {
        sample_state_free(st);
        return util_errf(err, errlen,
                         "sampling: out of memory for the penalty table of %lld tokens; lower max_tokens or the batch",
                         (long long)cap);
    }
    memset(st->slot, 0xFF, bytes_slot); /* -1 = empty */
    st->slot_bits = bits;
    st->cap = (int32_t)cap;
    st->V = V;
    return 0;
}

void sample_state_free(sample_state *st)
{
    free(st->ids);
    free(st->counts);
    free(st->slot);
    memset(st, 0, sizeof *st);
}

int sample_observe(sample_state *st, int32_t token, char *err, size_t errlen)
{
    if (!st->slot)
        return 0;
    if (token < 0 || token >= st->V)
        return util_errf(err, errlen, "sampling: observed token id %d is outside the vocabulary [0, %d)", (int)token,
                         st->V);
    uint64_t mask = ((uint64_t)1 << st->slot_bits) - 1;
    uint64_t h = ((uint32_t)token * 2654435761u) >> (32 - st->slot_bits);
    for (;; h = (h + 1) & mask) {
        int32_t k = st->slot[h];
        if (k < 0)
            break;
        if (st->ids[k] == token) {
            if (st->counts[k] < INT32_MAX)
                st->counts[k]++;
            return 0;
        }
    }
    if (st->n == st->cap)
        return util_errf(err, errlen,
                         "sampling: more than %d distinct tokens generated, the bound given to sample_state_init; "
                         "pass the row's real max_tokens",
                         (int)st->cap);
    st->slot[h] = st->n;
    st->ids[st->n] = token;
    st->counts[st->n] = 1;
    st->n++;
    return 0;
}

int sample_scratch_init(sample_scratch *sc, int V, char *err, size_t errlen)
{
    memset(sc, 0, sizeof *sc);
    if (V <= 0)
        return util_errf(err, errlen, "sampling: vocabulary size %d is not positive; load the model's vocabulary first",
                         V);
    sc->z = malloc((size_t)V * sizeof *sc->z);
    sc->e = malloc((size_t)V * sizeof *sc->e);
    sc->cand = malloc((size_t)V * sizeof *sc->cand);
    if (!sc->z || !sc->e || !sc->cand) {
        sample_scratch_free(sc);
        return util_errf(err, errlen, "sampling: out of memory for the %d-token scratch (16 bytes per token)", V);
    }
    sc->V = V;
    return 0;
}

void sample_scratch_free(sample_scratch *sc)
{
    free(sc->z);
    free(sc->e);
    free(sc->cand);
    memset(sc, 0, sizeof *sc);
}

/* ---- the distribution ------------------------------------------------------------------------------------- */

/* NaN and -inf → -inf (never drawn); +inf → FLT_MAX; finite values unchanged. */
static float clean_logit(float v)
{
    if (v != v || v == -INFINITY)
        return -INFINITY;
    return v > FLT_MAX ? FLT_MAX : v;
}

/* Back from a double sum to a finite fp32 logit; -inf stays -inf. */
static float to_logit(double v)
{
    if (v == -INFINITY)
        return -INFINITY;
    if (v > FLT_MAX)
        return FLT_MAX;
    if (v < -FLT_MAX)
        return -FLT_MAX;
    return (float)v;
}

/*
 * expf of a log-weight d <= 0.  Below -110 expf is 0 in fp32 anyway; the
 * early return also keeps a difference like -FLT_MAX - FLT_MAX from being
 * narrowed to float out of range.
 */
static float weight_of(double d)
{
    return d < -110.0 ? 0.0f : expf((float)d);
}

/* How often id occurs in ahead[0..n). */
static int32_t ahead_count(const int32_t *ahead, int n, int32_t id)
{
    int32_t c = 0;
    for (int j = 0; j < n; j++)
        c += ahead[j] == id;
    return c;
}

/* The state's count of id (0 when unseen or when the row has no penalties). */
static int32_t state_count(const sample_state *st, int32_t id)
{
    if (!st->slot)
        return 0;
    uint64_t mask = ((uint64_t)1 << st->slot_bits) - 1;
    for (uint64_t h = ((uint32_t)id * 2654435761u) >> (32 - st->slot_bits);; h = (h + 1) & mask) {
        int32_t k = st->slot[h];
        if (k < 0)
            return 0;
        if (st->ids[k] == id)
            return st->counts[k];
    }
}

/* What dist_build kept: one token (greedy), every id, or a sorted candidate prefix. */
typedef struct kept {
    int32_t token; /* greedy: the argmax; else -1 */
    bool all;      /* every id, weights sc->e, index order */
    int32_t n;     /* else sc->cand[0..n): keys in (weight desc, id asc) order */
    double mass;   /* sum of the kept weights, in the order they are walked */
} kept;

/*
 * Steps 1-6 of the file comment: fills sc->z (V) and, unless greedy, sc->e
 * (V) and the kept set, for the state st as if it had also observed
 * ahead[0..n_ahead) (a speculative position: the proposals before it).
 * Returns 0, or -1 with a sentence when no id is drawable or the scratch is
 * too small.
 */
static int dist_build(const float *logits, int V, const sample_params *p, const sample_state *st,
                      const int32_t *ahead, int n_ahead, sample_scratch *sc, kept *k, char *err, size_t errlen)
{
    memset(k, 0, sizeof *k);
    k->token = -1;
    if (V <= 0 || V > sc->V)
        return util_errf(
            err, errlen,
            "sampling: %d logits do not fit the scratch sized for %d; size sample_scratch for the model's vocabulary",
            V, sc->V);
    float *z = sc->z, *e = sc->e;
    for (int i = 0; i < V; i++)
        z[i] = clean_logit(logits[i]);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        int32_t id = p->logit_bias_id[i];
        if (id >= 0 && id < V)
            z[id] = to_logit((double)z[id] + p->logit_bias[i]);
    }
    /* every id once, with its count in the state plus in ahead: the numerics of a state that observed ahead */
    for (int32_t i = 0; st->slot && i < st->n; i++) {
        int32_t id = st->ids[i];
        if (id >= V)
            continue;
        double c = st->counts[i] + ahead_count(ahead, n_ahead, id);
        z[id] = to_logit((double)z[id] - c * p->frequency_penalty - (c > 0 ? p->presence_penalty : 0.0));
    }
    for (int j = 0; st->slot && j < n_ahead; j++) {
        int32_t id = ahead[j];
        if (id < 0 || id >= V || ahead_count(ahead, j, id) > 0 || state_count(st, id) > 0)
            continue; /* out of range, or counted already */
        double c = ahead_count(ahead, n_ahead, id);
        z[id] = to_logit((double)z[id] - c * p->frequency_penalty - (c > 0 ? p->presence_penalty : 0.0));
    }
    if (p->repetition_penalty > 0 && p->repetition_penalty != 1) {
        /* once per distinct token of the prompt and the generated ones (e marks them; it is rewritten below) */
        double rp = p->repetition_penalty;
        memset(e, 0, (size_t)V * sizeof *e);
        size_t n_seen = p->n_prompt + (size_t)(st->slot ? st->n : 0);
        for (size_t i = 0; i < n_seen + (size_t)(st->slot ? n_ahead : 0); i++) {
            int32_t id = i < p->n_prompt ? p->prompt[i] : i < n_seen ? st->ids[i - p->n_prompt] : ahead[i - n_seen];
            if (id < 0 || id >= V || e[id] != 0)
                continue;
            e[id] = 1;
            if (z[id] > -INFINITY)
                z[id] = to_logit(z[id] > 0 ? (double)z[id] / rp : (double)z[id] * rp);
        }
    }

    int32_t best = -1;
    float zmax = -INFINITY;
    for (int i = 0; i < V; i++)
        if (z[i] > zmax) { /* strict: ties keep the lowest id */
            zmax = z[i];
            best = i;
        }
    if (best < 0)
        return util_errf(
            err, errlen,
            "sampling: all %d logits are NaN or -inf (after logit_bias and penalties), so no token can be drawn; "
            "the forward pass produced invalid values for this row",
            V);
    if (p->temperature == 0) {
        k->token = best;
        return 0;
    }

    /* one pass: weights, their sum, and (if anything is cut) the weight histogram */
    bool cut = p->top_k > 0 || p->top_p < 1;
    if (cut) {
        memset(sc->hmass, 0, sizeof sc->hmass);
        memset(sc->hcount, 0, sizeof sc->hcount);
    }
    double T = p->temperature, S = 0;
    int32_t n_pos = 0;
    for (int i = 0; i < V; i++) {
        float w = weight_of(((double)z[i] - zmax) / T);
        if (w < p->min_p) /* w is p_i / p_max: min_p keeps what is at least that likely relative to the best */
            w = 0;
        e[i] = w;
        S += w;
        if (w > 0) {
            n_pos++;
            if (cut) {
                int b = weight_bucket(w);
                sc->hmass[b] += w;
                sc->hcount[b]++;
            }
        }
    }
    bool cut_k = p->top_k > 0 && p->top_k < n_pos, cut_p = p->top_p < 1;
    if (!cut_k && !cut_p) {
        k->all = true;
        k->mass = S;
        return 0;
    }

    /*
     * Buckets that surely hold the kept set: through the bucket where the
     * count reaches top_k, or one past the bucket where the mass reaches
     * top_p (the margin absorbs the histogram's different summation order).
     */
    int last_b = SAMPLE_BUCKETS - 1, b_sel = last_b;
    double acc = 0, target_s = p->top_p * S;
    for (int b = 0; b < SAMPLE_BUCKETS; b++) {
        acc += cut_k ? (double)sc->hcount[b] : sc->hmass[b];
        if (acc >= (cut_k ? (double)p->top_k : target_s)) {
            b_sel = cut_k || b == last_b ? b : b + 1;
            break;
        }
    }
    for (int round = 0; round < 2; round++) {
        bool last = round == 1 || b_sel == last_b;
        int b_max = round == 0 ? b_sel : last_b;
        size_t n = 0;
        for (int i = 0; i < V; i++)
            if (e[i] > 0 && weight_bucket(e[i]) <= b_max)
                sc->cand[n++] = weight_key(e[i], i);

        size_t m = n;
        double norm = S;
        if (cut_k) {
            m = (size_t)p->top_k; /* the counts are exact: n >= top_k */
            select_smallest(sc->cand, n, m);
        }
        qsort(sc->cand, m, sizeof *sc->cand, key_cmp);
        if (cut_k) {
            norm = 0;
            for (size_t j = 0; j < m; j++)
                norm += e[key_id(sc->cand[j])];
        }
        if (!cut_p) {
            k->n = (int32_t)m;
            k->mass = norm;
            return 0;
        }
        double target = p->top_p * norm, cum = 0;
        size_t j = 0;
        while (j < m) {
            cum += e[key_id(sc->cand[j++])];
            if (cum >= target)
                break;
        }
        /* with the whole top_k set, or with every id, rounding short of target keeps everything gathered */
        if (cum >= target || cut_k || last) {
            k->n = (int32_t)j;
            k->mass = cum;
            return 0;
        }
    }
    return util_errf(err, errlen, "sampling: internal error: no candidate round resolved top_p %g", p->top_p);
}

/* Inverts the uniform r over the kept weights; always returns a kept id with weight > 0. */
static int32_t draw(const sample_scratch *sc, int V, const kept *k, double r)
{
    double u = r * k->mass, c = 0;
    int32_t pick = -1, n = k->all ? V : k->n;
    for (int32_t j = 0; j < n; j++) {
        int32_t id = k->all ? j : key_id(sc->cand[j]);
        float w = sc->e[id];
        if (w <= 0)
            continue;
        pick = id;
        c += w;
        if (u < c)
            break;
    }
    return pick; /* the argmax has weight exp(0) = 1 and is always kept, so pick >= 0 */
}

static float floor_logprob(double lp)
{
    return lp < SAMPLE_LOGPROB_FLOOR ? SAMPLE_LOGPROB_FLOOR : (float)lp;
}

/* log_softmax of the raw logits at `token`, and the n_top most likely ids (heap of the n_top smallest keys). */
static void logprobs_fill(const float *logits, int V, const sample_params *p, int32_t token, sample_result *out)
{
    float m = -INFINITY;
    for (int i = 0; i < V; i++) {
        float v = clean_logit(logits[i]);
        if (v > m)
            m = v;
    }
    double S = 0;
    for (int i = 0; i < V; i++)
        S += weight_of((double)clean_logit(logits[i]) - m); /* fp32 terms, double sum: ~1e-7 */
    double lse = (double)m + log(S);
    out->logprob = floor_logprob((double)clean_logit(logits[token]) - lse);

    int K = p->n_top_logprobs, n = 0;
    uint64_t heap[SAMPLE_MAX_TOP]; /* max-heap: heap[0] is the worst of the best K so far */
    for (int i = 0; i < V && K > 0; i++) {
        uint64_t key = value_key(clean_logit(logits[i]), i);
        int at;
        if (n < K) {
            at = n++;
            while (at > 0 && heap[(at - 1) / 2] < key) {
                heap[at] = heap[(at - 1) / 2];
                at = (at - 1) / 2;
            }
            heap[at] = key;
            continue;
        }
        if (key >= heap[0])
            continue;
        at = 0;
        for (;;) {
            int c = 2 * at + 1;
            if (c >= n)
                break;
            if (c + 1 < n && heap[c + 1] > heap[c])
                c++;
            if (heap[c] <= key)
                break;
            heap[at] = heap[c];
            at = c;
        }
        heap[at] = key;
    }
    qsort(heap, (size_t)n, sizeof *heap, key_cmp);
    for (int j = 0; j < n; j++) {
        int32_t id = key_id(heap[j]);
        out->top_id[j] = id;
        out->top_logprob[j] = floor_logprob((double)clean_logit(logits[id]) - lse);
    }
    out->n_top = n;
}

int sample_next(const float *logits, int V, const sample_params *p, sample_state *st, sample_scratch *sc,
                sample_result *out, char *err, size_t errlen)
{
    out->token = 0;
    out->logprob = 0;
    out->n_top = 0;
    kept k;
    if (dist_build(logits, V, p, st, NULL, 0, sc, &k, err, errlen) < 0)
        return -1;
    out->token = k.token >= 0 ? k.token : draw(sc, V, &k, rng_uniform(st->rng));
    if (p->logprobs)
        logprobs_fill(logits, V, p, out->token, out);
    return 0;
}

int sample_next_ahead(const float *logits, int V, const sample_params *p, const sample_state *st,
                      const int32_t *ahead, int n_ahead, sample_scratch *sc, sample_result *out, char *err,
                      size_t errlen)
{
    out->token = 0;
    out->logprob = 0;
    out->n_top = 0;
    kept k;
    if (dist_build(logits, V, p, st, ahead, n_ahead, sc, &k, err, errlen) < 0)
        return -1;
    if (k.token >= 0)
        out->token = k.token;
    else {
        uint64_t rng[4] = {st->rng[0], st->rng[1], st->rng[2], st->rng[3]};
        for (int j = 0; j < n_ahead; j++)
            rng_next(rng);
        out->token = draw(sc, V, &k, rng_uniform(rng));
    }
    if (p->logprobs)
        logprobs_fill(logits, V, p, out->token, out);
    return 0;
}

void sample_skip(sample_state *st, const sample_params *p, int n)
{
    for (int j = 0; p->temperature > 0 && j < n; j++)
        rng_next(st->rng);
}

int sample_dist(const float *logits, int V, const sample_params *p, const sample_state *st, sample_scratch *sc,
                float *probs, char *err, size_t errlen)
{
    kept k;
    if (dist_build(logits, V, p, st, NULL, 0, sc, &k, err, errlen) < 0)
        return -1;
    memset(probs, 0, (size_t)V * sizeof *probs);
    if (k.token >= 0) {
        probs[k.token] = 1;
        return 0;
    }
    int32_t n = k.all ? V : k.n;
    for (int32_t j = 0; j < n; j++) {
        int32_t id = k.all ? j : key_id(sc->cand[j]);
        probs[id] = (float)(sc->e[id] / k.mass);
    }
    return 0;
}

int sample_score(const float *logits, int V, int32_t target, int n_top, sample_result *out, char *err,
                 size_t errlen)
{
    out->token = target;
    out->logprob = 0;
    out->n_top = 0;
    if (target < 0 || target >= V || n_top < 0 || n_top > SAMPLE_MAX_TOP)
        return util_errf(err, errlen, "token %d (or %d alternatives) is outside a vocabulary of %d.", target, n_top,
                         V);
    bool any = false;
    for (int i = 0; i < V && !any; i++)
        any = clean_logit(logits[i]) > -INFINITY;
    if (!any) {
        out->token = -1;
        return util_errf(err, errlen, "every logit is NaN or -inf: no log-prob to report.");
    }
    sample_params p = {0};
    p.logprobs = true;
    p.n_top_logprobs = n_top < V ? n_top : V;
    logprobs_fill(logits, V, &p, target, out);
    return 0;
}
