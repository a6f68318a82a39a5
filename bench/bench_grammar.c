/*
 * bench_grammar.c — what structured output costs a pass: B rows (default 1,024) advance in lockstep through
 * their grammars, as a job's rows do; each pass every row gets its mask (token_mask_get: the job's cache)
 * and applies it to a logits row of V floats (token_mask_apply), then takes a random allowed token (half the
 * time one holding a structural character, so values close) and feeds its bytes.  A row whose value closes
 * starts again.  Times the get and the apply only (the random pick stands in for the sampler, which a job
 * pays anyway); prints per pass: ms, misses, ms in misses; and the cold cost of one state's mask.
 *
 *     build/bench/bench_grammar [--rows B] [--passes P] [--schema object|person|mixed] [MODEL]
 *
 * Single-threaded: a job spreads the same work over its sampling threads (run.c draw_task).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "batch/grammar.h"
#include "batch/sample.h"
#include "batch/token_mask.h"
#include "model/model.h"
#include "text/prompt.h"

static const char *PERSON =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"email\":{\"type\":[\"string\",\"null\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":3},"
    "\"status\":{\"enum\":[\"active\",\"inactive\",\"banned\"]},\"score\":{\"type\":\"number\"},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}},\"required\":[\"name\",\"age\",\"status\"],"
    "\"additionalProperties\":false}";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

int main(int argc, char **argv)
{
    int B = 1024, P = 200;
    const char *which = "mixed", *spec = "smollm2:135m";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--schema") && i + 1 < argc)
            which = argv[++i];
        else
            spec = argv[i];
    }
    char err[SPILL_ERRLEN], path[4096];
    model_desc *m = NULL;
    tokenizer *tok = NULL;
    if (model_resolve(spec, path, sizeof path, err, sizeof err) || model_open(path, &m, err, sizeof err) ||
        prompt_open_tokenizer(m, &tok, err, sizeof err)) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    int V = m->vocab;
    json_t *doc = json_loads(PERSON, 0, NULL);
    grammar *gobj = NULL, *gper = NULL;
    token_mask *tm = NULL;
    double t0 = now_s();
    if (grammar_compile(NULL, "json_object", &gobj, NULL, 0, err, sizeof err) ||
        grammar_compile(doc, "person", &gper, NULL, 0, err, sizeof err) ||
        token_mask_open(tok, V, m->stop_ids, m->n_stop, 1, 128u << 20, &tm, err, sizeof err)) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    double t_open = now_s() - t0;
    size_t W = token_mask_words(tm);
    token_mask_stats st;
    token_mask_get_stats(tm, &st);
    printf("vocabulary %d (%d usable tokens, longest %d bytes); index built in %.1f ms; cache %zu masks of %zu "
           "bytes\n",
           V, st.n_tokens, st.max_len, 1e3 * t_open, st.cache_entries, W * 8);

    /* tokens holding a structural character, for the biased pick */
    char *structural = calloc((size_t)V, 1);
    for (int id = 0; id < V; id++) {
        size_t len;
        const uint8_t *b = tokenizer_token_bytes(tok, id, &len);
        for (size_t k = 0; b && k < len; k++)
            structural[id] |= b[k] == '"' || b[k] == '}' || b[k] == ']' || b[k] == ',';
    }
    gstate *s = malloc((size_t)B * sizeof *s);
    const grammar **g = malloc((size_t)B * sizeof *g);
    uint64_t *allow = malloc(W * 8);
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    for (int r = 0; r < B; r++) {
        g[r] = !strcmp(which, "object") ? gobj : !strcmp(which, "person") ? gper : (r % 2 ? gobj : gper);
        gstate_init(g[r], &s[r]);
    }
    /* cold: one state's mask, computed (start, inside a string, after a key) */
    static const char *probe[] = {"", "{\"name\":\"Jo", "{\"name\":\"Jo\",\"age\":"};
    for (int k = 0; k < 3; k++) {
        gstate q;
        gstate_init(gper, &q);
        gstate_feed_bytes(gper, &q, (const uint8_t *)probe[k], strlen(probe[k]));
        double c0 = now_s();
        int reps = 20, n = 0;
        for (int i = 0; i < reps; i++)
            n = token_mask_compute(tm, 0, gper, &q, allow);
        printf("cold mask after '%s': %.2f ms (%d tokens allowed)\n", probe[k], 1e3 * (now_s() - c0) / reps, n);
    }
    double sum_get = 0, sum_apply = 0, worst = 0;
    uint64_t done = 0, prev_miss = 0;
    double prev_miss_s = 0;
    int steady_from = P / 2;
    double steady_get = 0, steady_apply = 0;
    uint64_t steady_miss = 0;
    for (int p = 0; p < P; p++) {
        double tg = 0, ta = 0;
        for (int r = 0; r < B; r++) {
            double a0 = now_s();
            token_mask_get(tm, 0, g[r], &s[r], allow);
            double a1 = now_s();
            for (int i = 0; i < V; i++)
                logits[i] = 0;
            double a2 = now_s();
            token_mask_apply(allow, logits, V);
            double a3 = now_s();
            tg += a1 - a0, ta += a3 - a2;
            int n = 0, ns = 0;
            for (size_t w = 0; w < W; w++)
                for (uint64_t x = allow[w]; x; x &= x - 1)
                    ids[n++] = (int32_t)(w * 64 + (size_t)__builtin_ctzll(x));
            for (int i = 0; i < n; i++) /* structural ones first */
                if (structural[ids[i]]) {
                    int32_t t = ids[ns];
                    ids[ns++] = ids[i], ids[i] = t;
                }
            int32_t pick = ns && rnd() % 2 ? ids[rnd() % (uint32_t)ns] : ids[rnd() % (uint32_t)n];
            bool end = false;
            for (size_t k = 0; k < m->n_stop; k++)
                end |= m->stop_ids[k] == pick;
            size_t len;
            const uint8_t *b = tokenizer_token_bytes(tok, pick, &len);
            if (!end && gstate_feed_bytes(g[r], &s[r], b, len)) {
                fprintf(stderr, "bench_grammar: token %d refused after the mask allowed it\n", pick);
                return 1;
            }
            if (end || gstate_done(&s[r])) {
                gstate_init(g[r], &s[r]);
                done++;
            }
        }
        token_mask_get_stats(tm, &st);
        double pass = tg + ta;
        if (p >= steady_from)
            steady_get += tg, steady_apply += ta, steady_miss += st.misses - prev_miss;
        if (p < 5 || p % 50 == 0)
            printf("pass %3d: %.2f ms (get %.2f, apply %.2f), %llu misses costing %.2f ms\n", p, 1e3 * pass, 1e3 * tg,
                   1e3 * ta, (unsigned long long)(st.misses - prev_miss), 1e3 * (st.miss_s - prev_miss_s));
        prev_miss = st.misses, prev_miss_s = st.miss_s;
        sum_get += tg, sum_apply += ta;
        worst = pass > worst ? pass : worst;
    }
    token_mask_get_stats(tm, &st);
    int ns = P - steady_from;
    printf("%d rows x %d passes (%s): mean %.2f ms per pass (get %.2f, apply %.2f), worst %.2f ms; passes %d-%d: "
           "%.2f ms per pass, %.1f misses per pass; %llu values closed; %llu hits, %llu misses (%.2f ms each), "
           "%llu cache resets\n",
           B, P, which, 1e3 * (sum_get + sum_apply) / P, 1e3 * sum_get / P, 1e3 * sum_apply / P, 1e3 * worst,
           steady_from, P - 1, 1e3 * (steady_get + steady_apply) / ns, (double)steady_miss / ns,
           (unsigned long long)done, (unsigned long long)st.hits, (unsigned long long)st.misses,
           st.misses ? 1e3 * st.miss_s / (double)st.misses : 0.0, (unsigned long long)st.resets);
    /* reference: the host sampler the same rows pay anyway (temperature 1, one draw per row) */
    sample_params sp = {.temperature = 1, .top_p = 1};
    sample_state ss;
    sample_scratch sc;
    sample_result res;
    if (sample_state_init(&ss, &sp, 1, 0, V, 1, err, sizeof err) || sample_scratch_init(&sc, V, err, sizeof err)) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    for (int i = 0; i < V; i++)
        logits[i] = (float)(rnd() % 2000) / 100.0f - 10.0f;
    double q0 = now_s();
    for (int r = 0; r < B; r++)
        sample_next(logits, V, &sp, &ss, &sc, &res, err, sizeof err);
    printf("reference: sample_next at temperature 1 for %d rows: %.2f ms\n", B, 1e3 * (now_s() - q0));
    sample_state_free(&ss);
    sample_scratch_free(&sc);
    free(structural), free(s), free(g), free(allow), free(logits), free(ids);
    token_mask_close(tm);
    grammar_free(gobj), grammar_free(gper);
    json_decref(doc);
    tokenizer_free(tok);
    model_close(m);
    return 0;
}
