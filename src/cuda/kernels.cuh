/*
 * kernels.cuh — the CUDA backend's kernel launchers (private to src/cuda/):
 * kernels.cu (elementwise, norms, RoPE, dequant, KV pages, LoRA mask, greedy picks) and
 * attention.cu (paged attention), plus the KV-page device helpers both use.
 *
 * Every launcher enqueues on the given stream and returns the launch status
 * (cudaGetLastError); none allocates or synchronizes.  Dimension letters as in
 * cpu.h: T tokens, N output features, K input features, D model dim, H heads,
 * Kh kv heads, S head size, P page tokens.  Activations are fp32 row-major;
 * GEMM inputs are bf16.
 */
#ifndef SPILL_CUDA_KERNELS_CUH
#define SPILL_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../engine/kv.h" /* the page formats (KV_BF16, KV_I8) */
}

typedef __nv_bfloat16 bf16;

/* Whether the GPU dequantizer knows `type` (enum ggml_type). */
bool kq_type_supported(uint32_t type);

/* out(N, K) = dequant(W), W = N rows of row_bytes bytes.  One of out_b / out_f is non-NULL. */
/* 1: k_dequant always takes the generic per-element kernel (benchmarks; SPILL_DEQUANT=generic does it too). */
void k_dequant_force_generic(int on);
cudaError_t k_dequant(uint32_t type, const void *w, size_t row_bytes, int64_t N, int64_t K, bf16 *out_b, float *out_f,
                      cudaStream_t s);

/* x(T, D) = dequant(emb row tok[t]) * scale. */
cudaError_t k_embed(uint32_t type, const void *emb, size_t row_bytes, const int32_t *tok, int64_t T, int64_t D,
                    float scale, float *x, cudaStream_t s);

/* Row-wise RMS norm of x(rows, D) with weight w(D); writes y_f (fp32, may be x) and/or y_b (bf16). */
cudaError_t k_rmsnorm(const float *x, const float *w, int64_t rows, int64_t D, float eps, bool plus_one, float *y_f,
                      bf16 *y_b, cudaStream_t s);

/* y(T, n) += b(n) */
cudaError_t k_add_bias(float *y, const float *b, int64_t T, int64_t n, cudaStream_t s);

/* y(n) += x(n) */
cudaError_t k_add(float *y, const float *x, int64_t n, cudaStream_t s);

/* out_b(n) = bf16(x) */
cudaError_t k_to_bf16(const float *x, bf16 *out, int64_t n, cudaStream_t s);

/* x(T, H, S) rotated in place at positions pos(T).  lng (NULL: none) is longrope's choice per sequence:
 * token t of sequence seq[t] rotates with inv_freq[lng[seq[t]] * n_rot/2 ...] (short table, then long). */
cudaError_t k_rope(float *x, int64_t T, int H, int S, const int32_t *pos, const int32_t *seq, const int32_t *lng,
                   const float *inv_freq, int n_rot, int style, float attn_scale, cudaStream_t s);

/* out(n) = act(g) * u; out_b bf16 (GEMM input) or out_f fp32 (tests). */
cudaError_t k_act_mul(const float *g, const float *u, int64_t n, bool gelu, bf16 *out_b, float *out_f, cudaStream_t s);

/* LoRA's mask: out(T, C) = bf16(tmp) (round to nearest even) where own[j] == ad[t], else 0, so each token keeps
 * the rank-space columns of its own adapter only (ad 0, the bare base, keeps none; own -1 marks padding). */
cudaError_t k_lora_mask(const float *tmp, const int32_t *own, const int32_t *ad, int64_t T, int C, bf16 *out,
                        cudaStream_t s);

/* y(n) = cap * tanh(y / cap) */
cudaError_t k_softcap(float *y, int64_t n, float cap, cudaStream_t s);

/* dst(R, D) = x(rows[r], D) */
cudaError_t k_gather(float *dst, const float *x, const int32_t *rows, int R, int64_t D, cudaStream_t s);

/* Paged KV geometry of one layer (kv.h's layout): the block of page p at layer_base + p * kv_block_bytes.
 * kvt KV_BF16: 2*Kh*P*S bf16 values, rounded to nearest even when written.  KV_I8: K codes then V codes
 * (Kh*P*S int8 each), then Kh*P fp32 key scales and Kh*P value scales; value = code * scale.  Attention
 * widens either to fp32 and computes in fp32. */
typedef struct kv_geom {
    uint8_t *layer_base; /* arena + l * n_pages * kv_block_bytes */
    int P, Kh, S;
    int kvt; /* KV_BF16 or KV_I8 (kv.h) */
} kv_geom;

/* Bytes of one page's block in one layer. */
static inline __host__ __device__ int64_t kv_block_bytes(int P, int Kh, int S, int kvt)
{
    return kvt == KV_I8 ? 2 * (int64_t)Kh * P * S + 8 * (int64_t)Kh * P : 4 * (int64_t)Kh * P * S;
}

/* ---- device helpers shared by the KV-page kernels (kernels.cu) and attention (attention.cu) */

/* Where one key vector (row r = kh * P + pos % P of page `page`) lives; its value vector is `vs` values (and
 * for int8, one scale) further. */
struct kv_loc {
    const uint8_t *blk;
    int r;
};

__device__ __forceinline__ kv_loc kv_at(const kv_geom &g, int32_t page, int kh, int32_t pos)
{
    kv_loc L;
    L.blk = g.layer_base + (int64_t)page * kv_block_bytes(g.P, g.Kh, g.S, g.kvt);
    L.r = kh * g.P + pos % g.P;
    return L;
}

/* Value d of the key (v = 0) or value (v = 1) vector at L, widened to fp32. */
template <int KVT>
__device__ __forceinline__ float kv_get(const kv_geom &g, kv_loc L, int v, int d)
{
    const int64_t KPS = (int64_t)g.Kh * g.P * g.S;
    if (KVT == KV_I8) {
        const int8_t *c = (const int8_t *)L.blk + v * KPS + (int64_t)L.r * g.S;
        const float *sc = (const float *)(L.blk + 2 * KPS);
        return (float)c[d] * sc[v * g.Kh * g.P + L.r];
    }
    return __bfloat162float(((const bf16 *)L.blk)[v * KPS + (int64_t)L.r * g.S + d]);
}

/* Values [d, d + 8) of one vector (d % 8 == 0, S % 8 == 0): one 16-byte (bf16) or 8-byte (int8) load. */
template <int KVT>
__device__ __forceinline__ void kv_get8(const kv_geom &g, kv_loc L, int v, int d, float (&x)[8])
{
    const int64_t KPS = (int64_t)g.Kh * g.P * g.S;
    if (KVT == KV_I8) {
        uint2 raw = *(const uint2 *)((const int8_t *)L.blk + v * KPS + (int64_t)L.r * g.S + d);
        float sc = ((const float *)(L.blk + 2 * KPS))[v * g.Kh * g.P + L.r];
        const int8_t *c = (const int8_t *)&raw;
#pragma unroll
        for (int e = 0; e < 8; e++)
            x[e] = (float)c[e] * sc;
    } else {
        uint4 raw = *(const uint4 *)((const bf16 *)L.blk + v * KPS + (int64_t)L.r * g.S + d);
        const bf16 *h = (const bf16 *)&raw;
#pragma unroll
        for (int e = 0; e < 8; e++)
            x[e] = __bfloat162float(h[e]);
    }
}

/* Writes k, v (T, Kh*S) of every token into its row's page at pos[t] (bf16, or int8 codes with the vector's
 * scale amax/127: code = rint(x / scale), the division and rounding IEEE round-to-nearest-even). */
cudaError_t k_kv_write(kv_geom g, const float *k, const float *v, const int32_t *pos, const int32_t *seq,
                       const int32_t *pt_off, const int32_t *pages, int64_t T, cudaStream_t s);

/* A host-layout fp32 KV arena of n_pages (kv.h, one layer) into the device format of g (as k_kv_write would
 * store each vector), and back (widened); for the op tests. */
cudaError_t k_kv_pack(kv_geom g, const float *arena, int32_t n_pages, cudaStream_t s);
cudaError_t k_kv_unpack(kv_geom g, float *arena, int32_t n_pages, cudaStream_t s);

/* out(T, H*S) = causal attention of q(T, H*S) over each token's row's cached
 * positions [max(0, pos-window+1), pos] (window 0 = full); GQA by H/Kh.
 * With tiles and singles NULL every token goes through the one-warp-per-token
 * kernel; else the tokens of `tiles` (device pairs: first token, count of
 * consecutive positions of one sequence, at most k_attention_tile_tokens) go
 * through the tiled kernel and the `singles` (device token indices) through
 * the per-token one (k_attention_plan makes the two lists). */
cudaError_t k_attention(kv_geom g, const float *q, const int32_t *pos, const int32_t *seq, const int32_t *pt_off,
                        const int32_t *pages, int64_t T, int H, int window, float scale, float softcap,
                        const int32_t *tiles, int n_tiles, const int32_t *singles, int64_t n_singles, int32_t max_len,
                        float *part, float *out, cudaStream_t s);

/* The per-token kernel's split over long rows: with part (device scratch of k_attention_part_floats(S)
 * floats) and max_len (the longest per-token row's positions, pos + 1), tokens of rows of >= 512 keys split
 * their keys over several warps when the pass has few of them, and a merge kernel combines the parts. */
#define K_ATT_SPLIT_WARPS 8192
static inline size_t k_attention_part_floats(int S)
{
    return (size_t)K_ATT_SPLIT_WARPS * 4 * (size_t)(S + 2); /* 4 = query heads a warp takes (ATT_GC) */
}
/* Test hook: the parts the last k_attention call split its per-token rows into (1 = none). */
int k_attention_last_split(void);

/* Prompt tiles' kernel: 2 TF32 tensor cores (default; head sizes 32-128, multiples of 8), 1 fp32 CUDA cores
 * (SPILL_CUDA_ATT=fp32, and other head sizes). */
void k_attention_set_kind(int kind);

/* Tokens per tile of the tiled attention kernel (0: this shape is not tiled). */
int k_attention_tile_tokens(int H, int Kh, int S);

/* Host: splits T tokens (seq, pos as in the pass) into runs of consecutive positions of one sequence; runs of
 * at least min_run tokens become tiles of up to bq tokens (pairs in tiles, at most T), the rest singles (at
 * most T).  Returns 0. */
int k_attention_plan(const int32_t *seq, const int32_t *pos, int64_t T, int bq, int min_run, int32_t *tiles,
                     int32_t *singles, int *n_tiles, int64_t *n_singles);

/* Greedy picks on the device (sample.c's temperature-0 path and its logprobs_fill, same order and ties). */
#define PICK_MAX_TOP 64
typedef struct pick_out {
    int32_t token;  /* argmax of the cleaned logits (NaN, -inf -> -inf; +inf -> FLT_MAX), ties -> lowest id; -1 when
                       every logit is NaN or -inf */
    float logprob;  /* log-softmax at token (floored at -9999); 0 without logprobs */
    int32_t n_top;  /* alternatives filled */
    int32_t top_id[PICK_MAX_TOP];
    float top_logprob[PICK_MAX_TOP];
} pick_out;

/* For each of R rows of logits(R, V) with want[r] >= -1: out[r] = the argmax, and with want[r] >= 0 its
 * log-prob and the want[r] (<= PICK_MAX_TOP) most likely ids, (value desc, id asc), with log-probs.  Rows with
 * want[r] < -1 are skipped (the host samples them).  target (device, R; NULL = none): a row with target[r] >= 0
 * reports that token and its log-prob instead of the argmax (teacher-forced scoring), alternatives as above. */
cudaError_t k_pick(const float *logits, int R, int V, const int32_t *want, const int32_t *target, pick_out *out,
                   cudaStream_t s);

/* Test hook: a write through a wild device pointer. */
cudaError_t k_poison(cudaStream_t s);

#endif
