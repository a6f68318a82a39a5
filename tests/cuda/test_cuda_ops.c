/*
 * test_cuda_ops.c — every CUDA op against the CPU op it mirrors, on fresh
 * random inputs (the CPU backend is the oracle; see cpu.h, quant.h).
 *
 * Tolerances, fixed before the first GPU run:
 *  - dequant (fp32 output): bit-identical to quant_dequant_row_scalar.  The
 *    kernel issues the same IEEE operations in the same order with explicit
 *    round-to-nearest intrinsics (no FMA contraction), so any difference is a
 *    layout bug.
 *  - matmul: the GPU rounds both W (dequantized) and X to bf16 (unit roundoff
 *    u = 2^-9 each) and accumulates in fp32, the CPU is exact fp32.  Each term
 *    w_k x_k then carries a relative error of at most about 2u = 2^-8, and
 *    these errors are independent with random signs, so the error of a dot
 *    product is a random walk of size ~2^-8 * sqrt(sum_k (w_k x_k)^2) — i.e.
 *    2^-8 relative rounding × sqrt(K) × the typical term.  Bound per output:
 *    |dy| <= 4 * 2^-8 * sqrt(sum_k (w_k x_k)^2) + 1e-5 * sum_k |w_k x_k| (the
 *    factor 4 is > 6 standard deviations of the walk; the second term covers
 *    fp32 accumulation order, K * 2^-24 relative).  Plus a global
 *    ||dy|| / ||y|| <= 1e-2 (METHOD.md: bf16 operands land in 1e-3..1e-2).
 *  - rmsnorm: the same fp32 operations after a double sum of squares whose
 *    order differs: |dy| <= 1e-6 |y|.
 *  - RoPE: CUDA cosf/sinf are within 2 ulp (glibc within 1), so each rotated
 *    value differs by at most ~3 ulp of the pair's magnitude: |dy| <= 1e-6 (|a|+|b|).
 *  - SiLU·mul: CUDA expf within 2 ulp: |dy| <= 1e-6 |y| + 1e-30;  GELU·mul
 *    (1 + tanh cancels for negative inputs): |dy| <= 1e-6 (|g u| + |y|).
 *  - attention: fp32 online softmax against a double-precision two-pass
 *    reference; values in [-1, 1], scores O(1): |dy| <= 2e-5.  The engine
 *    keeps KV in bf16 (or int8 codes with a scale per vector), so the test's
 *    keys and values are values that format holds (kv_round below): the
 *    device's storing of them is exact and the bound is the kernels' alone.
 *  - KV write: bf16(x) rounded to nearest even, bit-identical to
 *    quant_fp32_to_bf16; int8: scale = amax/127 and code = rint(x / scale),
 *    widened as code * scale, bit-identical to kv_round's host arithmetic (IEEE
 *    division and rounding on both sides); at the right page and slot, every
 *    other slot 0.
 *  - LoRA mask: bf16(x) where the column's adapter is the token's, else 0;
 *    bit-identical to quant_fp32_to_bf16 (both round to nearest even) on
 *    random finite bit patterns, ties included.
 *  - LoRA group (x·Aᵀ, mask, ·Bᵀ added onto y, lora.cu) against the same
 *    roundings on the host (bf16 x, A and scale·B; x·Aᵀ summed in double and
 *    rounded to bf16; the second product in double): the GPU's fp32 sum of
 *    x·Aᵀ can round to the neighbouring bf16 where the host's sits next to a
 *    tie, moving that term by 2^-8 of itself, so |dy| <= 2^-8 Σ_k |t_k b_k| +
 *    1e-6 (|y| + Σ_k |t_k b_k|) (fp32 accumulation and the final add).  A wrong
 *    column, slot, scale or transpose moves outputs by the whole term.  Tokens
 *    of the bare base, and slots the token's adapter does not adapt, must keep
 *    y bit for bit (the masked columns add exactly 0).
 * Every output buffer is poisoned with NaN before the GPU writes it, and a NaN
 * never passes a comparison.
 */
#include <math.h>
#include <stdint.h>

#include "engine/cpu.h"
#include "cuda/cuda_test.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/quant.h"
#include "batch/sample.h"
#include "test.h"
#include "base/util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() & 0xffffff) / (float)0x1000000;
}

static void put_half(uint8_t *p, float v)
{
    uint16_t h = quant_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Fills n_elems of `type` with random values whose magnitude is about `scale`:
 * random bytes for the quants, sane fp16 scales (never inf/NaN). */
static void fill_weights(uint32_t type, uint8_t *buf, int64_t n_elems, float scale)
{
    size_t bytes;
    quant_row_bytes(type, n_elems, &bytes);
    for (size_t i = 0; i < bytes; i++)
        buf[i] = (uint8_t)rnd();
    int64_t be = quant_block_elems(type);
    size_t bb = quant_block_bytes(type);
    for (int64_t b = 0; b < n_elems / be; b++) {
        uint8_t *p = buf + (size_t)b * bb;
        switch (type) {
        case GGML_F32: {
            float v = frand(-scale, scale);
            memcpy(p, &v, 4);
            break;
        }
        case GGML_F16:
            put_half(p, frand(-scale, scale));
            break;
        case GGML_BF16: {
            uint16_t h = quant_fp32_to_bf16(frand(-scale, scale));
            memcpy(p, &h, 2);
            break;
        }
        case GGML_Q8_0:
            put_half(p, frand(0.5f, 1.5f) * scale / 64);
            break;
        case GGML_Q4_0:
        case GGML_Q5_0:
            put_half(p, frand(0.5f, 1.5f) * scale / 8);
            break;
        case GGML_Q4_1:
        case GGML_Q5_1:
            put_half(p, frand(0.5f, 1.5f) * scale / 8);
            put_half(p + 2, -frand(0.5f, 1.5f) * scale);
            break;
        case GGML_Q4_K:
        case GGML_Q5_K:
            put_half(p, frand(0.5f, 1.5f) * scale / 256);
            put_half(p + 2, frand(0.5f, 1.5f) * scale / 32);
            break;
        case GGML_Q6_K:
            put_half(p + 208, frand(0.5f, 1.5f) * scale / 2048);
            break;
        case GGML_Q8_K: {
            float d = frand(0.5f, 1.5f) * scale / 64;
            memcpy(p, &d, 4);
            break;
        }
        }
    }
}

static const uint32_t TYPES[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                 GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q8_K};
#define NTYPES (sizeof TYPES / sizeof TYPES[0])

static void test_dequant(void)
{
    char err[SPILL_ERRLEN];
    int64_t N = 7, K = 768;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        uint32_t type = TYPES[ti];
        size_t rb;
        quant_row_bytes(type, K, &rb);
        uint8_t *w = malloc(rb * (size_t)N);
        float *got = malloc((size_t)(N * K) * 4), *want = malloc((size_t)(N * K) * 4);
        fill_weights(type, w, N * K, 1.0f);
        for (int64_t i = 0; i < N * K; i++)
            got[i] = NAN;
        for (int64_t n = 0; n < N; n++)
            quant_dequant_row_scalar(type, w + (size_t)n * rb, want + n * K, K);
        int rc = cuda_op_dequant(type, w, N, K, got, err, sizeof err);
        CHECK(rc == 0, "dequant %s: %s", quant_type_name(type), err);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < N * K; i++)
            if (memcmp(&got[i], &want[i], 4) != 0) {
                bad++;
                if (first < 0)
                    first = i;
            }
        CHECK(bad == 0, "dequant %s: %lld of %lld values differ (first at %lld: %.9g vs %.9g)", quant_type_name(type),
              (long long)bad, (long long)(N * K), (long long)first, first >= 0 ? got[first] : 0.0,
              first >= 0 ? want[first] : 0.0);
        fprintf(stderr, "dequant %-5s %lld values: %s\n", quant_type_name(type), (long long)(N * K),
                bad ? "DIFFER" : "bit-identical");
        free(w), free(got), free(want);
    }
}

static void test_matmul(cpu_pool *pool)
{
    static const uint32_t mt[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0,
                                  GGML_Q4_1, GGML_Q5_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    static const int64_t Ts[] = {1, 7, 64};
    char err[SPILL_ERRLEN];
    int64_t N = 96, K = 512;
    for (size_t ti = 0; ti < sizeof mt / sizeof mt[0]; ti++) {
        uint32_t type = mt[ti];
        size_t rb;
        quant_row_bytes(type, K, &rb);
        uint8_t *w = malloc(rb * (size_t)N);
        float *wf = malloc((size_t)(N * K) * 4);
        fill_weights(type, w, N * K, 1.0f / sqrtf((float)K) * 2);
        for (int64_t n = 0; n < N; n++)
            quant_dequant_row_scalar(type, w + (size_t)n * rb, wf + n * K, K);
        for (size_t tj = 0; tj < sizeof Ts / sizeof Ts[0]; tj++) {
            int64_t T = Ts[tj];
            float *x = malloc((size_t)(T * K) * 4), *y = malloc((size_t)(T * N) * 4), *yc = malloc((size_t)(T * N) * 4);
            for (int64_t i = 0; i < T * K; i++)
                x[i] = frand(-1, 1);
            for (int64_t i = 0; i < T * N; i++)
                y[i] = NAN;
            int rc = cuda_op_matmul(type, w, N, K, x, T, y, err, sizeof err);
            CHECK(rc == 0, "matmul %s: %s", quant_type_name(type), err);
            rc = cpu_matmul(pool, w, type, N, K, x, T, yc, err, sizeof err);
            CHECK(rc == 0, "cpu matmul %s: %s", quant_type_name(type), err);
            double worst = 0, dn = 0, yn = 0;
            int bad = 0;
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = 0; n < N; n++) {
                    double s2 = 0, s1 = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double p = (double)wf[n * K + k] * x[t * K + k];
                        s2 += p * p;
                        s1 += fabs(p);
                    }
                    double tol = 4.0 / 256 * sqrt(s2) + 1e-5 * s1;
                    double d = fabs((double)y[t * N + n] - yc[t * N + n]);
                    if (!(d <= tol))
                        bad++;
                    if (d / (tol > 0 ? tol : 1) > worst || isnan(d))
                        worst = isnan(d) ? INFINITY : d / tol;
                    dn += d * d;
                    yn += (double)yc[t * N + n] * yc[t * N + n];
                }
            double rel = sqrt(dn / (yn > 0 ? yn : 1));
            CHECK(bad == 0, "matmul %s T=%lld: %d outputs beyond the bf16 bound (worst %.2f of the bound)",
                  quant_type_name(type), (long long)T, bad, worst);
            CHECK(rel <= 1e-2, "matmul %s T=%lld: relative error %.3g", quant_type_name(type), (long long)T, rel);
            if (T == 64)
                fprintf(stderr, "matmul %-5s N=%lld K=%lld T=%lld: rel err %.2e, worst %.2f of the bound\n",
                        quant_type_name(type), (long long)N, (long long)K, (long long)T, rel, worst);
            free(x), free(y), free(yc);
        }
        free(w), free(wf);
    }
}

static void test_rmsnorm(void)
{
    char err[SPILL_ERRLEN];
    int64_t T = 5, D = 576;
    float *x = malloc((size_t)(T * D) * 4), *w = malloc((size_t)D * 4), *y = malloc((size_t)(T * D) * 4),
          *yc = malloc((size_t)(T * D) * 4);
    for (int plus = 0; plus < 2; plus++) {
        for (int64_t i = 0; i < T * D; i++)
            x[i] = frand(-3, 3), y[i] = NAN;
        for (int64_t i = 0; i < D; i++)
            w[i] = frand(-1, 2);
        CHECK(cuda_op_rmsnorm(x, w, T, D, 1e-5f, plus, y, err, sizeof err) == 0, "rmsnorm: %s", err);
        cpu_rmsnorm(yc, x, w, T, D, 1e-5f, plus);
        int bad = 0;
        for (int64_t i = 0; i < T * D; i++)
            bad += !(fabsf(y[i] - yc[i]) <= 1e-6f * fabsf(yc[i]));
        CHECK(bad == 0, "rmsnorm (plus_one %d): %d values differ", plus, bad);
    }
    free(x), free(w), free(y), free(yc);
}

static void test_rope(void)
{
    char err[SPILL_ERRLEN];
    int64_t T = 6;
    int H = 3, S = 64;
    int32_t pos[6] = {0, 1, 17, 255, 1000, 4095};
    float *x = malloc((size_t)(T * H * S) * 4), *xc = malloc((size_t)(T * H * S) * 4);
    for (int style = 0; style < 2; style++)
        for (int nr = 0; nr < 2; nr++) {
            rope_cfg cfg = {0};
            cfg.style = style;
            cfg.n_rot = nr ? 32 : 64;
            cfg.freq_base = 10000.0;
            cpu_rope r;
            CHECK(cpu_rope_init(&r, &cfg, err, sizeof err) == 0, "rope init: %s", err);
            for (int64_t i = 0; i < T * H * S; i++)
                x[i] = xc[i] = frand(-2, 2);
            CHECK(cuda_op_rope(x, T, H, S, pos, r.inv_freq, r.n_rot, r.style, r.attn_scale, err, sizeof err) == 0,
                  "rope: %s", err);
            cpu_rope_apply(&r, xc, T, H, S, pos);
            int bad = 0;
            for (int64_t i = 0; i < T * H * S; i++)
                bad += !(fabsf(x[i] - xc[i]) <= 1e-6f * 4.0f);
            CHECK(bad == 0, "rope style %d n_rot %d: %d values differ", style, r.n_rot, bad);
        }
    free(x), free(xc);
}

static void test_act(void)
{
    char err[SPILL_ERRLEN];
    int64_t n = 4099;
    float *g = malloc((size_t)n * 4), *u = malloc((size_t)n * 4), *gc = malloc((size_t)n * 4);
    for (int gelu = 0; gelu < 2; gelu++) {
        for (int64_t i = 0; i < n; i++)
            g[i] = gc[i] = frand(-8, 8), u[i] = frand(-2, 2);
        CHECK(cuda_op_act_mul(g, u, n, gelu, err, sizeof err) == 0, "act_mul: %s", err);
        float *gin = malloc((size_t)n * 4);
        memcpy(gin, gc, (size_t)n * 4);
        if (gelu)
            cpu_gelu_tanh_mul(gc, u, n);
        else
            cpu_silu_mul(gc, u, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float tol = gelu ? 1e-6f * (fabsf(gin[i] * u[i]) + fabsf(gc[i])) : 1e-6f * fabsf(gc[i]) + 1e-30f;
            bad += !(fabsf(g[i] - gc[i]) <= tol);
        }
        CHECK(bad == 0, "%s: %d values differ", gelu ? "gelu_mul" : "silu_mul", bad);
        free(gin);
    }
    free(g), free(u), free(gc);
}

/* The n values of one key or value vector as the engine's KV pages hold them: bf16 (round to nearest even), or
 * int8 codes rint(x / (amax/127)) times that scale. */
static void kv_round(const float *x, float *out, int n, int dtype)
{
    if (dtype != KV_I8) {
        for (int i = 0; i < n; i++)
            out[i] = quant_bf16_to_fp32(quant_fp32_to_bf16(x[i]));
        return;
    }
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float sc = amax / 127.0f;
    for (int i = 0; i < n; i++) {
        float q = sc > 0.0f ? rintf(x[i] / sc) : 0.0f;
        int8_t code = (int8_t)fmaxf(-127.0f, fminf(127.0f, q)); /* an integer code: rint's -0 is stored as 0 */
        out[i] = (float)code * sc;
    }
}

/* An attention case's inputs: an arena of NP pages (one layer, K kv heads of P positions of S values in
 * [-1, 1], each vector as the KV pages of dtype hold it) and q (T, H, S) in [-2, 2]. */
static void attention_inputs(int NP, int P, int K, int S, int H, int64_t T, int dtype, float **arena, float **q)
{
    size_t an = (size_t)NP * 2 * K * P * S, qn = (size_t)T * H * S;
    *arena = malloc(an * 4);
    *q = malloc(qn * 4);
    for (size_t i = 0; i < an; i++)
        (*arena)[i] = frand(-1, 1);
    for (size_t i = 0; i < an; i += (size_t)S)
        kv_round(*arena + i, *arena + i, S, dtype);
    for (size_t i = 0; i < qn; i++)
        (*q)[i] = frand(-1, 1) * 2;
}

/* KV write into pages: three rows' tokens (a decode token, a chunk, a prefill) in shuffled pages; the arena read
 * back must hold exactly bf16(k), bf16(v) at (page, kv head, slot) and zeros everywhere else. */
static void test_kv_write(int dtype)
{
    enum { P = 4, NP = 16, K = 2, S = 80, T = 10 };
    int32_t pos[T] = {8, 9, 10, 11, 12, 0, 1, 2, 3, 4}, seq[T] = {0, 1, 1, 1, 1, 2, 2, 2, 2, 2};
    int32_t pt_off[3] = {0, 3, 7}, pages[9] = {11, 2, 7, 5, 0, 14, 9, 3, 12};
    size_t kn = (size_t)T * K * S, an = (size_t)NP * 2 * K * P * S;
    float *k = malloc(kn * 4), *v = malloc(kn * 4), *arena = malloc(an * 4), *want = calloc(an, 4);
    for (size_t i = 0; i < kn; i++) {
        k[i] = frand(-3, 3);
        v[i] = frand(-3, 3);
    }
    k[5] = 1.0f + 1.0f / 256; /* a tie: rounds to even (1.0) */
    k[6] = 1.0f + 3.0f / 256; /* a tie: rounds to even (1 + 4/256) */
    for (size_t i = 0; i < an; i++)
        arena[i] = NAN;
    for (int i = 0; i < S; i++) /* token 3, head 1: every key value 0 (scale 0) */
        k[(3 * K + 1) * S + i] = 0.0f;
    for (int t = 0; t < T; t++)
        for (int kh = 0; kh < K; kh++) {
            size_t off = (size_t)pages[pt_off[seq[t]] + pos[t] / P] * 2 * K * P * S +
                         ((size_t)kh * P + (size_t)(pos[t] % P)) * S;
            kv_round(k + ((size_t)t * K + kh) * S, want + off, S, dtype);
            kv_round(v + ((size_t)t * K + kh) * S, want + off + (size_t)K * P * S, S, dtype);
        }
    char err[SPILL_ERRLEN];
    int rc = cuda_op_kv_write(k, v, T, pos, seq, pt_off, pages, 9, 3, NP, P, K, S, dtype, arena, err, sizeof err);
    CHECK(rc == 0, "kv write: %s", err);
    size_t bad = 0;
    for (size_t i = 0; i < an; i++)
        bad += memcmp(&arena[i], &want[i], 4) != 0;
    CHECK(rc == 0 && bad == 0, "kv write (%s): %zu of %zu arena values differ from the host's rounding in place",
          kv_dtype_name(dtype), bad, an);
    free(k), free(v), free(arena), free(want);
}

/* Double-precision reference over the same paged layout (kv.h). */
static void attention_ref(const float *q, const float *arena, int P, int H, int K, int S, const int32_t *pos,
                          const int32_t *seq, int64_t T, const int32_t *pt_off, const int32_t *pages, int window,
                          float scale, float softcap, float *out)
{
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / K);
            int32_t p = pos[t], lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            double sc[4096], mx = -INFINITY, sum = 0, o[256] = {0}; /* keys of a row: <= 4,096 here */
            for (int32_t j = lo; j <= p; j++) {
                const float *kr = arena + (size_t)pages[pt_off[seq[t]] + j / P] * 2 * K * P * S +
                                  ((size_t)kh * P + (size_t)(j % P)) * S;
                double s = 0;
                for (int d = 0; d < S; d++)
                    s += (double)q[(t * H + h) * S + d] * kr[d];
                s *= scale;
                if (softcap > 0)
                    s = softcap * tanh(s / softcap);
                sc[j - lo] = s;
                mx = s > mx ? s : mx;
            }
            for (int32_t j = lo; j <= p; j++) {
                sc[j - lo] = exp(sc[j - lo] - mx);
                sum += sc[j - lo];
            }
            for (int32_t j = lo; j <= p; j++) {
                const float *vr = arena + (size_t)pages[pt_off[seq[t]] + j / P] * 2 * K * P * S +
                                  ((size_t)kh * P + (size_t)(j % P)) * S + (size_t)K * P * S;
                for (int d = 0; d < S; d++)
                    o[d] += sc[j - lo] / sum * vr[d];
            }
            for (int d = 0; d < S; d++)
                out[(t * H + h) * S + d] = (float)o[d];
        }
}

/* Attention tolerances, fixed before the first run.  fp32 kernels: sums of at most ~150 fp32 terms in another
 * order than the reference: 2e-5 on outputs of magnitude <= 1.  TF32 tensor-core tiles (head sizes <= 128,
 * multiples of 8): q, k, p and v are rounded to 10 explicit mantissa bits (relative 2^-11 each), so a score
 * moves by at most scale * sum|q_d k_d| * 2^-10 = (3 / sqrt(128)) * 128 * 0.5 * 2^-10 = 0.017 here (q in [-2, 2],
 * k in [-1, 1]) and an output (a convex mix of v in [-1, 1]) by about that plus 2^-10: 2e-2. */
static double att_tol(int kind, int S)
{
    return kind == 2 && S <= 128 && S % 8 == 0 ? 2e-2 : 2e-5;
}

/* One attention case on the GPU against attention_ref: the largest |difference|, or -1 (with a failed check)
 * when the op fails. */
static double attention_case(const float *q, const float *arena, int NP, int P, int H, int K, int S, int dtype,
                             const int32_t *pos, const int32_t *seq, int64_t T, const int32_t *pt_off,
                             const int32_t *pages, int n_table, int n_seqs, int window, float scale, float softcap,
                             int tile_min_run, bool split)
{
    char err[SPILL_ERRLEN];
    size_t qn = (size_t)T * H * S;
    float *y = malloc(qn * 4), *yr = malloc(qn * 4);
    for (size_t i = 0; i < qn; i++)
        y[i] = NAN;
    int rc = cuda_op_attention(q, arena, NP, P, H, K, S, dtype, pos, seq, T, pt_off, pages, n_table, n_seqs, window, scale,
                               softcap, tile_min_run, split, y, err, sizeof err);
    CHECK(rc == 0, "attention: %s", err);
    attention_ref(q, arena, P, H, K, S, pos, seq, T, pt_off, pages, window, scale, softcap, yr);
    double worst = 0;
    for (size_t i = 0; i < qn; i++) {
        double d = fabs((double)y[i] - yr[i]);
        worst = !(d <= worst) ? d : worst;
    }
    free(y), free(yr);
    return rc ? -1 : worst;
}

static void test_attention(int dt)
{
    enum { P = 4, NP = 16 };
    /* (H, K, S): GQA groups of 2, 8 (two warps' chunks), 5 (a partial chunk), MHA, MQA; S not a multiple of 32 */
    static const int cfgs[][3] = {{4, 2, 64}, {8, 1, 128}, {10, 2, 80}, {3, 3, 32}, {16, 2, 256}};
    /* three rows: a decode token at position 8, a chunk at 9..12, a prefill at 0..4 */
    int32_t pos[10] = {8, 9, 10, 11, 12, 0, 1, 2, 3, 4}, seq[10] = {0, 1, 1, 1, 1, 2, 2, 2, 2, 2};
    int32_t pt_off[3] = {0, 3, 7}, pages[9] = {11, 2, 7, 5, 0, 14, 9, 3, 12};
    int64_t T = 10;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        int H = cfgs[ci][0], K = cfgs[ci][1], S = cfgs[ci][2];
        float *arena, *q;
        attention_inputs(NP, P, K, S, H, T, dt, &arena, &q);
        /* variants 0-2: every token through the per-token kernel; 3-5: every run (even a lone decode token) in
         * fp32 tiles; 6-8: in TF32 tensor-core tiles (att_tol) */
        for (int variant = 0; variant < 9; variant++) {
            int window = variant % 3 == 1 ? 3 : 0, tiled = variant >= 3;
            cuda_attention_kind(variant >= 6 ? 2 : 1);
            float softcap = variant % 3 == 2 ? 2.0f : 0.0f, scale = 1.0f / sqrtf((float)S) * 3;
            double worst = attention_case(q, arena, NP, P, H, K, S, dt, pos, seq, T, pt_off, pages, 9, 3, window,
                                          scale, softcap, tiled, true);
            CHECK(worst >= 0 && worst <= att_tol(variant >= 6 ? 2 : 1, S),
                  "attention (%s KV) H=%d K=%d S=%d variant %d: max |dy| %.3g", kv_dtype_name(dt), H, K, S, variant,
                  worst);
        }
        free(arena), free(q);
    }
    cuda_attention_kind(2); /* the default again */
}

/* Longer rows through the tiled kernel: a 100-token prompt from position 0 (several tiles, several key blocks),
 * a 33-token chunk at positions 40..72 of a second row, a decode token at 150 of a third, with sliding windows
 * that cut inside key blocks.  Same 2e-5 bound as above: fp32 sums of at most ~150 terms in another order. */
static void test_attention_long(int dt)
{
    enum { P = 16, NP = 40 };
    static const int cfgs[][3] = {{32, 8, 128}, {8, 1, 64}, {16, 2, 256}, {10, 2, 80}, {4, 4, 32}};
    int64_t T = 100 + 33 + 1;
    int32_t pos[134], seq[134], pt_off[3] = {0, 7, 12}, pages[22];
    for (int i = 0; i < 100; i++)
        pos[i] = i, seq[i] = 0;
    for (int i = 0; i < 33; i++)
        pos[100 + i] = 40 + i, seq[100 + i] = 1;
    pos[133] = 150, seq[133] = 2;
    /* row 0: 7 pages, row 1: 5 pages (positions < 80), row 2: 10 pages (positions <= 150); shuffled ids */
    for (int i = 0; i < 22; i++)
        pages[i] = (i * 17 + 5) % NP;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        int H = cfgs[ci][0], K = cfgs[ci][1], S = cfgs[ci][2];
        float *arena, *q;
        attention_inputs(NP, P, K, S, H, T, dt, &arena, &q);
        for (int variant = 0; variant < 6; variant++) {
            int window = variant % 3 == 1 ? 37 : variant % 3 == 2 ? 5 : 0, kind = variant < 3 ? 1 : 2;
            float scale = 1.0f / sqrtf((float)S) * 2;
            cuda_attention_kind(kind);
            double worst = attention_case(q, arena, NP, P, H, K, S, dt, pos, seq, T, pt_off, pages, 22, 3, window,
                                          scale, 0.0f, 8, true);
            CHECK(worst >= 0 && worst <= att_tol(kind, S),
                  "attention (long, %s, %s KV) H=%d K=%d S=%d window %d: max |dy| %.3g", kind == 2 ? "tf32" : "fp32",
                  kv_dtype_name(dt), H, K, S, window, worst);
            if (variant % 3 == 0)
                fprintf(stderr, "attention tiled %s, %s KV, H=%d K=%d S=%d (%d tokens a tile): max |dy| %.2e\n",
                        kind == 2 && S <= 128 ? "tf32" : "fp32", kv_dtype_name(dt), H, K, S,
                        (S <= 128 ? 64 : 32) / (H / K), worst);
        }
        free(arena), free(q);
    }
    cuda_attention_kind(2); /* the default again */
}

/* Decode tokens of long rows split their keys over several warps (flash-decoding) when a pass has few of
 * them: a token at position 1,999 (2,000 keys: 8 parts), one at 700 under windows of 0 and 600, one at 5
 * (trailing parts empty), split and unsplit, against the reference.  Bound, decided before the first run:
 * the parts and their merge sum up to 2,000 fp32 terms in another order than the reference; worst case
 * n·2^-24 of outputs of magnitude <= 1 is 1.2e-4: 1e-4 (the random-walk size is ~3e-6). */
static void test_attention_split(int dt)
{
    enum { P = 16, NP = 170 };
    static const int cfgs[][3] = {{32, 8, 128}, {8, 1, 64}, {10, 2, 80}, {16, 2, 256}};
    int32_t pos[3] = {1999, 700, 5}, seq[3] = {0, 1, 2}, pt_off[3] = {0, 125, 169}, pages[170];
    for (int i = 0; i < 170; i++)
        pages[i] = (i * 37 + 11) % NP;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        int H = cfgs[ci][0], K = cfgs[ci][1], S = cfgs[ci][2];
        float *arena, *q;
        attention_inputs(NP, P, K, S, H, 3, dt, &arena, &q);
        for (int variant = 0; variant < 4; variant++) {
            int window = variant % 2 ? 600 : 0;
            bool split = variant < 2;
            float scale = 1.0f / sqrtf((float)S) * 2;
            double worst = attention_case(q, arena, NP, P, H, K, S, dt, pos, seq, 3, pt_off, pages, 170, 3, window,
                                          scale, 0.0f, 8, split);
            int parts = cuda_attention_last_split();
            CHECK(worst >= 0 && worst <= 1e-4 && (split ? parts > 1 : parts == 1),
                  "attention (split %d, %s KV) H=%d K=%d S=%d window %d: %d parts, max |dy| %.3g", split,
                  kv_dtype_name(dt), H, K, S, window, parts, worst);
            if (variant == 0)
                fprintf(stderr, "attention split, %s KV, H=%d K=%d S=%d: %d parts, max |dy| %.2e\n", kv_dtype_name(dt),
                        H, K, S, parts, worst);
        }
        free(arena), free(q);
    }
}

/* Greedy picks on the GPU vs sample_next at temperature 0 on the same logits: the token and the top ids must
 * be identical (same cleaning, same ties); log-probs differ only by the order of a double sum of fp32 terms
 * (~1e-12 relative) and the final rounding to fp32, so |Δ| <= 2e-6 · max(1, |lp|) (decided before the run). */
static void test_pick(void)
{
    enum { R = 12, V = 1000, VB = 128256 };
    float *lg = malloc((size_t)R * V * sizeof *lg);
    int32_t want[R] = {-1, 0, 5, 64, -2, 64, 3, -1, 20, 64, 1, 64};
    for (int r = 0; r < R; r++)
        for (int i = 0; i < V; i++)
            lg[(size_t)r * V + i] = frand(-8, 8);
    float *x;
    x = lg + 1 * V; /* a tied maximum: the lowest id wins */
    x[10] = x[700] = x[400] = 20.0f;
    x = lg + 2 * V; /* +0 and -0 tie, NaN and -inf are -inf, +inf is FLT_MAX */
    for (int i = 0; i < V; i++)
        x[i] = i % 7 == 0 ? -0.0f : i % 7 == 1 ? 0.0f : i % 7 == 2 ? NAN : -INFINITY;
    x = lg + 3 * V; /* 64 alternatives through a run of equal values straddling the threshold */
    for (int i = 0; i < V; i++)
        x[i] = (float)(i % 50) * 0.25f;
    x = lg + 5 * V; /* every logit NaN or -inf: no drawable token */
    for (int i = 0; i < V; i++)
        x[i] = i % 2 ? NAN : -INFINITY;
    x = lg + 6 * V;
    x[999] = INFINITY;
    x = lg + 9 * V; /* all equal */
    for (int i = 0; i < V; i++)
        x[i] = 1.5f;
    x = lg + 11 * V; /* far below the max: floored log-probs */
    for (int i = 0; i < V; i++)
        x[i] = i == 3 ? 3e4f : (float)(i % 9) - 1e5f;
    cuda_pick *pk = malloc(R * sizeof *pk);
    char err[SPILL_ERRLEN];
    int rc = cuda_op_pick(lg, R, V, want, NULL, pk, err, sizeof err);
    CHECK(rc == 0, "pick: %s", err);
    sample_scratch sc;
    sample_state st;
    CHECK(sample_scratch_init(&sc, VB, err, sizeof err) == 0, "%s", err);
    int compared = 0;
    double worst = 0;
    for (int r = 0; rc == 0 && r < R; r++) {
        if (want[r] < -1)
            continue;
        sample_params p = {0, 1, 0, 0, 0, 0, NULL, NULL, want[r] >= 0, want[r] >= 0 ? want[r] : 0, 0, 0, NULL, 0};
        sample_result sr;
        CHECK(sample_state_init(&st, &p, 1, 0, V, 1, err, sizeof err) == 0, "%s", err);
        int cr = sample_next(lg + (size_t)r * V, V, &p, &st, &sc, &sr, err, sizeof err);
        sample_state_free(&st);
        if (cr) {
            CHECK(pk[r].token == -1, "row %d: CPU finds no token, GPU picked %d", r, pk[r].token);
            continue;
        }
        CHECK(pk[r].token == sr.token, "row %d: GPU token %d, CPU %d", r, pk[r].token, sr.token);
        CHECK(pk[r].n_top == sr.n_top, "row %d: %d alternatives vs %d", r, pk[r].n_top, sr.n_top);
        double d = fabs((double)pk[r].logprob - sr.logprob);
        worst = d > worst ? d : worst;
        CHECK(d <= 2e-6 * fmax(1.0, fabs(sr.logprob)), "row %d: log-prob %.9g vs %.9g", r, pk[r].logprob, sr.logprob);
        for (int j = 0; j < sr.n_top && j < pk[r].n_top; j++) {
            CHECK(pk[r].top_id[j] == sr.top_id[j], "row %d alternative %d: id %d vs %d", r, j, pk[r].top_id[j],
                  sr.top_id[j]);
            d = fabs((double)pk[r].top_logprob[j] - sr.top_logprob[j]);
            worst = d > worst ? d : worst;
            CHECK(d <= 2e-6 * fmax(1.0, fabs(sr.top_logprob[j])), "row %d alternative %d: %.9g vs %.9g", r, j,
                  pk[r].top_logprob[j], sr.top_logprob[j]);
        }
        compared++;
    }
    CHECK(compared == R - 2, "only %d rows compared", compared);
    /* teacher forcing: a target per row (its log-prob, not the argmax's), alternatives as before; vs sample_score */
    int32_t tgt[R];
    for (int r = 0; r < R; r++)
        tgt[r] = r % 3 == 0 ? -1 : (r * 37) % V;
    int32_t want_t[R];
    for (int r = 0; r < R; r++)
        want_t[r] = want[r] < 0 && tgt[r] >= 0 ? 0 : want[r];
    rc = cuda_op_pick(lg, R, V, want_t, tgt, pk, err, sizeof err);
    CHECK(rc == 0, "pick with targets: %s", err);
    int scored = 0;
    for (int r = 0; rc == 0 && r < R; r++) {
        if (want_t[r] < -1 || tgt[r] < 0)
            continue;
        sample_result sr;
        if (sample_score(lg + (size_t)r * V, V, tgt[r], want_t[r], &sr, err, sizeof err)) {
            CHECK(pk[r].token == -1, "row %d: CPU finds no log-prob, GPU reports token %d", r, pk[r].token);
            continue;
        }
        CHECK(pk[r].token == tgt[r], "row %d: target %d reported as %d", r, tgt[r], pk[r].token);
        CHECK(fabs((double)pk[r].logprob - sr.logprob) <= 2e-6 * fmax(1.0, fabs(sr.logprob)),
              "row %d: target log-prob %.9g vs %.9g", r, pk[r].logprob, sr.logprob);
        CHECK(pk[r].n_top == sr.n_top, "row %d: %d alternatives vs %d", r, pk[r].n_top, sr.n_top);
        for (int j = 0; j < sr.n_top && j < pk[r].n_top; j++)
            CHECK(pk[r].top_id[j] == sr.top_id[j], "row %d alternative %d: id %d vs %d", r, j, pk[r].top_id[j],
                  sr.top_id[j]);
        scored++;
    }
    CHECK(scored >= 6, "only %d target rows compared", scored);
    /* one row of a 128k vocabulary with 64 alternatives */
    float *big = malloc((size_t)VB * sizeof *big);
    for (int i = 0; i < VB; i++)
        big[i] = frand(-12, 12);
    big[77777] = big[5] = 13.0f;
    int32_t w64 = 64;
    rc = cuda_op_pick(big, 1, VB, &w64, NULL, pk, err, sizeof err);
    CHECK(rc == 0, "pick (128k): %s", err);
    sample_params p = {0, 1, 0, 0, 0, 0, NULL, NULL, true, 64, 0, 0, NULL, 0};
    sample_result sr;
    CHECK(sample_state_init(&st, &p, 1, 0, VB, 1, err, sizeof err) == 0, "%s", err);
    if (rc == 0 && sample_next(big, VB, &p, &st, &sc, &sr, err, sizeof err) == 0) {
        CHECK(pk[0].token == sr.token && pk[0].token == 5 && pk[0].n_top == 64, "128k: token %d vs %d", pk[0].token,
              sr.token);
        int same = 0;
        for (int j = 0; j < 64; j++)
            same += pk[0].top_id[j] == sr.top_id[j] &&
                    fabs((double)pk[0].top_logprob[j] - sr.top_logprob[j]) <= 2e-6 * fmax(1.0, fabs(sr.top_logprob[j]));
        CHECK(same == 64, "128k: %d of 64 alternatives agree", same);
    }
    sample_state_free(&st);
    fprintf(stderr, "pick: %d rows of %d and one of %d vs sample_next: tokens and top ids equal, max |dlogprob| %.2e\n",
            compared, V, VB, worst);
    sample_scratch_free(&sc);
    free(big);
    free(pk);
    free(lg);
}

static float bf(float x)
{
    return quant_bf16_to_fp32(quant_fp32_to_bf16(x));
}

static void test_lora_mask(void)
{
    enum { T = 37, C = 48 };
    int32_t own[C], ad[T];
    float *tmp = malloc(T * C * sizeof *tmp);
    uint16_t *got = malloc(T * C * sizeof *got);
    for (int j = 0; j < C; j++)
        own[j] = j % 11 == 10 ? -1 : (int32_t)(rnd() % 3) + 1; /* -1: padding */
    for (int t = 0; t < T; t++)
        ad[t] = (int32_t)(rnd() % 4); /* 0: the bare base */
    for (int i = 0; i < T * C; i++) {
        uint32_t b;
        do
            b = rnd() << 16 ^ rnd();
        while ((b & 0x7f800000u) == 0x7f800000u); /* finite: NaN payloads are not the mask's concern */
        if (i % 5 == 0)
            b = (b & 0xffff0000u) | 0x8000u; /* an exact tie */
        memcpy(&tmp[i], &b, 4);
        got[i] = 0xffff;
    }
    char err[SPILL_ERRLEN];
    int rc = cuda_op_lora_mask(tmp, own, ad, T, C, got, err, sizeof err);
    CHECK(rc == 0, "lora mask: %s", err);
    int bad = 0, kept = 0;
    for (int t = 0; rc == 0 && t < T; t++)
        for (int j = 0; j < C; j++) {
            bool keep = own[j] == ad[t];
            uint16_t want = keep ? quant_fp32_to_bf16(tmp[t * C + j]) : 0;
            bad += got[t * C + j] != want;
            kept += keep;
        }
    CHECK(bad == 0 && kept > 0, "lora mask: %d of %d values differ (%d kept)", bad, T * C, kept);
    fprintf(stderr, "lora mask %dx%d: %d kept, %s\n", T, C, kept, bad ? "DIFFER" : "bit-identical");
    free(tmp), free(got);
}

/* An adapter built by hand, as lora_load returns one: rank r on the slots in `slots` (bit 1 << lora_slot) of the
 * layers in `layers` (bit 1 << l), A and B uniform in [-1, 1] / sqrt(width). */
static lora_adapter *fake_adapter(const char *name, int L, const int64_t *in, const int64_t *out, int r, float scale,
                                  uint32_t slots, uint32_t layers)
{
    lora_adapter *ad = calloc(1, sizeof *ad);
    snprintf(ad->name, sizeof ad->name, "%s", name);
    snprintf(ad->layout, sizeof ad->layout, "peft");
    ad->rank = r;
    ad->alpha = scale * (float)r;
    ad->scale = scale;
    ad->targets = slots;
    ad->n_layers = L;
    ad->m = calloc((size_t)L * LORA_N_SLOTS, sizeof *ad->m);
    for (int l = 0; l < L; l++)
        for (int s = 0; s < LORA_N_SLOTS; s++) {
            lora_mat *mt = &ad->m[l * LORA_N_SLOTS + s];
            if (!(slots >> s & 1) || !(layers >> l & 1))
                continue;
            mt->r = r, mt->in = in[s], mt->out = out[s];
            mt->A = malloc((size_t)r * (size_t)in[s] * sizeof(float));
            mt->B = malloc((size_t)out[s] * (size_t)r * sizeof(float));
            for (int64_t i = 0; i < r * in[s]; i++)
                mt->A[i] = frand(-1, 1) / sqrtf((float)in[s]);
            for (int64_t i = 0; i < out[s] * r; i++)
                mt->B[i] = frand(-1, 1) / sqrtf((float)r);
            ad->bytes += (uint64_t)(r * in[s] + out[s] * r) * 4;
        }
    return ad;
}

static void free_fake_adapter(lora_adapter *ad)
{
    for (int i = 0; i < ad->n_layers * LORA_N_SLOTS; i++)
        free(ad->m[i].A), free(ad->m[i].B);
    free(ad->m);
    free(ad);
}

/* Every slot group of three layers: adapter 1 (rank 5) on q, v, down everywhere; adapter 2 (rank 8) on all seven
 * slots of layers 0 and 1; adapter 3 (rank 3) on k, o, up of layer 1 only.  So layer 2 has q and v adapted but
 * not k (a slot of a group without columns), and no o, gate or up at all. */
static void test_lora_group(void)
{
    enum { L = 3, D = 96, HS = 128, KS = 32, F = 160, T = 29 };
    static const int64_t in[LORA_N_SLOTS] = {D, D, D, HS, D, D, F}, out[LORA_N_SLOTS] = {HS, KS, KS, D, F, F, D};
    static const int first[4] = {LORA_Q, LORA_O, LORA_GATE, LORA_DOWN}, n_slots[4] = {3, 1, 2, 1};
    lora_adapter *ads[3] = {
        fake_adapter("one", L, in, out, 5, 2.0f, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_DOWN, 7),
        fake_adapter("two", L, in, out, 8, 0.5f, (1u << LORA_N_SLOTS) - 1, 3),
        fake_adapter("three", L, in, out, 3, 1.25f, 1u << LORA_K | 1u << LORA_O | 1u << LORA_UP, 2)};
    lora_set set = {3, ads};
    int32_t ad[T];
    for (int t = 0; t < T; t++)
        ad[t] = t < 4 ? 2 : (int32_t)(rnd() % 4); /* a run of one adapter, then a mix with bare-base tokens */
    char err[SPILL_ERRLEN];
    int bad = 0, kept_bad = 0, adapted = 0;
    double worst = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < 4; g++) {
            int64_t K = in[first[g]];
            float *x = malloc((size_t)T * K * sizeof *x), *y[3] = {NULL, NULL, NULL}, *y0[3] = {NULL, NULL, NULL};
            for (int64_t i = 0; i < T * K; i++)
                x[i] = frand(-2, 2);
            for (int i = 0; i < n_slots[g]; i++) {
                int64_t n = T * out[first[g] + i];
                y[i] = malloc((size_t)n * sizeof(float));
                y0[i] = malloc((size_t)n * sizeof(float));
                for (int64_t j = 0; j < n; j++)
                    y[i][j] = y0[i][j] = frand(-1, 1);
            }
            int rc = cuda_op_lora(&set, l, g, x, T, ad, y, err, sizeof err);
            CHECK(rc == 0, "lora group %d of layer %d: %s", g, l, err);
            for (int i = 0; rc == 0 && i < n_slots[g]; i++) {
                int s = first[g] + i;
                int64_t N = out[s];
                for (int t = 0; t < T; t++) {
                    const lora_mat *mt = ad[t] ? &ads[ad[t] - 1]->m[l * LORA_N_SLOTS + s] : NULL;
                    if (!mt || mt->r == 0) { /* nothing of this token's adapter here: y keeps its bits */
                        kept_bad += memcmp(y[i] + t * N, y0[i] + t * N, (size_t)N * sizeof(float)) != 0;
                        continue;
                    }
                    float tb[8];
                    for (int k = 0; k < mt->r; k++) {
                        double a = 0;
                        for (int64_t c = 0; c < K; c++)
                            a += (double)bf(x[t * K + c]) * bf(mt->A[k * K + c]);
                        tb[k] = bf((float)a);
                    }
                    float sc = ads[ad[t] - 1]->scale;
                    for (int64_t o = 0; o < N; o++) {
                        double d = 0, s1 = 0;
                        for (int k = 0; k < mt->r; k++) {
                            double p = (double)tb[k] * bf(sc * mt->B[o * mt->r + k]);
                            d += p;
                            s1 += fabs(p);
                        }
                        double want = (double)y0[i][t * N + o] + d, got = y[i][t * N + o];
                        double tol = s1 / 256 + 1e-6 * (fabs(want) + s1), e = fabs(got - want);
                        bad += !(e <= tol);
                        worst = e / tol > worst || isnan(e) ? (isnan(e) ? INFINITY : e / tol) : worst;
                    }
                    adapted++;
                }
            }
            free(x);
            for (int i = 0; i < 3; i++)
                free(y[i]), free(y0[i]);
        }
    CHECK(bad == 0, "lora groups: %d outputs beyond the bound (worst %.2f of it)", bad, worst);
    CHECK(kept_bad == 0, "lora groups: %d rows of tokens without an adapter there changed", kept_bad);
    CHECK(adapted > 100, "lora groups: only %d adapted rows compared", adapted);
    fprintf(stderr,
            "lora groups, 3 layers x 4 groups, 3 adapters: %d adapted rows, worst %.2f of the bound, the others "
            "bit-identical: %s\n",
            adapted, worst, kept_bad ? "NO" : "yes");
    for (int a = 0; a < 3; a++)
        free_fake_adapter(ads[a]);
}

int main(void)
{
    char err[SPILL_ERRLEN], name[256];
    uint64_t tot, fr;
    if (cuda_device_info(0, name, sizeof name, &tot, &fr, err, sizeof err)) {
        fprintf(stderr, "no usable GPU: %s\n", err);
        return 1;
    }
    fprintf(stderr, "device: %s, %.1f of %.1f GiB free\n", name, fr / 1073741824.0, tot / 1073741824.0);
    cpu_pool *pool;
    if (cpu_pool_create(4, cpu_matmul_scratch_bytes(1024), &pool, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    test_dequant();
    test_matmul(pool);
    test_rmsnorm();
    test_rope();
    test_act();
    for (int dt = KV_BF16; dt <= KV_I8; dt++) {
        test_kv_write(dt);
        test_attention(dt);
        test_attention_long(dt);
        test_attention_split(dt);
    }
    test_pick();
    test_lora_mask();
    test_lora_group();
    cpu_pool_free(pool);
    return test_finish("test_cuda_ops");
}
