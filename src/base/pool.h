/*
 * pool.h — a thread pool for data-parallel jobs: run fn over [0, n_tasks)
 * on n threads (the caller is thread 0), each with its own scratch.  See
 * pool.c for the wake-up design.
 */
#ifndef SPILL_POOL_H
#define SPILL_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct spill_pool spill_pool;

/* One task of a parallel job: `task` in [0, n_tasks), `thread_id` in [0, pool_threads()) names the caller's
 * scratch. */
typedef void (*pool_task_fn)(void *ctx, int64_t task, int thread_id);

/*
 * Starts n_threads - 1 worker threads (the caller of pool_run is thread 0);
 * n_threads <= 0 means the number of online CPUs.  Each thread gets
 * scratch_bytes_per_thread bytes of 64-byte-aligned scratch, allocated here
 * once.  Returns 0, or -1 with a sentence in err.
 */
int pool_create(int n_threads, size_t scratch_bytes_per_thread, spill_pool **out, char *err, size_t errlen);

/* Runs fn(ctx, task, thread_id) for every task in [0, n_tasks) across the
 * pool and returns when all are done.  Tasks are handed out dynamically, so
 * fn must not depend on which thread runs which task except through
 * thread_id's scratch.  Not reentrant: one job at a time per pool. */
void pool_run(spill_pool *p, pool_task_fn fn, void *ctx, int64_t n_tasks);

int pool_threads(const spill_pool *p);
void *pool_scratch(spill_pool *p, int thread_id);
size_t pool_scratch_bytes(const spill_pool *p);

/* Joins the workers and frees everything; safe on NULL. */
void pool_free(spill_pool *p);

#endif
