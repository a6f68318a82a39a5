/*
 * bench_dequant.cu — the GPU dequantizer alone (kernels.cu's k_dequant), block kernel against the generic
 * per-element one, on 70B-shaped matrices, with the bf16 GEMM it feeds beside it:
 *
 *   for each type (Q8_0 Q4_0 Q4_1 Q4_K Q5_K Q6_K) and shape N x K (8192x8192, 28672x8192, 8192x28672):
 *     generic and block: median of 20 timed launches (CUDA events, after 3 warm-ups) -> ms, GB/s read
 *     (quantized bytes), GB/s written (bf16), TB/s of the two together;
 *   cuBLAS bf16 GEMM Y(T, N) = X(T, K) W(N, K)^T at T = 2048 and 4096 for each shape (fp32 accumulation, as
 *   cuda_engine.cu's matmul) -> ms.
 *
 * One line per case on stdout, and the same as JSON lines with --json FILE.  The weights are random bytes (the
 * kernels' work does not depend on the values; NaN scales included).  Needs a GPU: built by `make cuda`, run on
 * the device by tools/device_issue18.sh (step `kernels`).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.cuh"

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "bench_dequant: %s failed: %s\n", #x, cudaGetErrorString(e_));                             \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

typedef struct qtype {
    const char *name;
    uint32_t id;
    int block, bytes; /* elements and bytes of one block */
} qtype;

static const qtype TYPES[] = {{"Q8_0", 8, 32, 34},   {"Q4_0", 2, 32, 18},   {"Q4_1", 3, 32, 20},
                              {"Q4_K", 12, 256, 144}, {"Q5_K", 13, 256, 176}, {"Q6_K", 14, 256, 210}};

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median ms of reps launches of k_dequant. */
static float time_dequant(const qtype *t, const uint8_t *w, int64_t N, int64_t K, bf16 *out, int generic)
{
    k_dequant_force_generic(generic);
    size_t rb = (size_t)(K / t->block) * (size_t)t->bytes;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        CK(k_dequant(t->id, w, rb, N, K, out, NULL, 0));
    float ms[20];
    for (int i = 0; i < 20; i++) {
        CK(cudaEventRecord(a, 0));
        CK(k_dequant(t->id, w, rb, N, K, out, NULL, 0));
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    qsort(ms, 20, sizeof *ms, cmp_f);
    return (ms[9] + ms[10]) / 2;
}

static float time_gemm(cublasHandle_t h, int64_t T, int64_t N, int64_t K, const bf16 *x, const bf16 *w, float *y)
{
    float one = 1, zero = 0;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms[10];
    for (int i = -2; i < 10; i++) {
        CK(cudaEventRecord(a, 0));
        /* column-major: Y^T(N, T) = W(N, K) as W^T stored (K, N) transposed · X^T (K, T) */
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, w, CUDA_R_16BF,
                                         (int)K, x, CUDA_R_16BF, (int)K, &zero, y, CUDA_R_32F, (int)N,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "bench_dequant: cublasGemmEx failed (%d)\n", (int)st);
            exit(1);
        }
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        if (i >= 0)
            CK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    qsort(ms, 10, sizeof *ms, cmp_f);
    return (ms[4] + ms[5]) / 2;
}

int main(int argc, char **argv)
{
    FILE *js = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            if (!(js = fopen(argv[++i], "w"))) {
                fprintf(stderr, "bench_dequant: cannot write %s\n", argv[i]);
                return 1;
            }
        } else {
            fprintf(stderr, "usage: bench_dequant [--json FILE]\n");
            return 2;
        }
    }
    static const int64_t SHAPES[][2] = {{8192, 8192}, {28672, 8192}, {8192, 28672}};
    const int64_t maxe = 28672LL * 8192;
    uint8_t *w;
    bf16 *out, *x;
    float *y;
    CK(cudaMalloc((void **)&w, (size_t)(maxe / 32) * 34 + 4096));
    CK(cudaMalloc((void **)&out, (size_t)maxe * sizeof(bf16)));
    CK(cudaMalloc((void **)&x, (size_t)4096 * 28672 * sizeof(bf16)));
    CK(cudaMalloc((void **)&y, (size_t)4096 * 28672 * sizeof(float)));
    {
        size_t n = (size_t)(maxe / 32) * 34 + 4096;
        uint8_t *h = (uint8_t *)malloc(n);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            h[i] = (uint8_t)s;
        }
        CK(cudaMemcpy(w, h, n, cudaMemcpyHostToDevice));
        free(h);
    }
    CK(cudaMemset(x, 0, (size_t)4096 * 28672 * sizeof(bf16)));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_dequant: cublasCreate failed\n");
        return 1;
    }
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        int64_t N = SHAPES[si][0], K = SHAPES[si][1];
        for (int T = 2048; T <= 4096; T *= 2) {
            float g = time_gemm(h, T, N, K, x, out, y);
            printf("gemm bf16 T=%d N=%lld K=%lld: %.3f ms (%.0f TFLOP/s)\n", T, (long long)N, (long long)K, g,
                   2.0 * T * N * K / (g * 1e-3) / 1e12);
            if (js)
                fprintf(js, "{\"kind\":\"gemm\",\"T\":%d,\"N\":%lld,\"K\":%lld,\"ms\":%.4f}\n", T, (long long)N,
                        (long long)K, g);
        }
        for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++) {
            const qtype *t = &TYPES[ti];
            double rd = (double)N * (double)(K / t->block) * t->bytes, wr = (double)N * K * 2;
            for (int generic = 1; generic >= 0; generic--) {
                float ms = time_dequant(t, w, N, K, out, generic);
                double s = ms * 1e-3;
                printf("dequant %s %-7s N=%lld K=%lld: %.3f ms, read %.0f GB/s, write %.0f GB/s, %.2f TB/s\n", t->name,
                       generic ? "generic" : "block", (long long)N, (long long)K, ms, rd / s / 1e9, wr / s / 1e9,
                       (rd + wr) / s / 1e12);
                if (js)
                    fprintf(js,
                            "{\"kind\":\"dequant\",\"type\":\"%s\",\"kernel\":\"%s\",\"N\":%lld,\"K\":%lld,\"ms\":%.4f,"
                            "\"read_gbs\":%.1f,\"write_gbs\":%.1f,\"tbs\":%.3f}\n",
                            t->name, generic ? "generic" : "block", (long long)N, (long long)K, ms, rd / s / 1e9,
                            wr / s / 1e9, (rd + wr) / s / 1e12);
            }
        }
    }
    cublasDestroy(h);
    if (js)
        fclose(js);
    return 0;
}
