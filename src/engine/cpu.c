/*
 * cpu.c — the CPU backend's compute: weight matmul, fp32 elementwise ops
 * and RoPE, run on a thread pool (base/pool.c) that carries the matmul mode.
 *
 * Owns: the order in which every dot product is summed, and the RoPE
 * frequency formulas.  Does not own: the threads (base/pool.c: n-1 workers
 * plus the caller, ~100 µs of spinning before sleeping, so back-to-back
 * matmuls of one pass start without futex wake-ups — measured on 16 threads:
 * a 1536x576 Q4_1 matmul at T=1 went from 111 µs to 39 µs), weight layouts
 * (quant.c), attention, the KV cache or any model logic (forward.c).
 *
 * Matmul Y(T,N) = X(T,K) · W(N,K)^T.  A task is a tile of up to 16 W rows:
 * the thread dequantizes the tile into its scratch once (F32 weights are
 * used in place) and then multiplies it with all T rows of X, 4 W rows × 2 X
 * rows per register block, so a tile streamed from memory is reused T times
 * (that is where batching pays).  Weights are never expanded beyond a tile.
 *
 * What is bit-stable, exactly: every output Y[t][n] is computed by one
 * dot-product routine as
 *     acc[j] = fma(w[k], x[k], acc[j])   for k = j, j+8, j+16, … < K8 (K8 = K rounded down to 8),
 *     s      = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)),
 *     s      = fma(w[k], x[k], s)        for k = K8 … K-1,
 * where w is the dequantized row (bit-identical between the scalar and SIMD
 * dequantizers).  Nothing else enters the sum, so Y[t][n] depends only on X
 * row t and W row n: not on T, the thread count, the task split, the tile
 * size, the row's position in X, or the SIMD/scalar choice (the scalar path
 * emulates the eight lanes with fmaf).  Different K of course give different
 * orders.  This is what "streamed vs resident bit-identical" and "same seed,
 * same tokens regardless of batch composition" rest on.
 *
 * Second mode, per pool (cpu_pool_set_q8_act): for the 32-group weight types
 * (Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K) X rows are quantized to 8 bits per
 * 32-block, once per call, and dotted with the weights' integers with
 * maddubs (llama.cpp's approach).  Measured (bench/bench_matmul.c): 2.1-4.4x
 * faster at T=1 on Q4_1, 1.2-1.6x on Q8_0, about equal at T >= 64.  It
 * changes the numerics (activation rounding, bounded in cpu.h), so it is a
 * choice, not a silent switch by T: each mode is bit-stable in the sense
 * above on its own (its fixed order is given before quant_x_scalar), and
 * the scalar emulation of the integer lanes gives the same bits as AVX2.
 * Q6_K/Q8_K and float types always use the exact path.  Within that mode:
 * passes of 1-3 rows dot the raw legacy-quant rows (blocks unpacked in
 * registers, no tile), the kernels run on AVX-512 VNNI where present
 * (cpu_kq.h, instantiated for AVX2 and VNNI), batched passes dot 8
 * interleaved weight rows per register (lane = row), and cpu_matmul_multi
 * sends several matrices sharing one X as one job — all without changing a
 * bit (one arithmetic, stated in cpu_kq.h).
 */
#include "cpu.h"

#include "../model/quant.h"
#include "../model/quant_avx2.h"
#include "../base/pool.h"
#include "../base/util.h"

#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the engine's pool */

/* A thread pool (base/pool.c) plus the matmul mode and the 8-bit activation buffer that belong to it. */
struct cpu_pool {
    spill_pool *tp;
    bool q8_act;  /* matmul mode for quantized weights, see cpu_pool_set_q8_act */
    uint8_t *act; /* 8-bit activations (T, K + 8*K/32), grown on demand */
    size_t act_cap;
};

int cpu_pool_create(int n_threads, size_t scratch_bytes_per_thread, cpu_pool **out, char *err, size_t errlen)
{
    *out = NULL;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return util_errf(err, errlen, "cpu pool: out of memory allocating the pool.");
    if (pool_create(n_threads, scratch_bytes_per_thread, &p->tp, err, errlen)) {
        free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *ctx, int64_t n_tasks) { pool_run(p->tp, fn, ctx, n_tasks); }
int cpu_pool_threads(const cpu_pool *p) { return pool_threads(p->tp); }
void cpu_pool_set_q8_act(cpu_pool *p, bool on) { p->q8_act = on; }
bool cpu_pool_q8_act(const cpu_pool *p) { return p->q8_act; }
size_t cpu_pool_scratch_bytes(const cpu_pool *p) { return pool_scratch_bytes(p->tp); }
void *cpu_pool_scratch(cpu_pool *p, int thread_id) { return pool_scratch(p->tp, thread_id); }

void cpu_pool_free(cpu_pool *p)
{
    if (!p)
        return;
    pool_free(p->tp);
    free(p->act);
    free(p);
}

/* ---------------------------------------------------------------- dot products: scalar reference */

/* The fixed summation order (see the file comment), eight lanes emulated. */
static float dot_scalar(const float *w, const float *x, int64_t K)
{
    float acc[8] = {0};
    int64_t K8 = K & ~(int64_t)7, k = 0;
    for (; k < K8; k += 8)
        for (int j = 0; j < 8; j++)
            acc[j] = fmaf(w[k + j], x[k + j], acc[j]);
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; k < K; k++)
        s = fmaf(w[k], x[k], s);
    return s;
}

/* Y[t*ldy + r] for the R tile rows (each K floats, stride K) and all T rows of X. */
static void tile_scalar(const float *tile, int64_t R, int64_t K, const float *X, int64_t T, float *Y, int64_t ldy)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++)
            Y[t * ldy + r] = dot_scalar(tile + r * K, X + t * K, K);
}

/* ---------------------------------------------------------------- dot products: AVX2 + FMA */

#define SIMD __attribute__((target("avx2,fma,f16c")))

static inline SIMD float hsum8(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* a_i + a_(i+4) */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                          /* (0+4)+(2+6), (1+5)+(3+7) */
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline SIMD float tail(float s, const float *w, const float *x, int64_t k, int64_t K)
{
    for (; k < K; k++)
        s = fmaf(w[k], x[k], s);
    return s;
}

/* 4 W rows × 2 X rows: out[t][r]. */
static SIMD void kern_4x2(const float *w, int64_t K, const float *x0, const float *x1, float o0[4], float o1[4])
{
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    int64_t K8 = K & ~(int64_t)7, k = 0;
    for (; k < K8; k += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k);
        __m256 b0 = _mm256_loadu_ps(w0 + k), b1 = _mm256_loadu_ps(w1 + k);
        __m256 b2 = _mm256_loadu_ps(w2 + k), b3 = _mm256_loadu_ps(w3 + k);
        a00 = _mm256_fmadd_ps(b0, v0, a00);
        a01 = _mm256_fmadd_ps(b1, v0, a01);
        a02 = _mm256_fmadd_ps(b2, v0, a02);
        a03 = _mm256_fmadd_ps(b3, v0, a03);
        a10 = _mm256_fmadd_ps(b0, v1, a10);
        a11 = _mm256_fmadd_ps(b1, v1, a11);
        a12 = _mm256_fmadd_ps(b2, v1, a12);
        a13 = _mm256_fmadd_ps(b3, v1, a13);
    }
    o0[0] = tail(hsum8(a00), w0, x0, k, K);
    o0[1] = tail(hsum8(a01), w1, x0, k, K);
    o0[2] = tail(hsum8(a02), w2, x0, k, K);
    o0[3] = tail(hsum8(a03), w3, x0, k, K);
    o1[0] = tail(hsum8(a10), w0, x1, k, K);
    o1[1] = tail(hsum8(a11), w1, x1, k, K);
    o1[2] = tail(hsum8(a12), w2, x1, k, K);
    o1[3] = tail(hsum8(a13), w3, x1, k, K);
}

/* 4 W rows × 1 X row. */
static SIMD void kern_4x1(const float *w, int64_t K, const float *x0, float o0[4])
{
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t K8 = K & ~(int64_t)7, k = 0;
    for (; k < K8; k += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), v0, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), v0, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), v0, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), v0, a3);
    }
    o0[0] = tail(hsum8(a0), w0, x0, k, K);
    o0[1] = tail(hsum8(a1), w1, x0, k, K);
    o0[2] = tail(hsum8(a2), w2, x0, k, K);
    o0[3] = tail(hsum8(a3), w3, x0, k, K);
}

/* 1 W row × 1 X row. */
static SIMD float kern_1x1(const float *w, int64_t K, const float *x0)
{
    __m256 a = _mm256_setzero_ps();
    int64_t K8 = K & ~(int64_t)7, k = 0;
    for (; k < K8; k += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x0 + k), a);
    return tail(hsum8(a), w, x0, k, K);
}

static SIMD void tile_avx2(const float *tile, int64_t R, int64_t K, const float *X, int64_t T, float *Y, int64_t ldy)
{
    int64_t R4 = R & ~(int64_t)3;
    int64_t t = 0;
    for (; t + 2 <= T; t += 2) {
        const float *x0 = X + t * K, *x1 = x0 + K;
        float *y0 = Y + t * ldy, *y1 = y0 + ldy;
        int64_t r = 0;
        for (; r < R4; r += 4)
            kern_4x2(tile + r * K, K, x0, x1, y0 + r, y1 + r);
        for (; r < R; r++) {
            y0[r] = kern_1x1(tile + r * K, K, x0);
            y1[r] = kern_1x1(tile + r * K, K, x1);
        }
    }
    for (; t < T; t++) {
        const float *x0 = X + t * K;
        float *y0 = Y + t * ldy;
        int64_t r = 0;
        for (; r < R4; r += 4)
            kern_4x1(tile + r * K, K, x0, y0 + r);
        for (; r < R; r++)
            y0[r] = kern_1x1(tile + r * K, K, x0);
    }
}

/* ---------------------------------------------------------------- 8-bit-activation path
 *
 * X row layout in pool->act (stride K + 8*nb bytes, nb = K/32): int8 q[K],
 * float d[nb], float s[nb] with x ~= d[b]*q and s[b] = d[b]*sum(q of block b).
 * W rows from quant_unpack_q8_row (same stride): u8/i8 q[K], float dw[nb],
 * float mw[nb] (w = dw*q + mw per 32-group); the batched kernels take them
 * as groups of 8 rows interleaved 4 bytes at a time (kq_group_put).
 * Y[t][n] in every path (scalar, raw 1-row, interleaved; AVX2 or VNNI):
 * exact int32 block sums S_b, accumulator b mod 8 gets fma(fl(dw_b*dx_b), S_b)
 * and then fma(mw_b, s_b), one fixed 8-way tree (cpu_kq.h's opening comment;
 * dotq_scalar is the oracle).
 */

/* One X row to 8 bits: d = amax/127, q = round-half-even(x/d), per 32-block. */
static void quant_x_scalar(const float *x, int64_t K, int8_t *q, float *d, float *s)
{
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float db = amax / 127.0f, id = db != 0 ? 1.0f / db : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * id);
            q[32 * b + j] = (int8_t)v;
            sum += v;
        }
        d[b] = db;
        s[b] = db * (float)sum;
    }
}

static SIMD void quant_x_avx2(const float *x, int64_t K, int8_t *q, float *d, float *s)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4];
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_loadu_ps(xb + 8 * i);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float db = amax / 127.0f, id = db != 0 ? 1.0f / db : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i iv[4];
        for (int i = 0; i < 4; i++)
            iv[i] = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]), p23 = _mm256_packs_epi32(iv[2], iv[3]);
        __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), p);
        d[b] = db;
        s[b] = db * (float)_mm_cvtsi128_si32(s4);
    }
}

/* The 8-bit paths' one arithmetic (cpu_kq.h's opening comment), emulated: S_b exact in int32, accumulator b mod 8,
 * the scale product, then the block-minimum fma, the fixed 8-way tree. */
static float dotq_scalar(const uint8_t *wq, const float *dw, const float *mw, const int8_t *xq, const float *dx,
                         const float *sx, int64_t nb, bool sgn, bool has_min)
{
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        int32_t S = 0;
        for (int j = 32 * b; j < 32 * b + 32; j++)
            S += (sgn ? (int32_t)(int8_t)wq[j] : (int32_t)wq[j]) * xq[j];
        acc[b % 8] = fmaf(dw[b] * dx[b], (float)S, acc[b % 8]);
        if (has_min)
            acc[b % 8] = fmaf(mw[b], sx[b], acc[b % 8]);
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* The batched kernels' weight layout, one group of 8 tile rows (stride KQ_GROUP_BYTES(nb) = 8 * xs): for each
 * block b, for each 4-byte group g of it, the 8 rows' 4 bytes (q[256*b + 32*g + 4*r + i] = row r's byte 32b+4g+i),
 * then dw[8*b + r] and mw[8*b + r]. */
#define KQ_GROUP_BYTES(nb) ((size_t)(nb) * (256 + 64))

/* Row r (0..7) of a group from its row layout (q[K], dw[nb], mw[nb]). */
static void kq_group_put(uint8_t *grp, int r, const uint8_t *q, const float *dw, const float *mw, int64_t nb)
{
    float *gd = (float *)(grp + 256 * nb), *gm = gd + 8 * nb;
    for (int64_t b = 0; b < nb; b++) {
        for (int g = 0; g < 8; g++)
            memcpy(grp + 256 * b + 32 * g + 4 * r, q + 32 * b + 4 * g, 4);
        gd[8 * b + r] = dw[b];
        gm[8 * b + r] = mw[b];
    }
}

#define KQ_NX 4
#define KQ_ATTR SIMD
#define KQ_NAME(n) n##_avx2
#define KQ_DOTACC(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#include "cpu_kq.h"
#undef KQ_ATTR
#undef KQ_NAME
#undef KQ_DOTACC
#define KQ_ATTR __attribute__((target("avx2,fma,f16c,avx512vl,avx512vnni")))
#define KQ_NAME(n) n##_vnni
#define KQ_DOTACC(acc, w, x) _mm256_dpbusd_epi32(acc, w, x)
#include "cpu_kq.h"
#undef KQ_ATTR
#undef KQ_NAME
#undef KQ_DOTACC

/* The kernel set a matmul uses: VNNI where the CPU has AVX-512 VNNI + VL, unless cpu_q8_vnni_force(0) (main() for
 * SPILL_NO_VNNI=1). */
typedef struct kq_ops {
    float (*k1x1_raw)(uint32_t, const uint8_t *, size_t, const int8_t *, const float *, const float *, int64_t, bool,
                      bool);
    void (*k8xN)(const uint8_t *, const uint8_t *, int64_t, int64_t, int64_t, bool, bool, float *, int64_t, int);
    void (*k8x1)(const uint8_t *, const uint8_t *, int64_t, int64_t, int64_t, bool, bool, float *, int64_t, int);
} kq_ops;

static const kq_ops KQ_AVX2 = {kq_1x1_raw_avx2, kq_8xN_avx2, kq_8x1_avx2};
static const kq_ops KQ_VNNI = {kq_1x1_raw_vnni, kq_8xN_vnni, kq_8x1_vnni};
static int g_vnni = -1; /* -1: not decided yet */

void cpu_q8_vnni_force(int on)
{
    g_vnni = on;
}

bool cpu_q8_vnni_active(void)
{
    if (g_vnni < 0) {
        __builtin_cpu_init();
        g_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
    }
    return g_vnni > 0;
}

typedef struct {
    const float *X;
    uint8_t *act;
    int64_t K, T, xs, rows_per_task;
    bool simd;
} xq_ctx;

static void xq_task(void *vctx, int64_t task, int tid)
{
    const xq_ctx *c = vctx;
    int64_t nb = c->K / 32;
    for (int64_t t = task * c->rows_per_task; t < c->T && t < (task + 1) * c->rows_per_task; t++) {
        uint8_t *row = c->act + t * c->xs;
        float *d = (float *)(row + c->K);
        if (c->simd)
            quant_x_avx2(c->X + t * c->K, c->K, (int8_t *)row, d, d + nb);
        else
            quant_x_scalar(c->X + t * c->K, c->K, (int8_t *)row, d, d + nb);
    }
}

/* ---------------------------------------------------------------- matmul */

typedef struct {
    cpu_pool *p;
    const uint8_t *W;
    uint32_t wtype;
    size_t row_bytes;
    int64_t N, K, T;
    const float *X;
    float *Y;
    int64_t rows_per_task;
    bool simd;
    bool q8;              /* 8-bit-activation path */
    const uint8_t *act;   /* q8: quantized X, row stride xs */
    int64_t xs;
} mm_ctx;

/* Batched 8-bit passes walk X in chunks of this many bytes of rows (16 KiB: beside a 16-row tile of a
 * 576-wide matrix, 11.5 KiB, within a 32 KiB L1), each chunk meeting every 8-row group of the tile while hot.
 * Measured with the previous per-row kernels (B4's batch of 256, 2 cores): chunks gave ~1.10x. */
#define Q8_X_CHUNK_BYTES (16u << 10)

/* The 8-bit path for tile rows n0..n0+R-1 (R <= the tile's rows; scratch holds ceil(R/8)*8 + 1 rows of xs). */
static void mm_task_q8(const mm_ctx *c, int64_t n0, int64_t R, const uint8_t *w, int tid)
{
    int64_t K = c->K, nb = K / 32, xs = c->xs;
    bool sgn = quant_q8_signed(c->wtype), has_min = !sgn;
    uint8_t *tile = cpu_pool_scratch(c->p, tid);
    if (!c->simd) { /* the oracle: row layout, dotq_scalar */
        for (int64_t r = 0; r < R; r++) {
            float *dw = (float *)(tile + K);
            quant_unpack_q8_row(c->wtype, w + (size_t)r * c->row_bytes, K, tile, dw, dw + nb);
            for (int64_t t = 0; t < c->T; t++) {
                const uint8_t *xr = c->act + t * xs;
                const float *dx = (const float *)(xr + K);
                c->Y[t * c->N + n0 + r] = dotq_scalar(tile, dw, dw + nb, (const int8_t *)xr, dx, dx + nb, nb, sgn, has_min);
            }
        }
        return;
    }
    const kq_ops *kq = cpu_q8_vnni_active() ? &KQ_VNNI : &KQ_AVX2;
    if (c->T < 4 && c->wtype != GGML_Q4_K && c->wtype != GGML_Q5_K) {
        /* a decode pass of 1-3 rows: dot each raw weight row directly (no tile) */
        size_t bsz = c->row_bytes / (size_t)nb;
        for (int64_t r = 0; r < R; r++)
            for (int64_t t = 0; t < c->T; t++) {
                const uint8_t *xr = c->act + t * xs;
                const float *dx = (const float *)(xr + K);
                c->Y[t * c->N + n0 + r] = kq->k1x1_raw(c->wtype, w + (size_t)r * c->row_bytes, bsz, (const int8_t *)xr,
                                                       dx, dx + nb, nb, sgn, has_min);
            }
        return;
    }
    /* the tile as groups of 8 interleaved rows (a last partial group zero-padded), each row unpacked first into
     * the row after the groups */
    int64_t G = (R + 7) / 8;
    size_t gb = KQ_GROUP_BYTES(nb);
    uint8_t *row = tile + (size_t)G * gb;
    float *rdw = (float *)(row + K);
    if (R % 8)
        memset(tile + (size_t)(G - 1) * gb, 0, gb);
    for (int64_t r = 0; r < R; r++) {
        memset(rdw + nb, 0, sizeof(float) * (size_t)nb); /* mw: signed types leave it unwritten */
        quant_unpack_q8_row(c->wtype, w + (size_t)r * c->row_bytes, K, row, rdw, rdw + nb);
        kq_group_put(tile + (size_t)(r / 8) * gb, (int)(r % 8), row, rdw, rdw + nb, nb);
    }
    int64_t TN = c->T - c->T % KQ_NX;
    /* X rows in chunks that stay in L1 beside the tile; every output is the same arithmetic whatever the chunk */
    int64_t chunk = (int64_t)(Q8_X_CHUNK_BYTES / (size_t)xs) / KQ_NX * KQ_NX;
    chunk = chunk < KQ_NX ? KQ_NX : chunk;
    for (int64_t t0 = 0; t0 < TN; t0 += chunk) {
        int64_t t1 = t0 + chunk < TN ? t0 + chunk : TN;
        for (int64_t g = 0; g < G; g++) {
            int nr = R - 8 * g < 8 ? (int)(R - 8 * g) : 8;
            for (int64_t t = t0; t < t1; t += KQ_NX)
                kq->k8xN(tile + (size_t)g * gb, c->act + t * xs, xs, K, nb, sgn, has_min, c->Y + n0 + 8 * g + t * c->N,
                         c->N, nr);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        int nr = R - 8 * g < 8 ? (int)(R - 8 * g) : 8;
        for (int64_t t = TN; t < c->T; t++)
            kq->k8x1(tile + (size_t)g * gb, c->act + t * xs, xs, K, nb, sgn, has_min, c->Y + n0 + 8 * g + t * c->N, c->N,
                     nr);
    }
}

static void mm_task(void *vctx, int64_t task, int tid)
{
    const mm_ctx *c = vctx;
    int64_t n0 = task * c->rows_per_task;
    int64_t R = c->N - n0 < c->rows_per_task ? c->N - n0 : c->rows_per_task;
    const uint8_t *w = c->W + (size_t)n0 * c->row_bytes;
    if (c->q8) {
        mm_task_q8(c, n0, R, w, tid);
        return;
    }
    const float *tile;
    if (c->wtype == 0 /* GGML_F32 */) {
        tile = (const float *)w; /* already fp32: use the rows in place */
    } else {
        float *s = cpu_pool_scratch(c->p, tid);
        for (int64_t r = 0; r < R; r++)
            quant_dequant_row(c->wtype, w + (size_t)r * c->row_bytes, s + r * c->K, c->K);
        tile = s;
    }
    if (c->simd)
        tile_avx2(tile, R, c->K, c->X, c->T, c->Y + n0, c->N);
    else
        tile_scalar(tile, R, c->K, c->X, c->T, c->Y + n0, c->N);
}

size_t cpu_matmul_scratch_bytes(int64_t K)
{
    return K > 0 ? (size_t)K * sizeof(float) * CPU_MATMUL_TILE_ROWS : 0;
}

/* Grows pool->act to hold T rows of stride xs. */
static int grow_act(cpu_pool *p, int64_t T, int64_t K, int64_t xs, char *err, size_t errlen)
{
    uint64_t need;
    if (!ck_mul_u64((uint64_t)T, (uint64_t)xs, &need) || need > SIZE_MAX)
        return util_errf(err, errlen, "matmul: activation buffer for T=%lld K=%lld overflows; use a smaller pass.",
                         (long long)T, (long long)K);
    if (need > p->act_cap) {
        size_t cap = ((size_t)need + 63) & ~(size_t)63;
        uint8_t *a = aligned_alloc(64, cap);
        if (!a)
            return util_errf(err, errlen, "matmul: out of memory growing the 8-bit activation buffer to %zu bytes "
                             "(T=%lld, K=%lld); use a smaller pass.", cap, (long long)T, (long long)K);
        free(p->act);
        p->act = a;
        p->act_cap = cap;
    }
    return 0;
}

int cpu_pool_reserve_q8(cpu_pool *p, int64_t T, int64_t K, char *err, size_t errlen)
{
    if (T < 0 || K <= 0 || K % 32 != 0)
        return util_errf(err, errlen, "cpu pool: cannot reserve 8-bit activations for T=%lld K=%lld (K must be a "
                         "positive multiple of 32).", (long long)T, (long long)K);
    return grow_act(p, T, K, K + 8 * (K / 32), err, errlen);
}

/* Quantizes X into pool->act (grown here when a larger T×K first appears); a single task runs on the
 * calling thread (a decode pass's handful of rows is not worth waking the pool for). */
static int quantize_activations(cpu_pool *p, const float *X, int64_t T, int64_t K, int64_t xs, bool simd, char *err,
                                size_t errlen)
{
    if (grow_act(p, T, K, xs, err, errlen) != 0)
        return -1;
    int64_t rpt = 8;
    xq_ctx xc = {X, p->act, K, T, xs, rpt, simd};
    if (T <= rpt)
        xq_task(&xc, 0, 0);
    else
        cpu_pool_run(p, xq_task, &xc, (T + rpt - 1) / rpt);
    return 0;
}

/* Several matrices' row tiles as one job: task k belongs to the part whose range holds it. */
typedef struct {
    mm_ctx part[CPU_MM_MAX_PARTS];
    int64_t first_task[CPU_MM_MAX_PARTS + 1];
    int n;
} mm_multi;

static void mm_multi_task(void *vctx, int64_t task, int tid)
{
    mm_multi *m = vctx;
    int i = 0;
    while (i + 1 < m->n && task >= m->first_task[i + 1])
        i++;
    mm_task(&m->part[i], task - m->first_task[i], tid);
}

int cpu_matmul_multi(cpu_pool *p, const cpu_mm_part *parts, int n_parts, int64_t K, const float *X, int64_t T,
                     char *err, size_t errlen)
{
    if (n_parts < 1 || n_parts > CPU_MM_MAX_PARTS)
        return util_errf(err, errlen, "matmul: %d matrices in one dispatch (1..%d).", n_parts, CPU_MM_MAX_PARTS);
    mm_multi mm;
    memset(&mm, 0, sizeof mm);
    int64_t xs = K + 8 * (K / 32); /* q8 row stride, activations and weight tile alike */
    bool simd = quant_simd_active(), any_q8 = false;
    int64_t tasks = 0;
    for (int i = 0; i < n_parts; i++) {
        const cpu_mm_part *pt = &parts[i];
        size_t row_bytes;
        if (!quant_type_supported(pt->wtype))
            return util_errf(err, errlen, "matmul: weight type %u is not supported by the CPU backend.", pt->wtype);
        if (pt->N < 0 || K <= 0 || T < 0 || quant_row_bytes(pt->wtype, K, &row_bytes) != 0)
            return util_errf(err, errlen,
                             "matmul: shape N=%lld K=%lld T=%lld is invalid for %s (K must be a positive "
                             "multiple of %lld).",
                             (long long)pt->N, (long long)K, (long long)T, quant_type_name(pt->wtype),
                             (long long)quant_block_elems(pt->wtype));
        if (pt->N == 0 || T == 0)
            continue; /* nothing to compute (and no scratch needed) */
        bool q8 = p->q8_act && quant_q8_supported(pt->wtype);
        int64_t rpt = CPU_MATMUL_TILE_ROWS;
        if (pt->wtype != 0) {
            size_t row = q8 ? (size_t)xs : (size_t)K * sizeof(float);
            int64_t fit = (int64_t)(cpu_pool_scratch_bytes(p) / row);
            if (fit < 1)
                return util_errf(err, errlen,
                                 "matmul: per-thread scratch of %zu bytes cannot hold one row of K=%lld "
                                 "weights; create the pool with cpu_matmul_scratch_bytes(K).",
                                 cpu_pool_scratch_bytes(p), (long long)K);
            if (q8 && fit < 9) /* one group of 8 interleaved rows plus the row being unpacked */
                return util_errf(err, errlen,
                                 "matmul: per-thread scratch of %zu bytes cannot hold 9 rows of K=%lld 8-bit "
                                 "weights; create the pool with cpu_matmul_scratch_bytes(K).",
                                 cpu_pool_scratch_bytes(p), (long long)K);
            int64_t fit8 = (fit - 1) & ~(int64_t)7;
            if (q8 && fit8 < rpt)
                rpt = fit8;
            else if (fit < rpt)
                rpt = fit >= 4 ? fit & ~(int64_t)3 : fit;
        }
        /* keep every thread busy on small N: at least ~4 tasks per thread when rows allow (8-bit tiles in whole
         * groups of 8 rows) */
        int64_t step = q8 ? 8 : 4;
        while (rpt > step && (pt->N + rpt - 1) / rpt < 4 * (int64_t)cpu_pool_threads(p))
            rpt -= step;
        any_q8 |= q8 && pt->N > 0;
        mm.part[mm.n] = (mm_ctx){p, pt->W, pt->wtype, row_bytes, pt->N, K, T, X, pt->Y, rpt, simd, q8, NULL, xs};
        mm.first_task[mm.n] = tasks;
        tasks += (pt->N + rpt - 1) / rpt;
        mm.n++;
    }
    mm.first_task[mm.n] = tasks;
    if (tasks == 0 || T == 0)
        return 0;
    if (any_q8 && quantize_activations(p, X, T, K, xs, simd, err, errlen) != 0)
        return -1;
    for (int i = 0; i < mm.n; i++)
        mm.part[i].act = p->act; /* after the quantization: it may have grown the buffer */
    cpu_pool_run(p, mm_multi_task, &mm, tasks);
    return 0;
}

int cpu_matmul(cpu_pool *p, const void *W, uint32_t wtype, int64_t N, int64_t K, const float *X, int64_t T, float *Y,
               char *err, size_t errlen)
{
    cpu_mm_part part = {W, wtype, N, Y};
    return cpu_matmul_multi(p, &part, 1, K, X, T, err, errlen);
}

/* ---------------------------------------------------------------- attention helpers */

static SIMD void scores_avx2(const float *q, const float *k, int64_t n, int64_t S, float *s)
{
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        kern_4x1(k + j * S, S, q, s + j);
    for (; j < n; j++)
        s[j] = kern_1x1(k + j * S, S, q);
}

void cpu_attn_scores(const float *q, const float *k, int64_t n, int64_t S, float *s)
{
    if (quant_simd_active()) {
        scores_avx2(q, k, n, S, s);
        return;
    }
    for (int64_t j = 0; j < n; j++)
        s[j] = dot_scalar(k + j * S, q, S);
}

static SIMD void accum_avx2(float *o, const float *w, const float *v, int64_t n, int64_t S)
{
    int64_t d = 0;
    for (; d + 16 <= S; d += 16) {
        __m256 a0 = _mm256_loadu_ps(o + d), a1 = _mm256_loadu_ps(o + d + 8);
        for (int64_t j = 0; j < n; j++) {
            __m256 wj = _mm256_set1_ps(w[j]);
            a0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + j * S + d), a0);
            a1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + j * S + d + 8), a1);
        }
        _mm256_storeu_ps(o + d, a0);
        _mm256_storeu_ps(o + d + 8, a1);
    }
    for (; d < S; d++)
        for (int64_t j = 0; j < n; j++)
            o[d] = fmaf(w[j], v[j * S + d], o[d]);
}

void cpu_attn_accum(float *o, const float *w, const float *v, int64_t n, int64_t S)
{
    if (quant_simd_active()) {
        accum_avx2(o, w, v, n, S);
        return;
    }
    for (int64_t d = 0; d < S; d++)
        for (int64_t j = 0; j < n; j++)
            o[d] = fmaf(w[j], v[j * S + d], o[d]);
}

/* ---------------------------------------------------------------- elementwise */

void cpu_rmsnorm(float *y, const float *x, const float *w, int64_t T, int64_t D, float eps, bool w_plus_one)
{
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * D;
        float *yr = y + t * D;
        double ss = 0;
        for (int64_t i = 0; i < D; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
        for (int64_t i = 0; i < D; i++)
            yr[i] = (xr[i] * inv) * (w_plus_one ? 1.0f + w[i] : w[i]);
    }
}

void cpu_silu_mul(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_gelu_tanh_mul(float *g, const float *u, int64_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        float v = g[i];
        g[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v))) * u[i];
    }
}

void cpu_softmax(float *x, int64_t n)
{
    if (n <= 0)
        return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) { /* every entry masked: define the result as uniform zero mass */
        for (int64_t i = 0; i < n; i++)
            x[i] = 0;
        return;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

void cpu_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

void cpu_scale(float *x, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

/* ---------------------------------------------------------------- RoPE */

/* yarn helpers, verbatim from transformers (Python floats = double). */
static double yarn_get_mscale(double scale, double mscale)
{
    if (scale <= 1)
        return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double num_rot, double dim, double base, double max_pos)
{
    return (dim * log(max_pos / (num_rot * 2 * M_PI))) / (2 * log(base));
}

int cpu_rope_init(cpu_rope *r, const rope_cfg *cfg, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    int dim = cfg->n_rot;
    if (dim <= 0 || dim % 2 || dim > CPU_ROPE_MAX_ROT)
        return util_errf(err, errlen, "rope: rotary dim %d must be even and in 2..%d; check head_dim and "
                         "partial_rotary_factor.", dim, CPU_ROPE_MAX_ROT);
    if (!(cfg->freq_base > 1.0) || !isfinite(cfg->freq_base))
        return util_errf(err, errlen, "rope: rope_theta %g must be a finite number > 1.", cfg->freq_base);
    if (cfg->style != ROPE_NEOX && cfg->style != ROPE_NORM)
        return util_errf(err, errlen, "rope: unknown style %d.", cfg->style);
    bool needs_factor = cfg->scaling != ROPE_SCALE_NONE && cfg->scaling != ROPE_SCALE_LONGROPE;
    if (needs_factor && (!(cfg->factor > 0) || !isfinite(cfg->factor)))
        return util_errf(err, errlen, "rope: rope_parameters.factor %g must be a finite number > 0.", cfg->factor);
    r->style = cfg->style;
    r->n_rot = dim;
    r->attn_scale = 1.0f;
    int half = dim / 2;
    float *f = r->inv_freq;
    /* inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in fp32 */
    float base = (float)cfg->freq_base;
    float pos_freq[CPU_ROPE_MAX_ROT / 2];
    for (int i = 0; i < half; i++) {
        pos_freq[i] = powf(base, (float)(2 * i) / (float)dim);
        f[i] = 1.0f / pos_freq[i];
    }
    switch (cfg->scaling) {
    case ROPE_SCALE_NONE:
        break;
    case ROPE_SCALE_LINEAR:
        for (int i = 0; i < half; i++)
            f[i] /= (float)cfg->factor;
        break;
    case ROPE_SCALE_LLAMA3: {
        double lff = cfg->low_freq_factor, hff = cfg->high_freq_factor, old = cfg->orig_max_pos;
        if (!(lff > 0) || !(hff > lff) || !(old > 0))
            return util_errf(err, errlen, "rope llama3: need 0 < low_freq_factor (%g) < high_freq_factor (%g) and "
                             "original_max_position_embeddings (%g) > 0.", lff, hff, old);
        float low_wavelen = (float)(old / lff), high_wavelen = (float)(old / hff);
        float factor = (float)cfg->factor;
        for (int i = 0; i < half; i++) {
            float wavelen = (float)(2 * M_PI) / f[i];
            float ifl = wavelen > low_wavelen ? f[i] / factor : f[i];
            float smooth = ((float)old / wavelen - (float)lff) / (float)(hff - lff);
            float smoothed = (1.0f - smooth) * ifl / factor + smooth * ifl;
            bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            f[i] = medium ? smoothed : ifl;
        }
        break;
    }
    case ROPE_SCALE_YARN: {
        double factor = cfg->factor, old = cfg->orig_max_pos, base_d = cfg->freq_base;
        if (!(old > 0))
            return util_errf(err, errlen, "rope yarn: original_max_position_embeddings (%g) must be > 0.", old);
        double attn = cfg->attn_factor;
        if (attn <= 0) {
            if (cfg->mscale != 0 && cfg->mscale_all_dim != 0)
                attn = yarn_get_mscale(factor, cfg->mscale) / yarn_get_mscale(factor, cfg->mscale_all_dim);
            else
                attn = yarn_get_mscale(factor, 1);
        }
        double beta_fast = cfg->beta_fast != 0 ? cfg->beta_fast : 32, beta_slow = cfg->beta_slow != 0 ? cfg->beta_slow : 1;
        double low = yarn_correction_dim(beta_fast, dim, base_d, old);
        double high = yarn_correction_dim(beta_slow, dim, base_d, old);
        if (!cfg->yarn_no_truncate) {
            low = floor(low);
            high = ceil(high);
        }
        low = low > 0 ? low : 0;
        high = high < dim - 1 ? high : dim - 1;
        if (low == high)
            high += 0.001; /* transformers: prevent singularity */
        for (int i = 0; i < half; i++) {
            float extrap = 1.0f / pos_freq[i];
            float interp = 1.0f / ((float)factor * pos_freq[i]);
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp;
            f[i] = interp * (1.0f - ef) + extrap * ef;
        }
        r->attn_scale = (float)attn;
        break;
    }
    case ROPE_SCALE_LONGROPE: /* inv_freq = 1 / (ext_factors * base ** (arange(0, dim, 2) / dim)) */
        if (!cfg->ext_factors)
            return util_errf(err, errlen, "rope longrope: the factor list is missing.");
        for (int i = 0; i < half; i++)
            f[i] = 1.0f / (cfg->ext_factors[i] * pos_freq[i]);
        r->attn_scale = (float)cfg->attn_factor;
        break;
    default:
        return util_errf(err, errlen, "rope: unknown scaling type %d.", cfg->scaling);
    }
    return 0;
}

void cpu_rope_apply(const cpu_rope *r, float *x, int64_t T, int64_t H, int64_t S, const int32_t *pos)
{
    int half = r->n_rot / 2;
    float c[CPU_ROPE_MAX_ROT / 2], s[CPU_ROPE_MAX_ROT / 2];
    for (int64_t t = 0; t < T; t++) {
        float p = (float)pos[t];
        for (int i = 0; i < half; i++) {
            float a = p * r->inv_freq[i];
            c[i] = cosf(a) * r->attn_scale;
            s[i] = sinf(a) * r->attn_scale;
        }
        for (int64_t h = 0; h < H; h++) {
            float *v = x + (t * H + h) * S;
            if (r->style == ROPE_NEOX) {
                for (int i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * c[i] - b * s[i];
                    v[i + half] = b * c[i] + a * s[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * c[i] - b * s[i];
                    v[2 * i + 1] = b * c[i] + a * s[i];
                }
            }
        }
    }
}
