/*
 * cuda_engine.cu — the CUDA engine: weights on the GPU (resident or streamed
 * through pinned host RAM), the paged KV arena in HBM, and the forward pass of
 * forward.c on the GPU.
 *
 * Owns: device and pinned memory, the two streams (compute, copy), the layer
 * ring, cuBLAS, and turning CUDA failures into sentences and the sticky code.
 * Does not own: kernels (kernels.cu), page allocation (kv.c, on the host),
 * scheduling, sampling.
 *
 * Memory (L layers, of which Lr resident, Ls = L - Lr streamed):
 *   HBM:    globals (embedding and output head in file dtype; norms, biases as
 *           fp32) · resident arena: Lr layer packs · ring: slots × largest
 *           streamed pack · KV arena (L, n_pages, 2, Kh, P, S) bf16 or int8 + scales (kv.h) ·
 *           pass buffers for max_T tokens · bf16 dequant scratch (largest
 *           non-bf16 matrix) · cuBLAS workspace.
 *   pinned: one arena holding the Ls packs at exact size (anonymous memory read
 *           into by several threads, then cudaHostRegister'd; or cudaHostAlloc), or
 *           with from_disk the disk ring: disk_slots × the largest layer's
 *           4 KiB-aligned file range (stream.h), one allocation.
 * A layer pack is its seven matrices (q, k, v, o, gate, up, down) in file
 * dtype, each at a 256-byte-aligned offset, so a streamed layer is one
 * contiguous H2D copy (what reaches the copy engine's rate).
 *
 * Streaming: copies are numbered k = pass * Ls + i (i = streamed layer index)
 * and go to slot k % slots on the copy stream; copy k waits for the event
 * that compute k - slots recorded after its last use of the slot, and compute
 * k waits for copy k's event.  Copies are issued up to slots - 1 ahead of
 * compute and run on across pass boundaries (the next pass's first layers
 * load while this pass's head and the host's sampling run), so with 3 slots
 * two layers are always in flight.  Streamed and resident layers run the same
 * kernels and GEMMs on the same bytes, so their logits are bit-identical.
 * Measured (bench/results/cuda-run2, H200, 8B-shaped bf16, 32 layers from
 * pinned RAM): pass = 1.00 × bytes / 55 GB/s from 1 to 1,024 decode rows.
 *
 * Disk tier (from_disk): the streamed layers are never cached.  stream.c's
 * reader threads read layer after layer (wrapping into the next pass) into
 * pinned slots with O_DIRECT; pump() takes the next slot in order (waiting
 * for its read), copies the layer's whole file range to the device slot in
 * one H2D copy (tensors are bound at their offsets inside that range, so no
 * host repacking), and hands the pinned slot back to the readers once the
 * copy's event has fired.  Slots are released opportunistically on every
 * pump and, when all are held, by waiting for the oldest copy, so readers
 * never wait on the GPU for longer than one copy (~10 ms for an 8B layer).
 *
 * Logits: the requested rows (last token, or every token of an all_logits
 * sequence) are gathered, normed and multiplied by the head on the GPU, then
 * copied into a pinned buffer; the caller either gets a copy or reads them in
 * place (cuda_engine_logits), which at 1,024 rows × 128k vocab saves a 525 MB
 * host copy that the stream cannot hide.
 *
 * Errors: every CUDA and cuBLAS call is checked.  Errors that poison the
 * context (illegal address, launch failure, ECC, ...) set a process-wide flag
 * and return CUDA_ENGINE_EDEVICE from then on; other failures return -1 with
 * a sentence.  A failure in the middle of a pass leaves the ring's numbering
 * unknown, so the engine then refuses further passes (reopen it).
 */
#include "cuda_backend.h"

#include <cublas_v2.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "../cpu.h"
#include "../stream.h"
#include "../gguf.h"
#include "../quant.h"
#include "../util.h"
}
#include "kernels.cuh"

#define PACK_ALIGN 256

enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_COUNT };

/* Profile marks inside a layer (SPILL_CUDA_PROF): segment i runs from mark i to mark i + 1. */
#define PROF_MARKS 10
static const char *const PROF_SEG[PROF_MARKS - 1] = {"attn norm",    "gemm q,k,v", "bias/norm/rope/kv write",
                                                     "attention",    "gemm o + add", "ffn norm",
                                                     "gemm gate,up", "act",        "gemm down + add"};

typedef struct dmat {
    const model_tensor *t;
    uint32_t type;
    int64_t n, k; /* N rows of K elements */
    size_t row_bytes;
    size_t off; /* byte offset in the layer pack (0 for globals) */
} dmat;

typedef struct dlayer {
    dmat m[M_COUNT];
    size_t pack_bytes;
    bool resident;
    uint8_t *dev;                                                 /* resident: the pack in HBM */
    uint8_t *host;                                                /* streamed: the pack in the pinned arena */
    float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffw_norm; /* (D) device fp32 */
    float *q_norm, *k_norm;                                       /* (S) */
    float *bq, *bk, *bv;                                          /* (H*S), (Kh*S), (Kh*S) */
} dlayer;

struct cuda_engine {
    model_desc *m;
    cuda_engine_opts o;
    int max_T, max_seqs, max_rows; /* tokens, sequences, logit rows per pass */
    kv_cache kv;                   /* host page bookkeeping; arena NULL */
    uint8_t *d_kv;                 /* (L, n_pages, block): kv.h's layout in bf16 or int8 + scales */

    cudaStream_t cs, xs; /* compute, copy */
    cublasHandle_t blas;
    void *blas_ws;

    uint8_t *d_embd, *d_out;
    dmat embd, out;
    float *out_norm;
    dlayer *layers;
    uint8_t *d_res;    /* resident packs */
    uint8_t *h_pinned; /* streamed packs */
    size_t h_pinned_map; /* > 0: h_pinned is an anonymous mapping of this size (registered if st.pin_registered) */
    float *d_inv_freq, *d_inv_freq_local;
    cpu_rope rope, rope_local;
    float embed_scale;
    bool gelu;

    /* ring */
    int ns, slots, first_streamed;
    size_t slot_bytes;
    uint8_t *d_ring;
    cudaEvent_t *ev_copied, *ev_free; /* (slots) */
    cudaEvent_t *ev_cs[2], *ev_ce[2]; /* (ns) per pass parity: copy start / end */
    uint64_t copies_issued, computes_freed;
    int att_tiles;          /* this pass's attention plan (build_meta) */
    int64_t att_singles;
    int32_t att_max_len; /* the longest per-token row's positions this pass (pos + 1) */
    float *att_part;     /* split decode attention's parts (k_attention_part_floats) */

    /* disk tier */
    stream *disk;
    int hslots;             /* pinned host slots */
    cudaEvent_t *ev_hdone;  /* (hslots) the copy out of host slot i finished */
    uint64_t h_acquired, h_released; /* host slots taken from / given back to the stream, in copy order */

    /* pass buffers (device) */
    /* R = max_rows logit rows, B = max_seqs */
    float *x, *h, *q, *k, *v, *att, *g, *u, *last, *logits; /* (T,D) (T,D) (T,HS) (T,KS)x2 (T,HS) (T,F)x2 (R,D) (R,V) */
    bf16 *xb, *lastb, *wscratch;                            /* (T, max(D,HS,F)), (R, D), largest non-bf16 matrix */
    int32_t *d_meta, *h_meta;                               /* tok(T) pos(T) seq(T) rows(R) pt_off(B) pages(n_pages) */
    float *h_logits;                                        /* pinned (R, V) */
    int32_t *d_want, *h_want;                               /* (R) pick requests, device and pinned */
    pick_out *d_picks, *h_picks;                            /* (R) */

    void **allocs; /* every cudaMalloc, freed at close */
    size_t n_allocs, cap_allocs;
    int n_dev_allocs; /* for the fail_alloc_at hook */
    cuda_engine_stats st;
    bool broken;

    /* SPILL_CUDA_PROF=1: per-layer segment times from compute-stream events, printed at close */
    bool prof;
    cudaEvent_t *pev; /* (L, PROF_MARKS) */
    cudaEvent_t phead[2];
    double pacc[2][PROF_MARKS + 2]; /* [prefill?][segment, wait between layers, head] seconds */
    double pflop[2][4];             /* [prefill?][qkv, o, gate/up, down] FLOPs */
    uint64_t ppass[2], ptok[2];
};

static bool g_poisoned; /* the process's CUDA context is unusable */

static void prof_report(const cuda_engine *e);

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- errors */

static bool is_sticky(cudaError_t c)
{
    switch (c) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
    case cudaErrorContextIsDestroyed:
        return true;
    default:
        return false;
    }
}

/* Turns a failed CUDA call into the return code and one sentence. */
static int cu_fail(cudaError_t c, const char *what, int line, char *err, size_t errlen)
{
    if (is_sticky(c) || g_poisoned) {
        g_poisoned = true;
        util_errf(err, errlen,
                  "GPU fault during %s (cuda_engine.cu:%d): %s (%s); the CUDA context is unusable, exit and resume "
                  "the job.",
                  what, line, cudaGetErrorName(c), cudaGetErrorString(c));
        return CUDA_ENGINE_EDEVICE;
    }
    cudaGetLastError(); /* clear a non-sticky error */
    return util_errf(err, errlen, "CUDA call %s failed (cuda_engine.cu:%d): %s (%s).", what, line, cudaGetErrorName(c),
                     cudaGetErrorString(c));
}

#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t c_ = (call);                                                                                       \
        if (c_ != cudaSuccess)                                                                                         \
            return cu_fail(c_, #call, __LINE__, err, errlen);                                                          \
    } while (0)

static int blas_fail(cublasStatus_t s, const char *what, int line, char *err, size_t errlen)
{
    cudaError_t c = cudaPeekAtLastError();
    if (c != cudaSuccess || g_poisoned)
        return cu_fail(c != cudaSuccess ? c : cudaErrorUnknown, what, line, err, errlen);
    return util_errf(err, errlen, "cuBLAS call %s failed (cuda_engine.cu:%d): %s.", what, line,
                     cublasGetStatusString(s));
}

#define CB(call)                                                                                                       \
    do {                                                                                                               \
        cublasStatus_t s_ = (call);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                               \
            return blas_fail(s_, #call, __LINE__, err, errlen);                                                        \
    } while (0)

/* cudaMalloc with accounting, the test hook, and the out-of-memory sentence. */
static int dalloc(cuda_engine *e, void **p, size_t bytes, const char *what, char *err, size_t errlen)
{
    *p = NULL;
    if (bytes == 0)
        bytes = 256;
    if (e->n_allocs == e->cap_allocs) {
        size_t cap = e->cap_allocs ? 2 * e->cap_allocs : 64;
        void **a = (void **)realloc(e->allocs, cap * sizeof *a);
        if (!a)
            return util_errf(err, errlen, "out of host memory tracking GPU allocations.");
        e->allocs = a;
        e->cap_allocs = cap;
    }
    e->n_dev_allocs++;
    cudaError_t c = e->o.fail_alloc_at == e->n_dev_allocs ? cudaErrorMemoryAllocation : cudaMalloc(p, bytes);
    if (c == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        *p = NULL;
        return util_errf(err, errlen,
                         "out of GPU memory allocating %.3f MiB for %s (%.2f of %.2f GiB free); lower the KV pages or "
                         "the per-pass token cap, or stream more layers (fewer resident layers).",
                         (double)bytes / (1 << 20), what, (double)fr / (1 << 30), (double)tot / (1 << 30));
    }
    if (c != cudaSuccess)
        return cu_fail(c, "cudaMalloc", __LINE__, err, errlen);
    e->allocs[e->n_allocs++] = *p;
    e->st.device_bytes += bytes;
    return 0;
}

static void note_peak(cuda_engine *e)
{
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > e->st.peak_device_used)
        e->st.peak_device_used = tot - fr;
}

/* ---------------------------------------------------------------- loading */

static const model_tensor *find(const model_desc *m, const char *name)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

typedef struct file_reader {
    const model_desc *m;
    int *fds;
} file_reader;

static int read_from_files(void *ctx, const model_tensor *t, void *dst, char *err, size_t errlen)
{
    file_reader *fr = (file_reader *)ctx;
    const char *path = fr->m->files[t->file].path;
    if (fr->fds[t->file] < 0 && (fr->fds[t->file] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return util_errf(err, errlen, "%s: cannot open: %s.", path, strerror(errno));
    uint8_t *d = (uint8_t *)dst;
    uint64_t off = t->offset, len = t->size;
    while (len) {
        size_t chunk = len > (64u << 20) ? (64u << 20) : (size_t)len;
        ssize_t r = pread(fr->fds[t->file], d, chunk, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return util_errf(err, errlen, "%s: read of tensor %s failed at byte %llu: %s.", path, t->name,
                             (unsigned long long)off, r < 0 ? strerror(errno) : "unexpected end of file");
        d += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

/* The pinned arena's fill at open: threads take tensors in order (an atomic cursor) and pread them into
 * place.  Buffered reads in parallel: a model in the page cache or a sparse file copies at memory speed
 * instead of one core's, and a cold disk sees several requests in flight.  The files are opened before the
 * threads start (read_from_files opens lazily, which is not thread-safe). */
typedef struct pin_job {
    const model_tensor *t;
    uint8_t *dst;
} pin_job;

typedef struct pin_fill {
    file_reader *fr;
    const pin_job *jobs;
    size_t n;
    size_t next; /* atomic cursor */
    int failed;  /* atomic: the first failure stops the others */
    char err[SPILL_ERRLEN];
} pin_fill;

static void *pin_fill_thread(void *arg)
{
    pin_fill *pf = (pin_fill *)arg;
    char err[SPILL_ERRLEN];
    for (;;) {
        size_t i = __atomic_fetch_add(&pf->next, 1, __ATOMIC_RELAXED);
        if (i >= pf->n || __atomic_load_n(&pf->failed, __ATOMIC_RELAXED))
            return NULL;
        if (read_from_files(pf->fr, pf->jobs[i].t, pf->jobs[i].dst, err, sizeof err) &&
            !__atomic_exchange_n(&pf->failed, 1, __ATOMIC_ACQ_REL))
            snprintf(pf->err, sizeof pf->err, "%s", err);
    }
}

/* Reads jobs[0..n) with up to `threads` threads; 0 or -1 with the first failure's sentence. */
static int pin_fill_run(file_reader *fr, const pin_job *jobs, size_t n, int threads, char *err, size_t errlen)
{
    const model_desc *m = fr->m;
    for (size_t f = 0; f < m->n_files; f++)
        if (fr->fds[f] < 0 && (fr->fds[f] = open(m->files[f].path, O_RDONLY | O_CLOEXEC)) < 0)
            return util_errf(err, errlen, "%s: cannot open: %s.", m->files[f].path, strerror(errno));
    pin_fill pf = {fr, jobs, n, 0, 0, {0}};
    pthread_t tid[8];
    int started = 0;
    threads = threads > 8 ? 8 : threads;
    for (; started < threads - 1; started++)
        if (pthread_create(&tid[started], NULL, pin_fill_thread, &pf))
            break; /* fewer helpers: this thread reads the rest */
    pin_fill_thread(&pf);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    return pf.failed ? util_errf(err, errlen, "%s", pf.err) : 0;
}

/* Reads tensor t with the engine's reader. */
static int read_tensor(cuda_engine *e, file_reader *fr, const model_tensor *t, void *dst, char *err, size_t errlen)
{
    if (e->o.reader)
        return e->o.reader(e->o.reader_ctx, t, dst, err, errlen);
    return read_from_files(fr, t, dst, err, errlen);
}

/* Describes a matrix of N rows × K columns (GGUF ne = [K, N]); w->t stays NULL when absent and optional. */
static int bind_mat(cuda_engine *e, dmat *w, const char *name, int64_t n, int64_t k, bool required, char *err,
                    size_t errlen)
{
    const model_tensor *t = find(e->m, name);
    memset(w, 0, sizeof *w);
    if (!t)
        return required ? util_errf(err, errlen, "%s: tensor %s is missing.", e->m->source, name) : 0;
    if (t->n_dims != 2 || (int64_t)t->ne[0] != k || (int64_t)t->ne[1] != n)
        return util_errf(err, errlen, "%s: tensor %s has shape [%llu, %llu] but the config implies [%lld, %lld].",
                         e->m->source, name, (unsigned long long)t->ne[1], (unsigned long long)t->ne[0], (long long)n,
                         (long long)k);
    if (!kq_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &w->row_bytes) != 0 ||
        (uint64_t)w->row_bytes * (uint64_t)n != t->size)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which the CUDA backend cannot multiply.",
                         e->m->source, name, quant_type_name(t->dtype));
    w->t = t;
    w->type = t->dtype;
    w->n = n;
    w->k = k;
    return 0;
}

/* Uploads a 1-D tensor of n elements as fp32 (NULL when absent and optional). */
static int bind_vec(cuda_engine *e, file_reader *fr, float **out, const char *name, int64_t n, bool required, char *err,
                    size_t errlen)
{
    const model_tensor *t = find(e->m, name);
    *out = NULL;
    if (!t)
        return required ? util_errf(err, errlen, "%s: tensor %s is missing.", e->m->source, name) : 0;
    if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1 ||
        (t->dtype != GGML_F32 && t->dtype != GGML_F16 && t->dtype != GGML_BF16))
        return util_errf(err, errlen, "%s: tensor %s must be %lld F32, F16 or BF16 values.", e->m->source, name,
                         (long long)n);
    uint8_t *raw = (uint8_t *)malloc((size_t)t->size + 4);
    float *f = (float *)malloc((size_t)n * sizeof(float));
    int rc = !raw || !f ? util_errf(err, errlen, "out of host memory binding %s.", name)
                        : read_tensor(e, fr, t, raw, err, errlen);
    if (rc == 0 && quant_dequant_row(t->dtype, raw, f, n) != 0)
        rc = util_errf(err, errlen, "%s: tensor %s cannot be converted.", e->m->source, name);
    if (rc == 0)
        rc = dalloc(e, (void **)out, (size_t)n * sizeof(float), name, err, errlen);
    if (rc == 0) {
        cudaError_t c = cudaMemcpy(*out, f, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
        if (c != cudaSuccess)
            rc = cu_fail(c, "cudaMemcpy (1-D tensor)", __LINE__, err, errlen);
    }
    free(raw);
    free(f);
    return rc;
}

/* Reads a whole matrix into HBM at dst (through a host bounce buffer; load time only). */
static int upload_mat(cuda_engine *e, file_reader *fr, const dmat *w, uint8_t *dst, uint8_t **bounce,
                      size_t *bounce_cap, char *err, size_t errlen)
{
    size_t sz = (size_t)w->t->size;
    if (sz > *bounce_cap) {
        free(*bounce);
        *bounce = (uint8_t *)malloc(sz);
        *bounce_cap = *bounce ? sz : 0;
        if (!*bounce)
            return util_errf(err, errlen, "out of host memory reading %s (%zu bytes).", w->t->name, sz);
    }
    if (read_tensor(e, fr, w->t, *bounce, err, errlen))
        return -1;
    CU(cudaMemcpy(dst, *bounce, sz, cudaMemcpyHostToDevice));
    return 0;
}

static int rope_setup(cuda_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    cpu_rope_cfg c;
    memset(&c, 0, sizeof c);
    c.style = m->rope_style == ROPE_NORM ? CPU_ROPE_NORM : CPU_ROPE_NEOX;
    c.n_rot = m->rope_dim;
    c.freq_base = m->rope_theta;
    c.scaling = m->rope_scaling == ROPE_SCALE_LINEAR   ? CPU_ROPE_SCALE_LINEAR
                : m->rope_scaling == ROPE_SCALE_LLAMA3 ? CPU_ROPE_SCALE_LLAMA3
                : m->rope_scaling == ROPE_SCALE_YARN   ? CPU_ROPE_SCALE_YARN
                                                       : CPU_ROPE_SCALE_NONE;
    if (m->rope_scaling == ROPE_SCALE_DYNAMIC)
        return util_errf(err, errlen, "%s: dynamic RoPE scaling is not implemented.", m->source);
    if (m->format == MODEL_GGUF && m->rope_scaling == ROPE_SCALE_LLAMA3)
        return util_errf(err, errlen, "%s: GGUF llama3 RoPE scaling (rope_freqs tensor) is not wired yet.", m->source);
    c.factor = m->rope_factor;
    c.low_freq_factor = m->rope_low_freq;
    c.high_freq_factor = m->rope_high_freq;
    c.orig_max_pos = m->rope_orig_ctx;
    c.beta_fast = m->rope_beta_fast;
    c.beta_slow = m->rope_beta_slow;
    c.attn_factor = m->rope_attn_factor;
    if (cpu_rope_init(&e->rope, &c, err, errlen))
        return -1;
    c.freq_base = m->rope_theta_local > 0 ? m->rope_theta_local : m->rope_theta;
    if (m->rope_theta_local > 0)
        c.scaling = CPU_ROPE_SCALE_NONE;
    if (cpu_rope_init(&e->rope_local, &c, err, errlen))
        return -1;
    size_t bytes = (size_t)(m->rope_dim / 2) * sizeof(float);
    if (dalloc(e, (void **)&e->d_inv_freq, bytes, "RoPE frequencies", err, errlen) ||
        dalloc(e, (void **)&e->d_inv_freq_local, bytes, "RoPE frequencies", err, errlen))
        return -1;
    CU(cudaMemcpy(e->d_inv_freq, e->rope.inv_freq, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(e->d_inv_freq_local, e->rope_local.inv_freq, bytes, cudaMemcpyHostToDevice));
    return 0;
}

/* Describes every layer's matrices and pack layout, uploads norms and biases. */
static int bind_layers(cuda_engine *e, file_reader *fr, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, H = m->n_heads, K = m->n_kv_heads, S = m->head_dim, F = m->ffn_dim;
    char nm[96];
    e->layers = (dlayer *)calloc((size_t)m->n_layers, sizeof *e->layers);
    if (!e->layers)
        return util_errf(err, errlen, "out of host memory binding layers.");
    for (int l = 0; l < m->n_layers; l++) {
        dlayer *w = &e->layers[l];
#define NM(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
        if (bind_mat(e, &w->m[M_Q], NM("attn_q.weight"), H * S, D, true, err, errlen) ||
            bind_mat(e, &w->m[M_K], NM("attn_k.weight"), K * S, D, true, err, errlen) ||
            bind_mat(e, &w->m[M_V], NM("attn_v.weight"), K * S, D, true, err, errlen) ||
            bind_mat(e, &w->m[M_O], NM("attn_output.weight"), D, H * S, true, err, errlen) ||
            bind_mat(e, &w->m[M_GATE], NM("ffn_gate.weight"), F, D, true, err, errlen) ||
            bind_mat(e, &w->m[M_UP], NM("ffn_up.weight"), F, D, true, err, errlen) ||
            bind_mat(e, &w->m[M_DOWN], NM("ffn_down.weight"), D, F, true, err, errlen) ||
            bind_vec(e, fr, &w->attn_norm, NM("attn_norm.weight"), D, true, err, errlen) ||
            bind_vec(e, fr, &w->bq, NM("attn_q.bias"), H * S, false, err, errlen) ||
            bind_vec(e, fr, &w->bk, NM("attn_k.bias"), K * S, false, err, errlen) ||
            bind_vec(e, fr, &w->bv, NM("attn_v.bias"), K * S, false, err, errlen) ||
            bind_vec(e, fr, &w->q_norm, NM("attn_q_norm.weight"), S, m->qk_norm, err, errlen) ||
            bind_vec(e, fr, &w->k_norm, NM("attn_k_norm.weight"), S, m->qk_norm, err, errlen) ||
            bind_vec(e, fr, &w->post_attn_norm, NM("post_attention_norm.weight"), D, false, err, errlen) ||
            bind_vec(e, fr, &w->ffn_norm, NM("ffn_norm.weight"), D, true, err, errlen) ||
            bind_vec(e, fr, &w->post_ffw_norm, NM("post_ffw_norm.weight"), D, false, err, errlen))
            return -1;
#undef NM
        size_t off = 0;
        for (int i = 0; i < M_COUNT; i++) {
            w->m[i].off = off;
            off += ((size_t)w->m[i].t->size + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
        }
        w->pack_bytes = off;
    }
    return 0;
}

static void *pinned_alloc(size_t bytes, void *ctx)
{
    (void)ctx;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* out of pinnable memory is not sticky: stream_open reports it */
        return NULL;
    }
    return p;
}

static void pinned_release(void *p, void *ctx)
{
    (void)ctx;
    cudaFreeHost(p);
}

/* Disk tier: opens the stream over layers [lr, L) and binds each streamed matrix at its offset inside
 * the layer's slot (the layer's file range as read), so one copy moves the slot as it landed. */
static int open_disk_tier(cuda_engine *e, int lr, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    if (e->o.reader)
        return util_errf(err, errlen, "the disk tier reads the model's files; it cannot use a weight reader.");
    int hs = e->o.disk_slots > 0 ? e->o.disk_slots : 5;
    hs = hs < 2 ? 2 : hs;
    stream_opts so = {};
    so.slots = hs;
    so.readers = hs - 1;
    so.chunk_bytes = 16u << 20;
    so.direct = e->o.disk_direct;
    so.first_layer = lr;
    so.alloc = pinned_alloc;
    so.release = pinned_release;
    if (stream_open(m, &so, &e->disk, err, errlen))
        return -1;
    e->hslots = hs;
    e->slot_bytes = stream_slot_bytes(e->disk);
    for (int l = lr; l < m->n_layers; l++) {
        dlayer *w = &e->layers[l];
        for (int i = 0; i < M_COUNT; i++) {
            int64_t at = stream_slot_offset(e->disk, l, w->m[i].t->file, w->m[i].t->offset);
            if (at < 0)
                return util_errf(err, errlen, "%s: tensor %s lies outside layer %d's byte range.", m->source,
                                 w->m[i].t->name, l);
            w->m[i].off = (size_t)at;
        }
        w->pack_bytes = stream_layer_len(e->disk, l);
        e->st.streamed_bytes_per_pass += w->pack_bytes;
    }
    e->ev_hdone = (cudaEvent_t *)calloc((size_t)hs, sizeof(cudaEvent_t));
    if (!e->ev_hdone)
        return util_errf(err, errlen, "out of host memory for stream events.");
    for (int i = 0; i < hs; i++)
        CU(cudaEventCreateWithFlags(&e->ev_hdone[i], cudaEventDisableTiming));
    e->st.from_disk = true;
    e->st.disk_ring_bytes = stream_ring_bytes(e->disk);
    return 0;
}

/* How the arena of streamed layers is pinned.  By default: anonymous memory that the reader threads fill (the
 * kernel faults and zeroes its pages on those threads, in parallel), registered with the driver afterwards in
 * one call.  cudaHostAlloc instead faults and zeroes every page on one thread before the reads start: 54-110 s
 * for 137 GB on the H200 machine (bench/results/device-b1-80-*).  Measured on 68.5 GB, alternating
 * (bench/results/device-pin-run15, tools/device_pin.sh): ready in 27.0 and 10.0 s registered, 39.1 and 36.6 s
 * with cudaHostAlloc (pinning 1.8-4.7 s vs 28.1-31.3 s), identical answers.  SPILL_CUDA_PIN=alloc keeps
 * cudaHostAlloc (for A/B measurements); it is also the fallback where the driver refuses to register. */
static bool pin_by_register(void)
{
    const char *v = getenv("SPILL_CUDA_PIN");
    return !(v && !strcmp(v, "alloc"));
}

static int pin_refused(const cuda_engine *e, size_t bytes, char *err, size_t errlen)
{
    return util_errf(err, errlen,
                     "cannot pin %.2f GiB of host RAM for %d streamed layers; keep more layers resident or free host "
                     "memory.",
                     (double)bytes / (1 << 30), e->ns);
}

static int pin_alloc(cuda_engine *e, size_t bytes, char *err, size_t errlen)
{
    cudaError_t c = cudaHostAlloc((void **)&e->h_pinned, bytes, cudaHostAllocDefault);
    if (c == cudaSuccess)
        return 0;
    e->h_pinned = NULL;
    if (c == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return pin_refused(e, bytes, err, errlen);
    }
    return cu_fail(c, "cudaHostAlloc", __LINE__, err, errlen);
}

/* Pins the filled anonymous arena in place; where the driver refuses (not out of memory), copies it into a
 * cudaHostAlloc arena instead and moves the layers' host pointers there. */
static int pin_register(cuda_engine *e, size_t bytes, char *err, size_t errlen)
{
    cudaError_t c = cudaHostRegister(e->h_pinned, bytes, cudaHostRegisterDefault);
    if (c == cudaSuccess) {
        e->st.pin_registered = true;
        return 0;
    }
    cudaGetLastError();
    if (c == cudaErrorMemoryAllocation)
        return pin_refused(e, bytes, err, errlen);
    uint8_t *mapped = e->h_pinned;
    e->h_pinned = NULL;
    if (pin_alloc(e, bytes, err, errlen)) {
        e->h_pinned = mapped; /* still owned as a mapping: close unmaps it */
        return -1;
    }
    memcpy(e->h_pinned, mapped, bytes);
    for (int l = 0; l < e->m->n_layers; l++)
        if (e->layers[l].host)
            e->layers[l].host = e->h_pinned + (e->layers[l].host - mapped);
    munmap(mapped, bytes);
    e->h_pinned_map = 0;
    return 0;
}

/* Places layer packs: a resident prefix in one HBM arena, the rest in one pinned arena (exact size) or,
 * with from_disk, read every pass through the disk tier; plus the device ring. */
static int place_layers(cuda_engine *e, file_reader *fr, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int L = m->n_layers;
    int lr = !e->o.streamed ? L : (e->o.resident_layers < 0 ? 0 : e->o.resident_layers > L ? L : e->o.resident_layers);
    bool disk = e->o.streamed && e->o.from_disk && lr < L;
    size_t res_bytes = 0, pin_bytes = 0;
    for (int l = 0; l < L; l++) {
        dlayer *w = &e->layers[l];
        w->resident = l < lr;
        if (w->resident) {
            w->dev = (uint8_t *)(uintptr_t)res_bytes; /* offset until the arena exists */
            res_bytes += w->pack_bytes;
        } else if (!disk) {
            w->host = (uint8_t *)(uintptr_t)pin_bytes;
            pin_bytes += w->pack_bytes;
            if (w->pack_bytes > e->slot_bytes)
                e->slot_bytes = w->pack_bytes;
        }
    }
    e->first_streamed = lr;
    e->ns = L - lr;
    if (disk && open_disk_tier(e, lr, err, errlen))
        return -1;
    if (res_bytes && dalloc(e, (void **)&e->d_res, res_bytes, "resident layers", err, errlen))
        return -1;
    bool reg = pin_bytes && pin_by_register();
    double t_pin = mono();
    if (reg) {
        void *p = mmap(NULL, pin_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return util_errf(err, errlen,
                             "cannot map %.2f GiB of host RAM for %d streamed layers (%s); keep more layers resident or "
                             "free host memory.",
                             (double)pin_bytes / (1 << 30), e->ns, strerror(errno));
        madvise(p, pin_bytes, MADV_HUGEPAGE); /* fewer faults and a shorter page list to pin; advisory */
        e->h_pinned = (uint8_t *)p;
        e->h_pinned_map = pin_bytes;
    } else if (pin_bytes && pin_alloc(e, pin_bytes, err, errlen)) {
        return -1;
    }
    e->st.pinned_bytes = pin_bytes;
    e->st.pin_alloc_s = mono() - t_pin;
    uint8_t *bounce = NULL;
    size_t bounce_cap = 0;
    int rc = 0;
    pin_job *jobs = NULL;
    size_t nj = 0;
    if (pin_bytes && !e->o.reader && !(jobs = (pin_job *)malloc((size_t)L * M_COUNT * sizeof *jobs)))
        return util_errf(err, errlen, "out of host memory.");
    for (int l = 0; l < L && rc == 0; l++) {
        dlayer *w = &e->layers[l];
        if (w->resident)
            w->dev = e->d_res + (size_t)(uintptr_t)w->dev;
        else if (disk)
            continue;
        else
            w->host = e->h_pinned + (size_t)(uintptr_t)w->host;
        for (int i = 0; i < M_COUNT && rc == 0; i++) {
            if (w->resident)
                rc = upload_mat(e, fr, &w->m[i], w->dev + w->m[i].off, &bounce, &bounce_cap, err, errlen);
            else if (jobs)
                jobs[nj++] = (pin_job){w->m[i].t, w->host + w->m[i].off};
            else /* a caller's reader (tests): one thread, in order */
                rc = read_tensor(e, fr, w->m[i].t, w->host + w->m[i].off, err, errlen);
        }
    }
    free(bounce);
    double t_read = mono();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    e->st.pin_readers = !jobs ? 1 : cores >= 16 ? 8 : 4;
    if (rc == 0 && jobs)
        rc = pin_fill_run(fr, jobs, nj, e->st.pin_readers, err, errlen);
    e->st.pin_read_s = mono() - t_read;
    free(jobs);
    if (rc == 0 && reg) {
        t_pin = mono();
        rc = pin_register(e, pin_bytes, err, errlen);
        e->st.pin_alloc_s += mono() - t_pin;
    }
    if (rc)
        return rc;
    e->st.resident_weight_bytes += res_bytes;
    if (!disk)
        e->st.streamed_bytes_per_pass = pin_bytes;
    e->st.n_streamed = e->ns;
    if (e->ns == 0)
        return 0;
    int slots = e->o.ring_slots > 0 ? e->o.ring_slots : 3;
    slots = slots < 2 ? 2 : slots;
    e->slots = slots > e->ns ? e->ns : slots; /* keeps copies within one pass ahead (see the header comment) */
    e->st.ring_slots = e->slots;
    if (dalloc(e, (void **)&e->d_ring, e->slot_bytes * (size_t)e->slots, "the streaming ring", err, errlen))
        return -1;
    e->ev_copied = (cudaEvent_t *)calloc((size_t)e->slots, sizeof(cudaEvent_t));
    e->ev_free = (cudaEvent_t *)calloc((size_t)e->slots, sizeof(cudaEvent_t));
    for (int p = 0; p < 2; p++) {
        e->ev_cs[p] = (cudaEvent_t *)calloc((size_t)e->ns, sizeof(cudaEvent_t));
        e->ev_ce[p] = (cudaEvent_t *)calloc((size_t)e->ns, sizeof(cudaEvent_t));
        if (!e->ev_cs[p] || !e->ev_ce[p])
            return util_errf(err, errlen, "out of host memory for stream events.");
    }
    if (!e->ev_copied || !e->ev_free)
        return util_errf(err, errlen, "out of host memory for stream events.");
    for (int i = 0; i < e->slots; i++) {
        CU(cudaEventCreateWithFlags(&e->ev_copied[i], cudaEventDisableTiming));
        CU(cudaEventCreateWithFlags(&e->ev_free[i], cudaEventDisableTiming));
    }
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < e->ns; i++) {
            CU(cudaEventCreate(&e->ev_cs[p][i]));
            CU(cudaEventCreate(&e->ev_ce[p][i]));
        }
    return 0;
}

static int bind_globals(cuda_engine *e, file_reader *fr, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, V = m->vocab;
    if (bind_mat(e, &e->embd, "token_embd.weight", V, D, true, err, errlen) ||
        bind_mat(e, &e->out, "output.weight", V, D, false, err, errlen) ||
        bind_vec(e, fr, &e->out_norm, "output_norm.weight", D, true, err, errlen))
        return -1;
    uint8_t *bounce = NULL;
    size_t cap = 0;
    int rc = dalloc(e, (void **)&e->d_embd, (size_t)e->embd.t->size, "the embedding table", err, errlen);
    if (rc == 0)
        rc = upload_mat(e, fr, &e->embd, e->d_embd, &bounce, &cap, err, errlen);
    if (rc == 0 && e->out.t) {
        rc = dalloc(e, (void **)&e->d_out, (size_t)e->out.t->size, "the output head", err, errlen);
        if (rc == 0)
            rc = upload_mat(e, fr, &e->out, e->d_out, &bounce, &cap, err, errlen);
    }
    free(bounce);
    if (rc)
        return rc;
    if (!e->out.t) { /* tied embeddings */
        e->out = e->embd;
        e->d_out = e->d_embd;
    } else {
        e->st.resident_weight_bytes += e->out.t->size;
    }
    e->st.resident_weight_bytes += e->embd.t->size;
    return 0;
}

/* Bytes of each device pass buffer for caps T (tokens), B (sequences), R (logit rows): alloc_pass takes
 * these, and cuda_engine_pass_bytes sums them so the HBM plan can leave exactly that beside KV. */
#define BLAS_WS_BYTES (32u << 20)

typedef struct pass_sizes {
    size_t act_d;    /* x, h: T x D fp32 */
    size_t act_hs;   /* q, att: T x heads*S fp32 */
    size_t act_ks;   /* k, v: T x kv_heads*S fp32 */
    size_t act_f;    /* g, u: T x F fp32 */
    size_t last;     /* R x D fp32 */
    size_t logits;   /* R x V fp32 (and its pinned host copy) */
    size_t xb;       /* T x max(D, heads*S, F) bf16 */
    size_t lastb;    /* R x D bf16 */
    size_t scratch;  /* dequant scratch: the largest non-bf16 matrix, bf16 (0: none) */
    size_t meta;     /* pass metadata (and its pinned host copy), less the page table */
    size_t part;     /* split decode attention's parts */
    size_t blas_ws;  /* cuBLAS workspace */
    size_t want;     /* R x int32 (and host) */
    size_t picks;    /* R x pick_out (and host) */
} pass_sizes;

static pass_sizes pass_sizes_for(const model_desc *m, size_t T, size_t B, size_t R, size_t scratch_elems)
{
    size_t D = (size_t)m->d_model, V = (size_t)m->vocab;
    size_t HS = (size_t)m->n_heads * m->head_dim, KS = (size_t)m->n_kv_heads * m->head_dim, F = (size_t)m->ffn_dim;
    size_t wide = D > HS ? D : HS;
    wide = wide > F ? wide : F;
    pass_sizes p;
    p.act_d = T * D * 4;
    p.act_hs = T * HS * 4;
    p.act_ks = T * KS * 4;
    p.act_f = T * F * 4;
    p.last = R * D * 4;
    p.logits = R * V * 4;
    p.xb = T * wide * 2;
    p.lastb = R * D * 2;
    p.scratch = scratch_elems * 2;
    p.meta = (3 * T + R + B + 3 * T) * 4; /* tok pos seq, rows, pt_off, tiles (2T) singles */
    p.part = k_attention_part_floats(m->head_dim) * 4;
    p.blas_ws = BLAS_WS_BYTES;
    p.want = R * 4;
    p.picks = R * sizeof(pick_out);
    return p;
}

static size_t pass_sizes_total(const pass_sizes *p)
{
    return 2 * (p->act_d + p->act_hs + p->act_ks + p->act_f) + p->last + p->logits + p->xb + p->lastb + p->scratch +
           p->meta + p->part + p->blas_ws + p->want + p->picks;
}

/* HBM of the pass buffers for these options (less the KV arena and its page table).  The dequant scratch is
 * sized for the model's largest non-bf16 matrix (alloc_pass sizes it from the bound matrices: never more). */
uint64_t cuda_engine_pass_bytes(const model_desc *m, const cuda_engine_opts *o)
{
    size_t T = o->max_pass_tokens > 0 ? (size_t)o->max_pass_tokens : 512;
    size_t B = o->max_pass_seqs > 0 ? (size_t)o->max_pass_seqs : T;
    size_t R = o->max_logit_rows > 0 ? (size_t)o->max_logit_rows : B;
    size_t scratch = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (t->n_dims == 2 && t->dtype != GGML_BF16 && (size_t)(t->ne[0] * t->ne[1]) > scratch)
            scratch = (size_t)(t->ne[0] * t->ne[1]);
    }
    pass_sizes p = pass_sizes_for(m, T, B, R, scratch);
    return pass_sizes_total(&p);
}

static int alloc_pass(cuda_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    size_t scratch = 0; /* largest matrix that needs dequantizing */
    for (int l = 0; l < m->n_layers; l++)
        for (int i = 0; i < M_COUNT; i++)
            if (e->layers[l].m[i].type != GGML_BF16 && (size_t)(e->layers[l].m[i].n * e->layers[l].m[i].k) > scratch)
                scratch = (size_t)(e->layers[l].m[i].n * e->layers[l].m[i].k);
    if (e->out.type != GGML_BF16 && (size_t)(e->out.n * e->out.k) > scratch)
        scratch = (size_t)(e->out.n * e->out.k);
    pass_sizes p = pass_sizes_for(m, (size_t)e->max_T, (size_t)e->max_seqs, (size_t)e->max_rows, scratch);
    size_t meta = p.meta + (size_t)e->kv.n_pages * 4; /* the page table rides with the metadata */
    size_t kv_bytes;
    if (!ck_mul_size(kv_page_bytes_as(m->n_layers, m->n_kv_heads, m->head_dim, e->kv.page_tokens, e->kv.dtype),
                     (size_t)e->kv.n_pages, &kv_bytes))
        return util_errf(err, errlen, "a KV arena of %d pages cannot be sized.", e->kv.n_pages);
    if (dalloc(e, (void **)&e->d_kv, kv_bytes, "the KV cache", err, errlen) ||
        dalloc(e, (void **)&e->x, p.act_d, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->h, p.act_d, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->q, p.act_hs, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->k, p.act_ks, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->v, p.act_ks, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->att, p.act_hs, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->g, p.act_f, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->u, p.act_f, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->last, p.last, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->logits, p.logits, "logits", err, errlen) ||
        dalloc(e, (void **)&e->xb, p.xb, "pass buffers", err, errlen) ||
        dalloc(e, (void **)&e->lastb, p.lastb, "pass buffers", err, errlen) ||
        (p.scratch && dalloc(e, (void **)&e->wscratch, p.scratch, "the dequant scratch", err, errlen)) ||
        dalloc(e, (void **)&e->d_meta, meta, "pass metadata", err, errlen) ||
        dalloc(e, (void **)&e->att_part, p.part, "attention parts", err, errlen) ||
        dalloc(e, &e->blas_ws, p.blas_ws, "the cuBLAS workspace", err, errlen))
        return -1;
    CU(cudaMemset(e->d_kv, 0, kv_bytes)); /* pages never hold garbage, even before their first write */
    CU(cudaHostAlloc((void **)&e->h_meta, meta, cudaHostAllocDefault));
    CU(cudaHostAlloc((void **)&e->h_logits, p.logits, cudaHostAllocDefault));
    if (dalloc(e, (void **)&e->d_want, p.want, "pick buffers", err, errlen) ||
        dalloc(e, (void **)&e->d_picks, p.picks, "pick buffers", err, errlen))
        return -1;
    CU(cudaHostAlloc((void **)&e->h_want, p.want, cudaHostAllocDefault));
    CU(cudaHostAlloc((void **)&e->h_picks, p.picks, cudaHostAllocDefault));
    return 0;
}

int cuda_engine_open(model_desc *m, const cuda_engine_opts *o, cuda_engine **out, char *err, size_t errlen)
{
    *out = NULL;
    if (g_poisoned) {
        util_errf(err, errlen, "the CUDA context is unusable after an earlier GPU fault; restart the process.");
        return CUDA_ENGINE_EDEVICE;
    }
    if (m->state == ARCH_UNSUPPORTED)
        return util_errf(err, errlen, "%s: architecture %s is not supported: %s", m->source, m->arch, m->state_note);
    if (strcmp(m->arch, "llama") && strcmp(m->arch, "qwen2") && strcmp(m->arch, "qwen3") && strcmp(m->arch, "mistral"))
        return util_errf(err, errlen, "%s: architecture %s is described but its forward pass is not wired yet.",
                         m->source, m->arch);
    if (m->head_dim > 256 || m->n_experts > 0)
        return util_errf(err, errlen,
                         "%s: head size %d or %d experts is beyond the CUDA backend (head size <= 256, "
                         "dense models).",
                         m->source, m->head_dim, m->n_experts);
    cuda_engine *e = (cuda_engine *)calloc(1, sizeof *e);
    if (!e)
        return util_errf(err, errlen, "out of host memory.");
    e->m = m;
    e->o = *o;
    e->max_T = o->max_pass_tokens > 0 ? o->max_pass_tokens : 512;
    e->max_seqs = o->max_pass_seqs > 0 ? o->max_pass_seqs : e->max_T;
    e->max_rows = o->max_logit_rows > 0 ? o->max_logit_rows : e->max_seqs;
    e->embed_scale = !strncmp(m->arch, "gemma", 5) ? sqrtf((float)m->d_model) : 1.0f;
    e->gelu = !strncmp(m->arch, "gemma", 5);
    int fds_stack[8];
    int *fds = m->n_files <= 8 ? fds_stack : (int *)malloc(m->n_files * sizeof(int));
    file_reader fr = {m, fds};
    int rc = 0;
    if (!fds) {
        free(e);
        return util_errf(err, errlen, "out of host memory.");
    }
    for (size_t f = 0; f < m->n_files; f++)
        fds[f] = -1;
    int P = o->page_tokens > 0 ? o->page_tokens : 16;
    int32_t np = o->kv_pages > 0 ? o->kv_pages : 256;
    e->kv.n_layers = m->n_layers;
    e->kv.n_kv_heads = m->n_kv_heads;
    e->kv.head_dim = m->head_dim;
    e->kv.page_tokens = P;
    e->kv.n_pages = np;
    e->kv.dtype = o->kv_dtype == KV_I8 ? KV_I8 : KV_BF16;
    e->kv.free_list = (int32_t *)malloc((size_t)np * sizeof(int32_t));
    if (!e->kv.free_list) {
        rc = util_errf(err, errlen, "out of host memory for the KV page list.");
        goto out;
    }
    for (int32_t i = 0; i < np; i++) /* same order as kv_create: page 0 on top */
        e->kv.free_list[i] = np - 1 - i;
    e->kv.n_free = np;
    {
        cudaError_t c = cudaSetDevice(o->device);
        if (c == cudaSuccess)
            c = cudaStreamCreateWithFlags(&e->cs, cudaStreamNonBlocking);
        if (c == cudaSuccess)
            c = cudaStreamCreateWithFlags(&e->xs, cudaStreamNonBlocking);
        if (c != cudaSuccess) {
            rc = cu_fail(c, "cudaSetDevice/cudaStreamCreate", __LINE__, err, errlen);
            goto out;
        }
        cublasStatus_t s = cublasCreate(&e->blas);
        if (s != CUBLAS_STATUS_SUCCESS) {
            e->blas = NULL;
            rc = blas_fail(s, "cublasCreate", __LINE__, err, errlen);
            goto out;
        }
    }
    if ((rc = bind_globals(e, &fr, err, errlen)) || (rc = bind_layers(e, &fr, err, errlen)) ||
        (rc = rope_setup(e, err, errlen)) || (rc = place_layers(e, &fr, err, errlen)) ||
        (rc = alloc_pass(e, err, errlen)))
        goto out;
    {
        cublasStatus_t s = cublasSetStream(e->blas, e->cs);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasSetWorkspace(e->blas, e->blas_ws, BLAS_WS_BYTES);
        if (s != CUBLAS_STATUS_SUCCESS) {
            rc = blas_fail(s, "cublasSetStream/cublasSetWorkspace", __LINE__, err, errlen);
            goto out;
        }
    }
    {
        /* pageable cudaMemcpy and cudaMemset may still be in flight on the legacy stream, which the
         * non-blocking compute and copy streams do not wait for */
        cudaError_t c = cudaDeviceSynchronize();
        if (c != cudaSuccess) {
            rc = cu_fail(c, "cudaDeviceSynchronize (after loading)", __LINE__, err, errlen);
            goto out;
        }
    }
    note_peak(e);
    {
        const char *pv = getenv("SPILL_CUDA_PROF");
        if (pv && *pv && strcmp(pv, "0")) {
            e->pev = (cudaEvent_t *)calloc((size_t)m->n_layers * PROF_MARKS, sizeof(cudaEvent_t));
            e->prof = e->pev != NULL;
            for (size_t i = 0; e->prof && i < (size_t)m->n_layers * PROF_MARKS; i++)
                if (cudaEventCreate(&e->pev[i]) != cudaSuccess)
                    e->prof = false;
            if (e->prof && (cudaEventCreate(&e->phead[0]) != cudaSuccess ||
                            cudaEventCreate(&e->phead[1]) != cudaSuccess))
                e->prof = false;
            cudaGetLastError();
        }
    }
out:
    for (size_t f = 0; f < m->n_files; f++)
        if (fds[f] >= 0)
            close(fds[f]);
    if (fds != fds_stack)
        free(fds);
    if (rc) {
        cuda_engine_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

void cuda_engine_close(cuda_engine *e)
{
    if (!e)
        return;
    if (!g_poisoned) {
        if (e->cs)
            cudaStreamSynchronize(e->cs);
        if (e->xs)
            cudaStreamSynchronize(e->xs);
    }
    for (int i = 0; e->ev_copied && i < e->slots; i++)
        if (e->ev_copied[i])
            cudaEventDestroy(e->ev_copied[i]);
    for (int i = 0; e->ev_free && i < e->slots; i++)
        if (e->ev_free[i])
            cudaEventDestroy(e->ev_free[i]);
    for (int p = 0; p < 2; p++) {
        for (int i = 0; e->ev_cs[p] && i < e->ns; i++)
            if (e->ev_cs[p][i])
                cudaEventDestroy(e->ev_cs[p][i]);
        for (int i = 0; e->ev_ce[p] && i < e->ns; i++)
            if (e->ev_ce[p][i])
                cudaEventDestroy(e->ev_ce[p][i]);
        free(e->ev_cs[p]);
        free(e->ev_ce[p]);
    }
    free(e->ev_copied);
    free(e->ev_free);
    if (e->prof)
        prof_report(e);
    for (size_t i = 0; e->pev && i < (size_t)e->m->n_layers * PROF_MARKS; i++)
        if (e->pev[i])
            cudaEventDestroy(e->pev[i]);
    free(e->pev);
    for (int i = 0; i < 2; i++)
        if (e->phead[i])
            cudaEventDestroy(e->phead[i]);
    stream_close(e->disk); /* after the copy stream drained: its slots are pinned memory the copies read */
    for (int i = 0; e->ev_hdone && i < e->hslots; i++)
        if (e->ev_hdone[i])
            cudaEventDestroy(e->ev_hdone[i]);
    free(e->ev_hdone);
    if (e->blas)
        cublasDestroy(e->blas);
    for (size_t i = 0; i < e->n_allocs; i++)
        cudaFree(e->allocs[i]);
    free(e->allocs);
    if (e->h_pinned && e->h_pinned_map) {
        if (e->st.pin_registered)
            cudaHostUnregister(e->h_pinned);
        munmap(e->h_pinned, e->h_pinned_map);
    } else if (e->h_pinned) {
        cudaFreeHost(e->h_pinned);
    }
    if (e->h_meta)
        cudaFreeHost(e->h_meta);
    if (e->h_logits)
        cudaFreeHost(e->h_logits);
    if (e->h_want)
        cudaFreeHost(e->h_want);
    if (e->h_picks)
        cudaFreeHost(e->h_picks);
    if (e->cs)
        cudaStreamDestroy(e->cs);
    if (e->xs)
        cudaStreamDestroy(e->xs);
    free(e->layers);
    free(e->kv.free_list);
    free(e);
}

const float *cuda_engine_logits(const cuda_engine *e)
{
    return e->h_logits;
}

kv_cache *cuda_engine_kv(cuda_engine *e)
{
    return &e->kv;
}

void cuda_engine_get_stats(const cuda_engine *e, cuda_engine_stats *st)
{
    *st = e->st;
}

void cuda_engine_inject_fault(cuda_engine *e)
{
    k_poison(e->cs);
}

int cuda_device_info(int device, char *name, size_t name_cap, uint64_t *total_bytes, uint64_t *free_bytes, char *err,
                     size_t errlen)
{
    cudaDeviceProp p;
    size_t fr = 0, tot = 0;
    CU(cudaSetDevice(device));
    CU(cudaGetDeviceProperties(&p, device));
    CU(cudaMemGetInfo(&fr, &tot));
    snprintf(name, name_cap, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
    *total_bytes = tot;
    *free_bytes = fr;
    return 0;
}

/* ---------------------------------------------------------------- the pass */

/* Y(T, N) = X(T, K) · W(N, K)^T: W dequantized into the bf16 scratch unless it is bf16 already. */
static int gemm(cuda_engine *e, const dmat *w, const uint8_t *base, const bf16 *x, int64_t T, float *y, char *err,
                size_t errlen)
{
    const bf16 *W = (const bf16 *)(base + w->off);
    if (w->type != GGML_BF16) {
        CU(k_dequant(w->type, base + w->off, w->row_bytes, w->n, w->k, e->wscratch, NULL, e->cs));
        W = e->wscratch;
    }
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n, (int)T, (int)w->k, &one, W, CUDA_R_16BF, (int)w->k, x,
                    CUDA_R_16BF, (int)w->k, &zero, y, CUDA_R_32F, (int)w->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* Disk tier: gives pinned slots whose copies have finished back to the readers (oldest first); with
 * `need` set, first waits for the oldest copy when every slot is held. */
static int release_host_slots(cuda_engine *e, bool need, char *err, size_t errlen)
{
    if (need && e->h_acquired - e->h_released == (uint64_t)e->hslots)
        CU(cudaEventSynchronize(e->ev_hdone[e->h_released % (uint64_t)e->hslots]));
    while (e->h_released < e->h_acquired) {
        cudaError_t c = cudaEventQuery(e->ev_hdone[e->h_released % (uint64_t)e->hslots]);
        if (c == cudaErrorNotReady)
            break;
        CU(c);
        stream_release(e->disk, e->first_streamed + (int)(e->h_released % (uint64_t)e->ns));
        e->h_released++;
    }
    return 0;
}

/* Issues layer copies while a device slot is free (see the header comment); from the pinned arena, or
 * from the disk tier's next slot once its read has finished. */
static int pump(cuda_engine *e, char *err, size_t errlen)
{
    while (e->copies_issued < e->computes_freed + (uint64_t)e->slots) {
        uint64_t k = e->copies_issued;
        int slot = (int)(k % (uint64_t)e->slots), i = (int)(k % (uint64_t)e->ns), par = (int)((k / e->ns) % 2);
        const dlayer *w = &e->layers[e->first_streamed + i];
        const uint8_t *src = w->host;
        size_t bytes = w->pack_bytes;
        if (e->disk) {
            stream_layer sl;
            if (release_host_slots(e, true, err, errlen))
                return -1;
            if (stream_acquire(e->disk, e->first_streamed + i, &sl, err, errlen))
                return -1;
            e->h_acquired++;
            src = sl.slot;
            bytes = sl.slot_len;
        }
        if (k >= (uint64_t)e->slots)
            CU(cudaStreamWaitEvent(e->xs, e->ev_free[slot], 0));
        CU(cudaEventRecord(e->ev_cs[par][i], e->xs));
        CU(cudaMemcpyAsync(e->d_ring + (size_t)slot * e->slot_bytes, src, bytes, cudaMemcpyHostToDevice, e->xs));
        CU(cudaEventRecord(e->ev_ce[par][i], e->xs));
        CU(cudaEventRecord(e->ev_copied[slot], e->xs));
        if (e->disk)
            CU(cudaEventRecord(e->ev_hdone[(e->h_acquired - 1) % (uint64_t)e->hslots], e->xs));
        e->copies_issued++;
    }
    return 0;
}

typedef struct pass_meta {
    int32_t *tok, *pos, *seq, *rows, *pt_off, *tiles, *singles, *pages; /* device views of d_meta */
    int n_tiles;                                                        /* attention plan of the pass */
    int64_t n_singles;
} pass_meta;

#define MARK(i)                                                                                                        \
    do {                                                                                                               \
        if (e->prof)                                                                                                   \
            CU(cudaEventRecord(e->pev[(size_t)l * PROF_MARKS + (i)], s));                                              \
    } while (0)

static int forward_layer(cuda_engine *e, const pass_meta *pm, const dlayer *w, const uint8_t *base, int l, int64_t T,
                         char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, H = m->n_heads, K = m->n_kv_heads, S = m->head_dim, F = m->ffn_dim;
    int64_t HS = H * S, KS = K * S;
    cudaStream_t s = e->cs;
    bool sliding = m->layer_sliding && m->layer_sliding[l];
    int rc;
    MARK(0);
    CU(k_rmsnorm(e->x, w->attn_norm, T, D, m->norm_eps, m->norm_plus_one, NULL, e->xb, s));
    MARK(1);
    if ((rc = gemm(e, &w->m[M_Q], base, e->xb, T, e->q, err, errlen)) ||
        (rc = gemm(e, &w->m[M_K], base, e->xb, T, e->k, err, errlen)) ||
        (rc = gemm(e, &w->m[M_V], base, e->xb, T, e->v, err, errlen)))
        return rc;
    MARK(2);
    if (w->bq)
        CU(k_add_bias(e->q, w->bq, T, HS, s));
    if (w->bk)
        CU(k_add_bias(e->k, w->bk, T, KS, s));
    if (w->bv)
        CU(k_add_bias(e->v, w->bv, T, KS, s));
    if (w->q_norm) {
        CU(k_rmsnorm(e->q, w->q_norm, T * H, S, m->norm_eps, m->norm_plus_one, e->q, NULL, s));
        CU(k_rmsnorm(e->k, w->k_norm, T * K, S, m->norm_eps, m->norm_plus_one, e->k, NULL, s));
    }
    bool local = sliding && m->rope_theta_local > 0;
    const cpu_rope *rope = local ? &e->rope_local : &e->rope;
    const float *inv = local ? e->d_inv_freq_local : e->d_inv_freq;
    CU(k_rope(e->q, T, (int)H, (int)S, pm->pos, inv, rope->n_rot, rope->style, rope->attn_scale, s));
    CU(k_rope(e->k, T, (int)K, (int)S, pm->pos, inv, rope->n_rot, rope->style, rope->attn_scale, s));
    kv_geom g;
    g.P = e->kv.page_tokens;
    g.Kh = (int)K;
    g.S = (int)S;
    g.kvt = e->kv.dtype;
    g.layer_base = e->d_kv + (size_t)l * (size_t)e->kv.n_pages * (size_t)kv_block_bytes(g.P, g.Kh, g.S, g.kvt);
    CU(k_kv_write(g, e->k, e->v, pm->pos, pm->seq, pm->pt_off, pm->pages, T, s));
    MARK(3);
    float scale = m->query_scale > 0 ? (float)m->query_scale : 1.0f / sqrtf((float)S);
    CU(k_attention(g, e->q, pm->pos, pm->seq, pm->pt_off, pm->pages, T, (int)H, sliding ? m->sliding_window : 0, scale,
                   (float)m->attn_softcap, pm->tiles, pm->n_tiles, pm->singles, pm->n_singles, e->att_max_len,
                   e->o.attention_unsplit ? NULL : e->att_part, e->att, s));
    CU(k_to_bf16(e->att, e->xb, T * HS, s));
    MARK(4);
    if ((rc = gemm(e, &w->m[M_O], base, e->xb, T, e->h, err, errlen)))
        return rc;
    if (w->post_attn_norm && w->post_ffw_norm)
        CU(k_rmsnorm(e->h, w->post_attn_norm, T, D, m->norm_eps, m->norm_plus_one, e->h, NULL, s));
    CU(k_add(e->x, e->h, T * D, s));
    MARK(5);

    CU(k_rmsnorm(e->x, w->ffn_norm, T, D, m->norm_eps, m->norm_plus_one, NULL, e->xb, s));
    MARK(6);
    if ((rc = gemm(e, &w->m[M_GATE], base, e->xb, T, e->g, err, errlen)) ||
        (rc = gemm(e, &w->m[M_UP], base, e->xb, T, e->u, err, errlen)))
        return rc;
    MARK(7);
    CU(k_act_mul(e->g, e->u, T * F, e->gelu, e->xb, NULL, s));
    MARK(8);
    if ((rc = gemm(e, &w->m[M_DOWN], base, e->xb, T, e->h, err, errlen)))
        return rc;
    if (w->post_ffw_norm)
        CU(k_rmsnorm(e->h, w->post_ffw_norm, T, D, m->norm_eps, m->norm_plus_one, e->h, NULL, s));
    CU(k_add(e->x, e->h, T * D, s));
    MARK(9);
    return 0;
}

/* Validates the pass and lays its metadata into the pinned staging buffer. */
static int build_meta(cuda_engine *e, const fwd_seq *seqs, int n_seqs, int64_t *T_out, int *R_out, size_t *n_ints,
                      char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t T = 0, Tmax = e->max_T;
    int R = 0;
    int32_t npt = 0;
    if (n_seqs <= 0 || n_seqs > e->max_seqs)
        return util_errf(err, errlen, "a pass of %d sequences is outside the engine's 1..%d.", n_seqs, e->max_seqs);
    for (int s = 0; s < n_seqs; s++) {
        const fwd_seq *sq = &seqs[s];
        if (sq->n <= 0 || T + sq->n > Tmax)
            return util_errf(err, errlen, "a pass of more than %lld tokens (or an empty sequence) was requested.",
                             (long long)Tmax);
        if (sq->pos0 < 0 || kv_pages_for(&e->kv, sq->pos0 + sq->n) > sq->kv->n_pages || sq->pos0 + sq->n > m->ctx_len)
            return util_errf(err, errlen, "sequence %d has no KV room for positions up to %d.", s, sq->pos0 + sq->n);
        T += sq->n;
        R += sq->all_logits ? sq->n : sq->want_logits;
        if (R > e->max_rows)
            return util_errf(err, errlen,
                             "a pass asked for more than the engine's %d rows of logits; raise "
                             "max_logit_rows.",
                             e->max_rows);
        npt += kv_pages_for(&e->kv, sq->pos0 + sq->n);
        if (npt > e->kv.n_pages)
            return util_errf(err, errlen, "the pass's page tables hold more than the %d pages of the KV arena.",
                             e->kv.n_pages);
    }
    int32_t *tok = e->h_meta, *pos = tok + Tmax, *seq = pos + Tmax, *rows = seq + Tmax;
    int32_t *pt_off = rows + e->max_rows, *tiles = pt_off + e->max_seqs, *singles = tiles + 2 * Tmax;
    int32_t *pages = singles + Tmax;
    int64_t t = 0;
    npt = 0;
    R = 0;
    for (int s = 0; s < n_seqs; s++) {
        const fwd_seq *sq = &seqs[s];
        int32_t need = kv_pages_for(&e->kv, sq->pos0 + sq->n);
        pt_off[s] = npt;
        for (int32_t i = 0; i < need; i++) {
            int32_t pg = sq->kv->pages[i];
            if (pg < 0 || pg >= e->kv.n_pages)
                return util_errf(err, errlen, "sequence %d's page table names page %d outside the arena.", s, pg);
            pages[npt++] = pg;
        }
        for (int32_t i = 0; i < sq->n; i++, t++) {
            if (sq->tokens[i] < 0 || sq->tokens[i] >= m->vocab)
                return util_errf(err, errlen, "token id %d is outside the vocabulary of %d.", sq->tokens[i], m->vocab);
            tok[t] = sq->tokens[i];
            pos[t] = sq->pos0 + i;
            seq[t] = s;
            if (sq->all_logits)
                rows[R++] = (int32_t)t;
        }
        if (sq->want_logits && !sq->all_logits)
            rows[R++] = (int32_t)(t - 1);
    }
    /* attention: runs of >= 8 consecutive positions (prompt chunks) in tiles, the rest token by token */
    k_attention_plan(seq, pos, T, k_attention_tile_tokens(m->n_heads, m->n_kv_heads, m->head_dim), 8, tiles, singles,
                     &e->att_tiles, &e->att_singles);
    e->att_max_len = 0;
    for (int64_t i = 0; i < e->att_singles; i++)
        e->att_max_len = pos[singles[i]] + 1 > e->att_max_len ? pos[singles[i]] + 1 : e->att_max_len;
    *T_out = T;
    *R_out = R;
    *n_ints = (size_t)(pages + npt - e->h_meta);
    return 0;
}

/* Sums the last pass's layer copy times (all its copies finished: compute waited on each). */
static void harvest_copy_times(cuda_engine *e, uint64_t pass)
{
    int par = (int)(pass % 2);
    double busy = 0;
    float ms;
    for (int i = 0; i < e->ns; i++)
        if (cudaEventElapsedTime(&ms, e->ev_cs[par][i], e->ev_ce[par][i]) == cudaSuccess)
            busy += ms * 1e-3;
    e->st.last_h2d_busy_s = busy;
    e->st.last_h2d_span_s =
        cudaEventElapsedTime(&ms, e->ev_cs[par][0], e->ev_ce[par][e->ns - 1]) == cudaSuccess ? ms * 1e-3 : 0;
    cudaGetLastError(); /* a copy of layer 0 issued in an earlier pass's tail can make the span unavailable */
}

/* Adds the pass's segment times (every event has completed: the stream was synchronized). */
static void prof_harvest(cuda_engine *e, int64_t T)
{
    const model_desc *m = e->m;
    int b = T >= 2048; /* prompt-heavy pass vs decode pass */
    float ms;
    for (int l = 0; l < m->n_layers; l++) {
        cudaEvent_t *ev = e->pev + (size_t)l * PROF_MARKS;
        for (int i = 0; i + 1 < PROF_MARKS; i++)
            if (cudaEventElapsedTime(&ms, ev[i], ev[i + 1]) == cudaSuccess)
                e->pacc[b][i] += ms * 1e-3;
        cudaEvent_t prev = l ? e->pev[(size_t)(l - 1) * PROF_MARKS + PROF_MARKS - 1] : NULL;
        if (prev && cudaEventElapsedTime(&ms, prev, ev[0]) == cudaSuccess)
            e->pacc[b][PROF_MARKS - 1] += ms * 1e-3; /* waiting for the layer's copy */
    }
    if (cudaEventElapsedTime(&ms, e->phead[0], e->phead[1]) == cudaSuccess)
        e->pacc[b][PROF_MARKS] += ms * 1e-3;
    cudaGetLastError();
    double D = m->d_model, HS = (double)m->n_heads * m->head_dim, KS = (double)m->n_kv_heads * m->head_dim,
           F = m->ffn_dim, L = m->n_layers, t = (double)T;
    e->pflop[b][0] += 2 * t * D * (HS + 2 * KS) * L;
    e->pflop[b][1] += 2 * t * HS * D * L;
    e->pflop[b][2] += 4 * t * D * F * L;
    e->pflop[b][3] += 2 * t * F * D * L;
    e->ppass[b]++;
    e->ptok[b] += (uint64_t)T;
}

static void prof_report(const cuda_engine *e)
{
    static const int gemm_seg[4] = {1, 4, 6, 8};
    for (int b = 0; b < 2; b++) {
        if (!e->ppass[b])
            continue;
        double tot = 0;
        for (int i = 0; i < PROF_MARKS + 1; i++)
            tot += e->pacc[b][i];
        fprintf(stderr, "cuda profile, %s passes: %llu passes, %llu tokens, %.3f s on the compute stream\n",
                b ? "prompt-heavy (>= 2048 tokens)" : "decode", (unsigned long long)e->ppass[b],
                (unsigned long long)e->ptok[b], tot);
        for (int i = 0; i < PROF_MARKS + 1; i++) {
            const char *name = i < PROF_MARKS - 1 ? PROF_SEG[i] : i == PROF_MARKS - 1 ? "wait for layer copy" : "head";
            char extra[64] = "";
            for (int g = 0; g < 4; g++)
                if (gemm_seg[g] == i && e->pacc[b][i] > 0)
                    snprintf(extra, sizeof extra, "  %.0f TFLOP/s", e->pflop[b][g] / e->pacc[b][i] / 1e12);
            fprintf(stderr, "  %-24s %9.3f s %5.1f%%%s\n", name, e->pacc[b][i], tot > 0 ? 100 * e->pacc[b][i] / tot : 0,
                    extra);
        }
    }
}

static_assert(sizeof(cuda_pick) == sizeof(pick_out) && offsetof(cuda_pick, top_logprob) == offsetof(pick_out, top_logprob) &&
                  CUDA_PICK_MAX_TOP == PICK_MAX_TOP,
              "cuda_pick mirrors pick_out");

static int forward_inner(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, const int32_t *want,
                         cuda_pick *picks, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t T = 0, D = m->d_model, V = m->vocab;
    int R = 0, rc;
    size_t n_ints = 0;
    if ((rc = build_meta(e, seqs, n_seqs, &T, &R, &n_ints, err, errlen)))
        return rc;
    e->broken = true; /* until the pass completes */
    cudaStream_t s = e->cs;
    CU(cudaMemcpyAsync(e->d_meta, e->h_meta, n_ints * 4, cudaMemcpyHostToDevice, s));
    size_t Tm = (size_t)e->max_T, Rm = (size_t)e->max_rows, B = (size_t)e->max_seqs;
    int32_t *dm = e->d_meta;
    pass_meta pm = {dm,
                    dm + Tm,
                    dm + 2 * Tm,
                    dm + 3 * Tm,
                    dm + 3 * Tm + Rm,
                    dm + 3 * Tm + Rm + B,
                    dm + 3 * Tm + Rm + B + 2 * Tm,
                    dm + 3 * Tm + Rm + B + 3 * Tm,
                    e->att_tiles,
                    e->att_singles};
    CU(k_embed(e->embd.type, e->d_embd, e->embd.row_bytes, pm.tok, T, D, e->embed_scale, e->x, s));
    if (e->ns && (rc = pump(e, err, errlen)))
        return rc;
    for (int l = 0; l < m->n_layers; l++) {
        const dlayer *w = &e->layers[l];
        if (w->resident) {
            if ((rc = forward_layer(e, &pm, w, w->dev, l, T, err, errlen)))
                return rc;
            continue;
        }
        uint64_t k = e->computes_freed;
        int slot = (int)(k % (uint64_t)e->slots);
        CU(cudaStreamWaitEvent(s, e->ev_copied[slot], 0));
        if ((rc = forward_layer(e, &pm, w, e->d_ring + (size_t)slot * e->slot_bytes, l, T, err, errlen)))
            return rc;
        CU(cudaEventRecord(e->ev_free[slot], s));
        e->computes_freed++;
        if ((rc = pump(e, err, errlen)))
            return rc;
    }
    if (e->prof)
        CU(cudaEventRecord(e->phead[0], s));
    if (R > 0) {
        CU(k_gather(e->last, e->x, pm.rows, R, D, s));
        CU(k_rmsnorm(e->last, e->out_norm, R, D, m->norm_eps, m->norm_plus_one, NULL, e->lastb, s));
        if ((rc = gemm(e, &e->out, e->d_out, e->lastb, R, e->logits, err, errlen)))
            return rc;
        if (m->final_softcap > 0)
            CU(k_softcap(e->logits, (int64_t)R * V, (float)m->final_softcap, s));
        if (want) {
            /* picks on the device; only the rows the host samples come back whole, in runs of rows */
            memcpy(e->h_want, want, (size_t)R * 4);
            CU(cudaMemcpyAsync(e->d_want, e->h_want, (size_t)R * 4, cudaMemcpyHostToDevice, s));
            CU(k_pick(e->logits, R, (int)V, e->d_want, e->d_picks, s));
            CU(cudaMemcpyAsync(e->h_picks, e->d_picks, (size_t)R * sizeof(pick_out), cudaMemcpyDeviceToHost, s));
            for (int k = 0; k < R;) {
                if (want[k] >= -1) {
                    k++;
                    continue;
                }
                int k1 = k;
                while (k1 < R && want[k1] < -1)
                    k1++;
                CU(cudaMemcpyAsync(e->h_logits + (size_t)k * (size_t)V, e->logits + (size_t)k * (size_t)V,
                                   (size_t)(k1 - k) * (size_t)V * 4, cudaMemcpyDeviceToHost, s));
                k = k1;
            }
        } else
            CU(cudaMemcpyAsync(e->h_logits, e->logits, (size_t)R * (size_t)V * 4, cudaMemcpyDeviceToHost, s));
    }
    if (e->prof)
        CU(cudaEventRecord(e->phead[1], s));
    CU(cudaStreamSynchronize(s));
    if (e->prof)
        prof_harvest(e, T);
    if (R > 0 && want) {
        for (int k = 0; k < R; k++) {
            if (want[k] >= -1)
                memcpy(&picks[k], &e->h_picks[k], sizeof picks[k]);
            else if (logits)
                memcpy(logits + (size_t)k * (size_t)V, e->h_logits + (size_t)k * (size_t)V, (size_t)V * 4);
        }
    } else if (R > 0 && logits)
        memcpy(logits, e->h_logits, (size_t)R * (size_t)V * 4);
    if (e->ns)
        harvest_copy_times(e, e->st.passes);
    if (e->disk) {
        if ((rc = release_host_slots(e, false, err, errlen)))
            return rc;
        stream_stats(e->disk, &e->st.disk_bytes, &e->st.disk_wait_s, &e->st.disk_read_s);
    }
    e->broken = false;
    return 0;
}

static int forward_any(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, const int32_t *want,
                       cuda_pick *picks, char *err, size_t errlen);

int cuda_engine_forward(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen)
{
    return forward_any(e, seqs, n_seqs, logits, NULL, NULL, err, errlen);
}

int cuda_engine_forward_pick(cuda_engine *e, fwd_seq *seqs, int n_seqs, const int32_t *want, cuda_pick *picks,
                             float *logits, char *err, size_t errlen)
{
    return forward_any(e, seqs, n_seqs, logits, want, picks, err, errlen);
}

static int forward_any(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, const int32_t *want,
                       cuda_pick *picks, char *err, size_t errlen)
{
    if (g_poisoned) {
        util_errf(err, errlen, "the CUDA context is unusable after an earlier GPU fault; exit and resume.");
        return CUDA_ENGINE_EDEVICE;
    }
    if (e->broken)
        return util_errf(err, errlen, "the CUDA engine stopped in the middle of an earlier pass; reopen it.");
    double t0 = mono();
    int rc = forward_inner(e, seqs, n_seqs, logits, want, picks, err, errlen);
    if (rc == 0 || !e->broken) {
        if (rc == 0) {
            e->st.last_pass_s = mono() - t0;
            e->st.passes++;
            note_peak(e);
        }
        return rc;
    }
    /* A failure after work was enqueued: see whether the context survived, so a sticky fault is reported as such. */
    cudaError_t c = cudaStreamSynchronize(e->cs);
    if (c != cudaSuccess && is_sticky(c)) {
        g_poisoned = true;
        return CUDA_ENGINE_EDEVICE;
    }
    return rc;
}
