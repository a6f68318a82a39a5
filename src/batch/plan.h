/*
 * plan.h — the memory plan: one budget for everything the job holds.
 *
 * The budget (--mem-budget, default three quarters of RAM: the prototype's
 * knee was 75-85% of the working set) covers
 *     base      the process before the engine: binary, tokenizer, template,
 *               every row's prompt ids — measured (RSS) when the plan is made;
 *     weights   resident weights, or the stream ring when layers stream;
 *     pass      activation buffers for the pass's token cap, logits and
 *               sampling scratch for its sequences;
 *     KV        pages, the rest: what decides how many rows run at once.
 * A draft model (--speculate draft, draft.h) is priced inside these: its
 * weights and pass buffers with the pass share, and one draft KV page beside
 * every target page (page_bytes is the pair's).
 * The split: weights stay resident when the KV pages the batch wants still
 * fit beside them; otherwise layers stream and the memory goes to KV.  The
 * plan refuses (one sentence) when even streaming leaves no room for the
 * longest row.
 *
 * The model above is checked against what the process really holds: each
 * pass observes (RSS, sequence-tokens in the KV cache), and a least-squares
 * fit rss = base + slope · seq_tokens is stored per model|backend|machine
 * under $SPILL_HOME/calibration/ (the prototype's "measured, not theorised"
 * memory model).  A stored fit whose intercept exceeds the computed fixed
 * cost raises the fixed cost by the difference on the next run; the live
 * guard (admission pauses when RSS passes guard_bytes) is the backstop.
 *
 * Two levels: plan_solve and mem_fit are pure arithmetic on numbers the
 * caller measured; mem_job is one job's plan made from its model, engine
 * options and rows' needs (plan_job), observed after every pass
 * (plan_observe) and stored when the job ends (plan_save_fit).  The runner
 * holds one mem_job: it hands in its rows' page needs and the engine's
 * options, and reads the plan back; it sizes no memory itself.
 */
#ifndef SPILL_PLAN_H
#define SPILL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "../model/model.h"

typedef struct mem_need {
    uint64_t budget;          /* bytes */
    uint64_t base;            /* measured RSS before the engine */
    uint64_t weights;         /* weights bytes if resident */
    uint64_t ring;            /* stream ring bytes if streamed */
    uint64_t pass;            /* activations + logits + sampling scratch for one pass */
    uint64_t extra;           /* measured excess over the computed model from a stored fit (0 when none) */
    uint64_t page_bytes;      /* one KV page, all layers */
    int32_t want_pages;       /* pages the batch's largest rows need to run at once to their ends */
    int32_t min_pages;        /* pages the largest single row needs to finish alone */
    int mode;                 /* 0 auto, 1 stream, 2 resident */
    uint64_t kv_cap;          /* --kv-mem: at most this much KV (0 = no cap) */
} mem_need;

typedef struct mem_plan {
    bool gpu;                 /* planned for a GPU backend: KV and pass buffers in HBM (host figures unset) */
    bool stream;
    int32_t kv_pages;
    int32_t want_pages;       /* what the batch's largest rows would use */
    uint64_t fixed;           /* everything but KV */
    uint64_t total;           /* fixed + kv_pages * page_bytes */
    uint64_t guard;           /* RSS above which admission pauses */
} mem_plan;

/* Slack for heap growth and allocator rounding the computed model cannot see:
 * 2% of the budget plus 4 MiB. */
uint64_t plan_slack(uint64_t budget);

/* Solves the split; -1 with one sentence when the budget cannot hold a row. */
int plan_solve(const mem_need *n, mem_plan *p, char *err, size_t errlen);

/* Resident set size of this process now, and its peak (bytes; 0 when /proc is unreadable). */
uint64_t plan_rss_now(void);
/* MemAvailable of /proc/meminfo in bytes (0 when unreadable). */
uint64_t plan_mem_available(void);
uint64_t plan_rss_peak(void);

/* The measured memory model: least squares of rss over (1, seq_tokens). */
typedef struct mem_fit {
    double n, sx, sy, sxx, sxy;
    double base, slope;       /* after mem_fit_solve */
    bool valid;
} mem_fit;

void mem_fit_observe(mem_fit *f, double seq_tokens, double rss);
bool mem_fit_solve(mem_fit *f);
int mem_fit_load(const char *path, mem_fit *f);
int mem_fit_save(const char *path, const mem_fit *f, char *err, size_t errlen);

/* The KV pages a batch wants.  need (n) holds the pages each pending row needs to finish alone; it is sorted
 * in place, largest first.  *want: the `batch` largest summed (at least the largest, at most INT32_MAX / 4);
 * *min: the largest (at least 1). */
void plan_kv_want(int32_t *need, size_t n, int batch, int32_t *want, int32_t *min);

/* What the job's plan is made from. */
typedef struct mem_job_in {
    const model_desc *m;
    const engine_opts *eo;   /* the engine about to be opened; priced resident and streamed */
    const char *fingerprint; /* the model's: keys the stored fit by model | machine */
    uint64_t budget;         /* --mem-budget, bytes (run_opts.c fills the default) */
    uint64_t kv_cap;         /* --kv-mem, bytes (0 = no cap) */
    int threads;             /* CPU threads the engine runs (0 = every online CPU) */
    int mode;                /* 0 auto, 1 --stream, 2 --resident */
    int page_tokens;         /* P, positions per KV page */
    int kv_dtype;            /* GPU: KV_I8, or 0 for the backend's default (bf16) */
    int max_seqs;            /* sequences per pass: the runner's logits rows */
    int32_t want_pages, min_pages; /* plan_kv_want over the pending rows */
    bool masks;              /* rows with structured output: the token masks (token_mask.h) are counted */
    uint64_t draft_fixed;    /* --speculate draft: the draft model's resident weights and pass buffers (draft_mem),
                                counted with the pass buffers; its KV pages are in mem_job.page_bytes (one draft
                                page beside each target page); 0 = no draft */
} mem_job_in;

/* One job's memory: the plan, this run's observations of it, the stored fit of the excess. */
typedef struct mem_job {
    mem_plan plan;
    uint64_t page_bytes;     /* one KV page, all layers: the CPU's fp32 page while planning (the caller sets it),
                                the backend's own once the backend is open */
    uint64_t fixed_model;    /* what the plan priced besides KV and slack: the observations' baseline */
    uint64_t ring;           /* stream ring bytes (+ global tensors) when streamed */
    int32_t kv_peak_used;    /* pages ever touched (the free list is a stack) */
    mem_fit run, stored;
    char path[4096];         /* the stored fit's file; "" when there is none to keep (GPU plans) */
} mem_job;

/* Makes the plan into mj->plan: on the GPU (gpu true) the KV pages the batch can use, clamped by --kv-mem,
 * which the GPU backend's HBM plan clamps again; else plan_solve over the engine's computed costs both ways,
 * the process as measured now and the stored fit.  0, or -1 with one sentence. */
int plan_job(mem_job *mj, const mem_job_in *in, bool gpu, char *err, size_t errlen);

/* Records how far the measured RSS sits above the computed model after a pass: kv_used pages of the cache in
 * use, seq_tokens positions cached over the running choices. */
void plan_observe(mem_job *mj, int32_t kv_used, double seq_tokens);

/* Merges this run's observations into the stored fit and saves it (nothing to do: 0).  0, or -1 with a
 * sentence. */
int plan_save_fit(const mem_job *mj, char *err, size_t errlen);

/* Host RAM a GPU backend may pin streamed layers in: what the budget leaves beside this process and 1 GiB. */
uint64_t plan_host_mem(uint64_t budget);

#endif
