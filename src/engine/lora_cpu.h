/*
 * lora_cpu.h — the CPU engine's LoRA step: after a targeted projection's matmul, each token of a row that names
 * adapter i gets scale · (x·Aᵀ)·Bᵀ of adapter i's slot added (model/lora.h).  See lora_cpu.c.
 */
#ifndef SPILL_LORA_CPU_H
#define SPILL_LORA_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "engine.h"
#include "../model/lora.h"

typedef struct lora_cpu lora_cpu;

/* One projection of a dispatch: y (T, out) += the adapters' slot s of x (T, in). */
typedef struct lora_io {
    enum lora_slot slot;
    const float *x;
    float *y;
} lora_io;

/*
 * Checks every adapter of set against the model the engine runs (layer count, each slot's shape in the
 * layout a) and sizes the per-thread scratch for `threads` threads.  *out is NULL (nothing to apply) when set
 * is NULL or empty.  The set is borrowed.  Returns 0, or -1 with a sentence.
 */
int lora_cpu_open(const lora_set *set, const model_desc *m, const arch_layout *a, int threads, lora_cpu **out,
                  char *err, size_t errlen);
void lora_cpu_close(lora_cpu *lc);

/* Bytes lora_cpu_open will allocate for scratch beside the adapters' own (engine_mem_estimate). */
uint64_t lora_cpu_scratch_bytes(const lora_set *set, int threads);

/* Checks each sequence's adapter index (0 = the bare base, 1..n) for one pass and notes which adapters run
 * in it; lc may be NULL (no adapters: every index must be 0).  Returns 0, or -1 with a sentence. */
int lora_cpu_begin(lora_cpu *lc, const fwd_seq *seqs, int n_seqs, char *err, size_t errlen);

/* Adds the adapters' deltas of layer l to each io[i].y for the T tokens of the pass (seq_of[t]: the token's
 * sequence), one pool job over (projection, token).  A token's delta depends only on its own row of x and its
 * row's adapter, never on the other tokens of the pass.  No-op when lc is NULL or no token of the pass names an
 * adapter that adapts these slots of layer l. */
void lora_cpu_apply(lora_cpu *lc, cpu_pool *pool, const fwd_seq *seqs, const int32_t *seq_of, int l,
                    const lora_io *io, int n_io, int64_t T);

#endif
