/*
 * pool.c — the thread pool every parallel stage shares (the CPU engine's
 * matmuls and attention, the runner's sampling, pack's requantization,
 * synth's weight generation): n-1 workers plus the caller, tasks handed out
 * one index at a time from an atomic counter, per-thread scratch allocated
 * once at creation.
 *
 * Workers spin briefly (SPIN_ITERS pauses, ~100 µs) before sleeping on a
 * condition variable: a decode pass issues hundreds of small jobs back to
 * back, and a futex wake per job costs more than the spin.  One job at a time
 * per pool; the caller runs tasks too, so a 1-thread pool starts no thread.
 * Does not: know what the tasks compute (the CPU engine's 8-bit activation
 * buffers live in cpu.c's cpu_pool, which wraps one of these).
 */
#include "pool.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPIN_ITERS 4096 /* pause instructions before sleeping: ~100 µs on current x86 */

typedef struct {
    spill_pool *p;
    int id;
} worker_arg;

struct spill_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* (n-1) */
    worker_arg *args;      /* (n-1) */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* job published or stop */
    pthread_cond_t done;   /* last worker checked out */
    uint64_t gen;          /* job generation, under mu */
    _Atomic uint64_t gen_seen; /* copy of gen for the lock-free spin */
    pool_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    _Atomic int64_t next;  /* next unclaimed task */
    _Atomic int active;    /* workers still in the current job */
    bool stop;
    uint8_t *scratch;      /* (n, scratch_stride) */
    size_t scratch_bytes;
    size_t scratch_stride;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_tasks(spill_pool *p, pool_task_fn fn, void *ctx, int64_t n_tasks, int id)
{
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= n_tasks)
            return;
        fn(ctx, t, id);
    }
}

static void *worker_main(void *arg)
{
    worker_arg *a = arg;
    spill_pool *p = a->p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen_seen, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen_seen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while (p->gen == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
            g = atomic_load_explicit(&p->gen_seen, memory_order_acquire);
        }
        /* the job fields were written before the release store of gen_seen */
        if (p->stop)
            return NULL;
        seen = g;
        run_tasks(p, p->fn, p->ctx, p->n_tasks, a->id);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Publishes the job fields already stored in p (or stop) to the workers. */
static void publish(spill_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->gen++;
    atomic_store_explicit(&p->gen_seen, p->gen, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

int pool_create(int n_threads, size_t scratch_bytes_per_thread, spill_pool **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 4096)
        return util_errf(err, errlen, "thread pool: %d threads requested; use at most 4096.", n_threads);
    size_t stride;
    if (!ck_add_size(scratch_bytes_per_thread, 63, &stride))
        return util_errf(err, errlen, "thread pool: scratch size %zu overflows; ask for less.", scratch_bytes_per_thread);
    stride &= ~(size_t)63;
    size_t total;
    if (!ck_mul_size(stride, (size_t)n_threads, &total))
        return util_errf(err, errlen, "thread pool: %d threads x %zu bytes of scratch overflows; ask for less.",
                         n_threads, scratch_bytes_per_thread);

    spill_pool *p = calloc(1, sizeof *p);
    if (!p)
        return util_errf(err, errlen, "thread pool: out of memory allocating the pool.");
    p->n = n_threads;
    p->scratch_bytes = scratch_bytes_per_thread;
    p->scratch_stride = stride;
    atomic_init(&p->gen_seen, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->active, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (total) {
        p->scratch = aligned_alloc(64, total);
        if (!p->scratch) {
            util_errf(err, errlen, "thread pool: out of memory allocating %zu bytes of scratch (%d threads); use fewer "
                      "threads or a smaller tile.", total, n_threads);
            goto out_free_pool;
        }
    }
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) {
            util_errf(err, errlen, "thread pool: out of memory allocating %d thread handles.", n_threads);
            goto out_free_pool;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i] = (worker_arg){p, i + 1};
            int rc = pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]);
            if (rc != 0) {
                util_errf(err, errlen, "thread pool: could not start worker thread %d of %d (%s); use fewer threads.",
                          i + 1, n_threads - 1, strerror(rc));
                goto out_free_pool;
            }
            p->n_started++;
        }
    }
    *out = p;
    return 0;

out_free_pool:
    pool_free(p);
    return -1;
}

void pool_run(spill_pool *p, pool_task_fn fn, void *ctx, int64_t n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (p->n_started == 0 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n_started, memory_order_relaxed);
    publish(p);

    run_tasks(p, fn, ctx, n_tasks, 0);

    for (int i = 0; atomic_load_explicit(&p->active, memory_order_acquire) > 0 && i < SPIN_ITERS; i++)
        cpu_relax();
    if (atomic_load_explicit(&p->active, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->active, memory_order_acquire) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

int pool_threads(const spill_pool *p) { return p->n; }
size_t pool_scratch_bytes(const spill_pool *p) { return p->scratch_bytes; }

void *pool_scratch(spill_pool *p, int thread_id)
{
    return p->scratch ? p->scratch + (size_t)thread_id * p->scratch_stride : NULL;
}

void pool_free(spill_pool *p)
{
    if (!p)
        return;
    p->stop = true;
    publish(p);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->args);
    free(p->threads);
    free(p->scratch);
    free(p);
}
