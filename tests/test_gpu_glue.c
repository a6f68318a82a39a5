/*
 * test_gpu_glue.c — the CUDA glue's plan (src/cuda/cuda_glue.c) without a
 * GPU: the glue is compiled here against stand-ins for the few CUDA engine
 * entry points it calls (a device with a chosen amount of free memory, an
 * engine that records the options it is opened with), so CI checks what the
 * GPU machine would be asked to do: which layers stream, how many KV pages of
 * which type, pinned RAM or disk, and the refusal when nothing fits.
 */
#include <math.h>

#include "../src/cuda/cuda_glue.c"
#include "model/lora.h"
#include "test.h"

/* ---- stand-ins for the CUDA engine (src/cuda/cuda_backend.h) */
static uint64_t g_free = 150000000000ull, g_pass = 3000000000ull;
static cuda_engine_opts g_co;
static int g_opens;
static kv_cache g_kvc;

static int g_devices = 1, g_info_dev = -1;

int cuda_device_count(void)
{
    return g_devices;
}

uint64_t cuda_kept_bytes(void)
{
    return 0;
}

int cuda_device_info(int device, char *name, size_t name_cap, uint64_t *total, uint64_t *free_bytes, char *err,
                     size_t errlen)
{
    g_info_dev = device;
    snprintf(name, name_cap, "Stand-in H200");
    *total = 150000000000ull;
    *free_bytes = g_free;
    return 0;
}

static const struct lora_set *g_pass_lora; /* the adapters the plan's query saw */

uint64_t cuda_engine_pass_bytes(const model_desc *m, const cuda_engine_opts *o)
{
    g_pass_lora = o->lora;
    return g_pass;
}

int cuda_engine_open(model_desc *m, const cuda_engine_opts *o, cuda_engine **out, char *err, size_t errlen)
{
    g_co = *o;
    g_opens++;
    memset(&g_kvc, 0, sizeof g_kvc);
    g_kvc.n_pages = o->kv_pages;
    g_kvc.dtype = o->kv_dtype;
    *out = (cuda_engine *)&g_kvc;
    return 0;
}

void cuda_engine_get_stats(const cuda_engine *e, cuda_engine_stats *st)
{
    memset(st, 0, sizeof *st);
    st->n_streamed = g_co.streamed ? 80 - g_co.resident_layers : 0;
    st->from_disk = g_co.from_disk;
}

void cuda_engine_close(cuda_engine *e) {}
kv_cache *cuda_engine_kv(cuda_engine *e) { return &g_kvc; }
int cuda_engine_forward(cuda_engine *e, fwd_seq *seqs, int n, float *logits, char *err, size_t errlen) { return 0; }
int cuda_engine_forward_pick(cuda_engine *e, fwd_seq *seqs, int n, const int32_t *want, const int32_t *target,
                             cuda_pick *picks, float *logits, char *err, size_t errlen)
{
    return 0;
}

/* ---- a 70B-shaped model description (no file: the glue reads only the byte split and the shapes) */
enum { L70 = 80 };
static layer_range g_ranges[L70 + 1];
static model_tensor g_tensors[3];

static void model_70b(model_desc *m)
{
    memset(m, 0, sizeof *m);
    m->n_layers = L70;
    m->d_model = 8192;
    m->n_heads = 64;
    m->n_kv_heads = 8;
    m->head_dim = 128;
    m->vocab = 128256;
    uint64_t layer = 1711276032ull, globals = 4202692608ull; /* 855.6M and 2 × 1.05G + norms, in bf16 */
    g_ranges[0] = (layer_range){-1, 0, 0, globals, globals};
    for (int l = 0; l < L70; l++)
        g_ranges[l + 1] = (layer_range){l, 0, globals + l * layer, globals + (l + 1) * layer, layer};
    m->n_ranges = L70 + 1;
    m->ranges = g_ranges;
    m->total_bytes = globals + L70 * layer;
    /* parameters: the layers' matrices as one stand-in tensor, the head, the embedding (a gather) */
    g_tensors[0] = (model_tensor){.name = "blk.all.weight", .n_dims = 2, .ne = {8192, 104448ull * L70}};
    g_tensors[1] = (model_tensor){.name = "output.weight", .n_dims = 2, .ne = {8192, 128256}};
    g_tensors[2] = (model_tensor){.name = "token_embd.weight", .n_dims = 2, .ne = {8192, 128256}};
    m->n_tensors = 3;
    m->tensors = g_tensors;
}

static void test_glue(void)
{
    model_desc m;
    model_70b(&m);
    char err[512];
    spill_backend be;
    uint64_t page = kv_page_bytes_as(80, 8, 128, 16, KV_BF16);
    /* 4,096 short rows want 16 pages each (343 GB of bf16 KV): the layers stream from pinned RAM (a 200 GB
     * host budget), KV takes what is left */
    engine_opts o = {.max_pass_tokens = 12288, .max_pass_seqs = 4096, .page_tokens = 16, .kv_pages = 65536,
                     .stream_slots = 3, .host_mem = 200000000000ull};
    int rc = gpu_open(&m, &o, -1, &be, err, sizeof err);
    CHECK(rc == 0, "70B: %s", err);
    uint64_t fixed = g_pass + (1ull << 30) + 4202692608ull + 3 * 1711276032ull;
    CHECK(g_co.streamed && g_co.resident_layers <= 10 && !g_co.from_disk && g_co.kv_dtype == KV_BF16,
          "70B: streamed %d, %d resident, from_disk %d, kv %d", g_co.streamed, g_co.resident_layers, g_co.from_disk,
          g_co.kv_dtype);
    uint64_t used = fixed + (uint64_t)g_co.resident_layers * 1711276032ull + (uint64_t)g_co.kv_pages * page;
    CHECK(used <= g_free && used + page + 1711276032ull > g_free, "70B: %llu of %llu bytes planned",
          (unsigned long long)used, (unsigned long long)g_free);
    CHECK(strstr(be.name, "layers streamed from pinned RAM") && strstr(be.name, "GB bf16"), "70B: name \"%s\"",
          be.name);
    int bf16_pages = g_co.kv_pages;
    /* int8 KV: the same HBM holds about twice the pages */
    o.kv_dtype = KV_I8;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == 0 && g_co.kv_dtype == KV_I8 &&
              g_co.kv_pages > 19 * bf16_pages / 10 && strstr(be.name, "GB int8"),
          "70B int8: %d pages vs %d bf16, name \"%s\"", g_co.kv_pages, bf16_pages, be.name);
    o.kv_dtype = 0;
    /* a 60 GB host budget: the streamed layers cannot be cached pinned, so they come from disk */
    o.host_mem = 60000000000ull;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == 0 && g_co.streamed && g_co.from_disk &&
              strstr(be.name, "streamed from disk"),
          "70B, 60 GB host: from_disk %d, name \"%s\"", g_co.from_disk, be.name);
    o.host_mem = 200000000000ull;
    /* --resident-layers 0 as B1 runs it, and --gpu-mem caps the plan */
    o.stream = true;
    o.gpu_mem = 60000000000ull;
    CHECK(gpu_open(&m, &o, 0, &be, err, sizeof err) == 0 && g_co.streamed && g_co.resident_layers == 0 &&
              fixed + (uint64_t)g_co.kv_pages * page <= o.gpu_mem,
          "70B --resident-layers 0 --gpu-mem 60G: %d resident, %d pages", g_co.resident_layers, g_co.kv_pages);
    /* a cap that cannot hold the globals, a ring and the pass buffers: one sentence naming them, no engine */
    int opens = g_opens;
    o.gpu_mem = 10000000000ull;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == -1 && g_opens == opens && strstr(err, "pass buffers") &&
              strstr(err, "--prefill-chunk"),
          "10 GB: \"%s\"", err);
    o.gpu_mem = 0;
    o.stream = false;
    /* LoRA adapters: the plan's query of the pass bytes and the engine both get the set (the adapters' HBM is
     * counted before the layers are placed) */
    lora_set set = {0, NULL};
    o.lora = &set;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == 0 && g_pass_lora == &set && g_co.lora == &set,
          "LoRA: the plan saw %p, the engine got %p, want %p", (const void *)g_pass_lora, (const void *)g_co.lora,
          (const void *)&set);
    o.lora = NULL;
    /* a batch whose KV fits beside the whole model on a bigger device: nothing streams */
    g_free = 400000000000ull;
    o.kv_pages = 1024;
    CHECK(gpu_open(&m, &o, 5, &be, err, sizeof err) == 0 && !g_co.streamed && g_co.kv_pages == 1024 &&
              strstr(be.name, "weights resident"),
          "400 GB: streamed %d, %d pages, name \"%s\"", g_co.streamed, g_co.kv_pages, be.name);
    g_free = 150000000000ull;
    /* MPI ranks of one host (engine.h spill_gpu_index): rank 3 of a host with 2 GPUs drives GPU 1, rank 2 GPU 0;
     * one GPU takes every rank */
    g_devices = 2;
    spill_gpu_index = 3;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == 0 && g_co.device == 1 && g_info_dev == 1,
          "host rank 3, 2 GPUs: engine on %d, info of %d", g_co.device, g_info_dev);
    spill_gpu_index = 2;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == 0 && g_co.device == 0, "host rank 2, 2 GPUs: %d",
          g_co.device);
    g_devices = 1;
    spill_gpu_index = 5;
    CHECK(gpu_open(&m, &o, -1, &be, err, sizeof err) == 0 && g_co.device == 0, "host rank 5, 1 GPU: %d", g_co.device);
    spill_gpu_index = 0;
}

int main(void)
{
    test_glue();
    return test_finish("test_gpu_glue");
}
