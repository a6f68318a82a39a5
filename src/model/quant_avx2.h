/*
 * quant_avx2.h — AVX2 helpers for the legacy 32-element quant blocks, shared
 * by quant.c (dequantization, the 8-bit integer view) and cpu.c (the fused
 * decode dot product), so both read a block through the same instructions.
 * Private to those two files; every function is static inline and compiled
 * for avx2,fma,f16c (callers check quant_simd_active() first).
 */
#ifndef SPILL_QUANT_AVX2_H
#define SPILL_QUANT_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"

#define QSIMD __attribute__((target("avx2,fma,f16c")))

static inline QSIMD float rd_half_v(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0-15), then high nibbles (16-31). */
static inline QSIMD __m256i unpack_nibbles16(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
    return _mm256_set_m128i(hi, lo);
}

/* 32 bits -> 32 bytes, 0xFF where bit j is set (llama.cpp's bytes_from_bits_32). */
static inline QSIMD __m256i bits_to_bytes32(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* The 32 integers of one legacy block in element order (Q8_0 signed, the others unsigned), its scale d and
 * the offset m with value = d * q + m (quant_unpack_q8_row's dw / mw). */
static inline QSIMD __m256i legacy_block_q8(uint32_t type, const uint8_t *b, float *d, float *m)
{
    *d = rd_half_v(b);
    switch (type) {
    case GGML_Q8_0:
        *m = 0;
        return _mm256_loadu_si256((const __m256i *)(b + 2));
    case GGML_Q4_0:
        *m = -8.0f * *d;
        return unpack_nibbles16(b + 2);
    case GGML_Q4_1:
        *m = rd_half_v(b + 2);
        return unpack_nibbles16(b + 4);
    case GGML_Q5_0:
        *m = -16.0f * *d;
        return _mm256_or_si256(unpack_nibbles16(b + 6), _mm256_and_si256(bits_to_bytes32(b + 2), _mm256_set1_epi8(0x10)));
    default: /* Q5_1 */
        *m = rd_half_v(b + 2);
        return _mm256_or_si256(unpack_nibbles16(b + 8), _mm256_and_si256(bits_to_bytes32(b + 4), _mm256_set1_epi8(0x10)));
    }
}

#endif
