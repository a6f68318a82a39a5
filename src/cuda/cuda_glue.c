/*
 * cuda_glue.c — registers the GPU engine as the job runner's backend
 * (spill_gpu_open in engine.h).  Linked only into build/cuda/spill-cuda; the
 * CPU-only `spill` never sees it.
 *
 * The tier plan is applied here: the HBM split comes from hbm_plan.c (the
 * device's free memory and the engine's pass buffers are the inputs only
 * this file can measure); streamed layers come from pinned host RAM when
 * they fit there (read from disk once) and else from disk every pass
 * (O_DIRECT into a few pinned slots).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "../engine/engine.h"
#include "../engine/hbm_plan.h"
#include "../batch/plan.h"
#include "../batch/sample.h"
#include "../base/util.h"
#include "cuda_backend.h"
#include "../engine/host_share.h"

static int g_forward(void *impl, fwd_seq *seqs, int n, float *logits, char *err, size_t errlen)
{
    int rc = cuda_engine_forward(impl, seqs, n, logits, err, errlen);
    return rc == CUDA_ENGINE_EDEVICE ? ENGINE_EDEVICE : rc;
}
/* sample_result and cuda_pick are the same record, so the engine writes the runner's results in place. */
_Static_assert(sizeof(sample_result) == sizeof(cuda_pick) && offsetof(sample_result, token) == offsetof(cuda_pick, token) &&
                   offsetof(sample_result, logprob) == offsetof(cuda_pick, logprob) &&
                   offsetof(sample_result, n_top) == offsetof(cuda_pick, n_top) &&
                   offsetof(sample_result, top_id) == offsetof(cuda_pick, top_id) &&
                   offsetof(sample_result, top_logprob) == offsetof(cuda_pick, top_logprob) &&
                   SAMPLE_MAX_TOP == CUDA_PICK_MAX_TOP,
               "sample_result mirrors cuda_pick");

static int g_forward_pick(void *impl, fwd_seq *seqs, int n, const int32_t *want, const int32_t *target,
                          struct sample_result *picks, float *logits, char *err, size_t errlen)
{
    int rc = cuda_engine_forward_pick(impl, seqs, n, want, target, (cuda_pick *)picks, logits, err, errlen);
    return rc == CUDA_ENGINE_EDEVICE ? ENGINE_EDEVICE : rc;
}

static kv_cache *g_kv(void *impl) { return cuda_engine_kv(impl); }
static void g_close(void *impl) { cuda_engine_close(impl); }

static void g_io_line(void *impl, char *buf, size_t cap)
{
    cuda_engine_stats st;
    cuda_engine_get_stats(impl, &st);
    int n = 0;
    if (st.experts_run + st.experts_skipped) {
        n = snprintf(buf, cap, "experts: %llu (layer, expert) visits ran, %llu skipped; ",
                     (unsigned long long)st.experts_run, (unsigned long long)st.experts_skipped);
        if (n > 0 && (size_t)n < cap && st.lazy_layers)
            n += snprintf(buf + n, cap - (size_t)n,
                          "%llu layer copies fetched only the hit experts: %.2f GB copied, %.2f GB never copied; ",
                          (unsigned long long)st.lazy_layers, (double)st.lazy_expert_bytes / 1e9,
                          (double)st.lazy_skipped_bytes / 1e9);
        if (n < 0 || (size_t)n >= cap)
            return;
        buf += n, cap -= (size_t)n;
    }
    if (!st.n_streamed) {
        snprintf(buf, cap, st.hbm_kept ? "weights resident in HBM, kept from the worker's last job (nothing uploaded)"
                                       : "weights resident in HBM");
        return;
    }
    if (st.lazy_layers) /* head-first copies move less than the layer bytes: no rate from the two */
        n = snprintf(buf, cap, "%.2f GB of layers streamed per whole pass; last pass's layer copies busy %.3f s",
                     (double)st.streamed_bytes_per_pass / 1e9, st.last_h2d_busy_s);
    else
        n = snprintf(buf, cap, "%.2f GB streamed per pass; last pass's copies busy %.3f s (%.1f GB/s)",
                     (double)st.streamed_bytes_per_pass / 1e9, st.last_h2d_busy_s,
                     st.last_h2d_busy_s > 0 ? (double)st.streamed_bytes_per_pass / 1e9 / st.last_h2d_busy_s : 0.0);
    if (st.pinned_bytes && st.pin_shared == 2 && n > 0 && (size_t)n < cap) /* engine/host_share.h */
        n += snprintf(buf + n, cap - (size_t)n,
                      "; at open, mapped the host's shared copy of %.1f GB (filled already: read nothing), pinning it "
                      "(cudaHostRegister) took %.1f s",
                      (double)st.pinned_bytes / 1e9, st.pin_alloc_s);
    else if (st.pinned_bytes && n > 0 && (size_t)n < cap)
        n += st.pin_registered
                 ? snprintf(buf + n, cap - (size_t)n,
                            "; at open, %d threads read %.1f GB into RAM in %.1f s, then pinning it (cudaHostRegister) "
                            "took %.1f s",
                            st.pin_readers, (double)st.pinned_bytes / 1e9, st.pin_read_s, st.pin_alloc_s)
                 : snprintf(buf + n, cap - (size_t)n,
                            "; at open, pinning %.1f GB (cudaHostAlloc) took %.1f s, then %d threads read it in %.1f s",
                            (double)st.pinned_bytes / 1e9, st.pin_alloc_s, st.pin_readers, st.pin_read_s);
    if (st.pinned_bytes && n > 0 && (size_t)n < cap) /* engine/host_share.h */
        n += st.pin_shared == 1 ? snprintf(buf + n, cap - (size_t)n,
                                             "; the copy is the host's shared one (other processes streaming the same layers map it)")
             : st.pin_share_note[0] ? snprintf(buf + n, cap - (size_t)n, "; a private copy: %s", st.pin_share_note)
                                    : 0;
    if (st.from_disk && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n,
                 "; read %.2f GB from disk (%.2f GB/s per busy reader), passes waited %.1f s for reads",
                 (double)st.disk_bytes / 1e9, st.disk_read_s > 0 ? (double)st.disk_bytes / 1e9 / st.disk_read_s : 0.0,
                 st.disk_wait_s);
}

/* The GPU this process drives: its rank among its host's ranks, modulo the GPUs it sees (engine.h). */
static int gpu_device(void)
{
    int n = cuda_device_count();
    return n > 0 && spill_gpu_index > 0 ? spill_gpu_index % n : 0;
}

static int gpu_open(model_desc *m, const engine_opts *o, int resident_layers, spill_backend *out, char *err,
                    size_t errlen)
{
    char name[64];
    uint64_t total = 0, freeb = 0;
    memset(out, 0, sizeof *out);
    int dev = gpu_device();
    int rc = cuda_device_info(dev, name, sizeof name, &total, &freeb, err, errlen);
    if (rc)
        return rc == CUDA_ENGINE_EDEVICE ? ENGINE_EDEVICE : -1;
    freeb += cuda_kept_bytes(); /* the last job's resident layers (keep mode): reused or freed by the open */
    /* The HBM plan (hbm_plan.h): the weights stay resident when they fit beside the KV pages the batch
     * can use (what the host plan asked for; more would sit idle); otherwise layers stream from pinned RAM
     * through a ring and the split between a resident prefix of layers and KV pages is the one with the
     * most modelled rows per second — often an empty prefix (ZeRO-Inference's finding).  --gpu-mem caps
     * the HBM planned with (and so emulates a smaller GPU). */
    uint64_t hbm = o->gpu_mem && o->gpu_mem < freeb ? o->gpu_mem : freeb;
    int kvt = o->kv_dtype == KV_I8 ? KV_I8 : KV_BF16;
    /* beside weights and KV: the pass buffers at these caps, exactly as the engine will allocate them, and
     * 1 GiB for the CUDA context, cuBLAS and allocation granularity; with LoRA adapters, their HBM too */
    cuda_engine_opts caps = {0};
    caps.max_pass_tokens = o->max_pass_tokens;
    caps.max_pass_seqs = o->max_pass_seqs;
    caps.max_logit_rows = o->max_logit_rows;
    caps.lora = o->lora; /* the adapters stay resident: the plan sees their bytes before choosing layers */
    uint64_t margin = cuda_engine_pass_bytes(m, &caps) + (1ull << 30);
    hbm_need need;
    hbm_need_for(m, o, hbm, margin, resident_layers, &need);
    uint64_t page = need.page_bytes;
    hbm_plan plan;
    if (hbm_plan_choose(&need, &plan))
        return util_errf(err, errlen,
                         "%.1f GB of GPU memory cannot hold this model's global tensors (%.1f GB), a "
                         "streaming ring of %d layers (%.1f GB) and pass buffers for %d tokens (%.1f GB); lower "
                         "--prefill-chunk or --batch, raise --gpu-mem or use a larger GPU.",
                         (double)hbm / 1e9, (double)need.globals / 1e9, need.ring_slots, (double)need.ring / 1e9,
                         o->max_pass_tokens, (double)margin / 1e9);
    bool streamed = plan.streamed;
    int lr = plan.resident;
    int32_t pages = plan.pages; /* at least 2 */
    /* Host tier: the streamed layers are cached pinned when they fit the host RAM allowed (read from
     * disk once), else read from disk every pass. */
    uint64_t streamed_bytes = 0;
    for (size_t i = 0; streamed && i < m->n_ranges; i++)
        if (m->ranges[i].layer >= lr)
            streamed_bytes += m->ranges[i].bytes;
    uint64_t host_mem = o->host_mem;
    if (!host_mem) {
        uint64_t avail = plan_mem_available();
        host_mem = avail - avail / 10;
        /* the host's shared copies already filled (another rank's, or a kept one) take no new RAM to map: a
         * second rank of a model that fills most of the host must not read it from disk every pass */
        if (!o->gpu_pin_private && !o->gpu_pin_alloc) {
            uint64_t shared = host_share_ready_bytes(o->shm_dir);
            host_mem += shared < streamed_bytes ? shared : streamed_bytes;
        }
    }
    bool from_disk = streamed && (o->from_disk || streamed_bytes > host_mem);
    cuda_engine_opts co = {0};
    co.device = dev;
    co.max_pass_tokens = o->max_pass_tokens;
    co.max_pass_seqs = o->max_pass_seqs;
    co.max_logit_rows = o->max_logit_rows;
    co.page_tokens = o->page_tokens;
    co.kv_pages = pages;
    co.kv_dtype = kvt;
    co.streamed = streamed;
    co.resident_layers = streamed ? lr : 0;
    co.ring_slots = o->stream_slots;
    co.from_disk = from_disk;
    co.disk_direct = o->direct_io;
    co.profile = o->gpu_profile;
    co.attention_fp32 = o->gpu_attention_fp32;
    co.pin_alloc = o->gpu_pin_alloc;
    co.pin_private = o->gpu_pin_private;
    co.shm_dir = o->shm_dir;
    co.lora = o->lora;
    cuda_engine *e;
    rc = cuda_engine_open(m, &co, &e, err, errlen);
    if (rc)
        return rc == CUDA_ENGINE_EDEVICE ? ENGINE_EDEVICE : -1;
    cuda_engine_stats st;
    cuda_engine_get_stats(e, &st);
    out->impl = e;
    if (co.streamed && st.from_disk)
        snprintf(out->name, sizeof out->name,
                 "GPU %.40s, HBM plan %.1f GB: %d of %d layers streamed from disk (%.1f GB pinned slots), %d "
                 "resident, KV %.1f GB %s",
                 name, (double)hbm / 1e9, st.n_streamed, m->n_layers, (double)st.disk_ring_bytes / 1e9,
                 m->n_layers - st.n_streamed, (double)pages * (double)page / 1e9, kv_dtype_name(kvt));
    else if (co.streamed)
        snprintf(out->name, sizeof out->name,
                 "GPU %.40s, HBM plan %.1f GB: %d of %d layers streamed from pinned RAM, %d resident, KV %.1f GB %s",
                 name, (double)hbm / 1e9, st.n_streamed, m->n_layers, m->n_layers - st.n_streamed,
                 (double)pages * (double)page / 1e9, kv_dtype_name(kvt));
    else
        snprintf(out->name, sizeof out->name, "GPU %.40s, HBM plan %.1f GB: weights resident, KV %.1f GB %s", name,
                 (double)hbm / 1e9, (double)pages * (double)page / 1e9, kv_dtype_name(kvt));
    out->weight_bytes = st.resident_weight_bytes;
    out->streams = co.streamed && st.n_streamed > 0;
    out->forward = g_forward;
    out->forward_pick = g_forward_pick;
    out->kv = g_kv;
    out->kv_copy = NULL;        /* n > 1 choices prefill each on the GPU */
    out->forward_hidden = NULL; /* not yet on the GPU: embedding rows fail with a sentence (run them with --cpu) */
    out->close = g_close;
    out->io_line = g_io_line;
    return 0;
}

/* Free HBM of the device the engine opens (0: none answers). */
static uint64_t gpu_free(void)
{
    char name[128], err[SPILL_ERRLEN];
    uint64_t total = 0, fr = 0;
    return cuda_device_info(gpu_device(), name, sizeof name, &total, &fr, err, sizeof err) == 0 ? fr + cuda_kept_bytes()
                                                                                                 : 0;
}

__attribute__((constructor)) static void register_gpu(void)
{
    spill_gpu_open = gpu_open;
    spill_gpu_free = gpu_free;
}
