/*
 * fp8.cuh — GEMMs with fp8 weights on the FP8 tensor cores (fp8.cu), private to src/cuda/: the engine's
 * cuda_gemm, the op tests (cuda_ops.cu) and bench/cuda/bench_fp8.cu call it.
 *
 * Y(T, N) fp32 = X(T, K) · W(N, K)^T where W is N fp8 rows (GGML_F8_E4M3_ROW, gguf.h: fp32 scale ws[n], 12
 * zero bytes, K E4M3 codes) and X is bf16.  X is quantized per token to E4M3 (xs[t] = amax/448, codes
 * e4m3(x / xs[t]), quantize.c's rule for weight rows), the codes are multiplied on the tensor cores with fp32
 * accumulation, and the product of row t and weight n is scaled by xs[t] * ws[n]: by cuBLASLt itself
 * (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on A and B), or, where cuBLASLt does not take that mode, by a
 * small kernel after a GEMM with unit scales.  No weight is ever dequantized.
 */
#ifndef SPILL_CUDA_FP8_CUH
#define SPILL_CUDA_FP8_CUH

#include <cublasLt.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.cuh"

/* How the scales are applied: AUTO = OUTER where cuBLASLt accepts it (decided per shape, once), else POST. */
enum { FP8_AUTO, FP8_OUTER, FP8_POST };

typedef struct fp8_lt fp8_lt; /* a cuBLASLt handle, the scale mode, and the plans of the shapes seen */

/* 0, or -1 with a sentence. */
int fp8_lt_create(fp8_lt **out, char *err, size_t errlen);
void fp8_lt_free(fp8_lt *c); /* safe on NULL */
/* mode: FP8_AUTO (default), FP8_OUTER or FP8_POST; fast_accum: cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM (off by
 * default: the tensor cores' partial sums are promoted to fp32 regularly, the accurate setting). */
void fp8_lt_set(fp8_lt *c, int mode, bool fast_accum);
/* The mode the last fp8_gemm used (FP8_OUTER or FP8_POST). */
int fp8_lt_last_mode(const fp8_lt *c);

/* q(T, K) E4M3 codes and xs(T) scales of the bf16 rows x(T, K) (K % 16 == 0): xs = amax/448, q = e4m3(x / xs)
 * (IEEE division, round to nearest even, saturating), zero codes for a zero row: the bits quantize_row and
 * quant_fp32_to_e4m3 give on the CPU. */
cudaError_t k_fp8_quant_rows(const bf16 *x, int64_t T, int64_t K, uint8_t *q, float *xs, cudaStream_t s);

/* ws(N) = the scales in the headers of N fp8 rows of row_bytes bytes. */
cudaError_t k_fp8_row_scales(const uint8_t *w, size_t row_bytes, int64_t N, float *ws, cudaStream_t s);

/*
 * y(T, N) = x(T, K) · W(N, K)^T as above.  W: N fp8 rows of row_bytes = 16 + K bytes, 16-byte aligned, K % 16
 * == 0; scratch (device): xq (T*K bytes), xs (T floats), ws (N floats); work: cuBLASLt's workspace.
 * Returns 0, or -1 with a sentence; *cu is the CUDA error behind a failure (cudaSuccess when cuBLASLt refused),
 * so the caller can tell a device fault.
 */
int fp8_gemm(fp8_lt *c, const uint8_t *W, size_t row_bytes, int64_t N, int64_t K, const bf16 *x, int64_t T, float *y,
             uint8_t *xq, float *xs, float *ws, void *work, size_t work_bytes, cudaStream_t s, cudaError_t *cu,
             char *err, size_t errlen);

#endif
