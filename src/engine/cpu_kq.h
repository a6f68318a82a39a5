/*
 * cpu_kq.h — the 8-bit-activation dot-product kernels of cpu.c, included
 * twice: once for AVX2 (maddubs + madd) and once for AVX-512 VNNI on 256-bit
 * vectors (dpbusd).  The two give the same int32 sums — maddubs never
 * saturates here (4/5-bit weights times 8-bit activations, or |8-bit| pairs:
 * at most 2·127·127 = 32,258 per 16-bit pair) — and everything after the
 * integer dot is the same code, so both produce the same bits.
 *
 * One arithmetic for every 8-bit path (the scalar oracle dotq_scalar in cpu.c, the raw 1-row kernel, the
 * interleaved batched kernel): per 32-block b the exact int32 sum S_b of its 32 products (|S_b| <= 32·127·127
 * < 2^24, exact in fp32), then
 *     acc[b mod 8] = fma(fl(dw_b*dx_b), S_b, acc[b mod 8]);  acc[b mod 8] = fma(mw_b, sx_b, acc[b mod 8]) (minima),
 *     y = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)).
 * The 1-row kernel gets the 8 accumulators as the lanes of one register (8 blocks' dots reduced across lanes to
 * one vector of S_b); the batched kernel holds 8 weight rows interleaved 4 bytes at a time (lane = row, the
 * activation's 4 bytes broadcast), so S_b comes out of 8 dpbusd per block with no reduction and the convert,
 * the scale product, the broadcasts and both fmas are paid once per 8 rows (the previous kernels paid them per
 * row: perf put 75-82% of a batch-64/256 token in them).  Its 8 block-mod-8 accumulators are walked one at a
 * time (blocks j, j+8, …) so only one register per X row is live.  Padding lanes (a group of fewer than 8 rows)
 * hold zeros and are never stored.  Signed weights (Q8_0) use the sign trick on both ISAs.
 * Measured (SmolLM2-135M Q4_1, 2 shared cores, bench_decode --prompt 32, old and new binary back to back; the
 * machine was loaded by other builds, load average 3-8, so only the ratios mean anything): batch 256
 * 43.6 -> 117.3 tok/s (2.7x), batch 64 86.8 -> 111.9 (1.3x); --tokens 16 --prompt 8 at load ~3.7: batch 256
 * 134 -> 286 (2.1x), batch 64 114 -> 182 (1.6x).  Not yet measured against llama.cpp (tools/bench_b4.py).
 *
 * B4 against llama.cpp 0.3.36 (tools/bench_b4.py, 2026-12-04): batch 256 591 tok/s = 5.40x llama.cpp's single-row
 * median once the FFN's activation ran on the pool (4.30x before); single row 0.71-0.77x (this VM's noise is ±20%)
 * once the 1-row kernel folded block pairs as they came (in old/new pairs it had fallen from ~108 to 61-87 tok/s).
 * Tried and not kept: KQ_NX 8 (8 X rows per register block on VNNI's 32 registers): 573-636 against 587-613 tok/s
 * at batch 64 in alternating pairs, within this VM's noise.
 * Next step: the +128 offset for signed weights under VNNI (S = dpbusd(w+128, x) - 128·sum(x), exact; saves the
 * abs/sign pair per dpbusd on Q8_0); for Q4_1 (B4's model) the unpack of the 4-bit nibbles into the interleaved
 * tile, which every pass repeats per weight row — a cached interleaved copy of the weights would skip it when they
 * are resident (the cost is a second copy of the weights in RAM).
 *
 * Expects KQ_ATTR (the target attribute), KQ_NAME(n) (suffixes a name), KQ_DOTACC(acc, w, x) (acc plus 8 int32
 * lanes of 4 u8·s8 products) and KQ_NX (X rows per register block of the batched kernel).  No include guard:
 * it is meant to be included more than once, and only by cpu.c.
 */

/* acc + the 8 int32 lanes of 4 products each: unsigned w bytes times signed x bytes (sgn: both signed). */
static inline KQ_ATTR __m256i KQ_NAME(lanes_acc)(__m256i acc, __m256i w, __m256i x, bool sgn)
{
    if (sgn) {
        x = _mm256_sign_epi8(x, w);
        w = _mm256_abs_epi8(w);
    }
    return KQ_DOTACC(acc, w, x);
}

/* Lane j of the result = the sum of the 8 lanes of p[j] (exact integer adds). */
static inline KQ_ATTR __m256i KQ_NAME(reduce8)(const __m256i p[8])
{
    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i lo = _mm256_hadd_epi32(h01, h23), hi = _mm256_hadd_epi32(h45, h67); /* per 128-bit half: p0..p3 | p4..p7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* One raw legacy-quant weight row (Q8_0, Q4_0/1, Q5_0/1) · one 8-bit X row, each block unpacked in registers
 * (no tile): the decode passes of 1-3 rows.  Eight blocks at a time: their dots reduced to one vector of S_b,
 * then the file comment's arithmetic with lane = block mod 8; the last partial group's missing lanes get
 * fma(0, 0, acc) = acc (an accumulator is never -0: it starts at +0 and round-to-nearest sums give +0). */
static KQ_ATTR float KQ_NAME(kq_1x1_raw)(uint32_t type, const uint8_t *w, size_t bsz, const int8_t *xq, const float *dx,
                                         const float *sx, int64_t nb, bool sgn, bool has_min)
{
    __m256 acc = _mm256_setzero_ps();
    /* Whole groups of 8 blocks without branches, each pair of blocks' lanes folded (hadd) as soon as both exist,
     * so 4 vectors are live instead of 8 (AVX2 has 16 registers: the 8-vector form spilled, and single-row decode
     * fell from ~105 to ~80 tok/s on SmolLM2).  The integer adds are exact in any order: the same S_b, the same
     * bits.  dx and sx of a group are contiguous: loaded, not copied.  The last partial group takes the general
     * loop after it. */
#define KQ_RAW_PAIR(T_, j)                                                                                             \
    KQ_NAME(lanes_acc)(_mm256_setzero_si256(), legacy_block_q8(T_, w + (size_t)(b0 + (j)) * bsz, &d[j], &m[j]),       \
                       _mm256_loadu_si256((const __m256i *)(xq + 32 * (b0 + (j)))), sgn)
#define KQ_RAW_LOOP8(T_)                                                                                               \
    for (; b0 + 8 <= nb; b0 += 8) {                                                                                    \
        float d[8], m[8];                                                                                              \
        __m256i p0 = KQ_RAW_PAIR(T_, 0), p1 = KQ_RAW_PAIR(T_, 1);                                                       \
        __m256i h01 = _mm256_hadd_epi32(p0, p1);                                                                       \
        p0 = KQ_RAW_PAIR(T_, 2), p1 = KQ_RAW_PAIR(T_, 3);                                                              \
        __m256i lo = _mm256_hadd_epi32(h01, _mm256_hadd_epi32(p0, p1));                                                \
        p0 = KQ_RAW_PAIR(T_, 4), p1 = KQ_RAW_PAIR(T_, 5);                                                              \
        __m256i h45 = _mm256_hadd_epi32(p0, p1);                                                                       \
        p0 = KQ_RAW_PAIR(T_, 6), p1 = KQ_RAW_PAIR(T_, 7);                                                              \
        __m256i hi = _mm256_hadd_epi32(h45, _mm256_hadd_epi32(p0, p1));                                                \
        __m256 s = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),                        \
                                                       _mm256_permute2x128_si256(lo, hi, 0x31)));                      \
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(d), _mm256_loadu_ps(dx + b0)), s, acc);                    \
        if (has_min)                                                                                                   \
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(m), _mm256_loadu_ps(sx + b0), acc);                                  \
    }
    int64_t b0 = 0;
#define KQ_RAW_LOOP(T_)                                                                                                \
    KQ_RAW_LOOP8(T_)                                                                                                   \
    for (; b0 < nb; b0 += 8) {                                                                                         \
        int n = nb - b0 < 8 ? (int)(nb - b0) : 8;                                                                      \
        __m256i p[8];                                                                                                  \
        float d[8] = {0}, m[8] = {0}, ex[8] = {0}, es[8] = {0};                                                        \
        for (int j = 0; j < 8; j++) {                                                                                  \
            if (j < n) {                                                                                               \
                __m256i q = legacy_block_q8(T_, w + (size_t)(b0 + j) * bsz, &d[j], &m[j]);                           \
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * (b0 + j)));                                \
                p[j] = KQ_NAME(lanes_acc)(_mm256_setzero_si256(), q, x, sgn);                                          \
                ex[j] = dx[b0 + j];                                                                                    \
                es[j] = sx[b0 + j];                                                                                    \
            } else {                                                                                                   \
                p[j] = _mm256_setzero_si256();                                                                         \
            }                                                                                                          \
        }                                                                                                              \
        __m256 s = _mm256_cvtepi32_ps(KQ_NAME(reduce8)(p));                                                            \
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(d), _mm256_loadu_ps(ex)), s, acc);                        \
        if (has_min)                                                                                                   \
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(m), _mm256_loadu_ps(es), acc);                                       \
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
#undef KQ_RAW_LOOP8
#undef KQ_RAW_PAIR
    return hsum8(acc);
}

/* 8 interleaved weight rows (kq_group layout, cpu.c) × nx X rows (stride xs bytes, each q[K], d[nb], s[nb]):
 * y[i*ldy + r] for r < nr.  nx, sgn and has_min are constants at each call site (the wrappers below), so the
 * loops over nx unroll, the accumulators stay in registers and the branches fold. */
static inline __attribute__((always_inline)) KQ_ATTR void
KQ_NAME(kq_8xn)(const uint8_t *wi, const uint8_t *xrow, int64_t xs, int64_t K, int64_t nb, const bool sgn,
                const bool has_min, float *y, int64_t ldy, int nr, const int nx)
{
    const float *dw = (const float *)(wi + 256 * nb), *mw = dw + 8 * nb;
    const int8_t *xq[KQ_NX];
    const float *dx[KQ_NX], *sx[KQ_NX];
    for (int i = 0; i < nx; i++) {
        xq[i] = (const int8_t *)(xrow + i * xs);
        dx[i] = (const float *)(xrow + i * xs + K);
        sx[i] = dx[i] + nb;
    }
    __m256 part[KQ_NX][8];
    for (int j = 0; j < 8; j++) {
        __m256 a[KQ_NX];
#pragma GCC unroll 8
        for (int i = 0; i < nx; i++)
            a[i] = _mm256_setzero_ps();
        for (int64_t b = j; b < nb; b += 8) {
            const uint8_t *wb = wi + 256 * b;
            __m256i s[KQ_NX];
#pragma GCC unroll 8
            for (int i = 0; i < nx; i++)
                s[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * g));
#pragma GCC unroll 8
                for (int i = 0; i < nx; i++) {
                    int32_t x4;
                    memcpy(&x4, xq[i] + 32 * b + 4 * g, 4);
                    s[i] = KQ_NAME(lanes_acc)(s[i], w, _mm256_set1_epi32(x4), sgn);
                }
            }
            __m256 d = _mm256_loadu_ps(dw + 8 * b);
#pragma GCC unroll 8
            for (int i = 0; i < nx; i++) {
                a[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx[i][b])), _mm256_cvtepi32_ps(s[i]), a[i]);
                if (has_min)
                    a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(mw + 8 * b), _mm256_set1_ps(sx[i][b]), a[i]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < nx; i++)
            part[i][j] = a[i];
    }
    for (int i = 0; i < nx; i++) {
        const __m256 *p = part[i];
        __m256 r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[4]), _mm256_add_ps(p[2], p[6])),
                                 _mm256_add_ps(_mm256_add_ps(p[1], p[5]), _mm256_add_ps(p[3], p[7])));
        if (nr == 8) {
            _mm256_storeu_ps(y + i * ldy, r);
        } else {
            float o[8];
            _mm256_storeu_ps(o, r);
            memcpy(y + i * ldy, o, sizeof(float) * (size_t)nr);
        }
    }
}

/* kq_8xn for a full register block of KQ_NX X rows, and for one X row (the batch's last T mod KQ_NX rows);
 * each instantiated per (sgn, has_min). */
#define KQ_8XN_CALL(nx_)                                                                                               \
    do {                                                                                                               \
        if (sgn && !has_min)                                                                                           \
            KQ_NAME(kq_8xn)(wi, xrow, xs, K, nb, true, false, y, ldy, nr, nx_);                                        \
        else if (!sgn && has_min)                                                                                      \
            KQ_NAME(kq_8xn)(wi, xrow, xs, K, nb, false, true, y, ldy, nr, nx_);                                        \
        else if (sgn)                                                                                                  \
            KQ_NAME(kq_8xn)(wi, xrow, xs, K, nb, true, true, y, ldy, nr, nx_);                                         \
        else                                                                                                           \
            KQ_NAME(kq_8xn)(wi, xrow, xs, K, nb, false, false, y, ldy, nr, nx_);                                       \
    } while (0)

static KQ_ATTR void KQ_NAME(kq_8xN)(const uint8_t *wi, const uint8_t *xrow, int64_t xs, int64_t K, int64_t nb, bool sgn,
                                   bool has_min, float *y, int64_t ldy, int nr)
{
    KQ_8XN_CALL(KQ_NX);
}

static KQ_ATTR void KQ_NAME(kq_8x1)(const uint8_t *wi, const uint8_t *xrow, int64_t xs, int64_t K, int64_t nb, bool sgn,
                                   bool has_min, float *y, int64_t ldy, int nr)
{
    KQ_8XN_CALL(1);
}
#undef KQ_8XN_CALL
