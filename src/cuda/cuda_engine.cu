/*
 * cuda_engine.cu — the CUDA engine: weights on the GPU (resident or streamed
 * through pinned host RAM), the paged KV arena in HBM, and the forward pass of
 * forward.c on the GPU.
 *
 * Owns: device and pinned memory, the two streams (compute, copy), the layer
 * ring, cuBLAS, and turning CUDA failures into sentences and the sticky code.
 * Does not own: loading the model's tensors into HBM and the pinned arena
 * (cuda_load.cu; the engine's state is in cuda_internal.h), kernels
 * (kernels.cu), page allocation (kv.c, on the host), scheduling, sampling.
 *
 * Memory (L layers, of which Lr resident, Ls = L - Lr streamed):
 *   HBM:    globals (embedding and output head in file dtype; norms, biases as
 *           fp32) · resident arena: Lr layer packs · ring: slots × largest
 *           streamed pack · KV arena (L, n_pages, 2, Kh, P, S) bf16 or int8 + scales (kv.h) ·
 *           pass buffers for max_T tokens · bf16 dequant scratch (largest
 *           non-bf16 matrix) · cuBLAS workspace · LoRA adapters (lora.cu:
 *           every adapter stacked in bf16, and their rank-space scratch).
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
#include "cuda_internal.h"

/* Consecutive positions of a sequence from which attention runs tiled (build_meta says why). */
#define ATT_TILE_MIN_RUN 2
#include "cuda_test.h"

/* Names of the profile segments (SPILL_CUDA_PROF): segment i runs from mark i to mark i + 1. */
static const char *const PROF_SEG[PROF_MARKS - 1] = {"attn norm",    "gemm q,k,v", "bias/norm/rope/kv write",
                                                     "attention",    "gemm o + add", "ffn norm",
                                                     "gemm gate,up", "act",        "gemm down + add"};

static bool g_poisoned; /* the process's CUDA context is unusable */

static void prof_report(const cuda_engine *e);

double mono(void)
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

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Turns a failed CUDA call into the return code and one sentence. */
int cu_fail_at(cudaError_t c, const char *what, const char *file, int line, char *err, size_t errlen)
{
    if (is_sticky(c) || g_poisoned) {
        g_poisoned = true;
        util_errf(err, errlen,
                  "GPU fault during %s (%s:%d): %s (%s); the CUDA context is unusable, exit and resume the job.",
                  what, base_name(file), line, cudaGetErrorName(c), cudaGetErrorString(c));
        return CUDA_ENGINE_EDEVICE;
    }
    cudaGetLastError(); /* clear a non-sticky error */
    return util_errf(err, errlen, "CUDA call %s failed (%s:%d): %s (%s).", what, base_name(file), line,
                     cudaGetErrorName(c), cudaGetErrorString(c));
}

int blas_fail_at(cublasStatus_t s, const char *what, const char *file, int line, char *err, size_t errlen)
{
    cudaError_t c = cudaPeekAtLastError();
    if (c != cudaSuccess || g_poisoned)
        return cu_fail_at(c != cudaSuccess ? c : cudaErrorUnknown, what, file, line, err, errlen);
    return util_errf(err, errlen, "cuBLAS call %s failed (%s:%d): %s.", what, base_name(file), line,
                     cublasGetStatusString(s));
}

int dtrack(cuda_engine *e, void *p, size_t bytes, char *err, size_t errlen)
{
    if (e->n_allocs == e->cap_allocs) {
        size_t cap = e->cap_allocs ? 2 * e->cap_allocs : 64;
        void **a = (void **)realloc(e->allocs, cap * sizeof *a);
        if (!a)
            return util_errf(err, errlen, "out of host memory tracking GPU allocations.");
        e->allocs = a;
        e->cap_allocs = cap;
    }
    e->allocs[e->n_allocs++] = p;
    e->st.device_bytes += bytes;
    return 0;
}

/* cudaMalloc with accounting, the test hook, and the out-of-memory sentence. */
int dalloc(cuda_engine *e, void **p, size_t bytes, const char *what, char *err, size_t errlen)
{
    *p = NULL;
    if (bytes == 0)
        bytes = 256;
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
    if (dtrack(e, *p, bytes, err, errlen)) {
        cudaFree(*p);
        *p = NULL;
        return -1;
    }
    return 0;
}

void note_peak(cuda_engine *e)
{
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > e->st.peak_device_used)
        e->st.peak_device_used = tot - fr;
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
    size_t f8x, f8xs, f8ws; /* fp8 rows' GEMMs: T8 x K8 codes, T8 scales, N8 scales (0: no fp8 matrix) */
} pass_sizes;

/* The fp8 GEMMs' scratch for the largest fp8 matrix (K8 columns, N8 rows) and T8 rows per GEMM. */
static void fp8_sizes(pass_sizes *p, size_t T8, size_t K8, size_t N8)
{
    p->f8x = K8 ? T8 * K8 : 0;
    p->f8xs = K8 ? T8 * 4 : 0;
    p->f8ws = K8 ? N8 * 4 : 0;
}

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
    /* tok pos seq, rows, pt_off, tiles (2T) singles, longrope (B), adapter (T) */
    p.meta = (3 * T + R + B + 3 * T + B + T) * 4;
    p.part = k_attention_part_floats(m->head_dim) * 4;
    p.blas_ws = BLAS_WS_BYTES;
    p.want = R * 8; /* want, then target */
    p.picks = R * sizeof(pick_out);
    fp8_sizes(&p, 0, 0, 0);
    return p;
}

static size_t pass_sizes_total(const pass_sizes *p)
{
    return 2 * (p->act_d + p->act_hs + p->act_ks + p->act_f) + p->last + p->logits + p->xb + p->lastb + p->scratch +
           p->meta + p->part + p->blas_ws + p->want + p->picks + p->f8x + p->f8xs + p->f8ws;
}

/* Rows one GEMM of a pass of T tokens and R logit rows may take: T, R for the head, T*k in a MoE FFN. */
static size_t gemm_rows(const model_desc *m, size_t T, size_t R)
{
    size_t k = m->n_experts > 0 && m->n_experts_used > 1 ? (size_t)m->n_experts_used : 1;
    return T * k > R ? T * k : R;
}

/* HBM of the pass buffers for these options (less the KV arena and its page table).  The dequant scratch is
 * sized for the model's largest non-bf16 matrix (alloc_pass sizes it from the bound matrices: never more). */
uint64_t cuda_engine_pass_bytes(const model_desc *m, const cuda_engine_opts *o)
{
    size_t T = o->max_pass_tokens > 0 ? (size_t)o->max_pass_tokens : 512;
    size_t B = o->max_pass_seqs > 0 ? (size_t)o->max_pass_seqs : T;
    size_t R = o->max_logit_rows > 0 ? (size_t)o->max_logit_rows : B;
    size_t scratch = 0, K8 = 0, N8 = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (t->dtype == GGML_F8_E4M3_ROW) { /* multiplied as it is: fp8.cu's scratch instead */
            K8 = t->ne[0] > K8 ? (size_t)t->ne[0] : K8;
            N8 = t->ne[1] > N8 ? (size_t)t->ne[1] : N8;
            continue;
        }
        /* a stacked expert tensor (3-D) is dequantized one expert at a time */
        if ((t->n_dims == 2 || t->n_dims == 3) && t->dtype != GGML_BF16 && (size_t)(t->ne[0] * t->ne[1]) > scratch)
            scratch = (size_t)(t->ne[0] * t->ne[1]);
    }
    pass_sizes p = pass_sizes_for(m, T, B, R, scratch);
    fp8_sizes(&p, gemm_rows(m, T, R), K8, N8);
    return pass_sizes_total(&p) + cuda_moe_pass_bytes(m, T) + cuda_lora_bytes(m, o->lora, T);
}

static int alloc_pass(cuda_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    size_t scratch = 0, K8 = 0, N8 = 0; /* largest matrix that needs dequantizing; largest fp8 one */
    for (int l = 0; l <= m->n_layers; l++)
        for (int i = 0; i < (l < m->n_layers ? layer_n_mats(&e->layers[l]) : 1); i++) {
            const dmat *d = l < m->n_layers ? layer_mat_at(&e->layers[l], i) : &e->out;
            if (!d->t || d->type == GGML_BF16)
                continue;
            if (d->type == GGML_F8_E4M3_ROW) {
                K8 = (size_t)d->k > K8 ? (size_t)d->k : K8;
                N8 = (size_t)d->n > N8 ? (size_t)d->n : N8;
            } else if ((size_t)(d->n * d->k) > scratch)
                scratch = (size_t)(d->n * d->k);
        }
    pass_sizes p = pass_sizes_for(m, (size_t)e->max_T, (size_t)e->max_seqs, (size_t)e->max_rows, scratch);
    fp8_sizes(&p, gemm_rows(m, (size_t)e->max_T, (size_t)e->max_rows), K8, N8);
    if (K8 && !e->f8 && fp8_lt_create(&e->f8, err, errlen))
        return -1;
    if (K8 && (dalloc(e, (void **)&e->f8x, p.f8x, "the fp8 GEMM input", err, errlen) ||
               dalloc(e, (void **)&e->f8xs, p.f8xs, "the fp8 GEMM scales", err, errlen) ||
               dalloc(e, (void **)&e->f8ws, p.f8ws, "the fp8 GEMM scales", err, errlen)))
        return -1;
    size_t meta = p.meta + (size_t)e->kv.n_pages * 4; /* the page table rides with the metadata */
    e->meta_fixed = p.meta;
    e->pt_cap = e->kv.n_pages;
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
        dalloc(e, &e->blas_ws, p.blas_ws, "the cuBLAS workspace", err, errlen) || cuda_moe_alloc(e, err, errlen))
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
    arch_layout a;
    if (model_arch_resolve(m, ARCH_ENGINE_CUDA, &a, err, errlen))
        return -1;
    if (o->attention_fp32) /* the kernel choice is process-wide (one engine per process outside the tests) */
        k_attention_set_kind(1);
    if (m->head_dim > 256)
        return util_errf(err, errlen, "%s: head size %d is beyond the CUDA backend (head size <= 256).", m->source,
                         m->head_dim);
    cuda_engine *e = (cuda_engine *)calloc(1, sizeof *e);
    if (!e)
        return util_errf(err, errlen, "out of host memory.");
    e->m = m;
    e->a = a;
    e->o = *o;
    e->max_T = o->max_pass_tokens > 0 ? o->max_pass_tokens : 512;
    e->max_seqs = o->max_pass_seqs > 0 ? o->max_pass_seqs : e->max_T;
    e->max_rows = o->max_logit_rows > 0 ? o->max_logit_rows : e->max_seqs;
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
    e->kv.dtype = o->kv_dtype == KV_I8 ? KV_I8 : KV_BF16;
    if (kv_book_init(&e->kv, np, err, errlen)) { /* the same page order as kv_create: page 0 first */
        rc = -1;
        goto out;
    }
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
        (rc = alloc_pass(e, err, errlen)) || (rc = cuda_lora_upload(e, err, errlen)))
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
        if (o->profile) {
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
        e->keep_res[0] = e->keep_glob[0] = 0; /* half-uploaded arenas are never kept */
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
    free(e->slot_lazy);
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
    fp8_lt_free(e->f8);
    if (!g_poisoned)
        cuda_keep_stash(e); /* keep mode: the resident layers and globals stay in HBM for the next engine */
    for (size_t i = 0; i < e->n_allocs; i++)
        if (e->allocs[i])
            cudaFree(e->allocs[i]);
    free(e->allocs);
    if (e->h_pinned && e->h_share) {
        if (e->st.pin_registered)
            cudaHostUnregister(e->h_pinned);
        host_share_close(e->h_share); /* the last process mapping the host's copy removes it */
    } else if (e->h_pinned && e->h_pinned_map) {
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
    for (int l = 0; e->layers && l < e->m->n_layers; l++)
        if (e->layers[l].moe) {
            free(e->layers[l].moe->gate), free(e->layers[l].moe->up), free(e->layers[l].moe->down);
            free(e->layers[l].moe);
        }
    if (e->mo.h_ids)
        cudaFreeHost(e->mo.h_ids);
    if (e->mo.h_perm)
        cudaFreeHost(e->mo.h_perm);
    free(e->mo.h_count);
    free(e->lo.g);
    free(e->layers);
    kv_book_free(&e->kv);
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
    st->experts_run = e->mo.experts_run;
    st->experts_skipped = e->mo.experts_skipped;
    st->lazy_layers = e->mo.lazy_layers;
    st->lazy_expert_bytes = e->mo.lazy_bytes;
    st->lazy_skipped_bytes = e->mo.lazy_skipped;
}

void cuda_engine_inject_fault(cuda_engine *e)
{
    k_poison(e->cs);
}

int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
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

/* Y(T, N) = X(T, K) · W(N, K)^T: fp8 rows on the FP8 tensor cores as they are (fp8.cu); other types
 * dequantized into the bf16 scratch unless they are bf16 already. */
int cuda_gemm(cuda_engine *e, const dmat *w, const uint8_t *base, const bf16 *x, int64_t T, float *y, char *err,
              size_t errlen)
{
    if (w->type == GGML_F8_E4M3_ROW) {
        cudaError_t ce;
        if (fp8_gemm(e->f8, base + w->off, w->row_bytes, w->n, w->k, x, T, y, e->f8x, e->f8xs, e->f8ws, e->blas_ws,
                     BLAS_WS_BYTES, e->cs, &ce, err, errlen))
            return ce != cudaSuccess ? cu_fail(ce, "the fp8 GEMM", __LINE__, err, errlen) : -1;
        return 0;
    }
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
        /* a pass that can hit at most half a sparse layer's experts copies the layer's head only; moe.cu
         * fetches the experts its rows chose once routing has run (the slot remembers which kind it got) */
        e->slot_lazy[slot] = cuda_moe_lazy(e, w, e->cur_T);
        if (e->slot_lazy[slot])
            bytes = w->head_bytes;
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
    int32_t *tok, *pos, *seq, *rows, *pt_off, *tiles, *singles, *lng, *ad, *pages; /* device views of d_meta */
    int n_tiles;                                                        /* attention plan of the pass */
    int64_t n_singles;
} pass_meta;

#define MARK(i)                                                                                                        \
    do {                                                                                                               \
        if (e->prof)                                                                                                   \
            CU(cudaEventRecord(e->pev[(size_t)l * PROF_MARKS + (i)], s));                                              \
    } while (0)

static int forward_layer(cuda_engine *e, const pass_meta *pm, const dlayer *w, const uint8_t *base, int l, int64_t T,
                         bool lazy, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int64_t D = m->d_model, H = m->n_heads, K = m->n_kv_heads, S = m->head_dim, F = m->ffn_dim;
    int64_t HS = H * S, KS = K * S;
    cudaStream_t s = e->cs;
    const arch_layout *a = &e->a;
    bool sliding = arch_layer_sliding(a, l);
    int rc;
    MARK(0);
    CU(k_rmsnorm(e->x, w->attn_norm, T, D, m->norm_eps, a->norm_plus_one, NULL, e->xb, s));
    MARK(1);
    if ((rc = cuda_gemm(e, &w->m[M_Q], base, e->xb, T, e->q, err, errlen)) ||
        (rc = cuda_gemm(e, &w->m[M_K], base, e->xb, T, e->k, err, errlen)) ||
        (rc = cuda_gemm(e, &w->m[M_V], base, e->xb, T, e->v, err, errlen)) ||
        (rc = cuda_lora_apply(e, l, LG_QKV, pm->ad, T, err, errlen)))
        return rc;
    MARK(2);
    if (w->bq)
        CU(k_add_bias(e->q, w->bq, T, HS, s));
    if (w->bk)
        CU(k_add_bias(e->k, w->bk, T, KS, s));
    if (w->bv)
        CU(k_add_bias(e->v, w->bv, T, KS, s));
    if (w->q_norm) {
        CU(k_rmsnorm(e->q, w->q_norm, T * H, S, m->norm_eps, a->norm_plus_one, e->q, NULL, s));
        CU(k_rmsnorm(e->k, w->k_norm, T * K, S, m->norm_eps, a->norm_plus_one, e->k, NULL, s));
    }
    bool local = sliding && a->rope_local_on;
    const cpu_rope *rope = local ? &e->rope_local : &e->rope;
    const float *inv = local ? e->d_inv_freq_local : e->d_inv_freq;
    const int32_t *lng = !local && a->rope_long_on ? pm->lng : NULL; /* longrope: the row's table */
    CU(k_rope(e->q, T, (int)H, (int)S, pm->pos, pm->seq, lng, inv, rope->n_rot, rope->style, rope->attn_scale, s));
    CU(k_rope(e->k, T, (int)K, (int)S, pm->pos, pm->seq, lng, inv, rope->n_rot, rope->style, rope->attn_scale, s));
    kv_geom g;
    g.P = e->kv.page_tokens;
    g.Kh = (int)K;
    g.S = (int)S;
    g.kvt = e->kv.dtype;
    g.layer_base = e->d_kv + (size_t)l * (size_t)e->kv.n_pages * (size_t)kv_block_bytes(g.P, g.Kh, g.S, g.kvt);
    CU(k_kv_write(g, e->k, e->v, pm->pos, pm->seq, pm->pt_off, pm->pages, T, s));
    MARK(3);
    CU(k_attention(g, e->q, pm->pos, pm->seq, pm->pt_off, pm->pages, T, (int)H, sliding ? a->sliding_window : 0,
                   a->attn_scale, (float)a->attn_softcap, pm->tiles, pm->n_tiles, pm->singles, pm->n_singles,
                   e->att_max_len, e->o.attention_unsplit ? NULL : e->att_part, e->att, s));
    CU(k_to_bf16(e->att, e->xb, T * HS, s));
    MARK(4);
    if ((rc = cuda_gemm(e, &w->m[M_O], base, e->xb, T, e->h, err, errlen)) ||
        (rc = cuda_lora_apply(e, l, LG_O, pm->ad, T, err, errlen)))
        return rc;
    if (w->post_attn_norm && w->post_ffw_norm)
        CU(k_rmsnorm(e->h, w->post_attn_norm, T, D, m->norm_eps, a->norm_plus_one, e->h, NULL, s));
    CU(k_add(e->x, e->h, T * D, s));
    MARK(5);

    CU(k_rmsnorm(e->x, w->ffn_norm, T, D, m->norm_eps, a->norm_plus_one, NULL, e->xb, s));
    MARK(6);
    if (w->moe) { /* a sparse layer: the routed experts (moe.cu) */
        if ((rc = cuda_moe_ffn(e, w, base, T, lazy, err, errlen)))
            return rc;
        MARK(7);
        MARK(8);
    } else {
        if ((rc = cuda_gemm(e, &w->m[M_GATE], base, e->xb, T, e->g, err, errlen)) ||
            (rc = cuda_gemm(e, &w->m[M_UP], base, e->xb, T, e->u, err, errlen)) ||
            (rc = cuda_lora_apply(e, l, LG_GU, pm->ad, T, err, errlen)))
            return rc;
        MARK(7);
        CU(k_act_mul(e->g, e->u, T * F, a->act == ARCH_ACT_GELU_TANH, e->xb, NULL, s));
        MARK(8);
        if ((rc = cuda_gemm(e, &w->m[M_DOWN], base, e->xb, T, e->h, err, errlen)) ||
            (rc = cuda_lora_apply(e, l, LG_DOWN, pm->ad, T, err, errlen)))
            return rc;
    }
    if (w->post_ffw_norm)
        CU(k_rmsnorm(e->h, w->post_ffw_norm, T, D, m->norm_eps, a->norm_plus_one, e->h, NULL, s));
    CU(k_add(e->x, e->h, T * D, s));
    MARK(9);
    return 0;
}

/* Makes the pass metadata (device and pinned host) hold page tables of at least npt entries: a prefix page mapped by
 * several rows is in each of their tables, so a pass's tables can outgrow the arena's page count.  The new buffers
 * are allocated before the old ones are freed (a failure leaves the engine as it was); the compute stream is drained
 * first (the previous pass's metadata copy reads the pinned buffer).  The growth is a few MB at most (4 bytes per
 * entry, twice): outside the HBM plan, as the cuBLAS handle's own allocations are. */
static int meta_grow(cuda_engine *e, int32_t npt, char *err, size_t errlen)
{
    int64_t cap = (int64_t)e->pt_cap * 2 > npt ? (int64_t)e->pt_cap * 2 : npt;
    if (cap > INT32_MAX)
        cap = INT32_MAX;
    size_t bytes = e->meta_fixed + (size_t)cap * 4;
    int32_t *d = NULL, *h = NULL;
    CU(cudaStreamSynchronize(e->cs));
    if (cudaMalloc((void **)&d, bytes) != cudaSuccess || cudaHostAlloc((void **)&h, bytes, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        if (d)
            cudaFree(d);
        return util_errf(err, errlen,
                         "the pass's page tables need %d entries (shared prefix pages count once per row that maps "
                         "them) and the pass metadata cannot grow to %zu bytes; run with a smaller --batch.",
                         npt, bytes);
    }
    for (size_t i = 0; i < e->n_allocs; i++)
        if (e->allocs[i] == e->d_meta)
            e->allocs[i] = d;
    cudaFree(e->d_meta);
    cudaFreeHost(e->h_meta);
    e->d_meta = d;
    e->h_meta = h;
    e->pt_cap = (int32_t)cap;
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
    e->lo.pass = false;
    for (int s = 0; s < n_seqs; s++) {
        const fwd_seq *sq = &seqs[s];
        if (sq->adapter < 0 || sq->adapter > e->lo.n)
            return util_errf(err, errlen,
                             "sequence %d names LoRA adapter %d, but the engine holds %d (0 = the bare base).", s,
                             sq->adapter, e->lo.n);
        e->lo.pass |= sq->adapter != 0;
        if (sq->n <= 0 || T + sq->n > Tmax)
            return util_errf(err, errlen, "a pass of more than %lld tokens (or an empty sequence) was requested.",
                             (long long)Tmax);
        if (sq->pos0 < 0 || kv_pages_for(&e->kv, sq->pos0 + sq->n) > sq->kv->n_pages || sq->pos0 + sq->n > m->ctx_len)
            return util_errf(err, errlen, "sequence %d has no KV room for positions up to %d.", s, sq->pos0 + sq->n);
        if (sq->all_logits && (sq->logits_skip < 0 || sq->logits_skip >= sq->n))
            return util_errf(err, errlen, "sequence %d skips %d of its %d tokens' logits (at most n - 1).", s,
                             sq->logits_skip, sq->n);
        T += sq->n;
        R += sq->all_logits ? sq->n - sq->logits_skip : sq->want_logits;
        if (R > e->max_rows)
            return util_errf(err, errlen,
                             "a pass asked for more than the engine's %d rows of logits; raise "
                             "max_logit_rows.",
                             e->max_rows);
        int32_t np = kv_pages_for(&e->kv, sq->pos0 + sq->n);
        if (np > INT32_MAX - npt)
            return util_errf(err, errlen, "the pass's page tables hold more than %d entries.", INT32_MAX);
        npt += np;
    }
    if (npt > e->pt_cap && meta_grow(e, npt, err, errlen))
        return -1;
    int32_t *tok = e->h_meta, *pos = tok + Tmax, *seq = pos + Tmax, *rows = seq + Tmax;
    int32_t *pt_off = rows + e->max_rows, *tiles = pt_off + e->max_seqs, *singles = tiles + 2 * Tmax;
    int32_t *lng = singles + Tmax, *ad = lng + e->max_seqs, *pages = ad + Tmax;
    int64_t t = 0;
    npt = 0;
    R = 0;
    for (int s = 0; s < n_seqs; s++) {
        const fwd_seq *sq = &seqs[s];
        int32_t need = kv_pages_for(&e->kv, sq->pos0 + sq->n);
        pt_off[s] = npt;
        lng[s] = e->a.rope_long_on && sq->pos0 + sq->n > e->a.rope_long_after; /* as the CPU engine decides */
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
            ad[t] = sq->adapter;
            if (sq->all_logits && i >= sq->logits_skip)
                rows[R++] = (int32_t)t;
        }
        if (sq->want_logits && !sq->all_logits)
            rows[R++] = (int32_t)(t - 1);
    }
    /* attention: runs of >= ATT_TILE_MIN_RUN consecutive positions (prompt chunks, speculative verify runs) in
     * tiles, the rest token by token.  A token alone reads its row's whole KV, so a run of n verify tokens read it
     * n times: device run 30 (70B shape, 680 rows of 1,000 positions) measured verify passes of 5-7 tokens a row
     * at 1.17-1.53x a plain pass while 8-9 (tiled) cost 1.04-1.06x.  A tile reads each key block once for the
     * run's queries; a short run leaves tile rows idle, which costs MMA work, not memory.  SPILL_CUDA_TILE_MIN=N
     * overrides it (measurement). */
    static int min_run = 0;
    if (!min_run) {
        const char *v = getenv("SPILL_CUDA_TILE_MIN");
        min_run = v && atoi(v) >= 1 ? atoi(v) : ATT_TILE_MIN_RUN;
    }
    k_attention_plan(seq, pos, T, k_attention_tile_tokens(m->n_heads, m->n_kv_heads, m->head_dim), min_run, tiles,
                     singles, &e->att_tiles, &e->att_singles);
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
                         const int32_t *target, cuda_pick *picks, char *err, size_t errlen)
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
                    dm + 3 * Tm + Rm + B + 3 * Tm + B,
                    dm + 3 * Tm + Rm + B + 3 * Tm + B + Tm,
                    e->att_tiles,
                    e->att_singles};
    e->cur_T = T; /* before the first pump of the pass: its lazy-copy choice */
    CU(k_embed(e->embd.type, e->d_embd, e->embd.row_bytes, pm.tok, T, D, e->a.embed_scale, e->x, s));
    if (e->ns && (rc = pump(e, err, errlen)))
        return rc;
    for (int l = 0; l < m->n_layers; l++) {
        const dlayer *w = &e->layers[l];
        if (w->resident) {
            if ((rc = forward_layer(e, &pm, w, w->dev, l, T, false, err, errlen)))
                return rc;
            continue;
        }
        uint64_t k = e->computes_freed;
        int slot = (int)(k % (uint64_t)e->slots);
        CU(cudaStreamWaitEvent(s, e->ev_copied[slot], 0));
        if ((rc = forward_layer(e, &pm, w, e->d_ring + (size_t)slot * e->slot_bytes, l, T, e->slot_lazy[slot], err,
                                errlen)))
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
        CU(k_rmsnorm(e->last, e->out_norm, R, D, m->norm_eps, e->a.norm_plus_one, NULL, e->lastb, s));
        if ((rc = cuda_gemm(e, &e->out, e->d_out, e->lastb, R, e->logits, err, errlen)))
            return rc;
        if (e->a.final_softcap > 0)
            CU(k_softcap(e->logits, (int64_t)R * V, (float)e->a.final_softcap, s));
        if (want) {
            /* picks on the device; only the rows the host samples come back whole, in runs of rows */
            /* want then target, one copy: d_want holds 2 * max_rows */
            memcpy(e->h_want, want, (size_t)R * 4);
            if (target)
                memcpy(e->h_want + R, target, (size_t)R * 4);
            CU(cudaMemcpyAsync(e->d_want, e->h_want, (size_t)R * (target ? 8 : 4), cudaMemcpyHostToDevice, s));
            CU(k_pick(e->logits, R, (int)V, e->d_want, target ? e->d_want + R : NULL, e->d_picks, s));
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
                       const int32_t *target, cuda_pick *picks, char *err, size_t errlen);

int cuda_engine_forward(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen)
{
    return forward_any(e, seqs, n_seqs, logits, NULL, NULL, NULL, err, errlen);
}

int cuda_engine_forward_pick(cuda_engine *e, fwd_seq *seqs, int n_seqs, const int32_t *want, const int32_t *target,
                             cuda_pick *picks, float *logits, char *err, size_t errlen)
{
    return forward_any(e, seqs, n_seqs, logits, want, target, picks, err, errlen);
}

static int forward_any(cuda_engine *e, fwd_seq *seqs, int n_seqs, float *logits, const int32_t *want,
                       const int32_t *target, cuda_pick *picks, char *err, size_t errlen)
{
    if (g_poisoned) {
        util_errf(err, errlen, "the CUDA context is unusable after an earlier GPU fault; exit and resume.");
        return CUDA_ENGINE_EDEVICE;
    }
    if (e->broken)
        return util_errf(err, errlen, "the CUDA engine stopped in the middle of an earlier pass; reopen it.");
    double t0 = mono();
    int rc = forward_inner(e, seqs, n_seqs, logits, want, target, picks, err, errlen);
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
