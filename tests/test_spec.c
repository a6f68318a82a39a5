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
 *     1.00 tokens per row per pass, which the final progress line shows too (`N.NN tok/row/pass`).  That threshold only asks that some proposal was accepted: the fixture's random weights copy little
 *     of their prompt, so no acceptance rate is promised for it (bench/results measures a real model).
 *   - sample_next_ahead (sample.h): position j of a speculating step draws exactly what sample_next draws for a
 *     state that observed the j proposals (and spent their j draws), penalties included, and leaves the state
 *     alone; sample_skip then puts the state where the plain run's is;
 *   - the sampled rule's distribution, by a two-sample chi-square test (chi2_two below): on synthetic logits,
 *     the runner's rule passes and two wrong ones (always keep the proposal; on a rejection draw again from the
 *     whole p) are rejected by the same statistic and threshold; then on the tiny model, 1,000 seeded rows at
 *     temperature 1 with speculation against 1,000 others without (disjoint seeds, so the samples are
 *     independent): the third and fourth tokens' marginals agree.
 *   - k per row (sched_spec_k / sched_spec_learn): a newcomer proposes 4, a row whose proposals are all kept
 *     climbs to the cap, one whose proposals are all rejected drops to 0, proposes again after some quiet
 *     steps (the history fades) and climbs back once its proposals are kept, a row keeping 60% of its proposals sits at 1-2, a choice that ends mid-step is not
 *     counted as a rejection; and a job at --prefill-chunk 4 --spec-k 8 never carries more than 4 verify
 *     tokens in a pass (its --pass-log) while answering as --speculate off.
 *   - the ETA (sched_estimate) prices speculation: rows advance by the job's kept tokens per decode step.
 * Exact results: answers compared as JSON, no tolerance.
 */
#include <math.h>

#include "base/util.h"
#include "batch/sample.h"
#include "batch/sched.h"
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
    char plog[300];
    snprintf(plog, sizeof plog, "--prefill-chunk 4 --spec-k 8 --pass-log %s/passes.csv", tmp);
    const char *const variants[][2] = {{"lookup", ""}, {"b1", "--batch 1 --spec-k 6"},
                                       {"kv", "--batch 12 --kv-mem 40K --spec-k 3"}, {"chunk4", plog}};
    for (int v = 0; v < 4; v++) {
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
        /* the final progress line shows the same figure */
        char pat[64];
        snprintf(pat, sizeof pat, "%.2f tok/row/pass", pp);
        CHECK(sh("grep -q '^rows .* · %s' %s", pat, log) == 0, "%s: no progress line with '%s' (%s)", variants[v][0],
              pat, log);
        CHECK(pp > 1.0, "%s: %.2f tokens per row per pass (want > 1.00: some proposal accepted)", variants[v][0], pp);
        json_decref(got);
    }
    char kvlog[300];
    snprintf(kvlog, sizeof kvlog, "%s/kv.log", tmp);
    CHECK(sh("grep -q ' [1-9][0-9]* preemptions' %s", kvlog) == 0, "the --kv-mem 40K run did not preempt (%s)", kvlog);
    /* --prefill-chunk 4: a pass without prompt tokens (the CSV's 4th column) carries its decode steps (2nd) and at
     * most 4 verify tokens on top (3rd: decode tokens, verify included) */
    char csv[300], line[256];
    snprintf(csv, sizeof csv, "%s/passes.csv", tmp);
    FILE *f = fopen(csv, "r");
    int passes = 0, over = 0, max_verify = 0;
    while (f && fgets(line, sizeof line, f)) {
        int pass, ns, dec, prompt;
        if (sscanf(line, "%d,%d,%d,%d", &pass, &ns, &dec, &prompt) != 4 || prompt != 0)
            continue;
        passes++;
        over += dec - ns > 4;
        max_verify = dec - ns > max_verify ? dec - ns : max_verify;
    }
    if (f)
        fclose(f);
    CHECK(passes > 10 && over == 0 && max_verify > 0, "--prefill-chunk 4: %d of %d decode passes carried more than 4 "
          "verify tokens (most %d; want some, none over 4)", over, passes, max_verify);
    json_decref(ref);
    if (!test_failures)
        sh("rm -rf %s", tmp);
}

/* ---- k per row ---------------------------------------------------------------------------------------------- */

static void test_k_policy(void)
{
    choice c;
    memset(&c, 0, sizeof c);
    c.n_gen = 1;
    CHECK(sched_spec_k(&c, 4) == 4 && sched_spec_k(&c, 16) == 4, "a newcomer's k: %d (cap 4), %d (cap 16); want 4",
          sched_spec_k(&c, 4), sched_spec_k(&c, 16));
    CHECK(sched_spec_k(&c, 2) == 2 && sched_spec_k(&c, 0) == 0, "caps 2 and 0 give %d and %d", sched_spec_k(&c, 2),
          sched_spec_k(&c, 0));
    /* every proposal kept: k climbs to the cap within a few steps */
    int k = 0, steps = 0;
    for (; steps < 20 && (k = sched_spec_k(&c, 16)) < 16; steps++)
        sched_spec_learn(&c, k, k, false), c.n_gen += k + 1;
    CHECK(k == 16 && steps <= 10, "all kept: k %d after %d steps, want 16 within 10", k, steps);
    /* then every first proposal rejected: down to 0 within a few steps */
    for (steps = 0; steps < 20 && (k = sched_spec_k(&c, 16)) > 0; steps++)
        sched_spec_learn(&c, k, 0, false);
    CHECK(k == 0 && steps <= 10, "all rejected: k %d after %d steps, want 0 within 10", k, steps);
    /* a row that never copies, over 160 more decode steps: quiet steps fade the history, so it proposes again now
     * and then and is rejected each time — about one verify token in 8 steps (sched.c); want 1/16 .. 1/4 */
    int verify = 0;
    for (steps = 0; steps < 160; steps++) {
        k = sched_spec_k(&c, 16);
        verify += k;
        sched_spec_learn(&c, k, 0, false);
    }
    CHECK(verify >= 10 && verify <= 40, "never copying: %d verify tokens in 160 steps, want 10..40", verify);
    /* kept again: the row is noticed */
    for (steps = 0; steps < 20 && (k = sched_spec_k(&c, 16)) < 4; steps++)
        sched_spec_learn(&c, k, k, false);
    CHECK(k >= 4 && steps <= 10, "kept again: k %d after %d steps, want >= 4 within 10", k, steps);
    /* each proposal kept with probability 0.6 (a fixed LCG): p^2 = 0.36, p^3 = 0.22, so k should sit at 1..2 (the
     * per-step average reads low, towards 1); averaged over steps 20..59, decided before running: 1.0 .. 2.5 */
    memset(&c, 0, sizeof c);
    c.n_gen = 1;
    uint32_t lcg = 12345;
    double ksum = 0;
    for (int i = 0; i < 60; i++) {
        k = sched_spec_k(&c, 16);
        int kept = 0;
        while (kept < k && ((lcg = lcg * 1664525u + 1013904223u) >> 8) % 1000 < 600)
            kept++;
        sched_spec_learn(&c, k, kept, false); /* k 0: a quiet step, as speculate() records it */
        c.n_gen += kept + 1;
        if (i >= 20)
            ksum += k;
    }
    CHECK(ksum / 40 >= 1.0 && ksum / 40 <= 2.5, "60%% kept: mean k %.2f, want 1.0 .. 2.5", ksum / 40);
    /* a step that ended the choice: the proposals after its end are not rejections */
    memset(&c, 0, sizeof c);
    sched_spec_learn(&c, 4, 2, true);
    CHECK(c.spec_kept == 1 && c.spec_steps == 1, "an ended step counted %.2f of %.2f steps", c.spec_kept,
          c.spec_steps);
    sched_spec_learn(&c, 4, 2, false);
    CHECK(fabsf(c.spec_kept - (0.7f + 2.0f / 3)) < 1e-6f && fabsf(c.spec_steps - 1.7f) < 1e-6f,
          "after a rejection: %.3f of %.3f steps, want 1.367 of 1.7", c.spec_kept, c.spec_steps);
    sched_spec_learn(&c, 0, 0, false);
    CHECK(fabsf(c.spec_steps - 1.53f) < 1e-6f, "a step without proposals: %.3f steps, want 1.7 faded to 1.53",
          c.spec_steps);
}

/* ---- sampled rows: the rule and its distribution ------------------------------------------------------------ */

/*
 * The two-sample chi-square test, its parameters fixed before any sample was looked at:
 *   cells     the CHI_TOP categories with the largest pooled count (ties: the caller's order), then "other"
 *             (the rest); a cell whose pooled count is below CHI_MIN joins "other", so every expected count
 *             is >= 5 per sample (the usual condition for the chi-square approximation) — an empty "other"
 *             is no cell;
 *   statistic for samples of equal size, sum over cells of (a - b)^2 / (a + b), chi-square with cells - 1
 *             degrees of freedom under the null (same distribution);
 *   alpha     0.001 per test (three tests in this file: the correct rule on synthetic logits and the two model
 *             positions), so a true null fails none of them with probability > 0.99; the seeds are fixed, so the
 *             outcome is deterministic, and a wrong rule still shows: the two wrong rules below move a cell's
 *             probability by 0.18 and 0.76, statistics in the hundreds at these sizes.
 */
#define CHI_TOP 7
#define CHI_MIN 10
static const double chi2_crit_001[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322}; /* df 1..7 */

typedef struct cat {
    int a, b; /* counts in the two samples */
} cat;

static int cat_cmp(const void *x, const void *y)
{
    const cat *p = x, *q = y;
    return (q->a + q->b) - (p->a + p->b);
}

/* The statistic over categories c[0..n) (reordered: stable within equal pooled counts is not needed, the counts
 * alone decide the cells' contents); *df its degrees of freedom. */
static double chi2_two(cat *c, int n, int *df)
{
    qsort(c, (size_t)n, sizeof *c, cat_cmp);
    double x = 0;
    int cells = 0;
    cat other = {0, 0};
    for (int i = 0; i < n; i++) {
        if (i >= CHI_TOP || c[i].a + c[i].b < CHI_MIN) {
            other.a += c[i].a, other.b += c[i].b;
            continue;
        }
        double d = c[i].a - c[i].b;
        x += d * d / (c[i].a + c[i].b);
        cells++;
    }
    if (other.a + other.b > 0) {
        double d = other.a - other.b;
        x += d * d / (other.a + other.b);
        cells++;
    }
    *df = cells - 1;
    return x;
}

/* True when the test rejects "same distribution" (df outside the table: too few cells to test counts as a
 * failure of the setup, reported by the caller). */
static bool chi2_rejects(double x, int df)
{
    return df < 1 || df > 7 || x > chi2_crit_001[df];
}

/* sample_next_ahead against sample_next on a state that really observed the proposals. */
static void test_ahead_exact(void)
{
    char err[256];
    enum { V = 40 };
    float logits[V];
    for (int i = 0; i < V; i++)
        logits[i] = (float)(((i * 37) % 17) - 8) * 0.3f;
    int32_t ahead[3] = {5, 9, 5}; /* a repeated id: counted twice */
    sample_params ps[3];
    memset(ps, 0, sizeof ps);
    ps[0].temperature = 1, ps[0].top_p = 1, ps[0].frequency_penalty = 0.7f, ps[0].presence_penalty = 0.4f;
    ps[1].temperature = 0.8f, ps[1].top_p = 0.9f, ps[1].top_k = 12, ps[1].repetition_penalty = 1.3f;
    ps[1].logprobs = true, ps[1].n_top_logprobs = 3;
    int32_t prompt[] = {9, 11};
    ps[1].prompt = prompt, ps[1].n_prompt = 2;
    ps[2].temperature = 0, ps[2].top_p = 1, ps[2].frequency_penalty = 2.5f;
    sample_scratch sc;
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    int agree = 0, total = 0;
    for (int k = 0; k < 3; k++)
        for (int seed = 0; seed < 100; seed++)
            for (int j = 0; j <= 3; j++) {
                sample_state a, b;
                CHECK(sample_state_init(&a, &ps[k], (uint64_t)seed, 0, V, 16, err, sizeof err) == 0 &&
                          sample_state_init(&b, &ps[k], (uint64_t)seed, 0, V, 16, err, sizeof err) == 0,
                      "state: %s", err);
                sample_result ra, rb, r2a, r2b;
                /* a: the plain run generated ahead[0..j) (one draw each), then draws */
                for (int i = 0; i < j; i++)
                    sample_next(logits, V, &ps[k], &a, &sc, &ra, err, sizeof err), sample_observe(&a, ahead[i], err, sizeof err);
                sample_next(logits, V, &ps[k], &a, &sc, &ra, err, sizeof err);
                /* b: speculative position j */
                CHECK(sample_next_ahead(logits, V, &ps[k], &b, ahead, j, &sc, &rb, err, sizeof err) == 0, "ahead: %s",
                      err);
                bool same = ra.token == rb.token && ra.logprob == rb.logprob && ra.n_top == rb.n_top;
                for (int t = 0; same && t < ra.n_top; t++)
                    same = ra.top_id[t] == rb.top_id[t];
                /* then b keeps ahead[0..j) and ra's token: skip their draws, observe; the next draws agree */
                for (int i = 0; i < j; i++)
                    sample_observe(&b, ahead[i], err, sizeof err);
                sample_observe(&b, rb.token, err, sizeof err);
                sample_skip(&b, &ps[k], j + 1);
                sample_observe(&a, ra.token, err, sizeof err);
                sample_next(logits, V, &ps[k], &a, &sc, &r2a, err, sizeof err);
                sample_next(logits, V, &ps[k], &b, &sc, &r2b, err, sizeof err);
                agree += same && r2a.token == r2b.token;
                total++;
                sample_state_free(&a);
                sample_state_free(&b);
            }
    CHECK(agree == total, "sample_next_ahead agreed with the observed state in %d of %d draws", agree, total);
    sample_scratch_free(&sc);
}

/* The rule (a position's draw is kept; the proposal stays only when the draw equals it) against plain draws, and
 * two wrong rules that the same statistic must reject. */
static void test_rule_chi2(void)
{
    char err[256];
    enum { V = 6, N = 2000 };
    const float logits[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f}; /* p ~ .39 .24 .14 .09 .05 .03 */
    const int32_t x = 1;                                           /* the proposal */
    sample_params p = {0};
    p.temperature = 1, p.top_p = 1;
    sample_scratch sc;
    CHECK(sample_scratch_init(&sc, V, err, sizeof err) == 0, "scratch: %s", err);
    cat ref_rule[V] = {{0, 0}}, ref_always[V] = {{0, 0}}, ref_redraw[V] = {{0, 0}};
    for (int s = 0; s < N; s++) {
        sample_state a, b;
        sample_result r;
        sample_state_init(&a, &p, (uint64_t)s, 7, V, 4, err, sizeof err);
        sample_state_init(&b, &p, (uint64_t)(N + s), 7, V, 4, err, sizeof err);
        sample_next(logits, V, &p, &a, &sc, &r, err, sizeof err);
        ref_rule[r.token].a++, ref_always[r.token].a++, ref_redraw[r.token].a++;
        /* the runner's rule: position 0's draw t; x kept when t == x, else t is the corrected token */
        sample_next_ahead(logits, V, &p, &b, NULL, 0, &sc, &r, err, sizeof err);
        int32_t t = r.token;
        ref_rule[t].b++;
        ref_always[x].b++; /* wrong: the proposal always kept */
        if (t != x) /* wrong: on a rejection a fresh draw from the whole p (x included) */
            sample_next_ahead(logits, V, &p, &b, &x, 1, &sc, &r, err, sizeof err), t = r.token;
        ref_redraw[t].b++;
        sample_state_free(&a);
        sample_state_free(&b);
    }
    int df;
    double c = chi2_two(ref_rule, V, &df);
    CHECK(!chi2_rejects(c, df), "the rule: chi-square %.2f with %d df rejected at 0.001", c, df);
    fprintf(stderr, "synthetic: the rule %.2f (df %d)", c, df);
    c = chi2_two(ref_always, V, &df);
    CHECK(chi2_rejects(c, df), "always keeping the proposal: chi-square %.2f with %d df not rejected", c, df);
    fprintf(stderr, ", always keep %.2f (df %d)", c, df);
    c = chi2_two(ref_redraw, V, &df);
    CHECK(chi2_rejects(c, df), "redrawing from the whole p: chi-square %.2f with %d df not rejected", c, df);
    fprintf(stderr, ", redraw from p %.2f (df %d)\n", c, df);
    sample_scratch_free(&sc);
}

/* Category index of token text t in names (appended when new); n its count. */
static int cat_of(json_t *names, const char *t)
{
    size_t i;
    json_t *v;
    json_array_foreach(names, i, v) if (!strcmp(json_string_value(v), t)) return (int)i;
    json_array_append_new(names, json_string(t));
    return (int)json_array_size(names) - 1;
}

/* speculation's proposed tokens from a job's summary line, -1 when missing */
static long proposed(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    long v = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *q = strstr(line, "proposed tokens accepted");
        long acc, prop;
        if (q && (q = strstr(line, "decode steps, ")) && sscanf(q, "decode steps, %ld of %ld", &acc, &prop) == 2)
            v = prop;
    }
    if (f)
        fclose(f);
    return v;
}

/*
 * The tiny model at temperature 1 on a prompt of repeated " NF": its answers mostly go " evidence evidence ...",
 * so from the third token on the lookup proposes " evidence" (a unigram of its own output) and the rule decides
 * every time.  Tokens 3 and 4 (positions 2 and 3) are compared, each by its own test.  N = 600 rows a side:
 * the sanitizer build samples ~4 ms a token over the 49,152-token vocabulary, so the two jobs take ~20 s of 2
 * cores; a cell's share is then resolved to about +-2 points (the wrong rules above move one by 18 and more).
 */
static void test_model_chi2(void)
{
    enum { N = 600, MT = 4 };
    char tmp[] = "/tmp/spill_test_spec_chi2_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    static const char *const arm[2] = {"off", "lookup"};
    json_t *names = json_array();
    cat c[2][2048];
    memset(c, 0, sizeof c);
    int n_cat = 0;
    for (int a = 0; a < 2; a++) {
        char in[300];
        snprintf(in, sizeof in, "%s/%s.jsonl", tmp, arm[a]);
        FILE *f = fopen(in, "w");
        for (int i = 0; i < N; i++) /* disjoint seeds: off 0..N-1, lookup N..2N-1 */
            fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":"
                       "\"t\",\"prompt\":\" NF NF NF NF NF NF NF NF\",\"max_tokens\":%d,\"temperature\":1,"
                       "\"seed\":%d,\"logprobs\":0}}\n", i, MT, a * N + i);
        fclose(f);
        int rc = sh("%s run %s %s -o %s/%s --quiet --speculate %s >%s/%s.log 2>&1", bin(), MODEL, in, tmp, arm[a],
                    arm[a], tmp, arm[a]);
        CHECK(rc == 0, "the %s run failed (%s/%s.log)", arm[a], tmp, arm[a]);
        char path[300];
        snprintf(path, sizeof path, "%s/%s/results.jsonl", tmp, arm[a]);
        json_t *lines = read_lines(path);
        CHECK(json_array_size(lines) == N, "%s: %zu answers of %d", arm[a], json_array_size(lines), N);
        size_t i;
        json_t *o;
        json_array_foreach(lines, i, o)
        {
            json_t *ch = json_array_get(json_object_get(json_object_get(json_object_get(o, "response"), "body"),
                                                        "choices"), 0);
            json_t *toks = json_object_get(json_object_get(ch, "logprobs"), "tokens");
            for (int pos = 2; pos < 4; pos++) {
                const char *t = json_string_value(json_array_get(toks, (size_t)pos));
                int k = cat_of(names, t ? t : "(none: the answer ended)");
                if (k < 2048) {
                    if (a == 0)
                        c[pos - 2][k].a++;
                    else
                        c[pos - 2][k].b++;
                }
            }
        }
        json_decref(lines);
    }
    n_cat = (int)json_array_size(names);
    CHECK(n_cat <= 2048, "%d categories overflow the table", n_cat);
    char log[300];
    snprintf(log, sizeof log, "%s/lookup.log", tmp);
    long prop = proposed(log);
    CHECK(prop >= N / 5, "%ld tokens proposed over %d rows: too few for the rule to be tested (want >= %d)", prop, N,
          N / 5);
    for (int pos = 0; pos < 2; pos++) {
        int df;
        double x = chi2_two(c[pos], n_cat < 2048 ? n_cat : 2048, &df);
        fprintf(stderr, "tiny model, token %d: chi-square %.2f with %d df (critical %.2f), %ld proposed\n", pos + 3, x,
                df, df >= 1 && df <= 7 ? chi2_crit_001[df] : 0.0, prop);
        CHECK(!chi2_rejects(x, df), "token %d: with and without speculation differ (chi-square %.2f, %d df)", pos + 3,
              x, df);
    }
    json_decref(names);
    if (!test_failures)
        sh("rm -rf %s", tmp);
}

/* The ETA prices speculation (sched_estimate): 8 rows decoding, 100 new tokens each to go, under a pass-count-only
 * fit (1 s a pass).  Without speculation's history that is 100 passes; a job whose decode steps so far kept 2
 * proposals a step on average (3 tokens a step) has ceil(100 / 3) = 34 left.  Bounds decided first: within 2 passes
 * of each (the simulation's rounding of the last step), a third of the plain figure at most. */
static void test_eta_spec(void)
{
    char err[SPILL_ERRLEN] = "";
    kv_cache kv;
    CHECK(kv_create(&kv, 1, 1, 1, 16, 1024, err, sizeof err) == 0, "kv_create: %s", err);
    enum { N = 8 };
    row rows[N];
    choice ch[N];
    size_t active[N];
    memset(rows, 0, sizeof rows);
    memset(ch, 0, sizeof ch);
    for (int i = 0; i < N; i++) {
        rows[i].n_prompt = 10;
        rows[i].max_new = 100;
        rows[i].n_choices = 1;
        rows[i].state = ROW_ACTIVE;
        rows[i].ch = &ch[i];
        ch[i].fed = 10;
        active[i] = (size_t)i;
    }
    sched s;
    memset(&s, 0, sizeof s);
    s.kv = &kv;
    s.rows = rows;
    s.n_rows = N;
    s.active = active;
    s.n_active = N;
    s.cfg.batch = N;
    s.cfg.max_seqs = N;
    s.cfg.prefill_chunk = 64;
    calib c;
    memset(&c, 0, sizeof c);
    c.c[0] = 1.0;
    c.valid = true;
    double plain = sched_estimate(&s, &c);
    s.decode_steps = 400;
    s.spec_proposed = 1200;
    s.spec_kept = 800;
    double spec = sched_estimate(&s, &c);
    CHECK(fabs(plain - 100) <= 2, "ETA without speculation: %.1f passes, want 100", plain);
    CHECK(fabs(spec - 34) <= 2 && spec <= plain / 3 + 1, "ETA at 3 tokens a step: %.1f passes, want 34", spec);
    kv_destroy(&kv);
}

int main(void)
{
    test_propose();
    test_eta_spec();
    test_truncate();
    test_k_policy();
    test_ahead_exact();
    test_rule_chi2();
    test_model_chi2();
    test_jobs();
    return test_finish("test_spec");
}
