/*
 * test_matmul.c — cpu.c: thread pool, matmul for every weight type, the
 * bit-stability promises, elementwise ops, RoPE against transformers'
 * formulas (fixture tests/data/quant/rope.json from tools/gen_quant_fixtures.py).
 *
 * Tolerances, decided before looking at results:
 * - Matmul vs a double-precision reference on the same dequantized weights
 *   (the dequantizer itself is checked bit-exactly in test_quant.c): each
 *   output is a chain of at most K/8 + 3 + 7 fp32 roundings (8-lane FMA
 *   accumulation, 3 adds, the K%8 tail), so the classical bound gives
 *   |y - ref| <= (K/8 + 10) * 2^-24 * sum_k |x_k w_k| (times 1+O(Ku), covered
 *   by a factor 1.01).  This is a worst-case bound, not a guess, yet tight
 *   enough to catch one wrong term: a single misplaced product of average
 *   size is ~K times bigger than (K/8) * 6e-8 of the sum.
 * - Bit-identity (threads 1/2/3, each row of a T-row call vs the row alone,
 *   tile size, SIMD vs scalar): memcmp, no tolerance — that is the promise.
 * - Elementwise ops vs double: outputs are a handful of fp32 operations and
 *   one libm call (<= 2 ulp in glibc), so |err| <= 4e-6 * the output's scale
 *   (|v*u| for activations, |x|·|w|/rms for rmsnorm).
 * - RoPE vs the numpy port of transformers: inv_freq may differ by <= 3 ulp
 *   (powf vs numpy's power; a few fp32 ops in llama3/yarn), relative 4e-7.
 *   An inv_freq ulp moves the fp32 angle pos*inv_freq by ~1.2e-7*|angle|, and
 *   cos/sin implementations differ by <= 2 ulp, so each rotated value may
 *   differ by (|a|+|b|) * attn * (1e-6 + 4e-7*|angle|).  Unrotated dims: exact.
 */
#include "engine/cpu.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)((rng_u64() >> 40) / 16777216.0); }

static void put_half(uint8_t *p, float v)
{
    uint16_t h = quant_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Random but valid weights: random bytes, then sane scale fields (no NaN/Inf). */
static uint8_t *random_weights(uint32_t type, int64_t N, int64_t K, size_t *row_bytes)
{
    if (quant_row_bytes(type, K, row_bytes) != 0)
        return NULL;
    size_t total = *row_bytes * (size_t)N;
    uint8_t *w = malloc(total ? total : 1);
    for (size_t i = 0; i < total; i++)
        w[i] = (uint8_t)rng_u64();
    size_t bb = quant_block_bytes(type);
    for (size_t off = 0; off < total; off += bb) {
        uint8_t *b = w + off;
        float s = rng_uniform(0.001f, 0.05f) * (rng_u64() & 1 ? 1.0f : -1.0f);
        switch (type) {
        case GGML_F32: { float v = rng_uniform(-1, 1); memcpy(b, &v, 4); break; }
        case GGML_F16: put_half(b, rng_uniform(-1, 1)); break;
        case GGML_BF16: { uint16_t h = quant_fp32_to_bf16(rng_uniform(-1, 1)); memcpy(b, &h, 2); break; }
        case GGML_Q8_0: case GGML_Q4_0: case GGML_Q5_0: put_half(b, s); break;
        case GGML_Q4_1: case GGML_Q5_1: put_half(b, s); put_half(b + 2, rng_uniform(-0.5f, 0.5f)); break;
        case GGML_Q4_K: case GGML_Q5_K: put_half(b, fabsf(s) / 8); put_half(b + 2, fabsf(s) / 16); break;
        case GGML_Q6_K: put_half(b + 208, s / 16); break;
        case GGML_Q8_K: { float d = s / 4; memcpy(b, &d, 4); break; }
        }
    }
    return w;
}

static const uint32_t ALL_TYPES[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                     GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q8_K};
#define N_TYPES (sizeof ALL_TYPES / sizeof ALL_TYPES[0])

/* K for a type: not a multiple of 8 where the type allows, a few blocks otherwise. */
static int64_t pick_k(uint32_t type)
{
    int64_t be = quant_block_elems(type);
    if (be == 1)
        return 203;
    return be == 32 ? 32 * 7 : 256 * 3;
}

static void test_matmul_accuracy(cpu_pool *pool)
{
    const int64_t Ts[] = {1, 3, 17, 64};
    const int64_t N = 37; /* not a multiple of 4 or of the 16-row tile */
    char err[256];
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = ALL_TYPES[ti];
        int64_t K = pick_k(type);
        size_t rb;
        uint8_t *W = random_weights(type, N, K, &rb);
        float *Wf = malloc(sizeof(float) * N * K);
        for (int64_t n = 0; n < N; n++)
            quant_dequant_row_scalar(type, W + n * rb, Wf + n * K, K);
        float *X = malloc(sizeof(float) * 64 * K), *Y = malloc(sizeof(float) * 64 * N);
        for (int64_t i = 0; i < 64 * K; i++)
            X[i] = rng_uniform(-1, 1);
        double worst = 0; /* max of |err| / bound */
        int fails = 0;
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int64_t T = Ts[k];
            int rc = cpu_matmul(pool, W, type, N, K, X, T, Y, err, sizeof err);
            CHECK(rc == 0, "matmul %s: %s", quant_type_name(type), err);
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = 0; n < N; n++) {
                    double ref = 0, mag = 0;
                    for (int64_t j = 0; j < K; j++) {
                        ref += (double)X[t * K + j] * Wf[n * K + j];
                        mag += fabs((double)X[t * K + j] * Wf[n * K + j]);
                    }
                    double bound = 1.01 * (double)(K / 8 + 10) * ldexp(1.0, -24) * mag;
                    double e = fabs(Y[t * N + n] - ref);
                    if (bound > 0 && e / bound > worst)
                        worst = e / bound;
                    if (!(e <= bound) && fails++ < 3)
                        fprintf(stderr, "  %s T=%lld t=%lld n=%lld: got %.9g ref %.9g bound %.3g\n",
                                quant_type_name(type), (long long)T, (long long)t, (long long)n, Y[t * N + n], ref,
                                bound);
                }
        }
        CHECK(fails == 0, "matmul %s (N=%lld K=%lld) within the summation bound: %d outputs outside",
              quant_type_name(type), (long long)N, (long long)K, fails);
        fprintf(stderr, "  matmul %-4s K=%-4lld worst |err|/bound = %.3f\n", quant_type_name(type), (long long)K, worst);
        free(W);
        free(Wf);
        free(X);
        free(Y);
    }
}

/* The test's own copy of the activation quantizer (same formula as cpu.c's scalar one). */
static void ref_quant_x(const float *x, int64_t K, double *xhat, double *dblk)
{
    for (int64_t b = 0; b < K / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * b + j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++)
            xhat[32 * b + j] = (double)d * nearbyintf(x[32 * b + j] * id);
        dblk[b] = d;
    }
}

/*
 * 8-bit-activation mode.  Two references, bounds decided up front:
 * (a) tight: double dot of the unpacked integer weights (dw*q + mw, exact
 *     reals) with the test's own quantized x^ — only fp32 rounding remains:
 *     per block one product dw*dx and one FMA per lane, the min term, the
 *     hsums: |err| <= (nb + 16) * 2^-23 * sum|w x^| (u = 2^-24, doubled for
 *     the dw*dx product rounding);
 * (b) vs the true fp32 X on the dequantized weights: adds the activation
 *     rounding sum_j |w_j| * d_b/2 (|x - x^| <= d/2, x1.001 for x*id's own
 *     rounding) and the dequantizer's rounding of w (<= 1 ulp, 2^-23 sum|w x|).
 */
static void test_matmul_q8(cpu_pool *pool)
{
    const int64_t Ts[] = {1, 3, 17, 64};
    const int64_t N = 37;
    char err[256];
    cpu_pool_set_q8_act(pool, true);
    CHECK(cpu_pool_reserve_q8(pool, 64, 768, err, sizeof err) == 0, "reserve: %s", err);
    CHECK(cpu_pool_reserve_q8(pool, 1, 100, err, sizeof err) < 0, "reserve rejects K %% 32 != 0");
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = ALL_TYPES[ti];
        if (!quant_q8_supported(type))
            continue;
        int64_t K = pick_k(type), nb = K / 32;
        size_t rb;
        uint8_t *W = random_weights(type, N, K, &rb);
        float *Wf = malloc(sizeof(float) * N * K);
        double *Wi = malloc(sizeof(double) * N * K);
        uint8_t *q = malloc((size_t)K);
        float *dw = malloc(sizeof(float) * nb), *mw = malloc(sizeof(float) * nb);
        for (int64_t n = 0; n < N; n++) {
            quant_dequant_row_scalar(type, W + n * rb, Wf + n * K, K);
            CHECK(quant_unpack_q8_row(type, W + n * rb, K, q, dw, mw) == 0, "unpack %s", quant_type_name(type));
            for (int64_t j = 0; j < K; j++) {
                double qi = quant_q8_signed(type) ? (double)(int8_t)q[j] : (double)q[j];
                Wi[n * K + j] = (double)dw[j / 32] * qi + mw[j / 32];
            }
        }
        /* the integer view reproduces the dequantized weights to within one rounding */
        int bad_view = 0;
        for (int64_t i = 0; i < N * K; i++)
            bad_view += fabs(Wi[i] - Wf[i]) > ldexp(fabs(Wi[i]) + fabs(Wf[i]), -23) + 1e-30;
        CHECK(bad_view == 0, "%s: integer view equals the dequantized weights (%d differ)", quant_type_name(type),
              bad_view);
        float *X = malloc(sizeof(float) * 64 * K), *Y = malloc(sizeof(float) * 64 * N);
        double *xh = malloc(sizeof(double) * K), *db = malloc(sizeof(double) * nb);
        for (int64_t i = 0; i < 64 * K; i++)
            X[i] = rng_uniform(-1, 1) * (i % 97 == 0 ? 8.0f : 1.0f);
        int fa = 0, fb = 0;
        double wa = 0, wb = 0;
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int64_t T = Ts[k];
            CHECK(cpu_matmul(pool, W, type, N, K, X, T, Y, err, sizeof err) == 0, "q8 matmul: %s", err);
            for (int64_t t = 0; t < T; t++) {
                const float *x = X + t * K;
                ref_quant_x(x, K, xh, db);
                for (int64_t n = 0; n < N; n++) {
                    double ra = 0, ma = 0, rb2 = 0, mb = 0, act = 0;
                    for (int64_t j = 0; j < K; j++) {
                        ra += Wi[n * K + j] * xh[j];
                        ma += fabs(Wi[n * K + j] * xh[j]);
                        rb2 += (double)Wf[n * K + j] * x[j];
                        mb += fabs((double)Wf[n * K + j] * x[j]);
                        act += fabs(Wf[n * K + j]) * db[j / 32] / 2;
                    }
                    double y = Y[t * N + n];
                    double ba = (double)(nb + 16) * ldexp(ma, -23) + 1e-30;
                    double bb = ba + 1.001 * act + ldexp(mb, -23);
                    wa = fabs(y - ra) / ba > wa ? fabs(y - ra) / ba : wa;
                    wb = fabs(y - rb2) / bb > wb ? fabs(y - rb2) / bb : wb;
                    fa += !(fabs(y - ra) <= ba);
                    fb += !(fabs(y - rb2) <= bb);
                }
            }
        }
        CHECK(fa == 0, "q8 %s vs quantized-X reference: %d outside the rounding bound", quant_type_name(type), fa);
        CHECK(fb == 0, "q8 %s vs fp32 reference: %d outside the activation-rounding bound", quant_type_name(type), fb);
        fprintf(stderr, "  q8act  %-4s K=%-4lld worst |err|/bound: %.3f (vs x^), %.3f (vs x)\n", quant_type_name(type),
                (long long)K, wa, wb);
        free(W); free(Wf); free(Wi); free(q); free(dw); free(mw); free(X); free(Y); free(xh); free(db);
    }
    cpu_pool_set_q8_act(pool, false);
}

/*
 * The 8-bit paths' arithmetic (cpu_kq.h), restated here and compared bit for bit — no tolerance, since the
 * design makes every path (the raw 1-row kernel at T < 4, the 8-row interleaved kernel in blocks of 4 X rows
 * and its 1-row tail, AVX2 and VNNI, the scalar oracle) compute exactly this: x quantized per 32-block as
 * d = amax/127, q = nearbyint(x * (1/d)), s = d * sum(q); per weight block b the exact integer sum S_b,
 * acc[b % 8] = fma(dw_b*dx_b, S_b, acc[b % 8]), then fma(mw_b, s_b, ·) for types with a minimum, and the tree
 * ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)).  K of 7, 18 (SmolLM2's 576) and 48 blocks (partial and whole groups of
 * 8 blocks), N = 21 (two groups of 8 weight rows and a padded one), T covering every kernel split.
 */
static void test_matmul_q8_arith(void)
{
    const int64_t Ks[] = {224, 576, 1536}, Ts[] = {1, 3, 4, 6, 70};
    const int64_t N = 21, TMAX = 70;
    char err[256];
    cpu_pool *pool = NULL;
    CHECK(cpu_pool_create(2, cpu_matmul_scratch_bytes(1536), &pool, err, sizeof err) == 0, "%s", err);
    if (!pool)
        return;
    cpu_pool_set_q8_act(pool, true);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = ALL_TYPES[ti];
        if (!quant_q8_supported(type))
            continue;
        bool sgn = quant_q8_signed(type);
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            int64_t K = Ks[ki], nb = K / 32;
            if (K % quant_block_elems(type) != 0)
                continue;
            size_t rb;
            uint8_t *W = random_weights(type, N, K, &rb);
            uint8_t *wq = malloc((size_t)(N * K));
            float *dw = malloc(sizeof(float) * N * nb), *mw = calloc((size_t)(N * nb), sizeof(float));
            for (int64_t n = 0; n < N; n++)
                quant_unpack_q8_row(type, W + n * rb, K, wq + n * K, dw + n * nb, mw + n * nb);
            float *X = malloc(sizeof(float) * TMAX * K), *ref = malloc(sizeof(float) * TMAX * N);
            float *Y = malloc(sizeof(float) * TMAX * N);
            int8_t *xq = malloc((size_t)K);
            float *dx = malloc(sizeof(float) * nb), *sx = malloc(sizeof(float) * nb);
            for (int64_t i = 0; i < TMAX * K; i++)
                X[i] = rng_uniform(-1, 1) * (i % 89 == 0 ? 6.0f : 1.0f);
            for (int64_t t = 0; t < TMAX; t++) {
                for (int64_t b = 0; b < nb; b++) {
                    float amax = 0;
                    for (int j = 0; j < 32; j++)
                        amax = fmaxf(amax, fabsf(X[t * K + 32 * b + j]));
                    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
                    int sum = 0;
                    for (int j = 0; j < 32; j++) {
                        int v = (int)nearbyintf(X[t * K + 32 * b + j] * id);
                        xq[32 * b + j] = (int8_t)v;
                        sum += v;
                    }
                    dx[b] = d;
                    sx[b] = d * (float)sum;
                }
                for (int64_t n = 0; n < N; n++) {
                    float acc[8] = {0};
                    for (int64_t b = 0; b < nb; b++) {
                        int32_t S = 0;
                        for (int64_t j = 32 * b; j < 32 * b + 32; j++)
                            S += (sgn ? (int32_t)(int8_t)wq[n * K + j] : (int32_t)wq[n * K + j]) * xq[j];
                        acc[b % 8] = fmaf(dw[n * nb + b] * dx[b], (float)S, acc[b % 8]);
                        if (!sgn)
                            acc[b % 8] = fmaf(mw[n * nb + b], sx[b], acc[b % 8]);
                    }
                    ref[t * N + n] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
                }
            }
            /* 0: scalar oracle, 1: AVX2, 2: VNNI (where present) */
            for (int path = 0; path < 3; path++) {
                if (path == 0 && !quant_simd_available())
                    continue;
                if (path == 2 && !cpu_q8_vnni_active())
                    continue;
                quant_simd_force(path != 0);
                if (path == 1)
                    cpu_q8_vnni_force(0);
                for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                    int64_t T = Ts[k];
                    CHECK(cpu_matmul(pool, W, type, N, K, X, T, Y, err, sizeof err) == 0, "%s", err);
                    int bad = 0;
                    for (int64_t i = 0; i < T * N; i++)
                        bad += memcmp(&Y[i], &ref[i], sizeof(float)) != 0;
                    CHECK(bad == 0, "%s K=%lld T=%lld path %d: %d of %lld outputs differ from the stated arithmetic",
                          quant_type_name(type), (long long)K, (long long)T, path, bad, (long long)(T * N));
                }
                cpu_q8_vnni_force(-1);
                quant_simd_force(true);
            }
            free(W), free(wq), free(dw), free(mw), free(X), free(ref), free(Y), free(xq), free(dx), free(sx);
        }
    }
    cpu_pool_free(pool);
}

/* Threads 1/2/3, tile size, T-independence, SIMD vs scalar: identical bits. */
static void test_matmul_bitstable(bool q8)
{
    char err[256];
    const int64_t N = 53, T = 17;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = ALL_TYPES[ti];
        if (q8 && !quant_q8_supported(type))
            continue;
        int64_t K = pick_k(type);
        size_t rb;
        uint8_t *W = random_weights(type, N, K, &rb);
        float *X = malloc(sizeof(float) * T * K);
        for (int64_t i = 0; i < T * K; i++)
            X[i] = rng_uniform(-2, 2);
        float *Y[6];
        for (int i = 0; i < 6; i++)
            Y[i] = malloc(sizeof(float) * T * N);
        cpu_pool *p1 = NULL, *p2 = NULL, *p3 = NULL, *psmall = NULL;
        CHECK(cpu_pool_create(1, cpu_matmul_scratch_bytes(K), &p1, err, sizeof err) == 0, "%s", err);
        CHECK(cpu_pool_create(2, cpu_matmul_scratch_bytes(K), &p2, err, sizeof err) == 0, "%s", err);
        CHECK(cpu_pool_create(3, cpu_matmul_scratch_bytes(K), &p3, err, sizeof err) == 0, "%s", err);
        /* 5 rows of scratch: tiles of 4 rows, a different task split */
        CHECK(cpu_pool_create(2, sizeof(float) * K * 5, &psmall, err, sizeof err) == 0, "%s", err);
        if (!p1 || !p2 || !p3 || !psmall)
            return;
        cpu_pool_set_q8_act(p1, q8);
        cpu_pool_set_q8_act(p2, q8);
        cpu_pool_set_q8_act(p3, q8);
        cpu_pool_set_q8_act(psmall, q8);
        quant_simd_force(true);
        cpu_matmul(p1, W, type, N, K, X, T, Y[0], err, sizeof err);
        cpu_matmul(p2, W, type, N, K, X, T, Y[1], err, sizeof err);
        cpu_matmul(p3, W, type, N, K, X, T, Y[2], err, sizeof err);
        cpu_matmul(psmall, W, type, N, K, X, T, Y[3], err, sizeof err);
        size_t bytes = sizeof(float) * T * N;
        CHECK(memcmp(Y[0], Y[1], bytes) == 0, "%s%s: 1 vs 2 threads bit-identical", quant_type_name(type), q8 ? " q8" : "");
        CHECK(memcmp(Y[0], Y[2], bytes) == 0, "%s: 1 vs 3 threads bit-identical", quant_type_name(type));
        CHECK(memcmp(Y[0], Y[3], bytes) == 0, "%s: tile size does not change bits", quant_type_name(type));
        /* each row alone, and rows 5..11 as a sub-batch, equal the T-row call */
        int bad_rows = 0;
        for (int64_t t = 0; t < T; t++) {
            cpu_matmul(p3, W, type, N, K, X + t * K, 1, Y[4], err, sizeof err);
            bad_rows += memcmp(Y[4], Y[0] + t * N, sizeof(float) * N) != 0;
        }
        CHECK(bad_rows == 0, "%s%s: %d of %lld rows differ when computed alone", quant_type_name(type), q8 ? " q8" : "", bad_rows,
              (long long)T);
        cpu_matmul(p2, W, type, N, K, X + 5 * K, 7, Y[4], err, sizeof err);
        CHECK(memcmp(Y[4], Y[0] + 5 * N, sizeof(float) * 7 * N) == 0, "%s: sub-batch rows bit-identical",
              quant_type_name(type));
        /* AVX2 kernels vs AVX-512 VNNI (where the CPU has it): the same bits, at T = 17 and at T = 1 */
        if (q8 && cpu_q8_vnni_active()) {
            cpu_q8_vnni_force(0);
            cpu_matmul(p2, W, type, N, K, X, T, Y[4], err, sizeof err);
            CHECK(memcmp(Y[4], Y[0], bytes) == 0, "%s q8: AVX2 and VNNI kernels differ", quant_type_name(type));
            cpu_matmul(p2, W, type, N, K, X, 1, Y[4], err, sizeof err);
            CHECK(memcmp(Y[4], Y[0], sizeof(float) * N) == 0, "%s q8: AVX2 and VNNI decode kernels differ",
                  quant_type_name(type));
            cpu_q8_vnni_force(-1);
        }
        /* 2 and 3 rows: the decode path that dots raw weight rows without a tile */
        for (int64_t tn = 2; tn <= 3; tn++) {
            cpu_matmul(p2, W, type, N, K, X + 9 * K, tn, Y[4], err, sizeof err);
            CHECK(memcmp(Y[4], Y[0] + 9 * N, sizeof(float) * (size_t)(tn * N)) == 0,
                  "%s%s: a %lld-row sub-batch differs", quant_type_name(type), q8 ? " q8" : "", (long long)tn);
        }
        /* 103 rows (the X rows repeated): several L1-sized chunks of X rows in the 8-bit path, tiles of two
         * weight rows and a last odd one — every row equal to the 17-row call's */
        {
            enum { TB = 103 };
            float *XB = malloc(sizeof(float) * TB * K), *YB = malloc(sizeof(float) * TB * N);
            for (int64_t t = 0; t < TB; t++)
                memcpy(XB + t * K, X + (t % T) * K, sizeof(float) * K);
            cpu_matmul(p2, W, type, N, K, XB, TB, YB, err, sizeof err);
            int bad = 0;
            for (int64_t t = 0; t < TB; t++)
                bad += memcmp(YB + t * N, Y[0] + (t % T) * N, sizeof(float) * N) != 0;
            CHECK(bad == 0, "%s%s: %d of %d rows of a %d-row call differ from the 17-row call", quant_type_name(type),
                  q8 ? " q8" : "", bad, TB, TB);
            free(XB), free(YB);
        }
        /* scalar path (SPILL_NO_SIMD) gives the same bits */
        if (quant_simd_available()) {
            quant_simd_force(false);
            cpu_matmul(p2, W, type, N, K, X, T, Y[5], err, sizeof err);
            quant_simd_force(true);
            CHECK(memcmp(Y[0], Y[5], bytes) == 0, "%s%s: scalar and SIMD paths bit-identical", quant_type_name(type),
                  q8 ? " q8" : "");
        }
        cpu_pool_free(p1);
        cpu_pool_free(p2);
        cpu_pool_free(p3);
        cpu_pool_free(psmall);
        for (int i = 0; i < 6; i++)
            free(Y[i]);
        free(W);
        free(X);
    }
}

/* cpu_matmul_multi: q, k, v-like parts of different types (an 8-bit-activation type, one that is never
 * quantized, a float type) against one X give every part the bits of its own cpu_matmul, at T = 1 (the
 * decode path) and T = 17; both activation modes; a part with N = 0 and too many parts are handled. */
static void test_matmul_multi(cpu_pool *pool)
{
    char err[256];
    const int64_t K = 256, Ns[3] = {40, 16, 24};
    const uint32_t types[3] = {GGML_Q4_1, GGML_Q6_K, GGML_F16};
    uint8_t *W[3];
    size_t rb;
    for (int i = 0; i < 3; i++)
        W[i] = random_weights(types[i], Ns[i], K, &rb);
    float *X = malloc(sizeof(float) * 17 * K);
    for (int64_t i = 0; i < 17 * K; i++)
        X[i] = rng_uniform(-2, 2);
    for (int q8 = 0; q8 < 2; q8++) {
        cpu_pool_set_q8_act(pool, q8);
        for (int64_t T = 1; T <= 17; T += 16) {
            float *Ya[3], *Yb[3];
            cpu_mm_part parts[4];
            for (int i = 0; i < 3; i++) {
                Ya[i] = malloc(sizeof(float) * T * Ns[i]);
                Yb[i] = malloc(sizeof(float) * T * Ns[i]);
                CHECK(cpu_matmul(pool, W[i], types[i], Ns[i], K, X, T, Ya[i], err, sizeof err) == 0, "%s", err);
                parts[i] = (cpu_mm_part){W[i], types[i], Ns[i], Yb[i]};
            }
            parts[3] = (cpu_mm_part){W[0], types[0], 0, NULL};
            CHECK(cpu_matmul_multi(pool, parts, 4, K, X, T, err, sizeof err) == 0, "multi: %s", err);
            for (int i = 0; i < 3; i++) {
                CHECK(memcmp(Ya[i], Yb[i], sizeof(float) * T * Ns[i]) == 0, "multi part %d (%s, T=%lld%s) differs", i,
                      quant_type_name(types[i]), (long long)T, q8 ? ", q8" : "");
                free(Ya[i]);
                free(Yb[i]);
            }
        }
    }
    cpu_pool_set_q8_act(pool, false);
    cpu_mm_part five[5] = {{W[0], types[0], 1, NULL}};
    CHECK(cpu_matmul_multi(pool, five, 5, K, X, 1, err, sizeof err) == -1 && strstr(err, "matrices"),
          "5 parts must be refused: %s", err);
    for (int i = 0; i < 3; i++)
        free(W[i]);
    free(X);
}

static void test_matmul_errors(cpu_pool *pool)
{
    char err[256] = "";
    float X[64] = {0}, Y[64];
    uint8_t W[256] = {0};
    CHECK(cpu_matmul(pool, W, GGML_Q2_K, 1, 256, X, 1, Y, err, sizeof err) < 0 && strstr(err, "not supported"),
          "unsupported type rejected: %s", err);
    CHECK(cpu_matmul(pool, W, GGML_Q4_0, 1, 40, X, 1, Y, err, sizeof err) < 0 && strstr(err, "multiple of 32"),
          "K not a whole number of blocks rejected: %s", err);
    cpu_pool *tiny = NULL;
    CHECK(cpu_pool_create(1, 16, &tiny, err, sizeof err) == 0, "%s", err);
    CHECK(cpu_matmul(tiny, W, GGML_Q4_0, 1, 32, X, 1, Y, err, sizeof err) < 0 && strstr(err, "scratch"),
          "scratch too small rejected: %s", err);
    CHECK(cpu_matmul(tiny, X, GGML_F32, 1, 32, X, 1, Y, err, sizeof err) == 0, "F32 needs no scratch");
    CHECK(cpu_matmul(tiny, W, GGML_Q4_0, 0, 32, X, 1, Y, err, sizeof err) == 0, "N=0 is a no-op");
    cpu_pool_free(tiny);
    cpu_pool_free(NULL);
}

/* ---------------------------------------------------------------- pool */

typedef struct {
    int *hits;
    int n_threads;
    int bad_tid;
} pool_ctx;

static void count_task(void *vctx, int64_t task, int tid)
{
    pool_ctx *c = vctx;
    __atomic_add_fetch(&c->hits[task], 1, __ATOMIC_RELAXED);
    if (tid < 0 || tid >= c->n_threads)
        __atomic_add_fetch(&c->bad_tid, 1, __ATOMIC_RELAXED);
}

static void test_pool(void)
{
    char err[256];
    cpu_pool *p = NULL;
    CHECK(cpu_pool_create(3, 100, &p, err, sizeof err) == 0, "%s", err);
    if (!p)
        return;
    CHECK(cpu_pool_threads(p) == 3 && cpu_pool_scratch_bytes(p) == 100, "pool shape");
    CHECK(((uintptr_t)cpu_pool_scratch(p, 2) & 63) == 0 && cpu_pool_scratch(p, 1) != cpu_pool_scratch(p, 2),
          "scratch aligned and per thread");
    int hits[257];
    int bad = 0;
    for (int job = 0; job < 3000; job++) {
        int n = 1 + job % 257;
        memset(hits, 0, sizeof hits);
        pool_ctx c = {hits, 3, 0};
        cpu_pool_run(p, count_task, &c, n);
        for (int i = 0; i < n; i++)
            bad += hits[i] != 1;
        bad += c.bad_tid;
    }
    CHECK(bad == 0, "every task of 3000 jobs ran exactly once on a valid thread (%d errors)", bad);
    cpu_pool_free(p);
    cpu_pool *d = NULL;
    CHECK(cpu_pool_create(0, 0, &d, err, sizeof err) == 0 && d && cpu_pool_threads(d) >= 1, "default thread count");
    cpu_pool_free(d);
}

/* ---------------------------------------------------------------- elementwise */

static void test_elementwise(void)
{
    enum { T = 3, D = 300 };
    static float x[T * D], w[D], y[T * D];
    for (int i = 0; i < T * D; i++)
        x[i] = rng_uniform(-3, 3);
    for (int i = 0; i < D; i++)
        w[i] = rng_uniform(-1, 1);
    for (int plus = 0; plus < 2; plus++) {
        cpu_rmsnorm(y, x, w, T, D, 1e-6f, plus);
        int bad = 0;
        for (int t = 0; t < T; t++) {
            double ss = 0;
            for (int i = 0; i < D; i++)
                ss += (double)x[t * D + i] * x[t * D + i];
            double inv = 1.0 / sqrt(ss / D + 1e-6);
            for (int i = 0; i < D; i++) {
                double wi = plus ? 1.0 + w[i] : w[i];
                double ref = x[t * D + i] * inv * wi;
                bad += fabs(y[t * D + i] - ref) > 4e-6 * fabs(x[t * D + i] * inv) * (fabs(wi) + 1e-30) + 1e-30;
            }
        }
        CHECK(bad == 0, "rmsnorm%s vs double (%d outside)", plus ? " (1+w)" : "", bad);
    }
    memcpy(y, x, sizeof y);
    cpu_rmsnorm(y, y, w, T, D, 1e-6f, false);
    static float y2[T * D];
    cpu_rmsnorm(y2, x, w, T, D, 1e-6f, false);
    CHECK(memcmp(y, y2, sizeof y) == 0, "rmsnorm in place");

    static float g[T * D], u[T * D];
    int bad_s = 0, bad_g = 0;
    for (int i = 0; i < T * D; i++) {
        g[i] = rng_uniform(-12, 12);
        u[i] = rng_uniform(-2, 2);
    }
    memcpy(y, g, sizeof y);
    cpu_silu_mul(y, u, T * D);
    for (int i = 0; i < T * D; i++) {
        double v = g[i], ref = v / (1 + exp(-v)) * u[i];
        bad_s += fabs(y[i] - ref) > 4e-6 * fabs(v * u[i]);
    }
    memcpy(y, g, sizeof y);
    cpu_gelu_tanh_mul(y, u, T * D);
    for (int i = 0; i < T * D; i++) {
        double v = g[i], ref = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))) * u[i];
        bad_g += fabs(y[i] - ref) > 4e-6 * fabs(v * u[i]);
    }
    CHECK(bad_s == 0, "silu*mul vs double (%d outside)", bad_s);
    CHECK(bad_g == 0, "gelu_tanh*mul vs double (%d outside)", bad_g);

    float sm[7] = {1, 2, 3, -INFINITY, 0.5f, 1000, 999};
    cpu_softmax(sm, 7);
    double e[7] = {exp(1 - 1000.0), exp(2 - 1000.0), exp(3 - 1000.0), 0, exp(0.5 - 1000), 1, exp(-1.0)}, s = 0;
    for (int i = 0; i < 7; i++)
        s += e[i];
    int bad_m = 0;
    for (int i = 0; i < 7; i++)
        bad_m += fabs(sm[i] - e[i] / s) > 4e-7 * (e[i] / s) + 1e-37;
    CHECK(bad_m == 0 && sm[3] == 0, "softmax with -inf and a large max (%d outside)", bad_m);
    float allneg[3] = {-INFINITY, -INFINITY, -INFINITY};
    cpu_softmax(allneg, 3);
    CHECK(allneg[0] == 0 && allneg[2] == 0, "all-masked softmax is zeros, not NaN");

    float a[5] = {1, 2, 3, 4, 5}, b[5] = {0.5f, -2, 1, 0, 10};
    cpu_add(a, b, 5);
    cpu_scale(a, 5, 2);
    CHECK(a[0] == 3 && a[1] == 0 && a[2] == 8 && a[3] == 8 && a[4] == 30, "add + scale");
}

/* ---------------------------------------------------------------- RoPE */

static double jnum(json_t *o, const char *k, double def)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

static void test_rope(void)
{
    json_error_t je;
    json_t *root = json_load_file("tests/data/quant/rope.json", 0, &je);
    CHECK(root != NULL, "cannot load tests/data/quant/rope.json: %s (run tools/gen_quant_fixtures.py)", je.text);
    if (!root)
        return;
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) >= 10, "rope fixture has cases");
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *sc = json_string_value(json_object_get(c, "scaling"));
        rope_cfg cfg = {0};
        cfg.style = strcmp(json_string_value(json_object_get(c, "style")), "norm") == 0 ? ROPE_NORM : ROPE_NEOX;
        cfg.n_rot = (int)jnum(c, "n_rot", 0);
        cfg.freq_base = jnum(c, "base", 0);
        cfg.scaling = strcmp(sc, "linear") == 0   ? ROPE_SCALE_LINEAR
                      : strcmp(sc, "llama3") == 0 ? ROPE_SCALE_LLAMA3
                      : strcmp(sc, "yarn") == 0   ? ROPE_SCALE_YARN
                                                  : ROPE_SCALE_NONE;
        cfg.factor = jnum(c, "factor", 0);
        cfg.low_freq_factor = jnum(c, "low_freq_factor", 0);
        cfg.high_freq_factor = jnum(c, "high_freq_factor", 0);
        cfg.orig_max_pos = jnum(c, "orig_max_pos", 0);
        cfg.beta_fast = jnum(c, "beta_fast", 0);
        cfg.beta_slow = jnum(c, "beta_slow", 0);
        cfg.attn_factor = jnum(c, "attn_factor", 0);
        cfg.mscale = jnum(c, "mscale", 0);
        cfg.mscale_all_dim = jnum(c, "mscale_all_dim", 0);
        cfg.yarn_no_truncate = json_is_false(json_object_get(c, "truncate"));
        int64_t T = (int64_t)jnum(c, "T", 0), H = (int64_t)jnum(c, "H", 0), S = (int64_t)jnum(c, "S", 0);
        char err[256];
        cpu_rope r;
        int rc = cpu_rope_init(&r, &cfg, err, sizeof err);
        CHECK(rc == 0, "rope %s init: %s", name, err);
        if (rc)
            continue;
        json_t *jf = json_object_get(c, "inv_freq");
        int bad_f = 0;
        for (size_t i = 0; i < json_array_size(jf); i++) {
            double ref = json_number_value(json_array_get(jf, i));
            bad_f += fabs(r.inv_freq[i] - ref) > 4e-7 * fabs(ref);
        }
        CHECK(json_array_size(jf) == (size_t)cfg.n_rot / 2 && bad_f == 0, "rope %s inv_freq (%d outside 3 ulp)", name,
              bad_f);
        double attn_ref = jnum(c, "attn_scale", 1);
        CHECK(fabs(r.attn_scale - attn_ref) <= 1e-7 * attn_ref, "rope %s attention scale %g vs %g", name,
              r.attn_scale, attn_ref);

        size_t n = (size_t)(T * H * S);
        float *x = malloc(n * sizeof(float)), *x0 = malloc(n * sizeof(float));
        int32_t pos[64];
        json_t *jx = json_object_get(c, "x"), *jy = json_object_get(c, "y"), *jp = json_object_get(c, "pos");
        CHECK(json_array_size(jx) == n && json_array_size(jy) == n && json_array_size(jp) == (size_t)T && T <= 64,
              "rope %s fixture shape", name);
        if (json_array_size(jx) != n || json_array_size(jy) != n || T > 64) {
            free(x);
            free(x0);
            continue;
        }
        for (size_t i = 0; i < n; i++)
            x[i] = x0[i] = (float)json_number_value(json_array_get(jx, i));
        for (int64_t t = 0; t < T; t++)
            pos[t] = (int32_t)json_integer_value(json_array_get(jp, t));
        cpu_rope_apply(&r, x, T, H, S, pos);
        int bad = 0, bad_pass = 0;
        double worst = 0;
        int half = cfg.n_rot / 2;
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < S; d++) {
                    size_t i = (size_t)((t * H + h) * S + d);
                    double ref = json_number_value(json_array_get(jy, i));
                    if (d >= cfg.n_rot) {
                        bad_pass += memcmp(&x[i], &x0[i], 4) != 0;
                        continue;
                    }
                    int fi;
                    size_t ia, ib;
                    if (cfg.style == ROPE_NEOX) {
                        fi = (int)(d % half);
                        ia = i - (size_t)(d >= half ? half : 0);
                        ib = ia + (size_t)half;
                    } else {
                        fi = (int)(d / 2);
                        ia = i - (size_t)(d % 2);
                        ib = ia + 1;
                    }
                    double angle = fabs((double)pos[t] * r.inv_freq[fi]);
                    double tol = (fabs(x0[ia]) + fabs(x0[ib])) * attn_ref * (1e-6 + 4e-7 * angle);
                    double e = fabs(x[i] - ref);
                    worst = e / tol > worst ? e / tol : worst;
                    bad += e > tol;
                }
        CHECK(bad == 0 && bad_pass == 0, "rope %s vs transformers port: %d rotated outside, %d pass-through changed",
              name, bad, bad_pass);
        fprintf(stderr, "  rope %-18s worst |err|/tol = %.3f\n", name, worst);
        free(x);
        free(x0);
    }
    json_decref(root);

    rope_cfg bad = {.style = ROPE_NEOX, .n_rot = 63, .freq_base = 10000};
    cpu_rope r;
    char err[256] = "";
    CHECK(cpu_rope_init(&r, &bad, err, sizeof err) < 0 && strstr(err, "even"), "odd rotary dim rejected: %s", err);
    bad.n_rot = 64;
    bad.scaling = ROPE_SCALE_LLAMA3;
    bad.factor = 8;
    CHECK(cpu_rope_init(&r, &bad, err, sizeof err) < 0, "llama3 without its factors rejected: %s", err);
    bad.scaling = ROPE_SCALE_LINEAR;
    bad.factor = 0;
    CHECK(cpu_rope_init(&r, &bad, err, sizeof err) < 0, "linear with factor 0 rejected: %s", err);
}

int main(void)
{
    char err[256];
    cpu_pool *pool = NULL;
    if (cpu_pool_create(3, cpu_matmul_scratch_bytes(1024), &pool, err, sizeof err) != 0) {
        CHECK(0, "pool: %s", err);
        return test_finish("test_matmul");
    }
    fprintf(stderr, "  SIMD %s, 8-bit kernels %s\n", quant_simd_active() ? "active (AVX2+FMA+F16C)" : "off (scalar path)",
            cpu_q8_vnni_active() ? "AVX-512 VNNI" : "AVX2");
    test_pool();
    test_matmul_errors(pool);
    test_matmul_accuracy(pool);
    test_matmul_q8(pool);
    test_matmul_q8_arith();
    test_matmul_bitstable(false);
    test_matmul_bitstable(true);
    test_matmul_multi(pool);
    test_elementwise();
    test_rope();
    cpu_pool_free(pool);
    return test_finish("test_matmul");
}
