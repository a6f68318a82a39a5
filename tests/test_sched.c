/*
 * test_sched.c — the runner's scheduler over 10,000 random jobs, on a fake
 * engine and a fake clock: admission, prompt chunks mixed into decode
 * passes, KV page reservation, preemption and recompute, n > 1 sharing the
 * prompt's pages, the end tail, the ETA.
 *
 * The fake engine's "model" is a hash: a sequence's logits are a
 * pseudo-random function of every token id it holds, read back through its
 * KV page table (so a page-table, copy or recompute bug changes the answer);
 * each pass advances the clock by c0 + c_tok * tokens + c_att * pairs.
 * The runner is the real one (run.c is compiled into this test so its
 * static functions can be driven without a model file).
 *
 * Per job, run twice — under a memory plan for a random budget (tight), and
 * with room for every row at once (roomy):
 *   - the plan never exceeds the budget, and no pass holds more KV pages
 *     than the plan gave, more sequences or more tokens than the engine was
 *     sized for (checked inside every forward call);
 *   - every row finishes: the job closes JOB_DONE (completed + failed = total)
 *     with no error rows;
 *   - every row's answer (text, finish reason, token counts) equals the
 *     roomy run's: preemption and recompute change nothing; in odd jobs the
 *     tight run's backend also picks the greedy rows' tokens itself
 *     (forward_pick, as the GPU does) and the answers still agree.
 * And for the larger jobs, the pre-run ETA — from the fit calibrated on the
 * jobs before — lands within 25% of the fake wall time (the target SPEC §5
 * sets for real runs; decided before the first run of this test) in at
 * least 90% of them.
 */
#include "../src/batch/run.c"

#include <dirent.h>

#include "test.h"

#define N_JOBS 10000
#define VOCAB 64
#define STOP_ID 7

typedef struct fake {
    kv_cache kv;
    int max_seqs, max_tokens;
    int32_t plan_pages;
    double clock, c0, c_tok, c_att;
    uint64_t violations, picks;
    char what[200];
} fake;

static fake *g_fake;
static double fake_clock(void) { return g_fake ? g_fake->clock : 0; }

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void violation(fake *f, const char *what)
{
    if (!f->violations++)
        snprintf(f->what, sizeof f->what, "%s", what);
}

static int fake_forward(void *impl, fwd_seq *seqs, int n_seqs, float *logits, char *err, size_t errlen)
{
    fake *f = impl;
    int64_t tokens = 0;
    double att = 0;
    int li = 0;
    if (n_seqs > f->max_seqs)
        violation(f, "a pass carried more sequences than the engine was sized for");
    for (int s = 0; s < n_seqs; s++) {
        fwd_seq *q = &seqs[s];
        if (q->n < 1 || (int64_t)q->pos0 + q->n > (int64_t)q->kv->n_pages * f->kv.page_tokens) {
            violation(f, "a pass wrote past the pages its row reserved");
            continue;
        }
        for (int i = 0; i < q->n; i++)
            *kv_key(&f->kv, q->kv, 0, 0, q->pos0 + i) = (float)q->tokens[i];
        tokens += q->n;
        att += (double)q->n * q->pos0 + (double)q->n * (q->n + 1) / 2;
        if (!q->want_logits)
            continue;
        uint64_t h = 12345;
        for (int32_t p = 0; p < q->pos0 + q->n; p++)
            h = mix(h ^ (uint64_t)*kv_key(&f->kv, q->kv, 0, 0, p));
        float *lg = logits + (size_t)li * VOCAB;
        for (int v = 0; v < VOCAB; v++)
            lg[v] = (float)((double)(mix(h + (uint64_t)v) >> 40) / (double)(1u << 24) * 8.0 - 4.0);
        li++;
    }
    if (tokens > f->max_tokens)
        violation(f, "a pass carried more tokens than the engine was sized for");
    if (f->kv.n_pages - f->kv.n_free > f->plan_pages)
        violation(f, "more KV pages held than the plan gave");
    f->clock += f->c0 + f->c_tok * (double)tokens + f->c_att * att;
    return 0;
}

/* The backend-side greedy pick (forward_pick) over the same fake logits: argmax with ties to the lowest id,
 * written straight into the runner's results; the runner samples the other rows from their logits. */
static int fake_forward_pick(void *impl, fwd_seq *seqs, int n_seqs, const int32_t *want, struct sample_result *picks,
                             float *logits, char *err, size_t errlen)
{
    fake *f = impl;
    int R = 0;
    for (int s = 0; s < n_seqs; s++)
        R += seqs[s].want_logits;
    float *all = malloc(((size_t)R + 1) * VOCAB * sizeof *all);
    if (!all)
        return util_errf(err, errlen, "out of memory.");
    int rc = fake_forward(impl, seqs, n_seqs, all, err, errlen);
    for (int k = 0; rc == 0 && k < R; k++) {
        const float *lg = all + (size_t)k * VOCAB;
        if (want[k] < -1) {
            memcpy(logits + (size_t)k * VOCAB, lg, VOCAB * sizeof *lg);
            continue;
        }
        if (want[k] != -1)
            violation(f, "a greedy pick asked for log-probs the row did not request");
        int best = 0;
        for (int v = 1; v < VOCAB; v++)
            if (lg[v] > lg[best])
                best = v;
        picks[k].token = best;
        picks[k].logprob = 0;
        picks[k].n_top = 0;
        f->picks++;
    }
    free(all);
    return rc;
}

static kv_cache *fake_kv(void *impl) { return &((fake *)impl)->kv; }
static int fake_kv_copy(void *impl, kv_row *dst, const kv_row *src, int32_t n)
{
    return kv_row_copy(&((fake *)impl)->kv, dst, src, n);
}
static void fake_close(void *impl) { (void)impl; }

/* One random job. */
typedef struct job_spec {
    int n_rows, batch, chunk, page_tokens;
    uint64_t budget;
    int32_t *prompt_len, *prompt_seed, *max_new, *n_choices, *seeded;
    float *temp;
} job_spec;

static uint64_t g_rng = 0x5eed;
static uint32_t rnd(uint32_t n) { return (uint32_t)((g_rng = mix(g_rng)) % n); }

static void spec_make(job_spec *js, bool big)
{
    memset(js, 0, sizeof *js);
    js->n_rows = big ? 40 + (int)rnd(60) : 1 + (int)rnd(16);
    js->batch = 1 + (int)rnd(big ? 24 : 12);
    js->chunk = 1 + (int)rnd(64);
    js->page_tokens = 1 + (int)rnd(16);
    js->prompt_len = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->prompt_seed = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->max_new = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->n_choices = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->seeded = malloc(sizeof(int32_t) * (size_t)js->n_rows);
    js->temp = malloc(sizeof(float) * (size_t)js->n_rows);
    for (int i = 0; i < js->n_rows; i++) {
        js->prompt_len[i] = 1 + (int32_t)rnd(rnd(4) ? 40 : 200);
        js->prompt_seed[i] = (int32_t)rnd(1u << 30);
        js->max_new[i] = 1 + (int32_t)rnd(rnd(3) ? 12 : 60);
        js->n_choices[i] = rnd(5) ? 1 : 2 + (int32_t)rnd(2);
        js->seeded[i] = rnd(2) == 0;
        js->temp[i] = js->seeded[i] ? 0.9f : 0.0f; /* unseeded rows are greedy: the same answer every run */
    }
}

static void spec_free(job_spec *js)
{
    free(js->prompt_len);
    free(js->prompt_seed);
    free(js->max_new);
    free(js->n_choices);
    free(js->seeded);
    free(js->temp);
}

static model_desc g_model;
static tokenizer *g_tok;
static char g_tmp[64], g_input[128];
static int g_dir_serial;

/* custom_id -> canonical answer, from results.jsonl; counts error lines. */
static json_t *read_answers(const char *dir, int *n_err)
{
    char path[600];
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    json_t *map = json_object();
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)n, 0, &je);
        json_t *body = json_object_get(json_object_get(o, "response"), "body");
        json_t *canon = json_pack("{s:O*,s:O*}", "choices", json_object_get(body, "choices"), "usage",
                                  json_object_get(body, "usage"));
        json_object_set_new(map, json_string_value(json_object_get(o, "custom_id")), canon);
        json_decref(o);
    }
    free(line);
    if (f)
        fclose(f);
    snprintf(path, sizeof path, "%s/errors.jsonl", dir);
    f = fopen(path, "r");
    *n_err = 0;
    int c;
    while (f && (c = fgetc(f)) != EOF)
        *n_err += c == '\n';
    if (f)
        fclose(f);
    return map;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[700];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Runs the job; tight = under the plan for js->budget, else room for every row at once.
 * Returns the answers (NULL on failure); *wall = fake seconds; *eta = pre-run estimate under fit. */
static json_t *run_spec(const job_spec *js, bool tight, bool pick, calib *fit, double *wall, double *eta,
                        int *preempt, uint64_t *picks)
{
    runner r;
    memset(&r, 0, sizeof r);
    char err[SPILL_ERRLEN] = "", dir[128];
    r.o.batch = js->batch;
    r.o.prefill_chunk = js->chunk;
    r.o.page_tokens = js->page_tokens;
    r.o.threads = 1;
    r.o.quiet = true;
    r.m = &g_model;
    r.tok = g_tok;
    r.n_rows = (size_t)js->n_rows;
    r.rows = calloc(r.n_rows, sizeof *r.rows);
    int max_n = 1;
    int64_t all_pages = 0;
    int32_t P = js->page_tokens, min_pages = 1;
    int32_t *need = malloc(sizeof(int32_t) * r.n_rows);
    for (size_t i = 0; i < r.n_rows; i++) {
        row *w = &r.rows[i];
        char id[32];
        snprintf(id, sizeof id, "row-%zu", i);
        w->custom_id = strdup(id);
        w->model = strdup("fake");
        w->endpoint = REQ_EP_CHAT;
        w->line = i + 1;
        w->n_prompt = js->prompt_len[i];
        w->prompt = malloc(sizeof(int32_t) * (size_t)w->n_prompt);
        uint64_t h = (uint64_t)js->prompt_seed[i];
        for (int32_t k = 0; k < w->n_prompt; k++)
            w->prompt[k] = 17 + (int32_t)((h = mix(h)) % (VOCAB - 17));
        w->max_new = js->max_new[i];
        w->n_choices = js->n_choices[i];
        w->sp = (sample_params){js->temp[i], 1.0f, 0, 0, 0, 0, NULL, NULL, false, 0};
        w->has_seed = js->seeded[i];
        w->seed = js->prompt_seed[i];
        w->state = ROW_PENDING;
        max_n = w->n_choices > max_n ? w->n_choices : max_n;
        need[i] = (int32_t)((w->n_prompt + w->max_new + P - 1) / P * w->n_choices);
        all_pages += need[i];
        min_pages = need[i] > min_pages ? need[i] : min_pages;
    }
    r.max_seqs = r.o.batch + max_n;
    qsort(need, r.n_rows, sizeof *need, cmp_desc_i32);
    int64_t want = 0;
    for (size_t i = 0; i < r.n_rows && i < (size_t)r.o.batch; i++)
        want += need[i];
    free(need);
    /* the plan: process, weights and pass buffers are fixed costs; KV pages the rest */
    uint64_t page_bytes = (uint64_t)P * 2 * 4;
    mem_need mn = {tight ? js->budget : (uint64_t)1 << 40, 1u << 20, 2u << 20, 0, 512u << 10, 0, page_bytes,
                   (int32_t)(tight ? want : all_pages), min_pages, 2, 0};
    mem_plan plan;
    json_t *ans = NULL;
    fake f;
    memset(&f, 0, sizeof f);
    if (plan_solve(&mn, &plan, err, sizeof err)) {
        CHECK(0, "plan for a %llu-byte budget: %s", (unsigned long long)mn.budget, err);
        goto out;
    }
    CHECK(plan.total <= mn.budget, "plan of %llu bytes over the %llu budget", (unsigned long long)plan.total,
          (unsigned long long)mn.budget);
    f.max_seqs = r.max_seqs;
    f.max_tokens = r.max_seqs + r.o.prefill_chunk;
    f.plan_pages = plan.kv_pages;
    f.c0 = 0.5;
    f.c_tok = 0.01;
    f.c_att = 1e-5;
    if (kv_create(&f.kv, 1, 1, 1, P, plan.kv_pages, err, sizeof err)) {
        CHECK(0, "kv_create: %s", err);
        goto out;
    }
    r.be = (spill_backend){&f, "fake", 0, fake_forward, fake_kv, fake_kv_copy, fake_close, NULL, NULL};
    if (pick)
        r.be.forward_pick = fake_forward_pick;
    snprintf(dir, sizeof dir, "%s/j%d", g_tmp, g_dir_serial++);
    job_info ji = {"run", g_input, NULL, "fake", "0000", SPILL_VERSION, r.n_rows};
    if (job_create(dir, &ji, NULL, &r.j, err, sizeof err) || setup_passes(&r, err, sizeof err)) {
        CHECK(0, "setup: %s", err);
        goto out;
    }
    g_fake = &f;
    g_fake_clock = fake_clock;
    r.t_start = now_s();
    *eta = estimate_left(&r, fit);
    if (run_passes(&r, err, sizeof err)) {
        CHECK(0, "run_passes: %s", err);
        goto out;
    }
    *wall = now_s() - r.t_start;
    *preempt = (int)r.preemptions;
    *picks = f.picks;
    CHECK(f.violations == 0, "%llu violations: %s", (unsigned long long)f.violations, f.what);
    CHECK(r.rows_done == r.n_rows, "%llu of %zu rows done", (unsigned long long)r.rows_done, r.n_rows);
    int rc = job_close(r.j, JOB_DONE, err, sizeof err);
    r.j = NULL;
    CHECK(rc == 0, "job did not close done: %s", err);
    calib_merge(fit, &r.cal_run);
    int n_err;
    ans = read_answers(dir, &n_err);
    CHECK(n_err == 0 && json_object_size(ans) == r.n_rows, "%d error rows, %zu answers for %zu rows", n_err,
          json_object_size(ans), r.n_rows);
out:
    g_fake_clock = NULL;
    g_fake = NULL;
    if (r.j)
        job_close(r.j, JOB_INTERRUPTED, err, sizeof err);
    r.j = NULL;
    r.m = &g_model; /* runner_free closes the model and tokenizer the job opened: these are shared */
    for (size_t i = 0; i < r.n_rows; i++) {
        if (r.be.impl)
            row_release(&r, &r.rows[i]);
        row_free(&r.rows[i]);
    }
    r.n_rows = 0;
    r.m = NULL;
    r.tok = NULL;
    runner_free(&r);
    kv_destroy(&f.kv);
    rm_dir(dir);
    return ans;
}

int main(void)
{
    char err[SPILL_ERRLEN];
    gguf_file *gf = NULL;
    CHECK(gguf_open("tests/data/tiny/tiny-smollm2.gguf", &gf, err, sizeof err) == 0, "%s", err);
    CHECK(gf && tokenizer_from_gguf(gf, &g_tok, err, sizeof err) == 0, "%s", err);
    if (!g_tok)
        return test_finish("test_sched");
    g_model.vocab = VOCAB;
    g_model.ctx_len = 4096;
    g_model.n_stop = 1;
    g_model.stop_ids[0] = STOP_ID;
    snprintf(g_tmp, sizeof g_tmp, "%s/spill_sched_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    CHECK(mkdtemp(g_tmp) != NULL, "mkdtemp");
    snprintf(g_input, sizeof g_input, "%s/in.jsonl", g_tmp);
    FILE *in = fopen(g_input, "w");
    fputs("{}\n", in);
    fclose(in);

    calib fit;
    memset(&fit, 0, sizeof fit);
    int jobs = 0, big = 0, big_ok = 0, preempted_jobs = 0, differ = 0;
    uint64_t picked = 0;
    double worst = 0;
    for (int j = 0; j < N_JOBS && test_failures < 20; j++) {
        job_spec js;
        bool is_big = j % 50 == 49;
        spec_make(&js, is_big);
        /* a budget between "the longest row alone" and "the whole batch at once" */
        int64_t longest = 0, sum = 0;
        for (int i = 0; i < js.n_rows; i++) {
            int64_t pg = (js.prompt_len[i] + js.max_new[i] + js.page_tokens - 1) / js.page_tokens * js.n_choices[i];
            longest = pg > longest ? pg : longest;
            sum += pg;
        }
        uint64_t fixed = (1u << 20) + (2u << 20) + (512u << 10);
        uint64_t kvb = (uint64_t)(longest + (int64_t)rnd((uint32_t)(sum - longest + 1))) * js.page_tokens * 8;
        /* solve budget - slack(budget) = fixed + kvb */
        js.budget = (uint64_t)((double)(fixed + kvb + (4u << 20)) * 50.0 / 49.0) + 64;
        double wt = 0, wr = 0, eta = -1, eta2;
        int pre = 0, pre2;
        calib before = fit;
        uint64_t np = 0, np2;
        /* odd jobs: the tight run lets the backend pick greedy rows (forward_pick), the roomy run samples
         * every row itself: the answers must still agree */
        json_t *a = run_spec(&js, true, j % 2 == 1, &fit, &wt, &eta, &pre, &np);
        json_t *b = run_spec(&js, false, false, &before, &wr, &eta2, &pre2, &np2);
        picked += np;
        if (a && b && !json_equal(a, b)) {
            if (differ++ < 3) {
                const char *k;
                json_t *v;
                json_object_foreach(b, k, v) if (!json_equal(v, json_object_get(a, k)))
                {
                    char *x = json_dumps(v, JSON_COMPACT), *y = json_dumps(json_object_get(a, k), JSON_COMPACT);
                    fprintf(stderr, "job %d %s: roomy %.300s\n   tight %.300s\n", j, k, x, y ? y : "(none)");
                    free(x);
                    free(y);
                    break;
                }
            }
        }
        preempted_jobs += pre > 0;
        if (is_big && eta > 0 && wt > 0) {
            double e = fabs(eta - wt) / wt;
            big++;
            big_ok += e <= 0.25;
            if (e > 0.25 && getenv("SCHED_VERBOSE"))
                fprintf(stderr, "job %d: eta %.1f wall %.1f (%+.0f%%) rows %d batch %d chunk %d page %d preempt %d\n", j,
                        eta, wt, (eta - wt) / wt * 100, js.n_rows, js.batch, js.chunk, js.page_tokens, pre);
            worst = e > worst ? e : worst;
        }
        json_decref(a);
        json_decref(b);
        spec_free(&js);
        jobs++;
    }
    CHECK(differ == 0, "%d of %d jobs answered differently under the tight plan", differ, jobs);
    CHECK(picked > 1000, "only %llu tokens were picked by the backend", (unsigned long long)picked);
    CHECK(preempted_jobs > jobs / 20, "only %d of %d jobs preempted a row: the budgets did not bite", preempted_jobs,
          jobs);
    CHECK(big >= 150 && big_ok * 10 >= big * 9, "pre-run ETA within 25%% on %d of %d larger jobs (worst %.0f%%)",
          big_ok, big, worst * 100);
    fprintf(stderr,
            "%d jobs, %d with preemptions, %llu greedy tokens picked by the backend; pre-run ETA within 25%% on %d of "
            "%d larger jobs (worst %.0f%%)\n",
            jobs, preempted_jobs, (unsigned long long)picked, big_ok, big, worst * 100);
    rm_dir(g_tmp);
    tokenizer_free(g_tok);
    gguf_close(gf);
    return test_finish("test_sched");
}
