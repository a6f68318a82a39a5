/*
 * attention.cu — the CUDA backend's causal attention over paged KV: the
 * per-token (decode) kernel and its flash-decoding split and merge, the
 * tiled prompt kernels (fp32 CUDA cores and TF32 tensor cores), and the host
 * side that plans a pass's tokens between them and launches them (the
 * k_attention* calls of kernels.cuh).
 *
 * Does not own: writing KV pages and their layout (kernels.cu, kernels.cuh's
 * kv_geom / kv_get), memory and streams (cuda_engine.cu).
 *
 * Decode tokens (and short runs) take one warp per (token, kv head, up to 4
 * of its query heads), online softmax over the token's row's pages, each K/V
 * row read once for the heads of its group; when a pass has few such tokens
 * and their rows are long (>= 512 keys), each token's keys are split over up
 * to K_ATT_SPLIT_WARPS warps in all and a merge kernel combines the parts
 * (flash-decoding).  Prompt runs of >= 8 positions go in tiles of 64 query
 * rows (consecutive tokens × the query heads of one kv head) that share each
 * 32-key block through shared memory: TF32 mma.sync on the tensor cores by
 * default, fp32 on CUDA cores with SPILL_CUDA_ATT=fp32 or head sizes the MMA
 * kernel lacks.  k_attention_plan splits a pass's tokens between the two.
 * Every kernel is templated on the KV page format (bf16 or int8 codes), which
 * it widens to fp32 and computes in fp32.
 */
#include "kernels.cuh"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out[d] = acc[c] * inv for this lane's dims d = lane + 32c < S. */
template <int DPL>
__device__ __forceinline__ void store_row(float *o, const float (&acc)[DPL], float inv, int lane, int S)
{
#pragma unroll
    for (int c = 0; c < DPL; c++) {
        int d = lane + 32 * c;
        if (d < S)
            o[d] = acc[c] * inv;
    }
}

/* Stages keys/values [kb, kb + nk) of one kv head (positions past plast as zeros) into shared rows of
 * strides kstride / vstride, each value widened to fp32 and passed through cv (identity, or a TF32 rounding,
 * exact on bf16 values).  Head sizes that are multiples of 8 move 8 values per load. */
template <int KVT, typename T, typename Conv>
__device__ __forceinline__ void stage_kv(const kv_geom &g, const int32_t *pt, int kh, int32_t kb, int32_t plast, int nk,
                                         T *Ks, int kstride, T *Vs, int vstride, Conv cv)
{
    const int S = g.S;
    if (S % 8 == 0) {
        const int C = S / 8;
        for (int idx = threadIdx.x; idx < nk * C; idx += blockDim.x) {
            int jj = idx / C, d = (idx % C) * 8;
            int32_t j = kb + jj;
            float kk[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (j <= plast) {
                kv_loc L = kv_at(g, pt[j / g.P], kh, j);
                kv_get8<KVT>(g, L, 0, d, kk);
                kv_get8<KVT>(g, L, 1, d, vv);
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                Ks[jj * kstride + d + e] = cv(kk[e]);
                Vs[jj * vstride + d + e] = cv(vv[e]);
            }
        }
        return;
    }
    for (int idx = threadIdx.x; idx < nk * S; idx += blockDim.x) {
        int jj = idx / S, d = idx % S;
        int32_t j = kb + jj;
        float kk = 0.0f, vv = 0.0f;
        if (j <= plast) {
            kv_loc L = kv_at(g, pt[j / g.P], kh, j);
            kk = kv_get<KVT>(g, L, 0, d);
            vv = kv_get<KVT>(g, L, 1, d);
        }
        Ks[jj * kstride + d] = cv(kk);
        Vs[jj * vstride + d] = cv(vv);
    }
}

struct keep_f32 {
    __device__ float operator()(float x) const { return x; }
};

#define ATT_GC 4 /* query heads of one kv group handled by one warp */

/* One warp per (token, kv head, chunk of up to ATT_GC query heads of that
 * group): each key/value row is loaded once for the chunk's heads (GQA), each
 * lane holds DPL of the S dims.  Online softmax per head in fp32. */
template <int DPL, int KVT>
__global__ void attention_kernel(kv_geom g, const float *q, const int32_t *pos, const int32_t *seq,
                                 const int32_t *pt_off, const int32_t *pages, int64_t T, const int32_t *tok_list,
                                 int H, int window, float scale, float softcap, int nsplit, int span, float *part,
                                 float *out)
{
    int G = H / g.Kh, chunks = (G + ATT_GC - 1) / ATT_GC, S = g.S;
    int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (w >= T * nsplit * g.Kh * chunks)
        return;
    int64_t ti = w / (nsplit * g.Kh * chunks), t = tok_list ? tok_list[ti] : ti;
    int rem = (int)(w % (nsplit * g.Kh * chunks)), part_i = rem / (g.Kh * chunks);
    rem %= g.Kh * chunks;
    int kh = rem / chunks, h0 = kh * G + (rem % chunks) * ATT_GC;
    int gc = kh * G + G - h0 < ATT_GC ? kh * G + G - h0 : ATT_GC; /* warp-uniform */
    int32_t p = pos[t], lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    if (nsplit > 1) { /* this warp's part of the keys: [lo + part_i*span, lo + (part_i+1)*span) */
        int32_t hi = lo + (part_i + 1) * span - 1;
        lo += part_i * span;
        p = hi < p ? hi : p; /* may leave no key: m = -inf, l = 0 */
    }
    const int32_t *pt = pages + pt_off[seq[t]];
    float qv[ATT_GC][DPL], acc[ATT_GC][DPL], mx[ATT_GC], l[ATT_GC];
#pragma unroll
    for (int i = 0; i < ATT_GC; i++) {
        const float *qr = q + (t * H + h0 + (i < gc ? i : 0)) * S;
#pragma unroll
        for (int c = 0; c < DPL; c++) {
            int d = lane + 32 * c;
            qv[i][c] = d < S ? qr[d] : 0.0f;
            acc[i][c] = 0.0f;
        }
        mx[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (int32_t j = lo; j <= p; j++) {
        kv_loc L = kv_at(g, pt[j / g.P], kh, j);
        float kk[DPL], vv[DPL];
#pragma unroll
        for (int c = 0; c < DPL; c++) {
            int d = lane + 32 * c;
            kk[c] = d < S ? kv_get<KVT>(g, L, 0, d) : 0.0f;
            vv[c] = d < S ? kv_get<KVT>(g, L, 1, d) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < ATT_GC; i++) {
            if (i >= gc)
                break;
            float part = 0.0f;
#pragma unroll
            for (int c = 0; c < DPL; c++)
                part += qv[i][c] * kk[c];
            for (int o = 16; o > 0; o >>= 1)
                part += __shfl_xor_sync(0xffffffffu, part, o);
            float sc = part * scale;
            if (softcap > 0.0f)
                sc = softcap * tanhf(sc / softcap);
            float mn = fmaxf(mx[i], sc);
            float corr = expf(mx[i] - mn), pe = expf(sc - mn);
            l[i] = l[i] * corr + pe;
#pragma unroll
            for (int c = 0; c < DPL; c++)
                acc[i][c] = acc[i][c] * corr + pe * vv[c];
            mx[i] = mn;
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_GC; i++) {
        if (i >= gc)
            break;
        if (nsplit == 1) {
            store_row<DPL>(out + (t * H + h0 + i) * S, acc[i], 1.0f / l[i], lane, S);
            continue;
        }
        float *pr = part + ((ti * nsplit + part_i) * H + h0 + i) * (int64_t)(S + 2); /* acc unscaled, m, l */
        store_row<DPL>(pr, acc[i], 1.0f, lane, S);
        if (lane == 0) {
            pr[S] = mx[i];
            pr[S + 1] = l[i];
        }
    }
}

/* Merges the nsplit parts of each split token's attention: one warp per (token, query head), the parts'
 * maxima rescaled to the largest (a part with no key has m = -inf and weighs 0). */
__global__ void attention_merge_kernel(const float *part, const int32_t *tok_list, int64_t n, int H, int S,
                                       int nsplit, float *out)
{
    int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (w >= n * H)
        return;
    int64_t ti = w / H, t = tok_list ? tok_list[ti] : ti;
    int h = (int)(w % H);
    const float *pr = part + (ti * nsplit * H + h) * (int64_t)(S + 2);
    int64_t stride = (int64_t)H * (S + 2);
    float M = -INFINITY, L = 0.0f;
    for (int c = 0; c < nsplit; c++)
        M = fmaxf(M, pr[c * stride + S]);
    for (int c = 0; c < nsplit; c++) {
        float mc = pr[c * stride + S];
        L += mc == -INFINITY ? 0.0f : pr[c * stride + S + 1] * expf(mc - M);
    }
    for (int d = lane; d < S; d += 32) {
        float a = 0.0f;
        for (int c = 0; c < nsplit; c++) {
            float mc = pr[c * stride + S];
            a += mc == -INFINITY ? 0.0f : pr[c * stride + d] * expf(mc - M);
        }
        out[(t * H + h) * S + d] = a / L;
    }
}

/* Decode tokens whose rows are long split their keys over several warps when the pass has too few tokens to
 * fill the GPU (flash-decoding): a part per warp, then attention_merge_kernel.  Parts of at least 256 keys,
 * at most K_ATT_SPLIT_WARPS warps in all (the part buffer's size); 1 = no split. */
static int split_parts(int64_t n_tok, int Kh, int chunks, int32_t max_keys)
{
    int64_t base = n_tok * Kh * chunks;
    if (base <= 0 || max_keys < 512 || base >= K_ATT_SPLIT_WARPS / 2)
        return 1;
    int64_t by_len = (max_keys + 255) / 256, by_room = K_ATT_SPLIT_WARPS / base;
    int64_t n = by_len < by_room ? by_len : by_room;
    return n >= 2 ? (int)n : 1;
}

static int g_last_split = 1;

int k_attention_last_split(void)
{
    return g_last_split;
}

/* Prompt attention in tiles: one block of TQ_WARPS warps takes RW query rows per warp — BQ consecutive
 * tokens of one sequence × the G query heads of one kv head (row r = token r / G, head r % G) — and walks
 * the keys they need in blocks of TK positions staged in shared memory, so each key/value row is read from
 * HBM once per tile instead of once per query row.  Scores: lane = key; P·V: lane = DPL of the S dims.
 * Online softmax per row in fp32, as attention_kernel (the order of the sums differs: results agree to
 * rounding, not bit for bit). */
#define TQ_WARPS 4
#define TK 32

template <int DPL, int RW, int KVT>
__global__ void __launch_bounds__(TQ_WARPS * 32)
    attention_tile_kernel(kv_geom g, const float *q, const int32_t *pos, const int32_t *seq, const int32_t *pt_off,
                          const int32_t *pages, const int32_t *tiles, int H, int window, float scale, float softcap,
                          float *out)
{
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    const int S = g.S, SP = S + 4, G = H / g.Kh, ROWS = RW * TQ_WARPS;
    const int kh = blockIdx.y, t0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    float *Qs = smem, *Ks = Qs + ROWS * SP, *Vs = Ks + TK * SP, *Ps = Vs + TK * SP;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, nrows = nq * G;
    for (int idx = tid; idx < ROWS * S; idx += TQ_WARPS * 32) {
        int r = idx / S, d = idx % S;
        float v = 0.0f;
        if (r < nrows)
            v = q[((int64_t)(t0 + r / G) * H + kh * G + r % G) * S + d];
        Qs[r * SP + d] = v;
    }
    const int32_t p0 = pos[t0], plast = p0 + nq - 1; /* a tile's tokens are consecutive positions */
    const int32_t lo = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    const int32_t *pt = pages + pt_off[seq[t0]];
    float m[RW], l[RW], acc[RW][DPL];
    int32_t rpos[RW];
#pragma unroll
    for (int i = 0; i < RW; i++) {
        int r = warp * RW + i;
        m[i] = -INFINITY;
        l[i] = 0.0f;
        rpos[i] = r < nrows ? p0 + r / G : -1;
#pragma unroll
        for (int c = 0; c < DPL; c++)
            acc[i][c] = 0.0f;
    }
    for (int32_t kb = lo; kb <= plast; kb += TK) {
        __syncthreads(); /* the previous block's K, V and P are consumed (and Q is staged) */
        stage_kv<KVT>(g, pt, kh, kb, plast, TK, Ks, SP, Vs, SP, keep_f32());
        __syncthreads();
        const int32_t j = kb + lane;
        float sc[RW];
#pragma unroll
        for (int i = 0; i < RW; i++)
            sc[i] = 0.0f;
        for (int d = 0; d < S; d += 4) {
            float4 kk = *(const float4 *)&Ks[lane * SP + d];
#pragma unroll
            for (int i = 0; i < RW; i++) {
                float4 qq = *(const float4 *)&Qs[(warp * RW + i) * SP + d];
                sc[i] += qq.x * kk.x + qq.y * kk.y + qq.z * kk.z + qq.w * kk.w;
            }
        }
#pragma unroll
        for (int i = 0; i < RW; i++) {
            float x = sc[i] * scale;
            if (softcap > 0.0f)
                x = softcap * tanhf(x / softcap);
            bool ok = rpos[i] >= 0 && j <= rpos[i] && (window <= 0 || j > rpos[i] - window);
            x = ok ? x : -INFINITY;
            float mx = x;
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mn = fmaxf(m[i], mx);
            float pe = mn == -INFINITY ? 0.0f : expf(x - mn);
            float corr = mn == -INFINITY ? 1.0f : expf(m[i] - mn);
            float ps = pe;
            for (int o = 16; o > 0; o >>= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[i] = l[i] * corr + ps;
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < DPL; c++)
                acc[i][c] *= corr;
            Ps[(warp * RW + i) * (TK + 1) + lane] = pe;
        }
        __syncwarp();
        int kn = plast - kb + 1 < TK ? plast - kb + 1 : TK;
        for (int jj = 0; jj < kn; jj++) {
            float vv[DPL];
#pragma unroll
            for (int c = 0; c < DPL; c++) {
                int d = lane + 32 * c;
                vv[c] = d < S ? Vs[jj * SP + d] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < RW; i++) {
                float pe = Ps[(warp * RW + i) * (TK + 1) + jj];
#pragma unroll
                for (int c = 0; c < DPL; c++)
                    acc[i][c] += pe * vv[c];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RW; i++) {
        int r = warp * RW + i;
        if (r >= nrows)
            continue;
        store_row<DPL>(out + ((int64_t)(t0 + r / G) * H + kh * G + r % G) * S, acc[i], 1.0f / l[i], lane, S);
    }
}

/* The same tiles on the tensor cores: mma.sync m16n8k8 with TF32 inputs (10 explicit mantissa bits, round to
 * nearest) and fp32 accumulation, for head sizes S <= 128 with S % 8 == 0.  Each warp owns 16 query rows: its
 * Q fragments stay in registers for the whole tile, scores for a block of 32 keys are 4 MMA column tiles,
 * the online softmax runs on the accumulator layout (lane: rows lane/4 and lane/4 + 8, columns 2(lane%4) and
 * +1), P goes through shared memory into A fragments, and O = P·V accumulates in S/8 MMA tiles rescaled per
 * row.  Shared memory strides are padded so every fragment load is conflict-free. */
#define MK 32

__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

struct round_tf32 {
    __device__ uint32_t operator()(float x) const { return to_tf32(x); }
};

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int NS, int KVT>
__global__ void __launch_bounds__(TQ_WARPS * 32)
    attention_mma_kernel(kv_geom g, const float *q, const int32_t *pos, const int32_t *seq, const int32_t *pt_off,
                         const int32_t *pages, const int32_t *tiles, int H, int window, float scale, float softcap,
                         float *out)
{
    extern __shared__ float4 smem4[];
    uint32_t *sm = (uint32_t *)smem4;
    const int S = NS * 8, SPK = S + 4, SPV = S + 8, PP = MK + 4;
    uint32_t *Ks = sm, *Vs = Ks + MK * SPK, *Ps = Vs + MK * SPV;
    const int G = H / g.Kh, kh = blockIdx.y, t0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int nrows = nq * G, r0 = warp * 16 + gq, r1 = r0 + 8;
    const float *q0 = r0 < nrows ? q + ((int64_t)(t0 + r0 / G) * H + kh * G + r0 % G) * S : NULL;
    const float *q1 = r1 < nrows ? q + ((int64_t)(t0 + r1 / G) * H + kh * G + r1 % G) * S : NULL;
    uint32_t qa[NS][4];
#pragma unroll
    for (int kk = 0; kk < NS; kk++) {
        qa[kk][0] = to_tf32(q0 ? q0[8 * kk + tq] : 0.0f);
        qa[kk][1] = to_tf32(q1 ? q1[8 * kk + tq] : 0.0f);
        qa[kk][2] = to_tf32(q0 ? q0[8 * kk + tq + 4] : 0.0f);
        qa[kk][3] = to_tf32(q1 ? q1[8 * kk + tq + 4] : 0.0f);
    }
    const int32_t p0 = pos[t0], plast = p0 + nq - 1;
    const int32_t lo = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    const int32_t rp0 = r0 < nrows ? p0 + r0 / G : -1, rp1 = r1 < nrows ? p0 + r1 / G : -1;
    const int32_t *pt = pages + pt_off[seq[t0]];
    float o[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    uint32_t *P = Ps + warp * 16 * PP;
    for (int32_t kb = lo; kb <= plast; kb += MK) {
        __syncthreads(); /* the previous block's K and V are consumed */
        stage_kv<KVT>(g, pt, kh, kb, plast, MK, Ks, SPK, Vs, SPV, round_tf32());
        __syncthreads();
        float sc[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NS; kk++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                mma_tf32(sc[j], qa[kk], Ks[(8 * j + gq) * SPK + 8 * kk + tq], Ks[(8 * j + gq) * SPK + 8 * kk + tq + 4]);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int32_t key = kb + 8 * j + 2 * tq + (e & 1), rp = e < 2 ? rp0 : rp1;
                float x = sc[j][e] * scale;
                if (softcap > 0.0f)
                    x = softcap * tanhf(x / softcap);
                bool ok = rp >= 0 && key <= rp && (window <= 0 || key > rp - window);
                x = ok ? x : -INFINITY;
                sc[j][e] = x;
                if (e < 2)
                    mx0 = fmaxf(mx0, x);
                else
                    mx1 = fmaxf(mx1, x);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        float c0 = mn0 == -INFINITY ? 1.0f : expf(m0 - mn0), c1 = mn1 == -INFINITY ? 1.0f : expf(m1 - mn1);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float mn = e < 2 ? mn0 : mn1;
                float pe = mn == -INFINITY ? 0.0f : expf(sc[j][e] - mn);
                sc[j][e] = pe;
                if (e < 2)
                    s0 += pe;
                else
                    s1 += pe;
            }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        l0 = l0 * c0 + s0;
        l1 = l1 * c1 + s1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            P[gq * PP + 8 * j + 2 * tq] = to_tf32(sc[j][0]);
            P[gq * PP + 8 * j + 2 * tq + 1] = to_tf32(sc[j][1]);
            P[(gq + 8) * PP + 8 * j + 2 * tq] = to_tf32(sc[j][2]);
            P[(gq + 8) * PP + 8 * j + 2 * tq + 1] = to_tf32(sc[j][3]);
        }
        __syncwarp();
#pragma unroll
        for (int kk = 0; kk < MK / 8; kk++) {
            uint32_t a[4] = {P[gq * PP + 8 * kk + tq], P[(gq + 8) * PP + 8 * kk + tq], P[gq * PP + 8 * kk + tq + 4],
                             P[(gq + 8) * PP + 8 * kk + tq + 4]};
#pragma unroll
            for (int n = 0; n < NS; n++)
                mma_tf32(o[n], a, Vs[(8 * kk + tq) * SPV + 8 * n + gq], Vs[(8 * kk + tq + 4) * SPV + 8 * n + gq]);
        }
        __syncwarp(); /* P is rewritten next block */
    }
    if (r0 < nrows) {
        float inv = 1.0f / l0, *y = out + ((int64_t)(t0 + r0 / G) * H + kh * G + r0 % G) * S;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            y[8 * n + 2 * tq] = o[n][0] * inv;
            y[8 * n + 2 * tq + 1] = o[n][1] * inv;
        }
    }
    if (r1 < nrows) {
        float inv = 1.0f / l1, *y = out + ((int64_t)(t0 + r1 / G) * H + kh * G + r1 % G) * S;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            y[8 * n + 2 * tq] = o[n][2] * inv;
            y[8 * n + 2 * tq + 1] = o[n][3] * inv;
        }
    }
}

/* Which kernel prompt tiles use: 2 TF32 tensor cores where the head size allows (the default since `make
 * test-cuda` passed with it on the H200: bench/results/device-tf32-run8, prompt attention 1.72 s -> 1.37 s
 * in B3's best batch), 1 fp32 CUDA cores (cuda_engine_opts.attention_fp32, from SPILL_CUDA_ATT=fp32; and head
 * sizes the MMA kernel lacks). */
static int g_att_kind = 2; /* set by cuda_engine_open from its options (and by tests through cuda_test.h) */

void k_attention_set_kind(int kind)
{
    g_att_kind = kind;
}

static int att_kind(void)
{
    return g_att_kind;
}

/* Rows per warp of the tiled kernel for head size S (the DPL x RW accumulators stay in registers). */
static int tile_rw(int S)
{
    return S <= 128 ? 16 : 8;
}

int k_attention_tile_tokens(int H, int Kh, int S)
{
    if (Kh <= 0 || H % Kh || S % 4 || S > 256)
        return 0;
    int rows = tile_rw(S) * TQ_WARPS, G = H / Kh;
    return G <= rows ? rows / G : 0;
}

int k_attention_plan(const int32_t *seq, const int32_t *pos, int64_t T, int bq, int min_run, int32_t *tiles,
                     int32_t *singles, int *n_tiles, int64_t *n_singles)
{
    int nt = 0;
    int64_t ns = 0;
    for (int64_t t = 0; t < T;) {
        int64_t e = t + 1;
        while (e < T && seq[e] == seq[t] && pos[e] == pos[e - 1] + 1)
            e++;
        if (bq > 0 && e - t >= min_run) {
            for (int64_t a = t; a < e; a += bq) {
                tiles[2 * nt] = (int32_t)a;
                tiles[2 * nt + 1] = (int32_t)(e - a < bq ? e - a : bq);
                nt++;
            }
        } else
            for (int64_t a = t; a < e; a++)
                singles[ns++] = (int32_t)a;
        t = e;
    }
    *n_tiles = nt;
    *n_singles = ns;
    return 0;
}

template <int KVT>
static cudaError_t attention_launch(kv_geom g, const float *q, const int32_t *pos, const int32_t *seq,
                                    const int32_t *pt_off, const int32_t *pages, int64_t T, int H, int window,
                                    float scale, float softcap, const int32_t *tiles, int n_tiles,
                                    const int32_t *singles, int64_t n_singles, int32_t max_len, float *part,
                                    float *out, cudaStream_t s)
{
    int64_t n_warp_tok = tiles || singles ? n_singles : T;
    const int32_t *tok_list = tiles || singles ? singles : NULL;
    g_last_split = 1;
    if (n_warp_tok > 0) {
        int warps = 4, chunks = (H / g.Kh + ATT_GC - 1) / ATT_GC;
        int32_t max_keys = window > 0 && window < max_len ? window : max_len;
        int nsplit = part ? split_parts(n_warp_tok, g.Kh, chunks, max_keys) : 1;
        int span = nsplit > 1 ? (max_keys + nsplit - 1) / nsplit : 0;
        g_last_split = nsplit;
        unsigned blocks = (unsigned)((n_warp_tok * nsplit * g.Kh * chunks + warps - 1) / warps);
#define ATT_LAUNCH(dpl)                                                                                                \
    attention_kernel<dpl, KVT><<<blocks, 32 * warps, 0, s>>>(g, q, pos, seq, pt_off, pages, n_warp_tok, tok_list, H,   \
                                                             window, scale, softcap, nsplit, span, part, out)
        if (g.S <= 32)
            ATT_LAUNCH(1);
        else if (g.S <= 64)
            ATT_LAUNCH(2);
        else if (g.S <= 128)
            ATT_LAUNCH(4);
        else
            ATT_LAUNCH(8);
#undef ATT_LAUNCH
        if (nsplit > 1)
            attention_merge_kernel<<<(unsigned)((n_warp_tok * H + 3) / 4), 128, 0, s>>>(part, tok_list, n_warp_tok, H,
                                                                                        g.S, nsplit, out);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
    }
    if (tiles && n_tiles > 0 && att_kind() == 2 && g.S <= 128 && g.S % 8 == 0) {
        size_t smem = ((size_t)MK * (g.S + 4) + (size_t)MK * (g.S + 8) + (size_t)TQ_WARPS * 16 * (MK + 4)) * 4;
        dim3 grid((unsigned)n_tiles, (unsigned)g.Kh);
#define MMA_LAUNCH(ns)                                                                                                 \
    attention_mma_kernel<ns, KVT><<<grid, TQ_WARPS * 32, smem, s>>>(g, q, pos, seq, pt_off, pages, tiles, H, window,  \
                                                                    scale, softcap, out)
        switch (g.S / 8) {
        case 4:
            MMA_LAUNCH(4);
            break;
        case 8:
            MMA_LAUNCH(8);
            break;
        case 10:
            MMA_LAUNCH(10);
            break;
        case 12:
            MMA_LAUNCH(12);
            break;
        case 16:
            MMA_LAUNCH(16);
            break;
        default:
            goto fp32_tiles; /* other head sizes: CUDA-core tiles */
        }
#undef MMA_LAUNCH
        return cudaGetLastError();
    }
fp32_tiles:
    if (tiles && n_tiles > 0) {
        int rw = tile_rw(g.S), rows = rw * TQ_WARPS;
        size_t smem = ((size_t)rows * (g.S + 4) + 2 * (size_t)TK * (g.S + 4) + (size_t)rows * (TK + 1)) * sizeof(float);
        dim3 grid((unsigned)n_tiles, (unsigned)g.Kh);
#define TILE_LAUNCH(dpl, rw_)                                                                                          \
    do {                                                                                                               \
        static bool attr_set;                                                                                          \
        if (!attr_set) {                                                                                               \
            cudaError_t ae = cudaFuncSetAttribute(attention_tile_kernel<dpl, rw_, KVT>,                                \
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);            \
            if (ae != cudaSuccess)                                                                                     \
                return ae;                                                                                             \
            attr_set = true;                                                                                           \
        }                                                                                                              \
        attention_tile_kernel<dpl, rw_, KVT><<<grid, TQ_WARPS * 32, smem, s>>>(g, q, pos, seq, pt_off, pages, tiles,  \
                                                                               H, window, scale, softcap, out);      \
    } while (0)
        if (g.S <= 32)
            TILE_LAUNCH(1, 16);
        else if (g.S <= 64)
            TILE_LAUNCH(2, 16);
        else if (g.S <= 128)
            TILE_LAUNCH(4, 16);
        else
            TILE_LAUNCH(8, 8);
#undef TILE_LAUNCH
        return cudaGetLastError();
    }
    return cudaSuccess;
}

cudaError_t k_attention(kv_geom g, const float *q, const int32_t *pos, const int32_t *seq, const int32_t *pt_off,
                        const int32_t *pages, int64_t T, int H, int window, float scale, float softcap,
                        const int32_t *tiles, int n_tiles, const int32_t *singles, int64_t n_singles, int32_t max_len,
                        float *part, float *out, cudaStream_t s)
{
    if (g.S > 256 || g.Kh <= 0 || H % g.Kh || (g.kvt != KV_BF16 && g.kvt != KV_I8))
        return cudaErrorInvalidValue;
    return g.kvt == KV_I8 ? attention_launch<KV_I8>(g, q, pos, seq, pt_off, pages, T, H, window, scale, softcap,
                                                    tiles, n_tiles, singles, n_singles, max_len, part, out, s)
                          : attention_launch<KV_BF16>(g, q, pos, seq, pt_off, pages, T, H, window, scale, softcap,
                                                      tiles, n_tiles, singles, n_singles, max_len, part, out, s);
}
