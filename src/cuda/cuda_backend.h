/*
 * cuda_backend.h — the CUDA backend as C sees it: an opaque engine with the
 * semantics of engine.h (same fwd_seq, same paged KV bookkeeping).  The
 * op-level entry points the GPU tests compare against the CPU ops, and the
 * test hooks, are in cuda_test.h, which only tests include.
 *
 * This is the only header C code includes from src/cuda/: plain C types,
 * extern "C" entry points, no CUDA types.  Everything else in src/cuda/ is
 * CUDA C++ and private.
 *
 * Precision (stated once, relied on by the tests): the residual stream and
 * every activation are fp32; each weight matrix is dequantized on the GPU
 * from its file dtype into a bf16 scratch (BF16 weights are used in place),
 * the GEMM input rows are rounded to bf16, and cuBLAS multiplies with fp32
 * accumulation: Y(T,N) = X(T,K) · W(N,K)^T.  Norms, RoPE, attention (fp32
 * KV pages), SiLU and the residual adds stay in fp32.  A LoRA adapter adds
 * scale · (X·Aᵀ)·Bᵀ to a projection's fp32 output with the same roundings:
 * A and scale·B held in bf16, X·Aᵀ accumulated in fp32 and rounded to bf16
 * before the second product (lora.cu).
 *
 * Tiers: resident (every layer's matrices in HBM) or streamed (matrices of
 * layers >= resident_layers in one pinned host arena of exact size, copied
 * per layer on a separate copy stream into a ring of device buffers, several
 * layers ahead of compute).  With from_disk the streamed layers are not
 * cached in host RAM: reader threads read them from storage every pass
 * (O_DIRECT, stream.h) into a small ring of pinned slots, and each slot is
 * copied to the device ring as soon as it is read.  Globals (embedding,
 * output head, norms, biases) always live in HBM.
 */
#ifndef SPILL_CUDA_BACKEND_H
#define SPILL_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../engine/engine.h"

/* Returned by every call once the CUDA context is poisoned (illegal address,
 * launch failure, ECC, ...): the process must exit (75 = EX_TEMPFAIL) and be
 * resumed; no further call on any engine will succeed. */
#define CUDA_ENGINE_EDEVICE (-75)

/* Fills dst with the `size` bytes of tensor t (the model's file bytes at
 * t->offset).  Lets a caller (the benchmark) provide weights from memory;
 * returns 0 or -1 with a sentence. */
typedef int (*cuda_weight_reader)(void *ctx, const model_tensor *t, void *dst, char *err, size_t errlen);

typedef struct cuda_engine cuda_engine;

typedef struct cuda_engine_opts {
    int device;          /* CUDA device ordinal */
    int max_pass_tokens; /* T cap per pass (0 = 512) */
    int max_pass_seqs;   /* sequences per pass (0 = max_pass_tokens) */
    int page_tokens;     /* KV page size in positions (0 = 16) */
    int32_t kv_pages;    /* pages in the device KV arena (0 = 256) */
    int kv_dtype;        /* KV_I8 (kv.h): int8 codes + a scale per vector; anything else: bf16 */
    int max_logit_rows;  /* logit rows one pass may return (0 = max_pass_seqs); an all_logits sequence
                            counts one per token (the CPU engine allows up to max_pass_tokens) */
    bool streamed;       /* false: every layer resident in HBM */
    int resident_layers; /* streamed: layers [0, resident_layers) stay in HBM */
    int ring_slots;      /* streamed: device layer buffers (0 = 3, at least 2; at most the streamed layer count) */
    bool from_disk;      /* streamed: read the layers from storage every pass instead of caching them pinned */
    int disk_slots;      /* from_disk: pinned host slots (0 = 5, at least 2); readers = slots - 1 (4 by default: the probe's parallel read) */
    bool disk_direct;    /* from_disk: O_DIRECT reads (falls back to buffered where refused) */
    cuda_weight_reader reader; /* NULL: pread from the model's files */
    void *reader_ctx;
    bool attention_unsplit; /* decode attention never splits long rows over warps (tests compare the two) */
    int fail_alloc_at; /* test hook: the n-th device allocation (1-based) fails as out of memory; 0 = off */
    /* diagnostics (base/settings.h, from the environment through the runner's options) */
    bool profile;        /* per-layer segment times, printed at close (SPILL_CUDA_PROF) */
    bool attention_fp32; /* prompt attention tiles on CUDA cores instead of TF32 tensor cores (SPILL_CUDA_ATT=fp32);
                            process-wide once an engine asks for it */
    bool pin_alloc;      /* cudaHostAlloc the streamed arena instead of read-then-register (SPILL_CUDA_PIN=alloc) */
    bool pin_private;    /* read-then-register into this process's own memory, never the host's shared copy
                            (engine/host_share.h; SPILL_CUDA_PIN=register) */
    const char *shm_dir; /* where the shared copy lives (NULL: /dev/shm; SPILL_SHM_DIR) */
    /* LoRA adapters (model/lora.h; NULL or n 0 = none) that passes apply per sequence (fwd_seq.adapter), unmerged:
     * every one is uploaded to HBM at open as bf16, whatever the layers' tier (read only during open) */
    const struct lora_set *lora;
} cuda_engine_opts;

/* What the engine holds and what the last pass moved. */
typedef struct cuda_engine_stats {
    uint64_t device_bytes;            /* HBM taken by the engine (weights, ring, KV, buffers, cuBLAS workspace) */
    uint64_t pinned_bytes;            /* pinned host arena of streamed layers */
    uint64_t resident_weight_bytes;   /* layer matrices + globals held in HBM */
    uint64_t streamed_bytes_per_pass; /* layer bytes copied host->device each pass */
    int n_streamed;                   /* layers streamed each pass */
    int ring_slots;
    uint64_t passes;
    double last_pass_s;        /* host wall time of the last cuda_engine_forward */
    double last_h2d_busy_s;    /* sum of the last pass's layer copy times (device events) */
    double last_h2d_span_s;    /* first copy start to last copy end of the last pass's layers */
    uint64_t peak_device_used; /* max (total - free) device memory seen at open and after passes */
    bool from_disk;            /* streamed layers come from storage every pass */
    uint64_t disk_ring_bytes;  /* pinned host slots of the disk tier */
    uint64_t disk_bytes;       /* bytes read from storage since open */
    double disk_read_s;        /* seconds reader threads spent in reads (summed over readers) */
    double disk_wait_s;        /* seconds the engine waited for a layer to finish reading */
    double pin_alloc_s;        /* open: seconds to allocate (pin) the host arena of streamed layers */
    double pin_read_s;         /* open: seconds to read the streamed layers into it */
    int pin_readers;           /* threads that read them */
    bool pin_registered;       /* open: the arena was read first, then registered (cudaHostRegister) */
    int pin_shared;            /* open: 0 a private arena; 1 this process filled the host's shared copy; 2 it mapped
                                  the copy another process (or this worker's last job) had filled: nothing read */
    char pin_share_note[160];  /* why the arena is private when a shared copy was asked for ("" otherwise) */
    bool hbm_kept;             /* open: the resident layers and globals were the last job's, kept in HBM (spill
                                  worker): nothing uploaded */
    uint64_t experts_run;      /* MoE: (layer, expert) visits over at least one row since open */
    uint64_t experts_skipped;  /* MoE: (layer, expert) visits no row chose: no GEMM (0 for a dense model) */
    uint64_t lazy_layers;        /* MoE, streamed: layer copies that left the experts out (small passes) */
    uint64_t lazy_expert_bytes;  /* ... the hit experts' bytes fetched after routing */
    uint64_t lazy_skipped_bytes; /* ... the bytes of experts no row chose: never copied */
    int lora_adapters;           /* LoRA adapters held (fwd_seq.adapter 1..lora_adapters) */
    uint64_t lora_bytes;         /* HBM they take: stacked bf16 A and B, and their pass scratch */
} cuda_engine_stats;

/* Loads the model onto the GPU: globals, resident layers and the LoRA
 * adapters of o->lora into HBM, the rest into one pinned host arena (read
 * once, by up to 4 threads), sizes the pass buffers, the dequant scratch and
 * the KV arena (layout of kv.h, on the device).  The model must stay open
 * while the engine lives.  Returns 0, -1 with a sentence (bad model, an
 * adapter that does not fit it, out of GPU or pinned memory: the sentence
 * says what to lower), or CUDA_ENGINE_EDEVICE. */
int cuda_engine_open(model_desc *m, const cuda_engine_opts *o, cuda_engine **out, char *err, size_t errlen);

/* HBM the pass buffers of an engine opened with o take (activations for max_pass_tokens, logits, the dequant
 * scratch, cuBLAS workspace) and its LoRA adapters (o->lora): what an HBM plan must leave beside the layers,
 * the globals and the KV arena. */
uint64_t cuda_engine_pass_bytes(const model_desc *m, const cuda_engine_opts *o);

/* Frees everything; safe on NULL and on a poisoned context. */
void cuda_engine_close(cuda_engine *e);

/* One pass, same contract as engine_forward: the caller has reserved KV pages
 * (through cuda_engine_kv, whose page bookkeeping lives on the host while the
 * pages themselves live on the GPU) for pos0+n positions of every sequence;
 * logits receives (R, V) floats in host memory in sequence order: one row per
 * sequence with want_logits, n rows for one with all_logits (R at most
 * max_logit_rows).  With logits NULL the rows stay in the
 * engine's pinned buffer (cuda_engine_logits), which saves a host copy of
 * R×V floats (525 MB at R=1024, V=128k: tens of ms that the stream cannot
 * hide).  Returns 0, -1 with a sentence, or CUDA_ENGINE_EDEVICE. */
int cuda_engine_forward(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen);

/* A greedy pick made on the GPU (sample.c's temperature-0 path and its
 * log-probs, same ties): for a logits row whose request has temperature 0
 * and no bias or penalty, only this comes back instead of V floats. */
#define CUDA_PICK_MAX_TOP 64
typedef struct cuda_pick {
    int32_t token; /* the argmax (ties -> lowest id); -1 when every logit is NaN or -inf */
    float logprob; /* log-softmax at token, >= -9999; 0 without log-probs */
    int32_t n_top; /* alternatives filled */
    int32_t top_id[CUDA_PICK_MAX_TOP];
    float top_logprob[CUDA_PICK_MAX_TOP];
} cuda_pick;

/* cuda_engine_forward, with the picks made on the GPU: want (R, one per
 * logits row) is -2 for a row whose logits the host samples (copied to
 * logits + k*V, or left in cuda_engine_logits when logits is NULL), -1 for
 * the argmax alone, 0..CUDA_PICK_MAX_TOP for the argmax with its log-prob
 * and that many alternatives; picks[k] is filled for rows with want >= -1.
 * target (R; NULL = none): a row with target[k] >= 0 gets that token's log-prob instead of the argmax's. */
int cuda_engine_forward_pick(cuda_engine *e, fwd_seq *seqs, int n_seqs, const int32_t *want, const int32_t *target,
                             cuda_pick *picks, float *logits, char *err, size_t errlen);

/* The last pass's (R, V) logits in pinned host memory; valid until the next
 * cuda_engine_forward or close. */
const float *cuda_engine_logits(const cuda_engine *e);

/* The page allocator (kv_row_reserve/release work on it; its arena is NULL:
 * the pages live on the GPU). */
kv_cache *cuda_engine_kv(cuda_engine *e);
void cuda_engine_get_stats(const cuda_engine *e, cuda_engine_stats *st);

/* CUDA devices this process sees (0 when none answers). */
int cuda_device_count(void);

/* HBM that a closed engine left for the next one (spill worker's keep mode: its resident layers and globals),
 * free for planning: the next engine reuses it or frees it first. */
uint64_t cuda_kept_bytes(void);

/* Device name and memory, for logs.  Returns 0 or -1 with a sentence. */
int cuda_device_info(int device, char *name, size_t name_cap, uint64_t *total_bytes, uint64_t *free_bytes, char *err,
                     size_t errlen);

/* Pinned host->device copy rate: `reps` copies of `bytes` from one pinned
 * buffer into device memory, timed with events; *gbps is bytes/s / 1e9 of the
 * median copy.  Returns 0, -1 with a sentence, or CUDA_ENGINE_EDEVICE. */
int cuda_probe_h2d(int device, size_t bytes, int reps, double *gbps, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
