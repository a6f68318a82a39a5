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
 */
#ifndef SPILL_PLAN_H
#define SPILL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
