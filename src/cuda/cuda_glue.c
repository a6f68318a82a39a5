/*
 * cuda_glue.c — registers the GPU engine as the job runner's backend
 * (spill_gpu_open in engine.h).  Linked only into build/cuda/spill-cuda; the
 * CPU-only `spill` never sees it.
 *
 * The tier plan lives here: everything resident in HBM when weights + KV +
 * a margin fit the free device memory; otherwise layers stream from pinned
 * host RAM over PCIe each pass with `resident_layers` kept in HBM (0 when not
 * given: KV capacity is worth more than resident weights once a pass has to
 * stream anyway — the ZeRO-Inference finding).
 */
#include <stdio.h>
#include <string.h>

#include "../engine.h"
#include "cuda_backend.h"

static int g_forward(void *impl, fwd_seq *seqs, int n, float *logits, char *err, size_t errlen)
{
    int rc = cuda_engine_forward(impl, seqs, n, logits, err, errlen);
    return rc == CUDA_ENGINE_EDEVICE ? -75 : rc;
}
static kv_cache *g_kv(void *impl) { return cuda_engine_kv(impl); }
static void g_close(void *impl) { cuda_engine_close(impl); }

static int gpu_open(model_desc *m, const engine_opts *o, int resident_layers, spill_backend *out, char *err,
                    size_t errlen)
{
    char name[64];
    uint64_t total = 0, freeb = 0;
    memset(out, 0, sizeof *out);
    int rc = cuda_device_info(0, name, sizeof name, &total, &freeb, err, errlen);
    if (rc)
        return rc == CUDA_ENGINE_EDEVICE ? -75 : -1;
    uint64_t page = kv_page_bytes(m->n_layers, m->n_kv_heads, m->head_dim, o->page_tokens);
    uint64_t margin = 4ull << 30; /* activations, dequant scratch, cuBLAS workspace */
    /* The KV pages the host plan asked for (what the batch can use): weights stay resident when they fit
     * beside them, else layers stream (the ring: a few layers, bounded here by four average layers) and
     * the pages are clamped to the HBM left. */
    int32_t pages = o->kv_pages > 0 ? o->kv_pages : 256;
    uint64_t kv = page * (uint64_t)pages;
    bool fits = m->total_bytes + kv + margin < freeb;
    uint64_t weights_hbm = fits && !o->stream ? m->total_bytes : (m->total_bytes / (m->n_layers ? m->n_layers : 1)) * 4;
    if (weights_hbm + margin < freeb && page * (uint64_t)pages > freeb - weights_hbm - margin)
        pages = (int32_t)((freeb - weights_hbm - margin) / page);
    if (pages < 2)
        pages = 2;
    cuda_engine_opts co = {0};
    co.device = 0;
    co.max_pass_tokens = o->max_pass_tokens;
    co.max_pass_seqs = o->max_pass_seqs;
    co.page_tokens = o->page_tokens;
    co.kv_pages = pages;
    co.streamed = o->stream || !fits;
    co.resident_layers = resident_layers > 0 ? resident_layers : 0;
    co.ring_slots = o->stream_slots;
    cuda_engine *e;
    rc = cuda_engine_open(m, &co, &e, err, errlen);
    if (rc)
        return rc == CUDA_ENGINE_EDEVICE ? -75 : -1;
    cuda_engine_stats st;
    cuda_engine_get_stats(e, &st);
    out->impl = e;
    if (co.streamed)
        snprintf(out->name, sizeof out->name, "GPU %.40s, %d of %d layers streamed from pinned RAM", name, st.n_streamed,
                 m->n_layers);
    else
        snprintf(out->name, sizeof out->name, "GPU %.40s, resident", name);
    out->weight_bytes = st.resident_weight_bytes;
    out->forward = g_forward;
    out->kv = g_kv;
    out->kv_copy = NULL; /* n > 1 choices prefill each on the GPU */
    out->close = g_close;
    return 0;
}

__attribute__((constructor)) static void register_gpu(void) { spill_gpu_open = gpu_open; }
