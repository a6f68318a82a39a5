/*
 * cuda_load.cu — loading a model into the CUDA engine: binding each layer's
 * matrices (type, shape, offset in its layer pack), uploading globals and
 * resident layers to HBM, reading the streamed layers into one pinned host
 * arena (several reader threads, then cudaHostRegister) or opening the disk
 * tier's pinned slots, and the RoPE tables.  What to bind, in which shape,
 * and the RoPE parameters come from the model's arch_layout (model/arch.h),
 * the same the CPU engine binds from; this file only maps slots to the
 * engine's fields.  The engine's state and helpers are in cuda_internal.h;
 * cuda_engine.cu calls these from cuda_engine_open.
 */
#include "cuda_internal.h"

#include <sys/stat.h>

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

/* Describes slot s of layer l (model/arch.h) as a matrix in its file dtype; w->t stays NULL when the model
 * has none. */
static int bind_mat(cuda_engine *e, dmat *w, enum arch_slot s, int l, char *err, size_t errlen)
{
    const model_tensor *t;
    memset(w, 0, sizeof *w);
    if (model_arch_tensor(e->m, &e->a, s, l, &t, err, errlen))
        return -1;
    if (!t)
        return 0;
    int64_t n = e->a.t[s].n, k = e->a.t[s].k;
    if (!kq_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &w->row_bytes) != 0 ||
        (uint64_t)w->row_bytes * (uint64_t)n != t->size)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which the CUDA backend cannot multiply.",
                         e->m->source, t->name, quant_type_name(t->dtype));
    w->t = t;
    w->type = t->dtype;
    w->n = n;
    w->k = k;
    return 0;
}

/* Uploads slot s of layer l as fp32 (NULL when the model has none). */
static int bind_vec(cuda_engine *e, file_reader *fr, float **out, enum arch_slot s, int l, char *err, size_t errlen)
{
    const model_tensor *t;
    *out = NULL;
    if (model_arch_tensor(e->m, &e->a, s, l, &t, err, errlen))
        return -1;
    if (!t)
        return 0;
    int64_t n = e->a.t[s].n;
    const char *name = t->name;
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

/* RoPE tables of global and sliding layers from the layout's parameters (built by the CPU oracle's
 * cpu_rope_init, so both engines rotate by the same frequencies), uploaded. */
int rope_setup(cuda_engine *e, char *err, size_t errlen)
{
    if (cpu_rope_init(&e->rope, &e->a.rope, err, errlen) ||
        cpu_rope_init(&e->rope_local, &e->a.rope_local, err, errlen) ||
        (e->a.rope_long_on && cpu_rope_init(&e->rope_long, &e->a.rope_long, err, errlen)))
        return -1;
    size_t bytes = (size_t)(e->m->rope_dim / 2) * sizeof(float);
    if (dalloc(e, (void **)&e->d_inv_freq, bytes * (e->a.rope_long_on ? 2 : 1), "RoPE frequencies", err, errlen) ||
        dalloc(e, (void **)&e->d_inv_freq_local, bytes, "RoPE frequencies", err, errlen))
        return -1;
    CU(cudaMemcpy(e->d_inv_freq, e->rope.inv_freq, bytes, cudaMemcpyHostToDevice));
    if (e->a.rope_long_on) /* the long factors right after the short ones: the kernel picks per row */
        CU(cudaMemcpy(e->d_inv_freq + e->m->rope_dim / 2, e->rope_long.inv_freq, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(e->d_inv_freq_local, e->rope_local.inv_freq, bytes, cudaMemcpyHostToDevice));
    return 0;
}

/* Binds the fused matrix in slot s of layer l (QKV, gate/up) as consecutive row ranges: w->m[mi[i]] gets
 * rows[i] rows.  The first part carries the tensor's bytes into the pack; the others point inside it. */
static int bind_fused(cuda_engine *e, dlayer *w, enum arch_slot s, int l, const int *mi, const int64_t *rows,
                      int n_parts, char *err, size_t errlen)
{
    const model_tensor *t;
    if (model_arch_tensor(e->m, &e->a, s, l, &t, err, errlen))
        return -1;
    size_t rb;
    int64_t k = e->a.t[s].k, n = e->a.t[s].n;
    if (!t || !kq_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &rb) != 0 ||
        (uint64_t)rb * (uint64_t)n != t->size)
        return util_errf(err, errlen, "%s: tensor blk.%d.%s is stored as %s, which the CUDA backend cannot multiply.",
                         e->m->source, l, model_arch_slot_name(s), t ? quant_type_name(t->dtype) : "nothing");
    size_t sub = 0;
    for (int i = 0; i < n_parts; i++) {
        dmat *d = &w->m[mi[i]];
        memset(d, 0, sizeof *d);
        d->t = t;
        d->type = t->dtype;
        d->n = rows[i];
        d->k = k;
        d->row_bytes = rb;
        d->sub = sub;
        d->shared = i > 0;
        sub += (size_t)rows[i] * rb;
    }
    return 0;
}

/* Places matrix i of w (layer_mat_at) in its pack: a shared part at its rows inside the part that carries its
 * tensor, the others after the previous ones (PACK_ALIGN apart); returns the next free offset. */
static size_t place_mat(dlayer *w, int i, size_t off)
{
    dmat *d = layer_mat_at(w, i);
    if (!d->t)
        return off;
    if (!d->shared) {
        d->off = off;
        return off + ((size_t)d->t->size + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
    }
    for (int j = 0; j < i; j++) {
        const dmat *o = layer_mat_at(w, j);
        if (o->t == d->t && !o->shared)
            d->off = o->off + d->sub;
    }
    return off;
}

/* One matrix of a sparse layer's FFN: rows [row0, row0 + n) of t, n rows of k. */
static int moe_mat(cuda_engine *e, dmat *d, const model_tensor *t, int64_t row0, int64_t n, int64_t k, char *err,
                   size_t errlen)
{
    memset(d, 0, sizeof *d);
    if (!kq_type_supported(t->dtype) || quant_row_bytes(t->dtype, k, &d->row_bytes) != 0)
        return util_errf(err, errlen, "%s: tensor %s is stored as %s, which the CUDA backend cannot multiply.",
                         e->m->source, t->name, quant_type_name(t->dtype));
    d->t = t;
    d->type = t->dtype;
    d->n = n;
    d->k = k;
    d->sub = (size_t)row0 * d->row_bytes;
    d->shared = row0 != 0; /* the part at row 0 carries the tensor's bytes */
    return 0;
}

/* Binds sparse layer l's FFN: every expert's gate, up and down (model_arch_experts finds them however the file
 * stores them), the shared expert, and the router uploaded as fp32. */
static int bind_moe(cuda_engine *e, file_reader *fr, dlayer *w, int l, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    int E = m->n_experts;
    int64_t D = m->d_model, FE = m->expert_ffn_dim, FS = m->shared_ffn_dim;
    dmoe *mo = (dmoe *)calloc(1, sizeof *mo);
    arch_expert *ex = (arch_expert *)calloc((size_t)E, sizeof *ex);
    if (mo) {
        mo->gate = (dmat *)calloc((size_t)E, sizeof(dmat));
        mo->up = (dmat *)calloc((size_t)E, sizeof(dmat));
        mo->down = (dmat *)calloc((size_t)E, sizeof(dmat));
    }
    w->moe = mo;
    if (!mo || !ex || !mo->gate || !mo->up || !mo->down) {
        free(ex);
        return util_errf(err, errlen, "out of host memory binding layer %d's experts.", l);
    }
    mo->E = E;
    static const enum arch_slot slots[3] = {ARCH_GATE_EXPS, ARCH_UP_EXPS, ARCH_DOWN_EXPS};
    dmat *dst[3] = {mo->gate, mo->up, mo->down};
    int rc = 0;
    for (int p = 0; p < 3 && rc == 0; p++) {
        rc = model_arch_experts(m, &e->a, slots[p], l, ex, err, errlen);
        for (int x = 0; x < E && rc == 0; x++)
            rc = moe_mat(e, &dst[p][x], ex[x].t, ex[x].row0, p == 2 ? D : FE, p == 2 ? FE : D, err, errlen);
    }
    free(ex);
    if (rc)
        return -1;
    const model_tensor *t;
    static const enum arch_slot sh_slots[3] = {ARCH_SHEXP_GATE, ARCH_SHEXP_UP, ARCH_SHEXP_DOWN};
    dmat *sh[3] = {&mo->sh_gate, &mo->sh_up, &mo->sh_down};
    for (int p = 0; p < 3; p++) {
        if (model_arch_tensor(m, &e->a, sh_slots[p], l, &t, err, errlen))
            return -1;
        if (t && moe_mat(e, sh[p], t, 0, p == 2 ? D : FS, p == 2 ? FS : D, err, errlen))
            return -1;
    }
    if (bind_vec(e, fr, &mo->sh_gate_inp, ARCH_SHEXP_GATE_INP, l, err, errlen))
        return -1;
    /* the router, fp32 on the device */
    if (model_arch_tensor(m, &e->a, ARCH_ROUTER, l, &t, err, errlen))
        return -1;
    if (!t)
        return util_errf(err, errlen, "%s: layer %d has no router (blk.%d.ffn_gate_inp.weight).", m->source, l, l);
    size_t rb;
    if (quant_row_bytes(t->dtype, D, &rb) != 0 || rb * (size_t)E != t->size)
        return util_errf(err, errlen, "%s: tensor %s cannot be read as %d rows of %lld.", m->source, t->name, E,
                         (long long)D);
    uint8_t *raw = (uint8_t *)malloc((size_t)t->size);
    float *f = (float *)malloc((size_t)E * (size_t)D * sizeof(float));
    rc = !raw || !f ? util_errf(err, errlen, "out of host memory binding %s.", t->name)
                    : read_tensor(e, fr, t, raw, err, errlen);
    for (int x = 0; x < E && rc == 0; x++)
        if (quant_dequant_row(t->dtype, raw + (size_t)x * rb, f + (size_t)x * D, D) != 0)
            rc = util_errf(err, errlen, "%s: tensor %s cannot be converted.", m->source, t->name);
    if (rc == 0)
        rc = dalloc(e, (void **)&mo->router, (size_t)E * (size_t)D * sizeof(float), t->name, err, errlen);
    if (rc == 0 && cudaMemcpy(mo->router, f, (size_t)E * (size_t)D * sizeof(float), cudaMemcpyHostToDevice) !=
                       cudaSuccess)
        rc = util_errf(err, errlen, "uploading %s failed.", t->name);
    free(raw);
    free(f);
    return rc;
}

/* The pack matrix (M_*) that holds per-layer slot s, or -1 where the CUDA pass has no kernel that reads it. */
static int layer_mat(enum arch_slot s)
{
    switch (s) {
    case ARCH_Q:
        return M_Q;
    case ARCH_K:
        return M_K;
    case ARCH_V:
        return M_V;
    case ARCH_O:
        return M_O;
    case ARCH_GATE:
        return M_GATE;
    case ARCH_UP:
        return M_UP;
    case ARCH_DOWN:
        return M_DOWN;
    default:
        return -1;
    }
}

/* The field of w that holds per-layer 1-D slot s, or NULL where the CUDA pass has no kernel that reads it. */
static float **layer_vec(dlayer *w, enum arch_slot s)
{
    switch (s) {
    case ARCH_ATTN_NORM:
        return &w->attn_norm;
    case ARCH_Q_BIAS:
        return &w->bq;
    case ARCH_K_BIAS:
        return &w->bk;
    case ARCH_V_BIAS:
        return &w->bv;
    case ARCH_Q_NORM:
        return &w->q_norm;
    case ARCH_K_NORM:
        return &w->k_norm;
    case ARCH_POST_ATTN_NORM:
        return &w->post_attn_norm;
    case ARCH_FFN_NORM:
        return &w->ffn_norm;
    case ARCH_POST_FFW_NORM:
        return &w->post_ffw_norm;
    default:
        return NULL;
    }
}

/* Describes every layer's matrices and pack layout, then uploads its norms and biases: the slots the layout
 * lists, matrices first, each group in slot order. */
int bind_layers(cuda_engine *e, file_reader *fr, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    e->layers = (dlayer *)calloc((size_t)m->n_layers, sizeof *e->layers);
    if (!e->layers)
        return util_errf(err, errlen, "out of host memory binding layers.");
    for (int l = 0; l < m->n_layers; l++) {
        dlayer *w = &e->layers[l];
        for (int pass = 0; pass < 2; pass++)
            for (int si = ARCH_LAYER_FIRST; si < ARCH_SLOT_COUNT; si++) {
                enum arch_slot s = (enum arch_slot)si;
                const arch_tensor *at = &e->a.t[s];
                if (arch_slot_need(&e->a, s, l) == ARCH_ABSENT || arch_slot_sparse(s) ||
                    (pass == 0) != (at->kind != ARCH_VECTOR))
                    continue;
                enum arch_slot parts[ARCH_MAX_PARTS];
                int64_t rows[ARCH_MAX_PARTS];
                int np = arch_fused_parts(&e->a, s, parts, rows);
                if (np) { /* fused: row ranges of one tensor */
                    int mi[ARCH_MAX_PARTS];
                    for (int i = 0; i < np; i++)
                        mi[i] = layer_mat(parts[i]);
                    if (bind_fused(e, w, s, l, mi, rows, np, err, errlen))
                        return -1;
                    continue;
                }
                int mi = at->kind == ARCH_MATRIX ? layer_mat(s) : -1;
                float **vec = at->kind == ARCH_VECTOR ? layer_vec(w, s) : NULL;
                if (mi < 0 && !vec)
                    return util_errf(err, errlen,
                                     "%s: architecture %s needs tensor blk.%d.%s, which the CUDA engine has no kernel "
                                     "for (model/arch.c marks the family wired).",
                                     m->source, m->arch, l, model_arch_slot_name(s));
                if (mi >= 0 ? bind_mat(e, &w->m[mi], s, l, err, errlen) : bind_vec(e, fr, vec, s, l, err, errlen))
                    return -1;
            }
        if (arch_layer_sparse(&e->a, l) && bind_moe(e, fr, w, l, err, errlen))
            return -1;
        size_t off = 0;
        for (int i = 0; i < layer_n_mats(w); i++)
            off = place_mat(w, i, off);
        w->pack_bytes = off;
        cuda_moe_place(w);
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
        for (int i = 0; i < layer_n_mats(w); i++) {
            dmat *d = layer_mat_at(w, i);
            if (!d->t)
                continue;
            int64_t at = stream_slot_offset(e->disk, l, d->t->file, d->t->offset);
            if (at < 0)
                return util_errf(err, errlen, "%s: tensor %s lies outside layer %d's byte range.", m->source,
                                 d->t->name, l);
            d->off = (size_t)at + d->sub;
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
 * with cudaHostAlloc (pinning 1.8-4.7 s vs 28.1-31.3 s), identical answers.  cuda_engine_opts.pin_alloc
 * (SPILL_CUDA_PIN=alloc) keeps cudaHostAlloc (for A/B measurements); it is also the fallback where the driver refuses to register. */
static bool pin_by_register(const cuda_engine *e)
{
    return !e->o.pin_alloc;
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
    if (e->h_share) { /* this process copies the host's shared copy into its own: it shares nothing now */
        host_share_close(e->h_share);
        e->h_share = NULL;
        e->st.pin_shared = 0;
        snprintf(e->st.pin_share_note, sizeof e->st.pin_share_note, "the driver would not pin the shared copy");
    } else {
        munmap(mapped, bytes);
    }
    e->h_pinned_map = 0;
    return 0;
}

/* Keep mode (spill worker, host_share_keeping()): the HBM arenas of the resident layer packs (d_res) and of
 * the globals (d_embd, d_out) outlive an engine, so the worker's next job of the same model and the same split
 * maps them instead of uploading the layers again.  Each is keyed like the pinned copy: this build, the model
 * files' identity, every upload's (file, offset, size, destination).  A closing engine in keep mode hands its
 * arenas here (cuda_keep_stash); the next one takes them when its keys match, and frees them first when not
 * (a different model or split), so at most one set is ever kept.  A dense model's only (MoE layers upload their
 * experts apart: never kept). */
typedef struct kept_arena {
    char key[65];
    uint8_t *p[2];
    size_t bytes;
    int device;
} kept_arena;
static kept_arena g_kept_res, g_kept_glob;

static void kept_free(kept_arena *k)
{
    for (int i = 0; i < 2; i++)
        if (k->p[i])
            cudaFree(k->p[i]);
    memset(k, 0, sizeof *k);
}

uint64_t cuda_kept_bytes(void)
{
    return g_kept_res.bytes + g_kept_glob.bytes;
}

/* Appends the files' identity to key (as the pinned copy's key has it); false when a file cannot be stat'ed. */
static bool key_files(const model_desc *m, char *key, size_t cap, size_t *n)
{
    for (size_t f = 0; f < m->n_files; f++) {
        struct stat st;
        if (stat(m->files[f].path, &st) != 0)
            return false;
        *n += (size_t)snprintf(key + *n, cap - *n, "%llu %llu %llu %lld.%09ld\n", (unsigned long long)st.st_dev,
                               (unsigned long long)st.st_ino, (unsigned long long)st.st_size,
                               (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    }
    return *n < cap;
}

/* An engine's kept arenas: taken out of its allocation list (close does not free them) and kept for the next. */
void cuda_keep_stash(cuda_engine *e)
{
    /* no keys: not keep mode, or an open that failed (cuda_engine_open clears them; the globals may not exist) */
    if (!host_share_keeping() || (!e->keep_res[0] && !e->keep_glob[0]) || !e->embd.t)
        return;
    struct {
        const char *key;
        uint8_t *p[2];
        size_t bytes;
        kept_arena *to;
    } s[2] = {{e->keep_res, {e->d_res, NULL}, e->st.resident_weight_bytes, &g_kept_res},
              {e->keep_glob, {e->d_embd, e->d_out != e->d_embd ? e->d_out : NULL}, 0, &g_kept_glob}};
    s[1].bytes = (size_t)e->embd.t->size + (e->d_out != e->d_embd ? (size_t)e->out.t->size : 0);
    s[0].bytes -= s[1].bytes; /* resident_weight_bytes counts both */
    for (int k = 0; k < 2; k++) {
        if (!s[k].key[0] || !s[k].p[0])
            continue;
        kept_free(s[k].to);
        for (size_t i = 0; i < e->n_allocs; i++)
            if (e->allocs[i] == s[k].p[0] || (s[k].p[1] && e->allocs[i] == s[k].p[1]))
                e->allocs[i] = NULL;
        snprintf(s[k].to->key, sizeof s[k].to->key, "%s", s[k].key);
        s[k].to->p[0] = s[k].p[0];
        s[k].to->p[1] = s[k].p[1];
        s[k].to->bytes = s[k].bytes;
        s[k].to->device = e->o.device;
    }
}

/* The host's shared copy of the streamed arena (engine/host_share.h).  Its key is everything the bytes depend
 * on: this build, every model file's identity (device, inode, size, modification time), and each read
 * (tensor file, offset, size, and where it lands in the arena).  Sets e->h_pinned and e->h_share and *filled
 * (another process filled it: nothing to read) and returns 0; where the copy cannot be shared (no room in the
 * directory, no such directory) leaves them unset with the reason in st.pin_share_note (the caller maps a
 * private arena); -1 when out of memory. */
static int pin_share_open(cuda_engine *e, const pin_job *jobs, size_t nj, size_t bytes, bool *filled)
{
    const model_desc *m = e->m;
    size_t cap = 256 + m->n_files * 100 + nj * 64, n = 0;
    char *key = (char *)malloc(cap);
    if (!key)
        return -1;
    n += (size_t)snprintf(key + n, cap - n, "spill pinned arena v1 built %s %s %zu\n", __DATE__, __TIME__, bytes);
    for (size_t f = 0; f < m->n_files; f++) {
        struct stat st;
        if (stat(m->files[f].path, &st) != 0) {
            free(key);
            snprintf(e->st.pin_share_note, sizeof e->st.pin_share_note, "%.100s: %s", m->files[f].path,
                     strerror(errno));
            return 0;
        }
        n += (size_t)snprintf(key + n, cap - n, "%llu %llu %llu %lld.%09ld\n", /* not the path: ranks may name
                                                                                   the file differently */
                              (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                              (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    }
    for (size_t k = 0; k < nj && n < cap; k++)
        n += (size_t)snprintf(key + n, cap - n, "%u %llu %llu %zu\n", jobs[k].t->file,
                              (unsigned long long)jobs[k].t->offset, (unsigned long long)jobs[k].t->size,
                              (size_t)(uintptr_t)jobs[k].dst);
    host_share *s = NULL;
    uint8_t *base = NULL;
    bool fill = false;
    int rc = n < cap ? host_share_open(e->o.shm_dir, key, bytes, &s, &base, &fill, e->st.pin_share_note,
                                       sizeof e->st.pin_share_note)
                     : (snprintf(e->st.pin_share_note, sizeof e->st.pin_share_note, "the arena's key overflowed"), 1);
    free(key);
    if (rc != 0)
        return 0;
    e->h_share = s;
    e->h_pinned = base;
    e->st.pin_shared = fill ? 1 : 2;
    *filled = !fill;
    return 0;
}

/* Places layer packs: a resident prefix in one HBM arena, the rest in one pinned arena (exact size) or,
 * with from_disk, read every pass through the disk tier; plus the device ring. */
int place_layers(cuda_engine *e, file_reader *fr, char *err, size_t errlen)
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
    bool res_kept = false; /* keep mode: the last job's resident packs are these (nothing to upload) */
    e->keep_res[0] = 0;
    bool dense = true;
    for (int l = 0; l < L; l++)
        dense = dense && !arch_layer_sparse(&e->a, l);
    if (res_bytes && host_share_keeping() && !e->o.reader && dense) {
        size_t cap = 2048 + (size_t)lr * 16 * 80, n = 0;
        char *key = (char *)malloc(cap);
        if (!key)
            return util_errf(err, errlen, "out of host memory.");
        n += (size_t)snprintf(key + n, cap - n, "spill resident packs v1 built %s %s %zu\n", __DATE__, __TIME__,
                              res_bytes);
        bool ok = key_files(m, key, cap, &n);
        for (int l = 0; ok && l < lr; l++) {
            const dlayer *w = &e->layers[l];
            for (int i = 0; ok && i < layer_n_mats(&e->layers[l]); i++) {
                const dmat *d = layer_mat_at(&e->layers[l], i);
                if (!d->t || d->shared)
                    continue;
                n += (size_t)snprintf(key + n, cap - n, "%u %llu %llu %zu\n", d->t->file,
                                      (unsigned long long)d->t->offset, (unsigned long long)d->t->size,
                                      (size_t)(uintptr_t)w->dev + d->off);
                ok = n < cap;
            }
        }
        if (ok)
            host_share_key_hex(key, e->keep_res);
        free(key);
        if (e->keep_res[0] && g_kept_res.p[0] && g_kept_res.device == e->o.device && g_kept_res.bytes == res_bytes &&
            !strcmp(g_kept_res.key, e->keep_res)) {
            e->d_res = g_kept_res.p[0];
            memset(&g_kept_res, 0, sizeof g_kept_res);
            if (dtrack(e, e->d_res, res_bytes, err, errlen))
                return -1;
            res_kept = true;
        } else {
            kept_free(&g_kept_res);
        }
    }
    if (res_bytes && !res_kept)
        e->st.hbm_kept = false; /* the globals alone were the last job's: the layers upload */
    if (res_bytes && !res_kept && dalloc(e, (void **)&e->d_res, res_bytes, "resident layers", err, errlen))
        return -1;
    /* the streamed tensors' reads into the arena, as offsets until the arena exists (a caller's reader, in
     * tests, reads in the loop below instead) */
    pin_job *jobs = NULL;
    size_t nj = 0;
    size_t n_mats = 0;
    for (int l = 0; l < L; l++)
        n_mats += (size_t)layer_n_mats(&e->layers[l]);
    if (pin_bytes && !e->o.reader && !(jobs = (pin_job *)malloc(n_mats * sizeof *jobs)))
        return util_errf(err, errlen, "out of host memory.");
    for (int l = 0; l < L && jobs; l++) {
        dlayer *w = &e->layers[l];
        if (w->resident || disk)
            continue;
        for (int i = 0; i < layer_n_mats(w); i++) {
            const dmat *d = layer_mat_at(w, i);
            if (d->t && !d->shared) /* no tensor; or its bytes come with the part that carries them */
                jobs[nj++] = (pin_job){d->t, (uint8_t *)(uintptr_t)((size_t)(uintptr_t)w->host + d->off)};
        }
    }
    bool reg = pin_bytes && pin_by_register(e);
    bool filled = false; /* the host's shared copy was filled by another process (or this worker's last job) */
    double t_pin = mono();
    if (reg && jobs && !e->o.pin_private) {
        int sr = pin_share_open(e, jobs, nj, pin_bytes, &filled);
        if (sr < 0) {
            free(jobs);
            return util_errf(err, errlen, "out of host memory.");
        }
    }
    if (reg && !e->h_share) {
        void *p = mmap(NULL, pin_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            free(jobs);
            return util_errf(err, errlen,
                             "cannot map %.2f GiB of host RAM for %d streamed layers (%s); keep more layers resident or "
                             "free host memory.",
                             (double)pin_bytes / (1 << 30), e->ns, strerror(errno));
        }
        madvise(p, pin_bytes, MADV_HUGEPAGE); /* fewer faults and a shorter page list to pin; advisory */
        e->h_pinned = (uint8_t *)p;
        e->h_pinned_map = pin_bytes;
    } else if (pin_bytes && !reg && pin_alloc(e, pin_bytes, err, errlen)) {
        free(jobs);
        return -1;
    }
    e->st.pinned_bytes = pin_bytes;
    e->st.pin_alloc_s = mono() - t_pin;
    for (size_t k = 0; k < nj; k++)
        jobs[k].dst = e->h_pinned + (size_t)(uintptr_t)jobs[k].dst;
    uint8_t *bounce = NULL;
    size_t bounce_cap = 0;
    int rc = 0;
    for (int l = 0; l < L && rc == 0; l++) {
        dlayer *w = &e->layers[l];
        if (w->resident)
            w->dev = e->d_res + (size_t)(uintptr_t)w->dev;
        else if (disk)
            continue;
        else
            w->host = e->h_pinned + (size_t)(uintptr_t)w->host;
        for (int i = 0; i < layer_n_mats(w) && rc == 0; i++) {
            const dmat *d = layer_mat_at(w, i);
            if (!d->t || d->shared) /* no tensor; or its bytes come with the part that carries them */
                continue;
            if (w->resident)
                rc = res_kept ? 0 : upload_mat(e, fr, d, w->dev + d->off, &bounce, &bounce_cap, err, errlen);
            else if (!jobs) /* a caller's reader (tests): one thread, in order */
                rc = read_tensor(e, fr, d->t, w->host + d->off, err, errlen);
        }
    }
    free(bounce);
    double t_read = mono();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    e->st.pin_readers = !jobs ? 1 : cores >= 16 ? 8 : 4;
    if (rc == 0 && jobs && !filled)
        rc = pin_fill_run(fr, jobs, nj, e->st.pin_readers, err, errlen);
    if (rc == 0 && e->h_share && !filled)
        rc = host_share_ready(e->h_share, err, errlen);
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
    e->slot_lazy = (bool *)calloc((size_t)e->slots, sizeof(bool));
    for (int p = 0; p < 2; p++) {
        e->ev_cs[p] = (cudaEvent_t *)calloc((size_t)e->ns, sizeof(cudaEvent_t));
        e->ev_ce[p] = (cudaEvent_t *)calloc((size_t)e->ns, sizeof(cudaEvent_t));
        if (!e->ev_cs[p] || !e->ev_ce[p])
            return util_errf(err, errlen, "out of host memory for stream events.");
    }
    if (!e->ev_copied || !e->ev_free || !e->slot_lazy)
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

int bind_globals(cuda_engine *e, file_reader *fr, char *err, size_t errlen)
{
    if (bind_mat(e, &e->embd, ARCH_TOKEN_EMBD, -1, err, errlen) || bind_mat(e, &e->out, ARCH_OUTPUT, -1, err, errlen) ||
        bind_vec(e, fr, &e->out_norm, ARCH_OUTPUT_NORM, -1, err, errlen))
        return -1;
    uint8_t *bounce = NULL;
    size_t cap = 0;
    int rc = 0;
    e->keep_glob[0] = 0;
    if (host_share_keeping() && !e->o.reader) { /* keep mode: the last job's globals when they are these */
        char key[2048];
        size_t n = (size_t)snprintf(key, sizeof key, "spill globals v1 built %s %s\n", __DATE__, __TIME__);
        if (key_files(e->m, key, sizeof key, &n) && n < sizeof key - 200) {
            snprintf(key + n, sizeof key - n, "%u %llu %llu / %u %llu %llu\n", e->embd.t->file,
                     (unsigned long long)e->embd.t->offset, (unsigned long long)e->embd.t->size,
                     e->out.t ? e->out.t->file : 0u, e->out.t ? (unsigned long long)e->out.t->offset : 0ull,
                     e->out.t ? (unsigned long long)e->out.t->size : 0ull);
            host_share_key_hex(key, e->keep_glob);
        }
        bool same = e->keep_glob[0] && g_kept_glob.p[0] && g_kept_glob.device == e->o.device &&
                    !strcmp(g_kept_glob.key, e->keep_glob) && (e->out.t != NULL) == (g_kept_glob.p[1] != NULL);
        if (!same) { /* another model: what was kept for it goes before anything of this one is allocated */
            kept_free(&g_kept_glob);
            kept_free(&g_kept_res);
        } else {
            e->d_embd = g_kept_glob.p[0];
            e->d_out = g_kept_glob.p[1];
            memset(&g_kept_glob, 0, sizeof g_kept_glob);
            if (dtrack(e, e->d_embd, (size_t)e->embd.t->size, err, errlen) ||
                (e->d_out && dtrack(e, e->d_out, (size_t)e->out.t->size, err, errlen)))
                return -1;
            e->st.hbm_kept = true;
        }
    }
    if (!e->d_embd) {
        rc = dalloc(e, (void **)&e->d_embd, (size_t)e->embd.t->size, "the embedding table", err, errlen);
        if (rc == 0)
            rc = upload_mat(e, fr, &e->embd, e->d_embd, &bounce, &cap, err, errlen);
        if (rc == 0 && e->out.t) {
            rc = dalloc(e, (void **)&e->d_out, (size_t)e->out.t->size, "the output head", err, errlen);
            if (rc == 0)
                rc = upload_mat(e, fr, &e->out, e->d_out, &bounce, &cap, err, errlen);
        }
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

