/*
 * moe.h — the routed feed-forward block of a sparse (mixture-of-experts)
 * layer on the CPU backend: routing, the hit experts over their rows, the
 * shared expert.  See moe.c for the design and what is bit-stable.
 *
 * Dimension letters: T tokens in the pass, D model dim, E experts, k experts
 * per token, FE one expert's FFN dim, FS the shared expert's.
 */
#ifndef SPILL_MOE_H
#define SPILL_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "../model/arch.h"
#include "../model/model.h"
#include "cpu.h"
#include "stream.h"

/* One matrix of a sparse layer: n rows of k in `type`, rows contiguous, somewhere inside tensor t. */
typedef struct moe_mat {
    const void *p;         /* first row; rebound every pass when streamed (moe_rebind) */
    const model_tensor *t; /* the tensor holding the rows; NULL = no such matrix */
    uint64_t off;          /* byte offset of the first row inside t */
    uint32_t type;
} moe_mat;

/* A sparse layer's FFN weights (moe_bind fills it, moe_unbind frees what it owns). */
typedef struct moe_layer {
    int n_experts;                   /* E */
    moe_mat router;                  /* (E rows of D) */
    moe_mat *gate, *up, *down;       /* (E) each: FE rows of D, FE rows of D, D rows of FE */
    moe_mat sh_gate, sh_up, sh_down; /* the shared expert: FS rows of D, FS rows of D, D rows of FS; t NULL = none */
    float *sh_gate_inp;              /* (D) fp32: the shared expert's output scales by sigmoid(x . it); NULL = 1 */
} moe_layer;

/* The pass buffers of the routed block, sized once for the engine's largest pass. */
typedef struct moe_ctx moe_ctx;

/*
 * Binds sparse layer l of m as the layout describes it.  tbuf[i] is the bytes of m->tensors[i] in RAM, or NULL
 * for a tensor that is streamed (its matrices are then pointed at each pass by moe_rebind; 1-D tensors are
 * always in RAM).  Returns 0, or -1 with one sentence (a tensor missing or misshapen, experts inconsistent
 * with the config, a dtype the CPU backend cannot multiply); ml is then safe to moe_unbind.
 */
int moe_bind(moe_layer *ml, const model_desc *m, const arch_layout *a, int l, const uint8_t *const *tbuf, char *err,
             size_t errlen);
/* Frees what moe_bind allocated; safe on a zeroed or half-bound layer. */
void moe_unbind(moe_layer *ml);
/* Points a streamed layer's matrices at their bytes in the stream slot holding the layer. */
void moe_rebind(moe_layer *ml, const stream_layer *sl);

/* The largest K a sparse layer multiplies (FE or FS; 0 for a dense model): the matmul scratch must cover it. */
int64_t moe_max_k(const model_desc *m);
/* Bytes moe_open allocates for passes of max_T tokens (0 for a dense model). */
uint64_t moe_buffer_bytes(const model_desc *m, int64_t max_T);

/* Allocates the buffers for passes of up to max_T tokens; with q8, also reserves the pool's 8-bit activation
 * buffer for the gathered rows (T*k of them).  Returns 0, or -1 with a sentence. */
int moe_open(const model_desc *m, const arch_layout *a, cpu_pool *p, int64_t max_T, bool q8, moe_ctx **out, char *err,
             size_t errlen);
void moe_close(moe_ctx *c);

/*
 * y(T, D) = the routed FFN of x(T, D) (the normed hidden states) for every token: the k experts of highest
 * routing probability, weighted, plus the gated shared expert.  y may be x.  No allocation.  Each y row
 * depends only on its own x row and the weights, bit for bit (moe.c).  Returns 0, or -1 with a sentence from
 * a matmul.
 */
int moe_ffn(moe_ctx *c, cpu_pool *p, const moe_layer *ml, const float *x, int64_t T, float *y, char *err,
            size_t errlen);

/* Expert visits so far: (layer, expert) pairs that ran over at least one row, and those no row chose (not
 * touched).  rows, when not NULL, gets the last moe_ffn's rows per expert (E entries, owned by c). */
void moe_stats(const moe_ctx *c, uint64_t *run, uint64_t *skipped, const int32_t **rows);

#endif
