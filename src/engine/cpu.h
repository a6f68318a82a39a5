/*
 * cpu.h — the CPU backend's compute: the weight matmul on a thread pool, and
 * the fp32 elementwise ops of a transformer layer (norms, activations,
 * softmax, RoPE).  See cpu.c for the design and what is bit-stable.
 *
 * Dimension letters: T tokens in the pass, N output features, K input
 * features, D model dim, H heads, S head size.  All activations are fp32,
 * row-major.
 */
#ifndef SPILL_CPU_H
#define SPILL_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/pool.h"
#include "../model/arch.h"

/* ---------------------------------------------------------------- the engine's pool */

/* A thread pool (base/pool.h) that also carries the matmul mode and its 8-bit activation buffer. */
typedef struct cpu_pool cpu_pool;
typedef pool_task_fn cpu_task_fn;

/* As pool_create (cpu_matmul_scratch_bytes() says what the matmul needs per thread); the mode starts exact. */
int cpu_pool_create(int n_threads, size_t scratch_bytes_per_thread, cpu_pool **out, char *err, size_t errlen);
/* As pool_run. */
void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *ctx, int64_t n_tasks);
int cpu_pool_threads(const cpu_pool *p);

/*
 * Matmul arithmetic for quantized weights, per pool (default off = exact):
 *   off — W is dequantized to fp32 and dotted with fp32 X (the oracle path;
 *         matches a float reference on the dequantized weights to summation
 *         rounding).
 *   on  — for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, X rows are quantized
 *         to 8 bits per 32-block (as llama.cpp does) and dotted with the
 *         weights' integers; other types keep the exact path.  1.7-4.4x faster at
 *         T=1 on Q4_1 (bench_matmul), about equal at T >= 64; adds an
 *         activation-rounding error of up to
 *         sum_k |w_k| * amax(x block)/254 per output.
 * Both are deterministic and independent of T and of the thread count.
 * Change it only between matmuls.
 */
void cpu_pool_set_q8_act(cpu_pool *p, bool on);
bool cpu_pool_q8_act(const cpu_pool *p);

/* The 8-bit mode keeps the quantized X rows in a pool buffer that grows the
 * first time a larger T×K is seen; reserving the largest pass up front makes
 * every later matmul allocation-free.  Returns 0, or -1 with a sentence. */
int cpu_pool_reserve_q8(cpu_pool *p, int64_t T, int64_t K, char *err, size_t errlen);
void *cpu_pool_scratch(cpu_pool *p, int thread_id);
size_t cpu_pool_scratch_bytes(const cpu_pool *p);

/* Joins the workers and frees everything; safe on NULL. */
void cpu_pool_free(cpu_pool *p);

/* ---------------------------------------------------------------- matmul */

/* Per-thread scratch cpu_matmul wants for rows of K elements (a full tile of
 * CPU_MATMUL_TILE_ROWS dequantized rows); any amount >= K floats works, less
 * is slower. */
#define CPU_MATMUL_TILE_ROWS 16
size_t cpu_matmul_scratch_bytes(int64_t K);

/*
 * Y(T, N) = X(T, K) · W(N, K)^T.  W is N rows of K elements in its file type
 * `wtype` (enum ggml_type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K, Q8_K), rows contiguous (quant_row_bytes(wtype, K) bytes each).
 * X and Y are fp32; Y is overwritten.  No allocation (in 8-bit-activation
 * mode, none once cpu_pool_reserve_q8 covered the largest T×K).
 *
 * Bit-stability: each Y[t][n] is the dot product of X row t with the
 * dequantized W row n, summed in one fixed order that depends only on K (see
 * cpu.c), so the result is the same for any thread count, any T, any
 * position of the row in X, and any grouping of calls.  The SIMD and the
 * scalar (SPILL_NO_SIMD=1) paths use the same order and give the same bits.
 *
 * Returns 0, or -1 with a sentence in err (unsupported type, K not a whole
 * number of blocks, scratch smaller than K floats).
 */
int cpu_matmul(cpu_pool *p, const void *W, uint32_t wtype, int64_t N, int64_t K, const float *X, int64_t T, float *Y,
               char *err, size_t errlen);

/* Whether 8-bit-activation matmuls use the AVX-512 VNNI kernels (dpbusd on 256-bit vectors; the CPU must
 * have AVX-512 VNNI and VL).  They give the AVX2 kernels' bits; cpu_q8_vnni_force sets the choice (1 VNNI where
 * available, 0 AVX2 — main() for SPILL_NO_VNNI=1 — and -1 decide again). */
bool cpu_q8_vnni_active(void);
void cpu_q8_vnni_force(int on);

/* Several weight matrices against the same X in one dispatch (q, k, v; gate, up): part i computes
 * parts[i].Y(T, N_i) = X(T, K) · W_i(N_i, K)^T.  X is quantized once for every part that takes 8-bit
 * activations, and all parts' row tiles are one pool job, so a decode pass pays one wake-up where it paid
 * one per matrix.  Every Y[t][n] has the bits cpu_matmul gives it (same routine, same order).  At most
 * CPU_MM_MAX_PARTS parts. */
#define CPU_MM_MAX_PARTS 4
typedef struct cpu_mm_part {
    const void *W;
    uint32_t wtype;
    int64_t N;
    float *Y;
} cpu_mm_part;
int cpu_matmul_multi(cpu_pool *p, const cpu_mm_part *parts, int n_parts, int64_t K, const float *X, int64_t T,
                     char *err, size_t errlen);

/* ---------------------------------------------------------------- attention (one head, one KV page run) */

/* s[j] = q . k_j for n keys stored one after another (stride S floats), in the
 * matmul's fixed summation order (bit-identical with and without AVX2). */
void cpu_attn_scores(const float *q, const float *k, int64_t n, int64_t S, float *s);

/* o(S) += sum_j w[j] * v_j for n values (stride S), j in order, one fused
 * multiply-add per element per value (bit-identical with and without AVX2). */
void cpu_attn_accum(float *o, const float *w, const float *v, int64_t n, int64_t S);

/* ---------------------------------------------------------------- elementwise (fp32, single-threaded) */

/* y(T, D) = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) when w_plus_one (Gemma).
 * The mean is accumulated in double, in index order.  y may equal x. */
void cpu_rmsnorm(float *y, const float *x, const float *w, int64_t T, int64_t D, float eps, bool w_plus_one);

/* g(n) = silu(g) * u  (silu(v) = v / (1 + exp(-v))), in place in g. */
void cpu_silu_mul(float *g, const float *u, int64_t n);

/* g(n) = gelu_tanh(g) * u  (0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))), in place in g. */
void cpu_gelu_tanh_mul(float *g, const float *u, int64_t n);

/* In-place softmax of one row of n values (max subtracted first; -inf entries give 0). */
void cpu_softmax(float *x, int64_t n);

/* y(n) += x(n) */
void cpu_add(float *y, const float *x, int64_t n);

/* x(n) *= s */
void cpu_scale(float *x, int64_t n, float s);

/* ---------------------------------------------------------------- RoPE */

/* The parameters are the model layer's rope_cfg (model/arch.h: model_arch_resolve fills one for global and
 * one for sliding layers), so both engines build their tables from the same description. */
#define CPU_ROPE_MAX_ROT 1024

/* Precomputed frequencies: built once per model (per layer type), read-only after. */
typedef struct cpu_rope {
    int style; /* enum rope_style */
    int n_rot;
    float attn_scale;                    /* multiplies cos and sin (yarn), else 1 */
    float inv_freq[CPU_ROPE_MAX_ROT / 2]; /* (n_rot/2) */
} cpu_rope;

/* Computes the inverse frequencies exactly as transformers' modeling_rope_utils
 * does (same formulas, fp32 where it uses fp32 tensors, double where it uses
 * Python floats).  Returns 0, or -1 with a sentence in err for bad parameters. */
int cpu_rope_init(cpu_rope *r, const rope_cfg *cfg, char *err, size_t errlen);

/* Rotates x (T, H, S) in place: token t at position pos[t]; dims >= n_rot pass
 * through.  S must be >= n_rot. */
void cpu_rope_apply(const cpu_rope *r, float *x, int64_t T, int64_t H, int64_t S, const int32_t *pos);

#endif
