/*
 * test_distill.c — teacher forcing end to end through the real binary (build/asan/spill, or $SPILL_BIN):
 * completions `echo`, `spill distill --score`, `--logprobs K` beyond OpenAI's 20, `--full-logits`.
 *
 *   - echo log-probs vs transformers: every tiny reference model (tests/data/ref/<name>/, with a byte-level
 *     256-token tokenizer beside it) runs each reference sequence as a token-id prompt with echo, max_tokens
 *     0 and logprobs 0, in 7-token prompt chunks so that scored chunks split and mix; every prompt token after
 *     the first must have log_softmax(transformers' logits at the position before)[token].  Tolerance 1e-4,
 *     decided before looking: the CPU engine's logits sit within 1.5e-5 of transformers' on these models
 *     (test_forward), a log-softmax of V = 256 terms adds at most a few float32 ulps of the log-sum-exp, and
 *     the output rounds each log-prob to the float32 it was.
 *   - --score vs echo, bit for bit (one backend, one code path: the scored token's log-prob from the same
 *     prefill logits): score rows on tiny-smollm2 (its chat template), then the same prompt + answer ids as
 *     echo rows — each answer log-prob equal as a float32, under different batch sizes and chunking.
 *   - --full-logits: the .npy files numpy would read (header, shape answer tokens x V, float16), whose
 *     log-softmax at each answer id is within 0.02 of the row's log-prob: float16 keeps 11 significant bits,
 *     so logits of magnitude <= 32 are off by <= 2^-6 each and a log-softmax by at most twice that.
 *   - distill --logprobs 30: 20 top_logprobs (OpenAI's shape) and 10 in more_top_logprobs, descending,
 *     the 30 best of the vocabulary; --max-logits-bytes below the job's size refuses it up front (exit 2, a
 *     sentence, no job left).
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "ref.h"
#include "test.h"

#define TINY "tests/data/tiny/tiny-smollm2.gguf"

/* Every line, each of which must parse. */
static json_t *read_checked(const char *path)
{
    int bad = 0;
    json_t *a = read_lines_n(path, &bad);
    CHECK(bad == 0, "%s: %d lines are not JSON", path, bad);
    return a;
}

static json_t *completion_logprobs(json_t *line)
{
    json_t *ch = json_array_get(json_object_get(json_object_get(json_object_get(line, "response"), "body"),
                                                "choices"),
                                0);
    return json_object_get(ch, "logprobs");
}

/* ---------------------------------------------------------------- echo vs transformers */

static double echo_vs_reference(const char *name, const char *tmp, int *compared)
{
    char dir[1024], path[1600];
    snprintf(dir, sizeof dir, "%s/model-%s", tmp, name);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char src[1200], dst[1200], abs[4096];
        snprintf(src, sizeof src, "tests/data/ref/%s/%s", name, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        CHECK(realpath(src, abs) != NULL && symlink(abs, dst) == 0, "%s: cannot link %s", name, src);
    }
    char tabs[4096], tdst[1200];
    snprintf(tdst, sizeof tdst, "%s/tokenizer.json", dir);
    CHECK(realpath("tests/data/ref/tokenizer_bytes256.json", tabs) && symlink(tabs, tdst) == 0, "tokenizer link");

    ref_row rows[REF_MAXROWS];
    uint32_t nr = 0, V = 0;
    snprintf(path, sizeof path, "tests/data/ref/%s/ref.bin", name);
    if (ref_load(path, rows, &nr, &V)) {
        CHECK(0, "%s: cannot read %s", name, path);
        return INFINITY;
    }
    char in[1200], job[1300];
    snprintf(in, sizeof in, "%s/echo-%s.jsonl", tmp, name);
    snprintf(job, sizeof job, "%s/job-%s", tmp, name);
    FILE *f = fopen(in, "w");
    for (uint32_t r = 0; r < nr; r++) {
        fprintf(f, "{\"custom_id\":\"r%u\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\","
                   "\"prompt\":[",
                r);
        for (uint32_t i = 0; i < rows[r].n_total; i++)
            fprintf(f, "%s%d", i ? "," : "", rows[r].ids[i]);
        fprintf(f, "],\"max_tokens\":0,\"echo\":true,\"logprobs\":0}}\n");
    }
    fclose(f);
    int rc = sh("%s run %s %s -o %s --cpu --prefill-chunk 7 --batch 2 --quiet >/dev/null 2>%s/err-%s.txt", bin(), dir,
                in, job, tmp, name);
    CHECK(rc == 0, "%s: spill run exit %d (see %s/err-%s.txt)", name, rc, tmp, name);
    snprintf(path, sizeof path, "%s/results.jsonl", job);
    json_t *lines = read_checked(path);
    double worst = 0;
    for (uint32_t r = 0; r < nr; r++) {
        char id[16];
        snprintf(id, sizeof id, "r%u", r);
        json_t *lp = completion_logprobs(by_id(lines, id));
        json_t *tl = json_object_get(lp, "token_logprobs");
        CHECK(json_array_size(tl) == rows[r].n_total, "%s row %u: %zu token log-probs for %u tokens", name, r,
              json_array_size(tl), rows[r].n_total);
        CHECK(json_is_null(json_array_get(tl, 0)), "%s row %u: the first prompt token has a log-prob", name, r);
        for (uint32_t i = 1; i < rows[r].n_total && i < json_array_size(tl); i++) {
            double want = ref_logprob(rows[r].logits + (size_t)(i - 1) * V, (int)V, rows[r].ids[i]);
            double got = json_number_value(json_array_get(tl, i));
            double d = fabs(got - want);
            worst = d > worst ? d : worst;
            (*compared)++;
        }
    }
    json_decref(lines);
    ref_free(rows, nr);
    return worst;
}

static void test_echo_reference(const char *tmp)
{
    DIR *d = opendir("tests/data/ref");
    CHECK(d != NULL, "tests/data/ref");
    struct dirent *e;
    int models = 0, compared = 0;
    double worst = 0;
    while (d && (e = readdir(d))) {
        char cfg[600];
        snprintf(cfg, sizeof cfg, "tests/data/ref/%s/ref.bin", e->d_name);
        if (e->d_name[0] == '.' || access(cfg, R_OK))
            continue;
        /* longrope picks its table per pass (first position + tokens > original_max_position_embeddings), as
         * transformers' incremental generation does and its recorded reference follows (gen_ref_models.py's
         * INCREMENTAL); a whole sequence echoed in 7-token chunks crosses the switch mid-prompt, where the
         * reference's prompt forward used the long table throughout.  test_forward checks it on its schedule. */
        if (!strcmp(e->d_name, "phi3_longrope_partial"))
            continue;
        double w = echo_vs_reference(e->d_name, tmp, &compared);
        CHECK(w <= 1e-4, "%s: echo log-probs differ from transformers by %.3g (bound 1e-4)", e->d_name, w);
        worst = w > worst ? w : worst;
        models++;
    }
    if (d)
        closedir(d);
    CHECK(models >= 10, "only %d reference models", models);
    fprintf(stderr, "echo vs transformers fp32: %d models, %d prompt-token log-probs, max |d| %.2e (bound 1e-4)\n",
            models, compared, worst);
}

/* ---------------------------------------------------------------- --score vs echo, --full-logits */

static const char *const SCORE_ROWS[] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"},{\"role\":\"assistant\",\"content\":\"2+2 is "
    "4.\"}]}",
    "{\"custom_id\":\"b/2\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"x\","
    "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Name a "
    "colour.\"},{\"role\":\"assistant\",\"content\":\"Blue, like the sky over the sea on a clear summer "
    "morning.\"}]}}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Count.\"},{\"role\":\"assistant\",\"content\":\"one two three "
    "four five six seven eight nine ten eleven twelve\"},{\"role\":\"user\",\"content\":\"More.\"},{\"role\":"
    "\"assistant\",\"content\":\"thirteen fourteen\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"no answer here\"}]}",
};

/* Reads a float16 .npy of shape (rows, V): 0 and the data (malloc'd floats), or -1. */
static int read_npy(const char *path, int64_t *rows, int64_t *V, float **out)
{
    char *buf, err[SPILL_ERRLEN];
    size_t len;
    if (util_read_file(path, 512u << 20, &buf, &len, err, sizeof err))
        return -1;
    int rc = -1;
    if (len >= 128 && !memcmp(buf, "\x93NUMPY\x01\x00", 8)) {
        size_t hl = (unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8;
        long long a, b;
        char *sp = strstr(buf + 10, "'shape': (");
        if (hl + 10 == 128 && strstr(buf + 10, "'descr': '<f2'") && sp && sscanf(sp, "'shape': (%lld, %lld)", &a, &b) == 2 &&
            len == 128 + (size_t)(a * b * 2)) {
            *rows = a, *V = b;
            *out = malloc((size_t)(a * b) * sizeof **out + 1);
            const uint16_t *h = (const uint16_t *)(buf + 128);
            for (long long i = 0; i < a * b; i++) {
                uint16_t x = h[i];
                int e = (x >> 10) & 31, m = x & 1023;
                double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
                (*out)[i] = (float)((x & 0x8000) ? -v : v);
            }
            rc = 0;
        }
    }
    free(buf);
    return rc;
}

static void test_score(const char *tmp)
{
    char in[1200], job[1200], path[1500];
    snprintf(in, sizeof in, "%s/score.jsonl", tmp);
    FILE *f = fopen(in, "w");
    for (size_t i = 0; i < sizeof SCORE_ROWS / sizeof *SCORE_ROWS; i++)
        fprintf(f, "%s\n", SCORE_ROWS[i]);
    fclose(f);
    /* two settings: one row at a time in big chunks, and small chunks mixing rows */
    json_t *runs[2];
    for (int v = 0; v < 2; v++) {
        snprintf(job, sizeof job, "%s/score-%d", tmp, v);
        int rc = sh("%s distill %s %s --score --logprobs 3 %s -o %s --quiet >/dev/null 2>%s/score-%d.err", bin(), TINY,
                    in, v ? "--prefill-chunk 5 --batch 4" : "--batch 1 --full-logits", job, tmp, v);
        CHECK(rc == 0, "spill distill --score: exit %d", rc);
        snprintf(path, sizeof path, "%s/results.jsonl", job);
        runs[v] = read_checked(path);
        CHECK(json_array_size(runs[v]) == 3, "--score: %zu score lines, want 3", json_array_size(runs[v]));
        snprintf(path, sizeof path, "%s/errors.jsonl", job);
        json_t *errs = read_checked(path);
        json_t *e0 = json_array_get(errs, 0);
        const char *msg = json_string_value(json_object_get(
            json_object_get(json_object_get(json_object_get(e0, "response"), "body"), "error"), "message"));
        CHECK(json_array_size(errs) == 1 && msg && strstr(msg, "final assistant message"),
              "--score: the row without an answer is not refused with a sentence");
        json_decref(errs);
    }
    /* the same scores whatever the batch and chunking */
    size_t i;
    json_t *o;
    json_array_foreach(runs[0], i, o)
    {
        const char *id = json_string_value(json_object_get(o, "custom_id"));
        json_t *other = by_id(runs[1], id);
        CHECK(other && json_equal(json_object_get(o, "score"), json_object_get(other, "score")),
              "row %s: scores differ between batch 1 and batch 4 with 5-token chunks", id);
    }
    /* echo of prompt + answer ids: bit-identical log-probs at the answer's positions */
    snprintf(in, sizeof in, "%s/score-echo.jsonl", tmp);
    f = fopen(in, "w");
    json_array_foreach(runs[0], i, o)
    {
        json_t *sc = json_object_get(o, "score");
        fprintf(f, "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"x\","
                   "\"prompt\":[",
                json_string_value(json_object_get(o, "custom_id")));
        size_t k;
        json_t *v;
        int first = 1;
        json_array_foreach(json_object_get(sc, "prompt_ids"), k, v) fprintf(f, "%s%lld", first ? "" : ",",
                                                                              (long long)json_integer_value(v)),
            first = 0;
        json_array_foreach(json_object_get(sc, "answer_ids"), k, v) fprintf(f, ",%lld", (long long)json_integer_value(v));
        fprintf(f, "],\"max_tokens\":0,\"echo\":true,\"logprobs\":3}}\n");
    }
    fclose(f);
    snprintf(job, sizeof job, "%s/score-echo", tmp);
    CHECK(sh("%s run %s %s -o %s --quiet >/dev/null 2>&1", bin(), TINY, in, job) == 0, "echo run");
    snprintf(path, sizeof path, "%s/results.jsonl", job);
    json_t *echo = read_checked(path);
    int same = 0, total = 0;
    json_array_foreach(runs[0], i, o)
    {
        json_t *sc = json_object_get(o, "score"), *lps = json_object_get(sc, "logprobs");
        size_t np = json_array_size(json_object_get(sc, "prompt_ids")), na = json_array_size(lps);
        json_t *tl = json_object_get(completion_logprobs(by_id(echo, json_string_value(json_object_get(o, "custom_id")))),
                                     "token_logprobs");
        CHECK(json_array_size(tl) == np + na, "echo of row %zu: %zu log-probs, want %zu", i, json_array_size(tl), np + na);
        double sum = 0;
        for (size_t k = 0; k < na; k++) {
            float a = (float)json_number_value(json_array_get(lps, k)),
                  b = (float)json_number_value(json_array_get(tl, np + k));
            same += a == b;
            total++;
            sum += a;
        }
        CHECK(fabs(json_number_value(json_object_get(sc, "sum")) - sum) <= 1e-4 * fmax(1, fabs(sum)),
              "row %zu: sum %.9g is not the sum of its log-probs %.9g", i, json_number_value(json_object_get(sc, "sum")),
              sum);
        CHECK(fabs(json_number_value(json_object_get(sc, "mean")) * (double)na - sum) <= 1e-4 * fmax(1, fabs(sum)),
              "row %zu: mean is not sum / answer tokens", i);
        CHECK(json_array_size(json_object_get(sc, "answer_tokens")) == na &&
                  json_array_size(json_object_get(sc, "top_logprobs")) == na,
              "row %zu: answer_tokens / top_logprobs lengths", i);
        /* the answer ends with the end-of-turn token */
        const char *lastt = json_string_value(json_array_get(json_object_get(sc, "answer_tokens"), na - 1));
        CHECK(lastt && !strcmp(lastt, "<|im_end|>"), "row %zu: the answer ends with %s, not <|im_end|>", i,
              lastt ? lastt : "(none)");
    }
    CHECK(same == total && total > 20, "--score vs echo: %d of %d answer log-probs bit-identical", same, total);
    fprintf(stderr, "--score vs echo of the same ids: %d of %d answer log-probs bit-identical; batch 1 == batch 4\n",
            same, total);
    json_decref(echo);

    /* --full-logits of the batch-1 run: numpy's files, consistent with the scores */
    double worst = 0;
    int files = 0;
    json_array_foreach(runs[0], i, o)
    {
        const char *id = json_string_value(json_object_get(o, "custom_id"));
        json_t *sc = json_object_get(o, "score");
        const char *name = !strcmp(id, "row-1") ? "row-1" : !strcmp(id, "row-3") ? "row-3" : NULL;
        char np[1400];
        if (name)
            snprintf(np, sizeof np, "%s/score-0/logits/%s.npy", tmp, name);
        else { /* "b/2": '/' is not kept, so a hash follows */
            char cmd[1600];
            snprintf(cmd, sizeof cmd, "ls %s/score-0/logits/ | grep '^b_2-[0-9a-f]\\{16\\}\\.npy$' > %s/np.txt", tmp, tmp);
            CHECK(system(cmd) == 0, "row b/2 has no logits file named b_2-<hash>.npy");
            char nm[256] = "", lp[1300];
            snprintf(lp, sizeof lp, "%s/np.txt", tmp);
            FILE *g = fopen(lp, "r");
            if (g && fscanf(g, "%255s", nm) != 1)
                nm[0] = 0;
            if (g)
                fclose(g);
            snprintf(np, sizeof np, "%s/score-0/logits/%s", tmp, nm);
        }
        int64_t rows = 0, V = 0;
        float *lg = NULL;
        CHECK(read_npy(np, &rows, &V, &lg) == 0, "%s: not a float16 .npy", np);
        json_t *aids = json_object_get(sc, "answer_ids"), *lps = json_object_get(sc, "logprobs");
        CHECK(rows == (int64_t)json_array_size(aids) && V == 49152, "%s: shape (%lld, %lld)", np, (long long)rows,
              (long long)V);
        for (int64_t r = 0; lg && r < rows && r < (int64_t)json_array_size(aids); r++) {
            double d = fabs(ref_logprob(lg + r * V, (int)V, (int)json_integer_value(json_array_get(aids, (size_t)r))) -
                            json_number_value(json_array_get(lps, (size_t)r)));
            worst = d > worst ? d : worst;
        }
        free(lg);
        files++;
    }
    CHECK(files == 3 && worst <= 0.02, "--full-logits: %d files, log-probs from the float16 logits off by %.3g", files,
          worst);
    fprintf(stderr, "--full-logits: %d .npy files, log-softmax of the float16 logits within %.4f of the scores\n",
            files, worst);
    json_decref(runs[0]);
    json_decref(runs[1]);
}

/* ---------------------------------------------------------------- --logprobs 30, the size cap */

static void test_logprobs_k(const char *tmp)
{
    char in[1200], job[1200], path[1500];
    snprintf(in, sizeof in, "%s/gen.jsonl", tmp);
    FILE *f = fopen(in, "w");
    fprintf(f, "{\"custom_id\":\"g1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"x\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"}],\"max_tokens\":6,\"temperature\":0}}\n"
               "{\"custom_id\":\"g2\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"x\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":5,\"temperature\":0.8,\"seed\":4}}\n");
    fclose(f);
    snprintf(job, sizeof job, "%s/k30", tmp);
    CHECK(sh("%s distill %s %s --logprobs 30 -o %s --quiet >/dev/null 2>&1", bin(), TINY, in, job) == 0,
          "distill --logprobs 30");
    snprintf(path, sizeof path, "%s/results.jsonl", job);
    json_t *lines = read_checked(path);
    int tokens = 0;
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o)
    {
        json_t *body = json_object_get(json_object_get(o, "response"), "body");
        json_t *ch0 = json_array_get(json_object_get(body, "choices"), 0);
        json_t *content = json_object_get(json_object_get(ch0, "logprobs"), "content");
        size_t k;
        json_t *t;
        json_array_foreach(content, k, t)
        {
            json_t *top = json_object_get(t, "top_logprobs"), *more = json_object_get(t, "more_top_logprobs");
            CHECK(json_array_size(top) == 20 && json_array_size(more) == 10, "token %zu: %zu + %zu alternatives", k,
                  json_array_size(top), json_array_size(more));
            double prev = INFINITY;
            bool desc = true, chosen = false;
            for (size_t a = 0; a < 30; a++) {
                json_t *alt = a < 20 ? json_array_get(top, a) : json_array_get(more, a - 20);
                double lp = json_number_value(json_object_get(alt, "logprob"));
                desc &= lp <= prev;
                prev = lp;
                chosen |= json_equal(json_object_get(alt, "token"), json_object_get(t, "token"));
            }
            CHECK(desc, "token %zu: the 30 alternatives are not in descending order", k);
            if (i == 0) /* greedy: the chosen token is the best alternative */
                CHECK(chosen, "greedy token %zu is not among its alternatives", k);
            tokens++;
        }
    }
    CHECK(tokens == 11, "%d tokens with log-probs, want 11", tokens);
    json_decref(lines);
    /* a cap below the job's logits: refused before a job exists */
    snprintf(job, sizeof job, "%s/capped", tmp);
    snprintf(path, sizeof path, "%s/capped.err", tmp);
    int rc = sh("%s distill %s %s --full-logits --max-logits-bytes 100K -o %s --quiet >/dev/null 2>%s", bin(), TINY,
                in, job, path);
    char msg[2048] = "";
    f = fopen(path, "r");
    if (f) {
        size_t n = fread(msg, 1, sizeof msg - 1, f);
        msg[n] = 0;
        fclose(f);
    }
    CHECK(rc == 2 && strstr(msg, "--max-logits-bytes") && strstr(msg, " MB"), "the cap: exit %d, %s", rc, msg);
    CHECK(access(job, F_OK) != 0, "a refused distill job left %s behind", job);
    /* bad distill options: one sentence, exit 2, no job */
    static const char *const bad[][2] = {{"--logprobs 65", "0 to 64"},
                                         {"--logprobs x", "whole number"},
                                         {"--max-logits-bytes 12Q", "size in bytes"}};
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
        rc = sh("%s distill %s %s %s -o %s --quiet >/dev/null 2>%s", bin(), TINY, in, bad[b][0], job, path);
        f = fopen(path, "r");
        msg[0] = 0;
        if (f) {
            size_t n = fread(msg, 1, sizeof msg - 1, f);
            msg[n] = 0;
            fclose(f);
        }
        CHECK(rc == 2 && strstr(msg, bad[b][1]) && access(job, F_OK) != 0, "distill %s: exit %d, %s", bad[b][0], rc,
              msg);
    }
    /* rows --score and --full-logits cannot take fail alone, with a sentence */
    snprintf(in, sizeof in, "%s/badrows.jsonl", tmp);
    f = fopen(in, "w");
    fprintf(f, "{\"custom_id\":\"c1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"x\","
               "\"prompt\":\"hi\",\"max_tokens\":2}}\n"
               "{\"custom_id\":\"n2\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"x\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}],"
               "\"n\":2}}\n");
    fclose(f);
    snprintf(job, sizeof job, "%s/badrows", tmp);
    rc = sh("%s distill %s %s --score --full-logits -o %s --quiet >/dev/null 2>&1", bin(), TINY, in, job);
    snprintf(path, sizeof path, "%s/errors.jsonl", job);
    json_t *errs = read_checked(path);
    char *all = json_dumps(errs, 0);
    CHECK(rc == 0 && json_array_size(errs) == 2 && all && strstr(all, "completions request") &&
              strstr(all, "n = 2 choices"),
          "--score --full-logits: a completions row and an n = 2 row: exit %d, %.400s", rc, all ? all : "");
    free(all);
    json_decref(errs);
    fprintf(stderr, "--logprobs 30: %d tokens with 20 + 10 alternatives; --max-logits-bytes refuses with: %.200s", tokens,
            msg);
}

/* vLLM's top_k 1 and min_p 1 at temperature 1 keep only the argmax, so they answer as greedy does; top_k -2 is
 * refused alone. */
static void test_top_k(const char *tmp)
{
    char in[1200], job[1200], path[1500];
    snprintf(in, sizeof in, "%s/topk.jsonl", tmp);
    FILE *f = fopen(in, "w");
    static const char *const how[3] = {"\"temperature\":0", "\"temperature\":1.0,\"top_k\":1",
                                       "\"temperature\":1.0,\"min_p\":1.0"};
    for (int i = 0; i < 3; i++)
        fprintf(f, "{\"custom_id\":\"k%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                   "\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about rivers\"}],\"max_tokens\":12,"
                   "%s}}\n",
                i, how[i]);
    fprintf(f, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"x\","
               "\"prompt\":\"a\",\"top_k\":-2}}\n");
    fclose(f);
    snprintf(job, sizeof job, "%s/topk", tmp);
    CHECK(sh("%s run %s %s -o %s --quiet >/dev/null 2>&1", bin(), TINY, in, job) == 0, "top_k run");
    snprintf(path, sizeof path, "%s/results.jsonl", job);
    json_t *lines = read_checked(path);
    const char *a[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        json_t *l = by_id(lines, id);
        json_t *ch = json_array_get(json_object_get(json_object_get(json_object_get(l, "response"), "body"), "choices"),
                                    0);
        a[i] = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    }
    CHECK(a[0] && a[1] && !strcmp(a[0], a[1]), "top_k 1 at temperature 1 answered \"%s\", greedy \"%s\"",
          a[1] ? a[1] : "", a[0] ? a[0] : "");
    CHECK(a[0] && a[2] && !strcmp(a[0], a[2]), "min_p 1 at temperature 1 answered \"%s\", greedy \"%s\"",
          a[2] ? a[2] : "", a[0] ? a[0] : "");
    snprintf(path, sizeof path, "%s/errors.jsonl", job);
    json_t *errs = read_checked(path);
    char *all = json_dumps(errs, 0);
    CHECK(json_array_size(errs) == 1 && all && strstr(all, "body.top_k"), "top_k -2: %s", all ? all : "");
    free(all);
    json_decref(errs);
    json_decref(lines);
}

int main(void)
{
    char tmp[] = "/tmp/spill-test-distill-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    test_echo_reference(tmp);
    test_score(tmp);
    test_logprobs_k(tmp);
    test_top_k(tmp);
    if (!test_failures)
        sh("rm -rf %s", tmp);
    return test_finish("test_distill");
}
