/*
 * test_prefix.c — the prefix cache (src/engine/kv.c's index, src/batch/sched.c's grouping) end to end through the
 * real binary (build/asan/spill, or $SPILL_BIN) on tests/data/tiny/tiny-smollm2.gguf, 16-position KV pages, the
 * CPU engine, with SPILL_KV_CHECK=1: after every pass the run checks that every page's reference count equals
 * the rows that map it (and the index's hold), and fails the job if not.
 *
 * The input, in an order that interleaves its groups (the scheduler must find them):
 *   - a ~150-token system prompt shared by chat rows with different questions (greedy, seeded top_p, log-probs,
 *     and two n = 4 rows: their choices share the row's prompt pages);
 *   - two documents, each asked several questions through /v1/completions, one an echo + logprobs row (prompt
 *     log-probs need every prompt position's logits: such a row computes its whole prompt);
 *   - completions prompts that diverge inside a page (only the full pages before the divergence are shared);
 *   - three identical chat rows;
 *   - unrelated short rows.
 * Checked against the same job with --prefix-cache off, row by row and bit for bit (text, finish reasons,
 * log-probs, usage but cached_tokens):
 *   - a plain run: every group's rows but at most one report cached_tokens > 0 (the first computes the prefix),
 *     the lines' cached_tokens add up to the end summary's figure, the pre-run line says how many are expected
 *     from the cache, and the off run says "(prefix cache off)" and reports 0 everywhere;
 *   - a KV cache too small for the batch (rows are preempted while their prefix is shared: the summary must count
 *     preemptions, or the case was not reached), and --batch 1;
 *   - kill -9 while a group is half answered (results.jsonl part written), resumed until done: no row lost,
 *     none twice;
 *   - the official openai types read every line (tools/check_output_schema.py, when .venv is there).
 */
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"

static char root[] = "/tmp/spill_test_prefix_XXXXXX";

static const char SYS[] =
    "You are a careful assistant for a library of old maps. Every answer names the map, the year it was drawn, the "
    "cartographer when known, and the drawer in the archive where it is kept. You never guess a date: when the "
    "catalogue does not say, you write that the date is unknown. You answer in one short sentence, without "
    "greeting, and you keep place names as the map spells them, even when the modern spelling differs.";

static const char *const DOCS[2] = {
    "Document: The harbour of Vell was dredged in 1821 after the great storm filled its mouth with sand. The work "
    "took three summers and two hundred men, and the new quay was built from the stone of the old fort. Ships of "
    "deeper draught came in the following year, and the town doubled in ten years.",
    "Document: Mira Osk kept bees on the north slope for forty years. She wrote down every swarm, the weather of "
    "each spring and the colour of the honey, in eleven notebooks that the parish keeps. Her notes show the "
    "heather flowering a week earlier each decade."};

/* The group a row belongs to (-1: none) and its line; rows are written in an order that mixes the groups. */
typedef struct {
    int group;
    char line[4096];
} row;

#define MAX_ROWS 48
static row rows[MAX_ROWS];
static int n_rows;
#define N_GROUPS 5 /* 0 system prompt, 1-2 documents, 3 identical prompts, 4 divergence inside a page */

static void add(int group, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(int group, const char *fmt, ...)
{
    row *r = &rows[n_rows];
    r->group = group;
    va_list ap;
    va_start(ap, fmt);
    int at = snprintf(r->line, sizeof r->line, "{\"custom_id\":\"p%d\",\"method\":\"POST\",", n_rows);
    vsnprintf(r->line + at, sizeof r->line - (size_t)at, fmt, ap);
    va_end(ap);
    n_rows++;
}

static void build_rows(void)
{
    static const char *const qs[] = {"Which map shows the river ford?", "Who drew the coast chart?",
                                     "Where is the 1740 survey kept?", "Is the date of the town plan known?",
                                     "Which drawer holds the sea charts?", "What year is the mountain map?",
                                     "Who catalogued the estate maps?", "Which map spells the bay Wenlo?"};
    for (int i = 0; i < 8; i++) {
        char extra[160] = ",\"temperature\":0";
        if (i == 2 || i == 5)
            snprintf(extra, sizeof extra, ",\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3");
        else if (i == 3)
            snprintf(extra, sizeof extra, ",\"temperature\":0.8,\"top_p\":0.9,\"seed\":%d", 40 + i);
        add(0,
            "\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\","
            "\"content\":\"%s\"},{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d%s}}",
            SYS, qs[i], 4 + i % 5, extra);
    }
    for (int i = 0; i < 2; i++)
        add(0,
            "\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\","
            "\"content\":\"%s\"},{\"role\":\"user\",\"content\":\"Name %d maps.\"}],\"max_tokens\":6,"
            "\"temperature\":1.0,\"seed\":%d,\"n\":4%s}}",
            SYS, i + 2, 7 + i, i ? ",\"logprobs\":true,\"top_logprobs\":2" : "");
    static const char *const dq[2][5] = {
        {"When was the harbour dredged?", "How many men worked?", "What was the quay built from?",
         "What happened to the town?", "Why was the dredging needed?"},
        {"How long did Mira keep bees?", "How many notebooks are there?", "Who keeps the notebooks?",
         "What do the notes show?", "Where were the hives?"}};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 5; i++) {
            if (d == 1 && i == 2)
                add(1 + d,
                    "\"url\":\"/v1/completions\",\"body\":{\"model\":\"tiny\",\"prompt\":\"%s\\nQ: %s\\nA:\","
                    "\"max_tokens\":2,\"temperature\":0,\"echo\":true,\"logprobs\":2}}",
                    DOCS[d], dq[d][i]);
            else
                add(1 + d,
                    "\"url\":\"/v1/completions\",\"body\":{\"model\":\"tiny\",\"prompt\":\"%s\\nQ: %s\\nA:\","
                    "\"max_tokens\":%d,\"temperature\":0}}",
                    DOCS[d], dq[d][i], 3 + i);
        }
    for (int i = 0; i < 3; i++)
        add(3, "\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\","
               "\"content\":\"Tell me about the three old bridges of the river town, one by one.\"}],"
               "\"max_tokens\":6,\"temperature\":0}}");
    /* one shared stem of ~40 tokens, then suffixes that part at different positions inside the third page */
    static const char *const tails[] = {"gate.", "gate and the mill.", "wall.", "wall, the tower and the well."};
    for (int i = 0; i < 4; i++)
        add(4,
            "\"url\":\"/v1/completions\",\"body\":{\"model\":\"tiny\",\"prompt\":\"In the spring of that year the "
            "council met in the long hall above the market, and after much argument about money and stone it "
            "voted to rebuild the old %s\",\"max_tokens\":5,\"temperature\":0}}",
            tails[i]);
    for (int i = 0; i < 3; i++)
        add(-1,
            "\"url\":\"/v1/completions\",\"body\":{\"model\":\"tiny\",\"prompt\":\"%d green %s\",\"max_tokens\":4,"
            "\"temperature\":0}}",
            i * 37, i == 1 ? "apples" : "fields");
}

/* Writes the rows in a fixed shuffled order (the groups interleaved). */
static void write_input(const char *path)
{
    int order[MAX_ROWS];
    for (int i = 0; i < n_rows; i++)
        order[i] = i;
    unsigned x = 2024;
    for (int i = n_rows - 1; i > 0; i--) {
        x = x * 1103515245u + 12345u;
        int j = (int)((x >> 16) % (unsigned)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n_rows; i++)
        fprintf(f, "%s\n", rows[order[i]].line);
    fclose(f);
}

/* custom_id -> {body without its ids/times/model and usage's cached_tokens}, from DIR's two files; cached[i] gets
 * row p<i>'s cached_tokens; counts lines, duplicates and lines that do not parse. */
static json_t *answers(const char *dir, long *cached, int *n_lines, int *dups, int *bad)
{
    json_t *map = json_object();
    *n_lines = *dups = *bad = 0;
    for (int fi = 0; fi < 2; fi++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, fi ? "errors.jsonl" : "results.jsonl");
        json_t *lines = read_lines_n(path, bad);
        size_t i;
        json_t *o;
        json_array_foreach(lines, i, o)
        {
            const char *id = json_string_value(json_object_get(o, "custom_id"));
            json_t *body = json_object_get(json_object_get(o, "response"), "body");
            if (!id || (!fi && !body)) {
                (*bad)++;
                continue;
            }
            (*n_lines)++;
            if (json_object_get(map, id))
                (*dups)++;
            json_t *b = json_deep_copy(body ? body : json_object_get(o, "error"));
            json_object_del(b, "id");
            json_object_del(b, "created");
            json_object_del(b, "system_fingerprint");
            json_t *usage = json_object_get(b, "usage");
            json_t *details = json_object_get(usage, "prompt_tokens_details");
            long c = (long)json_integer_value(json_object_get(details, "cached_tokens"));
            if (!details || c < 0 || c > (long)json_integer_value(json_object_get(usage, "prompt_tokens")))
                (*bad)++;
            json_object_del(usage, "prompt_tokens_details");
            int k = id[0] == 'p' ? atoi(id + 1) : -1;
            if (k >= 0 && k < MAX_ROWS)
                cached[k] = c;
            json_object_set_new(map, id, b);
        }
        json_decref(lines);
    }
    return map;
}

/* Rows of want whose answer in got differs (or is missing), naming the first few. */
static int compare(const char *what, json_t *want, json_t *got)
{
    int differ = 0;
    const char *id;
    json_t *w;
    json_object_foreach(want, id, w)
    {
        json_t *g = json_object_get(got, id);
        if (g && json_equal(w, g))
            continue;
        if (differ++ < 3) {
            char *ws = json_dumps(w, JSON_COMPACT | JSON_SORT_KEYS), *gs = g ? json_dumps(g, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
            fprintf(stderr, "  %s: row %s differs:\n    off: %.600s\n    on:  %.600s\n", what, id, ws,
                    gs ? gs : "(missing)");
            free(ws);
            free(gs);
        }
    }
    return differ;
}

static bool file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    bool hit = false;
    while (f && !hit && fgets(line, sizeof line, f))
        hit = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return hit;
}

/* The number after `key` on the first line of path holding it, or -1. */
static long number_after(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    long v = -1;
    while (f && v < 0 && fgets(line, sizeof line, f)) {
        char *p = strstr(line, key);
        if (p)
            v = strtol(p + strlen(key), NULL, 10);
    }
    if (f)
        fclose(f);
    return v;
}

/* " N preemptions" on the done line, or -1. */
static long preemptions(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[4096];
    long v = -1;
    while (f && fgets(line, sizeof line, f)) {
        char *p = strstr(line, " preemptions");
        if (strncmp(line, "done:", 5) || !p)
            continue;
        while (p > line && p[-1] >= '0' && p[-1] <= '9')
            p--;
        v = strtol(p, NULL, 10);
    }
    if (f)
        fclose(f);
    return v;
}


/* Starts `spill run` on the input into dir and SIGKILLs it once results.jsonl holds at least `at` lines (or it
 * ended first); the exit status, or -signal. */
static int run_and_kill(const char *input, const char *dir, int at)
{
    char res[PATH_MAX + 32];
    snprintf(res, sizeof res, "%s/results.jsonl", dir);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(bin(), bin(), "run", MODEL, input, "-o", dir, "--cpu", "--page-tokens", "16", "--batch", "4",
              "--quiet", (char *)NULL);
        _exit(127);
    }
    struct timespec poll = {0, 1000000L};
    int st;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        if (count_lines(res) >= at) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -SIGKILL;
        }
        nanosleep(&poll, NULL);
    }
}

static void check_schema(const char *dir)
{
    if (access(".venv/bin/python", X_OK) != 0) {
        fprintf(stderr, "test_prefix: no .venv, the openai schema check is skipped (run tools/setup.sh)\n");
        return;
    }
    int rc = sh(".venv/bin/python tools/check_output_schema.py %s/results.jsonl %s/errors.jsonl", dir, dir);
    CHECK(rc == 0, "the openai types refused a line of %s", dir);
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("SPILL_KV_CHECK", "1", 1);
    build_rows();
    char input[PATH_MAX];
    snprintf(input, sizeof input, "%s/in.jsonl", root);
    write_input(input);

    const char *cmd = "%s run " MODEL " %s -o %s/%s --cpu --page-tokens 16 %s > %s/%s.log 2>&1";
    int rc = sh(cmd, bin(), input, root, "off", "--prefix-cache off --batch 8", root, "off");
    CHECK(rc == 0, "the --prefix-cache off run: exit %d (%s/off.log)", rc, root);
    rc = sh(cmd, bin(), input, root, "on", "--batch 8", root, "on");
    CHECK(rc == 0, "the prefix-cache run: exit %d (%s/on.log)", rc, root);

    char dir[PATH_MAX], log[PATH_MAX];
    long cached_off[MAX_ROWS], cached_on[MAX_ROWS], cached_x[MAX_ROWS];
    for (int i = 0; i < MAX_ROWS; i++)
        cached_off[i] = cached_on[i] = -1;
    int n, dups, bad;
    snprintf(dir, sizeof dir, "%s/off", root);
    json_t *want = answers(dir, cached_off, &n, &dups, &bad);
    CHECK(n == n_rows && dups == 0 && bad == 0, "off: %d lines for %d rows, %d twice, %d bad", n, n_rows, dups, bad);
    snprintf(log, sizeof log, "%s/off.log", root);
    CHECK(file_has(log, "(prefix cache off)"), "the off run's pre-run line does not say the prefix cache is off");
    CHECK(!file_has(log, "prefix cache:"), "the off run prints a prefix-cache summary");
    for (int i = 0; i < n_rows; i++)
        CHECK(cached_off[i] == 0, "off: row p%d reports %ld cached tokens", i, cached_off[i]);
    check_schema(dir);

    snprintf(dir, sizeof dir, "%s/on", root);
    json_t *got = answers(dir, cached_on, &n, &dups, &bad);
    CHECK(n == n_rows && dups == 0 && bad == 0, "on: %d lines for %d rows, %d twice, %d bad", n, n_rows, dups, bad);
    int differ = compare("prefix cache on", want, got);
    CHECK(differ == 0, "prefix cache on: %d rows answer differently from --prefix-cache off", differ);
    json_decref(got);
    check_schema(dir);

    /* every group's rows but the one that computed the prefix map it; the echo row computes its own */
    long sum = 0;
    for (int g = 0; g < N_GROUPS; g++) {
        int zero = 0, members = 0;
        for (int i = 0; i < n_rows; i++) {
            if (rows[i].group != g || strstr(rows[i].line, "\"echo\":true"))
                continue;
            members++;
            zero += cached_on[i] == 0;
        }
        CHECK(members > 1 && zero <= 1, "group %d: %d of its %d rows computed their whole prompt (want at most 1)",
              g, zero, members);
    }
    for (int i = 0; i < n_rows; i++) {
        sum += cached_on[i] > 0 ? cached_on[i] : 0;
        if (strstr(rows[i].line, "\"echo\":true"))
            CHECK(cached_on[i] == 0, "the echo + logprobs row p%d maps %ld tokens (it needs every prompt logit)", i,
                  cached_on[i]);
    }
    snprintf(log, sizeof log, "%s/on.log", root);
    long mapped = number_after(log, "prefix cache: ");
    CHECK(mapped == sum && sum > 0, "the summary says %ld prompt tokens mapped, the lines' cached_tokens add to %ld",
          mapped, sum);
    CHECK(file_has(log, "expected from the prefix cache"), "the pre-run line does not say what the cache will save");

    /* preemption while prefixes are shared, and one row at a time */
    static const char *const variants[][2] = {{"small-kv", "--batch 8 --kv-mem 100K"}, {"batch1", "--batch 1"}};
    for (int v = 0; v < 2; v++) {
        rc = sh(cmd, bin(), input, root, variants[v][0], variants[v][1], root, variants[v][0]);
        CHECK(rc == 0, "%s: exit %d (%s/%s.log)", variants[v][0], rc, root, variants[v][0]);
        snprintf(dir, sizeof dir, "%s/%s", root, variants[v][0]);
        got = answers(dir, cached_x, &n, &dups, &bad);
        CHECK(n == n_rows && dups == 0 && bad == 0, "%s: %d lines for %d rows, %d twice, %d bad", variants[v][0], n,
              n_rows, dups, bad);
        differ = compare(variants[v][0], want, got);
        CHECK(differ == 0, "%s: %d rows answer differently from --prefix-cache off", variants[v][0], differ);
        json_decref(got);
        snprintf(log, sizeof log, "%s/%s.log", root, variants[v][0]);
        long pre = preemptions(log);
        if (v == 0)
            CHECK(pre > 0, "small-kv: %ld preemptions: the KV cache was not small enough to preempt", pre);
        fprintf(stderr, "%s: %ld preemptions, %ld tokens mapped\n", variants[v][0], pre,
                number_after(log, "prefix cache: "));
    }

    /* kill -9 mid-group, resumed (killed again) until done */
    snprintf(dir, sizeof dir, "%s/killed", root);
    int kills = 0;
    rc = run_and_kill(input, dir, n_rows / 3);
    kills += rc == -SIGKILL;
    for (int attempt = 0; attempt < 4 && rc != 0; attempt++) {
        rc = sh("%s resume %s --quiet > %s/resume%d.log 2>&1", bin(), dir, root, attempt);
        CHECK(rc == 0 || attempt < 3, "resume %d: exit %d", attempt, rc);
    }
    CHECK(kills == 1, "the job ended before results.jsonl held %d lines: the kill was not mid-job", n_rows / 3);
    CHECK(rc == 0, "the killed job did not complete on resume");
    got = answers(dir, cached_x, &n, &dups, &bad);
    CHECK(n == n_rows && dups == 0 && bad == 0, "killed + resumed: %d lines for %d rows, %d twice, %d bad", n, n_rows,
          dups, bad);
    differ = compare("killed + resumed", want, got);
    CHECK(differ == 0, "killed + resumed: %d rows answer differently from --prefix-cache off", differ);
    json_decref(got);
    json_decref(want);

    if (!test_failures && !getenv("KEEP"))
        sh("rm -rf %s", root);
    return test_finish("test_prefix");
}
