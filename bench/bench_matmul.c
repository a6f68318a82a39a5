/*
 * bench_matmul.c — cpu_matmul throughput against this machine's limits.
 *
 * Not part of `make test`.  Build and run from the repo root:
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc bench/bench_matmul.c src/cpu.c src/quant.c src/util.c \
 *       -lcrypto -lpthread -lm -o /tmp/bench_matmul && /tmp/bench_matmul [threads]
 * SPILL_NO_SIMD=1 benchmarks the scalar path.
 *
 * For each weight type (Q4_1, Q8_0, F16, F32), matrix (SmolLM2-sized N=1536
 * K=576, and N=8192 K=2048) and T in {1, 8, 64, 256} it prints the time per
 * call, GFLOP/s (2·N·K·T per call) and the effective weight bandwidth (the
 * matrix's bytes in its file type per call), next to two measured limits:
 * Quantized types run in both matmul modes (exact fp32 dequant, and q8act:
 * 8-bit activations with integer dot products, see cpu_pool_set_q8_act).
 * The limits: the machine's peak fp32 FMA rate (independent FMA chains on all threads)
 * and its DRAM read bandwidth (summing a 512 MiB buffer on all threads).  The
 * small matrix fits in L2/L3, so its GB/s can exceed DRAM's; the large F32
 * and F16 ones do not.
 */
#include "engine/cpu.h"
#include "model/gguf.h"
#include "model/quant.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- limits */

typedef struct {
    float *buf;
    size_t n;
    double sums[256];
} bw_ctx;

static __attribute__((target("avx2,fma"))) void bw_task(void *vctx, int64_t task, int tid)
{
    bw_ctx *c = vctx;
    size_t chunk = c->n / 64, lo = (size_t)task * chunk;
    const float *p = c->buf + lo;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= chunk; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    c->sums[task % 256] += t[0];
}

static double measure_dram_gbs(cpu_pool *p)
{
    bw_ctx c = {0};
    c.n = (size_t)512 << 18; /* 512 MiB of floats */
    c.buf = malloc(c.n * sizeof(float));
    if (!c.buf)
        return 0;
    memset(c.buf, 1, c.n * sizeof(float));
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        cpu_pool_run(p, bw_task, &c, 64);
        double gbs = c.n * sizeof(float) / (now() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(c.buf);
    return best;
}

typedef struct {
    double out[256];
} fma_ctx;

#define FMA10(m, b) \
    a0 = _mm256_fmadd_ps(a0, m, b), a1 = _mm256_fmadd_ps(a1, m, b), a2 = _mm256_fmadd_ps(a2, m, b), \
    a3 = _mm256_fmadd_ps(a3, m, b), a4 = _mm256_fmadd_ps(a4, m, b), a5 = _mm256_fmadd_ps(a5, m, b), \
    a6 = _mm256_fmadd_ps(a6, m, b), a7 = _mm256_fmadd_ps(a7, m, b), a8 = _mm256_fmadd_ps(a8, m, b), \
    a9 = _mm256_fmadd_ps(a9, m, b)

/* 10 independent FMA chains (more than latency x ports on current x86) per thread. */
static __attribute__((target("avx2,fma"))) void fma_task(void *vctx, int64_t task, int tid)
{
    fma_ctx *c = vctx;
    __m256 m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3),
           a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7),
           a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9);
    for (int it = 0; it < 2000000; it++) {
        FMA10(m, b);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                           _mm256_add_ps(a8, a9)));
    float t[8];
    _mm256_storeu_ps(t, s);
    c->out[task % 256] = t[0];
}

static double measure_peak_gflops(cpu_pool *p)
{
    fma_ctx c;
    int n = cpu_pool_threads(p);
    double t0 = now();
    cpu_pool_run(p, fma_task, &c, n);
    double dt = now() - t0;
    return (double)n * 2000000.0 * 10 * 8 * 2 / dt / 1e9;
}

/* ---- matmul */

static uint8_t *make_weights(uint32_t type, int64_t N, int64_t K, size_t *bytes)
{
    size_t rb;
    quant_row_bytes(type, K, &rb);
    *bytes = rb * (size_t)N;
    uint8_t *w = malloc(*bytes);
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < *bytes; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        w[i] = (uint8_t)s;
    }
    /* sane scales so no NaN/Inf slows anything down */
    size_t bb = quant_block_bytes(type);
    uint16_t h = quant_fp32_to_fp16(0.01f);
    for (size_t off = 0; off < *bytes; off += bb) {
        if (type == GGML_F16) {
            memcpy(w + off, &h, 2);
        } else if (type == GGML_F32) {
            float v = 0.01f;
            memcpy(w + off, &v, 4);
        } else {
            memcpy(w + off, &h, 2);
            if (type == GGML_Q4_1)
                memcpy(w + off + 2, &h, 2);
        }
    }
    return w;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    char err[256];
    if (getenv("SPILL_NO_SIMD") && strcmp(getenv("SPILL_NO_SIMD"), "0")) /* this main() reads the switch itself */
        quant_simd_force(false);
    cpu_pool *pool;
    if (cpu_pool_create(threads, cpu_matmul_scratch_bytes(2048), &pool, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double dram = measure_dram_gbs(pool), peak = measure_peak_gflops(pool);
    printf("threads %d, SIMD %s\n", cpu_pool_threads(pool), quant_simd_active() ? "AVX2+FMA+F16C" : "off (scalar)");
    printf("machine limits (measured): fp32 FMA peak %.1f GFLOP/s, DRAM read %.1f GB/s\n\n", peak, dram);
    /* dequantization alone, one thread, 4096 elements per row from L1/L2 */
    {
        const uint32_t dts[] = {GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0,
                                GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
        float *row = malloc(sizeof(float) * 4096);
        printf("dequant, 1 thread:");
        for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
            size_t wb;
            uint8_t *w = make_weights(dts[i], 1, 4096, &wb);
            int iters = 0;
            double t0 = now(), dt;
            do {
                for (int r = 0; r < 100; r++)
                    quant_dequant_row(dts[i], w, row, 4096);
                iters += 100;
                dt = now() - t0;
            } while (dt < 0.05);
            printf(" %s %.2f", quant_type_name(dts[i]), 4096.0 * iters / dt / 1e9);
            free(w);
        }
        printf(" Gelem/s\n\n");
        free(row);
    }
    const uint32_t types[] = {GGML_Q4_1, GGML_Q8_0, GGML_F16, GGML_F32};
    printf("%-5s %-5s %11s %4s %10s %9s %7s %9s %8s\n", "type", "mode", "N x K", "T", "us/call", "GFLOP/s", "%peak",
           "W GB/s", "%DRAM");

    const int64_t shapes[][2] = {{1536, 576}, {8192, 2048}};
    const int64_t Ts[] = {1, 8, 64, 256};
    float *X = malloc(sizeof(float) * 256 * 2048), *Y = malloc(sizeof(float) * 256 * 8192);
    for (int i = 0; i < 256 * 2048; i++)
        X[i] = (float)(((int64_t)i * 7919) % 2001 - 1000) / 1000.0f;
    for (size_t s = 0; s < 2; s++) {
        for (size_t ti = 0; ti < 4; ti++) {
            int64_t N = shapes[s][0], K = shapes[s][1];
            size_t wbytes;
            uint8_t *W = make_weights(types[ti], N, K, &wbytes);
            for (int mode = 0; mode < 2; mode++)
            for (size_t k = 0; k < 4; k++) {
                int64_t T = Ts[k];
                if (mode == 1 && !quant_q8_supported(types[ti]))
                    break;
                cpu_pool_set_q8_act(pool, mode == 1);
                cpu_matmul(pool, W, types[ti], N, K, X, T, Y, err, sizeof err); /* warm up */
                int iters = 0;
                double t0 = now(), dt;
                do {
                    if (cpu_matmul(pool, W, types[ti], N, K, X, T, Y, err, sizeof err) != 0) {
                        fprintf(stderr, "%s\n", err);
                        return 1;
                    }
                    iters++;
                    dt = now() - t0;
                } while (dt < 0.25);
                double per = dt / iters;
                double gflops = 2.0 * N * K * T / per / 1e9, gbs = wbytes / per / 1e9;
                printf("%-5s %-5s %5lldx%-5lld %4lld %10.1f %9.1f %6.1f%% %9.2f %7.1f%%\n", quant_type_name(types[ti]),
                       mode ? "q8act" : "exact", (long long)N, (long long)K, (long long)T, per * 1e6, gflops, 100 * gflops / peak, gbs,
                       100 * gbs / dram);
            }
            free(W);
        }
    }
    free(X);
    free(Y);
    cpu_pool_free(pool);
    return 0;
}
