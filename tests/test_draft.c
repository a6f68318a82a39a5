/*
 * test_draft.c — speculative passes with a draft model (--speculate draft:MODEL, src/batch/draft.c), whole jobs
 * through the binary (cli.h) with SPILL_KV_CHECK=1:
 *   - the tiny fixture as its own draft, greedy rows only: the draft proposes exactly what the target draws
 *     (the same weights, and the CPU's logits do not depend on the batch or on how many tokens a sequence
 *     feeds), so nearly every proposal is kept.  Bounds decided before running: acceptance >= 95% (only an
 *     exact tie between two logits could make the draft's first-largest pick differ from the sampler's) and
 *     more than 3.0 tokens per row per pass at --spec-k 4 (at most 5: a row's first decode step and its last
 *     ones, where max_tokens caps k, keep fewer) — and the answers equal --speculate off;
 *   - the mixed rows of test_spec (stop strings, n = 2, log-probs, max_tokens ending mid-proposal, seeded
 *     sampled rows with penalties, top_p, repetition_penalty) with the tiny fixture as draft and with
 *     tests/data/tiny/tiny-smollm2-draft.gguf (the same vocabulary, other weights: tools/gen_tiny_gguf.py,
 *     seed 11, one layer) as draft, also at --batch 1 and under a --kv-mem that preempts: the answers equal
 *     --speculate off row for row, whatever the draft proposed (exact, no tolerance);
 *   - a draft whose vocabulary differs (tests/data/tiny/tiny-othervocab.gguf, the vocabulary of
 *     tests/data/tok/bpe_qwen2.gguf) is refused with one sentence, exit 2, before a job exists;
 *   - a draft job interrupted (SIGINT: checkpoint, exit 75) and resumed keeps its draft (the manifest's
 *     options, the resume's summary line) and answers as --speculate off.
 */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"
#define OTHER "tests/data/tiny/tiny-smollm2-draft.gguf"
#define BADVOCAB "tests/data/tiny/tiny-othervocab.gguf"


/* n rows; mixed: test_spec's variety (sampled, stop, n = 2, log-probs), else greedy chat rows only */
static void write_rows(const char *path, int n, bool mixed)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n; i++) {
        char txt[600] = "";
        for (int r = 0; r < 2 + i % 4; r++)
            strcat(txt, i % 3 ? "one two three four five six seven eight nine ten " : "the cat sat on the mat ");
        char extra[200] = ",\"temperature\":0";
        if (mixed && i % 6 == 1)
            strcat(extra, ",\"stop\":[\"heuristic\",\" aud\"]");
        else if (mixed && i % 6 == 3)
            strcat(extra, ",\"n\":2");
        else if (mixed && i == 5)
            snprintf(extra, sizeof extra, ",\"temperature\":0.9,\"seed\":%d,\"frequency_penalty\":0.5,"
                                          "\"presence_penalty\":0.3", i);
        else if (mixed && i == 11)
            strcpy(extra, ",\"temperature\":0,\"logprobs\":2");
        else if (mixed && i == 17)
            snprintf(extra, sizeof extra, ",\"temperature\":1.1,\"top_p\":0.9,\"seed\":%d,\"repetition_penalty\":1.3,"
                                          "\"logprobs\":3", i);
        int mt = mixed ? 7 + (i * 13) % 90 : 40 + (i * 13) % 57;
        if (mixed && i % 2)
            fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"t\","
                       "\"prompt\":\"%s\",\"max_tokens\":%d%s}}\n", i, txt, mt, extra);
        else
            fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                       "\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d%s}}\n",
                    i, txt, mt, extra);
    }
    fclose(f);
}

/* From a job's summary: tokens per row per pass and the acceptance in percent (-1 when the line is missing). */
static void spec_line(const char *log, double *per_pass, double *accept)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    *per_pass = *accept = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "speculation (draft ");
        const char *q = p ? strstr(p, "): ") : NULL, *a = p ? strrchr(p, '(') : NULL;
        if (q && a) {
            *per_pass = strtod(q + 3, NULL);
            *accept = strtod(a + 1, NULL);
        }
    }
    if (f)
        fclose(f);
}

/* From a job's summary, the distribution line: its percentages' sum and the mean tokens they imply (-1 when
 * the line is missing). */
static void hist_line(const char *log, double *sum, double *mean)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    *sum = *mean = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "tokens kept per row per pass: ");
        if (!p)
            continue;
        p += strlen("tokens kept per row per pass: ");
        *sum = *mean = 0;
        for (;;) {
            char *e;
            long n = strtol(p, &e, 10);
            if (e == p || *e != ':')
                break;
            double pct = strtod(e + 1, &e);
            *sum += pct, *mean += (double)n * pct / 100.0;
            if (*e != '%' || e[1] != ',')
                break;
            p = e + 2;
        }
    }
    if (f)
        fclose(f);
}

/* Answers of dir against ref: CHECK they are equal, showing the first differing rows. */
static void same_answers(const char *what, const char *dir, json_t *ref)
{
    json_t *got = job_answers(dir);
    CHECK(json_equal(got, ref), "%s: answers differ from --speculate off (%zu rows of %zu)", what,
          json_object_size(got), json_object_size(ref));
    const char *k;
    json_t *a;
    int shown = 0;
    json_object_foreach(ref, k, a) if (!json_equal(a, json_object_get(got, k)) && shown++ < 2)
    {
        char *x = json_dumps(a, JSON_COMPACT), *y = json_dumps(json_object_get(got, k), JSON_COMPACT);
        fprintf(stderr, "  %s want %.200s\n  %s got  %.200s\n", k, x, k, y ? y : "(missing)");
        free(x), free(y);
    }
    json_decref(got);
}

static json_t *reference(const char *tmp, const char *in, const char *name)
{
    CHECK(sh("SPILL_KV_CHECK=1 %s run %s %s -o %s/%s --quiet --speculate off >%s/%s.log 2>&1", bin(), MODEL, in, tmp,
             name, tmp, name) == 0, "the run without speculation failed (%s/%s.log)", tmp, name);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    return job_answers(dir);
}

static void test_self_draft(const char *tmp)
{
    char in[300], dir[300], log[320];
    snprintf(in, sizeof in, "%s/greedy.jsonl", tmp);
    write_rows(in, 12, false);
    json_t *ref = reference(tmp, in, "greedy-off");
    CHECK(json_object_size(ref) == 12, "the reference answered %zu rows of 12", json_object_size(ref));
    snprintf(dir, sizeof dir, "%s/greedy-self", tmp);
    snprintf(log, sizeof log, "%s.log", dir);
    CHECK(sh("SPILL_KV_CHECK=1 %s run %s %s -o %s --speculate draft:%s --spec-k 4 >%s 2>&1", bin(), MODEL, in, dir,
             MODEL, log) == 0, "the self-drafted run failed (%s)", log);
    same_answers("greedy, self draft", dir, ref);
    double pp, acc;
    spec_line(log, &pp, &acc);
    fprintf(stderr, "greedy, self draft: %.2f tokens per row per pass, %.1f%% accepted\n", pp, acc);
    CHECK(acc >= 95.0, "self draft: %.1f%% of the proposals accepted (want >= 95%%)", acc);
    CHECK(pp > 3.0, "self draft: %.2f tokens per row per pass (want > 3.00 at --spec-k 4)", pp);
    /* the distribution: percentages printed to 0.1 (each off by <= 0.05, at most 5 buckets), so their sum is
     * 100 within 0.25 and the mean they imply is the mean printed within 0.25 * 5 / 100 + 0.005 (rounding). */
    double hs, hm;
    hist_line(log, &hs, &hm);
    CHECK(fabs(hs - 100.0) <= 0.25, "self draft: the kept-token distribution sums to %.2f%% (want 100)", hs);
    CHECK(fabs(hm - pp) <= 0.02, "self draft: the distribution's mean %.3f is not the %.2f printed", hm, pp);
    char pat[64];
    snprintf(pat, sizeof pat, "%.2f tok/row/pass", pp);
    CHECK(sh("grep -q '^rows .* · %s' %s", pat, log) == 0, "self draft: no progress line with '%s' (%s)", pat, log);
    CHECK(sh("grep -q '^draft model: [1-9][0-9]* forwards' %s", log) == 0, "self draft: no draft summary (%s)", log);
    json_decref(ref);
}

static void test_mixed(const char *tmp)
{
    char in[300];
    snprintf(in, sizeof in, "%s/mixed.jsonl", tmp);
    write_rows(in, 18, true);
    json_t *ref = reference(tmp, in, "mixed-off");
    CHECK(json_object_size(ref) == 18, "the reference answered %zu rows of 18", json_object_size(ref));
    const char *const variants[][3] = {{"self", MODEL, ""},
                                       {"other", OTHER, ""},
                                       {"other-b1", OTHER, "--batch 1 --spec-k 6"},
                                       {"self-kv", MODEL, "--batch 12 --kv-mem 40K --spec-k 3"},
                                       {"other-chunk4", OTHER, "--prefill-chunk 4 --spec-k 8"}};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        char dir[300], log[320];
        snprintf(dir, sizeof dir, "%s/mixed-%s", tmp, variants[v][0]);
        snprintf(log, sizeof log, "%s.log", dir);
        int rc = sh("SPILL_KV_CHECK=1 %s run %s %s -o %s --speculate draft:%s %s >%s 2>&1", bin(), MODEL, in, dir,
                    variants[v][1], variants[v][2], log);
        CHECK(rc == 0, "%s: the drafted run failed (%s)", variants[v][0], log);
        same_answers(variants[v][0], dir, ref);
        double pp, acc;
        spec_line(log, &pp, &acc);
        fprintf(stderr, "mixed, %s: %.2f tokens per row per pass, %.1f%% accepted\n", variants[v][0], pp, acc);
        CHECK(pp >= 1.0, "%s: no speculation summary, or under 1 token per row per pass (%s)", variants[v][0], log);
    }
    char kvlog[320];
    snprintf(kvlog, sizeof kvlog, "%s/mixed-self-kv.log", tmp);
    CHECK(sh("grep -q ' [1-9][0-9]* preemptions' %s", kvlog) == 0, "the --kv-mem 40K run did not preempt (%s)", kvlog);
    json_decref(ref);
}

static void test_vocab_refused(const char *tmp)
{
    char in[300], dir[300], log[320];
    snprintf(in, sizeof in, "%s/greedy.jsonl", tmp);
    snprintf(dir, sizeof dir, "%s/badvocab", tmp);
    snprintf(log, sizeof log, "%s.log", dir);
    int rc = sh("%s run %s %s -o %s --quiet --speculate draft:%s >%s 2>&1", bin(), MODEL, in, dir, BADVOCAB, log);
    CHECK(rc == 2, "a draft with another vocabulary: exit %d (want 2)", rc);
    CHECK(access(dir, F_OK) != 0, "a draft with another vocabulary left a job directory %s", dir);
    CHECK(sh("test $(wc -l <%s) -eq 1 && grep -q \"^spill: --speculate draft:.*the draft's vocabulary is not the "
             "target's (.*); a draft model must have the target's tokenizer.$\" %s", log, log) == 0,
          "a draft with another vocabulary: not the one-sentence refusal (%s)", log);
}


static void test_resume(const char *tmp)
{
    char in[300], dir[300], res[320];
    snprintf(in, sizeof in, "%s/long.jsonl", tmp);
    write_rows(in, 48, false);
    json_t *ref = reference(tmp, in, "long-off");
    snprintf(dir, sizeof dir, "%s/long-draft", tmp);
    snprintf(res, sizeof res, "%s/results.jsonl", dir);
    char spec[300];
    snprintf(spec, sizeof spec, "draft:%s", OTHER);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(bin(), bin(), "run", MODEL, in, "-o", dir, "--batch", "2", "--speculate", spec, "--quiet", (char *)NULL);
        _exit(127);
    }
    struct timespec poll = {0, 1000000L};
    int st = 0, rc = -1;
    for (;;) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            break;
        }
        if (count_lines(res) >= 8) {
            kill(pid, SIGINT);
            waitpid(pid, &st, 0);
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            break;
        }
        nanosleep(&poll, NULL);
    }
    CHECK(rc == 75, "the interrupted draft job exited %d (want 75: it ended before the interrupt?)", rc);
    int done = count_lines(res);
    CHECK(done > 0 && done < 48, "the interrupted job had %d of 48 rows", done);
    CHECK(sh("grep -q '\"speculate\": *\"%s\"' %s/manifest.json", spec, dir) == 0,
          "the manifest does not keep --speculate %s", spec);
    char log[320];
    snprintf(log, sizeof log, "%s/resume.log", tmp);
    CHECK(sh("SPILL_KV_CHECK=1 %s resume %s >%s 2>&1", bin(), dir, log) == 0, "the resume failed (%s)", log);
    CHECK(sh("grep -q '^speculation (draft %s, k <= 4)' %s", OTHER, log) == 0, "the resume did not keep its draft (%s)",
          log);
    same_answers("interrupted + resumed", dir, ref);
    json_decref(ref);
}

int main(void)
{
    char tmp[] = "/tmp/spill_test_draft_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return test_finish("test_draft");
    }
    test_self_draft(tmp);
    test_mixed(tmp);
    test_vocab_refused(tmp);
    test_resume(tmp);
    if (!test_failures)
        sh("rm -rf %s", tmp);
    return test_finish("test_draft");
}
