/*
 * bench_pass.c — one CUDA pass over a synthetic Llama-shaped bf16 model held
 * in pinned host RAM (streamed, resident_layers 0 by default), against the
 * speed of light: bytes streamed / 55 GB/s (docs/performance.md) and
 * bytes / the pinned H2D rate measured here first.
 *
 * The model is generated in memory (no files): a model_desc with virtual
 * tensor offsets and a weight reader that tiles a 64 MiB block of random bf16
 * values (std ~0.02, never zeros: zeros can run faster than real data) into
 * each tensor, straight into the engine's pinned arena.
 *
 * For each batch B: B rows each decode one token after a 128-token context
 * (positions 0..127 are taken as cached; the KV arena is zero-filled at open,
 * so attention reads real pages of the right length), every row wants logits.
 * One warm-up pass, then the median of `reps` passes.  Then one prefill pass:
 * `prefill_rows` rows × ctx prompt tokens in a single pass.
 *
 * LoRA (--adapters N --rank R, N > 0): the engine holds N random adapters of
 * rank R on all seven slots of every layer (src/cuda/lora.cu), and each case
 * runs twice: every row on the bare base (a pass that skips LoRA: the base
 * figure) and the rows spread round-robin over the N adapters (row i on
 * adapter 1 + i % N); lora_ms and lora_x (lora / base) print beside it.
 *
 * Usage: bench_pass [--label 8b] [--layers 32] [--d 4096] [--heads 32]
 *   [--kv-heads 8] [--ffn 14336] [--vocab 128256] [--ctx 128]
 *   [--batches 1,8,64,256,1024] [--reps 3] [--prefill-rows 64]
 *   [--resident-layers 0] [--ring-slots 3] [--resident-too]
 *   [--copy-logits (copy them to a caller buffer; default: read in place)] [--csv out.csv]
 *   [--adapters 0] [--rank 16]
 * Prints a table; appends CSV rows (header when the file is new).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_backend.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/quant.h"
#include "base/util.h"

#define PATTERN_BYTES (64u << 20)

typedef struct cfg {
    const char *label, *csv;
    int L, D, H, KH, F, V, ctx, reps, prefill_rows, resident_layers;
    int batches[16], n_batches;
    int resident_too, ring_slots, copy_logits;
    int adapters, rank;
} cfg;

static uint8_t *g_pattern;

/* Weight reader: 1-D tensors are F32 ones-ish, matrices tile the random pattern. */
static int synth_reader(void *ctx, const model_tensor *t, void *dst, char *err, size_t errlen)
{
    (void)ctx;
    if (t->n_dims == 1) {
        float *f = dst;
        for (uint64_t i = 0; i < t->ne[0]; i++)
            f[i] = 1.0f + 0.01f * (float)(i % 7);
        return 0;
    }
    uint8_t *d = dst;
    uint64_t start = (t->offset * 2654435761u) % PATTERN_BYTES & ~(uint64_t)1, done = 0;
    while (done < t->size) {
        uint64_t n = PATTERN_BYTES - start;
        if (n > t->size - done)
            n = t->size - done;
        memcpy(d + done, g_pattern + start, n);
        done += n;
        start = 0;
    }
    return 0;
}

static model_tensor *add_tensor(model_desc *m, const char *name, int layer, uint32_t dtype, uint64_t ne0, uint64_t ne1,
                                uint64_t *off)
{
    model_tensor *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->src_name, sizeof t->src_name, "%s", name);
    t->dtype = dtype;
    t->n_dims = ne1 > 1 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = t->ne[3] = 1;
    t->layer = layer;
    t->file = 0;
    t->offset = *off;
    t->size = ne0 * ne1 * (dtype == GGML_F32 ? 4 : 2);
    *off += (t->size + 255) / 256 * 256;
    return t;
}

static model_desc *synth_model(const cfg *c)
{
    model_desc *m = calloc(1, sizeof *m);
    m->source = "synthetic";
    m->format = MODEL_GGUF;
    snprintf(m->arch, sizeof m->arch, "llama");
    m->state = ARCH_SUPPORTED;
    m->n_layers = c->L;
    m->d_model = c->D;
    m->n_heads = c->H;
    m->n_kv_heads = c->KH;
    m->head_dim = c->D / c->H;
    m->ffn_dim = c->F;
    m->vocab = c->V;
    m->ctx_len = 8192;
    m->norm_eps = 1e-5f;
    m->rope_style = ROPE_NORM;
    m->rope_dim = m->head_dim;
    m->rope_theta = 500000.0;
    m->n_files = 1;
    m->files = calloc(1, sizeof *m->files);
    m->files[0].path = "synthetic";
    m->tensors = calloc((size_t)(9 * c->L + 3), sizeof *m->tensors);
    uint64_t off = 0, HS = (uint64_t)c->H * m->head_dim, KS = (uint64_t)c->KH * m->head_dim;
    add_tensor(m, "token_embd.weight", -1, GGML_BF16, c->D, c->V, &off);
    add_tensor(m, "output_norm.weight", -1, GGML_F32, c->D, 1, &off);
    add_tensor(m, "output.weight", -1, GGML_BF16, c->D, c->V, &off);
    char nm[96];
    for (int l = 0; l < c->L; l++) {
#define T2(s, ne0, ne1) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), add_tensor(m, nm, l, GGML_BF16, ne0, ne1, &off))
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        add_tensor(m, nm, l, GGML_F32, c->D, 1, &off);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        add_tensor(m, nm, l, GGML_F32, c->D, 1, &off);
        T2("attn_q.weight", c->D, HS);
        T2("attn_k.weight", c->D, KS);
        T2("attn_v.weight", c->D, KS);
        T2("attn_output.weight", HS, c->D);
        T2("ffn_gate.weight", c->D, c->F);
        T2("ffn_up.weight", c->D, c->F);
        T2("ffn_down.weight", c->F, c->D);
#undef T2
    }
    m->total_bytes = off;
    return m;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct result {
    const char *kind;
    int rows, tokens;
    double pass_s, h2d_busy_s;
} result;

/* Runs `rows` rows of n tokens each (pos0 = ctx for decode, 0 for prefill), reps times; median pass.  Row i runs
 * on adapter 1 + i % n_adapters (0: every row on the bare base). */
static int run_case(cuda_engine *e, const cfg *c, int rows, int n, int32_t pos0, int reps, int n_adapters, result *out,
                    float *logits, int32_t *toks)
{
    char err[SPILL_ERRLEN];
    kv_cache *kv = cuda_engine_kv(e);
    kv_row *kr = calloc((size_t)rows, sizeof *kr);
    fwd_seq *seqs = calloc((size_t)rows, sizeof *seqs);
    double times[32], busy[32];
    int rc = 0;
    for (int r = 0; r < rows && rc == 0; r++) {
        if (kv_row_reserve(kv, &kr[r], pos0 + n)) {
            fprintf(stderr, "KV reserve failed for row %d\n", r);
            rc = -1;
        }
        int32_t ad = n_adapters ? 1 + r % n_adapters : 0;
        seqs[r] = (fwd_seq){&kr[r], pos0, n, toks + (size_t)r * n % 4096, true, false, 0, ad};
    }
    for (int i = 0; i <= reps && rc == 0; i++) {
        rc = cuda_engine_forward(e, seqs, rows, c->copy_logits ? logits : NULL, err, sizeof err);
        if (rc) {
            fprintf(stderr, "forward (%d rows × %d): %s\n", rows, n, err);
            break;
        }
        cuda_engine_stats st;
        cuda_engine_get_stats(e, &st);
        if (i > 0) {
            times[i - 1] = st.last_pass_s;
            busy[i - 1] = st.last_h2d_busy_s;
        }
    }
    if (rc == 0) {
        qsort(times, (size_t)reps, sizeof times[0], cmp_d);
        qsort(busy, (size_t)reps, sizeof busy[0], cmp_d);
        out->pass_s = times[reps / 2];
        out->h2d_busy_s = busy[reps / 2];
        out->rows = rows;
        out->tokens = rows * n;
    }
    for (int r = 0; r < rows; r++)
        kv_row_free(kv, &kr[r]);
    free(kr);
    free(seqs);
    return rc;
}

static void parse(cfg *c, int argc, char **argv)
{
    *c = (cfg){"8b", NULL, 32, 4096, 32, 8, 14336, 128256, 128, 3, 64, 0, {1, 8, 64, 256, 1024}, 5, 0, 3, 0, 0, 16};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--resident-too") || !strcmp(a, "--copy-logits")) {
            *(a[2] == 'r' ? &c->resident_too : &c->copy_logits) = 1;
            continue;
        }
        i++;
        if (!strcmp(a, "--label"))
            c->label = v;
        else if (!strcmp(a, "--csv"))
            c->csv = v;
        else if (!strcmp(a, "--layers"))
            c->L = atoi(v);
        else if (!strcmp(a, "--d"))
            c->D = atoi(v);
        else if (!strcmp(a, "--heads"))
            c->H = atoi(v);
        else if (!strcmp(a, "--kv-heads"))
            c->KH = atoi(v);
        else if (!strcmp(a, "--ffn"))
            c->F = atoi(v);
        else if (!strcmp(a, "--vocab"))
            c->V = atoi(v);
        else if (!strcmp(a, "--ctx"))
            c->ctx = atoi(v);
        else if (!strcmp(a, "--reps"))
            c->reps = atoi(v) < 1 ? 1 : atoi(v) > 31 ? 31 : atoi(v);
        else if (!strcmp(a, "--prefill-rows"))
            c->prefill_rows = atoi(v);
        else if (!strcmp(a, "--resident-layers"))
            c->resident_layers = atoi(v);
        else if (!strcmp(a, "--ring-slots"))
            c->ring_slots = atoi(v);
        else if (!strcmp(a, "--adapters"))
            c->adapters = atoi(v) < 0 ? 0 : atoi(v);
        else if (!strcmp(a, "--rank"))
            c->rank = atoi(v) < 1 ? 1 : atoi(v);
        else if (!strcmp(a, "--batches")) {
            c->n_batches = 0;
            for (const char *p = v; *p && c->n_batches < 16;) {
                c->batches[c->n_batches++] = atoi(p);
                p = strchr(p, ',');
                if (!p)
                    break;
                p++;
            }
        } else {
            fprintf(stderr, "unknown option %s\n", a);
            exit(2);
        }
    }
}

/* N adapters of rank r on every slot of every layer of m.  Their matrices are slices of one pool of random
 * values (the figures depend on the shapes, not the values): the set is built here, so no lora_free. */
static lora_set *bench_adapters(const model_desc *m, int N, int r, float **pool_out)
{
    int64_t D = m->d_model, HS = (int64_t)m->n_heads * m->head_dim, KS = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t F = m->ffn_dim, wide = D > HS ? D : HS;
    const int64_t in[LORA_N_SLOTS] = {D, D, D, HS, D, D, F}, out[LORA_N_SLOTS] = {HS, KS, KS, D, F, F, D};
    wide = wide > F ? wide : F;
    uint64_t pool_n = 2 * (uint64_t)r * (uint64_t)wide; /* every matrix a slice of it, at random offsets */
    pool_n = pool_n > (1u << 22) ? pool_n : (1u << 22);
    float *pool = malloc(pool_n * sizeof *pool);
    lora_set *set = calloc(1, sizeof *set);
    set->n = N;
    set->ad = calloc((size_t)N, sizeof *set->ad);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < pool_n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        pool[i] = ((float)(s >> 40) / (float)(1u << 24) - 0.5f) * 0.02f;
    }
    for (int a = 0; a < N; a++) {
        lora_adapter *ad = calloc(1, sizeof *ad);
        snprintf(ad->name, sizeof ad->name, "bench%d", a + 1);
        ad->rank = r;
        ad->scale = 1.0f;
        ad->alpha = (float)r;
        ad->targets = (1u << LORA_N_SLOTS) - 1;
        ad->n_layers = m->n_layers;
        ad->m = calloc((size_t)m->n_layers * LORA_N_SLOTS, sizeof *ad->m);
        for (int i = 0; i < m->n_layers * LORA_N_SLOTS; i++) {
            lora_mat *mt = &ad->m[i];
            int sl = i % LORA_N_SLOTS;
            mt->r = r, mt->in = in[sl], mt->out = out[sl];
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            mt->A = pool + s % (pool_n - (uint64_t)r * (uint64_t)in[sl]);
            mt->B = pool + (s >> 20) % (pool_n - (uint64_t)r * (uint64_t)out[sl]);
            ad->bytes += (uint64_t)r * (uint64_t)(in[sl] + out[sl]) * 4;
        }
        set->ad[a] = ad;
    }
    *pool_out = pool;
    return set;
}

int main(int argc, char **argv)
{
    cfg c;
    parse(&c, argc, argv);
    char err[SPILL_ERRLEN], name[256];
    uint64_t tot, fr;
    if (cuda_device_info(0, name, sizeof name, &tot, &fr, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double probe = 0;
    if (cuda_probe_h2d(0, 1u << 30, 7, &probe, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    fprintf(stderr, "device %s, %.1f GiB free; pinned H2D probe (1 GiB copies): %.1f GB/s\n", name, fr / 1073741824.0,
            probe);
    g_pattern = malloc(PATTERN_BYTES);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < PATTERN_BYTES / 2; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float v = ((float)(s >> 40) / (float)(1u << 24) - 0.5f) * 0.07f; /* uniform, std 0.02 */
        uint16_t h = quant_fp32_to_bf16(v);
        memcpy(g_pattern + 2 * i, &h, 2);
    }
    model_desc *m = synth_model(&c);
    float *lora_pool = NULL;
    lora_set *lora = c.adapters ? bench_adapters(m, c.adapters, c.rank, &lora_pool) : NULL;
    int max_b = 1;
    for (int i = 0; i < c.n_batches; i++)
        max_b = c.batches[i] > max_b ? c.batches[i] : max_b;
    int P = 16, per_row = (c.ctx + 1 + P - 1) / P;
    int max_T = max_b > c.prefill_rows * c.ctx ? max_b : c.prefill_rows * c.ctx;
    int max_rows = max_b > c.prefill_rows ? max_b : c.prefill_rows;
    float *logits = malloc((size_t)max_rows * (size_t)c.V * 4);
    int32_t *toks = malloc((4096 + (size_t)max_T) * 4);
    for (int i = 0; i < 4096 + max_T; i++)
        toks[i] = (int32_t)((i * 7919u) % (unsigned)c.V);
    FILE *csv = NULL;
    if (c.csv) {
        FILE *t = fopen(c.csv, "r");
        csv = fopen(c.csv, "a");
        if (csv && !t)
            fprintf(csv, "label,mode,layers,d,ffn,kind,rows,tokens,pass_s,streamed_gb,limit55_s,ratio55,probe_gbps,"
                         "ratio_probe,h2d_busy_gbps,h2d_pass_gbps,tok_s,peak_hbm_gib,pinned_gib,ring_slots,"
                         "logits,resident_layers,adapters,rank,lora_pass_s,lora_x\n");
        if (t)
            fclose(t);
    }
    printf("%-4s %-9s %-7s %6s %7s %9s %9s %7s %9s %9s %10s %8s %9s %7s\n", "lab", "mode", "kind", "rows", "tokens",
           "pass_ms", "limit_ms", "ratio", "busyGB/s", "passGB/s", "tok/s", "HBM_GiB", "lora_ms", "lora_x");
    for (int mode = 0; mode < 1 + c.resident_too; mode++) {
        cuda_engine_opts o = {.max_pass_tokens = max_T,
                              .max_pass_seqs = max_rows,
                              .page_tokens = P,
                              .kv_pages = max_rows * per_row,
                              .streamed = mode == 0,
                              .resident_layers = c.resident_layers,
                              .ring_slots = c.ring_slots,
                              .reader = synth_reader,
                              .lora = lora};
        cuda_engine *e;
        double t0 = now();
        int rc = cuda_engine_open(m, &o, &e, err, sizeof err);
        if (rc) {
            fprintf(stderr, "open (%s): %s\n", mode ? "resident" : "streamed", err);
            return rc == CUDA_ENGINE_EDEVICE ? 75 : 1;
        }
        cuda_engine_stats st;
        cuda_engine_get_stats(e, &st);
        fprintf(stderr,
                "%s engine open in %.1f s: %.2f GiB pinned, %.2f GiB in HBM (%.2f GiB of it %d LoRA adapters of rank "
                "%d), %d layers streamed, %d slots\n",
                mode ? "resident" : "streamed", now() - t0, st.pinned_bytes / 1073741824.0,
                st.device_bytes / 1073741824.0, st.lora_bytes / 1073741824.0, st.lora_adapters, c.rank, st.n_streamed,
                st.ring_slots);
        for (int bi = 0; bi <= c.n_batches; bi++) {
            result r = {0}, rl = {0};
            bool prefill = bi == c.n_batches;
            if (prefill && c.prefill_rows <= 0)
                break;
            r.kind = prefill ? "prefill" : "decode";
            int rows = prefill ? c.prefill_rows : c.batches[bi], n = prefill ? c.ctx : 1;
            int32_t pos0 = prefill ? 0 : c.ctx;
            rc = run_case(e, &c, rows, n, pos0, c.reps, 0, &r, logits, toks);
            if (rc == 0 && c.adapters)
                rc = run_case(e, &c, rows, n, pos0, c.reps, c.adapters, &rl, logits, toks);
            if (rc)
                break;
            char lora_ms[16] = "-", lora_x[16] = "-";
            if (c.adapters) {
                snprintf(lora_ms, sizeof lora_ms, "%.1f", rl.pass_s * 1e3);
                snprintf(lora_x, sizeof lora_x, "%.3f", rl.pass_s / r.pass_s);
            }
            cuda_engine_get_stats(e, &st);
            double gb = st.streamed_bytes_per_pass / 1e9, lim = gb / 55.0, limp = gb / probe;
            double busy_gbps = r.h2d_busy_s > 0 ? gb / r.h2d_busy_s : 0, pass_gbps = gb / r.pass_s;
            double tok_s = r.tokens / r.pass_s, hbm = st.peak_device_used / 1073741824.0;
            printf("%-4s %-9s %-7s %6d %7d %9.1f %9.1f %7.3f %9.1f %9.1f %10.0f %8.1f %9s %7s\n", c.label,
                   mode ? "resident" : "streamed", r.kind, r.rows, r.tokens, r.pass_s * 1e3, lim * 1e3,
                   lim > 0 ? r.pass_s / lim : 0, busy_gbps, pass_gbps, tok_s, hbm, lora_ms, lora_x);
            fflush(stdout);
            if (csv)
                fprintf(csv,
                        "%s,%s,%d,%d,%d,%s,%d,%d,%.6f,%.3f,%.6f,%.4f,%.2f,%.4f,%.2f,%.2f,%.1f,%.2f,%.2f,%d,%s,%d,%d,%d,"
                        "%.6f,%.4f\n",
                        c.label, mode ? "resident" : "streamed", c.L, c.D, c.F, r.kind, r.rows, r.tokens, r.pass_s, gb,
                        lim, lim > 0 ? r.pass_s / lim : 0, probe, limp > 0 ? r.pass_s / limp : 0, busy_gbps, pass_gbps,
                        tok_s, hbm, st.pinned_bytes / 1073741824.0, st.ring_slots,
                        c.copy_logits ? "copied" : "in_place", mode ? c.L : c.resident_layers, c.adapters, c.rank,
                        c.adapters ? rl.pass_s : 0.0, c.adapters ? rl.pass_s / r.pass_s : 0.0);
        }
        cuda_engine_close(e);
        if (rc)
            return rc == CUDA_ENGINE_EDEVICE ? 75 : 1;
    }
    if (csv)
        fclose(csv);
    free(logits);
    free(toks);
    free(g_pattern);
    for (int a = 0; lora && a < lora->n; a++) {
        free(lora->ad[a]->m);
        free(lora->ad[a]);
    }
    if (lora)
        free(lora->ad);
    free(lora);
    free(lora_pool);
    free(m->tensors);
    free(m->files);
    free(m);
    return 0;
}
