/*
 * quantize.h — fp32 → weight blocks: the writing side of quant.h.
 *
 * Owns turning rows of fp32 values into the bytes of a GGUF weight type:
 * Q8_0, Q4_0 and Q4_1 (ggml's reference quantizers, bit for bit), spill's
 * fp8 rows (E4M3 with one scale per row, quantize.c), and the plain
 * conversions to F32, F16 and BF16.  It does not choose a type (pack.c
 * does, by measured error) and never sees a whole tensor: callers quantize a
 * row or a chunk of rows at a time.
 */
#ifndef SPILL_QUANTIZE_H
#define SPILL_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

/* True for the types quantize_row can write: F32, F16, BF16, Q8_0, Q4_0, Q4_1, F8_E4M3_ROW (fp8 rows, n % 16 == 0). */
bool quantize_type_supported(uint32_t type);

/*
 * Writes n fp32 values x (n) as `type` into dst (quant_row_bytes(type, n)
 * bytes).  n must be a whole number of blocks (32 for the Q types).  Returns
 * 0, or -1 for an unsupported type or a partial block.
 *
 * Exactness: Q8_0, Q4_0 and Q4_1 follow quantize_row_*_ref in ggml-quants.c
 * operation by operation in fp32 (no fused multiply-add: this file is built
 * with -std=c11, which turns contraction off), which is also what gguf-py's
 * numpy port computes; tests/test_pack.c checks the bytes against gguf-py.
 */
int quantize_row(uint32_t type, const float *x, void *dst, int64_t n);

#endif
