/*
 * test_embed.c — /v1/embeddings rows on the tiny fixture model (tests/data/tiny/tiny-smollm2.gguf, D = 32):
 *   1. request parsing of every input shape (string, [string], [int], [[int]]) with encoding_format and
 *      dimensions, and bad shapes each failing their row with one sentence in errors.jsonl;
 *   2. a job mixing embedding rows with chat rows: the chat answers equal the same rows run without them;
 *   3. embeddings equal to tools/gen_embed_ref.py's (tests/data/embed/tiny_ref.json: an independent numpy fp32
 *      forward stopped at the output norm, pooled there), last-token (the default: the model has no embedding
 *      metadata) and --pooling mean, one input longer than a prefill chunk;
 *   4. mean and last differ (and agree on a one-token input), every vector has unit norm, base64 decodes to the
 *      float list's very values, dimensions truncates and renormalises under --matryoshka and fails the row
 *      without it (or above D), an input over the context fails with context_length_exceeded;
 *   5. batch invariance: an input alone and as one of 8 in a row gives the same vector;
 *   6. the pooling a model's files ask for: a sentence-transformers layout (mean / last / Normalize, refusals)
 *      and a GGUF's llama.pooling_type (a copy of the tiny model with the key = 1 embeds as the mean reference);
 *   7. `spill resume` of the finished job answers nothing twice; the openai types accept every line (.venv);
 *   8. mpirun -np 2 (an MPI build with mpirun): rank 0 answers the embedding rows, the same vectors, every row once.
 *
 * Tolerances, decided before the first run:
 *   - against the numpy reference: 1e-4 absolute per component of the unit vector.  Both sides run fp32
 *     activations on the same dequantized weights and differ only in summation order (numpy's BLAS vs spill's
 *     fixed-order kernels), ~1e-7 relative per op over 2 layers; the logits references of 15 tiny models measure
 *     ≈ 3e-6 under the same threshold.  A wrong pooling, a missed output norm or an off-by-one position moves
 *     components by 1e-2 or more, so 1e-4 still catches every such bug.
 *   - batch invariance and base64: exact (0).  engine.h promises a row's numbers never depend on the rows that
 *     share its pass (fixed summation order per output element; attention reads the row's own pages), the mean
 *     adds positions in order, and the float list is printed with 9 significant digits, which round-trips float32.
 *   - unit norm: |‖v‖ − 1| ≤ 1e-5 (float32 rounding of D = 32 components, each ≤ 6e-8 relative).
 *   - truncation: each of the 8 components within 1e-6 of the full vector's first 8 renormalised in double.
 */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batch/embed.h"
#include "batch/request.h"
#include "cli.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"
#define D 32

static char tmp[] = "/tmp/spill_test_embed_XXXXXX";

/* ---------------------------------------------------------------- helpers */

static void emb_line(FILE *f, const char *id, const char *input_json, const char *extra)
{
    fprintf(f, "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"model\":\"m\","
               "\"input\":%s%s}}\n", id, input_json, extra);
}

static void chat_line(FILE *f, const char *id, const char *text)
{
    fprintf(f, "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":8,\"temperature\":0}}\n", id, text);
}

static json_t *body_of(json_t *lines, const char *id)
{
    return json_object_get(json_object_get(by_id(lines, id), "response"), "body");
}

/* Embedding i of a row's body as floats (float list or base64); the count, -1 when absent or malformed. */
static int decode_b64(const char *s, unsigned char *out, int cap)
{
    int n = 0, bits = 0;
    uint32_t acc = 0;
    for (; *s && *s != '='; s++) {
        const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", *p = strchr(A, *s);
        if (!p)
            return -1;
        acc = acc << 6 | (uint32_t)(p - A), bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n == cap)
                return -1;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

static int vec_of(json_t *body, size_t i, float *v, int cap)
{
    json_t *e = json_object_get(json_array_get(json_object_get(body, "data"), i), "embedding");
    if (json_is_array(e)) {
        int n = (int)json_array_size(e);
        for (int k = 0; k < n && k < cap; k++)
            v[k] = (float)json_number_value(json_array_get(e, (size_t)k));
        return n <= cap ? n : -1;
    }
    if (!json_is_string(e))
        return -1;
    unsigned char b[4 * 64];
    int nb = decode_b64(json_string_value(e), b, (int)sizeof b);
    if (nb < 0 || nb % 4 || nb / 4 > cap)
        return -1;
    for (int k = 0; k < nb / 4; k++) {
        uint32_t u = (uint32_t)b[4 * k] | (uint32_t)b[4 * k + 1] << 8 | (uint32_t)b[4 * k + 2] << 16 |
                     (uint32_t)b[4 * k + 3] << 24;
        memcpy(&v[k], &u, 4);
    }
    return nb / 4;
}

static double norm(const float *v, int n)
{
    double s = 0;
    for (int k = 0; k < n; k++)
        s += (double)v[k] * v[k];
    return sqrt(s);
}

static const char *err_msg(json_t *errs, const char *id)
{
    return json_string_value(json_object_get(
        json_object_get(json_object_get(json_object_get(by_id(errs, id), "response"), "body"), "error"), "message"));
}

static const char *err_code(json_t *errs, const char *id)
{
    return json_string_value(json_object_get(
        json_object_get(json_object_get(json_object_get(by_id(errs, id), "response"), "body"), "error"), "code"));
}

/* One sentence: ends with '.', holds no line break. */
static bool one_sentence(const char *m)
{
    size_t n = m ? strlen(m) : 0;
    return n > 10 && m[n - 1] == '.' && !strchr(m, '\n');
}

static int run_job(const char *in, const char *out, const char *opts)
{
    return sh("%s run %s %s -o %s --quiet %s > %s.log 2>&1", bin(), MODEL, in, out, opts, out);
}

/* ---------------------------------------------------------------- 1. parsing */

static void parse_shapes(void)
{
    static const struct {
        const char *input, *extra;
        size_t n;
        bool b64;
        long long dims;
    } ok[] = {
        {"\"hello\"", "", 1, false, 0},
        {"[\"a\",\"b\",\"c\"]", ",\"encoding_format\":\"base64\"", 3, true, 0},
        {"[1,2,3]", ",\"dimensions\":8,\"encoding_format\":\"float\"", 1, false, 8},
        {"[[1,2],[3],[4,5,6]]", ",\"dimensions\":null,\"user\":\"u\"", 3, false, 0},
        {"[\"one\"]", "", 1, false, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char line[512], err[512];
        snprintf(line, sizeof line, "{\"custom_id\":\"x\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":"
                                    "{\"model\":\"m\",\"input\":%s%s}}", ok[i].input, ok[i].extra);
        request q;
        int rc = request_parse_line(line, strlen(line), 1, "in.jsonl", &q, err, sizeof err);
        CHECK(rc == 0, "input %s%s refused: %s", ok[i].input, ok[i].extra, err);
        CHECK(rc || (q.endpoint == REQ_EP_EMBEDDINGS && q.n_prompts == ok[i].n && q.emb_base64 == ok[i].b64 &&
                     q.emb_dims == ok[i].dims && q.prompt),
              "input %s: endpoint %d, %zu inputs (want %zu), base64 %d, dims %lld", ok[i].input, q.endpoint,
              q.n_prompts, ok[i].n, q.emb_base64, (long long)q.emb_dims);
        request_free(&q);
    }
}

/* ---------------------------------------------------------------- 6. the model's pooling */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A sentence-transformers layout in dir with this pooling config and (or not) a Normalize module. */
static void st_layout(const char *dir, const char *pool_cfg, bool normalize, const char *extra_module)
{
    char p[700];
    sh("rm -rf %s && mkdir -p %s/1_Pooling", dir, dir);
    snprintf(p, sizeof p, "%s/modules.json", dir);
    char mods[1024];
    snprintf(mods, sizeof mods,
             "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
             "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"}%s%s]",
             normalize ? ",{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":"
                         "\"sentence_transformers.models.Normalize\"}" : "",
             extra_module ? extra_module : "");
    write_file(p, mods);
    snprintf(p, sizeof p, "%s/1_Pooling/config.json", dir);
    write_file(p, pool_cfg);
}

/* A copy of the tiny model at dst with llama.pooling_type = pt added (every other key and tensor as they are).
 * 0, or -1 with a sentence. */
static int gguf_with_pooling(const char *dst, uint32_t pt, char *err, size_t errlen)
{
    gguf_file *g;
    gguf_w *w = NULL;
    if (gguf_open(MODEL, &g, err, errlen))
        return -1;
    int rc = gguf_w_new((uint32_t)g->alignment, &w, err, errlen);
    for (uint64_t i = 0; !rc && i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, "general.alignment"))
            rc = gguf_w_copy_kv(w, g, &g->kv[i], err, errlen);
    if (!rc)
        rc = gguf_w_u32(w, "llama.pooling_type", pt, err, errlen);
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++)
        rc = gguf_w_tensor(w, g->tensors[i].name, g->tensors[i].n_dims, g->tensors[i].ne, g->tensors[i].type, err,
                           errlen) < 0;
    uint8_t *hdr = NULL;
    size_t hl = 0;
    FILE *f = NULL;
    if (!rc)
        rc = gguf_w_header(w, &hdr, &hl, err, errlen);
    if (!rc && !(f = fopen(dst, "wb")))
        rc = -1, snprintf(err, errlen, "cannot create %.400s", dst);
    if (!rc && fwrite(hdr, 1, hl, f) != hl)
        rc = -1;
    uint64_t end = hl;
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (fseek(f, (long)gguf_w_tensor_offset(w, (int)i), SEEK_SET) ||
            fwrite(gguf_tensor_data(g, t), 1, t->size, f) != t->size)
            rc = -1, snprintf(err, errlen, "cannot write %.400s", dst);
        end = gguf_w_tensor_offset(w, (int)i) + t->size;
    }
    /* the padding after the last tensor, when it does not end aligned */
    if (!rc && end < gguf_w_file_size(w) && (fseek(f, (long)gguf_w_file_size(w) - 1, SEEK_SET) || fputc(0, f) == EOF))
        rc = -1;
    if (f && fclose(f))
        rc = -1;
    free(hdr);
    gguf_w_free(w);
    gguf_close(g);
    return rc;
}

static void model_pooling(void)
{
    model_desc *m;
    char err[512], dir[600];
    if (model_open(MODEL, &m, err, sizeof err)) {
        CHECK(0, "cannot open %s: %s", MODEL, err);
        return;
    }
    embed_cfg c;
    CHECK(embed_cfg_from_model(m, MODEL, NULL, false, &c, err, sizeof err) == 0 && c.pool == EMBED_POOL_LAST &&
              c.normalize && !c.refuse[0] && !c.matryoshka,
          "the tiny GGUF (no pooling_type) pools %s, normalize %d: want last, normalised", embed_pool_name(c.pool),
          c.normalize);
    CHECK(embed_cfg_from_model(m, MODEL, "mean", true, &c, err, sizeof err) == 0 && c.pool == EMBED_POOL_MEAN &&
              c.matryoshka && strstr(c.source, "--pooling"),
          "--pooling mean is not taken (%s, %s)", embed_pool_name(c.pool), c.source);
    snprintf(dir, sizeof dir, "%s/st", tmp);
    st_layout(dir, "{\"word_embedding_dimension\":32,\"pooling_mode_mean_tokens\":true,\"pooling_mode_cls_token\":false}",
              true, NULL);
    CHECK(embed_cfg_from_model(m, dir, NULL, false, &c, err, sizeof err) == 0 && c.pool == EMBED_POOL_MEAN &&
              c.normalize && !c.refuse[0],
          "a mean + Normalize layout gives %s, normalize %d, refuse '%s' (%s)", embed_pool_name(c.pool), c.normalize,
          c.refuse, err);
    st_layout(dir, "{\"pooling_mode_lasttoken\":true}", false, NULL);
    CHECK(embed_cfg_from_model(m, dir, NULL, false, &c, err, sizeof err) == 0 && c.pool == EMBED_POOL_LAST &&
              !c.normalize && !c.refuse[0],
          "a last-token layout without Normalize gives %s, normalize %d", embed_pool_name(c.pool), c.normalize);
    st_layout(dir, "{\"pooling_mode_max_tokens\":true}", true, NULL);
    CHECK(embed_cfg_from_model(m, dir, NULL, false, &c, err, sizeof err) == 0 && one_sentence(c.refuse) &&
              strstr(c.refuse, "pooling_mode_max_tokens"),
          "max pooling is not refused with a sentence: '%s'", c.refuse);
    CHECK(embed_cfg_from_model(m, dir, "last", false, &c, err, sizeof err) == 0 && !c.refuse[0] &&
              c.pool == EMBED_POOL_LAST,
          "--pooling last does not lift the max-pooling refusal: '%s'", c.refuse);
    st_layout(dir, "{\"pooling_mode_mean_tokens\":true}", true,
              ",{\"idx\":3,\"name\":\"3\",\"path\":\"3_Dense\",\"type\":\"sentence_transformers.models.Dense\"}");
    CHECK(embed_cfg_from_model(m, dir, "mean", false, &c, err, sizeof err) == 0 && one_sentence(c.refuse) &&
              strstr(c.refuse, "Dense"),
          "a Dense module is not refused (even with --pooling): '%s'", c.refuse);
    char mp[700];
    snprintf(mp, sizeof mp, "%s/modules.json", dir);
    write_file(mp, "[{\"idx\":0,");
    CHECK(embed_cfg_from_model(m, dir, NULL, false, &c, err, sizeof err) == -1 && strstr(err, "modules.json"),
          "a broken modules.json is not an error naming it: %s", err);
    model_close(m);
    /* a GGUF's pooling_type: 1 mean, 4 a reranker (refused) */
    static const struct {
        uint32_t pt;
        embed_pool pool;
        bool refused;
    } gk[] = {{1, EMBED_POOL_MEAN, false}, {2, EMBED_POOL_CLS, false}, {3, EMBED_POOL_LAST, false},
              {4, EMBED_POOL_LAST, true}};
    for (size_t i = 0; i < sizeof gk / sizeof gk[0]; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/pool%u.gguf", tmp, gk[i].pt);
        if (gguf_with_pooling(path, gk[i].pt, err, sizeof err) || model_open(path, &m, err, sizeof err)) {
            CHECK(0, "cannot write or open %s: %s", path, err);
            continue;
        }
        CHECK(embed_cfg_from_model(m, path, NULL, false, &c, err, sizeof err) == 0 && c.pool == gk[i].pool &&
                  c.normalize && (c.refuse[0] != 0) == gk[i].refused,
              "llama.pooling_type %u gives %s, refuse '%s'", gk[i].pt, embed_pool_name(c.pool), c.refuse);
        model_close(m);
    }
}

/* ---------------------------------------------------------------- the jobs */

/* The reference fixture: inputs (as JSON token lists) and the last / mean vectors. */
static json_t *load_ref(void)
{
    json_error_t je;
    json_t *r = json_load_file("tests/data/embed/tiny_ref.json", 0, &je);
    CHECK(r && !strcmp(json_string_value(json_object_get(r, "format")) ?: "", "spill-embed-ref") &&
              json_integer_value(json_object_get(r, "version")) == 1,
          "tests/data/embed/tiny_ref.json is missing or not a version-1 spill-embed-ref (run tools/gen_embed_ref.py)");
    return r;
}

/* Row `id` of lines matches the fixture's vectors `key` input by input within tol. */
static void match_ref(json_t *lines, const char *id, json_t *ref, const char *key, double tol)
{
    json_t *b = body_of(lines, id), *want = json_object_get(ref, key);
    size_t n = json_array_size(want);
    CHECK(b && json_array_size(json_object_get(b, "data")) == n, "%s: %zu embeddings, want %zu", id,
          json_array_size(json_object_get(b, "data")), n);
    for (size_t i = 0; b && i < n; i++) {
        float v[D];
        int got = vec_of(b, i, v, D);
        CHECK(got == D, "%s input %zu: %d components, want %d", id, i, got, D);
        double worst = 0;
        for (int k = 0; got == D && k < D; k++) {
            double d = fabs(v[k] - json_number_value(json_array_get(json_array_get(want, i), (size_t)k)));
            worst = d > worst ? d : worst;
        }
        CHECK(worst <= tol, "%s input %zu (%s pooling): max |spill - numpy| = %.3g > %.1g", id, i, key, worst, tol);
        CHECK(fabs(norm(v, D) - 1) <= 1e-5, "%s input %zu: norm %.9f, want 1", id, i, norm(v, D));
    }
}

int main(void)
{
    if (!mkdtemp(tmp))
        return 1;
    parse_shapes();
    model_pooling();
    json_t *ref = load_ref();
    char in[600], in_chat[600], out[600], out_chat[600], p[700];
    char *ids = json_dumps(json_object_get(ref, "inputs"), JSON_COMPACT);
    json_t *inputs = json_object_get(ref, "inputs");
    char *one = json_dumps(json_array_get(inputs, 2), JSON_COMPACT); /* the 33-token input */

    /* the job: embedding rows of every shape among chat rows, and bad rows */
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    FILE *f = fopen(in, "w");
    chat_line(f, "chat-1", "Hello there");
    emb_line(f, "ref", ids ? ids : "[]", "");
    emb_line(f, "str", "\"The quick brown fox\"", "");
    chat_line(f, "chat-2", "Count: one, two,");
    emb_line(f, "strs", "[\"The quick brown fox\",\"jumps over\"]", ",\"encoding_format\":\"float\"");
    emb_line(f, "strs-b64", "[\"The quick brown fox\",\"jumps over\"]", ",\"encoding_format\":\"base64\"");
    emb_line(f, "ids", "[504,3575,282]", ",\"user\":\"u-1\"");
    emb_line(f, "dims", "[504,3575,282]", ",\"dimensions\":8");
    /* an input alone, and the same input as the 6th of 8 */
    emb_line(f, "alone", one, "");
    fprintf(f, "{\"custom_id\":\"eight\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"model\":\"m\","
               "\"input\":[[5,6,7],[8],[9,10,11,12],[400,401],[7,7,7,7,7,7],%s,[13,14],[15]]}}\n", one);
    /* bad rows: one sentence each */
    emb_line(f, "bad-empty-list", "[]", "");
    emb_line(f, "bad-mixed", "[1,\"a\"]", "");
    emb_line(f, "bad-empty-ids", "[[1],[]]", "");
    emb_line(f, "bad-number", "5", "");
    emb_line(f, "bad-empty-str", "\"\"", "");
    emb_line(f, "bad-encoding", "\"x\"", ",\"encoding_format\":\"int8\"");
    emb_line(f, "bad-dims-zero", "\"x\"", ",\"dimensions\":0");
    emb_line(f, "bad-field", "\"x\"", ",\"temperature\":0");
    emb_line(f, "bad-token", "[49152]", "");
    fprintf(f, "{\"custom_id\":\"bad-long\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"model\":\"m\","
               "\"input\":[");
    for (int i = 0; i < 600; i++)
        fprintf(f, "%s%d", i ? "," : "", 100 + i);
    fprintf(f, "]}}\n");
    fclose(f);
    /* the chat rows alone */
    snprintf(in_chat, sizeof in_chat, "%s/chat.jsonl", tmp);
    f = fopen(in_chat, "w");
    chat_line(f, "chat-1", "Hello there");
    chat_line(f, "chat-2", "Count: one, two,");
    fclose(f);

    CHECK(sh("%s check %s --all > %s/check.log 2>&1", bin(), in, tmp) == 65, "spill check does not find the bad rows");
    CHECK(sh("grep -q 'line 11: body.input is an empty array' %s/check.log", tmp) == 0 &&
              sh("grep -c ' line ' %s/check.log | grep -qx 8", tmp) == 0,
          "spill check does not name the 8 bad embedding lines it can judge (see %s/check.log)", tmp);

    CHECK(sh("%s check %s --endpoint /v1/embeddings > %s/check-ep.log 2>&1", bin(), in, tmp) == 65 &&
              sh("grep -q 'line 1: url is \"/v1/chat/completions\", but --endpoint is \"/v1/embeddings\"' "
                 "%s/check-ep.log", tmp) == 0,
          "spill check --endpoint /v1/embeddings does not hold the chat rows to it (see %s/check-ep.log)", tmp);
    CHECK(sh("%s check tests/data/check/good/embeddings_batch.jsonl --endpoint /v1/embeddings > %s/check-ok.log 2>&1",
             bin(), tmp) == 0 && sh("grep -q 'OK .* 4 embedding batch rows' %s/check-ok.log", tmp) == 0,
          "spill check --endpoint /v1/embeddings refuses a file of embedding rows (see %s/check-ok.log)", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    CHECK(run_job(in, out, "") == 0, "spill run on the mixed job failed (see %s.log)", out);
    snprintf(out_chat, sizeof out_chat, "%s/out-chat", tmp);
    CHECK(run_job(in_chat, out_chat, "") == 0, "spill run on the chat rows failed (see %s.log)", out_chat);
    snprintf(p, sizeof p, "%s/results.jsonl", out);
    int bad = 0;
    json_t *lines = read_lines_n(p, &bad);
    snprintf(p, sizeof p, "%s/errors.jsonl", out);
    json_t *errs = read_lines(p);
    snprintf(p, sizeof p, "%s/results.jsonl", out_chat);
    json_t *chat = read_lines(p);
    CHECK(bad == 0 && json_array_size(lines) == 9, "results.jsonl has %zu lines (%d not JSON), want 2 chat + 7 "
                                                    "embedding", json_array_size(lines), bad);
    CHECK(json_array_size(errs) == 11, "errors.jsonl has %zu lines, want 11 (10 bad rows + dims without "
                                       "--matryoshka)", json_array_size(errs));

    /* 2. the chat rows answer as they do alone */
    for (int c = 1; c <= 2; c++) {
        char id[24];
        snprintf(id, sizeof id, "chat-%d", c);
        const char *a = chat_answer(by_id(lines, id)), *b = chat_answer(by_id(chat, id));
        CHECK(a && b && !strcmp(a, b), "%s answers \"%s\" among embedding rows but \"%s\" alone", id, a ? a : "(none)",
              b ? b : "(none)");
    }

    /* 3. the reference (last token: the model has no embedding metadata) */
    match_ref(lines, "ref", ref, "last", 1e-4);
    json_t *rb = body_of(lines, "ref");
    long long want_tok = 0;
    for (size_t i = 0; i < json_array_size(inputs); i++)
        want_tok += (long long)json_array_size(json_array_get(inputs, i));
    CHECK(json_integer_value(json_object_get(json_object_get(rb, "usage"), "prompt_tokens")) == want_tok &&
              json_integer_value(json_object_get(json_object_get(rb, "usage"), "total_tokens")) == want_tok,
          "ref's usage is not %lld prompt = total tokens", want_tok);
    CHECK(!strcmp(json_string_value(json_object_get(rb, "object")) ?: "", "list") &&
              !strcmp(json_string_value(json_object_get(rb, "model")) ?: "", MODEL),
          "ref's body is not a list naming the model that ran");

    /* 4. base64 = the float list, bit for bit */
    json_t *fb = body_of(lines, "strs"), *bb = body_of(lines, "strs-b64");
    for (size_t i = 0; i < 2; i++) {
        float a[D], b[D];
        int na = vec_of(fb, i, a, D), nb = vec_of(bb, i, b, D);
        CHECK(na == D && nb == D && memcmp(a, b, sizeof a) == 0, "input %zu: base64 (%d floats) is not the float "
                                                                   "list (%d floats) bit for bit", i, nb, na);
        CHECK(json_is_string(json_object_get(json_array_get(json_object_get(bb, "data"), i), "embedding")),
              "strs-b64 input %zu is not a base64 string", i);
    }
    /* a one-string list is the string */
    float s1[D], s2[D];
    CHECK(vec_of(body_of(lines, "str"), 0, s1, D) == D && vec_of(fb, 0, s2, D) == D && !memcmp(s1, s2, sizeof s1),
          "\"text\" and [\"text\", …] embed the same text differently");
    /* dimensions without --matryoshka: a 400 saying why */
    const char *dm = err_msg(errs, "dims");
    CHECK(one_sentence(dm) && strstr(dm, "--matryoshka"), "dims without --matryoshka: %s", dm ? dm : "(no error)");
    CHECK(!by_id(lines, "dims"), "dims was answered without --matryoshka");

    /* 5. batch invariance: exact */
    float va[D], vb[D];
    CHECK(vec_of(body_of(lines, "alone"), 0, va, D) == D && vec_of(body_of(lines, "eight"), 5, vb, D) == D &&
              memcmp(va, vb, sizeof va) == 0,
          "an input alone and the same input 6th of 8 embed differently");
    json_t *eb = body_of(lines, "eight");
    for (size_t i = 0; i < 8; i++)
        CHECK(json_integer_value(json_object_get(json_array_get(json_object_get(eb, "data"), i), "index")) ==
                  (json_int_t)i, "eight: data[%zu] has the wrong index", i);

    /* 1. the bad rows: one sentence each, on the field */
    static const char *const bads[][2] = {
        {"bad-empty-list", "body.input"},  {"bad-mixed", "body.input[1]"},       {"bad-empty-ids", "body.input[1]"},
        {"bad-number", "body.input"},      {"bad-empty-str", "body.input"},      {"bad-encoding", "body.encoding_format"},
        {"bad-dims-zero", "body.dimensions"}, {"bad-field", "body.temperature"}, {"bad-token", "body.input"},
        {"bad-long", "body.input"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        const char *m = err_msg(errs, bads[i][0]);
        CHECK(one_sentence(m) && strstr(m, bads[i][1]), "%s: the error is not one sentence naming %s: %s", bads[i][0],
              bads[i][1], m ? m : "(none)");
    }
    CHECK(!strcmp(err_code(errs, "bad-long") ?: "", "context_length_exceeded") &&
              strstr(err_msg(errs, "bad-long") ?: "", "context"),
          "an input over the context does not fail with context_length_exceeded: %s", err_msg(errs, "bad-long"));

    /* 7. the openai types */
    if (access(".venv/bin/python", X_OK) == 0)
        CHECK(sh(".venv/bin/python tools/check_output_schema.py %s/results.jsonl %s/errors.jsonl > %s/schema.log 2>&1",
                 out, out, tmp) == 0,
              "the openai types reject a line (see %s/schema.log)", tmp);
    /* a resume of the finished job answers nothing twice */
    CHECK(sh("%s resume %s --quiet > %s/resume.log 2>&1", bin(), out, tmp) == 0, "spill resume failed (%s/resume.log)",
          tmp);
    snprintf(p, sizeof p, "%s/results.jsonl", out);
    json_t *again = read_lines(p);
    snprintf(p, sizeof p, "%s/errors.jsonl", out);
    json_t *again_e = read_lines(p);
    CHECK(json_array_size(again) == 9 && json_array_size(again_e) == 11,
          "after resume: %zu results, %zu errors (want 9 and 11)", json_array_size(again), json_array_size(again_e));
    json_decref(again);
    json_decref(again_e);

#ifdef SPILL_MPI
    /* several ranks: rank 0 answers the embedding rows, the same bits as one process; every row once */
    if (system("command -v mpirun >/dev/null 2>&1") == 0) {
        char outm[600];
        snprintf(outm, sizeof outm, "%s/out-mpi", tmp);
        /* leak checking off for the ranks: OpenMPI's start-up allocations, kept to exit, come up here with
         * unnamed frames the suppressions cannot match; spill's own leaks are the single-process runs' to catch */
        CHECK(sh("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
                 "mpirun --oversubscribe -np 2 %s run %s %s -o %s --quiet > %s.log 2>&1", bin(), MODEL, in, outm,
                 outm) == 0,
              "mpirun -np 2 spill run failed (see %s.log)", outm);
        snprintf(p, sizeof p, "%s/results.jsonl", outm);
        json_t *ml = read_lines(p);
        snprintf(p, sizeof p, "%s/errors.jsonl", outm);
        json_t *me = read_lines(p);
        CHECK(json_array_size(ml) == 9 && json_array_size(me) == 11, "mpirun -np 2: %zu results, %zu errors (want 9, "
                                                                     "11)", json_array_size(ml), json_array_size(me));
        static const char *const ids_e[] = {"ref", "str", "strs", "ids", "alone", "eight"};
        for (size_t i = 0; i < sizeof ids_e / sizeof ids_e[0]; i++) {
            json_t *a = json_object_get(body_of(ml, ids_e[i]), "data"), *b = json_object_get(body_of(lines, ids_e[i]), "data");
            CHECK(a && json_equal(a, b), "mpirun -np 2: row %s embeds differently from one process", ids_e[i]);
        }
        const char *c1 = chat_answer(by_id(ml, "chat-1")), *c2 = chat_answer(by_id(lines, "chat-1"));
        CHECK(c1 && c2 && !strcmp(c1, c2), "mpirun -np 2: chat-1 answers differently");
        json_decref(ml);
        json_decref(me);
    }
#endif
    /* 3/4. mean pooling and Matryoshka: another job of the same rows, --pooling mean --matryoshka */
    char out2[600];
    snprintf(out2, sizeof out2, "%s/out-mean", tmp);
    CHECK(run_job(in, out2, "--pooling mean --matryoshka") == 0, "spill run --pooling mean failed (see %s.log)", out2);
    snprintf(p, sizeof p, "%s/results.jsonl", out2);
    json_t *mlines = read_lines(p);
    match_ref(mlines, "ref", ref, "mean", 1e-4);
    float ml[D], mm[D];
    CHECK(vec_of(body_of(lines, "ref"), 3, ml, D) == D && vec_of(body_of(mlines, "ref"), 3, mm, D) == D,
          "no 300-token input vectors");
    double diff = 0, same = 0;
    for (int k = 0; k < D; k++)
        diff = fmax(diff, fabs(ml[k] - mm[k]));
    CHECK(diff > 1e-2, "mean and last pooling of a 300-token input differ by only %.3g", diff);
    CHECK(vec_of(body_of(lines, "ref"), 0, ml, D) == D && vec_of(body_of(mlines, "ref"), 0, mm, D) == D, "no vectors");
    for (int k = 0; k < D; k++)
        same = fmax(same, fabs(ml[k] - mm[k]));
    CHECK(same == 0, "mean and last of a one-token input differ by %.3g", same);
    /* dimensions 8: the full vector's first 8, renormalised */
    float full[D], cut[D];
    int nc = vec_of(body_of(mlines, "dims"), 0, cut, D);
    CHECK(nc == 8 && vec_of(body_of(mlines, "ids"), 0, full, D) == D, "dims answered %d components, want 8", nc);
    double n8 = norm(full, 8), worst = 0;
    for (int k = 0; nc == 8 && k < 8; k++)
        worst = fmax(worst, fabs(cut[k] - full[k] / n8));
    CHECK(nc == 8 && worst <= 1e-6 && fabs(norm(cut, 8) - 1) <= 1e-5,
          "dimensions 8 is not the renormalised first 8 (max diff %.3g, norm %.9f)", worst, norm(cut, 8));
    json_decref(mlines);
    /* the GGUF that says pooling_type 1 (mean) embeds as the mean reference without --pooling */
    char out4[600];
    snprintf(out4, sizeof out4, "%s/out-gguf-mean", tmp);
    CHECK(sh("%s run %s/pool1.gguf %s -o %s --quiet > %s.log 2>&1", bin(), tmp, in, out4, out4) == 0,
          "spill run on the pooling_type 1 copy failed (see %s.log)", out4);
    snprintf(p, sizeof p, "%s/results.jsonl", out4);
    json_t *glines = read_lines(p);
    match_ref(glines, "ref", ref, "mean", 1e-4);
    json_decref(glines);
    /* dimensions above D */
    char in3[600], out3[600];
    snprintf(in3, sizeof in3, "%s/big.jsonl", tmp);
    f = fopen(in3, "w");
    emb_line(f, "too-big", "\"x\"", ",\"dimensions\":33");
    fclose(f);
    snprintf(out3, sizeof out3, "%s/out-big", tmp);
    CHECK(run_job(in3, out3, "--matryoshka") == 0, "spill run of dimensions 33 failed (see %s.log)", out3);
    snprintf(p, sizeof p, "%s/errors.jsonl", out3);
    json_t *be = read_lines(p);
    const char *bm = err_msg(be, "too-big");
    CHECK(one_sentence(bm) && strstr(bm, "32 dimensions"), "dimensions 33 of a 32-dimension model: %s",
          bm ? bm : "(none)");
    json_decref(be);

    json_decref(lines);
    json_decref(errs);
    json_decref(chat);
    json_decref(ref);
    free(ids);
    free(one);
    if (!test_failures)
        sh("rm -rf %s", tmp);
    return test_finish("test_embed");
}
