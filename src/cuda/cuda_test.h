/*
 * cuda_test.h — what only the GPU tests call: the op entry points the tests
 * compare one by one against the CPU ops (tests/cuda/test_cuda_ops.c), and
 * the hooks that inject a device fault or pick a kernel variant.  The engine,
 * the glue and the CLI include cuda_backend.h alone; nothing here is part of
 * the engine's interface.
 */
#ifndef SPILL_CUDA_TEST_H
#define SPILL_CUDA_TEST_H

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Test hook: launches a kernel that writes through a wild pointer, poisoning
 * the context; the next forward returns CUDA_ENGINE_EDEVICE. */
void cuda_engine_inject_fault(cuda_engine *e);

/* ---------------------------------------------------------------- op entry points (tests) */
/* Each uploads its host inputs, runs the GPU op once, downloads the result.
 * Return 0, -1 with a sentence, or CUDA_ENGINE_EDEVICE. */

/* out(N, K) fp32 = dequant of W (N rows of K elements in `type`). */
int cuda_op_dequant(uint32_t type, const void *w, int64_t N, int64_t K, float *out, char *err, size_t errlen);

/* Y(T, N) = bf16(X)(T, K) · bf16(dequant W)(N, K)^T with fp32 accumulation. */
int cuda_op_matmul(uint32_t type, const void *w, int64_t N, int64_t K, const float *x, int64_t T, float *y, char *err,
                   size_t errlen);

/* The fp8 GEMM input of x (T, K) fp32 as the engine makes it: rounded to bf16, then q (T, K) E4M3 codes and xs
 * (T) per-token scales (fp8.cuh k_fp8_quant_rows). */
int cuda_op_fp8_quant(const float *x, int64_t T, int64_t K, uint8_t *q, float *xs, char *err, size_t errlen);

/* Y(T, N) = fp8(bf16(X))(T, K) · W(N, K)^T for W N fp8 rows (GGML_F8_E4M3_ROW, 16 + K bytes each) on the FP8
 * tensor cores, as the engine's GEMM: mode 0 auto, 1 outer-vector scales in cuBLASLt, 2 unit scales then a
 * scaling kernel (fp8.cuh FP8_*); *used_mode (NULL: not wanted) the one that ran. */
int cuda_op_fp8_matmul(const void *w, int64_t N, int64_t K, const float *x, int64_t T, float *y, int mode,
                       bool fast_accum, int *used_mode, char *err, size_t errlen);

/* y(T, D) = rmsnorm(x) * w (or 1 + w). */
int cuda_op_rmsnorm(const float *x, const float *w, int64_t T, int64_t D, float eps, bool plus_one, float *y, char *err,
                    size_t errlen);

/* x(T, H, S) rotated in place; inv_freq (n_rot/2), style 0 NEOX / 1 NORM. */
int cuda_op_rope(float *x, int64_t T, int H, int S, const int32_t *pos, const float *inv_freq, int n_rot, int style,
                 float attn_scale, char *err, size_t errlen);

/* g(n) = silu(g) * u (gelu_tanh when gelu). */
int cuda_op_act_mul(float *g, const float *u, int64_t n, bool gelu, char *err, size_t errlen);

/* Attention over a host paged KV arena (kv.h layout, one layer, fp32 here; stored on the device in kv_dtype's
 * format (KV_BF16 or KV_I8) as the engine stores KV, so values that format represents reach the kernels
 * exactly): q (T, H, S), token t belongs to sequence seq[t] at position pos[t]; sequence s's page table is
 * pages[pt_off[s] ...]; out (T, H, S).  tile_min_run > 0 plans prompt tiles as the engine does; split lets
 * long per-token rows split their keys over warps as the engine does. */
int cuda_op_attention(const float *q, const float *kv_arena, int32_t n_pages, int P, int H, int K, int S, int kv_dtype,
                      const int32_t *pos, const int32_t *seq, int64_t T, const int32_t *pt_off, const int32_t *pages,
                      int32_t n_table, int n_seqs, int window, float scale, float softcap, int tile_min_run,
                      bool split, float *out, char *err, size_t errlen);

/* k, v (T, K*S) written into a zeroed device KV arena of n_pages (kv.h layout, one layer, kv_dtype KV_BF16 or
 * KV_I8) at each token's page and position, then widened back into arena (fp32, n_pages * 2*K*P*S values). */
int cuda_op_kv_write(const float *k, const float *v, int64_t T, const int32_t *pos, const int32_t *seq,
                     const int32_t *pt_off, const int32_t *pages, int32_t n_table, int n_seqs, int32_t n_pages, int P,
                     int K, int S, int kv_dtype, float *arena, char *err, size_t errlen);

/* Test hook: the parts the last attention call split its long per-token rows into (1 = none; the op splits
 * only with split true, as the engine always may). */
int cuda_attention_last_split(void);

/* Test hook: the kernel prompt tiles use (2 TF32 tensor cores, the default; 1 fp32 CUDA cores). */
void cuda_attention_kind(int kind);

/* LoRA's mask (k_lora_mask): out (T, C), bf16 bit patterns, = bf16(tmp) where own[j] == ad[t], else 0. */
int cuda_op_lora_mask(const float *tmp, const int32_t *own, const int32_t *ad, int64_t T, int C, uint16_t *out,
                      char *err, size_t errlen);

/* One LoRA slot group of layer `layer` of set ls as the engine applies it after the base GEMMs (lora.cu):
 * group 0 = q, k, v; 1 = o; 2 = gate, up; 3 = down.  x (T, in) fp32 is rounded to bf16 as the engine's GEMM
 * input is; y[i] (T, out_i), the group's i-th slot's output, gets each token's adapter (ad[t], 0 = none)
 * added in place; slots no adapter of the set adapts in this layer are left untouched. */
struct lora_set;
int cuda_op_lora(const struct lora_set *ls, int layer, int group, const float *x, int64_t T, const int32_t *ad,
                 float *const *y, char *err, size_t errlen);

/* picks for R rows of host logits (R, V) with want as in cuda_engine_forward_pick. */
int cuda_op_pick(const float *logits, int R, int V, const int32_t *want, const int32_t *target, cuda_pick *out,
                 char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
