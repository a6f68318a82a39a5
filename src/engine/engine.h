/*
 * engine.h — the loaded model on a backend, and one forward pass.
 *
 * A pass advances a set of sequences (rows) through every layer in order:
 * each sequence contributes n tokens at positions pos0..pos0+n-1 (1 for a
 * decode step, a prompt chunk for prefill), all tokens of the pass go through
 * the same matmuls, and each sequence may ask for the logits of its last
 * token.  Sequences at different lengths mix freely (attention reads each
 * row's own pages).  A row's output depends only on its own tokens, never on
 * which other rows share the pass (the matmul summation order is fixed per
 * output element), which is what makes seeds reproducible whatever the batch.
 */
#ifndef SPILL_ENGINE_H
#define SPILL_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "../model/model.h"

typedef struct spill_engine spill_engine;

typedef struct engine_opts {
    int threads;          /* 0 = all online CPUs */
    int max_pass_tokens;  /* T cap per pass (activation buffers are sized for it) */
    int max_pass_seqs;    /* sequences per pass */
    int max_logit_rows;   /* logits rows one pass may return (0 = max_pass_seqs); the CPU engine takes up to
                             max_pass_tokens whatever this says, the GPU engine sizes its logits buffers by it */
    int page_tokens;      /* KV page size in positions */
    int32_t kv_pages;     /* pages in the KV arena */
    bool stream;          /* read every layer's matrices from storage each pass (else all in RAM) */
    int stream_slots;     /* ring buffers when streaming (0 = 3) */
    bool direct_io;       /* O_DIRECT for streamed reads */
    bool q8_activations;  /* quantized weights multiply 8-bit-quantized activations (llama.cpp's scheme; faster,
                             bounded rounding); false = exact fp32 activations, the oracle for tests and scoring */
    uint64_t gpu_mem;     /* GPU backends: HBM the engine may plan with (0 = what the device has free) */
    uint64_t host_mem;    /* GPU backends: host RAM streamed layers may be cached in, pinned (0 = MemAvailable less 10%) */
    bool from_disk;       /* GPU backends: streamed layers are read from storage every pass, never cached */
    int kv_dtype;         /* GPU backends: KV_I8 for int8 KV pages; 0 = the backend's own (fp32 CPU, bf16 GPU) */
    bool gpu_profile, gpu_attention_fp32, gpu_pin_alloc; /* GPU diagnostics (base/settings.h; cuda_engine_opts) */
    bool gpu_pin_private; /* GPU backends: streamed layers pinned in this process's own memory, not the host's shared
                             copy (engine/host_share.h; SPILL_CUDA_PIN=register) */
    const char *shm_dir;  /* GPU backends: the shared copy's directory (NULL: /dev/shm; SPILL_SHM_DIR) */
    const struct lora_set *lora; /* adapters the pass may apply per sequence (fwd_seq.adapter); NULL = none.
                                    Borrowed: it must outlive the engine */
} engine_opts;

typedef struct fwd_seq {
    kv_row *kv;           /* the row's pages; positions [0, pos0) are already cached */
    int32_t pos0;         /* position of the first token fed now */
    int32_t n;            /* tokens fed now */
    const int32_t *tokens;/* (n) */
    bool want_logits;     /* logits of the last token fed */
    bool all_logits;      /* logits of every token fed (teacher forcing, scoring); implies want_logits */
    int32_t logits_skip;  /* all_logits: the first logits_skip tokens fed return none (rows for tokens
                             [logits_skip, n) only); 0 otherwise */
    int32_t adapter;      /* LoRA: 0 = the bare base, i = engine_opts.lora->ad[i - 1] (model/lora.h) */
} fwd_seq;

/* Loads every weight the forward pass binds into RAM (read once, in file
 * order) and sizes the pass buffers and the KV arena.  The model must stay
 * open while the engine lives. */
int engine_open(model_desc *m, const engine_opts *o, spill_engine **out, char *err, size_t errlen);
void engine_close(spill_engine *e);

/* Runs one pass.  The caller has reserved KV pages for pos0+n positions of
 * every sequence.  logits receives (R, V) floats in sequence order: one row
 * per sequence with want_logits, or n rows for one with all_logits.  R may
 * not exceed the engine's max_pass_seqs unless those rows are all_logits
 * rows, which are bounded by max_pass_tokens.  Returns 0 or -1 with a sentence. */
int engine_forward(spill_engine *e, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen);

/* The same pass stopped at the output norm: hidden receives (R, D) floats, the rows engine_forward's logits
 * would have (one per want_logits sequence, n - logits_skip for an all_logits one), each the final hidden
 * state after the output norm — what the output projection would multiply (embeddings pool these).  Same
 * limits and returns as engine_forward. */
int engine_forward_hidden(spill_engine *e, fwd_seq *seqs, int n_seqs, float *hidden, char *err, size_t errlen);

/* What the CPU engine will hold besides the KV arena, before opening it:
 * weights in RAM (all of them, or only the global tensors when streaming,
 * plus the factors of o->lora's adapters, always resident), the stream ring
 * (0 when resident), and the pass buffers (activations for max_pass_tokens,
 * per-thread matmul/attention/LoRA scratch, 8-bit activation copies).
 * threads must be resolved (> 0). */
void engine_mem_estimate(const model_desc *m, const engine_opts *o, int threads, uint64_t *weights, uint64_t *ring,
                         uint64_t *pass);

kv_cache *engine_kv(spill_engine *e);
const model_desc *engine_model(const spill_engine *e);
int engine_threads(const spill_engine *e);
/* Bytes of weights held in RAM (resident tensors; the stream ring is separate). */
uint64_t engine_weight_bytes(const spill_engine *e);
/* Streaming: ring bytes and cumulative read statistics; false when resident. */
bool engine_stream_stats(const spill_engine *e, size_t *ring_bytes, uint64_t *bytes_read, double *wait_s,
                         double *read_s);
/* MoE: cumulative (layer, expert) visits that ran over at least one row and those no row chose (skipped, their
 * weights not touched); false for a dense model. */
bool engine_moe_stats(const spill_engine *e, uint64_t *run, uint64_t *skipped);

/*
 * The engine the job runner drives, whichever backend implements it: the CPU
 * engine above, or the GPU engine that the CUDA build registers through
 * spill_gpu_open (NULL in the CPU-only binary; set by src/cuda/cuda_glue.c in
 * build/cuda/spill-cuda).  C code never sees a CUDA type.
 */
struct sample_result; /* sample.h */

typedef struct spill_backend {
    void *impl;
    char name[160];          /* "resident CPU, 2 threads", "GPU NVIDIA H200, 32 of 32 layers streamed", ... */
    uint64_t weight_bytes;   /* weights held in RAM / HBM */
    int (*forward)(void *impl, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen);
    kv_cache *(*kv)(void *impl);
    /* Copies the first n positions of src into the empty dst (kv_row_copy semantics); NULL = unsupported. */
    int (*kv_copy)(void *impl, kv_row *dst, const kv_row *src, int32_t n);
    void (*close)(void *impl);
    /* Optional: forward with greedy picks made where the logits are (sample.h semantics for temperature 0,
     * no bias, no penalty).  want (one per logits row): -2 = the host samples this row (its logits land at
     * logits + k*V), -1 = the argmax alone, 0..SAMPLE_MAX_TOP = the argmax, its log-prob and that many top
     * alternatives.  picks[k] is filled for rows with want >= -1 (token -1: every logit NaN or -inf).
     * target (one per logits row, NULL = none): a row with target[k] >= 0 reports that token and its log-prob
     * (teacher forcing: scoring, echo) instead of the argmax, with its want >= 0 alternatives.
     * NULL = every row's logits come back. */
    int (*forward_pick)(void *impl, fwd_seq *seqs, int n_seqs, const int32_t *want, const int32_t *target,
                        struct sample_result *picks, float *logits, char *err, size_t errlen);
    /* Optional: engine_forward_hidden's contract (the (R, D) hidden states after the output norm, no logits);
     * NULL = this backend cannot compute embeddings (their rows fail with a sentence). */
    int (*forward_hidden)(void *impl, fwd_seq *seqs, int n_seqs, float *hidden, char *err, size_t errlen);
    /* One line on what the weights' tiers moved so far (bytes per pass, disk and copy rates); NULL = none. */
    void (*io_line)(void *impl, char *buf, size_t cap);
    /* true when some layers are copied in every pass (disk or pinned RAM): a pass then costs at least that copy,
     * and prompt work can hide behind it (chunk.h); false when every layer is resident. */
    bool streams;
} spill_backend;

/* The CPU engine as a backend. */
int engine_backend_cpu(model_desc *m, const engine_opts *o, spill_backend *out, char *err, size_t errlen);

/* A backend's return for a device fault: the process must exit (75, resumable: base/exit.h). */
#define ENGINE_EDEVICE (-75)

/* Free device memory in bytes (0 when no device answers); set with spill_gpu_open.  --quant auto's tier. */
typedef uint64_t (*spill_gpu_free_fn)(void);
extern spill_gpu_free_fn spill_gpu_free;
/* This process's rank among the ranks on its host (0 for one process): the GPU backend drives GPU
 * spill_gpu_index % (the GPUs it sees), so the ranks of a host with several GPUs each stream over their own link.
 * Set by the runner before it plans (batch/mpi_run.c finds it). */
extern int spill_gpu_index;

/* Opens the GPU engine as a backend; returns ENGINE_EDEVICE for a device fault. */
typedef int (*spill_gpu_open_fn)(model_desc *m, const engine_opts *o, int resident_layers, spill_backend *out,
                                 char *err, size_t errlen);
extern spill_gpu_open_fn spill_gpu_open;

#endif
