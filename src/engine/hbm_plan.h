/*
 * hbm_plan.h — how a GPU engine splits its memory (HBM) between resident
 * layers, the streaming ring, pass buffers and KV pages.
 *
 * Pure arithmetic (no CUDA), so CI checks it: the CUDA glue fills hbm_need
 * from the device, the model and the batch, and opens the engine with the
 * plan's split.
 *
 * When the whole model and the KV pages the batch wants fit, nothing
 * streams.  Otherwise the choice among streamed splits (r < L resident
 * layers) maximises modelled rows per second:
 *     KV(r)    = min(what the batch wants, HBM - margin - globals - ring - r·layer)
 *     rows(r)  = the batch's rows scaled by KV(r) / KV wanted
 *     pass(r)  = max(stream, device)
 *       stream = (L - r)·layer / host→device rate        (copies overlap compute)
 *       device = max(rows·FLOPs per token / GEMM rate,    (compute-bound)
 *                    (weights + KV(r)) / HBM rate)         (memory-bound)
 *     rate(r)  = rows(r) / pass(r)
 * Streaming passes cost the copies, so a layer kept resident buys 1/L of the
 * pass back while its bytes cost KV rows: for a 70B on one H200 every layer
 * is worth fewer rows than it costs (zero resident, ZeRO-Inference's
 * finding); a small model whose batch wants more KV than fits keeps nearly
 * every layer resident (streaming them would only slow the pass).  Among
 * splits within 0.1% of the best, the one with the most rows wins (the
 * ZeRO-Inference finding, where the model cannot tell them apart), and among
 * those the one with the most resident layers (less PCIe and pinned RAM).
 * The rates are the H200's measured ones unless the caller has better.
 * Full residency with fewer KV pages than the batch wants is not weighed
 * against streaming: the device term above prices small-batch passes at the
 * roofline, and measured decode passes run 3-4x slower than that (B3's
 * profile: 47 ms for ~500 rows of an 8B), so the model would favour tiny
 * resident batches it cannot deliver.  In the streamed regime the copy term
 * dominates and is measured (passes at 1.00 × bytes / 55 GB/s).
 */
#ifndef SPILL_HBM_PLAN_H
#define SPILL_HBM_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "../model/model.h"

typedef struct hbm_need {
    uint64_t hbm;         /* memory to plan with (--gpu-mem or what is free) */
    uint64_t margin;      /* pass buffers, CUDA context, cuBLAS */
    uint64_t globals;     /* embeddings, output head, norms: always resident */
    uint64_t layer_bytes; /* one layer's matrices (the average) */
    uint64_t ring;        /* device buffers of layers in flight, when any layer streams */
    int n_layers;
    uint64_t page_bytes;  /* one KV page, all layers */
    int64_t want_pages;   /* pages the batch can use at once */
    int rows;             /* rows the batch holds with want_pages */
    double h2d_bps;       /* host→device bytes per second (pinned) */
    double hbm_bps;       /* device memory bytes per second */
    double flops;         /* GEMM FLOP per second */
    double flops_per_token; /* 2 × the layer matrices' parameters */
    bool force_stream;    /* --stream: at least one layer streams */
    int fixed_resident;   /* --resident-layers N (streaming), -1 = choose */
    int ring_slots;       /* layers the ring holds (ring = ring_slots × the largest layer) */
} hbm_need;

typedef struct hbm_plan {
    bool streamed;
    int resident;         /* layers [0, resident) in HBM */
    int32_t pages;        /* KV pages */
    double rows;          /* modelled rows per pass */
    double pass_s;        /* modelled pass time */
    double rows_per_s;    /* rows(r) / pass(r): decode tokens per second */
} hbm_plan;

/* The need of model m under engine options o (page_tokens, kv_pages, kv_dtype, max_pass_seqs, stream,
 * stream_slots) with hbm bytes to plan with and margin bytes for the pass buffers and the runtime;
 * resident_layers is --resident-layers (-1 = choose; it applies when layers stream).  The rates are the
 * H200's, measured: pinned copies at 55 GB/s (B1: passes at 1.00 × bytes / 55 GB/s), bf16 GEMMs at
 * 520-770 TFLOP/s (B3's profile: 650 taken), HBM at 4 TB/s of its 4.8 peak. */
void hbm_need_for(const model_desc *m, const engine_opts *o, uint64_t hbm, uint64_t margin, int resident_layers,
                  hbm_need *out);

/* 0 with the chosen split, -1 when even the globals, a ring and the pass buffers do not fit. */
int hbm_plan_choose(const hbm_need *n, hbm_plan *out);

/* The model's figures for r resident layers (r = n_layers: all resident); false when r does not fit. */
bool hbm_plan_eval(const hbm_need *n, int r, hbm_plan *out);

#endif
