/*
 * kernels.cu — the CUDA backend's elementwise, norm, RoPE, dequant, KV-page,
 * LoRA-mask and greedy-pick kernels (attention is attention.cu; the GEMMs are cuBLAS,
 * in cuda_engine.cu).
 *
 * Owns: GPU arithmetic that mirrors the CPU ops in cpu.c / quant.c.  Does not
 * own: memory, streams, weights (cuda_engine.cu).
 *
 * Dequantization reads the GGUF block layouts documented in quant.c and
 * computes each value with the same IEEE operations in the same order
 * (explicit __fmul_rn/__fadd_rn so nvcc cannot contract them into FMAs), so
 * the fp32 values equal quant_dequant_row's bit for bit (spill's fp8 rows
 * too, though their GEMMs never dequantize: fp8.cu); the bf16 variant
 * then rounds to nearest even.  One thread per element: the block header is
 * re-read by each of its elements from L1, and stores are coalesced.
 *
 * KV pages: k_kv_write stores each token's key and value vectors in bf16 or
 * as int8 codes with a per-vector scale (kv.h); attention (attention.cu)
 * widens them to fp32 through kernels.cuh's kv_get / kv_get8, every kernel
 * templated on the page format.
 *
 * Greedy picks (k_pick): argmax, log-sum-exp and the top-64 alternatives of a
 * logits row with sample.c's cleaning and ties, so only token ids and
 * log-probs leave the GPU for rows that sample greedily.
 */
#include "kernels.cuh"

#include <float.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    T_F32 = 0,
    T_F16 = 1,
    T_Q4_0 = 2,
    T_Q4_1 = 3,
    T_Q5_0 = 6,
    T_Q5_1 = 7,
    T_Q8_0 = 8,
    T_Q4_K = 12,
    T_Q5_K = 13,
    T_Q6_K = 14,
    T_Q8_K = 15,
    T_BF16 = 30,
    T_F8_ROW = 200 /* spill's fp8 rows (gguf.h GGML_F8_E4M3_ROW): fp32 scale, 12 zero bytes, K E4M3 codes */
};

bool kq_type_supported(uint32_t type)
{
    switch (type) {
    case T_F32:
    case T_F16:
    case T_BF16:
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_1:
    case T_Q8_0:
    case T_Q4_K:
    case T_Q5_K:
    case T_Q6_K:
    case T_Q8_K:
    case T_F8_ROW:
        return true;
    default:
        return false;
    }
}

static inline int grid_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (int)(b > 65535LL * 32 ? 65535LL * 32 : (b < 1 ? 1 : b));
}

/* ---------------------------------------------------------------- dequant */

__device__ __forceinline__ float rd_half(const uint8_t *p)
{
    __half_raw r;
    r.x = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__half(r));
}

/* Element j (< 256) of a 256-element K-quant sub-block pair: scale and min of sub-block js. */
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Value of element k of a row starting at `row` (type's blocks back to back). */
__device__ float dq_elem(uint32_t type, const uint8_t *row, int64_t k)
{
    switch (type) {
    case T_F32: {
        const uint8_t *p = row + k * 4;
        uint32_t u = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        return __uint_as_float(u);
    }
    case T_F16:
        return rd_half(row + k * 2);
    case T_BF16: {
        const uint8_t *p = row + k * 2;
        return __uint_as_float(((uint32_t)p[0] | ((uint32_t)p[1] << 8)) << 16);
    }
    case T_F8_ROW: { /* e4m3 -> half is exact, then one fp32 multiply: quant.c's dq_f8_row */
        uint32_t u = (uint32_t)row[0] | ((uint32_t)row[1] << 8) | ((uint32_t)row[2] << 16) | ((uint32_t)row[3] << 24);
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[16 + k], __NV_E4M3);
        return __fmul_rn(__half2float(__half(h)), __uint_as_float(u));
    }
    case T_Q8_0: {
        const uint8_t *b = row + (k / 32) * 34;
        return __fmul_rn((float)(int8_t)b[2 + k % 32], rd_half(b));
    }
    case T_Q4_0: {
        const uint8_t *b = row + (k / 32) * 18;
        int j = (int)(k % 32);
        int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), rd_half(b));
    }
    case T_Q4_1: {
        const uint8_t *b = row + (k / 32) * 20;
        int j = (int)(k % 32);
        int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, rd_half(b)), rd_half(b + 2));
    }
    case T_Q5_0:
    case T_Q5_1: {
        bool one = type == T_Q5_1;
        const uint8_t *b = row + (k / 32) * (one ? 24 : 22);
        const uint8_t *qhp = b + (one ? 4 : 2), *qs = b + (one ? 8 : 6);
        uint32_t qh = (uint32_t)qhp[0] | ((uint32_t)qhp[1] << 8) | ((uint32_t)qhp[2] << 16) | ((uint32_t)qhp[3] << 24);
        int j = (int)(k % 32), x;
        if (j < 16)
            x = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
        else
            x = (int)((qs[j - 16] >> 4) | ((qh >> (j - 16 + 12)) & 0x10));
        if (!one)
            return __fmul_rn((float)(x - 16), rd_half(b));
        return __fadd_rn(__fmul_rn((float)x, rd_half(b)), rd_half(b + 2));
    }
    case T_Q4_K:
    case T_Q5_K: {
        bool five = type == T_Q5_K;
        const uint8_t *b = row + (k / 256) * (five ? 176 : 144);
        int j = (int)(k % 256), c = j / 64, hi = (j % 64) / 32, l = j % 32;
        int sc, m;
        scale_min_k4(2 * c + hi, b + 4, &sc, &m);
        float d = __fmul_rn(rd_half(b), (float)sc), mn = __fmul_rn(rd_half(b + 2), (float)m);
        const uint8_t *q = b + (five ? 48 : 16) + c * 32;
        int v = hi ? (q[l] >> 4) : (q[l] & 0xF);
        if (five && (b[16 + l] & ((hi ? 2u : 1u) << (2 * c))))
            v += 16;
        return __fsub_rn(__fmul_rn(d, (float)v), mn);
    }
    case T_Q6_K: {
        const uint8_t *b = row + (k / 256) * 210;
        int j = (int)(k % 256), h = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
        const uint8_t *ql = b + h * 64, *qh = b + 128 + h * 32;
        const int8_t *sc = (const int8_t *)(b + 192 + h * 8);
        int is = l / 16, q;
        switch (quarter) {
        case 0:
            q = (int)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            break;
        case 1:
            q = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            break;
        case 2:
            q = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            break;
        default:
            q = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            break;
        }
        return __fmul_rn(__fmul_rn(rd_half(b + 208), (float)sc[is + 2 * quarter]), (float)(q - 32));
    }
    case T_Q8_K: {
        const uint8_t *b = row + (k / 256) * 292;
        uint32_t u = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        return __fmul_rn(__uint_as_float(u), (float)(int8_t)b[4 + k % 256]);
    }
    default:
        return __int_as_float(0x7fc00000);
    }
}

__global__ void dequant_kernel(uint32_t type, const uint8_t *w, size_t row_bytes, int64_t N, int64_t K, bf16 *out_b,
                               float *out_f)
{
    int64_t total = N * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / K, k = i % K;
        float v = dq_elem(type, w + n * row_bytes, k);
        if (out_b)
            out_b[i] = __float2bfloat16_rn(v);
        else
            out_f[i] = v;
    }
}

/*
 * The block formats' dequantizer: one thread per 8 consecutive elements of a row (always inside one quant block,
 * whose sizes are 32 or 256), the type a template constant so dq_elem's switch folds away, rows from the grid's
 * y dimension and chunks from x — no 64-bit divide or modulo per element (the generic kernel above pays one of
 * each), and the 8 outputs leave as one 16-byte bf16 store (two float4 for fp32).  The values are dq_elem's, so
 * they equal quant_dequant_row's bit for bit like the generic kernel's.  SPILL_DEQUANT=generic picks the generic
 * kernel (for A/B runs on the device).
 */
/* Elements k0 .. k0+7 (k0 a multiple of 8: one quant block, one scale group) with dq_elem's formulas and rounding,
 * the block's scales read once and its quants as 8 consecutive bytes. */
template <uint32_t TYPE> __device__ __forceinline__ void dq8(const uint8_t *row, int32_t k0, float *v)
{
    if constexpr (TYPE == T_Q8_0) {
        const uint8_t *b = row + (k0 / 32) * 34;
        float d = rd_half(b);
        const int8_t *q = (const int8_t *)(b + 2 + k0 % 32);
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = __fmul_rn((float)q[i], d);
    } else if constexpr (TYPE == T_Q4_0 || TYPE == T_Q4_1) {
        constexpr bool one = TYPE == T_Q4_1;
        const uint8_t *b = row + (k0 / 32) * (one ? 20 : 18);
        int j0 = k0 % 32;
        float d = rd_half(b), m = one ? rd_half(b + 2) : 0.0f;
        const uint8_t *q = b + (one ? 4 : 2) + (j0 & 15);
        int sh = j0 < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int x = (q[i] >> sh) & 0xF;
            v[i] = one ? __fadd_rn(__fmul_rn((float)x, d), m) : __fmul_rn((float)(x - 8), d);
        }
    } else if constexpr (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        constexpr bool five = TYPE == T_Q5_K;
        const uint8_t *b = row + (k0 / 256) * (five ? 176 : 144);
        int j0 = k0 % 256, c = j0 / 64, hi = (j0 % 64) / 32, l0 = j0 % 32;
        int sc, m;
        scale_min_k4(2 * c + hi, b + 4, &sc, &m);
        float d = __fmul_rn(rd_half(b), (float)sc), mn = __fmul_rn(rd_half(b + 2), (float)m);
        const uint8_t *q = b + (five ? 48 : 16) + c * 32 + l0;
        const uint8_t *qh = b + 16 + l0;
        unsigned bit = (hi ? 2u : 1u) << (2 * c);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int x = hi ? (q[i] >> 4) : (q[i] & 0xF);
            if (five && (qh[i] & bit))
                x += 16;
            v[i] = __fsub_rn(__fmul_rn(d, (float)x), mn);
        }
    } else if constexpr (TYPE == T_Q6_K) {
        const uint8_t *b = row + (k0 / 256) * 210;
        int j0 = k0 % 256, h = j0 / 128, r = j0 % 128, quarter = r / 32, l0 = r % 32;
        const uint8_t *ql = b + h * 64 + l0 + (quarter & 1) * 32, *qh = b + 128 + h * 32 + l0;
        float f = __fmul_rn(rd_half(b + 208), (float)((const int8_t *)(b + 192 + h * 8))[l0 / 16 + 2 * quarter]);
        int lsh = quarter < 2 ? 0 : 4, hsh = 2 * quarter;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int x = (int)(((ql[i] >> lsh) & 0xF) | (((qh[i] >> hsh) & 3) << 4));
            v[i] = __fmul_rn(f, (float)(x - 32));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = dq_elem(TYPE, row, k0 + i);
    }
}

template <uint32_t TYPE>
__global__ void dequant8_kernel(const uint8_t *w, size_t row_bytes, int64_t N, int32_t K, bf16 *out_b, float *out_f)
{
    int32_t k0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (k0 >= K)
        return;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
        const uint8_t *row = w + n * row_bytes;
        float v[8];
        dq8<TYPE>(row, k0, v);
        int64_t o = n * (int64_t)K + k0;
        if (out_b) {
            __align__(16) bf16 b[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                b[j] = __float2bfloat16_rn(v[j]);
            *(uint4 *)(out_b + o) = *(const uint4 *)b;
        } else {
            *(float4 *)(out_f + o) = make_float4(v[0], v[1], v[2], v[3]);
            *(float4 *)(out_f + o + 4) = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
}

static int dequant_generic_forced = -1;

void k_dequant_force_generic(int on)
{
    dequant_generic_forced = on != 0;
}

cudaError_t k_dequant(uint32_t type, const void *w, size_t row_bytes, int64_t N, int64_t K, bf16 *out_b, float *out_f,
                      cudaStream_t s)
{
    if (dequant_generic_forced < 0) {
        const char *e = getenv("SPILL_DEQUANT");
        dequant_generic_forced = e && !strcmp(e, "generic");
    }
    const uint8_t *wb = (const uint8_t *)w;
    bool aligned = K % 8 == 0 && K <= INT32_MAX && (uintptr_t)(out_b ? (void *)out_b : (void *)out_f) % 16 == 0;
    if (!dequant_generic_forced && aligned && N > 0) {
        dim3 grid((unsigned)((K / 8 + 255) / 256), (unsigned)(N < 65535 ? N : 65535));
        switch (type) {
#define DQ8(T)                                                                                                         \
    case T:                                                                                                            \
        dequant8_kernel<T><<<grid, 256, 0, s>>>(wb, row_bytes, N, (int32_t)K, out_b, out_f);                           \
        return cudaGetLastError();
            /* the types with a dq8 decoder (bench_dequant on the H200, device run 27, has the figures); Q5_0,
             * Q5_1 and F16 keep the generic kernel */
            DQ8(T_Q8_0)
            DQ8(T_Q4_0)
            DQ8(T_Q4_1)
            DQ8(T_Q4_K)
            DQ8(T_Q5_K)
            DQ8(T_Q6_K)
#undef DQ8
        default:
            break;
        }
    }
    dequant_kernel<<<grid_for(N * K, 256), 256, 0, s>>>(type, wb, row_bytes, N, K, out_b, out_f);
    return cudaGetLastError();
}

__global__ void embed_kernel(uint32_t type, const uint8_t *emb, size_t row_bytes, const int32_t *tok, int64_t D,
                             float scale, float *x)
{
    int64_t t = blockIdx.x;
    const uint8_t *row = emb + (int64_t)tok[t] * row_bytes;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float v = dq_elem(type, row, i);
        x[t * D + i] = scale != 1.0f ? __fmul_rn(v, scale) : v;
    }
}

cudaError_t k_embed(uint32_t type, const void *emb, size_t row_bytes, const int32_t *tok, int64_t T, int64_t D,
                    float scale, float *x, cudaStream_t s)
{
    embed_kernel<<<(unsigned)T, 256, 0, s>>>(type, (const uint8_t *)emb, row_bytes, tok, D, scale, x);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- norms and elementwise */

/* One block per row; the sum of squares in double like cpu_rmsnorm (order differs, far below fp32 rounding). */
__global__ void rmsnorm_kernel(const float *x, const float *w, int64_t D, float eps, bool plus_one, float *y_f,
                               bf16 *y_b)
{
    __shared__ double part[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * D;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        ss += (double)xr[i] * (double)xr[i];
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0)
            part[0] = v;
    }
    __syncthreads();
    float inv = (float)(1.0 / sqrt(part[0] / (double)D + (double)eps));
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float wi = plus_one ? __fadd_rn(1.0f, w[i]) : w[i];
        float v = __fmul_rn(__fmul_rn(xr[i], inv), wi);
        if (y_b)
            y_b[r * D + i] = __float2bfloat16_rn(v);
        if (y_f)
            y_f[r * D + i] = v;
    }
}

cudaError_t k_rmsnorm(const float *x, const float *w, int64_t rows, int64_t D, float eps, bool plus_one, float *y_f,
                      bf16 *y_b, cudaStream_t s)
{
    int threads = D >= 1024 ? 512 : D >= 256 ? 256 : 64;
    rmsnorm_kernel<<<(unsigned)rows, threads, 0, s>>>(x, w, D, eps, plus_one, y_f, y_b);
    return cudaGetLastError();
}

__global__ void add_bias_kernel(float *y, const float *b, int64_t T, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], b[i % n]);
}

cudaError_t k_add_bias(float *y, const float *b, int64_t T, int64_t n, cudaStream_t s)
{
    add_bias_kernel<<<grid_for(T * n, 256), 256, 0, s>>>(y, b, T, n);
    return cudaGetLastError();
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

cudaError_t k_add(float *y, const float *x, int64_t n, cudaStream_t s)
{
    add_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, x, n);
    return cudaGetLastError();
}

__global__ void to_bf16_kernel(const float *x, bf16 *out, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(x[i]);
}

cudaError_t k_to_bf16(const float *x, bf16 *out, int64_t n, cudaStream_t s)
{
    to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, out, n);
    return cudaGetLastError();
}

__global__ void lora_mask_kernel(const float *tmp, const int32_t *own, const int32_t *ad, int64_t T, int C, bf16 *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C;
        out[i] = own[i - t * C] == ad[t] ? __float2bfloat16_rn(tmp[i]) : __float2bfloat16_rn(0.0f);
    }
}

cudaError_t k_lora_mask(const float *tmp, const int32_t *own, const int32_t *ad, int64_t T, int C, bf16 *out,
                        cudaStream_t s)
{
    lora_mask_kernel<<<grid_for(T * C, 256), 256, 0, s>>>(tmp, own, ad, T, C, out);
    return cudaGetLastError();
}

/* One thread per (token, head, pair); the angle in fp32 as cpu_rope_apply computes it. */
__global__ void rope_kernel(float *x, int64_t T, int H, int S, const int32_t *pos, const int32_t *seq,
                            const int32_t *lng, const float *inv_freq, int half, int style, float attn_scale)
{
    int64_t total = T * H * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int p = (int)(i % half);
        int64_t th = i / half, t = th / H;
        int tab = lng ? lng[seq[t]] : 0; /* longrope: 1 = the long table, stored after the short one */
        float a = __fmul_rn((float)pos[t], inv_freq[tab * half + p]);
        float c = __fmul_rn(cosf(a), attn_scale), sn = __fmul_rn(sinf(a), attn_scale);
        float *v = x + th * S;
        int i0 = style == 0 ? p : 2 * p, i1 = style == 0 ? p + half : 2 * p + 1;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        v[i1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn));
    }
}

cudaError_t k_rope(float *x, int64_t T, int H, int S, const int32_t *pos, const int32_t *seq, const int32_t *lng,
                   const float *inv_freq, int n_rot, int style, float attn_scale, cudaStream_t s)
{
    int half = n_rot / 2;
    rope_kernel<<<grid_for(T * H * half, 256), 256, 0, s>>>(x, T, H, S, pos, seq, lng, inv_freq, half, style,
                                                             attn_scale);
    return cudaGetLastError();
}

__global__ void act_mul_kernel(const float *g, const float *u, int64_t n, bool gelu, bf16 *out_b, float *out_f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = g[i], a;
        if (gelu) {
            const float k0 = 0.7978845608028654f, k1 = 0.044715f;
            a = 0.5f * v * (1.0f + tanhf(k0 * (v + k1 * v * v * v)));
        } else {
            a = __fdiv_rn(v, __fadd_rn(1.0f, expf(-v)));
        }
        float r = __fmul_rn(a, u[i]);
        if (out_b)
            out_b[i] = __float2bfloat16_rn(r);
        else
            out_f[i] = r;
    }
}

cudaError_t k_act_mul(const float *g, const float *u, int64_t n, bool gelu, bf16 *out_b, float *out_f, cudaStream_t s)
{
    act_mul_kernel<<<grid_for(n, 256), 256, 0, s>>>(g, u, n, gelu, out_b, out_f);
    return cudaGetLastError();
}

__global__ void softcap_kernel(float *y, int64_t n, float cap)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (float)((double)cap * tanh((double)y[i] / (double)cap));
}

cudaError_t k_softcap(float *y, int64_t n, float cap, cudaStream_t s)
{
    softcap_kernel<<<grid_for(n, 256), 256, 0, s>>>(y, n, cap);
    return cudaGetLastError();
}

__global__ void gather_kernel(float *dst, const float *x, const int32_t *rows, int64_t D)
{
    int r = blockIdx.x;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        dst[(int64_t)r * D + i] = x[(int64_t)rows[r] * D + i];
}

cudaError_t k_gather(float *dst, const float *x, const int32_t *rows, int R, int64_t D, cudaStream_t s)
{
    gather_kernel<<<R, 256, 0, s>>>(dst, x, rows, D);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- paged KV */

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Stores the S values of src (a key or value vector) at L's slot v in the layout of g: one warp, lanes stride
 * the dims.  int8: amax over the vector, scale = amax / 127, code = rint(x / scale) (0 when amax is 0). */
template <int KVT>
__device__ __forceinline__ void kv_store_vec(const kv_geom &g, uint8_t *blk, int r, int v, const float *src, int lane)
{
    const int64_t KPS = (int64_t)g.Kh * g.P * g.S;
    if (KVT == KV_I8) {
        float amax = 0.0f;
        for (int d = lane; d < g.S; d += 32)
            amax = fmaxf(amax, fabsf(src[d]));
        amax = warp_max(amax);
        float sc = __fdiv_rn(amax, 127.0f);
        int8_t *c = (int8_t *)blk + v * KPS + (int64_t)r * g.S;
        for (int d = lane; d < g.S; d += 32) {
            float q = sc > 0.0f ? rintf(__fdiv_rn(src[d], sc)) : 0.0f;
            c[d] = (int8_t)fmaxf(-127.0f, fminf(127.0f, q));
        }
        if (lane == 0)
            ((float *)(blk + 2 * KPS))[v * g.Kh * g.P + r] = sc;
    } else {
        bf16 *h = (bf16 *)blk + v * KPS + (int64_t)r * g.S;
        for (int d = lane; d < g.S; d += 32)
            h[d] = __float2bfloat16_rn(src[d]);
    }
}

/* One warp per (token, kv head): its key and value vectors into the token's page. */
template <int KVT>
__global__ void kv_write_kernel(kv_geom g, const float *k, const float *v, const int32_t *pos, const int32_t *seq,
                                const int32_t *pt_off, const int32_t *pages, int64_t T)
{
    int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (w >= T * g.Kh)
        return;
    int64_t t = w / g.Kh;
    int kh = (int)(w % g.Kh);
    int32_t p = pos[t];
    kv_loc L = kv_at(g, pages[pt_off[seq[t]] + p / g.P], kh, p);
    kv_store_vec<KVT>(g, (uint8_t *)L.blk, L.r, 0, k + w * g.S, lane);
    kv_store_vec<KVT>(g, (uint8_t *)L.blk, L.r, 1, v + w * g.S, lane);
}

cudaError_t k_kv_write(kv_geom g, const float *k, const float *v, const int32_t *pos, const int32_t *seq,
                       const int32_t *pt_off, const int32_t *pages, int64_t T, cudaStream_t s)
{
    int64_t warps = T * g.Kh;
    if (warps <= 0)
        return cudaSuccess;
    unsigned blocks = (unsigned)((warps + 7) / 8);
    if (g.kvt == KV_I8)
        kv_write_kernel<KV_I8><<<blocks, 256, 0, s>>>(g, k, v, pos, seq, pt_off, pages, T);
    else
        kv_write_kernel<KV_BF16><<<blocks, 256, 0, s>>>(g, k, v, pos, seq, pt_off, pages, T);
    return cudaGetLastError();
}

/* Vector i of an fp32 host-layout arena (page, k/v, kh, slot; S values at arena + i*S) to or from g's format:
 * one warp per vector. */
template <int KVT>
__global__ void kv_pack_kernel(kv_geom g, float *arena, int64_t n_vec, bool unpack)
{
    int64_t i = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (i >= n_vec)
        return;
    int64_t per_page = 2 * (int64_t)g.Kh * g.P;
    int32_t page = (int32_t)(i / per_page);
    int rem = (int)(i % per_page), v = rem / (g.Kh * g.P), r = rem % (g.Kh * g.P);
    kv_loc L;
    L.blk = g.layer_base + (int64_t)page * kv_block_bytes(g.P, g.Kh, g.S, g.kvt);
    L.r = r;
    if (unpack)
        for (int d = lane; d < g.S; d += 32)
            arena[i * g.S + d] = kv_get<KVT>(g, L, v, d);
    else
        kv_store_vec<KVT>(g, (uint8_t *)L.blk, r, v, arena + i * g.S, lane);
}

static cudaError_t kv_pack_launch(kv_geom g, float *arena, int32_t n_pages, bool unpack, cudaStream_t s)
{
    int64_t n_vec = (int64_t)n_pages * 2 * g.Kh * g.P;
    unsigned blocks = (unsigned)((n_vec + 7) / 8);
    if (g.kvt == KV_I8)
        kv_pack_kernel<KV_I8><<<blocks, 256, 0, s>>>(g, arena, n_vec, unpack);
    else
        kv_pack_kernel<KV_BF16><<<blocks, 256, 0, s>>>(g, arena, n_vec, unpack);
    return cudaGetLastError();
}

cudaError_t k_kv_pack(kv_geom g, const float *arena, int32_t n_pages, cudaStream_t s)
{
    return kv_pack_launch(g, (float *)arena, n_pages, false, s);
}

cudaError_t k_kv_unpack(kv_geom g, float *arena, int32_t n_pages, cudaStream_t s)
{
    return kv_pack_launch(g, arena, n_pages, true, s);
}

/* ---------------------------------------------------------------- greedy picks */

/* Order-preserving key of a cleaned logit: ascending uint order = ascending float order, -0 == +0. */
__device__ __forceinline__ uint32_t pick_ord(float v)
{
    if (v != v || v == -INFINITY)
        v = -INFINITY;
    else if (v > FLT_MAX)
        v = FLT_MAX;
    if (v == 0.0f)
        v = 0.0f;
    uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float pick_val(uint32_t ord)
{
    uint32_t b = (ord & 0x80000000u) ? (ord & 0x7FFFFFFFu) : ~ord;
    return __uint_as_float(b);
}

#define PICK_THREADS 512

/* Block-wide max of a 64-bit value (every thread gets the result). */
__device__ uint64_t block_max_u64(uint64_t v, uint64_t *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    int wid = threadIdx.x / 32, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    v = sh[0];
    for (int i = 1; i < PICK_THREADS / 32; i++)
        v = sh[i] > v ? sh[i] : v;
    return v;
}

__device__ double block_sum_f64(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int wid = threadIdx.x / 32, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < PICK_THREADS / 32; i++)
        t += sh[i];
    return t;
}

/* One block per row.  Top-K is exact: a 4-round radix select finds the K-th largest key, then the ids
 * above it and the lowest ids equal to it are gathered in id order and ranked by (value desc, id asc). */
__global__ void pick_kernel(const float *logits, int V, const int32_t *want, const int32_t *target, pick_out *out)
{
    __shared__ uint64_t sh64[PICK_THREADS / 32];
    __shared__ double shd[PICK_THREADS / 32];
    __shared__ uint32_t hist[256];
    __shared__ uint32_t sel_prefix, sel_left, n_gt, n_eq_taken;
    __shared__ uint32_t cand_ord[PICK_MAX_TOP];
    __shared__ int32_t cand_id[PICK_MAX_TOP];
    __shared__ int warp_eq[PICK_THREADS / 32];
    int r = blockIdx.x, K = want[r], tid = threadIdx.x;
    if (K < -1)
        return;
    int32_t tg = target ? target[r] : -1; /* >= 0: report this token's log-prob instead of the argmax's */
    if (tg >= V)
        tg = -1;
    if (tg >= 0 && K < 0)
        K = 0;
    const float *x = logits + (size_t)r * (size_t)V;
    pick_out *o = out + r;
    /* argmax: max of (ord << 32 | ~id) = largest value, then lowest id */
    uint64_t best = 0;
    for (int i = tid; i < V; i += PICK_THREADS) {
        uint64_t k = ((uint64_t)pick_ord(x[i]) << 32) | (uint32_t)~(uint32_t)i;
        best = k > best ? k : best;
    }
    best = block_max_u64(best, sh64);
    uint32_t best_ord = (uint32_t)(best >> 32);
    int32_t token = (int32_t)~(uint32_t)best;
    if (best_ord <= pick_ord(-INFINITY)) {
        if (tid == 0)
            o->token = -1, o->logprob = 0, o->n_top = 0;
        return;
    }
    if (K < 0) {
        if (tid == 0)
            o->token = token, o->logprob = 0, o->n_top = 0;
        return;
    }
    /* log-sum-exp as sample.c: fp32 terms expf((float)(v - m)) (0 below -110), double sum */
    float m = pick_val(best_ord);
    double S = 0;
    for (int i = tid; i < V; i += PICK_THREADS) {
        double d = (double)pick_val(pick_ord(x[i])) - (double)m;
        S += d < -110.0 ? 0.0 : (double)expf((float)d);
    }
    S = block_sum_f64(S, shd);
    double lse = (double)m + log(S);
    if (tid == 0) {
        double lp = (tg >= 0 ? (double)pick_val(pick_ord(x[tg])) : (double)m) - lse;
        o->token = tg >= 0 ? tg : token;
        o->logprob = lp < -9999.0 ? -9999.0f : (float)lp;
    }
    if (K > V)
        K = V;
    if (K > PICK_MAX_TOP)
        K = PICK_MAX_TOP;
    if (K == 0) {
        if (tid == 0)
            o->n_top = 0;
        return;
    }
    /* radix select of the K-th largest ord, 8 bits at a time from the top */
    if (tid == 0)
        sel_prefix = 0, sel_left = (uint32_t)K;
    for (int round = 0; round < 4; round++) {
        int shift = 24 - 8 * round;
        uint32_t mask_hi = round == 0 ? 0u : 0xFFFFFFFFu << (shift + 8);
        for (int b = tid; b < 256; b += PICK_THREADS)
            hist[b] = 0;
        __syncthreads();
        uint32_t pre = sel_prefix;
        for (int i = tid; i < V; i += PICK_THREADS) {
            uint32_t k = pick_ord(x[i]);
            if ((k & mask_hi) == pre)
                atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            uint32_t left = sel_left, b = 255;
            for (;; b--) {
                if (hist[b] >= left || b == 0)
                    break;
                left -= hist[b];
            }
            sel_prefix = pre | (b << shift);
            sel_left = left; /* how many of the keys equal to the final threshold to take */
        }
        __syncthreads();
    }
    uint32_t tau = sel_prefix, need_eq = sel_left;
    if (tid == 0)
        n_gt = 0, n_eq_taken = 0;
    __syncthreads();
    /* gather in id order: every key > tau, then the first need_eq keys == tau */
    int wid = tid / 32, lane = tid & 31;
    for (int base = 0; base < V; base += PICK_THREADS) {
        int i = base + tid;
        uint32_t k = i < V ? pick_ord(x[i]) : 0u;
        bool gt = i < V && k > tau, eq = i < V && k == tau;
        if (gt) {
            uint32_t at = atomicAdd(&n_gt, 1u);
            if (at < PICK_MAX_TOP)
                cand_ord[at] = k, cand_id[at] = i;
        }
        unsigned bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0)
            warp_eq[wid] = __popc(bal);
        __syncthreads();
        uint32_t before = n_eq_taken;
        for (int w2 = 0; w2 < wid; w2++)
            before += (uint32_t)warp_eq[w2];
        before += (uint32_t)__popc(bal & ((1u << lane) - 1u));
        __syncthreads();
        if (eq && before < need_eq) {
            uint32_t at = (uint32_t)K - need_eq + before; /* slots after the K - need_eq keys above tau */
            cand_ord[at] = k, cand_id[at] = i;
        }
        if (tid == 0) {
            uint32_t tot = 0;
            for (int w2 = 0; w2 < PICK_THREADS / 32; w2++)
                tot += (uint32_t)warp_eq[w2];
            n_eq_taken += tot;
        }
        __syncthreads();
        if (n_eq_taken >= need_eq && n_gt >= (uint32_t)K - need_eq)
            break; /* block-uniform: both read after the barrier */
    }
    __syncthreads();
    /* rank sort of the K candidates: (value desc, id asc) */
    uint32_t my_ord = 0;
    int32_t my_id = 0, rank = 0;
    if (tid < K) {
        my_ord = cand_ord[tid];
        my_id = cand_id[tid];
        for (int j = 0; j < K; j++) {
            uint32_t oj = cand_ord[j];
            rank += oj > my_ord || (oj == my_ord && cand_id[j] < my_id);
        }
    }
    __syncthreads();
    if (tid < K) {
        double lp = (double)pick_val(my_ord) - lse;
        o->top_id[rank] = my_id;
        o->top_logprob[rank] = lp < -9999.0 ? -9999.0f : (float)lp;
    }
    if (tid == 0)
        o->n_top = K;
}

cudaError_t k_pick(const float *logits, int R, int V, const int32_t *want, const int32_t *target, pick_out *out,
                   cudaStream_t s)
{
    if (R <= 0)
        return cudaSuccess;
    pick_kernel<<<R, PICK_THREADS, 0, s>>>(logits, V, want, target, out);
    return cudaGetLastError();
}

__global__ void poison_kernel(float *p)
{
    p[threadIdx.x] = 1.0f;
}

cudaError_t k_poison(cudaStream_t s)
{
    poison_kernel<<<1, 32, 0, s>>>((float *)(uintptr_t)0x10);
    return cudaGetLastError();
}
