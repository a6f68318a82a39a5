/*
 * cuda_ops.cu — one-shot entry points around single kernels, for the GPU op
 * tests (tests/cuda/test_cuda_ops.c compares each with the CPU op).
 *
 * Owns: staging host inputs to the device and results back, per call.  Not
 * for the hot path: every call allocates and synchronizes.  The engine
 * (cuda_engine.cu) runs the same kernels and the same cuBLAS call shape.
 */
#include "cuda_test.h"

#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../model/gguf.h"
#include "../model/quant.h"
#include "../base/util.h"
}
#include "kernels.cuh"
#include "fp8.cuh"

#define MAXBUF 12

/* Device buffers of one call, freed together. */
typedef struct op_ctx {
    void *p[MAXBUF];
    int n;
    char *err;
    size_t errlen;
} op_ctx;

static int op_fail(op_ctx *c, cudaError_t e, const char *what)
{
    bool sticky = e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorMisalignedAddress ||
                  e == cudaErrorIllegalInstruction || e == cudaErrorUnknown;
    util_errf(c->err, c->errlen, "CUDA %s failed: %s (%s).", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return sticky ? CUDA_ENGINE_EDEVICE : -1;
}

/* Allocates bytes on the device and copies src (when non-NULL) into it. */
static int op_up(op_ctx *c, void **d, const void *src, size_t bytes)
{
    cudaError_t e = cudaMalloc(d, bytes ? bytes : 4);
    if (e != cudaSuccess)
        return op_fail(c, e, "cudaMalloc");
    c->p[c->n++] = *d;
    if (src && (e = cudaMemcpy(*d, src, bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
        return op_fail(c, e, "cudaMemcpy H2D");
    return 0;
}

/* Waits for the launch and copies the result back. */
static int op_down(op_ctx *c, cudaError_t launch, void *dst, const void *d, size_t bytes)
{
    if (launch != cudaSuccess)
        return op_fail(c, launch, "kernel launch");
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemcpy(dst, d, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0 : op_fail(c, e, "kernel or copy back");
}

static int op_done(op_ctx *c, int rc)
{
    for (int i = 0; i < c->n; i++)
        cudaFree(c->p[i]);
    return rc;
}

#define OP_BEGIN                                                                                                       \
    op_ctx c_ = {{0}, 0, err, errlen}, *c = &c_;                                                                       \
    int rc = 0
#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        if ((rc = (x)) != 0)                                                                                           \
            return op_done(c, rc);                                                                                     \
    } while (0)

int cuda_op_dequant(uint32_t type, const void *w, int64_t N, int64_t K, float *out, char *err, size_t errlen)
{
    OP_BEGIN;
    size_t rb;
    if (!kq_type_supported(type) || quant_row_bytes(type, K, &rb))
        return util_errf(err, errlen, "type %u with %lld columns cannot be dequantized on the GPU.", type,
                         (long long)K);
    void *dw, *dy;
    TRY(op_up(c, &dw, w, rb * (size_t)N));
    TRY(op_up(c, &dy, NULL, (size_t)(N * K) * 4));
    TRY(op_down(c, k_dequant(type, dw, rb, N, K, NULL, (float *)dy, 0), out, dy, (size_t)(N * K) * 4));
    return op_done(c, 0);
}

int cuda_op_matmul(uint32_t type, const void *w, int64_t N, int64_t K, const float *x, int64_t T, float *y, char *err,
                   size_t errlen)
{
    OP_BEGIN;
    size_t rb;
    if (!kq_type_supported(type) || quant_row_bytes(type, K, &rb))
        return util_errf(err, errlen, "type %u with %lld columns cannot be multiplied on the GPU.", type, (long long)K);
    void *dw, *dwb, *dx, *dxb, *dy;
    TRY(op_up(c, &dw, w, rb * (size_t)N));
    TRY(op_up(c, &dwb, NULL, (size_t)(N * K) * 2));
    TRY(op_up(c, &dx, x, (size_t)(T * K) * 4));
    TRY(op_up(c, &dxb, NULL, (size_t)(T * K) * 2));
    TRY(op_up(c, &dy, NULL, (size_t)(T * N) * 4));
    cudaError_t e = k_dequant(type, dw, rb, N, K, (bf16 *)dwb, NULL, 0);
    if (e == cudaSuccess)
        e = k_to_bf16((const float *)dx, (bf16 *)dxb, T * K, 0);
    if (e != cudaSuccess)
        return op_done(c, op_fail(c, e, "kernel launch"));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return op_done(c, util_errf(err, errlen, "cublasCreate failed."));
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s =
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, dwb, CUDA_R_16BF, (int)K, dxb,
                     CUDA_R_16BF, (int)K, &zero, dy, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasDestroy(h);
    if (s != CUBLAS_STATUS_SUCCESS)
        return op_done(c, util_errf(err, errlen, "cublasGemmEx failed: %s.", cublasGetStatusString(s)));
    TRY(op_down(c, cudaSuccess, y, dy, (size_t)(T * N) * 4));
    return op_done(c, 0);
}

int cuda_op_fp8_quant(const float *x, int64_t T, int64_t K, uint8_t *q, float *xs, char *err, size_t errlen)
{
    OP_BEGIN;
    if (K % 16)
        return util_errf(err, errlen, "fp8 activations need K %% 16 == 0, not %lld.", (long long)K);
    void *dx, *dxb, *dq, *ds;
    TRY(op_up(c, &dx, x, (size_t)(T * K) * 4));
    TRY(op_up(c, &dxb, NULL, (size_t)(T * K) * 2));
    TRY(op_up(c, &dq, NULL, (size_t)(T * K)));
    TRY(op_up(c, &ds, NULL, (size_t)T * 4));
    cudaError_t e = k_to_bf16((const float *)dx, (bf16 *)dxb, T * K, 0);
    if (e == cudaSuccess)
        e = k_fp8_quant_rows((const bf16 *)dxb, T, K, (uint8_t *)dq, (float *)ds, 0);
    TRY(op_down(c, e, q, dq, (size_t)(T * K)));
    TRY(op_down(c, cudaSuccess, xs, ds, (size_t)T * 4));
    return op_done(c, 0);
}

int cuda_op_fp8_matmul(const void *w, int64_t N, int64_t K, const float *x, int64_t T, float *y, int mode,
                       bool fast_accum, int *used_mode, char *err, size_t errlen)
{
    OP_BEGIN;
    size_t rb = (size_t)K + 16;
    void *dw, *dx, *dxb, *dq, *dxs, *dws, *dy, *dwork;
    const size_t work = 32u << 20;
    TRY(op_up(c, &dw, w, rb * (size_t)N));
    TRY(op_up(c, &dx, x, (size_t)(T * K) * 4));
    TRY(op_up(c, &dxb, NULL, (size_t)(T * K) * 2));
    TRY(op_up(c, &dq, NULL, (size_t)(T * K)));
    TRY(op_up(c, &dxs, NULL, (size_t)T * 4));
    TRY(op_up(c, &dws, NULL, (size_t)N * 4));
    TRY(op_up(c, &dy, NULL, (size_t)(T * N) * 4));
    TRY(op_up(c, &dwork, NULL, work));
    cudaError_t e = k_to_bf16((const float *)dx, (bf16 *)dxb, T * K, 0);
    if (e != cudaSuccess)
        return op_done(c, op_fail(c, e, "kernel launch"));
    fp8_lt *lt;
    if (fp8_lt_create(&lt, err, errlen))
        return op_done(c, -1);
    fp8_lt_set(lt, mode, fast_accum);
    cudaError_t ce;
    int r = fp8_gemm(lt, (const uint8_t *)dw, rb, N, K, (const bf16 *)dxb, T, (float *)dy, (uint8_t *)dq,
                     (float *)dxs, (float *)dws, dwork, work, 0, &ce, err, errlen);
    if (used_mode)
        *used_mode = fp8_lt_last_mode(lt);
    if (r == 0)
        r = op_down(c, cudaSuccess, y, dy, (size_t)(T * N) * 4);
    else if (ce != cudaSuccess)
        r = op_fail(c, ce, "fp8 GEMM");
    cudaDeviceSynchronize();
    fp8_lt_free(lt);
    return op_done(c, r);
}

int cuda_op_rmsnorm(const float *x, const float *w, int64_t T, int64_t D, float eps, bool plus_one, float *y, char *err,
                    size_t errlen)
{
    OP_BEGIN;
    void *dx, *dw;
    TRY(op_up(c, &dx, x, (size_t)(T * D) * 4));
    TRY(op_up(c, &dw, w, (size_t)D * 4));
    TRY(op_down(c, k_rmsnorm((float *)dx, (float *)dw, T, D, eps, plus_one, (float *)dx, NULL, 0), y, dx,
                (size_t)(T * D) * 4));
    return op_done(c, 0);
}

int cuda_op_rope(float *x, int64_t T, int H, int S, const int32_t *pos, const float *inv_freq, int n_rot, int style,
                 float attn_scale, char *err, size_t errlen)
{
    OP_BEGIN;
    void *dx, *dp, *df;
    size_t n = (size_t)T * (size_t)H * (size_t)S;
    TRY(op_up(c, &dx, x, n * 4));
    TRY(op_up(c, &dp, pos, (size_t)T * 4));
    TRY(op_up(c, &df, inv_freq, (size_t)(n_rot / 2) * 4));
    TRY(op_down(c, k_rope((float *)dx, T, H, S, (int32_t *)dp, NULL, NULL, (float *)df, n_rot, style, attn_scale, 0), x, dx,
                n * 4));
    return op_done(c, 0);
}

int cuda_op_act_mul(float *g, const float *u, int64_t n, bool gelu, char *err, size_t errlen)
{
    OP_BEGIN;
    void *dg, *du, *dy;
    TRY(op_up(c, &dg, g, (size_t)n * 4));
    TRY(op_up(c, &du, u, (size_t)n * 4));
    TRY(op_up(c, &dy, NULL, (size_t)n * 4));
    TRY(op_down(c, k_act_mul((float *)dg, (float *)du, n, gelu, NULL, (float *)dy, 0), g, dy, (size_t)n * 4));
    return op_done(c, 0);
}

int cuda_op_attention(const float *q, const float *kv_arena, int32_t n_pages, int P, int H, int K, int S, int kv_dtype,
                      const int32_t *pos, const int32_t *seq, int64_t T, const int32_t *pt_off, const int32_t *pages,
                      int32_t n_table, int n_seqs, int window, float scale, float softcap, int tile_min_run,
                      bool split, float *out, char *err, size_t errlen)
{
    OP_BEGIN;
    void *dq, *dkv, *dpos, *dseq, *dpt, *dpg, *dout, *dtiles = NULL, *dsingles = NULL;
    size_t qn = (size_t)T * (size_t)H * (size_t)S;
    int n_tiles = 0;
    int64_t n_singles = 0;
    int32_t max_len = 0; /* the per-token kernel's longest row */
    int bq = k_attention_tile_tokens(H, K, S);
    for (int64_t t = 0; t < T; t++)
        max_len = pos[t] + 1 > max_len ? pos[t] + 1 : max_len;
    if (tile_min_run > 0 && bq > 0) {
        int32_t *tiles = (int32_t *)malloc((size_t)T * 2 * 4), *singles = (int32_t *)malloc((size_t)T * 4);
        if (!tiles || !singles) {
            free(tiles);
            free(singles);
            return op_done(c, util_errf(err, errlen, "out of host memory."));
        }
        k_attention_plan(seq, pos, T, bq, tile_min_run, tiles, singles, &n_tiles, &n_singles);
        max_len = 0;
        for (int64_t i = 0; i < n_singles; i++)
            max_len = pos[singles[i]] + 1 > max_len ? pos[singles[i]] + 1 : max_len;
        int up = op_up(c, &dtiles, tiles, (size_t)T * 2 * 4);
        if (up == 0)
            up = op_up(c, &dsingles, singles, (size_t)T * 4);
        free(tiles);
        free(singles);
        TRY(up);
    }
    size_t an = (size_t)n_pages * 2 * (size_t)K * (size_t)P * (size_t)S;
    void *dkv32;
    kv_geom g;
    g.P = P;
    g.Kh = K;
    g.S = S;
    g.kvt = kv_dtype == KV_I8 ? KV_I8 : KV_BF16;
    TRY(op_up(c, &dq, q, qn * 4));
    TRY(op_up(c, &dkv32, kv_arena, an * 4));
    TRY(op_up(c, &dkv, NULL, (size_t)n_pages * (size_t)kv_block_bytes(P, K, S, g.kvt)));
    void *dpart = NULL;
    if (split)
        TRY(op_up(c, &dpart, NULL, k_attention_part_floats(S) * 4));
    g.layer_base = (uint8_t *)dkv;
    cudaError_t ce = k_kv_pack(g, (const float *)dkv32, n_pages, 0); /* as the engine stores KV */
    if (ce != cudaSuccess)
        return op_done(c, op_fail(c, ce, "kernel launch"));
    TRY(op_up(c, &dpos, pos, (size_t)T * 4));
    TRY(op_up(c, &dseq, seq, (size_t)T * 4));
    TRY(op_up(c, &dpt, pt_off, (size_t)n_seqs * 4));
    TRY(op_up(c, &dpg, pages, (size_t)n_table * 4));
    TRY(op_up(c, &dout, NULL, qn * 4));
    TRY(op_down(c,
                k_attention(g, (float *)dq, (int32_t *)dpos, (int32_t *)dseq, (int32_t *)dpt, (int32_t *)dpg, T, H,
                            window, scale, softcap, (const int32_t *)dtiles, n_tiles, (const int32_t *)dsingles,
                            n_singles, max_len, (float *)dpart, (float *)dout, 0),
                out, dout, qn * 4));
    return op_done(c, 0);
}

int cuda_op_kv_write(const float *k, const float *v, int64_t T, const int32_t *pos, const int32_t *seq,
                     const int32_t *pt_off, const int32_t *pages, int32_t n_table, int n_seqs, int32_t n_pages, int P,
                     int K, int S, int kv_dtype, float *arena, char *err, size_t errlen)
{
    OP_BEGIN;
    void *dk, *dv, *dpos, *dseq, *dpt, *dpg, *dkv, *dout;
    size_t kn = (size_t)T * (size_t)K * (size_t)S, an = (size_t)n_pages * 2 * (size_t)K * (size_t)P * (size_t)S;
    TRY(op_up(c, &dk, k, kn * 4));
    TRY(op_up(c, &dv, v, kn * 4));
    TRY(op_up(c, &dpos, pos, (size_t)T * 4));
    TRY(op_up(c, &dseq, seq, (size_t)T * 4));
    TRY(op_up(c, &dpt, pt_off, (size_t)n_seqs * 4));
    TRY(op_up(c, &dpg, pages, (size_t)n_table * 4));
    kv_geom g;
    g.P = P;
    g.Kh = K;
    g.S = S;
    g.kvt = kv_dtype == KV_I8 ? KV_I8 : KV_BF16;
    size_t bytes = (size_t)n_pages * (size_t)kv_block_bytes(P, K, S, g.kvt);
    TRY(op_up(c, &dkv, NULL, bytes));
    TRY(op_up(c, &dout, NULL, an * 4));
    cudaError_t ce = cudaMemset(dkv, 0, bytes);
    g.layer_base = (uint8_t *)dkv;
    if (ce == cudaSuccess)
        ce = k_kv_write(g, (const float *)dk, (const float *)dv, (const int32_t *)dpos, (const int32_t *)dseq,
                        (const int32_t *)dpt, (const int32_t *)dpg, T, 0);
    if (ce == cudaSuccess)
        ce = k_kv_unpack(g, (float *)dout, n_pages, 0);
    TRY(op_down(c, ce, arena, dout, an * 4));
    return op_done(c, 0);
}

void cuda_attention_kind(int kind)
{
    k_attention_set_kind(kind);
}

int cuda_attention_last_split(void)
{
    return k_attention_last_split();
}

int cuda_op_pick(const float *logits, int R, int V, const int32_t *want, const int32_t *target, cuda_pick *out,
                 char *err, size_t errlen)
{
    OP_BEGIN;
    void *dl, *dw, *dt = NULL, *dout;
    TRY(op_up(c, &dl, logits, (size_t)R * (size_t)V * 4));
    TRY(op_up(c, &dw, want, (size_t)R * 4));
    if (target)
        TRY(op_up(c, &dt, target, (size_t)R * 4));
    TRY(op_up(c, &dout, NULL, (size_t)R * sizeof(pick_out)));
    TRY(op_down(c, k_pick((const float *)dl, R, V, (const int32_t *)dw, (const int32_t *)dt, (pick_out *)dout, 0),
                out, dout,
                (size_t)R * sizeof(pick_out)));
    return op_done(c, 0);
}

int cuda_op_lora_mask(const float *tmp, const int32_t *own, const int32_t *ad, int64_t T, int C, uint16_t *out,
                      char *err, size_t errlen)
{
    OP_BEGIN;
    void *dt, *dw, *da, *dout;
    size_t n = (size_t)T * (size_t)C;
    TRY(op_up(c, &dt, tmp, n * 4));
    TRY(op_up(c, &dw, own, (size_t)C * 4));
    TRY(op_up(c, &da, ad, (size_t)T * 4));
    TRY(op_up(c, &dout, NULL, n * 2));
    TRY(op_down(c, k_lora_mask((const float *)dt, (const int32_t *)dw, (const int32_t *)da, T, C, (bf16 *)dout, 0), out,
                dout, n * 2));
    return op_done(c, 0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cuda_probe_h2d(int device, size_t bytes, int reps, double *gbps, char *err, size_t errlen)
{
    OP_BEGIN;
    void *h = NULL, *d;
    cudaEvent_t a = NULL, b = NULL;
    double ms_all[64];
    reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return op_fail(c, e, "cudaSetDevice");
    TRY(op_up(c, &d, NULL, bytes));
    if ((e = cudaHostAlloc(&h, bytes, cudaHostAllocDefault)) != cudaSuccess)
        return op_done(c, op_fail(c, e, "cudaHostAlloc"));
    memset(h, 0x5a, bytes); /* touch every page before timing */
    if ((e = cudaEventCreate(&a)) == cudaSuccess)
        e = cudaEventCreate(&b);
    for (int r = 0; r < reps && e == cudaSuccess; r++) {
        float ms = 0;
        e = cudaEventRecord(a, 0);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, 0);
        if (e == cudaSuccess)
            e = cudaEventRecord(b, 0);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(b);
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&ms, a, b);
        ms_all[r] = ms;
    }
    if (e == cudaSuccess) {
        qsort(ms_all, (size_t)reps, sizeof ms_all[0], cmp_double);
        *gbps = (double)bytes / (ms_all[reps / 2] * 1e-3) / 1e9;
    }
    if (a)
        cudaEventDestroy(a);
    if (b)
        cudaEventDestroy(b);
    cudaFreeHost(h);
    return op_done(c, e == cudaSuccess ? 0 : op_fail(c, e, "H2D probe"));
}
