/*
 * test_synth.c — `spill synth` output read back through spill's own readers.
 *
 * The tiny preset (D 256, H 4, K 2, F 512, V 1024, L 4) is written as bf16,
 * f16, q8 and q4 into a temporary directory, then:
 *  - model_open accepts it and reports the preset's dimensions;
 *  - every tensor has the declared shape and type and a 4096-aligned offset,
 *    tensors follow each other in declared order with only alignment padding
 *    between them, and the file ends at the last tensor's padded end (the
 *    file size the writer reported);
 *  - each layer's byte range is contiguous, starts 4096-aligned, holds only
 *    that layer's tensors, and the next layer starts at the aligned end of
 *    the previous one (globals first);
 *  - the weights have the intended distribution: matrices std 0.02 ± 5% (for
 *    Q4_0 the 16-level grid gives std 0.576·a = 0.01996), norms in
 *    [0.95, 1.05], nothing non-finite;
 *  - the vocabulary loads through tokenizer_from_gguf and " the" is one
 *    merged token while "hi" is two byte tokens;
 *  - the same options give the same bytes; another seed does not;
 *  - the engine runs a pass on it and gives finite logits;
 *  - bad options fail with a sentence.
 */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "model/synth.h"
#include "test.h"
#include "text/tokenizer.h"
#include "base/util.h"

static char dir[] = "/tmp/spill_test_synth_XXXXXX";

static uint64_t align4k(uint64_t v)
{
    return (v + 4095) / 4096 * 4096;
}

static const model_tensor *find(const model_desc *m, const char *name)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

/* std of a tensor's dequantized values read from the file; min/max through out params */
static double tensor_std(const model_desc *m, const model_tensor *t, double *mn, double *mx)
{
    FILE *f = fopen(m->files[t->file].path, "rb");
    uint8_t *b = malloc(t->size);
    uint64_t n = t->ne[0] * t->ne[1];
    float *x = malloc(n * sizeof *x);
    double s = 0, s2 = 0;
    *mn = INFINITY, *mx = -INFINITY;
    if (f && b && x && fseek(f, (long)t->offset, SEEK_SET) == 0 && fread(b, 1, t->size, f) == t->size &&
        quant_dequant_row(t->dtype, b, x, (int64_t)n) == 0)
        for (uint64_t i = 0; i < n; i++) {
            s += x[i], s2 += (double)x[i] * x[i];
            *mn = x[i] < *mn ? x[i] : *mn;
            *mx = x[i] > *mx ? x[i] : *mx;
        }
    else
        s2 = NAN;
    if (f)
        fclose(f);
    free(b);
    free(x);
    return sqrt(s2 / (double)n - (s / (double)n) * (s / (double)n));
}

static void check_layout(const model_desc *m, uint64_t file_size, const char *what)
{
    /* tensors in file order: offsets aligned, back to back with padding only */
    uint64_t expect = UINT64_MAX;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        CHECK(t->offset % 4096 == 0, "%s: %s at %llu is not 4096-aligned", what, t->name,
              (unsigned long long)t->offset);
        if (expect != UINT64_MAX)
            CHECK(t->offset == expect, "%s: %s at %llu, expected %llu", what, t->name, (unsigned long long)t->offset,
                  (unsigned long long)expect);
        expect = align4k(t->offset + t->size);
    }
    CHECK(expect == file_size, "%s: tensors end at %llu but the file has %llu bytes", what, (unsigned long long)expect,
          (unsigned long long)file_size);
    /* ranges: globals first, then layer l at the aligned end of layer l-1, bytes = sum of sizes */
    CHECK(m->n_ranges == (size_t)m->n_layers + 1, "%s: %zu ranges for %d layers", what, m->n_ranges, m->n_layers);
    uint64_t prev_end = 0;
    for (size_t r = 0; r < m->n_ranges; r++) {
        const layer_range *lr = &m->ranges[r];
        CHECK(lr->layer == (int32_t)r - 1, "%s: range %zu is layer %d", what, r, lr->layer);
        CHECK(lr->begin % 4096 == 0, "%s: layer %d begins at %llu", what, lr->layer, (unsigned long long)lr->begin);
        if (r > 0)
            CHECK(lr->begin == align4k(prev_end), "%s: layer %d begins at %llu, previous ended at %llu", what,
                  lr->layer, (unsigned long long)lr->begin, (unsigned long long)prev_end);
        uint64_t sum = 0, padded = 0;
        for (size_t i = 0; i < m->n_tensors; i++)
            if (m->tensors[i].layer == lr->layer) {
                sum += m->tensors[i].size;
                padded += align4k(m->tensors[i].size);
            }
        CHECK(lr->bytes == sum, "%s: layer %d holds %llu bytes, tensors sum to %llu", what, lr->layer,
              (unsigned long long)lr->bytes, (unsigned long long)sum);
        CHECK(align4k(lr->end) - lr->begin == padded, "%s: layer %d spans %llu bytes, padded tensors %llu", what,
              lr->layer, (unsigned long long)(align4k(lr->end) - lr->begin), (unsigned long long)padded);
        prev_end = lr->end;
    }
}

static void check_one(const char *q, uint32_t wtype)
{
    char path[256], err[SPILL_ERRLEN];
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", dir, q);
    synth_opts o = {.like = "tiny", .wtype = wtype, .seed = 7, .path = path};
    synth_stats st;
    int rc = synth_write(&o, &st, err, sizeof err);
    CHECK(rc == 0, "%s: synth_write: %s", q, err);
    if (rc)
        return;
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size == st.bytes, "%s: file size %lld vs reported %llu", q,
          (long long)sb.st_size, (unsigned long long)st.bytes);
    model_desc *m;
    rc = model_open(path, &m, err, sizeof err);
    CHECK(rc == 0, "%s: model_open: %s", q, err);
    if (rc)
        return;
    CHECK(!strcmp(m->arch, "llama") && m->n_layers == 4 && m->d_model == 256 && m->n_heads == 4 && m->n_kv_heads == 2 &&
              m->head_dim == 64 && m->ffn_dim == 512 && m->vocab == 1024,
          "%s: dims L%d D%d H%d K%d S%d F%d V%d", q, m->n_layers, m->d_model, m->n_heads, m->n_kv_heads, m->head_dim,
          m->ffn_dim, m->vocab);
    CHECK(fabs(m->rope_theta - 10000.0) < 1e-6 && fabs(m->norm_eps - 1e-5f) < 1e-12, "%s: rope %g eps %g", q,
          m->rope_theta, (double)m->norm_eps);
    CHECK(m->n_tensors == 3 + 4 * 9, "%s: %zu tensors", q, m->n_tensors);
    CHECK(!m->tied_embeddings, "%s: tiny has its own output head", q);
    CHECK(m->eos_id == 1023 && m->bos_id == 1022, "%s: eos %d bos %d", q, m->eos_id, m->bos_id);
    check_layout(m, st.bytes, q);

    static const struct {
        const char *name;
        uint64_t ne0, ne1;
        bool matrix;
    } shapes[] = {
        {"token_embd.weight", 256, 1024, true},       {"output.weight", 256, 1024, true},
        {"output_norm.weight", 256, 1, false},        {"blk.0.attn_q.weight", 256, 256, true},
        {"blk.1.attn_k.weight", 256, 128, true},      {"blk.2.attn_v.weight", 256, 128, true},
        {"blk.3.attn_output.weight", 256, 256, true}, {"blk.3.ffn_gate.weight", 256, 512, true},
        {"blk.0.ffn_up.weight", 256, 512, true},      {"blk.2.ffn_down.weight", 512, 256, true},
        {"blk.1.attn_norm.weight", 256, 1, false},    {"blk.1.ffn_norm.weight", 256, 1, false},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const model_tensor *t = find(m, shapes[i].name);
        CHECK(t, "%s: %s missing", q, shapes[i].name);
        if (!t)
            continue;
        CHECK(t->ne[0] == shapes[i].ne0 && t->ne[1] == shapes[i].ne1, "%s: %s is [%llu, %llu]", q, t->name,
              (unsigned long long)t->ne[0], (unsigned long long)t->ne[1]);
        CHECK(t->dtype == (shapes[i].matrix ? wtype : GGML_F32), "%s: %s has dtype %u", q, t->name, t->dtype);
        double mn, mx, sd = tensor_std(m, t, &mn, &mx);
        if (shapes[i].matrix)
            CHECK(fabs(sd - 0.02) < 0.001 && mn >= -0.0355 && mx <= 0.0355, "%s: %s std %g range [%g, %g]", q, t->name,
                  sd, mn, mx);
        else
            CHECK(mn >= 0.95 && mx <= 1.05 && sd > 0, "%s: norm %s range [%g, %g]", q, t->name, mn, mx);
    }

    tokenizer *tok;
    rc = tokenizer_from_gguf(m->gguf, &tok, err, sizeof err);
    CHECK(rc == 0, "%s: tokenizer_from_gguf: %s", q, err);
    if (rc == 0) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tokenizer_encode(tok, " the", 4, false, &ids, &n, err, sizeof err) == 0 && n == 1 && ids[0] == 262,
              "%s: ' the' -> %zu ids, first %d", q, n, n ? ids[0] : -1);
        free(ids);
        ids = NULL, n = 0;
        CHECK(tokenizer_encode(tok, "hi", 2, false, &ids, &n, err, sizeof err) == 0 && n == 2 && ids[0] == 'h' &&
                  ids[1] == 'i',
              "%s: 'hi' -> %zu ids", q, n);
        free(ids);
        tokenizer_free(tok);
    }

    engine_opts eo = {.threads = 2, .max_pass_tokens = 16, .max_pass_seqs = 2, .page_tokens = 16, .kv_pages = 8};
    spill_engine *e;
    rc = engine_open(m, &eo, &e, err, sizeof err);
    CHECK(rc == 0, "%s: engine_open: %s", q, err);
    if (rc == 0) {
        kv_row kr = {0};
        int32_t toks[5] = {1, 262, 104, 105, 7};
        CHECK(kv_row_reserve(engine_kv(e), &kr, 5) == 0, "%s: kv reserve", q);
        fwd_seq sq = {.kv = &kr, .pos0 = 0, .n = 5, .tokens = toks, .want_logits = true};
        float *logits = malloc(1024 * sizeof *logits);
        rc = engine_forward(e, &sq, 1, logits, err, sizeof err);
        CHECK(rc == 0, "%s: engine_forward: %s", q, err);
        double s2 = 0;
        int finite = 1;
        for (int i = 0; i < 1024 && rc == 0; i++) {
            finite &= isfinite(logits[i]);
            s2 += (double)logits[i] * logits[i];
        }
        /* logits std ≈ 0.02·√D·(rms of the normed state ≈ 1) = 0.32; accept 0.05..2 */
        CHECK(rc || (finite && sqrt(s2 / 1024) > 0.05 && sqrt(s2 / 1024) < 2), "%s: logits rms %g", q, sqrt(s2 / 1024));
        free(logits);
        kv_row_free(engine_kv(e), &kr);
        engine_close(e);
    }
    model_close(m);
}

static bool same_file(const char *a, const char *b)
{
    char *x, *y, err[SPILL_ERRLEN];
    size_t nx, ny;
    if (util_read_file(a, 64u << 20, &x, &nx, err, sizeof err))
        return false;
    if (util_read_file(b, 64u << 20, &y, &ny, err, sizeof err)) {
        free(x);
        return false;
    }
    bool same = nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

int main(void)
{
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return test_finish("test_synth");
    }
    check_one("bf16", GGML_BF16);
    check_one("f16", GGML_F16);
    check_one("q8", GGML_Q8_0);
    check_one("q4", GGML_Q4_0);

    char a[256], b[256], c[256], err[SPILL_ERRLEN];
    snprintf(a, sizeof a, "%s/tiny-bf16.gguf", dir);
    snprintf(b, sizeof b, "%s/again.gguf", dir);
    snprintf(c, sizeof c, "%s/other.gguf", dir);
    synth_stats st;
    synth_opts o = {.like = "tiny", .wtype = GGML_BF16, .seed = 7, .path = b};
    CHECK(synth_write(&o, &st, err, sizeof err) == 0 && same_file(a, b), "same seed, different bytes: %s", err);
    o.seed = 8, o.path = c;
    CHECK(synth_write(&o, &st, err, sizeof err) == 0 && !same_file(a, c), "another seed, same bytes");

    /* the thread count does not change the bytes */
    o.seed = 7, o.path = c, o.threads = 3;
    CHECK(synth_write(&o, &st, err, sizeof err) == 0 && same_file(a, c), "3 threads give other bytes than 2: %s", err);
    o.threads = 1;
    CHECK(synth_write(&o, &st, err, sizeof err) == 0 && same_file(a, c), "1 thread gives other bytes than 2: %s", err);
    o.threads = 0;

    /* --layers 2: a model of 2 layers whose layers are byte for byte those of the 4-layer file */
    o.layers = 2;
    model_desc *m2 = NULL, *m4 = NULL;
    CHECK(synth_write(&o, &st, err, sizeof err) == 0 && model_open(c, &m2, err, sizeof err) == 0 && m2->n_layers == 2 &&
              model_open(a, &m4, err, sizeof err) == 0,
          "--layers 2: %s", err);
    if (m2 && m4) {
        const model_tensor *x = find(m2, "blk.1.ffn_up.weight"), *y = find(m4, "blk.1.ffn_up.weight");
        uint8_t *bx = x ? malloc(x->size) : NULL, *by = y ? malloc(y->size) : NULL;
        FILE *fx = fopen(c, "rb"), *fy = fopen(a, "rb");
        bool same = bx && by && fx && fy && x->size == y->size && fseek(fx, (long)x->offset, SEEK_SET) == 0 &&
                    fseek(fy, (long)y->offset, SEEK_SET) == 0 && fread(bx, 1, x->size, fx) == x->size &&
                    fread(by, 1, y->size, fy) == y->size && !memcmp(bx, by, x->size);
        CHECK(same, "blk.1.ffn_up differs between the 2- and 4-layer files");
        if (fx)
            fclose(fx);
        if (fy)
            fclose(fy);
        free(bx), free(by);
    }
    model_close(m2);
    model_close(m4);

    /* --sparse: same layout and size; globals and norms byte for byte those of the full file, layer matrices zero */
    o.layers = 0;
    o.sparse = true;
    char sp[256];
    snprintf(sp, sizeof sp, "%s/sparse.gguf", dir);
    o.path = sp;
    model_desc *ms = NULL, *mf = NULL;
    CHECK(synth_write(&o, &st, err, sizeof err) == 0 && model_open(sp, &ms, err, sizeof err) == 0 &&
              model_open(a, &mf, err, sizeof err) == 0,
          "--sparse: %s", err);
    o.sparse = false;
    if (ms && mf) {
        struct stat s1, s2;
        CHECK(stat(sp, &s1) == 0 && stat(a, &s2) == 0 && s1.st_size == s2.st_size && ms->n_tensors == mf->n_tensors,
              "sparse file size %lld vs %lld", (long long)s1.st_size, (long long)s2.st_size);
        fprintf(stderr, "sparse tiny: %lld bytes, %lld allocated (full file: %lld allocated)\n", (long long)s1.st_size,
                (long long)s1.st_blocks * 512, (long long)s2.st_blocks * 512);
        FILE *fs = fopen(sp, "rb"), *ff = fopen(a, "rb");
        int zero_mats = 0, same_other = 0, n_mats = 0, n_other = 0;
        for (size_t i = 0; fs && ff && i < ms->n_tensors; i++) {
            const model_tensor *x = &ms->tensors[i], *y = find(mf, x->name);
            uint8_t *bx = malloc(x->size), *by = malloc(x->size);
            bool ok = y && bx && by && y->size == x->size && y->offset == x->offset &&
                      fseek(fs, (long)x->offset, SEEK_SET) == 0 && fread(bx, 1, x->size, fs) == x->size &&
                      fseek(ff, (long)y->offset, SEEK_SET) == 0 && fread(by, 1, y->size, ff) == y->size;
            bool layer_mat = x->layer >= 0 && x->n_dims == 2;
            if (layer_mat) {
                n_mats++;
                bool z = ok;
                for (uint64_t k = 0; z && k < x->size; k++)
                    z = bx[k] == 0;
                zero_mats += z;
            } else {
                n_other++;
                same_other += ok && !memcmp(bx, by, x->size);
            }
            free(bx), free(by);
        }
        CHECK(n_mats == 28 && zero_mats == n_mats, "%d of %d layer matrices read as zeros", zero_mats, n_mats);
        CHECK(n_other > 0 && same_other == n_other, "%d of %d globals/norms equal the full file's", same_other, n_other);
        if (fs)
            fclose(fs);
        if (ff)
            fclose(ff);
    }
    model_close(ms);
    model_close(mf);

    o.layers = 5;
    CHECK(synth_write(&o, &st, err, sizeof err) != 0 && strstr(err, "--layers 5"), "5 layers of tiny: '%s'", err);
    o.layers = 0, o.like = "gpt5";
    CHECK(synth_write(&o, &st, err, sizeof err) != 0 && strstr(err, "gpt5"), "unknown shape: '%s'", err);
    o.like = "tiny", o.wtype = GGML_Q4_K;
    CHECK(synth_write(&o, &st, err, sizeof err) != 0 && strstr(err, "Q4_K"), "Q4_K: '%s'", err);
    o.wtype = GGML_BF16;
    snprintf(c, sizeof c, "%s/no/such/dir/x.gguf", dir);
    o.path = c;
    CHECK(synth_write(&o, &st, err, sizeof err) != 0 && strstr(err, "cannot create"), "bad path: '%s'", err);

    /* the command line */
    char *argv1[] = {"--like", "tiny", "--quant", "q8", "-o", dir};
    CHECK(synth_main(6, argv1) == 0, "synth_main into a directory");
    snprintf(c, sizeof c, "%s/tiny-q8.gguf", dir);
    CHECK(util_is_file(c), "synth_main wrote %s", c);
    char *argv2[] = {"--like", "tiny", "--quant", "q3", "-o", dir};
    CHECK(synth_main(6, argv2) == 2, "bad --quant is a usage error");
    char *argv3[] = {"--like", "tiny"};
    CHECK(synth_main(2, argv3) == 2, "missing -o is a usage error");
    char *argv4[] = {"--like", "gpt5", "-o", dir};
    CHECK(synth_main(4, argv4) == 2, "unknown shape is a usage error");
    char *argv5[] = {"--like", "tiny", "--layers", "9", "-o", dir};
    CHECK(synth_main(6, argv5) == 2, "too many layers is a usage error");
    snprintf(c, sizeof c, "%s/no/such/dir/x.gguf", dir);
    char *argv6[] = {"--like", "tiny", "-o", c};
    CHECK(synth_main(4, argv6) == 73, "an unwritable path exits 73");

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return test_finish("test_synth");
}
