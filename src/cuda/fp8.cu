/*
 * fp8.cu — GEMMs with fp8 weights on the FP8 tensor cores through cuBLASLt (see fp8.cuh for the contract).
 *
 * Owns: the per-token activation quantizer, the cuBLASLt call (layouts, scale modes, the plan cache) and the
 * fallback scaling kernel.  Does not own: where the buffers live (cuda_engine.cu), the weight format
 * (quantize.c / gguf.h).
 *
 * Layout, in cuBLASLt's column-major terms (FP8 GEMMs there must be "TN": A transposed, B not):
 *   A = the weights: K x N, leading dimension row_bytes (= 16 + K: each row's scale header sits between
 *       rows, so the codes are read in place from W + 16), op(A) = A^T, so M = N;
 *   B = the quantized activations: K x T, leading dimension K;
 *   D = y^T: N x T fp32, leading dimension N, i.e. y(T, N) row-major.
 * Every leading dimension and pointer is a multiple of 16 bytes when K % 16 == 0 (cuBLASLt's FP8 rule).
 *
 * Scales: the product of token t and weight row n needs xs[t] * ws[n].  cuBLASLt 12.9+ applies exactly that
 * with CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on A (a vector of M = N) and B (a vector of T); the header
 * (CUDA 13's cublasLt.h) documents it for FP8 inputs with a 16F/16BF/32F output.  Where a shape gets no
 * algorithm in that mode (or the library refuses it), the GEMM runs with unit scales and k_fp8_rescale
 * multiplies y afterwards: one extra pass over y (T*N*4 bytes written and read), which at 70B shapes is
 * ~1-2% of the GEMM.  FP8_AUTO tries OUTER once per shape and remembers the answer.
 *
 * Plans: a matmul descriptor, three layouts and the heuristic's algorithm per (N, K, T, row_bytes, mode,
 * fast_accum), 64 kept (replaced round robin): the heuristic costs tens of microseconds, a pass calls this
 * 7 times per layer, and T takes few distinct values in a job (the batch, the prompt chunk).
 */
#include "fp8.cuh"

#include <cuda_fp8.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLANS 64

typedef struct plan {
    bool used, outer_ok; /* outer_ok false: this (shape, mode) has no algorithm; kept so it is not asked again */
    int64_t N, K, T;
    size_t ld;
    int mode;
    bool fast;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} plan;

struct fp8_lt {
    cublasLtHandle_t h;
    int mode, last_mode;
    bool fast;
    plan p[PLANS];
    int next;
};

static int fp8_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---------------------------------------------------------------- kernels */

/* One block of 256 threads per token row: amax, then 8 codes per thread per step (16-byte loads). */
__global__ void fp8_quant_rows_kernel(const bf16 *x, int64_t K, uint8_t *q, float *xs)
{
    __shared__ float part[8];
    const bf16 *xr = x + blockIdx.x * K;
    uint8_t *qr = q + blockIdx.x * K;
    float amax = 0;
    for (int64_t k = (int64_t)threadIdx.x * 8; k < K; k += (int64_t)blockDim.x * 8) {
        uint4 raw = *(const uint4 *)(xr + k);
        const bf16 *h = (const bf16 *)&raw;
#pragma unroll
        for (int j = 0; j < 8; j++)
            amax = fmaxf(amax, fabsf(__bfloat162float(h[j])));
    }
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = amax;
    __syncthreads();
    float m = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        m = fmaxf(m, part[w]);
    float s = __fdiv_rn(m, 448.0f);
    if (threadIdx.x == 0)
        xs[blockIdx.x] = s;
    for (int64_t k = (int64_t)threadIdx.x * 8; k < K; k += (int64_t)blockDim.x * 8) {
        uint4 raw = *(const uint4 *)(xr + k);
        const bf16 *h = (const bf16 *)&raw;
        __align__(8) uint8_t c[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            c[j] = s != 0 ? (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(h[j]), s), __NV_SATFINITE,
                                                           __NV_E4M3)
                          : 0;
        *(uint2 *)(qr + k) = *(const uint2 *)c;
    }
}

cudaError_t k_fp8_quant_rows(const bf16 *x, int64_t T, int64_t K, uint8_t *q, float *xs, cudaStream_t s)
{
    if (T <= 0)
        return cudaSuccess;
    fp8_quant_rows_kernel<<<(unsigned)T, 256, 0, s>>>(x, K, q, xs);
    return cudaGetLastError();
}

__global__ void fp8_row_scales_kernel(const uint8_t *w, size_t row_bytes, int64_t N, float *ws)
{
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        ws[n] = *(const float *)(w + n * row_bytes);
}

cudaError_t k_fp8_row_scales(const uint8_t *w, size_t row_bytes, int64_t N, float *ws, cudaStream_t s)
{
    if (N <= 0)
        return cudaSuccess;
    fp8_row_scales_kernel<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(w, row_bytes, N, ws);
    return cudaGetLastError();
}

/* y(T, N) *= xs[t] * ws[n] */
__global__ void fp8_rescale_kernel(float *y, const float *xs, const float *ws, int64_t T, int64_t N)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < T * N; i += stride)
        y[i] = __fmul_rn(y[i], __fmul_rn(xs[i / N], ws[i % N]));
}

static cudaError_t k_fp8_rescale(float *y, const float *xs, const float *ws, int64_t T, int64_t N, cudaStream_t s)
{
    int64_t b = (T * N + 255) / 256;
    fp8_rescale_kernel<<<(unsigned)(b > 65535LL * 16 ? 65535LL * 16 : b), 256, 0, s>>>(y, xs, ws, T, N);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- cuBLASLt */

int fp8_lt_create(fp8_lt **out, char *err, size_t errlen)
{
    *out = NULL;
    fp8_lt *c = (fp8_lt *)calloc(1, sizeof *c);
    if (!c)
        return fp8_errf(err, errlen, "out of memory creating the fp8 GEMM context.");
    cublasStatus_t st = cublasLtCreate(&c->h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(c);
        return fp8_errf(err, errlen, "cublasLtCreate failed: %s.", cublasGetStatusString(st));
    }
    c->mode = FP8_AUTO;
    c->last_mode = FP8_OUTER;
    *out = c;
    return 0;
}

static void plan_drop(plan *p)
{
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

void fp8_lt_free(fp8_lt *c)
{
    if (!c)
        return;
    for (int i = 0; i < PLANS; i++)
        plan_drop(&c->p[i]);
    cublasLtDestroy(c->h);
    free(c);
}

void fp8_lt_set(fp8_lt *c, int mode, bool fast_accum)
{
    c->mode = mode;
    c->fast = fast_accum;
}

int fp8_lt_last_mode(const fp8_lt *c)
{
    return c->last_mode;
}

/* Builds a plan for mode (FP8_OUTER or FP8_POST); CUBLAS_STATUS_NOT_SUPPORTED when the heuristic has none. */
static cublasStatus_t plan_build(fp8_lt *c, plan *p, int64_t N, int64_t K, int64_t T, size_t ld, int mode,
                                 size_t work_bytes)
{
    memset(p, 0, sizeof *p);
    p->N = N, p->K = K, p->T = T, p->ld = ld, p->mode = mode, p->fast = c->fast;
    cublasStatus_t st;
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    const int8_t fast = c->fast ? 1 : 0;
#define TRY_LT(x)                                                                                                      \
    do {                                                                                                               \
        if ((st = (x)) != CUBLAS_STATUS_SUCCESS) {                                                                     \
            plan_drop(p);                                                                                              \
            return st;                                                                                                 \
        }                                                                                                              \
    } while (0)
    TRY_LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    TRY_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
    TRY_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
    TRY_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    if (mode == FP8_OUTER) {
        const int32_t sm = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        TRY_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm, sizeof sm));
        TRY_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm, sizeof sm));
    }
    TRY_LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)N, (int64_t)ld));
    TRY_LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)T, (int64_t)K));
    TRY_LT(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)N, (uint64_t)T, (int64_t)N));
    cublasLtMatmulPreference_t pref;
    TRY_LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wb = work_bytes;
    /* the heuristic assumes 256-byte aligned operands unless told; the weights start 16 bytes into a row (after
     * the scale header) and MoE outputs at row offsets, so every operand is promised 16 bytes only */
    const uint32_t align = 16;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wb, sizeof wb);
    static const cublasLtMatmulPreferenceAttributes_t al[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, al[i], &align, sizeof align);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(c->h, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found < 1)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st != CUBLAS_STATUS_SUCCESS) {
        plan_drop(p);
        return st;
    }
#undef TRY_LT
    p->algo = res.algo;
    p->used = true;
    p->outer_ok = true;
    return CUBLAS_STATUS_SUCCESS;
}

static plan *plan_find(fp8_lt *c, int64_t N, int64_t K, int64_t T, size_t ld, int mode)
{
    for (int i = 0; i < PLANS; i++) {
        plan *p = &c->p[i];
        if (p->used && p->N == N && p->K == K && p->T == T && p->ld == ld && p->mode == mode && p->fast == c->fast)
            return p;
    }
    return NULL;
}

/* One matmul in mode; CUBLAS_STATUS_NOT_SUPPORTED when the mode has no plan for the shape. */
static cublasStatus_t lt_run(fp8_lt *c, int mode, const uint8_t *A, size_t ld, int64_t N, int64_t K,
                             const uint8_t *B, int64_t T, float *y, const float *xs, const float *ws, void *work,
                             size_t work_bytes, cudaStream_t s)
{
    plan *p = plan_find(c, N, K, T, ld, mode);
    if (p && !p->outer_ok)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* tried before: no algorithm in this mode */
    if (!p) {
        p = &c->p[c->next];
        c->next = (c->next + 1) % PLANS;
        plan_drop(p);
        cublasStatus_t st = plan_build(c, p, N, K, T, ld, mode, work_bytes);
        if (st != CUBLAS_STATUS_SUCCESS) { /* remembered, so the heuristic is not asked again for this shape */
            p->used = true, p->outer_ok = false;
            p->N = N, p->K = K, p->T = T, p->ld = ld, p->mode = mode, p->fast = c->fast;
            return st;
        }
    }
    if (mode == FP8_OUTER) {
        cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st =
        cublasLtMatmul(c->h, p->op, &one, A, p->a, B, p->b, &zero, y, p->d, y, p->d, &p->algo, work, work_bytes, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) { /* refused at matmul time */
        plan_drop(p);
        p->used = true, p->outer_ok = false;
        p->N = N, p->K = K, p->T = T, p->ld = ld, p->mode = mode, p->fast = c->fast;
    }
    return st;
}

int fp8_gemm(fp8_lt *c, const uint8_t *W, size_t row_bytes, int64_t N, int64_t K, const bf16 *x, int64_t T, float *y,
             uint8_t *xq, float *xs, float *ws, void *work, size_t work_bytes, cudaStream_t s, cudaError_t *cu,
             char *err, size_t errlen)
{
    *cu = cudaSuccess;
    if (K % 16 || row_bytes != (size_t)K + 16 || (uintptr_t)W % 16)
        return fp8_errf(err, errlen, "fp8 GEMM: K = %lld with rows of %zu bytes at %p; fp8 rows need K %% 16 == 0, "
                                     "16 + K bytes and 16-byte alignment.",
                        (long long)K, row_bytes, (const void *)W);
    if (T <= 0 || N <= 0)
        return 0;
    cudaError_t ce = k_fp8_quant_rows(x, T, K, xq, xs, s);
    if (ce == cudaSuccess)
        ce = k_fp8_row_scales(W, row_bytes, N, ws, s);
    if (ce != cudaSuccess) {
        *cu = ce;
        return fp8_errf(err, errlen, "CUDA fp8 quantize kernels failed: %s (%s).", cudaGetErrorName(ce),
                        cudaGetErrorString(ce));
    }
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    int mode = c->mode == FP8_POST ? FP8_POST : FP8_OUTER;
    if (mode == FP8_OUTER) {
        st = lt_run(c, FP8_OUTER, W + 16, row_bytes, N, K, xq, T, y, xs, ws, work, work_bytes, s);
        if ((st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) && c->mode == FP8_AUTO)
            mode = FP8_POST; /* this cuBLASLt has no outer-vector scaling for the shape: scale after */
    }
    if (mode == FP8_POST) {
        st = lt_run(c, FP8_POST, W + 16, row_bytes, N, K, xq, T, y, xs, ws, work, work_bytes, s);
        if (st == CUBLAS_STATUS_SUCCESS && (ce = k_fp8_rescale(y, xs, ws, T, N, s)) != cudaSuccess) {
            *cu = ce;
            return fp8_errf(err, errlen, "CUDA fp8 rescale kernel failed: %s (%s).", cudaGetErrorName(ce),
                            cudaGetErrorString(ce));
        }
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fp8_errf(err, errlen, "cuBLASLt fp8 GEMM (N=%lld K=%lld T=%lld, %s scales) failed: %s.", (long long)N,
                        (long long)K, (long long)T, mode == FP8_OUTER ? "outer-vector" : "unit",
                        cublasGetStatusString(st));
    c->last_mode = mode;
    return 0;
}
