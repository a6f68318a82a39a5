/*
 * test_run.c — `spill run` / `spill resume` end to end through the real
 * binary (build/asan/spill, or $SPILL_BIN), on tests/data/tiny/tiny-smollm2.gguf
 * (SmolLM2's real vocabulary and chat template, a tiny random-weight body).
 *
 * The input mixes greedy chat rows, seeded sampled rows (top_p), n = 2,
 * stop strings with log-probs, and /v1/completions rows, plus two bad rows.
 * Every variant must produce the same answers as a reference run, row by row
 * (ids and timestamps aside):
 *   - streamed from disk instead of resident (bit-identical forward), and the
 *     same model repacked into spill's layer-contiguous layout, streamed;
 *   - batch 1 instead of 64 (a row's tokens do not depend on its batch-mates,
 *     seeded sampling included);
 *   - a KV cache three times too small for the rows in flight (admission
 *     waits, rows are preempted and recomputed; nothing fails);
 *   - killed with SIGKILL at random moments and resumed until done (no row
 *     lost, none duplicated, every line valid JSON);
 *   - SIGINT: exit 75 within 5 s, then resume completes the job;
 *   - long prompts streamed with the adaptive prompt budget (chunk.h), with a
 *     constant --prefill-chunk, and resident: the same answers.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "batch/plan.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"
#define ROWS 120

static const char *bin(void)
{
    const char *b = getenv("SPILL_BIN");
    return b && *b ? b : "build/asan/spill";
}

static void write_input(const char *path)
{
    FILE *f = fopen(path, "w");
    unsigned x = 12345;
    for (int i = 0; i < ROWS; i++) {
        x = x * 1103515245u + 12345u;
        int kind = i % 6, mt = (int)(4 + (x >> 16) % 30);
        char extra[256] = ",\"temperature\":0"; /* unseeded sampling differs run to run by design */
        if (kind == 1)
            snprintf(extra, sizeof extra, ",\"temperature\":0.8,\"top_p\":0.9,\"seed\":%d", i);
        else if (kind == 2)
            snprintf(extra, sizeof extra, ",\"temperature\":1.0,\"seed\":%d,\"n\":2", 1000 + i);
        else if (kind == 3)
            snprintf(extra, sizeof extra,
                     ",\"temperature\":0,\"stop\":[\"e\",\"the\"],\"logprobs\":true,\"top_logprobs\":3");
        if (kind == 4)
            fprintf(
                f,
                "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"tiny\","
                "\"prompt\":\"Once upon a time %u\",\"max_tokens\":%d,\"temperature\":0}}\n",
                i, x % 997, mt);
        else if (kind == 5 && i % 60 == 5)
            fprintf(f,
                    "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                    "\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":25}}\n",
                    i);
        else
            fprintf(f,
                    "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                    "\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Question %d about %u, answer "
                    "briefly.\"}],\"max_tokens\":%d%s}}\n",
                    i, i, x % 1000, mt, extra);
    }
    fclose(f);
}

/* Runs spill with args; returns the exit status (or -1), killing it after kill_ms with sig if kill_ms > 0. */
/* Signals are sent kill_ms after `wait_for` exists (the job's manifest: before it, there is no job to resume). */
static const char *wait_for;
static long last_maxrss_kb; /* peak RSS of the last child (wait4) */

static int spawn_out(char *const argv[], int kill_ms, int sig, double *elapsed_after_signal, const char *out)
{
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        int o = out ? open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644) : devnull;
        dup2(o, 1);
        dup2(devnull, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    if (kill_ms > 0) {
        struct timespec poll = {0, 2000000L};
        for (int i = 0; wait_for && i < 5000 && access(wait_for, F_OK) != 0; i++)
            nanosleep(&poll, NULL);
        struct timespec ts = {kill_ms / 1000, (long)(kill_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, sig);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0 && errno == EINTR)
        ;
    last_maxrss_kb = ru.ru_maxrss;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (elapsed_after_signal)
        *elapsed_after_signal = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return -WTERMSIG(st);
}

static int spawn(char *const argv[], int kill_ms, int sig, double *elapsed_after_signal)
{
    return spawn_out(argv, kill_ms, sig, elapsed_after_signal, NULL);
}

/* custom_id → canonical answer string (choices' text + finish reasons + usage), from results + errors. */
static json_t *answers(const char *dir, int *n_lines, int *n_errors, int *dups, int *bad_json)
{
    json_t *map = json_object();
    const char *files[2] = {"results.jsonl", "errors.jsonl"};
    *n_lines = *n_errors = *dups = *bad_json = 0;
    for (int fi = 0; fi < 2; fi++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, files[fi]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, f)) > 0) {
            json_error_t je;
            json_t *o = json_loadb(line, (size_t)n, 0, &je);
            const char *id = json_string_value(json_object_get(o, "custom_id"));
            if (!o || !id || line[n - 1] != '\n') {
                (*bad_json)++;
                json_decref(o);
                continue;
            }
            (*n_lines)++;
            if (fi == 1)
                (*n_errors)++;
            if (json_object_get(map, id))
                (*dups)++;
            json_t *body = json_object_get(json_object_get(o, "response"), "body");
            /* cached_tokens depends on the schedule (which prefixes were indexed when the row was admitted),
             * not on the answer: held to 0 <= cached <= prompt here and left out of the comparison. */
            json_t *usage = json_deep_copy(json_object_get(body, "usage"));
            json_t *details = json_object_get(usage, "prompt_tokens_details");
            if (details) {
                json_int_t cached = json_integer_value(json_object_get(details, "cached_tokens"));
                json_int_t prompt = json_integer_value(json_object_get(usage, "prompt_tokens"));
                if (cached < 0 || cached > prompt)
                    (*bad_json)++;
                json_object_del(usage, "prompt_tokens_details");
            }
            json_t *canon = json_pack("{s:O*,s:o*}", "choices", json_object_get(body, "choices"), "usage", usage);
            if (fi == 1)
                json_object_set(canon, "error", json_object_get(json_object_get(body, "error"), "code"));
            json_t *ch = json_object_get(canon, "choices");
            size_t i;
            json_t *c;
            json_array_foreach(ch, i, c) json_object_del(c, "index");
            json_object_set_new(map, id, canon);
            json_decref(o);
        }
        free(line);
        fclose(f);
    }
    return map;
}

static void compare_n(const char *what, json_t *ref, const char *dir, int rows)
{
    int n, ne, dups, bad;
    json_t *got = answers(dir, &n, &ne, &dups, &bad);
    CHECK(n == rows, "%s: %d lines, want %d", what, n, rows);
    CHECK(dups == 0 && bad == 0, "%s: %d duplicate custom_ids, %d invalid lines", what, dups, bad);
    int diff = 0;
    const char *k;
    json_t *v;
    json_object_foreach(ref, k, v)
    {
        json_t *g = json_object_get(got, k);
        if (!g || !json_equal(g, v)) {
            if (diff < 3) {
                char *a = json_dumps(v, JSON_COMPACT), *b = g ? json_dumps(g, JSON_COMPACT) : NULL;
                fprintf(stderr, "%s: %s differs:\n  want %.300s\n  got  %.300s\n", what, k, a, b ? b : "(missing)");
                free(a);
                free(b);
            }
            diff++;
        }
    }
    CHECK(diff == 0, "%s: %d rows differ from the reference run", what, diff);
    json_decref(got);
}

static void compare(const char *what, json_t *ref, const char *dir)
{
    compare_n(what, ref, dir, ROWS);
}

static void rmrf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "rm");
}

/* ---------------------------------------------------------------- the memory budget */

#define LONG_ROWS 96

/* Rows of ~330-token prompts (the tiny model's context is 512): the KV cache, not the process, is what a
 * budget squeezes. */
static void write_long_input(const char *path)
{
    static const char *words[] = {"river", "stone", "cloud", "amber", "violet", "engine", "garden", "silver",
                                  "window", "harbor", "lantern", "meadow", "orbit", "pepper", "quartz", "saddle"};
    FILE *f = fopen(path, "w");
    unsigned x = 777;
    for (int i = 0; i < LONG_ROWS; i++) {
        fprintf(f, "{\"custom_id\":\"m%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                   "\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"",
                i);
        int nw = 250 + i % 70;
        for (int w = 0; w < nw; w++) {
            x = x * 1103515245u + 12345u;
            fprintf(f, "%s%s", w ? " " : "", words[(x >> 16) % 16]);
        }
        fprintf(f, "\"}],\"max_tokens\":%d,\"temperature\":0}}\n", 8 + i % 24);
    }
    fclose(f);
}

/* Reads up to cap-1 bytes of a file into buf (empty when it cannot be read). */
static void read_head(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[got] = 0;
    if (f)
        fclose(f);
}

/* "...KV 2.1 MB (N pages of 16 tokens; the batch wants W)" and "memory plan X MB of" from a pre-run line. */
static int parse_plan(const char *log, double *plan_mb, long *pages, long *want)
{
    char buf[8192];
    read_head(log, buf, sizeof buf);
    const char *p = strstr(buf, "memory plan "), *k = strstr(buf, " pages of 16 tokens; the batch wants ");
    if (!p || !k)
        return -1;
    *plan_mb = strtod(p + 12, NULL);
    if (!strncmp(strchr(p + 12, ' '), " GB", 3))
        *plan_mb *= 1000;
    const char *q = k;
    while (q > buf && q[-1] >= '0' && q[-1] <= '9')
        q--;
    *pages = strtol(q, NULL, 10);
    *want = strtol(k + strlen(" pages of 16 tokens; the batch wants "), NULL, 10);
    return 0;
}

/* A job whose rows need 3x the KV memory the budget leaves finishes with every row answered as in a roomy
 * run, and the process's peak RSS (wait4) stays under the budget.  Runs the release binary: ASan's shadow
 * memory is not the engine's. */
static void test_memory_budget(const char *tmp)
{
    const char *b = getenv("SPILL_REL_BIN") && *getenv("SPILL_REL_BIN") ? getenv("SPILL_REL_BIN") : "./spill";
    char input[600], ref[600], d[600], log[700];
    snprintf(input, sizeof input, "%s/long.jsonl", tmp);
    write_long_input(input);
    snprintf(ref, sizeof ref, "%s/mref", tmp);
    snprintf(log, sizeof log, "%s/mref.log", tmp);
    char *a_ref[] = {(char *)b, "run", MODEL, input, "-o", ref, "--quiet", "--batch", "64", "--mem-budget", "64M", NULL};
    CHECK(spawn_out(a_ref, 0, 0, NULL, log) == 0, "roomy memory-budget reference run failed (%s)", b);
    double plan_mb;
    long pages, want;
    CHECK(parse_plan(log, &plan_mb, &pages, &want) == 0, "no memory plan in the pre-run line (%s)", log);
    CHECK(pages == want && want > 300, "roomy run: %ld KV pages for the %ld wanted", pages, want);
    int n, ne, dups, bad;
    json_t *refm = answers(ref, &n, &ne, &dups, &bad);
    CHECK(n == LONG_ROWS && ne == 0, "roomy run: %d lines, %d errors", n, ne);
    /* fixed costs without slack, then the budget whose KV share is a third of what the batch wants
     * (0.3 MB under it: the plan printed to 0.1 MB) */
    double page = 16.0 * 256; /* 16 tokens x 2 layers x 1 KV head x 32 dims x K and V x 4 bytes */
    double fixed = plan_mb * 1e6 - (double)want * page - (double)plan_slack(64ull << 20);
    double target = (double)want / 3 * page - 0.3e6;
    double budget = (fixed + 4.0 * 1048576 + target) * 50.0 / 49.0;
    char bs[32];
    snprintf(bs, sizeof bs, "%.0f", budget);
    snprintf(d, sizeof d, "%s/mtight", tmp);
    snprintf(log, sizeof log, "%s/mtight.log", tmp);
    char *a_t[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--batch", "64", "--mem-budget", bs, NULL};
    CHECK(spawn_out(a_t, 0, 0, NULL, log) == 0, "run under a %s-byte budget failed (see %s)", bs, log);
    long tpages, twant;
    CHECK(parse_plan(log, &plan_mb, &tpages, &twant) == 0, "no memory plan in %s", log);
    CHECK(tpages * 3 <= twant && tpages > 0, "budget %s left %ld KV pages; the batch wants %ld (want >= 3x)", bs,
          tpages, twant);
    fprintf(stderr, "memory budget %s bytes: KV %ld of %ld wanted pages, peak RSS %ld kB\n", bs, tpages, twant,
            last_maxrss_kb);
    CHECK((double)last_maxrss_kb * 1024 <= budget, "peak RSS %ld kB is over the %s-byte budget", last_maxrss_kb, bs);
    compare_n("KV 3x over the memory budget", refm, d, LONG_ROWS);
    json_decref(refm);
}

/* The prompt tokens per pass: streamed without --prefill-chunk they adapt to the passes' times (chunk.h), which
 * must not change a row's tokens.  The long rows (~330-token prompts, 16 at once) answer the same streamed and
 * adaptive, streamed with a constant --prefill-chunk 40, and resident with the default constant; the lines say
 * how the tokens were chosen; and the adaptive run's chunks really differ from a constant's: once half the rows
 * decode, a clean-pass probe is held to the 64-token floor while prompts wait (the first pass took the whole cap).
 * Release binary: three CPU runs of 96 long rows. */
static void test_adaptive_chunk(const char *tmp)
{
    const char *b = getenv("SPILL_REL_BIN") && *getenv("SPILL_REL_BIN") ? getenv("SPILL_REL_BIN") : "./spill";
    char input[600], ref[600], d[600], log[700], plog[700], buf[8192];
    snprintf(input, sizeof input, "%s/long.jsonl", tmp);
    write_long_input(input);
    snprintf(ref, sizeof ref, "%s/cref", tmp);
    snprintf(log, sizeof log, "%s/cref.log", tmp);
    char *a_ref[] = {(char *)b, "run", MODEL, input, "-o", ref, "--batch", "16", "--resident", "--quiet", NULL};
    CHECK(spawn_out(a_ref, 0, 0, NULL, log) == 0, "resident constant-chunk run failed (%s)", b);
    read_head(log, buf, sizeof buf);
    CHECK(strstr(buf, "prompt tokens per pass: 256 (weights resident") != NULL,
          "the resident run does not say its prompt tokens per pass are the constant 256: %.400s", buf);
    int n, ne, dups, bad;
    json_t *refm = answers(ref, &n, &ne, &dups, &bad);
    CHECK(n == LONG_ROWS && ne == 0, "resident constant-chunk run: %d lines, %d errors", n, ne);

    snprintf(d, sizeof d, "%s/cadapt", tmp);
    snprintf(log, sizeof log, "%s/cadapt.log", tmp);
    snprintf(plog, sizeof plog, "%s/cadapt.csv", tmp);
    char *a_ad[] = {(char *)b, "run", MODEL, input, "-o", d, "--batch", "16", "--stream", "--pass-log", plog, "--quiet",
                    NULL};
    CHECK(spawn_out(a_ad, 0, 0, NULL, log) == 0, "streamed adaptive run failed (see %s)", log);
    read_head(log, buf, sizeof buf);
    CHECK(strstr(buf, "prompt tokens per pass: adaptive, 1.25x the clean pass (at most 256)") != NULL,
          "the adaptive run's pre-run line does not say so: %.400s", buf);
    CHECK(strstr(buf, "prompt tokens per pass: adaptive, 1.25x the clean pass (last ") != NULL,
          "the adaptive run's summary does not say how prompt tokens per pass were chosen: %.400s", buf);
    compare_n("streamed, adaptive prompt tokens per pass", refm, d, LONG_ROWS);
    /* the budget bounds only passes where at least half of the 16 rows decode: before that the first pass takes
     * the whole cap (256 and the free decode slots); once 8 rows decode, a probe at the 64-token floor comes,
     * then a bounded pass that takes more than the floor */
    FILE *f = fopen(plog, "r");
    int pass, seqs, dec, pre, first = -1, probe_at = -1, after = -1;
    if (f) {
        CHECK(fgets(buf, sizeof buf, f) != NULL, "empty pass log %s", plog);
        while (fscanf(f, "%d,%d,%d,%d%*[^\n]", &pass, &seqs, &dec, &pre) == 4) {
            if (first < 0)
                first = pre;
            else if (probe_at < 0 && dec >= 8 && pre > 0 && pre <= 64)
                probe_at = pass;
            else if (probe_at >= 0 && after < 0 && pre > 64)
                after = pre;
        }
        fclose(f);
    }
    CHECK(first >= 256 && probe_at > 0 && after > 64,
          "adaptive run's passes: the first carried %d prompt tokens (want the cap, 256, or more), the probe at the "
          "floor with 8 rows decoding came at pass %d (want one), a later pass carried %d (want more than 64)",
          first, probe_at, after);

    snprintf(d, sizeof d, "%s/cfixed", tmp);
    snprintf(log, sizeof log, "%s/cfixed.log", tmp);
    char *a_fx[] = {(char *)b, "run", MODEL, input, "-o", d, "--batch", "16", "--stream", "--prefill-chunk", "40",
                    "--quiet", NULL};
    CHECK(spawn_out(a_fx, 0, 0, NULL, log) == 0, "streamed --prefill-chunk 40 run failed (see %s)", log);
    read_head(log, buf, sizeof buf);
    CHECK(strstr(buf, "prompt tokens per pass: 40 (--prefill-chunk)") != NULL,
          "the --prefill-chunk run does not say its chunk is the constant 40: %.400s", buf);
    compare_n("streamed, --prefill-chunk 40", refm, d, LONG_ROWS);
    json_decref(refm);
}

/* N from the "..., N preemptions" of a run's summary line; -1 when absent. */
static long preemptions_of(const char *buf)
{
    const char *p = strstr(buf, " preemptions");
    if (!p)
        return -1;
    const char *q = p;
    while (q > buf && q[-1] >= '0' && q[-1] <= '9')
        q--;
    return q == p ? -1 : strtol(q, NULL, 10);
}

int main(void)
{
    char tmp[] = "/tmp/spill_test_run_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char input[600], ref[600], d[600];
    snprintf(input, sizeof input, "%s/in.jsonl", tmp);
    write_input(input);
    const char *b = bin();

    /* reference: resident, batch 64 */
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    char *a_ref[] = {(char *)b, "run", MODEL, input, "-o", ref, "--quiet", "--batch", "64", NULL};
    CHECK(spawn(a_ref, 0, 0, NULL) == 0, "reference run failed");
    int n, ne, dups, bad;
    json_t *refm = answers(ref, &n, &ne, &dups, &bad);
    CHECK(n == ROWS && dups == 0 && bad == 0, "reference: %d lines, %d dups, %d bad", n, dups, bad);
    CHECK(ne == 2, "reference: %d error rows, want the 2 bad rows", ne);
    /* every line validates against the official openai package's types (installed in .venv by tools/setup.sh) */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, ".venv/bin/python tools/check_output_schema.py %s/results.jsonl %s/errors.jsonl", ref,
             ref);
    CHECK(system(cmd) == 0, "output lines do not validate against the openai types (%s); run tools/setup.sh", cmd);

    /* --kv-dtype is the GPU engine's: on the CPU it is refused (usage, exit 2) before a job exists, and an
     * unknown type is a usage error too */
    snprintf(d, sizeof d, "%s/kvi8", tmp);
    char *a_kvd[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--cpu", "--kv-dtype", "int8", NULL};
    CHECK(spawn(a_kvd, 0, 0, NULL) == 2 && access(d, F_OK) != 0, "--kv-dtype int8 on the CPU: not refused up front");
    char *a_kvx[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--kv-dtype", "fp8", NULL};
    CHECK(spawn(a_kvx, 0, 0, NULL) == 2 && access(d, F_OK) != 0, "--kv-dtype fp8: not a usage error");

    snprintf(d, sizeof d, "%s/stream", tmp);
    char *a_st[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--stream", "--stream-slots", "2", NULL};
    CHECK(spawn(a_st, 0, 0, NULL) == 0, "streamed run failed");
    compare("streamed", refm, d);

    /* spill's packed layout (--quant none: the same weight bytes, each layer one 4 KiB-aligned block), streamed */
    char packed[700];
    snprintf(packed, sizeof packed, "%s/packed.gguf", tmp);
    char *a_pk[] = {(char *)b, "pack", MODEL, "--quant", "none", "-o", packed, NULL};
    CHECK(spawn(a_pk, 0, 0, NULL) == 0, "spill pack --quant none failed");
    snprintf(d, sizeof d, "%s/packed", tmp);
    char *a_ps[] = {(char *)b, "run", packed, input, "-o", d, "--quiet", "--stream", "--stream-slots", "2", NULL};
    CHECK(spawn(a_ps, 0, 0, NULL) == 0, "streamed run of the packed model failed");
    compare("packed layout, streamed", refm, d);

    snprintf(d, sizeof d, "%s/b1", tmp);
    char *a_b1[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--batch", "1", NULL};
    CHECK(spawn(a_b1, 0, 0, NULL) == 0, "batch-1 run failed");
    compare("batch 1", refm, d);

    /* KV pressure: 16-token pages of 256 bytes/token = 4 KiB; 48 KiB holds 12 pages, while 32 rows in flight
     * (up to 2 choices each, ~40-70 positions) want ~100.  --batch 32 admits rows as their prompts fit and
     * preempts as they grow; from memory (no --batch) admits only while every admitted row fits at its
     * max_tokens, so it never preempts.  Both answer as the reference does. */
    snprintf(d, sizeof d, "%s/kv", tmp);
    char *a_kv[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--batch", "32", "--kv-mem", "48K", NULL};
    char log[700], buf[4096];
    snprintf(log, sizeof log, "%s/kv.log", tmp);
    CHECK(spawn_out(a_kv, 0, 0, NULL, log) == 0, "KV-pressure run failed");
    read_head(log, buf, sizeof buf);
    long npre = preemptions_of(buf);
    CHECK(npre > 0, "KV-pressure run with --batch 32 reported no preemptions: %.200s", buf);
    compare("KV 3x oversubscribed", refm, d);
    snprintf(d, sizeof d, "%s/kvmem", tmp);
    char *a_km[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--kv-mem", "48K", NULL};
    CHECK(spawn_out(a_km, 0, 0, NULL, log) == 0, "KV-pressure run with the batch from memory failed");
    read_head(log, buf, sizeof buf);
    npre = preemptions_of(buf);
    CHECK(npre == 0, "batch from memory under KV pressure preempted %ld rows: %.300s", npre, buf);
    CHECK(strstr(buf, " from memory (the KV pages hold ") != NULL, "the pre-run line does not say where the batch came "
          "from: %.300s", buf);
    compare("KV pressure, batch from memory", refm, d);

    /* SIGKILL at random moments, then resume until done. */
    snprintf(d, sizeof d, "%s/kill", tmp);
    char *a_k[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--batch", "1", NULL};
    char *a_r[] = {(char *)b, "resume", d, "--quiet", NULL};
    unsigned seed = 99;
    char man[700];
    snprintf(man, sizeof man, "%s/manifest.json", d);
    wait_for = man;
    int rc = spawn(a_k, 50, SIGKILL, NULL), kills = 0, resumes = 0;
    kills += rc == -SIGKILL;
    for (int i = 0; i < 40 && rc != 0; i++) {
        seed = seed * 1103515245u + 12345u;
        int ms = (int)(5 + (seed >> 16) % 80);
        rc = spawn(a_r, i < 14 ? ms : 0, SIGKILL, NULL);
        resumes++;
        kills += rc == -SIGKILL;
    }
    CHECK(rc == 0, "resume after kills did not finish (rc %d)", rc);
    fprintf(stderr, "kill -9: %d kills, %d resumes\n", kills, resumes);
    CHECK(kills >= 10, "only %d kills landed; the test did not exercise resume enough", kills);
    compare("killed and resumed", refm, d);

    /* SIGINT: checkpoint and exit 75 within 5 s, then resume. */
    snprintf(d, sizeof d, "%s/int", tmp);
    char *a_i[] = {(char *)b, "run", MODEL, input, "-o", d, "--quiet", "--batch", "1", NULL};
    char *a_ri[] = {(char *)b, "resume", d, "--quiet", NULL};
    double el;
    snprintf(man, sizeof man, "%s/manifest.json", d);
    rc = spawn(a_i, 300, SIGINT, &el);
    CHECK(rc == 75 || rc == 0, "SIGINT: exit %d, want 75", rc);
    CHECK(el < 5.0, "SIGINT: took %.1f s to exit", el);
    if (rc == 75)
        CHECK(spawn(a_ri, 0, 0, NULL) == 0, "resume after SIGINT failed");
    compare("interrupted and resumed", refm, d);

    json_decref(refm);
    test_memory_budget(tmp);
    test_adaptive_chunk(tmp);
    rmrf(tmp);
    return test_finish("test_run");
}
