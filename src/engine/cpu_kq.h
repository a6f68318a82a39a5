/*
 * cpu_kq.h — the 8-bit-activation dot-product kernels of cpu.c, included
 * twice: once for AVX2 (maddubs + madd) and once for AVX-512 VNNI on 256-bit
 * vectors (dpbusd).  The two give the same int32 lanes — maddubs never
 * saturates here (4/5-bit weights times 8-bit activations, or |8-bit| pairs:
 * at most 2·128·127 = 32,512 per 16-bit pair) — and everything after the
 * integer dot is the same code, so both produce the same bits.
 *
 * What bounds the batched kernels (kq_1x4, kq_2x4): their lanes hold partial sums of one weight row, so each
 * 32-product dpbusd costs a convert, a scale product, a broadcast and an fma besides.  Interleaving 8 unpacked
 * weight rows 4 bytes at a time (lane = row, the activation's 4 bytes broadcast) would pay those once per 8
 * rows.  Keeping every path's bits equal (batch invariance) then needs one arithmetic for all of them: exact
 * int32 block sums S_b (|S_b| < 2^24, exact in fp32), accumulators indexed by block mod 8
 * (acc = fma(fl(dw*dx), S_b, acc), then the block-minimum fma) and one fixed 8-way tree at the end — which the
 * 1-row kernel gets from 8 blocks' dpbusd reduced across lanes, and the interleaved one from 8 registers.
 * Signed weights: +128 offset and -128*sum(x) (exact) under VNNI; maddubs would saturate there, so AVX2 keeps
 * the sign trick.  Not built: it changes every 8-bit dot path and the scalar oracle.
 *
 * Expects KQ_ATTR (the target attribute), KQ_NAME(n) (suffixes a name) and
 * KQ_DOT(w, x) (8 int32 lanes of 4 u8·s8 products).  No include guard: it is
 * meant to be included more than once, and only by cpu.c.
 */

/* 8 int32 lanes of 4 products each: unsigned w bytes times signed x bytes (sgn: both signed). */
static inline KQ_ATTR __m256 KQ_NAME(lanes_dot)(__m256i w, __m256i x, bool sgn)
{
    if (sgn) {
        x = _mm256_sign_epi8(x, w);
        w = _mm256_abs_epi8(w);
    }
    return _mm256_cvtepi32_ps(KQ_DOT(w, x));
}

static KQ_ATTR float KQ_NAME(kq_1x1)(const uint8_t *wq, const float *dw, const float *mw, const int8_t *xq, const float *dx,
                         const float *sx, int64_t nb, bool sgn, bool has_min)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(wq + 32 * b));
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[b]), KQ_NAME(lanes_dot)(w, x, sgn), acc);
    }
    float s = hsum8(acc);
    return has_min ? s + minsum_avx2(mw, sx, nb) : s;
}

/* kq_1x1 on a raw legacy-quant row (Q8_0, Q4_0/1, Q5_0/1), each block unpacked in registers instead of
 * through the tile: for decode passes of 1-3 rows the unpack cost as much as two dot products (perf: 51% of
 * a batch-1 token in quant_unpack_q8_row, 22% in kq_1x1).  Same integers, same scales, same fma order and the
 * same block-minimum sum (mw gathered, then minsum_avx2), so the same bits as unpack + kq_1x1. */
static KQ_ATTR float KQ_NAME(kq_1x1_raw)(uint32_t type, const uint8_t *w, size_t bsz, const int8_t *xq, const float *dx,
                             const float *sx, int64_t nb, bool sgn, bool has_min, float *mw)
{
    __m256 acc = _mm256_setzero_ps();
#define KQ_RAW_LOOP(T_)                                                                                                \
    for (int64_t b = 0; b < nb; b++) {                                                                                 \
        float d;                                                                                                       \
        __m256i q = legacy_block_q8(T_, w + (size_t)b * bsz, &d, &mw[b]);                                             \
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));                                               \
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[b]), KQ_NAME(lanes_dot)(q, x, sgn), acc);                                 \
    }
    switch (type) { /* one loop per type: the block layout is a constant inside it */
    case GGML_Q8_0:
        KQ_RAW_LOOP(GGML_Q8_0);
        break;
    case GGML_Q4_0:
        KQ_RAW_LOOP(GGML_Q4_0);
        break;
    case GGML_Q4_1:
        KQ_RAW_LOOP(GGML_Q4_1);
        break;
    case GGML_Q5_0:
        KQ_RAW_LOOP(GGML_Q5_0);
        break;
    default:
        KQ_RAW_LOOP(GGML_Q5_1);
        break;
    }
#undef KQ_RAW_LOOP
    float s = hsum8(acc);
    return has_min ? s + minsum_avx2(mw, sx, nb) : s;
}

/* 1 W row × 4 X rows (x rows at stride xs bytes; their d/s arrays at the same stride). */
static KQ_ATTR void KQ_NAME(kq_1x4)(const uint8_t *wq, const float *dw, const float *mw, const uint8_t *xrow, int64_t xs, int64_t K,
                        int64_t nb, bool sgn, bool has_min, float *y, int64_t ldy)
{
    const int8_t *xq[4];
    const float *dx[4], *sx[4];
    kq_xrows(xrow, xs, K, nb, xq, dx, sx);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t b = 0; b < nb; b++) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(wq + 32 * b));
        float d = dw[b];
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[0][b]),
                             KQ_NAME(lanes_dot)(w, _mm256_loadu_si256((const __m256i *)(xq[0] + 32 * b)), sgn), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[1][b]),
                             KQ_NAME(lanes_dot)(w, _mm256_loadu_si256((const __m256i *)(xq[1] + 32 * b)), sgn), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[2][b]),
                             KQ_NAME(lanes_dot)(w, _mm256_loadu_si256((const __m256i *)(xq[2] + 32 * b)), sgn), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[3][b]),
                             KQ_NAME(lanes_dot)(w, _mm256_loadu_si256((const __m256i *)(xq[3] + 32 * b)), sgn), a3);
    }
    __m256 a[4] = {a0, a1, a2, a3};
    for (int i = 0; i < 4; i++) {
        float s = hsum8(a[i]);
        y[i * ldy] = has_min ? s + minsum_avx2(mw, sx[i], nb) : s;
    }
}


/* 2 W rows × 4 X rows: kq_1x4's arithmetic for each row (the same bits), the X blocks loaded once for both. */
static KQ_ATTR void KQ_NAME(kq_2x4)(const uint8_t *wq, int64_t ws, const uint8_t *xrow, int64_t xs, int64_t K,
                        int64_t nb, bool sgn, bool has_min, float *y, int64_t ldy)
{
    const int8_t *xq[4];
    const float *dx[4], *sx[4];
    kq_xrows(xrow, xs, K, nb, xq, dx, sx);
    const uint8_t *wq1 = wq + ws;
    const float *dw0 = (const float *)(wq + K), *dw1 = (const float *)(wq1 + K);
    __m256 a[2][4];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++)
            a[r][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(wq + 32 * b));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(wq1 + 32 * b));
        float d0 = dw0[b], d1 = dw1[b];
#define KQ_2X4_ROW(i)                                                                                                  \
    do {                                                                                                               \
        __m256i x_ = _mm256_loadu_si256((const __m256i *)(xq[i] + 32 * b));                                           \
        a[0][i] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * dx[i][b]), KQ_NAME(lanes_dot)(w0, x_, sgn), a[0][i]);            \
        a[1][i] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * dx[i][b]), KQ_NAME(lanes_dot)(w1, x_, sgn), a[1][i]);            \
    } while (0)
        KQ_2X4_ROW(0);
        KQ_2X4_ROW(1);
        KQ_2X4_ROW(2);
        KQ_2X4_ROW(3);
#undef KQ_2X4_ROW
    }
    for (int r = 0; r < 2; r++) {
        const float *mw = (r ? dw1 : dw0) + nb;
        for (int i = 0; i < 4; i++) {
            float s = hsum8(a[r][i]);
            y[r + i * ldy] = has_min ? s + minsum_avx2(mw, sx[i], nb) : s;
        }
    }
}

