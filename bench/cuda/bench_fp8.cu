/*
 * bench_fp8.cu — the fp8 GEMM (src/cuda/fp8.cu) against the bf16 one at the 70B shapes, on the GPU alone:
 *
 *   for N x K in 8192x8192 (q, o), 28672x8192 (gate, up), 8192x28672 (down) and T = 1024, 2048, 4096 rows:
 *     bf16   cuBLAS Y(T, N) = X(T, K) W(N, K)^T, bf16 operands, fp32 accumulation and output (the engine's
 *            GEMM for bf16 weights, and what q8/q4 pay after their dequant pass);
 *     fp8    fp8_gemm as the engine calls it: per-token E4M3 quantization of X, the weight scales gathered, the
 *            cuBLASLt FP8 GEMM with the scales applied (auto: outer-vector where cuBLASLt takes it), fp32 out;
 *            also with unit scales + the scaling kernel (post), and auto with FAST_ACCUM;
 *     quant  the activation quantizer alone (its share of the fp8 time).
 *   Each: median of 20 timed calls (CUDA events) after 3 warm-ups -> ms and TFLOP/s (2 T N K / s) against the
 *   H200 SXM's dense peaks (989 TFLOP/s bf16, 1979 fp8: NVIDIA's data sheet), and the fp8/bf16 speed-up.
 *
 * One line per case on stdout, JSON lines with --json FILE.  Weights are random finite E4M3 codes with unit
 * scales (tensor-core time does not depend on values).  Needs a GPU: built by `make cuda`, run on the device by
 * tools/device_fp8.sh.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/fp8.cuh"

#define PEAK_BF16 989.0
#define PEAK_FP8 1979.0

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "bench_fp8: %s failed: %s\n", #x, cudaGetErrorString(e_));                                 \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct bufs {
    uint8_t *w, *xq;
    bf16 *wb, *x;
    float *y, *xs, *ws;
    void *work;
    size_t work_bytes;
    cublasHandle_t h;
    fp8_lt *lt;
} bufs;

enum { K_BF16, K_FP8, K_QUANT };

/* One call of kind k on the default stream. */
static void call(bufs *b, int kind, int64_t T, int64_t N, int64_t K)
{
    if (kind == K_BF16) {
        float one = 1, zero = 0;
        cublasStatus_t st = cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, b->wb,
                                         CUDA_R_16BF, (int)K, b->x, CUDA_R_16BF, (int)K, &zero, b->y, CUDA_R_32F,
                                         (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "bench_fp8: cublasGemmEx failed (%d)\n", (int)st);
            exit(1);
        }
    } else if (kind == K_QUANT) {
        CK(k_fp8_quant_rows(b->x, T, K, b->xq, b->xs, 0));
    } else {
        char err[512];
        cudaError_t ce;
        if (fp8_gemm(b->lt, b->w, (size_t)K + 16, N, K, b->x, T, b->y, b->xq, b->xs, b->ws, b->work, b->work_bytes, 0,
                     &ce, err, sizeof err)) {
            fprintf(stderr, "bench_fp8: %s\n", err);
            exit(1);
        }
    }
}

static float time_ms(bufs *b, int kind, int64_t T, int64_t N, int64_t K)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        call(b, kind, T, N, K);
    float ms[20];
    for (int i = 0; i < 20; i++) {
        CK(cudaEventRecord(e0, 0));
        call(b, kind, T, N, K);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    qsort(ms, 20, sizeof *ms, cmp_f);
    return (ms[9] + ms[10]) / 2;
}

int main(int argc, char **argv)
{
    FILE *js = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            if (!(js = fopen(argv[++i], "w"))) {
                fprintf(stderr, "bench_fp8: cannot write %s\n", argv[i]);
                return 1;
            }
        } else {
            fprintf(stderr, "usage: bench_fp8 [--json FILE]\n");
            return 2;
        }
    }
    static const int64_t SHAPES[][2] = {{8192, 8192}, {28672, 8192}, {8192, 28672}};
    const int64_t maxe = 28672LL * 8192, maxT = 4096, maxK = 28672, maxN = 28672;
    bufs b;
    memset(&b, 0, sizeof b);
    b.work_bytes = 32u << 20;
    CK(cudaMalloc((void **)&b.w, (size_t)28672 * (8192 + 16)));
    CK(cudaMalloc((void **)&b.wb, (size_t)maxe * 2));
    CK(cudaMalloc((void **)&b.x, (size_t)maxT * maxK * 2));
    CK(cudaMalloc((void **)&b.xq, (size_t)maxT * maxK));
    CK(cudaMalloc((void **)&b.y, (size_t)maxT * maxN * 4));
    CK(cudaMalloc((void **)&b.xs, (size_t)maxT * 4));
    CK(cudaMalloc((void **)&b.ws, (size_t)maxN * 4));
    CK(cudaMalloc(&b.work, b.work_bytes));
    {
        /* weights: finite E4M3 codes (bit 3 clear: no NaN), unit scales in every row header of every shape's
         * layout (rows of 16 + K bytes for K = 8192 and 28672: the headers of the wider layout are set too) */
        size_t n = (size_t)28672 * (8192 + 16);
        uint8_t *h = (uint8_t *)malloc(n);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            h[i] = (uint8_t)(s & 0xf7);
        }
        const float one = 1.0f;
        for (int64_t K = 8192; K <= 28672; K += 28672 - 8192)
            for (int64_t r = 0; r < (int64_t)(n / (size_t)(K + 16)); r++) {
                memcpy(h + (size_t)r * (size_t)(K + 16), &one, 4);
                memset(h + (size_t)r * (size_t)(K + 16) + 4, 0, 12);
            }
        CK(cudaMemcpy(b.w, h, n, cudaMemcpyHostToDevice));
        free(h);
        /* activations: bf16 in [-1, 1) */
        size_t nx = (size_t)maxT * maxK;
        uint16_t *hx = (uint16_t *)malloc(nx * 2);
        for (size_t i = 0; i < nx; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            float v = (float)((s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            hx[i] = (uint16_t)(u >> 16);
        }
        CK(cudaMemcpy(b.x, hx, nx * 2, cudaMemcpyHostToDevice));
        free(hx);
        CK(cudaMemset(b.wb, 0, (size_t)maxe * 2));
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs; peaks (H200 SXM dense): bf16 %.0f, fp8 %.0f TFLOP/s\n", prop.name,
           prop.multiProcessorCount, PEAK_BF16, PEAK_FP8);
    if (cublasCreate(&b.h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_fp8: cublasCreate failed\n");
        return 1;
    }
    char err[512];
    if (fp8_lt_create(&b.lt, err, sizeof err)) {
        fprintf(stderr, "bench_fp8: %s\n", err);
        return 1;
    }
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        int64_t N = SHAPES[si][0], K = SHAPES[si][1];
        for (int64_t T = 1024; T <= 4096; T *= 2) {
            double flop = 2.0 * (double)T * (double)N * (double)K;
            float tb = time_ms(&b, K_BF16, T, N, K), tq = time_ms(&b, K_QUANT, T, N, K);
            fp8_lt_set(b.lt, FP8_AUTO, false);
            float ta = time_ms(&b, K_FP8, T, N, K);
            int mode = fp8_lt_last_mode(b.lt);
            fp8_lt_set(b.lt, FP8_POST, false);
            float tp = time_ms(&b, K_FP8, T, N, K);
            fp8_lt_set(b.lt, FP8_AUTO, true);
            float tf = time_ms(&b, K_FP8, T, N, K);
            printf("T=%-4lld N=%-5lld K=%-5lld  bf16 %7.3f ms %4.0f TF/s (%2.0f%% of peak) | fp8 %s %7.3f ms %4.0f TF/s "
                   "(%2.0f%% of peak, %.2fx bf16; quant %.3f ms) | post %7.3f ms | fast-accum %7.3f ms %4.0f TF/s\n",
                   (long long)T, (long long)N, (long long)K, tb, flop / (tb * 1e9), 100 * flop / (tb * 1e9) / PEAK_BF16,
                   mode == FP8_OUTER ? "outer" : "post", ta, flop / (ta * 1e9), 100 * flop / (ta * 1e9) / PEAK_FP8,
                   tb / ta, tq, tp, tf, flop / (tf * 1e9));
            if (js)
                fprintf(js,
                        "{\"T\":%lld,\"N\":%lld,\"K\":%lld,\"bf16_ms\":%.4f,\"fp8_ms\":%.4f,\"fp8_mode\":\"%s\","
                        "\"fp8_post_ms\":%.4f,\"fp8_fast_ms\":%.4f,\"quant_ms\":%.4f,\"bf16_tflops\":%.1f,"
                        "\"fp8_tflops\":%.1f,\"peak_bf16\":%.0f,\"peak_fp8\":%.0f}\n",
                        (long long)T, (long long)N, (long long)K, tb, ta, mode == FP8_OUTER ? "outer" : "post", tp, tf,
                        tq, flop / (tb * 1e9), flop / (ta * 1e9), PEAK_BF16, PEAK_FP8);
        }
    }
    fp8_lt_free(b.lt);
    cublasDestroy(b.h);
    if (js)
        fclose(js);
    return 0;
}
