/*
 * test_llamacpp.c — the real default model (SmolLM2-135M-Instruct Q4_1)
 * against two references, for 20 chat prompts + 128 tokens each
 * (tests/data/llamacpp/smollm2.json):
 *   - "fp32": an independent numpy forward over the same GGUF weights
 *     (tools/gen_fp32_ref.py; weights dequantized by the `gguf` package);
 *   - llama.cpp (llama-cpp-python, tools/gen_llamacpp_ref.py), a real peer
 *     that computes with its own approximations (f16 KV cache, 8-bit
 *     activations).
 *
 * Checks, with thresholds fixed before the comparison ran:
 *   - spill's template + tokenizer give llama.cpp's prompt ids exactly;
 *   - spill's exact path (fp32 activations) vs fp32: max |Δ log-prob| of the
 *     forced next token ≤ 1e-4 (same reasoning as test_forward: fp32 with a
 *     different summation order moves log-probs by ~1e-5), and greedy
 *     generations identical on ≥ 18 of 20;
 *   - vs llama.cpp: spill may not disagree with llama.cpp more than the exact
 *     fp32 reference itself does (top-1 agreement and mean |Δ log-prob|,
 *     margin 0.005): llama.cpp's own rounding bounds how close any exact
 *     implementation can get (measured: fp32 reaches ~98% top-1 agreement),
 *     so the "≥ 99% vs llama.cpp" is not reachable by a correct fp32
 *     engine and is replaced by this comparison;
 *   - the default generation path (8-bit activations, like llama.cpp's) is
 *     reported against both references.
 *
 * Gemma 3 270M (gemma3:270m, Q4_K_M, tests/data/llamacpp/gemma3.json, the
 * same 20 questions rendered by jinja2 with spill's built-in template), with
 * thresholds fixed before the comparison ran:
 *   - spill's built-in template + tokenizer give llama.cpp's prompt ids exactly,
 *     and <end_of_turn> (one token) is in the stop set;
 *   - spill's default path (fp32 activations) teacher-forced over llama.cpp's
 *     sequences: top-1 agreement with llama.cpp ≥ 0.99 (the target)
 *     and mean |Δ log-prob| of the forced token ≤ 0.10.  The helper who wrote
 *     this gate first set 0.97 before the run (no exact fp32 reference exists
 *     for this model, and SmolLM2 above shows llama.cpp's own rounding leaves a
 *     correct fp32 engine at 0.9747 there); the run measured 0.9927
 *     (2842/2863) and 0.0200, and the gate was then raised to the 0.99.
 *     The path is deterministic (cpu.c's fixed summation order), so the margin
 *     of 0.27 points is not noise.  A wiring error (a RoPE base, a missing norm,
 *     the window, a scale) moves top-1 by tens of points.
 */
#include <jansson.h>
#include <math.h>

#include "engine/engine.h"
#include "model/model.h"
#include "text/prompt.h"
#include "text/template.h"
#include "test.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define FIXTURE "tests/data/llamacpp/smollm2.json"
#define GEMMA_FIXTURE "tests/data/llamacpp/gemma3.json"

typedef struct stats {
    long positions, agree_llama, agree_fp32;
    double dlp_llama, dlp_fp32, max_dlp_fp32;
    int greedy_llama, greedy_fp32;
} stats;

static double log_softmax_at(const float *x, int V, int idx)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++)
        s += exp(x[i] - mx);
    return x[idx] - mx - log(s);
}

static int argmax(const float *x, int V)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static bool same_seq(const int32_t *a, int n, json_t *b)
{
    if ((size_t)n != json_array_size(b))
        return false;
    for (int i = 0; i < n; i++)
        if (a[i] != json_integer_value(json_array_get(b, (size_t)i)))
            return false;
    return true;
}

/* Teacher-forces every prompt's sequence (and, with greedy, generates greedily from every prompt) on one
 * engine path, counting agreement with llama.cpp and, where the fixture has it, with the fp32 reference. */
static void run(model_desc *m, json_t *prompts, bool q8, bool greedy, stats *st)
{
    char err[SPILL_ERRLEN];
    size_t NP = json_array_size(prompts);
    int V = m->vocab;
    engine_opts o = {.threads = 0, .max_pass_tokens = 1024, .max_pass_seqs = 32, .page_tokens = 16,
                     .kv_pages = 32 * 24, .q8_activations = q8};
    spill_engine *e;
    int rc = engine_open(m, &o, &e, err, sizeof err);
    CHECK(rc == 0, "engine_open: %s", err);
    if (rc)
        return;
    kv_cache *kv = engine_kv(e);
    size_t rows = NP; /* logits rows: the longest teacher-forced sequence, or one per prompt when generating */
    for (size_t p = 0; p < NP; p++) {
        size_t n = json_array_size(json_object_get(json_array_get(prompts, p), "ids"));
        rows = n > rows ? n : rows;
    }
    float *logits = malloc(rows * (size_t)V * sizeof(float));
    memset(st, 0, sizeof *st);

    /* teacher forcing: one prompt per pass, logits at every position */
    for (size_t p = 0; p < NP; p++) {
        json_t *pr = json_array_get(prompts, p), *fp = json_object_get(pr, "fp32");
        json_t *ids = json_object_get(pr, "ids"), *top1 = json_object_get(pr, "top1"),
               *lp = json_object_get(pr, "logprob_next"), *lp32 = json_object_get(fp, "logprob_next"),
               *top32 = json_object_get(fp, "top1");
        int n = (int)json_array_size(ids);
        int32_t *seq = malloc((size_t)n * sizeof *seq);
        for (int i = 0; i < n; i++)
            seq[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        kv_row kr = {0};
        CHECK(kv_row_reserve(kv, &kr, n) == 0, "KV");
        fwd_seq sq = {&kr, 0, n - 1, seq, true, true, 0, 0};
        rc = engine_forward(e, &sq, 1, logits, err, sizeof err);
        CHECK(rc == 0, "forward: %s", err);
        for (int i = 0; rc == 0 && i < n - 1; i++) {
            const float *l = logits + (size_t)i * (size_t)V;
            double mine = log_softmax_at(l, V, seq[i + 1]);
            int a = argmax(l, V);
            st->agree_llama += a == json_integer_value(json_array_get(top1, (size_t)i));
            st->dlp_llama += fabs(mine - json_number_value(json_array_get(lp, (size_t)i)));
            st->positions++;
            if (!fp)
                continue;
            st->agree_fp32 += a == json_integer_value(json_array_get(top32, (size_t)i));
            double d32 = fabs(mine - json_number_value(json_array_get(lp32, (size_t)i)));
            st->dlp_fp32 += d32;
            st->max_dlp_fp32 = d32 > st->max_dlp_fp32 ? d32 : st->max_dlp_fp32;
        }
        kv_row_free(kv, &kr);
        free(seq);
    }

    if (!greedy) {
        free(logits);
        engine_close(e);
        return;
    }
    /* greedy generation, all prompts batched at different lengths */
    kv_row *kr = calloc(NP, sizeof *kr);
    int32_t **gen = calloc(NP, sizeof *gen), *ngen = calloc(NP, sizeof *ngen), *pos = calloc(NP, sizeof *pos);
    int32_t *next = calloc(NP, sizeof *next), **pids = calloc(NP, sizeof *pids);
    fwd_seq *sqs = calloc(NP, sizeof *sqs);
    size_t *map = calloc(NP, sizeof *map);
    for (size_t p = 0; p < NP; p++) {
        json_t *pr = json_array_get(prompts, p);
        int np = (int)json_integer_value(json_object_get(pr, "n_prompt"));
        pids[p] = malloc((size_t)np * sizeof(int32_t));
        for (int i = 0; i < np; i++)
            pids[p][i] = (int32_t)json_integer_value(json_array_get(json_object_get(pr, "ids"), (size_t)i));
        gen[p] = malloc(129 * sizeof(int32_t));
        kv_row_reserve(kv, &kr[p], np + 129);
        pos[p] = np;
        sqs[p] = (fwd_seq){&kr[p], 0, np, pids[p], true, false, 0, 0};
        map[p] = p;
    }
    int ns = (int)NP;
    while (ns > 0) {
        if (engine_forward(e, sqs, ns, logits, err, sizeof err)) {
            CHECK(0, "greedy forward: %s", err);
            break;
        }
        int k = 0;
        for (int s = 0; s < ns; s++) {
            size_t p = map[s];
            int32_t t = argmax(logits + (size_t)s * (size_t)V, V);
            bool stop = false;
            for (size_t i = 0; i < m->n_stop; i++)
                stop |= t == m->stop_ids[i];
            if (stop || ngen[p] >= 128)
                continue;
            gen[p][ngen[p]++] = t;
            next[p] = t;
            sqs[k] = (fwd_seq){&kr[p], pos[p]++, 1, &next[p], true, false, 0, 0};
            map[k++] = p;
        }
        ns = k;
    }
    for (size_t p = 0; p < NP; p++) {
        json_t *pr = json_array_get(prompts, p);
        st->greedy_llama += same_seq(gen[p], ngen[p], json_object_get(pr, "greedy"));
        st->greedy_fp32 += same_seq(gen[p], ngen[p], json_object_get(json_object_get(pr, "fp32"), "greedy"));
        kv_row_free(kv, &kr[p]);
        free(gen[p]);
        free(pids[p]);
    }
    free(kr), free(gen), free(ngen), free(pos), free(next), free(pids), free(sqs), free(map);
    free(logits);
    engine_close(e);
}

static void test_smollm2(void)
{
    char err[SPILL_ERRLEN], path[4096];
    json_error_t je;
    json_t *fx = json_load_file(FIXTURE, 0, &je);
    CHECK(fx != NULL, "%s: %s", FIXTURE, je.text);
    model_desc *m = NULL;
    int rc = model_resolve("smollm2:135m", path, sizeof path, err, sizeof err);
    if (rc == 0)
        rc = model_open(path, &m, err, sizeof err);
    CHECK(rc == 0, "the default model must be installed (tools/setup.sh): %s", err);
    if (!fx || rc) {
        model_close(m);
        json_decref(fx);
        return;
    }
    json_t *prompts = json_object_get(fx, "prompts");
    size_t NP = json_array_size(prompts);

    /* prompt ids: template + tokenizer vs llama.cpp's tokenization of the same rendered text */
    tokenizer *tok;
    CHECK(tokenizer_from_gguf(m->gguf, &tok, err, sizeof err) == 0, "tokenizer: %s", err);
    int ids_match = 0;
    long ref_agree = 0, ref_pos = 0;
    double ref_dlp = 0;
    for (size_t p = 0; p < NP; p++) {
        json_t *pr = json_array_get(prompts, p), *fp = json_object_get(pr, "fp32");
        json_t *msgs =
            json_pack("[{s:s,s:s}]", "role", "user", "content", json_string_value(json_object_get(pr, "question")));
        char *text = NULL;
        size_t tl = 0, nt = 0;
        int32_t *mine = NULL;
        int n_prompt = (int)json_integer_value(json_object_get(pr, "n_prompt"));
        if (chat_template_render(m->chat_template, strlen(m->chat_template), msgs, NULL, NULL, true, 0, &text, &tl,
                                 err, sizeof err) == 0 &&
            tokenizer_encode(tok, text, tl, false, &mine, &nt, err, sizeof err) == 0 && (int)nt == n_prompt)
            ids_match += same_seq(mine, (int)nt, json_object_get(pr, "ids")) ||
                         !memcmp(mine, (int32_t[]){0}, 0); /* prefix compare below */
        bool prefix = mine && (int)nt == n_prompt;
        for (int i = 0; prefix && i < n_prompt; i++)
            prefix = mine[i] == json_integer_value(json_array_get(json_object_get(pr, "ids"), (size_t)i));
        ids_match -= (mine && (int)nt == n_prompt) ? 1 : 0;
        ids_match += prefix;
        free(text);
        free(mine);
        json_decref(msgs);
        /* how close the exact fp32 reference itself is to llama.cpp */
        json_t *t1 = json_object_get(pr, "top1"), *t32 = json_object_get(fp, "top1"),
               *lp = json_object_get(pr, "logprob_next"), *lp32 = json_object_get(fp, "logprob_next");
        for (size_t i = 0; i < json_array_size(t1); i++, ref_pos++) {
            ref_agree += json_integer_value(json_array_get(t1, i)) == json_integer_value(json_array_get(t32, i));
            ref_dlp += fabs(json_number_value(json_array_get(lp, i)) - json_number_value(json_array_get(lp32, i)));
        }
    }
    tokenizer_free(tok);
    fprintf(stderr, "prompt ids identical to llama.cpp: %d/%zu\n", ids_match, NP);
    CHECK(ids_match == (int)NP, "template+tokenizer ids differ from llama.cpp on %zu prompts", NP - (size_t)ids_match);
    double ref_rate = (double)ref_agree / (double)ref_pos, ref_mean = ref_dlp / (double)ref_pos;
    fprintf(stderr, "fp32 reference vs llama.cpp: top-1 %.4f, mean |dlogprob| %.5f\n", ref_rate, ref_mean);

    stats ex, q8;
    run(m, prompts, false, true, &ex);
    run(m, prompts, true, true, &q8);
    for (int k = 0; k < 2; k++) {
        const stats *s = k ? &q8 : &ex;
        fprintf(stderr,
                "%s: vs fp32 max |dlogprob| %.2e mean %.2e, top-1 %.4f, greedy %d/%zu · vs llama.cpp top-1 %.4f, "
                "mean |dlogprob| %.5f, greedy %d/%zu\n",
                k ? "spill 8-bit activations" : "spill exact fp32", s->max_dlp_fp32,
                s->dlp_fp32 / (double)s->positions, (double)s->agree_fp32 / (double)s->positions, s->greedy_fp32, NP,
                (double)s->agree_llama / (double)s->positions, s->dlp_llama / (double)s->positions, s->greedy_llama,
                NP);
    }
    CHECK(ex.positions > 3000, "only %ld positions compared", ex.positions);
    CHECK(ex.max_dlp_fp32 <= 1e-4, "exact path vs fp32 reference: max |dlogprob| %.3g > 1e-4", ex.max_dlp_fp32);
    CHECK(ex.greedy_fp32 >= 18, "exact path: only %d/%zu greedy generations match the fp32 reference",
          ex.greedy_fp32, NP);
    CHECK((double)ex.agree_llama / (double)ex.positions >= ref_rate - 0.005,
          "exact path agrees with llama.cpp less than the fp32 reference does");
    CHECK(ex.dlp_llama / (double)ex.positions <= ref_mean + 0.005,
          "exact path is further from llama.cpp than the fp32 reference is");
    model_close(m);
    json_decref(fx);
}

static void test_gemma3(void)
{
    char err[SPILL_ERRLEN], path[4096];
    json_error_t je;
    json_t *fx = json_load_file(GEMMA_FIXTURE, 0, &je);
    CHECK(fx != NULL, "%s: %s", GEMMA_FIXTURE, je.text);
    model_desc *m = NULL;
    int rc = model_resolve("gemma3:270m", path, sizeof path, err, sizeof err);
    if (rc == 0)
        rc = model_open(path, &m, err, sizeof err);
    CHECK(rc == 0, "gemma3:270m must be installed (tools/setup.sh): %s", err);
    if (!fx || rc) {
        model_close(m);
        json_decref(fx);
        return;
    }
    CHECK(m->template_builtin && !strcmp(m->template_builtin, "gemma3"), "gemma3:270m: the built-in template is %s",
          m->template_builtin ? m->template_builtin : "not attached");
    json_t *prompts = json_object_get(fx, "prompts");
    size_t NP = json_array_size(prompts);

    /* prompt ids: the path spill run takes for a chat row (prompt.c) vs llama.cpp's tokens of jinja2's render */
    tokenizer *tok = NULL;
    tmpl_t *tm = NULL;
    CHECK(prompt_open_tokenizer(m, &tok, err, sizeof err) == 0 && prompt_open_template(m, &tm, err, sizeof err) == 0,
          "tokenizer/template: %s", err);
    prompt_src ps = {m, tok, tm};
    int ids_match = 0;
    for (size_t p = 0; tok && tm && p < NP; p++) {
        json_t *pr = json_array_get(prompts, p), *ids = json_object_get(pr, "ids");
        json_t *msgs =
            json_pack("[{s:s,s:s}]", "role", "user", "content", json_string_value(json_object_get(pr, "question")));
        int32_t *mine = NULL;
        size_t nt = 0;
        int n_prompt = (int)json_integer_value(json_object_get(pr, "n_prompt"));
        bool same = prompt_chat(&ps, msgs, NULL, true, 0, NULL, NULL, &mine, &nt, err, sizeof err) == 0 &&
                    (int)nt == n_prompt;
        for (int i = 0; same && i < n_prompt; i++)
            same = mine[i] == json_integer_value(json_array_get(ids, (size_t)i));
        ids_match += same;
        free(mine);
        json_decref(msgs);
    }
    /* a chat row ends at the template's turn end: <end_of_turn> is one special token and in the stop set */
    int32_t *eot = NULL;
    size_t neot = 0;
    bool stops = false;
    if (tok && prompt_text(&ps, "<end_of_turn>", 13, false, &eot, &neot, err, sizeof err) == 0 && neot == 1)
        for (size_t i = 0; i < m->n_stop; i++)
            stops |= m->stop_ids[i] == eot[0];
    CHECK(stops, "gemma3: <end_of_turn> (%zu ids, first %d) is not in the stop set", neot, neot ? eot[0] : -1);
    free(eot);
    template_free(tm);
    tokenizer_free(tok);
    fprintf(stderr, "gemma3: prompt ids identical to llama.cpp: %d/%zu\n", ids_match, NP);
    CHECK(ids_match == (int)NP, "gemma3: template+tokenizer ids differ from llama.cpp on %zu prompts",
          NP - (size_t)ids_match);

    stats ex;
    run(m, prompts, false, false, &ex);
    double rate = ex.positions ? (double)ex.agree_llama / (double)ex.positions : 0,
           mean = ex.positions ? ex.dlp_llama / (double)ex.positions : INFINITY;
    fprintf(stderr, "gemma3 spill default (fp32 activations) vs llama.cpp: top-1 %.4f (%ld/%ld positions; target 0.99), "
                    "mean |dlogprob| %.5f\n",
            rate, ex.agree_llama, ex.positions, mean);
    CHECK(ex.positions > 2500, "gemma3: only %ld positions compared", ex.positions);
    CHECK(rate >= 0.99, "gemma3: top-1 agreement with llama.cpp %.4f < 0.99", rate);
    CHECK(mean <= 0.10, "gemma3: mean |dlogprob| vs llama.cpp %.4f > 0.10", mean);
    model_close(m);
    json_decref(fx);
}

int main(void)
{
    test_gemma3();
    test_smollm2();
    return test_finish("test_llamacpp");
}
