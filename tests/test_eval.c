/*
 * test_eval.c — `spill eval` end to end through the real binary (build/asan/spill, or $SPILL_BIN) on
 * tests/data/tiny/tiny-smollm2.gguf, with a temporary SPILL_HOME (its eval cache).
 *
 *   - the metric values in table.csv are recomputed here from the run's own results.jsonl: exact_match with the
 *     stated normalisation (trim, case fold, whitespace runs) and contains (case-insensitive substring of the
 *     trimmed expected), over rows whose `expected` is the model's greedy answer (some re-cased and padded),
 *     a substring of it, or something else;
 *   - the same eval again reuses the run ("cached", no pass: the run's manifest is untouched), also for the same
 *     weights under another path (the key is the fingerprint, not the name); --rerun runs again;
 *   - an eval killed in the middle of its run resumes it (no row answered twice);
 *   - the bare base and BASE+ADAPTER answer in one shared job (one pass over the base for both), each model's
 *     answers equal to its own run alone;
 *   - a row without `expected` and a bad metric are refused with one sentence before any model runs.
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "peft_fixture.h"
#include "test.h"

#define TINY "tests/data/tiny/tiny-smollm2.gguf"
#define ROWS 12

static void read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
}

/* One row of the table.csv for model spec (the line's text), or "" */
static void csv_row(const char *path, const char *spec, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    out[0] = 0;
    char want[1100];
    snprintf(want, sizeof want, "\"%s\",", spec);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, want, strlen(want)))
            snprintf(out, cap, "%s", line);
    if (f)
        fclose(f);
}

/* field k (0-based) of a CSV line without quoted commas after the first field */
static double csv_num(const char *line, int k)
{
    const char *p = line;
    for (int i = 0; i < k && p; i++) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return p ? atof(p) : NAN;
}

static void write_rows(const char *path, int n, int tokens)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"custom_id\":\"q%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                   "\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Question %d about %s\"}],\"max_tokens\":%d,"
                   "\"temperature\":0},\"expected\":\"placeholder\"}\n",
                i, i, i % 2 ? "rivers" : "stones", tokens);
    fclose(f);
}

int main(void)
{
    char tmp[] = "/tmp/spill-test-eval-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char home[1100], path[1400], in[1200], ev[1200], dir[1300], buf[16384];
    snprintf(home, sizeof home, "%s/home", tmp);
    mkdir(home, 0755);
    setenv("SPILL_HOME", home, 1);

    /* the model's greedy answers, from a plain run */
    snprintf(in, sizeof in, "%s/plain.jsonl", tmp);
    write_rows(in, ROWS, 6);
    snprintf(dir, sizeof dir, "%s/plain", tmp);
    CHECK(sh("%s run %s %s -o %s --quiet >/dev/null 2>&1", bin(), TINY, in, dir) == 0, "plain run");
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    json_t *plain = read_lines(path);
    CHECK(json_array_size(plain) == ROWS, "plain run: %zu rows", json_array_size(plain));
    char *ans[ROWS] = {0};
    size_t i;
    json_t *o;
    json_array_foreach(plain, i, o)
    {
        int k = atoi(json_string_value(json_object_get(o, "custom_id")) + 1);
        if (k >= 0 && k < ROWS && chat_answer(o))
            ans[k] = strdup(chat_answer(o));
    }
    /* expected: the answer itself (0 mod 4), re-cased and padded (1 mod 4: exact_match after normalisation),
     * a piece of it (2 mod 4: contains only), something else (3 mod 4) */
    snprintf(ev, sizeof ev, "%s/eval.jsonl", tmp);
    FILE *f = fopen(ev, "w");
    double want_em = 0, want_ct = 0;
    for (int k = 0; k < ROWS; k++) {
        char e[512];
        const char *a = ans[k] ? ans[k] : "";
        if (k % 4 == 0)
            snprintf(e, sizeof e, "%s", a);
        else if (k % 4 == 1) {
            snprintf(e, sizeof e, "  %s  ", a);
            for (char *p = e; *p; p++)
                if (*p >= 'a' && *p <= 'z')
                    *p = (char)(*p - 32);
        } else if (k % 4 == 2)
            snprintf(e, sizeof e, "%.*s", (int)(strlen(a) > 3 ? 3 : strlen(a)), a + (strlen(a) > 3 ? 1 : 0));
        else
            snprintf(e, sizeof e, "zzqx not the answer");
        /* the expected values as exact_match / contains define them, computed here independently */
        bool trivially_empty = strlen(e) == 0;
        want_em += k % 4 <= 1 || trivially_empty;
        want_ct += k % 4 <= 2 || trivially_empty;
        json_t *je = json_string(e);
        char *es = json_dumps(je, JSON_ENCODE_ANY);
        fprintf(f, "{\"custom_id\":\"q%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                   "\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Question %d about %s\"}],\"max_tokens\":6,"
                   "\"temperature\":0},\"expected\":%s}\n",
                k, k, k % 2 ? "rivers" : "stones", es);
        free(es);
        json_decref(je);
    }
    fclose(f);
    want_em /= ROWS, want_ct /= ROWS;

    char out[1300], csv[1400], row[4096];
    snprintf(out, sizeof out, "%s/ev1", tmp);
    int rc = sh("%s eval %s %s --metric exact_match --metric contains -o %s --quiet > %s/ev1.txt 2>&1", bin(), ev, TINY,
                out, tmp);
    CHECK(rc == 0, "spill eval: exit %d", rc);
    snprintf(csv, sizeof csv, "%s/table.csv", out);
    csv_row(csv, TINY, row, sizeof row);
    /* model,rows,failed,exact_match,lo,hi,contains,lo,hi,p50,p95,prompt,completion,tok_s,cached,run_dir */
    double em = csv_num(row, 3), ct = csv_num(row, 6), lo = csv_num(row, 4), hi = csv_num(row, 5);
    CHECK(fabs(em - want_em) < 1e-6 && fabs(ct - want_ct) < 1e-6, "table: exact_match %.4f (want %.4f), contains %.4f "
                                                                  "(want %.4f): %s",
          em, want_em, ct, want_ct, row);
    CHECK(lo <= em && em <= hi && lo >= 0 && hi <= 1, "interval [%.3f, %.3f] around %.3f", lo, hi, em);
    CHECK(csv_num(row, 1) == ROWS && csv_num(row, 2) == 0 && csv_num(row, 15) == 0, "rows / failed / cached: %s", row);
    snprintf(path, sizeof path, "%s/table.md", out);
    read_file(path, buf, sizeof buf);
    CHECK(strstr(buf, "| model |") && strstr(buf, "exact_match") && strstr(buf, "p95"), "table.md: %.300s", buf);

    /* again: cached, no pass (the run's manifest is untouched); the same weights under another path too */
    char run_manifest[1500], before[16384], after[16384];
    const char *rd = strrchr(row, ',');
    snprintf(run_manifest, sizeof run_manifest, "%.*s/manifest.json", rd ? (int)strcspn(rd + 2, "\"") : 0,
             rd ? rd + 2 : "");
    read_file(run_manifest, before, sizeof before);
    char alias[1300];
    snprintf(alias, sizeof alias, "%s/alias.gguf", tmp);
    char absm[4096];
    CHECK(realpath(TINY, absm) && symlink(absm, alias) == 0, "alias link");
    snprintf(out, sizeof out, "%s/ev2", tmp);
    rc = sh("%s eval %s %s %s --metric exact_match -o %s --quiet >/dev/null 2>&1", bin(), ev, TINY, alias, out);
    snprintf(csv, sizeof csv, "%s/table.csv", out);
    char r1[4096], r2[4096];
    csv_row(csv, TINY, r1, sizeof r1);
    csv_row(csv, alias, r2, sizeof r2);
    read_file(run_manifest, after, sizeof after);
    CHECK(rc == 0 && csv_num(r1, 12) == 1 && csv_num(r2, 12) == 1, "second eval: exit %d, cached %s | %s", rc, r1, r2);
    CHECK(before[0] && !strcmp(before, after), "the cached run's manifest changed: it ran again");
    snprintf(path, sizeof path, "%s/diff.jsonl", out);
    read_file(path, buf, sizeof buf);
    CHECK(buf[0] == 0, "two runs of the same weights disagree: %.300s", buf);
    /* --rerun: a fresh run */
    snprintf(out, sizeof out, "%s/ev3", tmp);
    rc = sh("%s eval %s %s --metric exact_match --rerun -o %s --quiet >/dev/null 2>&1", bin(), ev, TINY, out);
    snprintf(csv, sizeof csv, "%s/table.csv", out);
    csv_row(csv, TINY, r1, sizeof r1);
    CHECK(rc == 0 && csv_num(r1, 12) == 0 && fabs(csv_num(r1, 3) - want_em) < 1e-6, "--rerun: exit %d, %s", rc, r1);

    /* the base and an adapter of it: one shared job, each model's answers as its own run gives them */
    char adir[1300], spec[2600];
    snprintf(adir, sizeof adir, "%s/ad1", tmp);
    static const char *const tg[] = {"q_proj", "v_proj", "down_proj"};
    write_peft(adir, 4, tg, 3);
    snprintf(spec, sizeof spec, "%s+%s", TINY, adir);
    snprintf(out, sizeof out, "%s/ev8", tmp);
    rc = sh("%s eval %s %s '%s' --metric exact_match -o %s --quiet >/dev/null 2>&1", bin(), ev, TINY, spec, out);
    snprintf(csv, sizeof csv, "%s/table.csv", out);
    csv_row(csv, TINY, r1, sizeof r1);
    csv_row(csv, spec, r2, sizeof r2);
    CHECK(rc == 0 && csv_num(r1, 11) == 2 && csv_num(r2, 11) == 2 && csv_num(r1, 1) == ROWS && csv_num(r2, 1) == ROWS,
          "shared job: exit %d, %s | %s", rc, r1, r2);
    CHECK(fabs(csv_num(r1, 3) - want_em) < 1e-6, "the base in a shared job: exact_match %.3f, alone %.3f",
          csv_num(r1, 3), want_em);
    snprintf(dir, sizeof dir, "%s/alone-ad", tmp);
    CHECK(sh("%s run '%s' %s -o %s --quiet >/dev/null 2>&1", bin(), spec, in, dir) == 0, "adapter run alone");
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    json_t *alone = read_lines(path);
    const char *srd = strrchr(r2, ',');
    char shared_res[1500];
    snprintf(shared_res, sizeof shared_res, "%.*s/results.jsonl", srd ? (int)strcspn(srd + 2, "\"") : 0,
             srd ? srd + 2 : "");
    json_t *sh_lines = read_lines(shared_res);
    int same = 0, differ = 0;
    json_array_foreach(alone, i, o)
    {
        char want_id[64];
        snprintf(want_id, sizeof want_id, "%s#1", json_string_value(json_object_get(o, "custom_id")));
        size_t k;
        json_t *p;
        json_array_foreach(sh_lines, k, p) if (!strcmp(json_string_value(json_object_get(p, "custom_id")), want_id))
        {
            same += chat_answer(o) && chat_answer(p) && !strcmp(chat_answer(o), chat_answer(p));
            int q = atoi(json_string_value(json_object_get(o, "custom_id")) + 1);
            differ += q >= 0 && q < ROWS && ans[q] && chat_answer(o) && strcmp(ans[q], chat_answer(o));
        }
    }
    CHECK(same == ROWS && differ > 0, "shared job: %d of %d adapter answers equal to the adapter alone; %d differ from "
                                      "the base",
          same, ROWS, differ);
    json_decref(alone);
    json_decref(sh_lines);

    /* a judge: its own run over the answers, a column in the table */
    snprintf(out, sizeof out, "%s/ev9", tmp);
    rc = sh("%s eval %s %s --metric judge --judge %s -o %s --quiet >/dev/null 2>&1", bin(), ev, TINY, TINY, out);
    snprintf(path, sizeof path, "%s/table.md", out);
    read_file(path, buf, sizeof buf);
    snprintf(csv, sizeof csv, "%s/runs/judge-1-%s/results.jsonl", out, "tests_data_tiny_tiny-smollm2.gguf");
    json_t *jl = read_lines(csv);
    CHECK(rc == 0 && strstr(buf, "judge") && json_array_size(jl) == ROWS, "judge: exit %d, %zu judged rows, %.200s",
          rc, json_array_size(jl), buf);
    json_decref(jl);
    /* spill resume with the run id a row carries: the job is found and, being finished, says so */
    json_t *first = json_array_get(plain, 0);
    const char *run_id = json_string_value(json_object_get(json_object_get(first, "spill"), "run_id"));
    rc = sh("%s resume %s > %s/resume.txt 2>&1", bin(), run_id ? run_id : "none", tmp);
    snprintf(path, sizeof path, "%s/resume.txt", tmp);
    read_file(path, buf, sizeof buf);
    CHECK(rc == 0 && strstr(buf, "already complete"), "spill resume %s: exit %d, %s", run_id ? run_id : "?", rc, buf);

    /* a killed eval resumes its run */
    char big[1300];
    snprintf(big, sizeof big, "%s/big.jsonl", tmp);
    write_rows(big, 400, 40);
    snprintf(out, sizeof out, "%s/ev4", tmp);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s eval %s %s --metric contains -o %s --batch 2 --quiet >/dev/null 2>&1", bin(),
             big, TINY, out);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* interrupt once the run has answered some rows (and long before its 400) */
    for (int t = 0; t < 600; t++) {
        char cnt[1600], nb[64] = "";
        snprintf(cnt, sizeof cnt, "cat %s/runs/*/results.jsonl 2>/dev/null | wc -l > %s/count.txt", out, tmp);
        if (system(cnt) != 0)
            break;
        snprintf(cnt, sizeof cnt, "%s/count.txt", tmp);
        read_file(cnt, nb, sizeof nb);
        if (atoi(nb) >= 5)
            break;
        usleep(100000);
    }
    kill(-pid, SIGINT);
    int st;
    waitpid(pid, &st, 0);
    rc = sh("%s eval %s %s --metric contains -o %s --batch 2 --quiet >/dev/null 2>&1", bin(), big, TINY, out);
    snprintf(csv, sizeof csv, "%s/table.csv", out);
    csv_row(csv, TINY, r1, sizeof r1);
    const char *rd4 = strrchr(r1, ',');
    char res[1500];
    snprintf(res, sizeof res, "%.*s/results.jsonl", rd4 ? (int)strcspn(rd4 + 2, "\"") : 0, rd4 ? rd4 + 2 : "");
    json_t *lines = read_lines(res);
    char mp[1600];
    snprintf(mp, sizeof mp, "%.*s/manifest.json", rd4 ? (int)strcspn(rd4 + 2, "\"") : 0, rd4 ? rd4 + 2 : "");
    json_t *man = json_load_file(mp, 0, NULL);
    CHECK(rc == 0 && json_array_size(lines) == 400 && csv_num(r1, 1) == 400, "killed eval: exit %d, %zu result lines",
          rc, json_array_size(lines));
    CHECK(json_integer_value(json_object_get(man, "resumes")) >= 1, "the killed eval's run was not resumed (%lld)",
          (long long)json_integer_value(json_object_get(man, "resumes")));
    json_decref(man);
    json_decref(lines);

    /* refusals before any model runs */
    snprintf(path, sizeof path, "%s/noexp.jsonl", tmp);
    f = fopen(path, "w");
    fprintf(f, "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"x\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]},\"expected\":\"x\"}\n"
               "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"x\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n");
    fclose(f);
    snprintf(out, sizeof out, "%s/ev5", tmp);
    rc = sh("%s eval %s %s --metric exact_match -o %s > %s/ev5.txt 2>&1", bin(), path, TINY, out, tmp);
    snprintf(path, sizeof path, "%s/ev5.txt", tmp);
    read_file(path, buf, sizeof buf);
    CHECK(rc == 65 && strstr(buf, "line 2") && strstr(buf, "expected"), "a row without expected: exit %d, %s", rc, buf);
    rc = sh("%s eval %s %s --metric 'regex:(' -o %s > %s/ev6.txt 2>&1", bin(), ev, TINY, out, tmp);
    snprintf(path, sizeof path, "%s/ev6.txt", tmp);
    read_file(path, buf, sizeof buf);
    CHECK(rc == 2 && strstr(buf, "regex"), "a bad regex: exit %d, %s", rc, buf);
    rc = sh("%s eval %s %s --metric nosuch -o %s > %s/ev7.txt 2>&1", bin(), ev, TINY, out, tmp);
    CHECK(rc == 2, "an unknown metric: exit %d", rc);

    for (int k = 0; k < ROWS; k++)
        free(ans[k]);
    json_decref(plain);
    fprintf(stderr, "eval: exact_match %.3f and contains %.3f as recomputed; cached by fingerprint; --rerun; a killed "
                    "eval resumed; refusals\n",
            want_em, want_ct);
    if (!test_failures)
        sh("rm -rf %s", tmp);
    return test_finish("test_eval");
}
