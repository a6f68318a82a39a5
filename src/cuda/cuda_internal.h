/*
 * cuda_internal.h — what the CUDA engine's files share: the engine's state
 * (struct cuda_engine, its layers' device matrices and LoRA groups), the error
 * and allocation helpers (cuda_engine.cu), and the entry points of the loader
 * (cuda_load.cu), the MoE FFN (moe.cu) and LoRA (lora.cu).  Not part of the backend's interface: C callers see only
 * cuda_backend.h.
 */
#ifndef SPILL_CUDA_INTERNAL_H
#define SPILL_CUDA_INTERNAL_H

#include "cuda_backend.h"

#include <cublas_v2.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "../engine/cpu.h"
#include "../engine/host_share.h"
#include "../engine/stream.h"
#include "../model/arch.h"
#include "../model/gguf.h"
#include "../model/lora.h"
#include "../model/quant.h"
#include "../base/util.h"
}
#include "kernels.cuh"
#include "fp8.cuh"

#define PACK_ALIGN 256

enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_COUNT };

#define PROF_MARKS 10

typedef struct dmat {
    const model_tensor *t;
    uint32_t type;
    int64_t n, k; /* N rows of K elements */
    size_t row_bytes;
    size_t off;  /* byte offset in the layer pack (0 for globals) */
    size_t sub;  /* bytes into t where these rows start: q, k, v of a fused QKV, gate and up of a fused gate/up */
    bool shared; /* a later part of a fused tensor: its bytes travel with the part at sub 0 */
} dmat;

/* A sparse layer's FFN (model/arch.h arch_layer_sparse): its experts' matrices ride in the layer pack after
 * the attention's, a stacked tensor's experts as row ranges of it (the first carries the bytes); the router
 * stays resident in fp32 so tokens pick their experts as the CPU engine does. */
typedef struct dmoe {
    int E;
    dmat *gate, *up, *down;       /* (E) each: FE rows of D, FE rows of D, D rows of FE */
    dmat sh_gate, sh_up, sh_down; /* the shared expert (t NULL: none) */
    float *router;                /* (E, D) device fp32 */
    float *sh_gate_inp;           /* (D) device fp32, or NULL: the shared expert is not gated */
} dmoe;

typedef struct dlayer {
    dmat m[M_COUNT];
    dmoe *moe; /* sparse layers: the routed FFN (m[M_GATE/UP/DOWN] then have no tensor); NULL = dense */
    size_t head_bytes; /* sparse layers: pack bytes before the first expert (attention, shared expert): what a
                        * pass copies when it fetches only the experts its rows chose (moe.cu); 0 = whole only */
    size_t pack_bytes;
    bool resident;
    uint8_t *dev;                                                 /* resident: the pack in HBM */
    uint8_t *host;                                                /* streamed: the pack in the pinned arena */
    float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffw_norm; /* (D) device fp32 */
    float *q_norm, *k_norm;                                       /* (S) */
    float *bq, *bk, *bv;                                          /* (H*S), (Kh*S), (Kh*S) */
} dlayer;

/* LoRA (lora.cu): the adapters of one layer for a group of slots that read the same GEMM input (q, k, v: the
 * normed x; o: the attention output; gate, up: the normed x; down: the activation).  Every adapter's A rows for
 * the group's slots are stacked into one (C, in) matrix, slot by slot, so one GEMM takes every token into the
 * rank space of every adapter; a mask keeps each token's own adapter's columns; one GEMM per slot adds the
 * slot's stacked B (scale folded in) back onto the projection's output. */
enum { LG_QKV, LG_O, LG_GU, LG_DOWN, LG_COUNT };
#define LORA_GROUP_MAX 3 /* slots a group holds */

typedef struct dlora_group {
    int first, n_slots;            /* the group's slots: lora_slot (= M_*) first .. first + n_slots - 1 */
    int64_t in;                    /* input width */
    int32_t C;                     /* columns of the rank space; 0 = no adapter adapts the group in this layer */
    int32_t c0[LORA_GROUP_MAX];    /* slot i's columns [c0, c0 + R): its adapters' ranks stacked in set order, */
    int32_t R[LORA_GROUP_MAX];     /* padded with zero rows to a multiple of 8 (16-byte aligned GEMM operands) */
    int64_t out[LORA_GROUP_MAX];   /* slot i's output width */
    size_t a_off, own_off;         /* byte offsets in the LoRA arena of A and own, */
    size_t b_off[LORA_GROUP_MAX];  /* and of each slot's B */
    const bf16 *A;                 /* (C, in) device */
    const int32_t *own;            /* (C) device: the adapter (1..n) each column belongs to; -1 = padding */
    const bf16 *B[LORA_GROUP_MAX]; /* (out_i, R_i) device: scale * B, the adapters' columns as in A's rows */
} dlora_group;

struct cuda_engine {
    model_desc *m;
    cuda_engine_opts o;
    int max_T, max_seqs, max_rows; /* tokens, sequences, logit rows per pass */
    kv_cache kv;                   /* host page bookkeeping; arena NULL */
    uint8_t *d_kv;                 /* (L, n_pages, block): kv.h's layout in bf16 or int8 + scales */

    cudaStream_t cs, xs; /* compute, copy */
    cublasHandle_t blas;
    void *blas_ws;

    uint8_t *d_embd, *d_out;
    dmat embd, out;
    float *out_norm;
    dlayer *layers;
    uint8_t *d_res;    /* resident packs */
    uint8_t *h_pinned; /* streamed packs */
    size_t h_pinned_map; /* > 0: h_pinned is an anonymous mapping of this size (registered if st.pin_registered) */
    struct host_share *h_share; /* non-NULL: h_pinned is the host's shared copy (engine/host_share.h), registered */
    char keep_res[65], keep_glob[65]; /* keep mode: the keys of d_res and of d_embd/d_out ("" none), cuda_load.cu */
    arch_layout a;       /* what the family makes of the pass: tensors, flags, RoPE parameters (model/arch.h) */
    float *d_inv_freq, *d_inv_freq_local; /* (rope_dim/2) of rope, rope_local; longrope: rope's short then long */
    cpu_rope rope, rope_local;            /* global and sliding layers */
    cpu_rope rope_long;                   /* longrope: global layers of rows past the original length */

    /* ring */
    int ns, slots, first_streamed;
    size_t slot_bytes;
    uint8_t *d_ring;
    cudaEvent_t *ev_copied, *ev_free; /* (slots) */
    cudaEvent_t *ev_cs[2], *ev_ce[2]; /* (ns) per pass parity: copy start / end */
    uint64_t copies_issued, computes_freed;
    bool *slot_lazy; /* (slots) the slot's layer was copied without its experts: moe.cu fetches the hit ones */
    int64_t cur_T;   /* tokens of the pass being run (pump decides lazy copies from it) */
    int att_tiles;          /* this pass's attention plan (build_meta) */
    int64_t att_singles;
    int32_t att_max_len; /* the longest per-token row's positions this pass (pos + 1) */
    float *att_part;     /* split decode attention's parts (k_attention_part_floats) */

    /* disk tier */
    stream *disk;
    int hslots;             /* pinned host slots */
    cudaEvent_t *ev_hdone;  /* (hslots) the copy out of host slot i finished */
    uint64_t h_acquired, h_released; /* host slots taken from / given back to the stream, in copy order */

    /* pass buffers (device) */
    /* R = max_rows logit rows, B = max_seqs */
    float *x, *h, *q, *k, *v, *att, *g, *u, *last, *logits; /* (T,D) (T,D) (T,HS) (T,KS)x2 (T,HS) (T,F)x2 (R,D) (R,V) */
    bf16 *xb, *lastb, *wscratch;                            /* (T, max(D,HS,F)), (R, D), largest dequantized matrix */
    struct fp8_lt *f8;        /* fp8 rows' GEMMs (fp8.cu), NULL when the model has none */
    uint8_t *f8x;             /* (T8, K8) the GEMM input's E4M3 codes: T8 the most rows one GEMM takes (MoE: T*k), */
    float *f8xs, *f8ws;       /* (T8) its per-token scales; (N8) the weight rows' scales; K8, N8 the largest */
    int32_t *d_meta, *h_meta; /* tok pos seq (T) rows (R) pt_off (B) tiles (2T) singles (T) lng (B) ad (T) pages */
    size_t meta_fixed;        /* their bytes before the page table */
    int32_t pt_cap;           /* page-table entries they hold: the arena's pages, grown when shared prefix pages
                                 (mapped by several rows) make a pass's tables longer (build_meta) */
    float *h_logits;                                        /* pinned (R, V) */
    int32_t *d_want, *h_want;                               /* (R) pick requests, device and pinned */
    pick_out *d_picks, *h_picks;                            /* (R) */

    /* MoE pass buffers (moe.cu; none for a dense model), TK = max_T * k slots of (token, chosen expert) */
    struct {
        float *xn, *logits, *wts, *g, *u, *yg, *sh, *shg; /* (T,D) (T,E) (TK) (TK|T,FE|FS)x2 (TK,D) (T,D) (T) */
        bf16 *xg, *gb;                                     /* (TK, D), (TK|T, FE|FS) */
        int32_t *ids, *perm;                               /* (TK) chosen experts; (2 TK) sorted slots, slot rows */
        int32_t *h_ids, *h_perm;                           /* pinned host copies */
        int32_t *h_count;                                  /* (E) rows per expert this layer (host) */
        uint64_t experts_run, experts_skipped;             /* (layer, expert) visits with rows / with none */
        uint64_t lazy_layers, lazy_bytes, lazy_skipped;    /* layers copied head-first; expert bytes fetched
                                                            * after routing; expert bytes never copied */
    } mo;

    /* LoRA adapters (lora.cu; n 0 without any) */
    struct {
        int n;          /* adapters: fwd_seq.adapter 1..n */
        dlora_group *g; /* (L, LG_COUNT) */
        uint8_t *arena; /* device: every group's A, owners and B */
        float *tmp;     /* (T, max C) x · A^T */
        bf16 *tmpb;     /* (T, max C) masked to each token's adapter, bf16 */
        bool pass;      /* some sequence of the pass being run names an adapter */
    } lo;

    void **allocs; /* every cudaMalloc, freed at close */
    size_t n_allocs, cap_allocs;
    int n_dev_allocs; /* for the fail_alloc_at hook */
    cuda_engine_stats st;
    bool broken;

    /* SPILL_CUDA_PROF=1: per-layer segment times from compute-stream events, printed at close */
    bool prof;
    cudaEvent_t *pev; /* (L, PROF_MARKS) */
    cudaEvent_t phead[2];
    double pacc[2][PROF_MARKS + 2]; /* [prefill?][segment, wait between layers, head] seconds */
    double pflop[2][4];             /* [prefill?][qkv, o, gate/up, down] FLOPs */
    uint64_t ppass[2], ptok[2];
};

typedef struct file_reader {
    const model_desc *m;
    int *fds; /* per model file, -1 until opened */
} file_reader;

/* cuda_engine.cu */
double mono(void);
int cu_fail_at(cudaError_t c, const char *what, const char *file, int line, char *err, size_t errlen);
int blas_fail_at(cublasStatus_t s, const char *what, const char *file, int line, char *err, size_t errlen);
/* Adds p (bytes of HBM) to the engine's allocations, freed at close.  0, or -1 with a sentence. */
int dtrack(cuda_engine *e, void *p, size_t bytes, char *err, size_t errlen);
int dalloc(cuda_engine *e, void **p, size_t bytes, const char *what, char *err, size_t errlen);
void note_peak(cuda_engine *e);
#define cu_fail(c, what, line, err, errlen) cu_fail_at(c, what, __FILE__, line, err, errlen)
#define blas_fail(s, what, line, err, errlen) blas_fail_at(s, what, __FILE__, line, err, errlen)
#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t c_ = (call);                                                                                       \
        if (c_ != cudaSuccess)                                                                                         \
            return cu_fail(c_, #call, __LINE__, err, errlen);                                                          \
    } while (0)

#define CB(call)                                                                                                       \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                               \
            return blas_fail(s_, #call, __LINE__, err, errlen);                                                        \
    } while (0)

/* cuda_load.cu: binds the model's tensors, uploads resident weights, fills the pinned arena or opens the disk
 * tier, and sets up RoPE; each returns 0, -1 with a sentence, or CUDA_ENGINE_EDEVICE. */
int bind_globals(cuda_engine *e, file_reader *fr, char *err, size_t errlen);
/* cuda_load.cu, keep mode (spill worker): at close, an opened engine's resident packs and globals are kept in HBM
 * for the next engine of the same model and split instead of freed. */
void cuda_keep_stash(cuda_engine *e);
int bind_layers(cuda_engine *e, file_reader *fr, char *err, size_t errlen);

/* Every matrix of a layer's pack, attention's first, then a sparse layer's experts and shared expert (moe.cu):
 * layer_n_mats of them, layer_mat_at(w, i) the i-th; a slot without a tensor has t NULL. */
int layer_n_mats(const dlayer *w);
dmat *layer_mat_at(dlayer *w, int i);
/* HBM the MoE pass buffers take for passes of T tokens (0 for a dense model), and their allocation. */
size_t cuda_moe_pass_bytes(const model_desc *m, size_t T);
int cuda_moe_alloc(cuda_engine *e, char *err, size_t errlen);
/* The routed FFN of sparse layer w for the pass's T tokens: e->h = experts(norm(x)) (+ the gated shared
 * expert), with e->xb already holding bf16(norm(x)); base is the layer pack's bytes on the device. */
int cuda_moe_ffn(cuda_engine *e, const dlayer *w, const uint8_t *base, int64_t T, bool lazy, char *err,
                 size_t errlen);
/* Whether a pass of T tokens copies sparse layer w head-first and fetches only its hit experts: at most half
 * the experts can be hit (T * k <= E / 2), from the pinned tier (the disk tier's slots hold the file's order). */
bool cuda_moe_lazy(const cuda_engine *e, const dlayer *w, int64_t T);
/* Sets w->head_bytes once the layer's pack is placed. */
void cuda_moe_place(dlayer *w);
/* y(T, n) = x(T, k) . W(n, k)^T for one matrix of the pack (cuda_engine.cu's GEMM). */
int cuda_gemm(cuda_engine *e, const dmat *w, const uint8_t *base, const bf16 *x, int64_t T, float *y, char *err,
              size_t errlen);
int rope_setup(cuda_engine *e, char *err, size_t errlen);

/* lora.cu: HBM the adapters of ls take (stacked bf16, and their scratch for passes of T tokens; 0 for none, or
 * for a set open will refuse); their upload at open (e->o.lora, checked against the bound layers: a sentence
 * for an adapter that does not fit the base); and their application after the GEMMs of group g of layer l,
 * reading e->xb (the group's input) and adding onto the group's outputs, for tokens whose adapter is ad[t]
 * (device, T).  Apply returns at once when no sequence of the pass names an adapter. */
size_t cuda_lora_bytes(const model_desc *m, const lora_set *ls, size_t T);
int cuda_lora_upload(cuda_engine *e, char *err, size_t errlen);
int cuda_lora_apply(cuda_engine *e, int l, int g, const int32_t *ad, int64_t T, char *err, size_t errlen);
int place_layers(cuda_engine *e, file_reader *fr, char *err, size_t errlen);

#endif
