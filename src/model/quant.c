/*
 * quant.c — weight element types: block layouts, row dequantization (scalar
 * reference + AVX2/F16C), fp16/bf16 conversions.
 *
 * Owns: the byte layout of each supported type (below) and the exact
 * arithmetic that turns it into fp32.  Does not own: matrix products (cpu.c)
 * or which tensors use which type (the loaders).
 *
 * Byte layouts (little-endian; `half` = IEEE binary16; a block covers QK=32 or
 * QK_K=256 consecutive elements along the row, ne[0]):
 *   F32  float                                        1 elem,    4 B
 *   F16  half                                         1 elem,    2 B
 *   BF16 bfloat16                                     1 elem,    2 B
 *   Q8_0 half d; i8 qs[32]                           32 elems,  34 B  y = qs*d
 *   Q4_0 half d; u8 qs[16]                           32 elems,  18 B  y = (nib-8)*d
 *   Q4_1 half d, m; u8 qs[16]                        32 elems,  20 B  y = nib*d + m
 *   Q5_0 half d; u8 qh[4]; u8 qs[16]                 32 elems,  22 B  y = (nib|hbit<<4 - 16)*d
 *   Q5_1 half d, m; u8 qh[4]; u8 qs[16]              32 elems,  24 B  y = (nib|hbit<<4)*d + m
 *   Q4_K half d, dmin; u8 scales[12]; u8 qs[128]    256 elems, 144 B
 *   Q5_K half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]  256 elems, 176 B
 *   Q6_K u8 ql[128]; u8 qh[64]; i8 scales[16]; half d        256 elems, 210 B
 *   Q8_K f32 d; i8 qs[256]; i16 bsums[16]           256 elems, 292 B  y = d*qs
 *   F8_E4M3 (spill's GGML_F8_E4M3_ROW) f32 s; 12 zero bytes; u8 e4m3[K]   one row, 16 + K B  y = s*e4m3
 * In the 32-element types, qs[j] holds element j in its low nibble and
 * element j+16 in its high nibble; qh bit j is element j's fifth bit.  The
 * K-quant sub-block scales follow ggml's get_scale_min_k4 (see dq_q4_k).
 *
 * Key decision: every value is computed with the operations of ggml-quants.c
 * / gguf-py in their order (e.g. Q4_K: (d*sc)*q - dmin*m, two roundings,
 * never an FMA).  The SIMD code issues the same operations lane-wise, so it
 * is bit-identical to the scalar code and to the Python reference; the
 * project builds with -std=c11, under which GCC does not contract a*b+c into
 * an FMA (tests/test_quant.c would catch it if that ever changed).
 */
#include "quant.h"
#include "quant_avx2.h"

#include "gguf.h"
#include "../base/util.h"

#include <cpuid.h>
#include <math.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define QK_K 256

/* ---------------------------------------------------------------- fp16 / bf16 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float quant_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
    if (mant == 0)
        return bits_f32(sign);
    /* subnormal: normalise so the leading 1 lands on bit 10 */
    uint32_t e = 113;
    while (!(mant & 0x400)) {
        mant <<= 1;
        e--;
    }
    return bits_f32(sign | (e << 23) | ((mant & 0x3ff) << 13));
}

uint16_t quant_fp32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return sign | 0x7e00;                 /* NaN stays a (quiet) NaN */
    if (x >= 0x477ff000u)
        return sign | 0x7c00;                 /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                    /* below 2^-14: half subnormal or zero */
        uint32_t e = x >> 23;
        if (e < 102)
            return sign;                      /* < 2^-25: rounds to zero */
        uint32_t mant = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;             /* 14..24 */
        uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return sign | (uint16_t)r;
    }
    uint32_t h = (((x >> 23) - 112) << 10) | ((x & 0x7fffffu) >> 13);
    uint32_t rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;                                  /* carry into the exponent is correct */
    return sign | (uint16_t)h;
}

float quant_bf16_to_fp32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

/* ---------------------------------------------------------------- e4m3 */

float quant_e4m3_to_fp32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return bits_f32(sign | 0x7fc00000u);
    if (e == 0) /* subnormal: m * 2^-9, exact in fp32 */
        return bits_f32(sign | f32_bits((float)m * 0x1p-9f));
    return bits_f32(sign | ((e + 120) << 23) | (m << 20));
}

uint8_t quant_fp32_to_e4m3(float f)
{
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return sign | 0x7f;
    if (x >= 0x43e00000u) /* >= 448 (inf included): saturate; 448 < |x| < 464 would round to 448 anyway */
        return sign | 0x7e;
    if (x < 0x3c800000u) { /* below 2^-6: a subnormal m * 2^-9 (m = 8 is 2^-6, code 0x08, the first normal) */
        float v = bits_f32(x) * 0x1p9f; /* exact: a power-of-two scaling */
        float r = v - floorf(v);
        int m = (int)floorf(v);
        if (r > 0.5f || (r == 0.5f && (m & 1)))
            m++;
        return sign | (uint8_t)m;
    }
    uint32_t code = ((((x >> 23) - 120) << 3) | ((x >> 20) & 7)), rem = x & 0xfffff;
    if (rem > 0x80000 || (rem == 0x80000 && (code & 1)))
        code++; /* a carry into the exponent is correct; 447.99.. rounds to 0x7e = 448 at most */
    return sign | (uint8_t)code;
}

/* The 256 decoded codes, built once (pthread_once: engines decode from several threads). */
static float e4m3_tab[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static void e4m3_init(void)
{
    for (int c = 0; c < 256; c++)
        e4m3_tab[c] = quant_e4m3_to_fp32((uint8_t)c);
}

/* fp8 rows: the scale header, then the codes; y = e4m3 * s, one rounding. */
static void dq_f8_row(const uint8_t *p, float *dst, int64_t n)
{
    pthread_once(&e4m3_once, e4m3_init);
    float s;
    memcpy(&s, p, 4);
    for (int64_t i = 0; i < n; i++)
        dst[i] = e4m3_tab[p[16 + i]] * s;
}

uint16_t quant_fp32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

static inline float rd_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return quant_fp16_to_fp32(h);
}

/* ---------------------------------------------------------------- type table */

typedef void (*dq_block_fn)(const uint8_t *blk, float *y);

typedef struct {
    uint32_t type;
    const char *name;
    int64_t elems;
    size_t bytes;
} type_info;

static const type_info TYPES[] = {
    {GGML_F32, "F32", 1, 4},       {GGML_F16, "F16", 1, 2},       {GGML_BF16, "BF16", 1, 2},
    {GGML_Q8_0, "Q8_0", QK, 34},   {GGML_Q4_0, "Q4_0", QK, 18},   {GGML_Q4_1, "Q4_1", QK, 20},
    {GGML_Q5_0, "Q5_0", QK, 22},   {GGML_Q5_1, "Q5_1", QK, 24},   {GGML_Q4_K, "Q4_K", QK_K, 144},
    {GGML_Q5_K, "Q5_K", QK_K, 176}, {GGML_Q6_K, "Q6_K", QK_K, 210}, {GGML_Q8_K, "Q8_K", QK_K, 292},
    {GGML_F8_E4M3_ROW, "F8_E4M3", 16, 16}, /* plus the 16-byte row header (ggml_type_row_extra) */
};

static const type_info *find_type(uint32_t type)
{
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].type == type)
            return &TYPES[i];
    return NULL;
}

bool quant_type_supported(uint32_t type) { return find_type(type) != NULL; }
const char *quant_type_name(uint32_t type) { const type_info *t = find_type(type); return t ? t->name : "?"; }
int64_t quant_block_elems(uint32_t type) { const type_info *t = find_type(type); return t ? t->elems : 0; }
size_t quant_block_bytes(uint32_t type) { const type_info *t = find_type(type); return t ? t->bytes : 0; }

int quant_row_bytes(uint32_t type, int64_t n_elems, size_t *out)
{
    const type_info *t = find_type(type);
    if (!t || n_elems < 0 || n_elems % t->elems != 0)
        return -1;
    uint64_t b;
    if (!ck_mul_u64((uint64_t)(n_elems / t->elems), t->bytes, &b) || !ck_add_u64(b, ggml_type_row_extra(type), &b) ||
        b > SIZE_MAX)
        return -1;
    *out = (size_t)b;
    return 0;
}

/* ---------------------------------------------------------------- scalar reference */

static void dq_q8_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++)
        y[j] = (float)qs[j] * d;
}

static void dq_q4_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0xF) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void dq_q4_1(const uint8_t *b, float *y)
{
    float d = rd_half(b), m = rd_half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0xF) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static void dq_q5_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
        int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

static void dq_q5_1(const uint8_t *b, float *y)
{
    float d = rd_half(b), m = rd_half(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (int)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
        int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* ggml get_scale_min_k4: 8 six-bit (scale, min) pairs packed in 12 bytes. */
static inline void scale_min_k4(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void dq_q4_k(const uint8_t *b, float *y)
{
    float d = rd_half(b), dmin = rd_half(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int c = 0; c < 4; c++, q += 32, y += 64) {
        int sc, m;
        scale_min_k4(2 * c, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * c + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            y[l] = d1 * (float)(q[l] & 0xF) - m1;
            y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dq_q5_k(const uint8_t *b, float *y)
{
    float d = rd_half(b), dmin = rd_half(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *q = b + 48;
    for (int c = 0; c < 4; c++, q += 32, y += 64) {
        int sc, m;
        uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
        scale_min_k4(2 * c, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * c + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            y[l] = d1 * (float)((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            y[l + 32] = d2 * (float)((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void dq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = rd_half(b + 208);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

static void dq_q8_k(const uint8_t *b, float *y)
{
    float d;
    memcpy(&d, b, 4);
    const int8_t *qs = (const int8_t *)(b + 4);
    for (int j = 0; j < QK_K; j++)
        y[j] = d * (float)qs[j];
}

static dq_block_fn scalar_block_fn(uint32_t type)
{
    switch (type) {
    case GGML_Q8_0: return dq_q8_0;
    case GGML_Q4_0: return dq_q4_0;
    case GGML_Q4_1: return dq_q4_1;
    case GGML_Q5_0: return dq_q5_0;
    case GGML_Q5_1: return dq_q5_1;
    case GGML_Q4_K: return dq_q4_k;
    case GGML_Q5_K: return dq_q5_k;
    case GGML_Q6_K: return dq_q6_k;
    case GGML_Q8_K: return dq_q8_k;
    default: return NULL;
    }
}

int quant_dequant_row_scalar(uint32_t type, const void *src, float *dst, int64_t n)
{
    const type_info *t = find_type(type);
    if (!t || n < 0 || n % t->elems != 0)
        return -1;
    const uint8_t *p = src;
    switch (type) {
    case GGML_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case GGML_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = quant_fp16_to_fp32(h);
        }
        return 0;
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = quant_bf16_to_fp32(h);
        }
        return 0;
    case GGML_F8_E4M3_ROW:
        dq_f8_row(p, dst, n);
        return 0;
    default: {
        dq_block_fn fn = scalar_block_fn(type);
        for (int64_t i = 0; i < n / t->elems; i++)
            fn(p + (size_t)i * t->bytes, dst + i * t->elems);
        return 0;
    }
    }
}

/* ---------------------------------------------------------------- AVX2 / F16C */

#define SIMD __attribute__((target("avx2,fma,f16c")))

/* fp16 scale via F16C: exact like quant_fp16_to_fp32, and it keeps SIMD code
 * free of calls into non-VEX code (which costs state transitions on Intel). */
/* 32 signed bytes -> 4 vectors of 8 floats, in element order. */
static inline SIMD void i8x32_to_ps(__m256i v, __m256 o[4])
{
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    o[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    o[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    o[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    o[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

/* y[0..32) = q*d */
static inline SIMD void st_mul(float *y, __m256i q, __m256 d)
{
    __m256 f[4];
    i8x32_to_ps(q, f);
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(f[i], d));
}

/* y[0..32) = q*d + m (two roundings, as the reference) */
static inline SIMD void st_mul_add(float *y, __m256i q, __m256 d, __m256 m)
{
    __m256 f[4];
    i8x32_to_ps(q, f);
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(f[i], d), m));
}

/* y[0..32) = d*q - m */
static inline SIMD void st_mul_sub(float *y, __m256i q, __m256 d, __m256 m)
{
    __m256 f[4];
    i8x32_to_ps(q, f);
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_sub_ps(_mm256_mul_ps(d, f[i]), m));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high nibbles (16..31). */
static SIMD void dqv_q8_0(const uint8_t *b, float *y)
{
    st_mul(y, _mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_ps(rd_half_v(b)));
}

static SIMD void dqv_q4_0(const uint8_t *b, float *y)
{
    __m256i q = _mm256_sub_epi8(unpack_nibbles16(b + 2), _mm256_set1_epi8(8));
    st_mul(y, q, _mm256_set1_ps(rd_half_v(b)));
}

static SIMD void dqv_q4_1(const uint8_t *b, float *y)
{
    st_mul_add(y, unpack_nibbles16(b + 4), _mm256_set1_ps(rd_half_v(b)), _mm256_set1_ps(rd_half_v(b + 2)));
}

static SIMD void dqv_q5_0(const uint8_t *b, float *y)
{
    __m256i hb = _mm256_and_si256(bits_to_bytes32(b + 2), _mm256_set1_epi8(0x10));
    __m256i q = _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles16(b + 6), hb), _mm256_set1_epi8(16));
    st_mul(y, q, _mm256_set1_ps(rd_half_v(b)));
}

static SIMD void dqv_q5_1(const uint8_t *b, float *y)
{
    __m256i hb = _mm256_and_si256(bits_to_bytes32(b + 4), _mm256_set1_epi8(0x10));
    __m256i q = _mm256_or_si256(unpack_nibbles16(b + 8), hb);
    st_mul_add(y, q, _mm256_set1_ps(rd_half_v(b)), _mm256_set1_ps(rd_half_v(b + 2)));
}

/* Shared by Q4_K and Q5_K: qh == NULL for Q4_K. */
static inline SIMD void dqv_k45(const uint8_t *b, const uint8_t *qh, const uint8_t *q, float *y)
{
    float d = rd_half_v(b), dmin = rd_half_v(b + 2);
    const uint8_t *scales = b + 4;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++, q += 32, y += 64) {
        int sc, m;
        scale_min_k4(2 * c, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(2 * c + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        __m256i v = _mm256_loadu_si256((const __m256i *)q);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (qh) {
            __m256i u1 = _mm256_set1_epi8((char)(1 << (2 * c))), u2 = _mm256_set1_epi8((char)(2 << (2 * c)));
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, u1), u1), b16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, u2), u2), b16));
        }
        st_mul_sub(y, lo, _mm256_set1_ps(d1), _mm256_set1_ps(m1));
        st_mul_sub(y + 32, hi, _mm256_set1_ps(d2), _mm256_set1_ps(m2));
    }
}

static SIMD void dqv_q4_k(const uint8_t *b, float *y) { dqv_k45(b, NULL, b + 16, y); }
static SIMD void dqv_q5_k(const uint8_t *b, float *y) { dqv_k45(b, b + 16, b + 48, y); }

/* 32 six-bit values scaled in two halves of 16: y = (d*sc_a)*q for 0..15, (d*sc_b)*q for 16..31. */
static inline SIMD void st_q6(float *y, __m256i q, float d, int8_t sa, int8_t sb)
{
    __m256 f[4];
    i8x32_to_ps(q, f);
    __m256 da = _mm256_set1_ps(d * (float)sa), db = _mm256_set1_ps(d * (float)sb);
    _mm256_storeu_ps(y, _mm256_mul_ps(da, f[0]));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(da, f[1]));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(db, f[2]));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(db, f[3]));
}

static SIMD void dqv_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = rd_half_v(b + 208);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03), m30 = _mm256_set1_epi8(0x30),
                  o32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i hv = _mm256_loadu_si256((const __m256i *)qh);
        /* the 16-bit shifts move bits across byte boundaries; the byte masks remove them */
        __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hv, m3), 4));
        __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30));
        __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hv, m30));
        __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30));
        st_q6(y, _mm256_sub_epi8(q1, o32), d, sc[0], sc[1]);
        st_q6(y + 32, _mm256_sub_epi8(q2, o32), d, sc[2], sc[3]);
        st_q6(y + 64, _mm256_sub_epi8(q3, o32), d, sc[4], sc[5]);
        st_q6(y + 96, _mm256_sub_epi8(q4, o32), d, sc[6], sc[7]);
    }
}

static SIMD void dqv_q8_k(const uint8_t *b, float *y)
{
    float d;
    memcpy(&d, b, 4);
    __m256 dv = _mm256_set1_ps(d);
    for (int i = 0; i < QK_K / 32; i++) {
        __m256 f[4];
        i8x32_to_ps(_mm256_loadu_si256((const __m256i *)(b + 4 + 32 * i)), f);
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(y + 32 * i + 8 * k, _mm256_mul_ps(dv, f[k]));
    }
}

static SIMD void dqv_f16(const uint8_t *p, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = quant_fp16_to_fp32(h);
    }
}

static SIMD void dqv_bf16(const uint8_t *p, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = quant_bf16_to_fp32(h);
    }
}

static dq_block_fn simd_block_fn(uint32_t type)
{
    switch (type) {
    case GGML_Q8_0: return dqv_q8_0;
    case GGML_Q4_0: return dqv_q4_0;
    case GGML_Q4_1: return dqv_q4_1;
    case GGML_Q5_0: return dqv_q5_0;
    case GGML_Q5_1: return dqv_q5_1;
    case GGML_Q4_K: return dqv_q4_k;
    case GGML_Q5_K: return dqv_q5_k;
    case GGML_Q6_K: return dqv_q6_k;
    case GGML_Q8_K: return dqv_q8_k;
    default: return NULL;
    }
}

/* Q4_K/Q5_K integers of one super-block: chunk c gives low nibbles (group 2c) then high nibbles (group 2c+1). */
static SIMD void q8v_k45_avx2(const uint8_t *qh, const uint8_t *qs, uint8_t *q)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++, qs += 32, q += 64) {
        __m256i v = _mm256_loadu_si256((const __m256i *)qs);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (qh) {
            __m256i u1 = _mm256_set1_epi8((char)(1 << (2 * c))), u2 = _mm256_set1_epi8((char)(2 << (2 * c)));
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, u1), u1), b16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, u2), u2), b16));
        }
        _mm256_storeu_si256((__m256i *)q, lo);
        _mm256_storeu_si256((__m256i *)(q + 32), hi);
    }
}

/* ---------------------------------------------------------------- dispatch */

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static bool simd_avail, simd_on;

static void simd_init(void)
{
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c";
     * the avx2 test also covers the OS saving YMM state */
    unsigned a, b, c = 0, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    simd_avail = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    simd_on = simd_avail; /* main() turns it off for SPILL_NO_SIMD=1 (base/settings.h) */
}

bool quant_simd_available(void) { pthread_once(&simd_once, simd_init); return simd_avail; }
bool quant_simd_active(void) { pthread_once(&simd_once, simd_init); return simd_on; }

bool quant_simd_force(bool on)
{
    pthread_once(&simd_once, simd_init);
    simd_on = on && simd_avail;
    return simd_on;
}

int quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    if (!quant_simd_active())
        return quant_dequant_row_scalar(type, src, dst, n);
    const type_info *t = find_type(type);
    if (!t || n < 0 || n % t->elems != 0)
        return -1;
    const uint8_t *p = src;
    switch (type) {
    case GGML_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case GGML_F16:
        dqv_f16(p, dst, n);
        return 0;
    case GGML_BF16:
        dqv_bf16(p, dst, n);
        return 0;
    case GGML_F8_E4M3_ROW: /* a table-free scalar decode: the same bits either way */
        dq_f8_row(p, dst, n);
        return 0;
    default: {
        dq_block_fn fn = simd_block_fn(type);
        for (int64_t i = 0; i < n / t->elems; i++)
            fn(p + (size_t)i * t->bytes, dst + i * t->elems);
        return 0;
    }
    }
}

/* ---------------------------------------------------------------- integer view (8-bit-activation matmul) */

bool quant_q8_supported(uint32_t type)
{
    switch (type) {
    case GGML_Q8_0: case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K:
        return true;
    default:
        return false;
    }
}

bool quant_q8_signed(uint32_t type) { return type == GGML_Q8_0; }

/* Scalar: the 32 small integers of one legacy block (elements in order). */
static void q8v_legacy_scalar(uint32_t type, const uint8_t *b, uint8_t *q)
{
    switch (type) {
    case GGML_Q8_0:
        memcpy(q, b + 2, 32);
        return;
    case GGML_Q4_0: case GGML_Q4_1: {
        const uint8_t *qs = b + (type == GGML_Q4_0 ? 2 : 4);
        for (int j = 0; j < 16; j++) {
            q[j] = qs[j] & 0xF;
            q[j + 16] = qs[j] >> 4;
        }
        return;
    }
    default: { /* Q5_0, Q5_1 */
        const uint8_t *qhp = b + (type == GGML_Q5_0 ? 2 : 4), *qs = qhp + 4;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
            q[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        }
        return;
    }
    }
}

static SIMD void q8v_legacy_avx2(uint32_t type, const uint8_t *b, uint8_t *q)
{
    float d, m;
    _mm256_storeu_si256((__m256i *)q, legacy_block_q8(type, b, &d, &m));
}

/* Legacy (32-element) blocks: scales, and the integers via `blk` (scalar or AVX2). */
#define Q8V_LEGACY_ROW(NAME, ATTR, HALF, BLK)                                                                          \
    static ATTR void NAME(uint32_t type, const uint8_t *p, int64_t nb, size_t bytes, uint8_t *q, float *dw,          \
                          float *mw)                                                                                 \
    {                                                                                                                \
        for (int64_t i = 0; i < nb; i++, p += bytes, q += 32) {                                                      \
            float d = HALF(p);                                                                                       \
            dw[i] = d;                                                                                               \
            switch (type) {                                                                                          \
            case GGML_Q8_0: mw[i] = 0; break;                                                                        \
            case GGML_Q4_0: mw[i] = -8.0f * d; break;                                                                \
            case GGML_Q5_0: mw[i] = -16.0f * d; break;                                                               \
            default: mw[i] = HALF(p + 2); break; /* Q4_1, Q5_1: the block minimum */                                 \
            }                                                                                                        \
            BLK(type, p, q);                                                                                         \
        }                                                                                                            \
    }

Q8V_LEGACY_ROW(q8v_legacy_row_scalar, , rd_half, q8v_legacy_scalar)
Q8V_LEGACY_ROW(q8v_legacy_row_avx2, SIMD, rd_half_v, q8v_legacy_avx2)

/* One K-quant super-block (256 elements, 8 groups of 32); qh NULL for Q4_K. */
static void q8v_k45(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, uint8_t *q, float *dw, float *mw,
                    bool simd)
{
    float d = rd_half(b), dmin = rd_half(b + 2);
    for (int g = 0; g < 8; g++) {
        int sc, m;
        scale_min_k4(g, b + 4, &sc, &m);
        dw[g] = d * (float)sc;
        mw[g] = -(dmin * (float)m);
    }
    if (simd) {
        q8v_k45_avx2(qh, qs, q);
        return;
    }
    for (int c = 0; c < 4; c++, qs += 32, q += 64) {
        for (int l = 0; l < 32; l++) {
            q[l] = (uint8_t)((qs[l] & 0xF) + (qh && (qh[l] >> (2 * c)) & 1 ? 16 : 0));
            q[l + 32] = (uint8_t)((qs[l] >> 4) + (qh && (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0));
        }
    }
}

int quant_unpack_q8_row(uint32_t type, const void *src, int64_t n, uint8_t *q, float *dw, float *mw)
{
    const type_info *t = find_type(type);
    if (!t || !quant_q8_supported(type) || n < 0 || n % t->elems != 0)
        return -1;
    bool simd = quant_simd_active();
    const uint8_t *p = src;
    int64_t nb = n / t->elems;
    if (type == GGML_Q4_K || type == GGML_Q5_K) {
        for (int64_t i = 0; i < nb; i++, p += t->bytes, q += 256, dw += 8, mw += 8)
            q8v_k45(p, type == GGML_Q5_K ? p + 16 : NULL, p + (type == GGML_Q5_K ? 48 : 16), q, dw, mw, simd);
        return 0;
    }
    if (simd)
        q8v_legacy_row_avx2(type, p, nb, t->bytes, q, dw, mw);
    else
        q8v_legacy_row_scalar(type, p, nb, t->bytes, q, dw, mw);
    return 0;
}
