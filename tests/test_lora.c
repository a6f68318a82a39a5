/*
 * test_lora.c — LoRA adapters: the loader (model/lora.c) and the CPU engine applying them unmerged, per row.
 *
 * 1. Merged vs unmerged (tools/make_lora_fixtures.py): for tiny models of tests/data/ref/ and random adapters
 *    (B non-zero) in PEFT and mlx-lm layouts — every projection, q and v only with rsLoRA and per-module
 *    rank/alpha patterns, Phi-3's fused qkv_proj / gate_up_proj, attention-only on an MoE base; F32, F16 and
 *    BF16 factors — the CPU engine on base + adapter must give the logits of the CPU engine on the merged
 *    model (W + scale·B·A, computed by numpy in float64 and stored fp32) at every position of three rows
 *    (prompts of 5, 13 and 23 tokens plus 32 decoded ones, prefilled in chunks of 1, 4 and whole).
 *    Tolerance, fixed before the first run: max |Δlogit| ≤ 1e-4.  Both sides are fp32 and differ only in
 *    association: x·(W + sBA)ᵀ with the merged weight rounded to fp32 (6e-8 relative per weight) against
 *    x·Wᵀ + s·(x·Aᵀ)·Bᵀ; per dot product that is ~1e-7 × sqrt(K) relative for K ≤ 256, compounding over two
 *    layers to ~1e-5 on logits of size O(1).  1e-4 leaves a 10x margin, while a wrong slot, a missing scale,
 *    a transposed factor or a delta landing after RoPE / the bias / the activation moves logits by 1e-2 or
 *    more (each adapter moves the base's logits by more than 0.05, checked).  The same passes on an engine
 *    streaming its layers from disk must give the resident engine's bits (the adapter is resident either way).
 * 2. Mixed rows: one pass mixing rows on the bare base (0) and two adapters (1, 2) must give each row the
 *    logits of passes holding that row alone, bit for bit — not merely within 1e-6 — and on an engine with
 *    another thread count: a token's delta is two fixed-order dot-product runs over its own activations and
 *    its row's factors (engine/lora_cpu.c), the base matmul's order is fixed per output element (cpu.h), and
 *    attention reads the row's own pages, so nothing in a row's arithmetic depends on its neighbours.
 * 3. Against peft (tools/gen_lora_refs.py, run on a machine with torch + peft): when
 *    tests/data/lora/peft_ref/<variant>/ref.bin is present, base + that adapter against the reference logits
 *    of transformers + peft in fp32, max |Δlogit| ≤ 1e-4 (the argument of test_forward.c: fp32 both sides,
 *    different summation orders, ~1e-5 expected).  Skipped with a note when absent.
 * 4. Malformed adapters (tools/make_bad_adapters.py, tests/data/bad_adapters/expected.tsv): each is refused
 *    with one sentence that names the case's key thing, nothing allocated left behind (ASan).
 * 5. Names (lora_resolve, lora_split_spec, lora_list under a temporary SPILL_HOME), the hash, adapter indices
 *    out of range, the memory estimate.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "engine/engine.h"
#include "model/arch.h"
#include "model/lora.h"
#include "model/model.h"
#include "ref.h"
#include "test.h"

#define MAXROWS REF_MAXROWS /* ref_load fills up to that many */
#define TOL 1e-4

/* SPLREF01 (tools/gen_ref_models.py, tests/ref.h): 0 when read, -1 when the file is absent or malformed. */
static int load_ref(const char *path, ref_row *rows, uint32_t *n_rows, uint32_t *vocab)
{
    return util_is_file(path) ? ref_load(path, rows, n_rows, vocab) : -1;
}

static void free_ref(ref_row *rows, uint32_t n)
{
    ref_free(rows, n);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++)
        w = fabs((double)a[i] - b[i]) > w ? fabs((double)a[i] - b[i]) : w;
    return w;
}

static const engine_opts OPTS = {.threads = 2, .max_pass_tokens = 64, .max_pass_seqs = 8, .page_tokens = 16,
                                 .kv_pages = 64};

/*
 * Feeds every token of rows[0..n) through engine e, the rows sharing passes: row k's prompt in chunks of
 * chunk[k] tokens (0 = whole), then one token per pass; every pass asks for all logits.  Row k runs on adapter
 * adapter[k].  out[k] receives (n_total, V) logits: position i's row is the distribution of token i + 1.
 */
static int drive(spill_engine *e, const ref_row *rows, int n, const int *chunk, const int32_t *adapter, int V,
                 float **out, const char *label)
{
    char err[SPILL_ERRLEN];
    kv_cache *kv = engine_kv(e);
    kv_row kr[MAXROWS] = {{0}};
    int32_t done[MAXROWS] = {0};
    float *logits = malloc((size_t)64 * V * sizeof(float));
    int rc = 0;
    for (int pass = 0; pass < 400 && !rc; pass++) {
        fwd_seq seqs[MAXROWS];
        int ns = 0, idx[MAXROWS];
        for (int k = 0; k < n; k++) {
            int32_t left = (int32_t)rows[k].n_total - done[k];
            if (left <= 0)
                continue;
            int32_t m = 1;
            if (done[k] < (int32_t)rows[k].n_prompt) {
                int32_t rest = (int32_t)rows[k].n_prompt - done[k];
                m = chunk[k] == 0 || chunk[k] > rest ? rest : chunk[k];
            }
            if (kv_row_reserve(kv, &kr[k], done[k] + m)) {
                CHECK(0, "%s: KV reserve", label);
                rc = -1;
                break;
            }
            seqs[ns] = (fwd_seq){&kr[k], done[k], m, rows[k].ids + done[k], true, true, 0, adapter[k]};
            idx[ns++] = k;
        }
        if (rc || !ns)
            break;
        rc = engine_forward(e, seqs, ns, logits, err, sizeof err);
        CHECK(rc == 0, "%s: forward: %s", label, err);
        int row = 0;
        for (int s = 0; s < ns && !rc; s++) {
            int k = idx[s];
            memcpy(out[k] + (size_t)done[k] * V, logits + (size_t)row * V, (size_t)seqs[s].n * V * sizeof(float));
            row += seqs[s].n;
            done[k] += seqs[s].n;
        }
    }
    for (int k = 0; k < n; k++)
        kv_row_free(kv, &kr[k]);
    CHECK(kv->n_free == kv->n_pages, "%s: pages leaked", label);
    free(logits);
    return rc;
}

static float **alloc_out(const ref_row *rows, int n, int V)
{
    float **o = calloc((size_t)n, sizeof *o);
    for (int k = 0; k < n; k++)
        o[k] = calloc((size_t)rows[k].n_total * V, sizeof(float));
    return o;
}

static void free_out(float **o, int n)
{
    for (int k = 0; k < n; k++)
        free(o[k]);
    free(o);
}

typedef struct base_model {
    model_desc *m;
    arch_layout a;
} base_model;

static int open_base(const char *dir, base_model *b)
{
    char err[SPILL_ERRLEN];
    if (model_open(dir, &b->m, err, sizeof err)) {
        CHECK(0, "%s: model_open: %s", dir, err);
        return -1;
    }
    if (model_arch_resolve(b->m, ARCH_ENGINE_CPU, &b->a, err, sizeof err)) {
        CHECK(0, "%s: resolve: %s", dir, err);
        model_close(b->m);
        return -1;
    }
    return 0;
}

static lora_adapter *load_adapter(const base_model *b, const char *dir)
{
    char err[SPILL_ERRLEN];
    lora_adapter *ad = NULL;
    int rc = lora_load(b->m, &b->a, dir, &ad, err, sizeof err);
    CHECK(rc == 0 && ad, "%s: lora_load: %s", dir, err);
    return rc ? NULL : ad;
}

/* ---------------------------------------------------------------- 1. merged vs unmerged */

typedef struct variant {
    const char *name, *base, *layout;
    uint32_t targets; /* lora slots adapted */
    int rank;
    double scale;
} variant;

#define QKVO ((1u << LORA_Q) | (1u << LORA_K) | (1u << LORA_V) | (1u << LORA_O))
#define ALL7 (QKVO | (1u << LORA_GATE) | (1u << LORA_UP) | (1u << LORA_DOWN))

/* tools/make_lora_fixtures.py's VARIANTS */
static const variant VARIANTS[] = {
    {"llama_all7", "llama_gqa_s64", "peft", ALL7, 4, 8.0 / 4},
    {"llama_qv_rs", "llama_gqa_s64", "peft", (1u << LORA_Q) | (1u << LORA_V), 8, 4 / 2.8284271247461903},
    {"qwen2_mlx", "qwen2_bias", "mlx", ALL7, 4, 2.0},
    {"phi3_fused", "phi3_plain_tied", "peft", ALL7, 4, 8.0 / 4},
    {"qwen3moe_attn", "qwen3_moe_top8", "peft", QKVO, 4, 4 / 2.0},
};

static const int CHUNKS[MAXROWS] = {1, 4, 0};

static void check_merged(const variant *v)
{
    char dir[512], path[600];
    snprintf(path, sizeof path, "tests/data/ref/%s/ref.bin", v->base);
    ref_row rows[MAXROWS];
    uint32_t n_rows, V;
    if (load_ref(path, rows, &n_rows, &V)) {
        CHECK(0, "%s: cannot load %s", v->name, path);
        return;
    }
    base_model b, mg;
    snprintf(dir, sizeof dir, "tests/data/ref/%s", v->base);
    if (open_base(dir, &b))
        goto out_ref;
    snprintf(dir, sizeof dir, "tests/data/lora/merged/%s", v->name);
    if (open_base(dir, &mg))
        goto out_base;
    snprintf(dir, sizeof dir, "tests/data/lora/adapters/%s", v->name);
    lora_adapter *ad = load_adapter(&b, dir);
    if (!ad)
        goto out_merged;
    CHECK(!strcmp(ad->layout, v->layout) && !strcmp(ad->name, v->name), "%s: layout %s name %s", v->name, ad->layout,
          ad->name);
    CHECK(ad->targets == v->targets && ad->rank == v->rank && fabs(ad->scale - v->scale) < 1e-6,
          "%s: targets %x rank %d scale %g", v->name, ad->targets, ad->rank, ad->scale);
    CHECK(strlen(ad->hash) == 64 && ad->bytes > 0 && ad->n_layers == b.m->n_layers, "%s: hash, bytes, layers",
          v->name);

    lora_set set = {1, &ad};
    engine_opts o = OPTS, os = OPTS;
    o.lora = &set;
    os.lora = &set;
    os.stream = true;
    os.stream_slots = 2;
    os.threads = 3;
    spill_engine *eb = NULL, *es = NULL, *em = NULL;
    char err[SPILL_ERRLEN];
    int rc = engine_open(b.m, &o, &eb, err, sizeof err) || engine_open(b.m, &os, &es, err, sizeof err) ||
             engine_open(mg.m, &OPTS, &em, err, sizeof err);
    CHECK(rc == 0, "%s: engine_open: %s", v->name, err);
    if (!rc) {
        int n = (int)n_rows;
        int32_t on[MAXROWS] = {1, 1, 1}, off[MAXROWS] = {0, 0, 0};
        float **lb = alloc_out(rows, n, (int)V), **ls = alloc_out(rows, n, (int)V), **lm = alloc_out(rows, n, (int)V);
        rc = drive(eb, rows, n, CHUNKS, on, (int)V, lb, v->name) || drive(es, rows, n, CHUNKS, on, (int)V, ls, v->name) ||
             drive(em, rows, n, CHUNKS, off, (int)V, lm, v->name);
        double worst = 0, moved = 0;
        int positions = 0, stream_diff = 0;
        for (int k = 0; k < n && !rc; k++) {
            size_t cnt = (size_t)rows[k].n_total * V;
            double d = max_abs_diff(lb[k], lm[k], cnt), mv = max_abs_diff(lm[k], rows[k].logits, cnt);
            worst = d > worst ? d : worst;
            moved = mv > moved ? mv : moved;
            stream_diff += memcmp(lb[k], ls[k], cnt * sizeof(float)) != 0;
            positions += (int)rows[k].n_total;
        }
        CHECK(!rc && worst <= TOL, "%s: max |dlogit| unmerged vs merged %.3g over %d positions", v->name, worst,
              positions);
        CHECK(!rc && moved > 0.05, "%s: the adapter moves the base's logits by only %.3g", v->name, moved);
        CHECK(!rc && stream_diff == 0, "%s: streamed logits differ from resident in %d rows", v->name, stream_diff);
        fprintf(stderr, "%-16s %-4s on %-16s %3d positions, max |dlogit| unmerged vs merged %.2e (adapter moves "
                "logits by %.2f), streamed identical: %s\n",
                v->name, ad->layout, v->base, positions, worst, moved, stream_diff ? "NO" : "yes");
        free_out(lb, n);
        free_out(ls, n);
        free_out(lm, n);
    }
    engine_close(eb);
    engine_close(es);
    engine_close(em);
    lora_free(ad);
out_merged:
    model_close(mg.m);
out_base:
    model_close(b.m);
out_ref:
    free_ref(rows, n_rows);
}

/* ---------------------------------------------------------------- 2. mixed rows */

static void check_mixed(void)
{
    ref_row rows[MAXROWS];
    uint32_t n_rows, V;
    base_model b;
    if (load_ref("tests/data/ref/llama_gqa_s64/ref.bin", rows, &n_rows, &V)) {
        CHECK(0, "mixed: cannot load the reference");
        return;
    }
    if (open_base("tests/data/ref/llama_gqa_s64", &b)) {
        free_ref(rows, n_rows);
        return;
    }
    lora_adapter *ad[2] = {load_adapter(&b, "tests/data/lora/adapters/llama_all7"),
                           load_adapter(&b, "tests/data/lora/adapters/llama_qv_rs")};
    lora_set set = {2, ad};
    engine_opts o = OPTS, o1 = OPTS;
    o.lora = o1.lora = &set;
    o.threads = 3;
    o1.threads = 1;
    spill_engine *e = NULL, *e1 = NULL;
    char err[SPILL_ERRLEN];
    int rc = !ad[0] || !ad[1] || engine_open(b.m, &o, &e, err, sizeof err) || engine_open(b.m, &o1, &e1, err, sizeof err);
    CHECK(rc == 0, "mixed: open: %s", err);
    if (!rc) {
        int n = (int)n_rows;
        /* every row on every adapter, mixed with the others on the two other indices */
        int diff = 0, cmp = 0;
        for (int shift = 0; shift < 3; shift++) {
            int32_t adapter[MAXROWS];
            for (int k = 0; k < n; k++)
                adapter[k] = (k + shift) % 3;
            float **mixed = alloc_out(rows, n, (int)V);
            rc = rc || drive(e, rows, n, CHUNKS, adapter, (int)V, mixed, "mixed");
            for (int k = 0; k < n && !rc; k++) {
                float **alone = alloc_out(&rows[k], 1, (int)V);
                rc = drive(e1, &rows[k], 1, &CHUNKS[k], &adapter[k], (int)V, alone, "alone");
                diff += !rc && memcmp(alone[0], mixed[k], (size_t)rows[k].n_total * V * sizeof(float)) != 0;
                cmp++;
                free_out(alone, 1);
            }
            free_out(mixed, n);
        }
        CHECK(!rc && diff == 0, "mixed: %d of %d rows differ from the same row alone", diff, cmp);
        fprintf(stderr, "mixed adapters 0/1/2 in one pass: %d rows bit-identical to the row alone on 1 thread: %s\n",
                cmp, !rc && diff == 0 ? "yes" : "NO");

        /* an index outside the set is one sentence, and so is any index on an engine without adapters */
        kv_row kr = {0};
        float *lg = malloc((size_t)V * sizeof(float));
        CHECK(kv_row_reserve(engine_kv(e), &kr, 1) == 0, "mixed: reserve");
        fwd_seq bad = {&kr, 0, 1, rows[0].ids, true, false, 0, 3};
        CHECK(engine_forward(e, &bad, 1, lg, err, sizeof err) != 0 && strstr(err, "adapter 3"), "index 3: %s", err);
        bad.adapter = -1;
        CHECK(engine_forward(e, &bad, 1, lg, err, sizeof err) != 0 && strstr(err, "adapter -1"), "index -1: %s", err);
        kv_row_free(engine_kv(e), &kr);
        spill_engine *plain;
        if (engine_open(b.m, &OPTS, &plain, err, sizeof err) == 0) {
            CHECK(kv_row_reserve(engine_kv(plain), &kr, 1) == 0, "plain: reserve");
            bad.kv = &kr;
            bad.adapter = 1;
            CHECK(engine_forward(plain, &bad, 1, lg, err, sizeof err) != 0 && strstr(err, "holds 0"),
                  "no adapters: %s", err);
            kv_row_free(engine_kv(plain), &kr);
            engine_close(plain);
        }
        free(lg);

        /* the estimate counts the adapters' factors as resident weights */
        uint64_t w0, r0, p0, w1, r1, p1;
        engine_mem_estimate(b.m, &OPTS, 2, &w0, &r0, &p0);
        o.threads = 2;
        engine_mem_estimate(b.m, &o, 2, &w1, &r1, &p1);
        CHECK(w1 == w0 + ad[0]->bytes + ad[1]->bytes && p1 > p0 && r1 == r0, "estimate: %llu -> %llu",
              (unsigned long long)w0, (unsigned long long)w1);
    }
    engine_close(e);
    engine_close(e1);
    lora_free(ad[0]);
    lora_free(ad[1]);
    model_close(b.m);
    free_ref(rows, n_rows);
}

/* ---------------------------------------------------------------- 3. against peft */

/* tools/gen_lora_refs.py's adapters: directory under tests/data/lora/peft_ref/ and its base */
static const char *const PEFT_REFS[][2] = {
    {"llama_gqa_s64_all7", "llama_gqa_s64"},     {"llama_gqa_s64_qv_rs", "llama_gqa_s64"},
    {"llama_gqa_s64_all7_mlx", "llama_gqa_s64"}, {"qwen2_bias_all7_rs", "qwen2_bias"},
    {"phi3_plain_tied_fused", "phi3_plain_tied"}, {"qwen3_moe_top8_attn", "qwen3_moe_top8"},
};

static void check_peft_refs(void)
{
    for (size_t i = 0; i < sizeof PEFT_REFS / sizeof PEFT_REFS[0]; i++) {
        char dir[512], path[600], base_dir[512];
        snprintf(dir, sizeof dir, "tests/data/lora/peft_ref/%s", PEFT_REFS[i][0]);
        snprintf(path, sizeof path, "%s/ref.bin", dir);
        snprintf(base_dir, sizeof base_dir, "tests/data/ref/%s", PEFT_REFS[i][1]);
        ref_row rows[MAXROWS];
        uint32_t n_rows, V;
        if (!util_is_file(path)) {
            fprintf(stderr, "%-24s skipped: %s is absent (tools/gen_lora_refs.py writes it on a machine with "
                    "torch and peft)\n", PEFT_REFS[i][0], path);
            continue;
        }
        if (load_ref(path, rows, &n_rows, &V)) {
            CHECK(0, "%s: malformed", path);
            continue;
        }
        base_model b;
        if (open_base(base_dir, &b)) {
            free_ref(rows, n_rows);
            continue;
        }
        lora_adapter *ad = load_adapter(&b, dir);
        lora_set set = {1, &ad};
        engine_opts o = OPTS;
        o.lora = &set;
        spill_engine *e = NULL;
        char err[SPILL_ERRLEN];
        int rc = !ad || engine_open(b.m, &o, &e, err, sizeof err);
        CHECK(rc == 0, "%s: open: %s", dir, err);
        if (!rc) {
            int n = (int)n_rows;
            int32_t on[MAXROWS] = {1, 1, 1};
            float **got = alloc_out(rows, n, (int)V);
            rc = drive(e, rows, n, CHUNKS, on, (int)V, got, dir);
            double worst = 0;
            int positions = 0;
            for (int k = 0; k < n && !rc; k++) {
                double d = max_abs_diff(got[k], rows[k].logits, (size_t)rows[k].n_total * V);
                worst = d > worst ? d : worst;
                positions += (int)rows[k].n_total;
            }
            CHECK(!rc && worst <= TOL, "%s: max |dlogit| against peft %.3g", dir, worst);
            fprintf(stderr, "%-24s %-4s %3d positions, max |dlogit| against transformers + peft %.2e\n",
                    PEFT_REFS[i][0], ad->layout, positions, worst);
            free_out(got, n);
        }
        engine_close(e);
        lora_free(ad);
        model_close(b.m);
        free_ref(rows, n_rows);
    }
}

/* ---------------------------------------------------------------- 4. malformed adapters */

static void check_bad(void)
{
    char *tsv, err[SPILL_ERRLEN];
    size_t len;
    if (util_read_file("tests/data/bad_adapters/expected.tsv", 1u << 20, &tsv, &len, err, sizeof err)) {
        CHECK(0, "bad adapters: %s", err);
        return;
    }
    int cases = 0;
    for (char *line = strtok(tsv, "\n"); line; line = strtok(NULL, "\n")) {
        char *name = line, *base = strchr(name, '\t'), *want = base ? strchr(base + 1, '\t') : NULL;
        if (!want)
            continue;
        *base++ = 0;
        *want++ = 0;
        char dir[512], bdir[512];
        snprintf(dir, sizeof dir, "tests/data/bad_adapters/%s", name);
        snprintf(bdir, sizeof bdir, "tests/data/ref/%s", base);
        base_model b;
        if (open_base(bdir, &b))
            continue;
        lora_adapter *ad = (lora_adapter *)1;
        err[0] = 0;
        int rc = lora_load(b.m, &b.a, dir, &ad, err, sizeof err);
        size_t n = strlen(err);
        CHECK(rc == -1 && ad == NULL, "%s: accepted", name);
        CHECK(strstr(err, want) != NULL, "%s: the sentence does not name \"%s\": %s", name, want, err);
        CHECK(n > 0 && err[n - 1] == '.' && !strchr(err, '\n'), "%s: not one sentence: %s", name, err);
        fprintf(stderr, "  %-24s %s\n", name, err);
        if (rc == 0)
            lora_free(ad);
        model_close(b.m);
        cases++;
    }
    CHECK(cases >= 12, "bad adapters: only %d cases", cases);
    free(tsv);
}

/* ---------------------------------------------------------------- 5. names, list, hash */

static void check_names(void)
{
    char home[] = "/tmp/spill_lora_XXXXXX", path[600], src[1100], dir[4096], base[512], adn[512], err[SPILL_ERRLEN];
    char *cwd = getcwd(NULL, 0);
    if (!cwd || !mkdtemp(home)) {
        CHECK(0, "names: temporary home");
        free(cwd);
        return;
    }
    const char *old = getenv("SPILL_HOME");
    char *saved = old ? strdup(old) : NULL;
    setenv("SPILL_HOME", home, 1);
    snprintf(path, sizeof path, "%s/adapters", home);
    CHECK(mkdir(path, 0755) == 0, "names: mkdir");
    const char *names[] = {"llama_all7", "qwen2_mlx"};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/tests/data/lora/adapters/%s", cwd, names[i]);
        snprintf(path, sizeof path, "%s/adapters/%s", home, names[i]);
        CHECK(symlink(src, path) == 0, "names: symlink");
    }
    snprintf(path, sizeof path, "%s/adapters/broken", home);
    CHECK(mkdir(path, 0755) == 0, "names: mkdir broken");

    CHECK(lora_resolve("llama_all7", dir, sizeof dir, err, sizeof err) == 0 && strstr(dir, home), "resolve: %s", err);
    CHECK(lora_resolve("tests/data/lora/adapters/qwen2_mlx", dir, sizeof dir, err, sizeof err) == 0 &&
              !strcmp(dir, "tests/data/lora/adapters/qwen2_mlx"), "resolve path: %s", err);
    CHECK(lora_resolve("nope", dir, sizeof dir, err, sizeof err) == -1 && strstr(err, "nope"), "resolve: %s", err);
    CHECK(lora_resolve("./nope", dir, sizeof dir, err, sizeof err) == -1 && strstr(err, "./nope"), "resolve: %s", err);

    CHECK(lora_split_spec("tests/data/ref/llama_gqa_s64+llama_all7", base, sizeof base, adn, sizeof adn, err,
                          sizeof err) == 1 && !strcmp(base, "tests/data/ref/llama_gqa_s64") && !strcmp(adn, "llama_all7"),
          "split: %s | %s | %s", base, adn, err);
    CHECK(lora_split_spec("tests/data/ref/llama_gqa_s64", base, sizeof base, adn, sizeof adn, err, sizeof err) == 0 &&
              !strcmp(base, "tests/data/ref/llama_gqa_s64") && !adn[0], "split bare: %s", err);
    CHECK(lora_split_spec("x+y+llama_all7", base, sizeof base, adn, sizeof adn, err, sizeof err) == 1 &&
              !strcmp(base, "x+y") && !strcmp(adn, "llama_all7"), "split at the last resolvable '+'");
    CHECK(lora_split_spec("tests/data/ref/llama_gqa_s64+nope", base, sizeof base, adn, sizeof adn, err, sizeof err) ==
              -1 && strstr(err, "nope"), "split unknown: %s", err);

    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    CHECK(lora_list(f, err, sizeof err) == 0, "list: %s", err);
    fclose(f);
    CHECK(buf && strstr(buf, "llama_all7") && strstr(buf, "qwen2_mlx") && strstr(buf, "broken") &&
              strstr(buf, "unreadable") && strstr(buf, "q,k,v,o,gate,up,down") && strstr(buf, " mlx "),
          "list:\n%s", buf ? buf : "");
    fprintf(stderr, "spill adapters:\n%s", buf ? buf : "");

    /* the hash: sha256 over the config's bytes then the weights' */
    char *c, *w, *both, want[65];
    size_t cl, wl;
    base_model b;
    if (open_base("tests/data/ref/llama_gqa_s64", &b) == 0) {
        lora_adapter *ad = load_adapter(&b, "tests/data/lora/adapters/llama_all7");
        if (ad && util_read_file("tests/data/lora/adapters/llama_all7/adapter_config.json", 1u << 20, &c, &cl, err,
                                 sizeof err) == 0) {
            if (util_read_file("tests/data/lora/adapters/llama_all7/adapter_model.safetensors", 64u << 20, &w, &wl,
                               err, sizeof err) == 0) {
                both = malloc(cl + wl);
                memcpy(both, c, cl);
                memcpy(both + cl, w, wl);
                util_sha256_hex(both, cl + wl, want);
                CHECK(!strcmp(want, ad->hash) && strstr(buf, want), "hash %s vs %s", ad->hash, want);
                free(both);
                free(w);
            }
            free(c);
        }
        lora_free(ad);
        model_close(b.m);
    }
    free(buf);

    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/adapters/%s", home, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/adapters/broken", home);
    rmdir(path);
    snprintf(path, sizeof path, "%s/adapters", home);
    rmdir(path);
    rmdir(home);
    if (saved)
        setenv("SPILL_HOME", saved, 1);
    else
        unsetenv("SPILL_HOME");
    free(saved);
    free(cwd);
}

/* What the loader makes of the layouts: mlx-lm's last-layer-only adapter, Phi-3's fused split, patterns. */
static void check_shapes(void)
{
    base_model b;
    if (open_base("tests/data/ref/qwen2_bias", &b) == 0) {
        lora_adapter *ad = load_adapter(&b, "tests/data/lora/adapters/qwen2_mlx");
        if (ad) {
            CHECK(ad->m[0 * LORA_N_SLOTS + LORA_Q].r == 0 && ad->m[1 * LORA_N_SLOTS + LORA_Q].r == 4 &&
                      ad->m[1 * LORA_N_SLOTS + LORA_DOWN].in == 128 && ad->m[1 * LORA_N_SLOTS + LORA_DOWN].out == 64 &&
                      ad->m[1 * LORA_N_SLOTS + LORA_K].out == 32,
                  "qwen2_mlx: shapes");
            CHECK(fabsf(ad->alpha - 8.0f) < 1e-6f && !ad->rslora, "qwen2_mlx: alpha %g", ad->alpha);
        }
        lora_free(ad);
        model_close(b.m);
    }
    if (open_base("tests/data/ref/phi3_plain_tied", &b) == 0) {
        lora_adapter *ad = load_adapter(&b, "tests/data/lora/adapters/phi3_fused");
        if (ad) {
            const lora_mat *q = &ad->m[LORA_Q], *k = &ad->m[LORA_K], *v = &ad->m[LORA_V];
            const lora_mat *g = &ad->m[LORA_GATE], *u = &ad->m[LORA_UP];
            CHECK(q->out == 64 && k->out == 64 && v->out == 64 && g->out == 128 && u->out == 128 && q->A != k->A &&
                      !memcmp(q->A, k->A, (size_t)(q->r * q->in) * sizeof(float)),
                  "phi3_fused: split");
        }
        lora_free(ad);
        model_close(b.m);
    }
    if (open_base("tests/data/ref/llama_gqa_s64", &b) == 0) {
        lora_adapter *ad = load_adapter(&b, "tests/data/lora/adapters/llama_qv_rs");
        if (ad)
            CHECK(ad->m[LORA_Q].r == 8 && ad->m[LORA_V].r == 4 && ad->m[LORA_N_SLOTS + LORA_V].r == 4 &&
                      ad->m[LORA_K].r == 0 && ad->rslora,
                  "llama_qv_rs: rank_pattern");
        lora_free(ad);
        model_close(b.m);
    }
}

int main(void)
{
    for (size_t i = 0; i < sizeof VARIANTS / sizeof VARIANTS[0]; i++)
        check_merged(&VARIANTS[i]);
    check_mixed();
    check_shapes();
    check_peft_refs();
    check_bad();
    check_names();
    return test_finish("test_lora");
}
