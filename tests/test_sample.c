/*
 * test_sample.c — the sampler against references computed here in double.
 *
 * Tolerances and thresholds, fixed before the first run:
 *  - probabilities from sample_dist vs a double-precision softmax of the
 *    hand-modified logits: 1e-6 absolute (fp32 weights, double sums);
 *  - log-probs vs log_softmax in double: |Δ| <= 1e-6 + 1e-7·|lp| (the
 *    result is an fp32, whose rounding alone is up to 6e-8·|lp|; the 1e-6
 *    covers the fp32 exp terms of the normaliser);
 *  - nucleus / top-k support sets: exact, against a full sort in the test
 *    (same fp32 weights, same summation orders as documented in sample.c),
 *    on hand-picked cases, on V = 262,144 cases that reach each selection
 *    path, and on 3,000 random small cases with NaN / ±inf / ties;
 *  - empirical frequencies over N = 10^5 draws: Pearson chi-square against
 *    the renormalised distribution, rejected above the p = 0.001 critical
 *    value for k − 1 degrees of freedom (Wilson–Hilferty approximation);
 *    every expected count is >= 5 by construction.  Seeds are fixed, so a
 *    pass is reproducible; the threshold bounds how unlikely a false alarm
 *    was when the seeds were chosen (they were not tuned).
 *  - a token outside the support set must never be drawn in those 10^5 draws.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "batch/sample.h"
#include "test.h"

static char err[512];

/* Test-side RNG for logits (independent of the sampler's). */
static uint64_t trng = 0x1234567ull;
static double tuniform(void)
{
    trng ^= trng << 13;
    trng ^= trng >> 7;
    trng ^= trng << 17;
    return (double)(trng >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int V, double spread)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)((tuniform() - 0.5) * spread);
}

static sample_params params_default(void)
{
    sample_params p = {.temperature = 1, .top_p = 1};
    return p;
}

/* Critical chi-square value at p = 0.001 (z = 3.0902), Wilson–Hilferty. */
static double chi2_crit(int df)
{
    double a = 2.0 / (9.0 * df);
    double x = 1 - a + 3.0902 * sqrt(a);
    return df * x * x * x;
}

/*
 * Draws N tokens for (logits, p) from a fresh state that has observed
 * gen[0..n_gen) (and nothing drawn since), and checks them against want (V,
 * renormalised probabilities, 0 = must never be drawn).
 */
static void check_draws_after(const float *logits, int V, const sample_params *p, const int32_t *gen, int n_gen,
                              const double *want, int N, uint64_t seed, const char *label)
{
    sample_state st;
    sample_scratch sc;
    sample_result r;
    long *count = calloc((size_t)V, sizeof *count);
    CHECK(sample_state_init(&st, p, seed, 0, V, n_gen + 1, err, sizeof err) == 0, "%s: state: %s", label, err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "%s: scratch: %s", label, err);
    for (int i = 0; i < n_gen; i++)
        CHECK(sample_observe(&st, gen[i], err, sizeof err) == 0, "observe: %s", err);
    for (int i = 0; i < N; i++) {
        if (sample_next(logits, V, p, &st, &sc, &r, err, sizeof err) < 0 || r.token < 0 || r.token >= V) {
            CHECK(0, "%s: draw %d failed (%d): %s", label, i, (int)r.token, err);
            break;
        }
        count[r.token]++;
    }
    double chi2 = 0;
    int k = 0, outside = 0;
    for (int i = 0; i < V; i++) {
        if (want[i] == 0) {
            outside += count[i] > 0;
            continue;
        }
        double e = want[i] * N;
        CHECK(e >= 5, "%s: expected count %.2f of token %d is below 5: the test is badly built", label, e, i);
        chi2 += (count[i] - e) * (count[i] - e) / e;
        k++;
    }
    CHECK(outside == 0, "%s: %d tokens outside the support were drawn", label, outside);
    if (k > 1)
        CHECK(chi2 <= chi2_crit(k - 1), "%s: chi2 %.2f > %.2f (df %d)", label, chi2, chi2_crit(k - 1), k - 1);
    else
        CHECK(k == 1, "%s: empty support", label);
    sample_scratch_free(&sc);
    sample_state_free(&st);
    free(count);
}

static void check_draws(const float *logits, int V, const sample_params *p, const double *want, int N, uint64_t seed,
                        const char *label)
{
    check_draws_after(logits, V, p, NULL, 0, want, N, seed, label);
}

/* Double reference of steps 1-5 (no truncation): softmax((l + bias - penalty) / T). */
static void ref_softmax(const double *z, int V, double T, double *p)
{
    double m = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        if (z[i] > m)
            m = z[i];
    for (int i = 0; i < V; i++)
        s += (p[i] = exp((z[i] - m) / T));
    for (int i = 0; i < V; i++)
        p[i] /= s;
}

/* ---- greedy ----------------------------------------------------------------------------------------------- */

static void test_greedy(void)
{
    enum { V = 1000 };
    static float l[V];
    sample_params p = params_default();
    p.temperature = 0;
    sample_state st;
    sample_scratch sc;
    sample_result r;
    CHECK(sample_state_init(&st, &p, 1, 0, V, 100, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    for (int rep = 0; rep < 20; rep++) {
        random_logits(l, V, 20);
        int best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[best])
                best = i;
        CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == best, "argmax %d, got %d", best,
              (int)r.token);
    }
    /* ties → lowest id; NaN is never a maximum; +inf wins */
    random_logits(l, V, 2);
    l[700] = 5, l[300] = 5, l[900] = 5;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 300, "tie: got %d, want 300",
          (int)r.token);
    l[10] = NAN;
    l[0] = NAN;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 300, "NaN: got %d", (int)r.token);
    l[999] = INFINITY;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 999, "+inf: got %d", (int)r.token);
    /* every logit NaN / -inf: an error, and still an id in range */
    for (int i = 0; i < V; i++)
        l[i] = i % 2 ? NAN : -INFINITY;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) < 0 && r.token == 0 && strstr(err, "NaN"),
          "all-NaN accepted (token %d): %s", (int)r.token, err);
    p.temperature = 1;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) < 0 && r.token == 0, "all-NaN sampled: %d",
          (int)r.token);
    /* NaN and +inf under sampling: +inf takes all the mass, NaN never drawn */
    random_logits(l, V, 2);
    l[5] = NAN;
    l[6] = INFINITY;
    for (int i = 0; i < 100; i++)
        CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 6, "+inf sampled: %d",
              (int)r.token);
    sample_scratch_free(&sc);
    sample_state_free(&st);
}

/* ---- logit_bias and penalties ----------------------------------------------------------------------------- */

static void test_bias(void)
{
    enum { V = 10 };
    float l[V] = {1.0f, 0.5f, 2.0f, 0.1f, 1.5f, 0.0f, 0.3f, 0.9f, 1.2f, 0.7f};
    int32_t ids[2] = {2, 5};
    float bias[2] = {-100, 100};
    sample_params p = params_default();
    p.temperature = 0;
    p.n_logit_bias = 2;
    p.logit_bias_id = ids;
    p.logit_bias = bias;
    sample_state st;
    sample_scratch sc;
    sample_result r;
    CHECK(sample_params_check(&p, V, err, sizeof err) == 0, "check: %s", err);
    CHECK(sample_state_init(&st, &p, 7, 0, V, 10, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 5, "+100 forces 5: got %d",
          (int)r.token);
    /* +100 forces and -100 bans under sampling too (e^-98 per draw ≈ never) */
    p.temperature = 1;
    double want[V] = {0};
    want[5] = 1;
    check_draws(l, V, &p, want, 100000, 11, "bias +100");
    bias[1] = 0; /* now only the ban of token 2 is left */
    double z[V];
    for (int i = 0; i < V; i++)
        z[i] = l[i] - (i == 2 ? 100 : 0);
    ref_softmax(z, V, 1, want);
    want[2] = 0;
    check_draws(l, V, &p, want, 100000, 12, "bias -100");
    /* greedy falls to the runner-up when the best is banned */
    p.temperature = 0;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 4, "ban: got %d, want 4",
          (int)r.token);
    /* an id outside the vocabulary is refused by the check */
    ids[0] = V;
    CHECK(sample_params_check(&p, V, err, sizeof err) < 0 && strstr(err, "logit_bias"), "bad id accepted: %s", err);
    sample_scratch_free(&sc);
    sample_state_free(&st);
}

static void test_penalties(void)
{
    enum { V = 8 };
    float l[V] = {0.2f, 1.1f, 2.0f, -0.5f, 0.7f, 1.9f, 0.0f, 1.0f};
    int32_t bid[1] = {2};
    float bval[1] = {1.0f};
    sample_params p = params_default();
    p.temperature = 0.8f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.7f;
    p.n_logit_bias = 1;
    p.logit_bias_id = bid;
    p.logit_bias = bval;
    sample_state st;
    sample_scratch sc;
    CHECK(sample_state_init(&st, &p, 3, 0, V, 16, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    /* generated so far: 2 ×3, 5 ×1, 7 ×2 */
    int32_t gen[] = {2, 5, 2, 7, 2, 7};
    for (size_t i = 0; i < sizeof gen / sizeof *gen; i++)
        CHECK(sample_observe(&st, gen[i], err, sizeof err) == 0, "observe: %s", err);
    /* hand-computed: z_j = l_j + bias_j − c_j·0.5 − [c_j>0]·0.7 */
    const double adj[V] = {0, 0, 1.0 - 3 * 0.5 - 0.7, 0, 0, -1 * 0.5 - 0.7, 0, -2 * 0.5 - 0.7};
    double z[V], want[V];
    float got[V];
    for (int i = 0; i < V; i++)
        z[i] = (double)l[i] + adj[i];
    ref_softmax(z, V, 0.8, want);
    CHECK(sample_dist(l, V, &p, &st, &sc, got, err, sizeof err) == 0, "dist: %s", err);
    double maxd = 0;
    for (int i = 0; i < V; i++)
        maxd = fmax(maxd, fabs(got[i] - want[i]));
    CHECK(maxd <= 1e-6, "penalised distribution off by %.3g", maxd);
    check_draws_after(l, V, &p, gen, (int)(sizeof gen / sizeof *gen), want, 100000, 21, "penalties T=0.8");
    /* greedy: token 2 (raw best, 3.0 with bias) drops to 0.8, token 1 (1.1) wins */
    p.temperature = 0;
    sample_result r;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 1, "greedy with penalties: %d",
          (int)r.token);
    /* negative penalties encourage repetition: frequency −2 lifts token 2 to 3.0 + 3·2 = 9 */
    p.frequency_penalty = -2;
    p.presence_penalty = 0;
    CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 2, "negative penalty: %d",
          (int)r.token);
    /* more distinct tokens than promised: an error, not a crash */
    sample_state small;
    p.frequency_penalty = 0.1f;
    CHECK(sample_state_init(&small, &p, 1, 0, V, 2, err, sizeof err) == 0, "small: %s", err);
    CHECK(sample_observe(&small, 1, err, sizeof err) == 0 && sample_observe(&small, 1, err, sizeof err) == 0 &&
              sample_observe(&small, 3, err, sizeof err) == 0,
          "observe within bound: %s", err);
    CHECK(sample_observe(&small, 4, err, sizeof err) < 0 && strstr(err, "distinct"), "overflow accepted: %s", err);
    CHECK(sample_observe(&small, V, err, sizeof err) < 0, "out-of-range token accepted");
    sample_state_free(&small);
    CHECK(sample_state_init(&small, &p, 1, 0, V, 0, err, sizeof err) < 0, "penalties with no bound accepted");
    sample_state_free(&small);
    sample_scratch_free(&sc);
    sample_state_free(&st);
}

/* ---- top-k / top-p ---------------------------------------------------------------------------------------- */

static const float *g_w;
static int cmp_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (g_w[x] != g_w[y])
        return g_w[x] > g_w[y] ? -1 : 1;
    return x - y;
}

/*
 * Independent reference of the kept set by a FULL sort: fp32 weights
 * expf((z − max)/T) as sample.c documents, sorted (w desc, id asc), top_k prefix, then the smallest
 * prefix with mass >= top_p × (its normaliser).  Writes renormalised
 * probabilities to want (V), returns the support size.
 */
static int ref_kept(const float *l, int V, double T, int top_k, double top_p, double *want)
{
    float *w = malloc((size_t)V * sizeof *w);
    int *ord = malloc((size_t)V * sizeof *ord);
    float m = -INFINITY;
    for (int i = 0; i < V; i++)
        m = l[i] > m ? l[i] : m;
    double S = 0;
    int npos = 0;
    for (int i = 0; i < V; i++) {
        w[i] = expf((float)(((double)l[i] - m) / T));
        S += w[i];
        npos += w[i] > 0;
        ord[i] = i;
    }
    g_w = w;
    qsort(ord, (size_t)V, sizeof *ord, cmp_desc);
    int n = top_k > 0 && top_k < npos ? top_k : npos;
    double norm = S;
    if (top_k > 0 && top_k < npos) {
        norm = 0;
        for (int j = 0; j < n; j++)
            norm += w[ord[j]];
    }
    int keep = n;
    double cum = 0;
    if (top_p < 1) {
        for (keep = 0; keep < n;) {
            cum += w[ord[keep++]];
            if (cum >= top_p * norm)
                break;
        }
    } else {
        cum = norm;
    }
    memset(want, 0, (size_t)V * sizeof *want);
    for (int j = 0; j < keep; j++)
        want[ord[j]] = w[ord[j]] / cum;
    free(w);
    free(ord);
    return keep;
}

/* sample_dist must give exactly the reference's support and its probabilities within 1e-6. */
static void check_dist(const float *l, int V, const sample_params *p, const char *label)
{
    double *want = malloc((size_t)V * sizeof *want);
    float *got = malloc((size_t)V * sizeof *got);
    sample_state st;
    sample_scratch sc;
    int keep = ref_kept(l, V, p->temperature, p->top_k, p->top_p, want);
    CHECK(sample_state_init(&st, p, 1, 0, V, 1, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    CHECK(sample_dist(l, V, p, &st, &sc, got, err, sizeof err) == 0, "%s: dist: %s", label, err);
    int support = 0, mismatch = 0;
    double maxd = 0;
    for (int i = 0; i < V; i++) {
        support += got[i] > 0;
        mismatch += (got[i] > 0) != ((float)want[i] > 0); /* kept ids below 1e-45 read 0 in fp32 */
        maxd = fmax(maxd, fabs(got[i] - want[i]));
    }
    CHECK(mismatch == 0, "%s: support %d vs reference %d, %d ids differ", label, support, keep, mismatch);
    CHECK(maxd <= 1e-6, "%s: probabilities off by %.3g", label, maxd);
    sample_scratch_free(&sc);
    sample_state_free(&st);
    free(want);
    free(got);
}

static void test_truncation(void)
{
    /* small vocabularies: support sets and 10^5-draw frequencies */
    enum { V = 50 };
    float l[V];
    double want[V];
    random_logits(l, V, 8);
    sample_params p = params_default();
    p.top_k = 5;
    ref_kept(l, V, 1, 5, 1, want);
    check_dist(l, V, &p, "top_k 5");
    check_draws(l, V, &p, want, 100000, 31, "top_k 5");
    p.top_k = 0;
    p.top_p = 0.6f;
    p.temperature = 0.7f;
    int keep = ref_kept(l, V, 0.7, 0, 0.6, want);
    CHECK(keep > 1 && keep < V, "top_p 0.6 case keeps %d of %d: pick other logits", keep, V);
    check_dist(l, V, &p, "top_p 0.6");
    check_draws(l, V, &p, want, 100000, 32, "top_p 0.6");
    p.top_k = 8;
    p.top_p = 0.8f;
    ref_kept(l, V, 0.7, 8, 0.8, want);
    check_dist(l, V, &p, "top_k 8 + top_p 0.8");
    check_draws(l, V, &p, want, 100000, 33, "top_k 8 + top_p 0.8");
    /* plain temperature sampling */
    p.top_k = 0;
    p.top_p = 1;
    p.temperature = 1.3f;
    float l20[20];
    double w20[20];
    random_logits(l20, 20, 4);
    ref_kept(l20, 20, 1.3, 0, 1, w20);
    check_draws(l20, 20, &p, w20, 100000, 34, "T=1.3");
    /* top_p = 0 keeps only the most likely id; top_k = 1 too */
    p.top_p = 0;
    check_dist(l, V, &p, "top_p 0");
    p.top_p = 1;
    p.top_k = 1;
    check_dist(l, V, &p, "top_k 1");

    /* large vocabularies: every candidate round of sample.c, against the full sort */
    int bigV = 262144;
    float *big = malloc((size_t)bigV * sizeof *big);
    random_logits(big, bigV, 30); /* peaked: the nucleus is found among the first candidates */
    p = params_default();
    p.top_p = 0.9f;
    check_dist(big, bigV, &p, "V=262144 peaked top_p 0.9");
    random_logits(big, bigV, 1); /* flat: only the last round (τ = 0) holds the nucleus */
    check_dist(big, bigV, &p, "V=262144 flat top_p 0.9");
    p.top_p = 0.999f;
    check_dist(big, bigV, &p, "V=262144 flat top_p 0.999");
    random_logits(big, bigV, 12); /* in between: the middle round */
    p.top_p = 0.95f;
    check_dist(big, bigV, &p, "V=262144 medium top_p 0.95");
    p.top_p = 1;
    p.top_k = 50;
    check_dist(big, bigV, &p, "V=262144 top_k 50");
    p.top_k = 40000;
    check_dist(big, bigV, &p, "V=262144 top_k 40000");
    p.top_k = 200000; /* more ids than the 2^-15 round gathers: only τ = 0 has them */
    check_dist(big, bigV, &p, "V=262144 top_k 200000");
    p.top_k = 0;
    p.top_p = 0.9999999f; /* needs ids below p = 2^-20 */
    check_dist(big, bigV, &p, "V=262144 medium top_p 0.9999999");
    p.top_k = 40000;
    p.top_p = 0.5f;
    check_dist(big, bigV, &p, "V=262144 top_k 40000 + top_p 0.5");
    /* many equal logits: ties resolved by id, support still exact */
    for (int i = 0; i < bigV; i++)
        big[i] = (float)(i % 7);
    p.top_k = 1000;
    p.top_p = 1;
    check_dist(big, bigV, &p, "V=262144 ties top_k 1000");
    p.top_k = 0;
    p.top_p = 0.3f;
    check_dist(big, bigV, &p, "V=262144 ties top_p 0.3");
    free(big);
}

/*
 * Random small cases: V in [1, 300], logits with NaN / ±inf / exact ties,
 * random T, top_k, top_p; the kept set must equal the full-sort reference
 * (on the sanitised logits: NaN → -inf, +inf → FLT_MAX) and every draw must
 * be an id of that set.
 */
static void test_random_cases(void)
{
    enum { MAXV = 300 };
    static float l[MAXV], clean[MAXV], got[MAXV];
    static double want[MAXV];
    sample_scratch sc;
    sample_state st;
    sample_result r;
    CHECK(sample_scratch_init(&sc, MAXV, err, sizeof err) == 0, "scratch: %s", err);
    int bad = 0;
    for (int iter = 0; iter < 3000 && bad < 5; iter++) {
        int V = 1 + (int)(tuniform() * MAXV);
        double spread = tuniform() < 0.5 ? 4 : 60;
        for (int i = 0; i < V; i++) {
            double u = tuniform();
            l[i] = u < 0.03 ? NAN : u < 0.05 ? -INFINITY : u < 0.1 ? 1.0f : (float)((tuniform() - 0.5) * spread);
        }
        if (tuniform() < 0.05)
            l[(int)(tuniform() * V)] = INFINITY;
        for (int i = 0; i < V; i++)
            clean[i] = l[i] != l[i] ? -INFINITY : l[i] > FLT_MAX ? FLT_MAX : l[i];
        int finite = 0;
        for (int i = 0; i < V; i++)
            finite += clean[i] > -INFINITY;
        if (!finite)
            continue;
        sample_params p = params_default();
        p.temperature = (float)(0.05 + tuniform() * 2);
        p.top_k = tuniform() < 0.5 ? 0 : 1 + (int)(tuniform() * V * 1.2);
        p.top_p = tuniform() < 0.3 ? 1 : (float)tuniform();
        int keep = ref_kept(clean, V, p.temperature, p.top_k, p.top_p, want);
        CHECK(sample_state_init(&st, &p, (uint64_t)iter, 0, V, 1, err, sizeof err) == 0, "state: %s", err);
        if (sample_dist(l, V, &p, &st, &sc, got, err, sizeof err) < 0) {
            CHECK(0, "case %d: dist failed: %s", iter, err);
            bad++;
        }
        int support = 0, mismatch = 0;
        for (int i = 0; i < V; i++) {
            support += got[i] > 0;
            mismatch += (got[i] > 0) != ((float)want[i] > 0); /* kept ids below 1e-45 read 0 in fp32 */
        }
        if (mismatch) {
            CHECK(0, "case %d (V %d, T %g, top_k %d, top_p %g): support %d vs %d, %d differ", iter, V, p.temperature,
                  p.top_k, p.top_p, support, keep, mismatch);
            bad++;
        }
        for (int d = 0; d < 20; d++) {
            if (sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) < 0 || r.token < 0 || r.token >= V ||
                want[r.token] == 0) {
                CHECK(0, "case %d: drew %d outside the kept set (%s)", iter, (int)r.token, err);
                bad++;
                break;
            }
        }
        sample_state_free(&st);
    }
    CHECK(bad == 0, "%d random cases failed", bad);
    sample_scratch_free(&sc);
}

/* ---- seeds ------------------------------------------------------------------------------------------------ */

/* Logits that depend on the step and row, so sequences are non-trivial. */
static void step_logits(float *l, int V, int step, int row)
{
    uint64_t x = (uint64_t)step * 1000003u + (uint64_t)row * 7919u + 1;
    for (int i = 0; i < V; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        l[i] = (float)((double)(x >> 11) * 0x1.0p-53 * 6.0);
    }
}

static void test_seeds(void)
{
    enum { V = 500, STEPS = 200, ROWS = 4 };
    static float l[V];
    static int32_t solo[ROWS][STEPS], mixed[ROWS][STEPS];
    sample_params p = params_default();
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.frequency_penalty = 0.3f;
    sample_scratch sc, sc2;
    sample_result r;
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    CHECK(sample_scratch_init(&sc2, V, err, sizeof err) == 0, "scratch: %s", err);
    /* rows 0,1: same seed 42, choices 0 and 1; row 2: seed 43 choice 0; row 3: seed 42 choice 0 again */
    uint64_t seed[ROWS] = {42, 42, 43, 42}, stream[ROWS] = {0, 1, 0, 0};
    for (int row = 0; row < ROWS; row++) {
        sample_state st;
        CHECK(sample_state_init(&st, &p, seed[row], stream[row], V, STEPS, err, sizeof err) == 0, "state: %s", err);
        for (int s = 0; s < STEPS; s++) {
            step_logits(l, V, s, row == 3 ? 0 : row);
            CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0, "next: %s", err);
            solo[row][s] = r.token;
            sample_observe(&st, r.token, err, sizeof err);
        }
        sample_state_free(&st);
    }
    CHECK(!memcmp(solo[0], solo[3], sizeof solo[0]), "same seed and stream gave different sequences");
    CHECK(memcmp(solo[0], solo[1], sizeof solo[0]) != 0, "choices 0 and 1 of one seed gave the same sequence");
    int same = 0;
    for (int s = 0; s < STEPS; s++)
        same += solo[0][s] == solo[2][s];
    CHECK(same < STEPS / 2, "seeds 42 and 43 agree on %d of %d steps", same, STEPS);

    /* interleaved: each step visits the rows in a different order, with two scratches */
    sample_state st[ROWS];
    for (int row = 0; row < ROWS; row++)
        CHECK(sample_state_init(&st[row], &p, seed[row], stream[row], V, STEPS, err, sizeof err) == 0, "state: %s",
              err);
    for (int s = 0; s < STEPS; s++) {
        int order[ROWS] = {0, 1, 2, 3};
        for (int i = ROWS - 1; i > 0; i--) {
            int j = (int)(tuniform() * (i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < ROWS; i++) {
            int row = order[i];
            step_logits(l, V, s, row == 3 ? 0 : row);
            CHECK(sample_next(l, V, &p, &st[row], i % 2 ? &sc : &sc2, &r, err, sizeof err) == 0, "next: %s", err);
            mixed[row][s] = r.token;
            sample_observe(&st[row], r.token, err, sizeof err);
        }
    }
    for (int row = 0; row < ROWS; row++) {
        CHECK(!memcmp(solo[row], mixed[row], sizeof solo[row]), "row %d: interleaving changed its sequence", row);
        sample_state_free(&st[row]);
    }
    sample_scratch_free(&sc);
    sample_scratch_free(&sc2);
}

/* ---- log-probs -------------------------------------------------------------------------------------------- */

static void test_logprobs(void)
{
    enum { V = 5000 };
    static float l[V];
    static double ref[V];
    random_logits(l, V, 16);
    l[17] = -INFINITY;
    l[18] = NAN;
    l[100] = l[200] = 9.5f; /* a tie inside the top list: 100 must come first */
    sample_params p = params_default();
    p.logprobs = true;
    p.n_top_logprobs = 20;
    /* modifiers that must NOT move the reported log-probs */
    int32_t bid[1] = {3};
    float bval[1] = {50};
    p.n_logit_bias = 1;
    p.logit_bias_id = bid;
    p.logit_bias = bval;
    p.temperature = 0.5f;
    p.top_p = 0.9f;
    double m = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        if (l[i] == l[i] && l[i] > m)
            m = l[i];
    for (int i = 0; i < V; i++)
        s += l[i] == l[i] ? exp((double)l[i] - m) : 0;
    for (int i = 0; i < V; i++)
        ref[i] = l[i] == l[i] ? (double)l[i] - m - log(s) : -INFINITY;

    sample_state st;
    sample_scratch sc;
    sample_result r;
    CHECK(sample_params_check(&p, V, err, sizeof err) == 0, "check: %s", err);
    CHECK(sample_state_init(&st, &p, 5, 0, V, 1, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    for (int rep = 0; rep < 50; rep++) {
        CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0, "next: %s", err);
        CHECK(fabs(r.logprob - ref[r.token]) <= 1e-6 + 1e-7 * fabs(ref[r.token]), "logprob of %d: %.9g vs %.9g",
              (int)r.token, r.logprob, ref[r.token]);
    }
    /* no bias, hotter: varied tokens, same reported log-probs */
    p.n_logit_bias = 0;
    p.temperature = 1.5f;
    p.top_p = 1;
    for (int rep = 0; rep < 50; rep++) {
        CHECK(sample_next(l, V, &p, &st, &sc, &r, err, sizeof err) == 0, "next: %s", err);
        CHECK(fabs(r.logprob - ref[r.token]) <= 1e-6 + 1e-7 * fabs(ref[r.token]), "logprob of %d: %.9g vs %.9g",
              (int)r.token, r.logprob, ref[r.token]);
    }
    CHECK(r.n_top == 20, "n_top %d", r.n_top);
    /* reference top-20 by full scan: (logprob desc, id asc) */
    int top[20];
    for (int k = 0; k < 20; k++) {
        int b = -1;
        for (int i = 0; i < V; i++) {
            int used = 0;
            for (int j = 0; j < k; j++)
                used |= top[j] == i;
            if (!used && ref[i] > -INFINITY && (b < 0 || ref[i] > ref[b]))
                b = i;
        }
        top[k] = b;
    }
    for (int k = 0; k < 20; k++) {
        CHECK(r.top_id[k] == top[k], "top[%d] = %d, want %d", k, (int)r.top_id[k], top[k]);
        CHECK(fabs(r.top_logprob[k] - ref[top[k]]) <= 1e-6 + 1e-7 * fabs(ref[top[k]]), "top[%d] logprob %.9g vs %.9g",
              k, r.top_logprob[k], ref[top[k]]);
    }
    CHECK(top[0] == 100 && top[1] == 200, "tie setup: top %d %d", top[0], top[1]);

    /* 64 alternatives on a tiny vocabulary: NaN / -inf report the -9999 floor, never -inf */
    enum { W = 64 };
    float tiny[W];
    random_logits(tiny, W, 4);
    tiny[3] = -INFINITY;
    tiny[9] = NAN;
    p.n_top_logprobs = W;
    p.n_logit_bias = 0;
    CHECK(sample_params_check(&p, W, err, sizeof err) == 0, "check 64: %s", err);
    sample_scratch sct;
    CHECK(sample_scratch_init(&sct, W, err, sizeof err) == 0, "scratch: %s", err);
    CHECK(sample_next(tiny, W, &p, &st, &sct, &r, err, sizeof err) == 0 && r.n_top == W, "64 tops: %d", r.n_top);
    CHECK(r.top_id[W - 2] == 3 && r.top_id[W - 1] == 9, "-inf/NaN last, by id: %d %d", (int)r.top_id[W - 2],
          (int)r.top_id[W - 1]);
    CHECK(r.top_logprob[W - 1] == SAMPLE_LOGPROB_FLOOR && r.top_logprob[W - 2] == SAMPLE_LOGPROB_FLOOR, "floor: %g %g",
          r.top_logprob[W - 2], r.top_logprob[W - 1]);
    for (int k = 1; k < W; k++)
        CHECK(r.top_logprob[k] <= r.top_logprob[k - 1], "top list not descending at %d", k);
    p.n_top_logprobs = W + 1;
    CHECK(sample_params_check(&p, 1000, err, sizeof err) < 0, "65 alternatives accepted");
    p.n_top_logprobs = 10;
    CHECK(sample_params_check(&p, 5, err, sizeof err) < 0, "more alternatives than tokens accepted");
    /* without logprobs nothing is reported */
    p.logprobs = false;
    CHECK(sample_next(tiny, W, &p, &st, &sct, &r, err, sizeof err) == 0 && r.n_top == 0 && r.logprob == 0,
          "logprobs off still reported");
    sample_scratch_free(&sct);
    sample_scratch_free(&sc);
    sample_state_free(&st);
}

static void test_params(void)
{
    sample_params p = params_default();
    CHECK(sample_params_check(&p, 10, err, sizeof err) == 0, "defaults: %s", err);
    p.temperature = -1;
    CHECK(sample_params_check(&p, 10, err, sizeof err) < 0 && strstr(err, "temperature"), "T<0: %s", err);
    p.temperature = NAN;
    CHECK(sample_params_check(&p, 10, err, sizeof err) < 0, "T NaN accepted");
    p = params_default();
    p.top_p = 1.5f;
    CHECK(sample_params_check(&p, 10, err, sizeof err) < 0 && strstr(err, "top_p"), "top_p: %s", err);
    p = params_default();
    p.top_k = -1;
    CHECK(sample_params_check(&p, 10, err, sizeof err) < 0 && strstr(err, "top_k"), "top_k: %s", err);
    p = params_default();
    p.presence_penalty = INFINITY;
    CHECK(sample_params_check(&p, 10, err, sizeof err) < 0, "inf penalty accepted");
    CHECK(sample_params_check(&p, 0, err, sizeof err) < 0, "V=0 accepted");
    /* logits longer than the scratch: an error, never an overrun */
    sample_scratch sc;
    sample_state st;
    sample_result r;
    float l[20] = {0};
    p = params_default();
    CHECK(sample_scratch_init(&sc, 10, err, sizeof err) == 0, "scratch: %s", err);
    CHECK(sample_state_init(&st, &p, 1, 0, 20, 1, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_next(l, 20, &p, &st, &sc, &r, err, sizeof err) < 0 && r.token == 0, "V > scratch accepted");
    sample_state_free(&st);
    sample_scratch_free(&sc);
}

/* ---- vLLM's min_p and repetition_penalty ---------------------------------------------------------------- */

/* min_p keeps the tokens at least min_p as likely as the best: with logits 0, -ln 2, -ln 4, -ln 8 (probabilities
 * 1 : 1/2 : 1/4 : 1/8 of the best) and min_p 0.3 only ids 0 and 1 may be drawn, in the ratio 2 : 1 (sample_dist
 * gives 2/3 and 1/3 exactly up to float rounding).  repetition_penalty (once per distinct token of the prompt and
 * the generated ones): a positive logit is divided, a negative one multiplied: logits {4, 3, -1, -2} with token 0
 * in the prompt and penalty 2 → {2, 3, -1, -2}: greedy picks 1; token 1 generated too → {2, 1.5, ...}: picks 0;
 * a repeated prompt id counts once ({0, 0} in the prompt gives 2, not 1). */
static void test_vllm_params(void)
{
    enum { V = 4 };
    float l[V] = {0, -logf(2), -logf(4), -logf(8)}, probs[V];
    sample_params p = params_default();
    p.min_p = 0.3f;
    sample_state st;
    sample_scratch sc;
    CHECK(sample_state_init(&st, &p, 1, 0, V, 10, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    CHECK(sample_dist(l, V, &p, &st, &sc, probs, err, sizeof err) == 0, "min_p dist: %s", err);
    CHECK(fabs(probs[0] - 2.0 / 3) < 1e-6 && fabs(probs[1] - 1.0 / 3) < 1e-6 && probs[2] == 0 && probs[3] == 0,
          "min_p 0.3: %.6f %.6f %.6f %.6f", probs[0], probs[1], probs[2], probs[3]);
    sample_state_free(&st);

    float r4[V] = {4, 3, -1, -2};
    int32_t prompt[2] = {0, 0};
    p = params_default();
    p.temperature = 0;
    p.repetition_penalty = 2;
    p.prompt = prompt;
    p.n_prompt = 2;
    sample_result r;
    CHECK(sample_state_init(&st, &p, 1, 0, V, 10, err, sizeof err) == 0, "state: %s", err);
    CHECK(sample_next(r4, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 1, "penalised prompt token: %d",
          (int)r.token);
    CHECK(sample_observe(&st, 1, err, sizeof err) == 0, "observe: %s", err);
    CHECK(sample_next(r4, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 0, "both penalised: %d",
          (int)r.token);
    /* negative logits are multiplied: ids 0 and 1 far below, id 2's -1.5 (in the prompt) becomes -3, under id 3's -2 */
    float neg[V] = {-100, -100, -1, -2};
    int32_t pr2[1] = {2};
    p.prompt = pr2;
    p.n_prompt = 1;
    sample_state_free(&st);
    CHECK(sample_state_init(&st, &p, 1, 0, V, 10, err, sizeof err) == 0, "state: %s", err);
    neg[2] = -1.5f; /* -1.5 x 2 = -3 < -2 */
    CHECK(sample_next(neg, V, &p, &st, &sc, &r, err, sizeof err) == 0 && r.token == 3, "negative logit multiplied: %d",
          (int)r.token);
    /* bad values */
    sample_params b = params_default();
    b.min_p = 1.5f;
    CHECK(sample_params_check(&b, V, err, sizeof err) < 0 && strstr(err, "min_p"), "min_p 1.5 accepted");
    b = params_default();
    b.repetition_penalty = -1;
    CHECK(sample_params_check(&b, V, err, sizeof err) < 0 && strstr(err, "repetition_penalty"),
          "repetition_penalty -1 accepted");
    sample_state_free(&st);
    sample_scratch_free(&sc);
}

int main(void)
{
    test_params();
    test_vllm_params();
    test_greedy();
    test_bias();
    test_penalties();
    test_truncation();
    test_random_cases();
    test_seeds();
    test_logprobs();
    return test_finish("test_sample");
}
