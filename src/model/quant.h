/*
 * quant.h — weight element types: sizes, row dequantization, fp16/bf16.
 *
 * Owns the byte layout of every weight dtype spill reads from a file (F32,
 * F16, BF16, the GGUF block types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K, Q8_K, and spill's fp8 rows GGML_F8_E4M3_ROW; ids are enum
 * ggml_type in gguf.h), the OCP E4M3FN element codec, and turns one row of
 * any of them into fp32.  It does not multiply anything (cpu.c does) and it
 * never expands a whole tensor: callers dequantize a row or a tile at a time.
 *
 * Every dequantized value is produced with exactly the arithmetic of ggml's
 * reference C code and gguf-py's numpy code (same operations, same order, one
 * IEEE rounding per operation, no fused multiply-add), so the scalar path and
 * the AVX2 path give bit-identical fp32 values (tests/test_quant.c checks it).
 */
#ifndef SPILL_QUANT_H
#define SPILL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True for the types this file can dequantize. */
bool quant_type_supported(uint32_t type);

/* "Q4_K", "F16", …; "?" for an unsupported type. */
const char *quant_type_name(uint32_t type);

/* Elements per block (1 for F32/F16/BF16, 32 or 256 for block types) and
 * bytes per block; both 0 for an unsupported type. */
int64_t quant_block_elems(uint32_t type);
size_t quant_block_bytes(uint32_t type);

/* Bytes taken by a row of n_elems elements of `type` (GGML_F8_E4M3_ROW: 16 + n_elems, its scale header
 * included).  Returns 0, or -1 when the type is unsupported, n_elems < 0, n_elems is not a multiple of the
 * block size, or the size overflows. */
int quant_row_bytes(uint32_t type, int64_t n_elems, size_t *out);

/*
 * Dequantizes n elements (one row or part of one; n a multiple of the block
 * size; GGML_F8_E4M3_ROW: src is the row's start, its header, and the first
 * n elements are decoded) from src into dst (n floats).  Returns 0, or -1 when the type is
 * unsupported or n is not a whole number of blocks.  Uses AVX2/F16C when
 * quant_simd_active(); the result is bit-identical either way.
 */
int quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* The scalar reference of quant_dequant_row (the oracle the SIMD code is tested against). */
int quant_dequant_row_scalar(uint32_t type, const void *src, float *dst, int64_t n);

/*
 * Integer view of a row, for the matmul's 8-bit-activation path (cpu.c).
 * For the types where quant_q8_supported() (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K) every 32-element group g of the row is w = dw[g]*q + mw[g]
 * exactly in real arithmetic, with q small integers: unsigned 0..31 stored as
 * bytes, or, for Q8_0 (quant_q8_signed()), signed -128..127 with mw = 0.
 * (Q4_0: q = nibble, mw = -8*d; Q4_K: dw = d*sc, mw = -dmin*m per sub-block.)
 * Writes q (n bytes), dw and mw (n/32 floats each).  Returns 0, or -1 for an
 * unsupported type or n not a whole number of blocks.
 */
bool quant_q8_supported(uint32_t type);
bool quant_q8_signed(uint32_t type);
int quant_unpack_q8_row(uint32_t type, const void *src, int64_t n, uint8_t *q, float *dw, float *mw);

/*
 * SIMD dispatch, shared by quant.c and cpu.c.  Active when the CPU has
 * AVX2+FMA+F16C (decided once, thread-safely, on first use) unless
 * quant_simd_force(false) — what main() calls for SPILL_NO_SIMD=1
 * (base/settings.h).  Tests and the bench switch paths with it too; it cannot turn SIMD on where the CPU
 * lacks it, and returns the state now in force.  Do not call it while other
 * threads are computing.
 */
bool quant_simd_available(void);
bool quant_simd_active(void);
bool quant_simd_force(bool on);

/* IEEE binary16 <-> binary32.  fp16 -> fp32 is exact (subnormals, inf, NaN
 * kept); fp32 -> fp16 rounds to nearest even, overflow gives inf. */
float quant_fp16_to_fp32(uint16_t h);
uint16_t quant_fp32_to_fp16(float f);

/*
 * OCP FP8 E4M3FN (torch.float8_e4m3fn, safetensors F8_E4M3, CUDA __nv_fp8_e4m3): sign, 4 exponent bits
 * (bias 7), 3 mantissa bits, no infinities; S.1111.111 is NaN; the largest finite value is ±448, the smallest
 * subnormal 2^-9.  e4m3 -> fp32 is exact (NaN stays NaN).  fp32 -> e4m3 rounds to nearest even and saturates:
 * |x| >= 448 (and ±inf) gives ±448, NaN gives 0x7F with the input's sign (CUDA's __NV_SATFINITE conversion,
 * which the GPU's activation quantizer uses, gives the same bits).
 */
float quant_e4m3_to_fp32(uint8_t c);
uint8_t quant_fp32_to_e4m3(float f);

/* bfloat16 <-> binary32.  bf16 -> fp32 is exact; fp32 -> bf16 rounds to
 * nearest even and quiets NaNs (same as ggml_compute_fp32_to_bf16). */
float quant_bf16_to_fp32(uint16_t b);
uint16_t quant_fp32_to_bf16(float f);

#endif
