/*
 * test_forward.c — the CPU forward pass against reference logits from
 * transformers (tools/gen_ref_models.py: tiny random-weight models of each
 * llama-family architecture, fp32, eager attention).
 *
 * For each model the three rows (prompts of 5, 13 and 23 tokens, then 32
 * greedy tokens) run together: prompts are prefilled in chunks of different
 * sizes in the same passes (row 0 token by token, row 1 in chunks of 4, row 2
 * whole), then the recorded tokens are decoded one per pass with the rows at
 * different lengths.  Each chunk's last logits and every decode step are
 * compared with the reference.  A second engine runs the same passes in
 * lockstep with its layers streamed from disk (O_DIRECT, a ring of 2 slots)
 * and KV pages of 1 position instead of 16: its logits must be bit-identical
 * to the resident engine's (same bytes, same summation order), which is the
 * streamed-vs-resident and paged-layout guarantee.
 *
 * Tolerance, fixed before the first run: max |Δ log-softmax| ≤ 1e-4.  Both
 * sides compute in fp32 with different summation orders (blocked dot
 * products here, BLAS in torch); relative error per dot product is ~1e-6 ×
 * sqrt(K) for K ≤ 256, logits are O(1), and two layers compound it to ~1e-5:
 * 1e-4 leaves a 10x margin while any real bug (a wrong RoPE pair, mask, bias,
 * norm) moves log-probs by 1e-2 or more.  The greedy tokens must also agree
 * wherever the reference's top-2 margin exceeds 1e-3.  The MoE fixtures
 * (mixtral, qwen2_moe, qwen3_moe) keep the same bound: routing is a top-k of
 * fp32 probabilities, and a choice flipped by summation rounding would need
 * two probabilities within ~1e-6 of each other, which the random weights do
 * not produce (a flip would show as an error of 1e-2, not hide under 1e-4).
 *
 * Each MoE fixture also runs from the transformers 4 config (config_v4.json:
 * num_experts, top-level rope_theta) and, where generated, from
 * transformers 5's fused expert tensors (model_fused.safetensors): a
 * temporary directory of symlinks stands for the variant.  The MoE engines
 * must have skipped experts no token chose, and a prompt prefilled whole must
 * give the bits of the same prompt fed one token per pass (the routed
 * block's output per token does not depend on the batch).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/model.h"
#include "ref.h"
#include "test.h"
#include "base/util.h"

#define MAXROWS REF_MAXROWS

/* SPLREF01 (tools/gen_ref_models.py, tests/ref.h): 0 when read, -1 when the file is absent or malformed. */
static int load_ref(const char *path, ref_row *rows, uint32_t *n_rows, uint32_t *vocab)
{
    return ref_load(path, rows, n_rows, vocab);
}

static void log_softmax(const float *x, double *y, int n)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++)
        s += exp(x[i] - mx);
    for (int i = 0; i < n; i++)
        y[i] = x[i] - mx - log(s);
}

static double compare(const float *got, const float *want, int V)
{
    double a[4096], b[4096], worst = 0;
    log_softmax(got, a, V);
    log_softmax(want, b, V);
    for (int i = 0; i < V; i++)
        worst = fabs(a[i] - b[i]) > worst ? fabs(a[i] - b[i]) : worst;
    return worst;
}

static int argmax(const float *x, int V, float *margin)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best])
            best = i;
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != best && x[i] > second)
            second = x[i];
    *margin = x[best] - second;
    return best;
}

/* Prefills row r's prompt whole on one engine and token by token on another: the last logits must be the
 * same bits. */
static void check_batch_independent(model_desc *m, const ref_row *row, uint32_t V, const char *name)
{
    char err[SPILL_ERRLEN];
    engine_opts o = {.threads = 2, .max_pass_tokens = 64, .max_pass_seqs = 8, .page_tokens = 16, .kv_pages = 64};
    spill_engine *a, *b;
    if (engine_open(m, &o, &a, err, sizeof err)) {
        CHECK(0, "%s: engine_open: %s", name, err);
        return;
    }
    o.threads = 1;
    if (engine_open(m, &o, &b, err, sizeof err)) {
        CHECK(0, "%s: engine_open: %s", name, err);
        engine_close(a);
        return;
    }
    int32_t n = (int32_t)row->n_prompt;
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    kv_row ka = {0}, kb = {0};
    int rc = kv_row_reserve(engine_kv(a), &ka, n) || kv_row_reserve(engine_kv(b), &kb, n);
    fwd_seq whole = {&ka, 0, n, row->ids, true, false, 0, 0};
    rc = rc || engine_forward(a, &whole, 1, la, err, sizeof err);
    for (int32_t i = 0; i < n && !rc; i++) {
        fwd_seq one = {&kb, i, 1, row->ids + i, true, false, 0, 0};
        rc = engine_forward(b, &one, 1, lb, err, sizeof err);
    }
    CHECK(rc == 0, "%s: batch check: %s", name, err);
    CHECK(rc || !memcmp(la, lb, (size_t)V * sizeof(float)),
          "%s: a prompt prefilled whole differs from the same prompt fed token by token", name);
    kv_row_free(engine_kv(a), &ka);
    kv_row_free(engine_kv(b), &kb);
    free(la);
    free(lb);
    engine_close(a);
    engine_close(b);
}

/* Runs the model in dir (fixture ref's own directory, or a variant of it) against ref's logits; name labels
 * the messages. */
static void run_dir(const char *ref, const char *name, const char *dir)
{
    char path[600], err[SPILL_ERRLEN];
    snprintf(path, sizeof path, "tests/data/ref/%s/ref.bin", ref);
    ref_row rows[MAXROWS];
    uint32_t n_rows, V;
    if (load_ref(path, rows, &n_rows, &V) != 0) {
        CHECK(0, "%s: cannot load reference", name);
        return;
    }
    model_desc *m;
    int rc = model_open(dir, &m, err, sizeof err);
    CHECK(rc == 0, "%s: model_open: %s", name, err);
    if (rc)
        return;
    CHECK(m->vocab == (int)V, "%s: vocab %d vs %u", name, m->vocab, V);
    engine_opts o = {.threads = 2, .max_pass_tokens = 64, .max_pass_seqs = 8, .page_tokens = 16, .kv_pages = 64};
    engine_opts os = {.threads = 3,
                      .max_pass_tokens = 64,
                      .max_pass_seqs = 8,
                      .page_tokens = 1,
                      .kv_pages = 1024,
                      .stream = true,
                      .stream_slots = 2,
                      .direct_io = true};
    spill_engine *e, *es = NULL;
    rc = engine_open(m, &o, &e, err, sizeof err);
    CHECK(rc == 0, "%s: engine_open: %s", name, err);
    if (rc == 0) {
        rc = engine_open(m, &os, &es, err, sizeof err);
        CHECK(rc == 0, "%s: streamed engine_open: %s", name, err);
    }
    if (rc) {
        engine_close(e);
        model_close(m);
        return;
    }
    kv_cache *kv = engine_kv(e), *kvs = engine_kv(es);
    kv_row kr[MAXROWS] = {0}, krs[MAXROWS] = {0};
    int32_t done[MAXROWS] = {0}; /* tokens fed so far */
    float *logits = malloc((size_t)MAXROWS * V * sizeof(float)),
          *logits_s = malloc((size_t)MAXROWS * V * sizeof(float));
    double worst = 0;
    int compared = 0, token_mismatch = 0, stream_diff = 0;
    for (int pass = 0; pass < 200; pass++) {
        fwd_seq seqs[MAXROWS], seqs_s[MAXROWS];
        int ns = 0, idx[MAXROWS];
        for (uint32_t r = 0; r < n_rows; r++) {
            int32_t left = (int32_t)rows[r].n_total - 1 - done[r]; /* the last token's logits are not needed */
            if (left <= 0)
                continue;
            int32_t n = 1;
            if (done[r] < (int32_t)rows[r].n_prompt) {
                int32_t rest = (int32_t)rows[r].n_prompt - done[r];
                n = r == 0 ? 1 : r == 1 ? (rest < 4 ? rest : 4) : rest;
            }
            CHECK(kv_row_reserve(kv, &kr[r], done[r] + n) == 0, "%s: KV reserve", name);
            CHECK(kv_row_reserve(kvs, &krs[r], done[r] + n) == 0, "%s: KV reserve (streamed)", name);
            seqs[ns] = (fwd_seq){&kr[r], done[r], n, rows[r].ids + done[r], true, false, 0, 0};
            seqs_s[ns] = (fwd_seq){&krs[r], done[r], n, rows[r].ids + done[r], true, false, 0, 0};
            idx[ns++] = (int)r;
        }
        if (!ns)
            break;
        rc = engine_forward(e, seqs, ns, logits, err, sizeof err);
        CHECK(rc == 0, "%s: forward: %s", name, err);
        int rcs = engine_forward(es, seqs_s, ns, logits_s, err, sizeof err);
        CHECK(rcs == 0, "%s: streamed forward: %s", name, err);
        if (rc || rcs)
            break;
        stream_diff += memcmp(logits, logits_s, (size_t)ns * V * sizeof(float)) != 0;
        for (int s = 0; s < ns; s++) {
            int r = idx[s];
            int32_t at = done[r] + seqs[s].n - 1; /* position whose logits came back */
            const float *want = rows[r].logits + (size_t)at * V;
            double d = compare(logits + (size_t)s * V, want, (int)V);
            worst = d > worst ? d : worst;
            compared++;
            float mg, mg2;
            int a = argmax(logits + (size_t)s * V, (int)V, &mg), b = argmax(want, (int)V, &mg2);
            if (a != b && mg2 > 1e-3f)
                token_mismatch++;
            done[r] += seqs[s].n;
        }
    }
    CHECK(worst <= 1e-4, "%s: max |dlogsoftmax| %.3g over %d positions", name, worst, compared);
    CHECK(token_mismatch == 0, "%s: %d greedy tokens differ", name, token_mismatch);
    CHECK(compared >= 96, "%s: only %d positions compared", name, compared);
    CHECK(stream_diff == 0, "%s: streamed logits differ from resident in %d passes", name, stream_diff);
    uint64_t bytes;
    size_t ring;
    double wait_s, read_s;
    CHECK(engine_stream_stats(es, &ring, &bytes, &wait_s, &read_s) && bytes > 0, "%s: nothing was streamed", name);
    fprintf(stderr, "%-34s %3d positions, max |dlogsoftmax| %.2e, streamed %llu bytes, identical: %s\n", name, compared,
            worst, (unsigned long long)bytes, stream_diff ? "NO" : "yes");
    uint64_t run, skipped;
    if (engine_moe_stats(e, &run, &skipped)) {
        CHECK(run > 0 && skipped > 0, "%s: %llu experts ran, %llu skipped", name, (unsigned long long)run,
              (unsigned long long)skipped);
        fprintf(stderr, "%-34s experts ran %llu times, skipped %llu times\n", "", (unsigned long long)run,
                (unsigned long long)skipped);
        check_batch_independent(m, &rows[n_rows - 1], V, name);
    }
    for (uint32_t r = 0; r < n_rows; r++) {
        kv_row_free(kv, &kr[r]);
        kv_row_free(kvs, &krs[r]);
        free(rows[r].ids);
        free(rows[r].logits);
    }
    CHECK(kv->n_free == kv->n_pages && kvs->n_free == kvs->n_pages, "%s: pages leaked", name);
    free(logits);
    free(logits_s);
    engine_close(e);
    engine_close(es);
    model_close(m);
}

static void run_model(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "tests/data/ref/%s", name);
    run_dir(name, name, dir);
}

/* Runs fixture `name` from a temporary directory whose config.json and model.safetensors are symlinks to the
 * fixture's files `config` and `weights`. */
static void run_variant(const char *name, const char *config, const char *weights)
{
    char tmp[] = "/tmp/spill_fwd_XXXXXX", src[1024], dst[1100], label[128];
    char *cwd = getcwd(NULL, 0);
    CHECK(cwd && mkdtemp(tmp), "%s: temporary directory", name);
    if (!cwd)
        return;
    const char *files[2][2] = {{config, "config.json"}, {weights, "model.safetensors"}};
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/tests/data/ref/%s/%s", cwd, name, files[i][0]);
        snprintf(dst, sizeof dst, "%s/%s", tmp, files[i][1]);
        ok = ok && symlink(src, dst) == 0;
    }
    CHECK(ok, "%s: symlinks in %s", name, tmp);
    snprintf(label, sizeof label, "%s (%s%s)", name, strcmp(config, "config.json") ? "v4 config" : "v5 config",
             strcmp(weights, "model.safetensors") ? ", fused" : "");
    if (ok)
        run_dir(name, label, tmp);
    for (int i = 0; i < 2; i++) {
        snprintf(dst, sizeof dst, "%s/%s", tmp, files[i][1]);
        unlink(dst);
    }
    rmdir(tmp);
    free(cwd);
}

int main(void)
{
    static const char *models[] = {"llama_gqa_s64",         "llama_mha_s128_tied_llama3",
                                   "llama_mqa_linear",      "llama_yarn",
                                   "qwen2_bias",            "qwen3_qknorm",
                                   "mistral_window8",       "gemma2_softcap_window",
                                   "gemma3_local_linear",   "phi3_longrope_partial",
                                   "phi3_plain_tied",       "mixtral_top2",
                                   "qwen2_moe_shared",      "qwen2_moe_top1_step2",
                                   "qwen3_moe_top8"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        run_model(models[i]);
    /* issue 12's families with their configs as transformers 4 wrote them, and transformers 5's fused experts */
    static const char *v4[] = {"gemma2_softcap_window", "gemma3_local_linear", "phi3_longrope_partial",
                               "mixtral_top2",          "qwen2_moe_shared",    "qwen2_moe_top1_step2",
                               "qwen3_moe_top8"};
    for (size_t i = 0; i < sizeof v4 / sizeof v4[0]; i++)
        run_variant(v4[i], "config_v4.json", "model.safetensors");
    run_variant("mixtral_top2", "config.json", "model_fused.safetensors");
    run_variant("qwen3_moe_top8", "config_v4.json", "model_fused.safetensors");
    return test_finish("test_forward");
}
