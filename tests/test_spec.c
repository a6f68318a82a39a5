/*
 * test_spec.c — speculative passes (issue 20), the parts that stand alone:
 *   - the prompt-lookup proposer (spec.h): longest n-gram first, its most
 *     recent earlier occurrence, the continuation capped by k and by the
 *     sequence's end, across the prompt/output boundary, nothing without a match;
 *   - kv_row_truncate (kv.h): pages past the kept length go back through the
 *     reference counts (free, idle when indexed, one count less when another
 *     row maps them), a shared or indexed page the row would write again is
 *     refused, and kv_check agrees with every page's count after each step;
 *   - whole jobs through the binary (cli.h) on tests/data/tiny/tiny-smollm2.gguf with SPILL_KV_CHECK=1: greedy
 *     chat and completions rows (prompts that repeat text, stop strings, max_tokens ending mid-proposal, n = 2,
 *     log-probs) and seeded sampled rows (frequency/presence penalties; top_p, repetition_penalty and log-probs)
 *     answer with --speculate lookup exactly as with off, also at --batch 1 and under a --kv-mem that preempts:
 *     a speculative position draws the token the plain run draws there with the same RNG value (sample.c), so
 *     on the CPU, whose logits do not depend on how many tokens a sequence feeds, even sampled answers agree
 *     token for token (a stronger check than the distribution test below); and the summary shows more than
 *     1.00 tokens per row per pass.  That threshold only asks that some proposal was accepted: the fixture's random weights copy little
 *     of their prompt, so no acceptance rate is promised for it (bench/results measures a real model).
 * Exact results: answers compared as JSON, no tolerance.
 */
#include "batch/spec.h"
#include "cli.h"
#include "engine/kv.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"

static void test_propose(void)
{
    int32_t out[SPEC_K_MAX];
    /* prompt 1 2 3 4 5 9 1 2, output 3: the trigram 1 2 3 recurs, propose 4 5 9 (k 3) */
    int32_t p[] = {1, 2, 3, 4, 5, 9, 1, 2};
    int32_t g[] = {3};
    int n = spec_propose(p, 8, g, 1, 3, out);
    CHECK(n == 3 && out[0] == 4 && out[1] == 5 && out[2] == 9, "trigram: %d tokens (%d %d %d)", n, out[0], out[1],
          out[2]);
    /* k larger than what follows: stops at the sequence's end (the continuation runs into the match itself) */
    n = spec_propose(p, 8, g, 1, 16, out);
    CHECK(n == 6 && out[0] == 4 && out[5] == 3, "k 16: %d tokens", n);
    /* the most recent occurrence wins: 7 8 -> 1 earlier, 7 8 -> 2 later; sequence ends in 7 8 */
    int32_t q[] = {7, 8, 1, 5, 7, 8, 2, 6, 7, 8};
    n = spec_propose(q, 10, NULL, 0, 2, out);
    CHECK(n == 2 && out[0] == 2 && out[1] == 6, "most recent: %d tokens (%d %d)", n, out[0], out[1]);
    /* the longest n-gram wins over a more recent shorter one: 4 5 6 -> 10 (trigram) vs 6 -> 11 (unigram) */
    int32_t r[] = {4, 5, 6, 10, 6, 11, 4, 5, 6};
    n = spec_propose(r, 9, NULL, 0, 1, out);
    CHECK(n == 1 && out[0] == 10, "longest first: %d tokens (%d)", n, out[0]);
    /* a unigram when nothing longer matches, the match in the prompt and the end in the output */
    int32_t s[] = {3, 9, 9};
    int32_t sg[] = {5, 3};
    n = spec_propose(s, 3, sg, 2, 4, out);
    CHECK(n == 4 && out[0] == 9 && out[1] == 9 && out[2] == 5 && out[3] == 3, "unigram across the boundary: %d", n);
    /* no earlier occurrence, k 0, a one-token sequence: nothing */
    int32_t u[] = {1, 2, 3, 4};
    CHECK(spec_propose(u, 4, NULL, 0, 4, out) == 0, "no match proposed something");
    CHECK(spec_propose(p, 8, g, 1, 0, out) == 0, "k 0 proposed something");
    CHECK(spec_propose(u, 1, NULL, 0, 4, out) == 0, "one token proposed something");
}

static void check_pages(const kv_cache *c, const kv_row *const *rows, size_t n, const char *what)
{
    char err[256];
    CHECK(kv_check(c, rows, n, err, sizeof err) == 0, "%s: %s", what, err);
}

static void test_truncate(void)
{
    char err[256];
    kv_cache c;
    const int P = 4;
    CHECK(kv_create(&c, 1, 1, 1, P, 16, err, sizeof err) == 0, "kv_create: %s", err);
    CHECK(kv_prefix_enable(&c, err, sizeof err) == 0, "prefix index: %s", err);
    /* row a: a 10-token prompt; its 2 full pages indexed (the prefix cache's state after its prefill) */
    int32_t prompt[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kv_row a = {0}, b = {0};
    CHECK(kv_row_reserve(&c, &a, 10) == 0, "reserve a");
    a.len = 10;
    kv_chain ch = kv_chain_start(0);
    kv_prefix_insert(&c, &ch, &a, prompt, 10);
    int32_t ix, idle;
    uint64_t ev;
    kv_prefix_stats(&c, &ix, &idle, &ev);
    CHECK(ix == 2, "%d pages indexed, want 2", ix);
    /* row b maps a's first two pages, then decodes 1 + k = 6 speculative positions: 8 + 6 = 14 (4 pages) */
    CHECK(kv_row_map(&c, &b, &a, 2) == 0 && kv_row_reserve(&c, &b, 14) == 0, "map + reserve b");
    b.len = 14;
    const kv_row *both[] = {&a, &b};
    check_pages(&c, both, 2, "after the speculative reserve");
    CHECK(c.n_free == 16 - 3 - 2, "free %d, want 11", c.n_free);
    int32_t shared0 = b.pages[0], shared1 = b.pages[1], own3 = b.pages[3];
    /* one token accepted: keep 9 positions (3 pages); the 4th page goes back to the free list */
    CHECK(kv_row_truncate(&c, &b, 9) == 0, "truncate to 9");
    CHECK(b.n_pages == 3 && b.len == 9, "b holds %d pages, len %d; want 3, 9", b.n_pages, b.len);
    CHECK(c.ref[own3] == 0 && c.n_free == 12, "page %d count %d, free %d; want 0, 12", own3, c.ref[own3], c.n_free);
    CHECK(c.ref[shared0] == 2 && c.ref[shared1] == 2, "shared pages' counts %d %d, want 2 2", c.ref[shared0],
          c.ref[shared1]);
    check_pages(&c, both, 2, "after truncating to 9");
    /* a length inside a mapped (shared, indexed) page is refused, nothing changed */
    CHECK(kv_row_truncate(&c, &b, 6) == -1, "truncating into a shared page was not refused");
    CHECK(b.n_pages == 3 && b.len == 9 && c.ref[shared1] == 2, "a refused truncate changed the row");
    /* on a page boundary: the shared pages are kept untouched, b's own page goes */
    CHECK(kv_row_truncate(&c, &b, 8) == 0 && b.n_pages == 2 && b.len == 8, "truncate to 8");
    CHECK(c.ref[shared0] == 2 && c.ref[shared1] == 2 && c.n_free == 13, "after 8: counts %d %d, free %d",
          c.ref[shared0], c.ref[shared1], c.n_free);
    check_pages(&c, both, 2, "after truncating to 8");
    /* below the shared pages, on a boundary: one mapping of page 1 dropped, a still holds it */
    CHECK(kv_row_truncate(&c, &b, 4) == 0 && b.n_pages == 1 && c.ref[shared1] == 1, "truncate to 4");
    check_pages(&c, both, 2, "after truncating to 4");
    /* a longer length than held: nothing released, len unchanged */
    CHECK(kv_row_truncate(&c, &b, 40) == 0 && b.n_pages == 1 && b.len == 4, "truncate past the end");
    /* a's own tail: its partial 3rd page (not indexed, count 1) may be kept and written on */
    CHECK(kv_row_truncate(&c, &a, 9) == 0 && a.n_pages == 3, "truncate a to 9");
    /* a releases its indexed pages: page 1 (mapped by a alone now) goes idle, page 0 keeps b's mapping */
    kv_row_free(&c, &a);
    const kv_row *only_b[] = {&b};
    check_pages(&c, only_b, 1, "after a is freed");
    kv_prefix_stats(&c, &ix, &idle, &ev);
    CHECK(idle == 1 && c.ref[shared0] == 1, "idle %d, page 0 count %d; want 1, 1", idle, c.ref[shared0]);
    kv_row_free(&c, &b);
    check_pages(&c, NULL, 0, "after both are freed");
    CHECK(c.n_free == 16, "free %d, want every page", c.n_free);
    kv_destroy(&c);
}

/* The answers of a job (custom_id -> choices), without ids and timestamps; NULL when results.jsonl is missing. */
static json_t *job_answers(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    json_t *lines = read_lines(path), *map = json_object();
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o)
    {
        json_t *body = json_object_get(json_object_get(o, "response"), "body");
        json_object_set(map, json_string_value(json_object_get(o, "custom_id")), json_object_get(body, "choices"));
    }
    json_decref(lines);
    return map;
}

static void write_rows(const char *path)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 18; i++) {
        char txt[600] = "";
        for (int r = 0; r < 2 + i % 4; r++)
            strcat(txt, "one two three four five six seven eight nine ten ");
        char extra[200] = ",\"temperature\":0";
        if (i % 6 == 1)
            strcat(extra, ",\"stop\":[\"heuristic\",\" aud\"]");
        else if (i % 6 == 3)
            strcat(extra, ",\"n\":2");
        else if (i == 5) /* sampled, with the penalties that count the tokens before each speculative position */
            snprintf(extra, sizeof extra, ",\"temperature\":0.9,\"seed\":%d,\"frequency_penalty\":0.5,"
                                          "\"presence_penalty\":0.3", i);
        else if (i == 11) /* greedy with completions' log-probs */
            strcpy(extra, ",\"temperature\":0,\"logprobs\":2");
        else if (i == 17) /* sampled with top_p, repetition_penalty and log-probs */
            snprintf(extra, sizeof extra, ",\"temperature\":1.1,\"top_p\":0.9,\"seed\":%d,\"repetition_penalty\":1.3,"
                                          "\"logprobs\":3", i);
        int mt = 7 + (i * 13) % 90; /* odd lengths: max_tokens ends in the middle of proposals */
        if (i % 2)
            fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"t\","
                       "\"prompt\":\"%s\",\"max_tokens\":%d%s}}\n", i, txt, mt, extra);
        else
            fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                       "\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d%s}}\n",
                    i, txt, mt, extra);
    }
    fclose(f);
}

/* tokens per row per pass from a job's summary, -1 when the line is missing */
static double per_pass(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    double v = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "speculation (lookup");
        if (p && (p = strchr(p, ':')))
            v = strtod(p + 1, NULL);
    }
    if (f)
        fclose(f);
    return v;
}

static void test_jobs(void)
{
    char tmp[] = "/tmp/spill_test_spec_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char in[200];
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    write_rows(in);
    CHECK(sh("SPILL_KV_CHECK=1 %s run %s %s -o %s/off --quiet --speculate off >%s/off.log 2>&1", bin(), MODEL, in,
             tmp, tmp) == 0, "the run without speculation failed (%s/off.log)", tmp);
    json_t *ref = job_answers(strcat(strcpy((char[256]){0}, tmp), "/off"));
    CHECK(json_object_size(ref) == 18, "the reference answered %zu rows of 18", json_object_size(ref));
    static const char *const variants[][2] = {{"lookup", ""}, {"b1", "--batch 1 --spec-k 6"},
                                              {"kv", "--batch 12 --kv-mem 40K --spec-k 3"}};
    for (int v = 0; v < 3; v++) {
        char dir[256], log[300];
        snprintf(dir, sizeof dir, "%s/%s", tmp, variants[v][0]);
        snprintf(log, sizeof log, "%s.log", dir);
        int rc = sh("SPILL_KV_CHECK=1 %s run %s %s -o %s --speculate lookup %s >%s 2>&1", bin(), MODEL, in, dir,
                    variants[v][1], log);
        CHECK(rc == 0, "%s: the speculating run failed (%s)", variants[v][0], log);
        json_t *got = job_answers(dir);
        CHECK(json_equal(got, ref), "%s: answers differ from --speculate off", variants[v][0]);
        const char *k;
        json_t *a;
        int shown = 0;
        json_object_foreach(ref, k, a) if (!json_equal(a, json_object_get(got, k)) && shown++ < 2)
        {
            char *x = json_dumps(a, JSON_COMPACT), *y = json_dumps(json_object_get(got, k), JSON_COMPACT);
            fprintf(stderr, "  %s want %.200s\n  %s got  %.200s\n", k, x, k, y ? y : "(missing)");
            free(x), free(y);
        }
        double pp = per_pass(log);
        fprintf(stderr, "%s: %.2f tokens per row per pass\n", variants[v][0], pp);
        CHECK(pp > 1.0, "%s: %.2f tokens per row per pass (want > 1.00: some proposal accepted)", variants[v][0], pp);
        json_decref(got);
    }
    char kvlog[300];
    snprintf(kvlog, sizeof kvlog, "%s/kv.log", tmp);
    CHECK(sh("grep -q ' [1-9][0-9]* preemptions' %s", kvlog) == 0, "the --kv-mem 40K run did not preempt (%s)", kvlog);
    json_decref(ref);
    if (!test_failures)
        sh("rm -rf %s", tmp);
}

int main(void)
{
    test_propose();
    test_truncate();
    test_jobs();
    return test_finish("test_spec");
}
