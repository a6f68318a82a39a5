/*
 * bench.c — `spill bench MODEL`: decode throughput against batch size and
 * weight tier on this machine, next to each tier's limit.
 *
 * A point is (tier, batch B).  The backend is opened once per tier, sized
 * for the largest batch: CPU resident (weights in RAM), CPU stream (every
 * layer read from disk each pass, O_DIRECT), and with a GPU engine
 * (spill_gpu_open) GPU resident, streamed from pinned RAM, and read from
 * disk every pass.  For each B: B rows prefill --prompt random token ids
 * (in passes of at most the runner's prefill chunk), then decode passes of
 * B tokens, one per row, greedy, are timed for --gen steps or until
 * --seconds; decode tok/s = B · steps / seconds.  Picks are made where the
 * runner makes them (forward_pick when the backend has it), so the pass time
 * is what `spill run` pays per decode pass.  --verify K makes each decode pass
 * a speculative verify pass: every row feeds its next token and K proposals
 * (random ids: the cost is the same whichever are kept) and gets every
 * position's logits back, positions advancing by 1 + K (issue 20's pass cost
 * against k; the limit's FLOPs count the tokens fed).
 *
 * The limit is the tier's speed of light at B (docs/performance.md §1):
 *     pass >= max(bytes moved per pass / rate, B · FLOPs per token / GEMM rate)
 *     limit tok/s = B / that
 * bytes: the weights (resident: RAM or HBM) or the layers streamed (disk,
 * pinned copies); FLOPs per token: 2 × the parameters of every matrix a token
 * multiplies (the output head included, the embedding gather not, attention
 * left out: prompts here are short).  Rates: disk and GEMM from the stored
 * probe ($SPILL_HOME/calibration/probe.json, probe_load) when there is one,
 * else measured now (O_DIRECT reads of the model's own file; an F16 GEMM of
 * the probe's shape); RAM read bandwidth always measured now (threads summing
 * 256 MiB); the GPU tiers' copy, HBM and GEMM rates are the GPU planner's
 * (hbm_plan.h), not this machine's.  Each row of bench.csv names the term
 * that binds and where its rate came from.  (gpu-resident asks the GPU
 * planner for residency; a model that does not fit still streams, and
 * bench.md quotes the backend's own description of what it did.)
 *
 * Decisions: the three files are rewritten (atomically) after every point,
 * so an interrupted sweep keeps what it measured; a tier's sweep stops after
 * a point that took longer than --seconds (the next, larger batch would
 * too), and batches whose KV and pass buffers would not fit in available RAM
 * are left out before the backend opens.  Left out: sampling other than
 * greedy, prompts from a tokenizer (random ids cost the same), and warm-up
 * passes (the first decode pass counts, as it does in a job).
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "../base/exit.h"
#include "../base/pool.h"
#include "../base/util.h"
#include "../engine/cpu.h"
#include "../engine/engine.h"
#include "../engine/hbm_plan.h"
#include "../engine/probe.h"
#include "../model/arch.h"
#include "../model/gguf.h"
#include "../model/model.h"
#include "../model/quant.h"
#include "plan.h"
#include "sample.h"
#include "svg.h"

#define MAX_BATCHES 32
#define MAX_BATCH 65536
#define MAX_NOTES 16
#define PAGE_TOKENS 16
#define DIO_ALIGN 4096u /* O_DIRECT needs 4096-aligned offset, length and buffer */
#define MIB (1024ull * 1024)
#define TMPFS_MAGIC_ 0x01021994 /* linux/magic.h: O_DIRECT on these reaches RAM, not storage */
#define RAMFS_MAGIC_ 0x858458f6

enum tier { TIER_RESIDENT, TIER_STREAM, TIER_GPU_RESIDENT, TIER_GPU_PINNED, TIER_GPU_DISK, N_TIERS };

static const struct tier_def {
    const char *name, *what;
    bool gpu, stream, from_disk;
} tier_defs[N_TIERS] = {
    {"resident", "CPU, weights in RAM", false, false, false},
    {"stream", "CPU, every layer read from disk each pass (O_DIRECT)", false, true, false},
    {"gpu-resident", "GPU, weights in HBM", true, false, false},
    {"gpu-pinned", "GPU, every layer copied from pinned host RAM each pass", true, true, false},
    {"gpu-disk", "GPU, every layer read from disk each pass", true, true, true},
};

typedef struct bench_opts {
    const char *model, *out_dir;
    int batches[MAX_BATCHES], n_batches; /* ascending, distinct */
    bool tier_on[N_TIERS];
    int prompt, gen, threads;
    int verify; /* --verify K: each decode pass feeds every row 1 + K tokens, every position's logits back */
    double seconds;
    bool q8;
} bench_opts;

typedef struct rate {
    bool have;
    double v;      /* GB/s, or GFLOP/s for GEMM */
    char src[192]; /* where it came from: "stored probe of 2025-...", "measured now: ..." */
} rate;

typedef struct point {
    int tier, batch, prompt, steps;
    double prefill_s, seconds, tok_s, pass_ms, limit, gbs; /* gbs: weight bytes moved per second */
    char basis[320];
} point;

/* Per-row scratch for the largest batch, allocated once. */
typedef struct bufs {
    int max_b;
    kv_row *rows;         /* (B) */
    fwd_seq *seqs;        /* (B) */
    int *seq_row;         /* (B) the row of each sequence of a pass */
    int32_t *prompt;      /* (B, T_prompt) random ids */
    int32_t *next;        /* (B) each row's next token */
    int32_t *fed;         /* (B, 1 + K) a verify pass's tokens per row: the next token, then K random ids */
    int32_t *want;        /* (B (1 + K)) forward_pick: -1 = the argmax alone */
    sample_result *picks; /* (B (1 + K)) */
    float *logits;        /* (B (1 + K), V) */
} bufs;

typedef struct bench {
    bench_opts o;
    model_desc *m;
    int threads;           /* CPU threads, resolved */
    double flops_tok;      /* FLOPs one token costs */
    uint64_t stream_bytes; /* layer bytes one streamed pass reads (4 KiB-aligned ranges) */
    rate ram, disk, gemm;
    double gpu_h2d, gpu_hbm, gpu_flops; /* the GPU planner's rates: bytes/s, bytes/s, FLOP/s */
    char backend[N_TIERS][160];         /* the opened backend's own description */
    uint64_t weight_bytes[N_TIERS];     /* weights it holds */
    point pts[N_TIERS * MAX_BATCHES];
    int n_pts;
    char notes[MAX_NOTES][320];
    int n_notes;
    char host[64], started[32];
    double t0;
    bufs w;
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void add_note(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(bench *b, const char *fmt, ...)
{
    if (b->n_notes == MAX_NOTES)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->notes[b->n_notes++], sizeof b->notes[0], fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- arguments */

void bench_help(FILE *f)
{
    fprintf(f, "usage: spill bench MODEL [OPTIONS]\n"
               "Decode throughput against batch size and weight tier on this machine, each point beside its tier's "
               "limit.\n"
               "Writes DIR/bench.csv, DIR/bench.md and DIR/bench.svg (rewritten after every point) and prints a "
               "table as it goes.\n\n"
               "  --batches LIST    batch sizes, comma-separated (default 1,2,4,8,16,32,64)\n"
               "  --tiers LIST      tiers, comma-separated (default: every tier this binary has):\n");
    for (int t = 0; t < N_TIERS; t++)
        fprintf(f, "                      %-13s %s\n", tier_defs[t].name, tier_defs[t].what);
    fprintf(f,
            "  --prompt N        prompt tokens per row, random ids (default 32)\n"
            "  --gen N           decode steps per point (default 16)\n"
            "  --verify K        each decode pass feeds every row 1 + K tokens and returns every position's logits,\n"
            "                    as a speculative pass verifying K proposals does (default 0: one token a row)\n"
            "  --seconds S       decode time budget per point; a tier's sweep stops after a point that took "
            "longer (default 30)\n"
            "  --threads N       CPU threads (default: every online CPU)\n"
            "  --q8-activations  CPU: quantized weights multiply 8-bit activations, as `spill run "
            "--q8-activations` (default exact)\n"
            "  -o DIR            where the files go (default: the working directory)\n\n"
            "limit: tok/s <= B / max(bytes moved per pass / rate, B x FLOPs per token / GEMM rate); disk and GEMM "
            "rates from\n"
            "`spill probe`'s stored results when there are any, else measured at the start (bench.csv says which).\n");
}

/* A whole decimal integer in [lo, hi]. */
static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

static int parse_batches(const char *s, bench_opts *o, char *err, size_t errlen)
{
    o->n_batches = 0;
    const char *p = s;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char item[24] = "";
        long v = 0;
        if (len < sizeof item)
            memcpy(item, p, len), item[len] = 0;
        if (len >= sizeof item || !parse_int(item, 1, MAX_BATCH, &v))
            return util_errf(err, errlen,
                             "--batches '%s': '%.*s' is not a batch size; give comma-separated sizes from 1 to %d, "
                             "such as 1,8,32.",
                             s, (int)(len > 20 ? 20 : len), p, MAX_BATCH);
        if (o->n_batches == MAX_BATCHES)
            return util_errf(err, errlen, "--batches '%s' lists more than %d sizes; give fewer.", s, MAX_BATCHES);
        o->batches[o->n_batches++] = (int)v;
        if (!c)
            break;
        p = c + 1;
    }
    qsort(o->batches, (size_t)o->n_batches, sizeof o->batches[0], cmp_int);
    int n = 0;
    for (int i = 0; i < o->n_batches; i++)
        if (!n || o->batches[i] != o->batches[n - 1])
            o->batches[n++] = o->batches[i];
    o->n_batches = n;
    return 0;
}

static int parse_tiers(const char *s, bench_opts *o, char *err, size_t errlen)
{
    memset(o->tier_on, 0, sizeof o->tier_on);
    const char *p = s;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int t = 0;
        while (t < N_TIERS && !(strlen(tier_defs[t].name) == len && !strncmp(tier_defs[t].name, p, len)))
            t++;
        if (t == N_TIERS)
            return util_errf(err, errlen,
                             "--tiers: unknown tier '%.*s'; the tiers are resident, stream, gpu-resident, gpu-pinned "
                             "and gpu-disk.",
                             (int)(len > 40 ? 40 : len), p);
        o->tier_on[t] = true;
        if (!c)
            break;
        p = c + 1;
    }
    return 0;
}

/* Fills o from argv; 0, 1 for --help, or -1 with a sentence. */
static int parse_args(int argc, char **argv, bench_opts *o, char *err, size_t errlen)
{
    *o = (bench_opts){.out_dir = ".", .prompt = 32, .gen = 16, .seconds = 30};
    static const int def_batches[] = {1, 2, 4, 8, 16, 32, 64};
    o->n_batches = (int)(sizeof def_batches / sizeof def_batches[0]);
    memcpy(o->batches, def_batches, sizeof def_batches);
    for (int t = 0; t < N_TIERS; t++)
        o->tier_on[t] = true;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        if (!strcmp(a, "--q8-activations")) {
            o->q8 = true;
            continue;
        }
        if (a[0] != '-') {
            if (o->model)
                return util_errf(err, errlen, "one MODEL only: '%s' and '%s' were both given.", o->model, a);
            o->model = a;
            continue;
        }
        static const char *const valued[] = {"--batches", "--tiers",   "--prompt", "--gen",
                                             "--seconds", "--threads", "-o",       "--out", "--verify"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(a, valued[k]);
        if (!known)
            return util_errf(err, errlen, "unknown option '%s'; `spill bench --help` lists the options.", a);
        if (!v)
            return util_errf(err, errlen, "%s needs a value; `spill bench --help` lists the options.", a);
        i++;
        if (!strcmp(a, "--batches")) {
            if (parse_batches(v, o, err, errlen))
                return -1;
        } else if (!strcmp(a, "--tiers")) {
            if (parse_tiers(v, o, err, errlen))
                return -1;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--gen") || !strcmp(a, "--threads")) {
            bool thr = !strcmp(a, "--threads");
            if (!parse_int(v, thr ? 0 : 1, thr ? 1024 : 1 << 20, &n))
                return util_errf(err, errlen, "%s '%s' must be a whole number from %d to %d.", a, v, thr ? 0 : 1,
                                 thr ? 1024 : 1 << 20);
            *(!strcmp(a, "--prompt") ? &o->prompt : !strcmp(a, "--gen") ? &o->gen : &o->threads) = (int)n;
        } else if (!strcmp(a, "--verify")) {
            if (!parse_int(v, 0, 16, &n))
                return util_errf(err, errlen, "--verify '%s' must be a whole number from 0 to 16 (proposals a row).", v);
            o->verify = (int)n;
        } else if (!strcmp(a, "--seconds")) {
            char *end;
            double s = strtod(v, &end);
            if (end == v || *end || !(s > 0) || s > 1e6)
                return util_errf(err, errlen, "--seconds '%s' must be a number of seconds above 0.", v);
            o->seconds = s;
        } else {
            o->out_dir = v;
        }
    }
    if (!o->model)
        return util_errf(err, errlen, "MODEL is missing: spill bench MODEL [OPTIONS] (--help lists them).");
    return 0;
}

/* ---------------------------------------------------------------- what a pass costs */

/* 2 × the parameters of every matrix one token multiplies: each layer's matrices (a routed expert's counted
 * once per expert a token uses) and the output head (the token embedding when they are tied); the embedding
 * itself is a gather. */
static double flops_per_token(const model_desc *m)
{
    double params = 0;
    bool head = false;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (!strcmp(t->name, "token_embd.weight"))
            continue;
        head |= !strcmp(t->name, "output.weight");
        if (t->n_dims == 2)
            params += (double)t->ne[0] * (double)t->ne[1];
        else if (t->n_dims == 3 && m->n_experts > 0) /* (E, N, K) experts: k of E per token */
            params += (double)t->ne[0] * (double)t->ne[1] * (double)m->n_experts_used;
    }
    if (!head)
        params += (double)m->vocab * (double)m->d_model;
    return 2 * params;
}

/* Bytes a streamed pass reads: every layer range widened to 4 KiB, as stream.c reads them. */
static uint64_t streamed_bytes(const model_desc *m)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < m->n_ranges; i++)
        if (m->ranges[i].layer >= 0) {
            uint64_t a = m->ranges[i].begin / DIO_ALIGN * DIO_ALIGN;
            uint64_t e = (m->ranges[i].end + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
            sum += e - a;
        }
    return sum;
}

/* ---------------------------------------------------------------- rates */

typedef struct ram_ctx {
    const uint64_t *buf;
    size_t words_per_task;
    uint64_t sink[64]; /* one per thread, so the sums cannot be optimised away */
} ram_ctx;

static void ram_task(void *arg, int64_t task, int thread_id)
{
    ram_ctx *c = arg;
    const uint64_t *p = c->buf + (size_t)task * c->words_per_task;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= c->words_per_task; i += 4)
        s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
    c->sink[thread_id & 63] += s0 ^ s1 ^ s2 ^ s3;
}

/* RAM read bandwidth: `threads` threads summing a 256 MiB buffer (far above any cache), best of 3. */
static int measure_ram(int threads, rate *r, char *err, size_t errlen)
{
    size_t bytes = 256 * MIB, task = 4 * MIB;
    uint64_t *buf = malloc(bytes);
    spill_pool *pool = NULL;
    if (!buf)
        return util_errf(err, errlen, "out of memory for the 256 MiB RAM bandwidth test.");
    if (pool_create(threads, 0, &pool, err, errlen)) {
        free(buf);
        return -1;
    }
    memset(buf, 1, bytes); /* every page mapped before timing */
    ram_ctx c = {.buf = buf, .words_per_task = task / 8};
    double best = 1e30;
    for (int it = 0; it < 4; it++) { /* the first is a warm-up */
        double t = now_s();
        pool_run(pool, ram_task, &c, (int64_t)(bytes / task));
        t = now_s() - t;
        if (it && t < best)
            best = t;
    }
    r->have = true;
    r->v = (double)bytes / 1e9 / best;
    snprintf(r->src, sizeof r->src, "measured now: %d threads summing 256 MiB", pool_threads(pool));
    pool_free(pool);
    free(buf);
    return 0;
}

/* GEMM rate as the probe measures it (F16 W 4096x4096, T = 64 rows, every engine thread), best of 3. */
static int measure_gemm(int threads, rate *r, char *err, size_t errlen)
{
    const int64_t N = 4096, K = 4096, T = 64;
    int rc = -1;
    cpu_pool *pool = NULL;
    uint16_t *W = malloc((size_t)(N * K) * sizeof *W);
    float *X = malloc((size_t)(T * K) * sizeof *X), *Y = malloc((size_t)(T * N) * sizeof *Y);
    if (!W || !X || !Y) {
        util_errf(err, errlen, "out of memory for the GEMM rate test.");
        goto out;
    }
    for (int64_t i = 0; i < N * K; i++)
        W[i] = quant_fp32_to_fp16((float)((i * 7919) % 2003) / 2003.0f - 0.5f);
    for (int64_t i = 0; i < T * K; i++)
        X[i] = (float)((i * 104729) % 101) / 101.0f - 0.5f;
    if (cpu_pool_create(threads, cpu_matmul_scratch_bytes(K), &pool, err, errlen))
        goto out;
    double best = 1e30;
    for (int it = 0; it < 4; it++) { /* the first is a warm-up */
        double t = now_s();
        if (cpu_matmul(pool, W, GGML_F16, N, K, X, T, Y, err, errlen))
            goto out;
        t = now_s() - t;
        if (it && t < best)
            best = t;
    }
    r->have = true;
    r->v = 2.0 * (double)(T * N * K) / 1e9 / best;
    snprintf(r->src, sizeof r->src, "measured now: F16 GEMM 4096x4096 with T=64 rows on %d threads",
             cpu_pool_threads(pool));
    rc = 0;
out:
    cpu_pool_free(pool);
    free(W), free(X), free(Y);
    return rc;
}

/* Disk read rate: the model's largest file (its first 256 MiB) read with O_DIRECT in 4 MiB requests by 1, 2 and
 * 4 readers taking the next offset in order, twice each, the best of the six (a virtual disk's rate varies by 2x
 * from one read to the next; a limit wants the best it reaches). */
static int measure_disk(const model_desc *m, rate *r, char *err, size_t errlen)
{
    const model_file *mf = &m->files[0];
    for (size_t i = 1; i < m->n_files; i++)
        if (m->files[i].size > mf->size)
            mf = &m->files[i];
    uint64_t size = mf->size < 256 * MIB ? mf->size : 256 * MIB;
    struct statfs sf;
    bool ram_fs = statfs(mf->path, &sf) == 0 && (sf.f_type == TMPFS_MAGIC_ || sf.f_type == RAMFS_MAGIC_);
    int fd = open(mf->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    bool direct = fd >= 0 && !ram_fs;
    if (fd < 0 && errno != EINVAL)
        return util_errf(err, errlen, "%s: cannot open for the disk rate test: %s.", mf->path, strerror(errno));
    if (fd >= 0)
        close(fd);
    double best = 0;
    for (int k = 0; k < 6; k++) {
        double gbs;
        char e2[SPILL_ERRLEN];
        if (probe_read_rate(mf->path, direct, size, 4 * MIB, 1 << (k % 3), &gbs, e2, sizeof e2))
            return util_errf(err, errlen, "the disk rate test could not read the model file: %s", e2);
        best = gbs > best ? gbs : best;
    }
    r->have = true;
    r->v = best;
    snprintf(r->src, sizeof r->src, "measured now: %s reads of %.0f MB of the model file%s",
             direct ? "O_DIRECT" : "buffered", (double)size / 1e6,
             direct ? "" : ", a page-cache rate (the file system has no O_DIRECT)");
    return 0;
}

/* The rates the chosen tiers' limits need: the stored probe's disk and GEMM figures, else measured now; the RAM
 * bandwidth measured now; the GPU planner's. */
static void gather_rates(bench *b)
{
    const bool *on = b->o.tier_on;
    bool ram = on[TIER_RESIDENT], disk = on[TIER_STREAM] || on[TIER_GPU_DISK],
         gemm = on[TIER_RESIDENT] || on[TIER_STREAM];
    char err[SPILL_ERRLEN], perr[SPILL_ERRLEN];
    probe_result pr;
    bool probed = probe_load(NULL, &pr, perr, sizeof perr) == 0;
    if (probed) {
        const char *note = pr.direct ? "" : " (buffered: the probe's file system has no O_DIRECT)";
        b->disk = (rate){true, pr.read_gbs, ""};
        snprintf(b->disk.src, sizeof b->disk.src, "stored probe of %s: best O_DIRECT read%s", pr.time, note);
        b->gemm = (rate){true, pr.matmul_gflops, ""};
        snprintf(b->gemm.src, sizeof b->gemm.src, "stored probe of %s: F16 GEMM %dx%d T=%d on %d threads", pr.time,
                 pr.mm_n, pr.mm_k, pr.mm_t, pr.threads);
        if (pr.threads && pr.threads != b->threads)
            add_note(b,
                     "the stored probe's GEMM rate was measured on %d threads and this run uses %d; run `spill "
                     "probe` again or pass --threads %d.",
                     pr.threads, b->threads, pr.threads);
    } else if (disk || gemm) {
        size_t n = strlen(perr);
        if (n && perr[n - 1] == '.') /* nested in the note's sentence */
            perr[n - 1] = 0;
        add_note(b, "no stored probe was read (%.200s), so the disk and GEMM rates were measured at the start.", perr);
    }
    if (ram && measure_ram(b->threads, &b->ram, err, sizeof err))
        add_note(b, "RAM bandwidth not measured: %s", err);
    if (disk && !b->disk.have && measure_disk(b->m, &b->disk, err, sizeof err))
        add_note(b, "disk rate not measured: %s", err);
    if (gemm && !b->gemm.have && measure_gemm(b->threads, &b->gemm, err, sizeof err))
        add_note(b, "GEMM rate not measured: %s", err);
    if (on[TIER_GPU_RESIDENT] || on[TIER_GPU_PINNED] || on[TIER_GPU_DISK]) {
        engine_opts eo = {.page_tokens = PAGE_TOKENS, .max_pass_seqs = 1};
        hbm_need hn;
        hbm_need_for(b->m, &eo, 1ull << 40, 0, -1, &hn);
        b->gpu_h2d = hn.h2d_bps, b->gpu_hbm = hn.hbm_bps, b->gpu_flops = hn.flops;
    }
}

/* The tier's limit at batch B (tok/s, 0 when no rate is known) and the term that binds, with its rate's source. */
static double tier_limit(const bench *b, int tier, int B, char *basis, size_t cap)
{
    const struct tier_def *d = &tier_defs[tier];
    double bytes, bps; /* bytes moved per pass, at bps bytes per second */
    const char *what, *src;
    if (tier == TIER_STREAM || tier == TIER_GPU_DISK)
        bytes = (double)b->stream_bytes, bps = b->disk.have ? b->disk.v * 1e9 : 0, what = "disk", src = b->disk.src;
    else if (tier == TIER_GPU_PINNED)
        bytes = (double)b->stream_bytes, bps = b->gpu_h2d, what = "pinned copies", src = "the GPU planner's rate";
    else if (tier == TIER_GPU_RESIDENT)
        bytes = (double)b->weight_bytes[tier], bps = b->gpu_hbm, what = "HBM", src = "the GPU planner's rate";
    else
        bytes = (double)b->weight_bytes[tier], bps = b->ram.have ? b->ram.v * 1e9 : 0, what = "RAM", src = b->ram.src;
    double fps = d->gpu ? b->gpu_flops : b->gemm.have ? b->gemm.v * 1e9 : 0;
    const char *fsrc = d->gpu ? "the GPU planner's rate" : b->gemm.src;
    double move = bps > 0 ? bytes / bps : 0, compute = fps > 0 ? (double)B * (1 + b->o.verify) * b->flops_tok / fps : 0; /* tokens fed */
    if (move <= 0 && compute <= 0) {
        snprintf(basis, cap, "none: no rate for this tier");
        return 0;
    }
    if (move >= compute)
        snprintf(basis, cap, "%s: %.4g MB per pass at %.2f GB/s (%s)", what, bytes / 1e6, bps / 1e9, src);
    else
        snprintf(basis, cap, "GEMM: %.1f MFLOP per token fed (%d a row) at %.1f GFLOP/s (%s)", b->flops_tok / 1e6,
                 1 + b->o.verify, fps / 1e9, fsrc);
    for (char *p = basis; *p; p++) /* one CSV field, no quoting */
        if (*p == ',')
            *p = ';';
    return (double)B / (move > compute ? move : compute);
}

/* ---------------------------------------------------------------- outputs */

static const char *limit_formula =
    "limit: tok/s <= B / max(bytes moved per pass / rate; B x FLOPs per token / GEMM rate); bytes = the weights "
    "held (resident tiers; RAM or HBM rate) or the layers streamed per pass (disk or pinned-copy rate); FLOPs per "
    "token = 2 x the parameters of every matrix a token multiplies (attention left out)";

static void write_csv(const bench *b, FILE *f)
{
    fprintf(f,
            "# spill bench %s on %s: %d threads, %s activations; %d random prompt tokens per row, %d decode "
            "steps or %.0f s a point; started %s\n",
            b->o.model, b->host, b->threads, b->o.q8 ? "8-bit" : "exact fp32", b->o.prompt, b->o.gen, b->o.seconds,
            b->started);
    if (b->o.verify)
        fprintf(f, "# --verify %d: each decode pass feeds every row %d tokens (every position's logits back); tok_s "
                   "counts one token a row a pass\n", b->o.verify, 1 + b->o.verify);
    fprintf(f, "# %s\n", limit_formula);
    fprintf(f, "# flops_per_token %.0f, streamed_bytes_per_pass %llu\n", b->flops_tok,
            (unsigned long long)b->stream_bytes);
    if (b->ram.have)
        fprintf(f, "# rate RAM %.3f GB/s: %s\n", b->ram.v, b->ram.src);
    if (b->disk.have)
        fprintf(f, "# rate disk %.3f GB/s: %s\n", b->disk.v, b->disk.src);
    if (b->gemm.have)
        fprintf(f, "# rate GEMM %.1f GFLOP/s: %s\n", b->gemm.v, b->gemm.src);
    if (b->gpu_flops > 0)
        fprintf(f,
                "# rate GPU (the planner's, hbm_plan.h): pinned copies %.1f GB/s, HBM %.0f GB/s, GEMM %.0f TFLOP/s\n",
                b->gpu_h2d / 1e9, b->gpu_hbm / 1e9, b->gpu_flops / 1e12);
    fprintf(f, "tier,batch,prompt_tokens,gen_steps,seconds,tok_s,pass_ms,limit_tok_s,limit_basis\n");
    for (int i = 0; i < b->n_pts; i++) {
        const point *p = &b->pts[i];
        fprintf(f, "%s,%d,%d,%d,%.6f,%.3f,%.4f,%.6g,%s\n", tier_defs[p->tier].name, p->batch, p->prompt, p->steps,
                p->seconds, p->tok_s, p->pass_ms, p->limit, p->basis);
    }
}

/* The bound's first word: "RAM", "disk", "GEMM", ... */
static void bound_word(const char *basis, char *out, size_t cap)
{
    size_t n = strcspn(basis, ":");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), basis);
}

static void write_md(const bench *b, FILE *f)
{
    fprintf(f, "# spill bench: %s\n\n", b->o.model);
    fprintf(f,
            "%s (%s, %d layers, %.1f MB of weights: %s) on %s, %d threads, %s activations; %d random prompt "
            "tokens per row, %d decode steps (at most %.0f s a point); started %s, %.0f s so far.\n\n",
            b->o.model, b->m->arch, b->m->n_layers, (double)b->m->total_bytes / 1e6, b->m->quant_summary, b->host,
            b->threads, b->o.q8 ? "8-bit" : "exact fp32", b->o.prompt, b->o.gen, b->o.seconds, b->started,
            now_s() - b->t0);
    if (b->o.verify)
        fprintf(f, "Verify passes (--verify %d): each decode pass feeds every row %d tokens and returns every "
                   "position's logits, as a speculative pass checking %d proposals; decode tok/s counts one token a "
                   "row a pass (nothing accepted), so the pass time is the figure.\n\n",
                b->o.verify, 1 + b->o.verify, b->o.verify);
    fprintf(f, "| tier | batch | prefill tok/s | decode tok/s | pass ms | weights GB/s | limit tok/s | of limit | "
               "bound |\n|---|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for (int i = 0; i < b->n_pts; i++) {
        const point *p = &b->pts[i];
        char bw[32];
        bound_word(p->basis, bw, sizeof bw);
        fprintf(f, "| %s | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.0f%% | %s |\n", tier_defs[p->tier].name, p->batch,
                p->prefill_s > 0 ? (double)p->batch * p->prompt / p->prefill_s : 0.0, p->tok_s, p->pass_ms, p->gbs,
                p->limit, p->limit > 0 ? 100 * p->tok_s / p->limit : 0.0, bw);
    }
    fprintf(f, "\nTiers:\n\n");
    for (int t = 0; t < N_TIERS; t++)
        if (b->backend[t][0])
            fprintf(f, "- %s: %s (%s)\n", tier_defs[t].name, tier_defs[t].what, b->backend[t]);
    fprintf(f,
            "\nThe limit (`limit_tok_s` in bench.csv, dashed in bench.svg), %s.  FLOPs per token here: %.4g M; "
            "layers streamed per pass: %.4g MB.\n\nRates:\n\n",
            limit_formula + strlen("limit: "), b->flops_tok / 1e6, (double)b->stream_bytes / 1e6);
    if (b->ram.have)
        fprintf(f, "- RAM read %.2f GB/s (%s)\n", b->ram.v, b->ram.src);
    if (b->disk.have)
        fprintf(f, "- disk read %.2f GB/s (%s)\n", b->disk.v, b->disk.src);
    if (b->gemm.have)
        fprintf(f, "- GEMM %.1f GFLOP/s (%s)\n", b->gemm.v, b->gemm.src);
    if (b->gpu_flops > 0)
        fprintf(f,
                "- GPU: pinned copies %.1f GB/s, HBM %.0f GB/s, GEMM %.0f TFLOP/s (the GPU planner's figures, "
                "hbm_plan.h, not measured here)\n",
                b->gpu_h2d / 1e9, b->gpu_hbm / 1e9, b->gpu_flops / 1e12);
    if (b->n_notes) {
        fprintf(f, "\nNotes:\n\n");
        for (int i = 0; i < b->n_notes; i++)
            fprintf(f, "- %s\n", b->notes[i]);
    }
    fprintf(f, "\n![decode tok/s against batch](bench.svg)\n");
}

static int write_svg(const bench *b, FILE *f)
{
    svg_series se[N_TIERS];
    double x[N_TIERS][MAX_BATCHES], y[N_TIERS][MAX_BATCHES], lim[N_TIERS][MAX_BATCHES];
    char names[N_TIERS][64];
    int ns = 0;
    double ymin = INFINITY, ymax = 0;
    for (int t = 0; t < N_TIERS; t++) {
        int n = 0;
        for (int i = 0; i < b->n_pts; i++)
            if (b->pts[i].tier == t && n < MAX_BATCHES) {
                x[ns][n] = b->pts[i].batch, y[ns][n] = b->pts[i].tok_s, lim[ns][n] = b->pts[i].limit;
                for (int k = 0; k < 2; k++) {
                    double v = k ? lim[ns][n] : y[ns][n];
                    if (v > 0)
                        ymin = v < ymin ? v : ymin, ymax = v > ymax ? v : ymax;
                }
                n++;
            }
        if (!b->backend[t][0])
            continue;
        snprintf(names[ns], sizeof names[ns], "%s", tier_defs[t].name);
        se[ns] = (svg_series){names[ns], n, x[ns], y[ns], lim[ns]};
        ns++;
    }
    char title[256], cap[4][600];
    snprintf(title, sizeof title, "spill bench: %s on %s (%d threads)", b->o.model, b->host, b->threads);
    snprintf(cap[0], sizeof cap[0], "Decode tok/s = B x steps / seconds over %d steps after %d-token prompts; %s.",
             b->o.gen, b->o.prompt, b->o.q8 ? "8-bit activations" : "exact fp32 activations");
    snprintf(cap[1], sizeof cap[1], "Dashed: the tier's %s.", limit_formula);
    size_t rn = (size_t)snprintf(cap[2], sizeof cap[2], "Rates:");
    const rate *rs[3] = {&b->ram, &b->disk, &b->gemm};
    static const char *const rname[3] = {"RAM", "disk", "GEMM"}, *const unit[3] = {"GB/s", "GB/s", "GFLOP/s"};
    for (int k = 0; k < 3; k++)
        if (rs[k]->have && rn < sizeof cap[2])
            rn += (size_t)snprintf(cap[2] + rn, sizeof cap[2] - rn, " %s %.*f %s (%s);", rname[k], k == 2 ? 1 : 2,
                                   rs[k]->v, unit[k], rs[k]->src);
    if (b->gpu_flops > 0 && rn < sizeof cap[2])
        snprintf(cap[2] + rn, sizeof cap[2] - rn,
                 " GPU (the planner's figures): pinned copies %.0f GB/s; HBM %.0f GB/s; "
                 "GEMM %.0f TFLOP/s.",
                 b->gpu_h2d / 1e9, b->gpu_hbm / 1e9, b->gpu_flops / 1e12);
    snprintf(cap[3], sizeof cap[3], "Written by spill bench, started %s.", b->started);
    const char *caps[4] = {cap[0], cap[1], cap[2], cap[3]};
    /* log y when the values span more than a decade (bandwidth-bound limits are then straight lines) */
    svg_chart c = {title,
                   "batch B (rows per pass, log2 scale)",
                   ymax > 10 * ymin ? "decode tok/s (log scale)" : "decode tok/s",
                   SVG_LOG2,
                   ymax > 10 * ymin ? SVG_LOG10 : SVG_LINEAR,
                   se,
                   ns,
                   caps,
                   4};
    return svg_chart_write(f, &c);
}

/* Rewrites DIR/bench.csv, bench.md and bench.svg (each atomically).  0, or -1 with a sentence. */
static int write_outputs(const bench *b, char *err, size_t errlen)
{
    static const char *const names[3] = {"bench.csv", "bench.md", "bench.svg"};
    for (int k = 0; k < 3; k++) {
        char *buf = NULL, path[4096];
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
            return util_errf(err, errlen, "out of memory for %s.", names[k]);
        int rc = 0;
        if (k == 0)
            write_csv(b, f);
        else if (k == 1)
            write_md(b, f);
        else
            rc = write_svg(b, f);
        rc |= ferror(f) ? -1 : 0;
        if (fclose(f) != 0 || rc) {
            free(buf);
            return util_errf(err, errlen, "out of memory for %s.", names[k]);
        }
        if (util_pathf(path, sizeof path, "%s/%s", b->o.out_dir, names[k]) != 0) {
            free(buf);
            return util_errf(err, errlen, "%s/%s: path too long.", b->o.out_dir, names[k]);
        }
        rc = util_write_atomic(path, buf, len, err, errlen);
        free(buf);
        if (rc)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- passes */

static int bufs_init(bufs *w, int max_b, int prompt, int verify, int vocab, char *err, size_t errlen)
{
    w->max_b = max_b;
    size_t B = (size_t)max_b, L = B * (size_t)(1 + verify);
    w->rows = calloc(B, sizeof *w->rows);
    w->seqs = calloc(B, sizeof *w->seqs);
    w->seq_row = calloc(B, sizeof *w->seq_row);
    w->prompt = malloc(B * (size_t)prompt * sizeof *w->prompt);
    w->next = calloc(B, sizeof *w->next);
    w->fed = calloc(L, sizeof *w->fed);
    w->want = calloc(L, sizeof *w->want);
    w->picks = calloc(L, sizeof *w->picks);
    w->logits = malloc(L * (size_t)vocab * sizeof *w->logits);
    if (!w->rows || !w->seqs || !w->seq_row || !w->prompt || !w->next || !w->fed || !w->want || !w->picks ||
        !w->logits)
        return util_errf(err, errlen,
                         "out of memory for the buffers of %d rows (%.1f MB of logits); give smaller "
                         "--batches.",
                         max_b, (double)L * vocab * 4 / 1e6);
    uint64_t x = 0x9E3779B97F4A7C15ull; /* the same random prompts every run */
    for (size_t i = 0; i < B * (size_t)prompt; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        w->prompt[i] = (int32_t)((x * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)vocab);
    }
    return 0;
}

static void bufs_free(bufs *w)
{
    free(w->rows), free(w->seqs), free(w->seq_row), free(w->prompt);
    free(w->next), free(w->fed), free(w->want), free(w->picks), free(w->logits);
}

/* One pass over n sequences; each sequence with want_logits sets its row's next token to the greedy pick. */
static int run_pass(bufs *w, const spill_backend *be, int n, int vocab, char *err, size_t errlen)
{
    int R = 0;
    for (int s = 0; s < n; s++)
        R += w->seqs[s].all_logits ? w->seqs[s].n - w->seqs[s].logits_skip : w->seqs[s].want_logits;
    int rc;
    if (be->forward_pick) { /* the argmax where the logits are, as the runner does for greedy rows */
        for (int k = 0; k < R; k++)
            w->want[k] = -1;
        rc = be->forward_pick(be->impl, w->seqs, n, w->want, NULL, w->picks, w->logits, err, errlen);
    } else
        rc = be->forward(be->impl, w->seqs, n, w->logits, err, errlen);
    if (rc)
        return rc;
    for (int s = 0, k = 0; s < n; s++) {
        if (!w->seqs[s].want_logits)
            continue;
        if (w->seqs[s].all_logits) /* a verify pass: the row's last position gives its next token */
            k += w->seqs[s].n - w->seqs[s].logits_skip - 1;
        int32_t best = 0;
        if (be->forward_pick)
            best = w->picks[k].token;
        else {
            const float *l = w->logits + (size_t)k * (size_t)vocab;
            for (int v = 1; v < vocab; v++)
                if (l[v] > l[best])
                    best = v;
        }
        w->next[w->seq_row[s]] = best;
        k++;
    }
    return 0;
}

/* One point: B rows prefill, then decode until --gen steps or --seconds.  0; 1 when the KV cache cannot hold B
 * rows (a sentence in err); or the backend's negative return. */
static int run_point(bench *b, const spill_backend *be, int tier, int B, int chunk, point *pt, char *err, size_t errlen)
{
    bufs *w = &b->w;
    kv_cache *kv = be->kv(be->impl);
    int P = b->o.prompt, V = b->m->vocab, rc = 0, reserved = 0, F = 1 + b->o.verify;
    int32_t span = P + b->o.gen * F;
    for (; reserved < B; reserved++)
        if (kv_row_reserve(kv, &w->rows[reserved], span) != 0) {
            rc = 1;
            util_errf(err, errlen, "the KV cache holds %d pages and %d rows of %d positions need %d.", kv->n_pages, B,
                      span, B * kv_pages_for(kv, span));
            goto out;
        }
    /* prefill: rows in order, at most `chunk` tokens and max_b sequences a pass */
    double t = now_s();
    for (int row = 0, done = 0; row < B;) {
        int n = 0, tokens = 0;
        while (row < B && tokens < chunk && n < w->max_b) {
            int take = P - done < chunk - tokens ? P - done : chunk - tokens;
            w->seqs[n] = (fwd_seq){&w->rows[row],    done,  take, w->prompt + (size_t)row * (size_t)P + done,
                                   done + take == P, false, 0,    0};
            w->seq_row[n++] = row;
            tokens += take;
            done += take;
            if (done == P)
                row++, done = 0;
        }
        if ((rc = run_pass(w, be, n, V, err, errlen)))
            goto out;
    }
    pt->prefill_s = now_s() - t;
    /* decode: one token per row a pass, or with --verify the next token and K proposals (random ids: a pass
     * costs the same whichever are kept), positions advancing by 1 + K as if every proposal were kept */
    int steps = 0;
    t = now_s();
    double el = 0;
    uint64_t x = 0xD1B54A32D192ED03ull;
    while (steps < b->o.gen && (steps == 0 || el < b->o.seconds)) {
        for (int r = 0; r < B; r++) {
            if (F == 1)
                w->seqs[r] = (fwd_seq){&w->rows[r], P + steps, 1, &w->next[r], true, false, 0, 0};
            else {
                int32_t *f = w->fed + (size_t)r * (size_t)F;
                f[0] = w->next[r];
                for (int j = 1; j < F; j++) {
                    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
                    f[j] = (int32_t)((x * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)V);
                }
                w->seqs[r] = (fwd_seq){&w->rows[r], P + steps * F, F, f, true, true, 0, 0};
            }
            w->seq_row[r] = r;
        }
        if ((rc = run_pass(w, be, B, V, err, errlen)))
            goto out;
        steps++;
        el = now_s() - t;
    }
    pt->tier = tier, pt->batch = B, pt->prompt = P, pt->steps = steps;
    pt->seconds = el;
    pt->tok_s = (double)B * steps / el;
    pt->pass_ms = el / steps * 1e3;
    bool streamed = tier_defs[tier].stream;
    pt->gbs = (double)(streamed ? b->stream_bytes : b->weight_bytes[tier]) * steps / el / 1e9;
    pt->limit = tier_limit(b, tier, B, pt->basis, sizeof pt->basis);
out:
    for (int r = 0; r < reserved; r++)
        kv_row_release(kv, &w->rows[r]);
    return rc;
}

/* ---------------------------------------------------------------- tiers */

static engine_opts tier_opts(const bench *b, int tier, int max_b, int chunk)
{
    const struct tier_def *d = &tier_defs[tier];
    int F = 1 + b->o.verify;
    int32_t per_row = (b->o.prompt + b->o.gen * F + PAGE_TOKENS - 1) / PAGE_TOKENS;
    return (engine_opts){.threads = b->o.threads,
                         .max_pass_tokens = chunk > max_b * F ? chunk : max_b * F,
                         .max_pass_seqs = max_b,
                         .max_logit_rows = max_b * F,
                         .page_tokens = PAGE_TOKENS,
                         .kv_pages = (int32_t)max_b * per_row,
                         .stream = d->stream,
                         .stream_slots = 3,
                         .direct_io = true,
                         .q8_activations = b->o.q8,
                         .from_disk = d->from_disk};
}

/* The largest of the requested batches whose KV pages, pass buffers, logits and weights (CPU tiers) fit in 90%
 * of the RAM available now; 0 when none does. */
static int cpu_max_batch(const bench *b, int tier, int chunk)
{
    uint64_t avail = plan_mem_available();
    for (int i = b->o.n_batches - 1; i >= 0; i--) {
        int B = b->o.batches[i];
        if (!avail)
            return B;
        engine_opts eo = tier_opts(b, tier, B, chunk);
        uint64_t wgt, ring, pass;
        engine_mem_estimate(b->m, &eo, b->threads, &wgt, &ring, &pass);
        uint64_t kv =
            (uint64_t)eo.kv_pages * kv_page_bytes(b->m->n_layers, b->m->n_kv_heads, b->m->head_dim, PAGE_TOKENS);
        uint64_t logits = (uint64_t)B * (uint64_t)(1 + b->o.verify) * (uint64_t)b->m->vocab * 4;
        if ((double)(wgt + ring + pass + kv + logits) <= 0.9 * (double)avail)
            return B;
    }
    return 0;
}

static void print_point(const point *p)
{
    char bw[32];
    bound_word(p->basis, bw, sizeof bw);
    printf("%-13s %6d %10.1f %10.1f %9.1f %8.2f %11.1f %7.0f%%  %s\n", tier_defs[p->tier].name, p->batch,
           p->prefill_s > 0 ? (double)p->batch * p->prompt / p->prefill_s : 0.0, p->tok_s, p->pass_ms, p->gbs, p->limit,
           p->limit > 0 ? 100 * p->tok_s / p->limit : 0.0, bw);
    fflush(stdout);
}

/* Opens the tier's backend, sweeps its batches, closes it.  Returns 0, 1 when the tier could not run or
 * failed (said on stderr), ENGINE_EDEVICE on a device fault, or -2 when the files cannot be written (err). */
static int run_tier(bench *b, int tier, char *err, size_t errlen)
{
    const struct tier_def *d = &tier_defs[tier];
    int chunk = d->gpu ? 8192 : 256; /* the runner's prefill chunk on each engine (run_opts.c) */
    chunk = chunk > b->o.prompt ? chunk : b->o.prompt;
    int max_b = b->o.batches[b->o.n_batches - 1];
    if (!d->gpu) {
        max_b = cpu_max_batch(b, tier, chunk);
        if (!max_b) {
            fprintf(stderr, "spill bench: skipping %s: even batch %d would not fit in the RAM available.\n", d->name,
                    b->o.batches[0]);
            add_note(b, "%s skipped: even batch %d would not fit in the RAM available.", d->name, b->o.batches[0]);
            return 1;
        }
        if (max_b < b->o.batches[b->o.n_batches - 1])
            add_note(b,
                     "%s: batches above %d left out: their KV pages and buffers would not fit in the RAM "
                     "available.",
                     d->name, max_b);
    }
    engine_opts eo = tier_opts(b, tier, max_b, chunk);
    spill_backend be;
    char e2[SPILL_ERRLEN];
    int rc = d->gpu ? spill_gpu_open(b->m, &eo, d->stream ? 0 : -1, &be, e2, sizeof e2)
                    : engine_backend_cpu(b->m, &eo, &be, e2, sizeof e2);
    if (rc) {
        fprintf(stderr, "spill bench: %s: %s\n", d->name, e2);
        add_note(b, "%s did not open: %s", d->name, e2);
        return rc == ENGINE_EDEVICE ? ENGINE_EDEVICE : 1;
    }
    snprintf(b->backend[tier], sizeof b->backend[tier], "%s", be.name);
    b->weight_bytes[tier] = be.weight_bytes ? be.weight_bytes : b->m->total_bytes;
    printf("%-13s %s\n", d->name, be.name);
    fflush(stdout);
    int out = 0;
    for (int i = 0; i < b->o.n_batches && b->o.batches[i] <= max_b; i++) {
        int B = b->o.batches[i];
        point *p = &b->pts[b->n_pts];
        memset(p, 0, sizeof *p);
        double t = now_s();
        rc = run_point(b, &be, tier, B, chunk, p, e2, sizeof e2);
        if (rc == 1) {
            printf("%-13s %6d  stopped: %s\n", d->name, B, e2);
            add_note(b, "%s stopped before batch %d: %s", d->name, B, e2);
            break;
        }
        if (rc) {
            fprintf(stderr, "spill bench: %s at batch %d: %s\n", d->name, B, e2);
            add_note(b, "%s failed at batch %d: %s", d->name, B, e2);
            out = rc == ENGINE_EDEVICE ? ENGINE_EDEVICE : 1;
            break;
        }
        b->n_pts++;
        print_point(p);
        if (write_outputs(b, err, errlen)) {
            out = -2;
            break;
        }
        t = now_s() - t;
        if (t > b->o.seconds && i + 1 < b->o.n_batches && b->o.batches[i + 1] <= max_b) {
            printf("%-13s stopping after batch %d: it took %.1f s, over --seconds %.0f\n", d->name, B, t, b->o.seconds);
            add_note(b, "%s stopped after batch %d: the point took %.1f s, over --seconds %.0f.", d->name, B, t,
                     b->o.seconds);
            break;
        }
    }
    kv_cache *kv = be.kv(be.impl);
    for (int r = 0; r < b->w.max_b; r++) /* page tables go with the cache they index */
        kv_row_free(kv, &b->w.rows[r]);
    be.close(be.impl);
    return out;
}

/* ---------------------------------------------------------------- the command */

int bench_main(int argc, char **argv)
{
    static bench b; /* large (points, notes): not on the stack */
    memset(&b, 0, sizeof b);
    char err[SPILL_ERRLEN], path[4096];
    int prc = parse_args(argc, argv, &b.o, err, sizeof err);
    if (prc == 1) {
        bench_help(stdout);
        return SPILL_EX_OK;
    }
    if (prc) {
        fprintf(stderr, "spill bench: %s\n", err);
        return SPILL_EX_USAGE;
    }
    if (!spill_gpu_open) {
        char skipped[128] = "";
        for (int t = 0; t < N_TIERS; t++)
            if (tier_defs[t].gpu && b.o.tier_on[t]) {
                snprintf(skipped + strlen(skipped), sizeof skipped - strlen(skipped), "%s%s", skipped[0] ? ", " : "",
                         tier_defs[t].name);
                b.o.tier_on[t] = false;
            }
        if (skipped[0])
            fprintf(stderr,
                    "spill bench: skipping %s: this spill binary has no GPU engine (build/cuda/spill-cuda "
                    "has one).\n",
                    skipped);
    }
    bool any = false;
    for (int t = 0; t < N_TIERS; t++)
        any |= b.o.tier_on[t];
    if (!any) {
        fprintf(stderr, "spill bench: no tier left to run: the GPU tiers need a CUDA build; ask for resident or "
                        "stream.\n");
        return SPILL_EX_USAGE;
    }
    int rr = model_resolve(b.o.model, path, sizeof path, err, sizeof err);
    if (rr) {
        fprintf(stderr, "spill bench: %s\n", err);
        return model_resolve_exit(rr);
    }
    if (model_open(path, &b.m, err, sizeof err)) {
        fprintf(stderr, "spill bench: %s\n", err);
        return SPILL_EX_DATAERR;
    }
    int code = SPILL_EX_DATAERR;
    arch_layout al; /* the engine the first tier runs on must take this family */
    bool cpu = b.o.tier_on[TIER_RESIDENT] || b.o.tier_on[TIER_STREAM];
    if (model_arch_resolve(b.m, cpu ? ARCH_ENGINE_CPU : ARCH_ENGINE_CUDA, &al, err, sizeof err)) {
        fprintf(stderr, "spill bench: %s\n", err);
        goto out;
    }
    b.t0 = now_s();
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(b.started, sizeof b.started, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (gethostname(b.host, sizeof b.host - 1) != 0)
        snprintf(b.host, sizeof b.host, "this machine");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    b.threads = b.o.threads > 0 ? b.o.threads : cpus > 0 ? (int)cpus : 1;
    b.flops_tok = flops_per_token(b.m);
    b.stream_bytes = streamed_bytes(b.m);
    code = SPILL_EX_CANTCREAT; /* a directory that cannot be written fails now, not after the sweep */
    if (write_outputs(&b, err, sizeof err)) {
        fprintf(stderr, "spill bench: %s\n", err);
        goto out;
    }
    code = SPILL_EX_SOFTWARE;
    if (bufs_init(&b.w, b.o.batches[b.o.n_batches - 1], b.o.prompt, b.o.verify, b.m->vocab, err, sizeof err)) {
        fprintf(stderr, "spill bench: %s\n", err);
        goto out_bufs;
    }
    printf("spill bench %s: %s, %d layers, %.1f MB (%s); %d threads, %s activations; prompt %d, gen %d, at most "
           "%.0f s a point\n",
           b.o.model, b.m->arch, b.m->n_layers, (double)b.m->total_bytes / 1e6, b.m->quant_summary, b.threads,
           b.o.q8 ? "8-bit" : "exact fp32", b.o.prompt, b.o.gen, b.o.seconds);
    if (b.o.verify)
        printf("verify passes: %d tokens a row a pass (--verify %d); tok/s counts one a row\n", 1 + b.o.verify,
               b.o.verify);
    fflush(stdout);
    gather_rates(&b);
    printf("rates:");
    if (b.ram.have)
        printf(" RAM %.2f GB/s (%s);", b.ram.v, b.ram.src);
    if (b.disk.have)
        printf(" disk %.2f GB/s (%s);", b.disk.v, b.disk.src);
    if (b.gemm.have)
        printf(" GEMM %.1f GFLOP/s (%s);", b.gemm.v, b.gemm.src);
    printf("\n%-13s %6s %10s %10s %9s %8s %11s %8s  %s\n", "tier", "batch", "prefill/s", "decode/s", "pass ms", "GB/s",
           "limit tok/s", "of limit", "bound");
    fflush(stdout);
    code = SPILL_EX_OK;
    for (int t = 0; t < N_TIERS; t++) {
        if (!b.o.tier_on[t])
            continue;
        int rc = run_tier(&b, t, err, sizeof err);
        if (rc == -2) {
            fprintf(stderr, "spill bench: %s\n", err);
            code = SPILL_EX_IOERR;
            goto out_bufs;
        }
        if (rc == ENGINE_EDEVICE) {
            code = SPILL_EX_TEMPFAIL;
            break;
        }
        if (rc && code == SPILL_EX_OK)
            code = SPILL_EX_SOFTWARE;
    }
    for (int i = 0; i < b.n_pts; i++)
        if (b.pts[i].limit > 0 && b.pts[i].tok_s > 1.05 * b.pts[i].limit) {
            char bw[32];
            bound_word(b.pts[i].basis, bw, sizeof bw);
            add_note(&b,
                     "%s at batch %d ran at %.0f%% of its limit: the %s rate understates what this tier reaches "
                     "(run `spill probe` again, or expect this of a disk whose rate varies).",
                     tier_defs[b.pts[i].tier].name, b.pts[i].batch, 100 * b.pts[i].tok_s / b.pts[i].limit, bw);
            printf("note: %s\n", b.notes[b.n_notes - 1]);
            break;
        }
    if (write_outputs(&b, err, sizeof err)) { /* the notes and tiers of the last tier, and the total time */
        fprintf(stderr, "spill bench: %s\n", err);
        code = SPILL_EX_IOERR;
        goto out_bufs;
    }
    printf("%d points in %.0f s: %s/bench.csv, bench.md, bench.svg\n", b.n_pts, now_s() - b.t0, b.o.out_dir);
out_bufs:
    bufs_free(&b.w);
out:
    model_close(b.m);
    return code;
}
