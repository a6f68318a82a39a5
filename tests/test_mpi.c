/*
 * test_mpi.c — `spill run` / `spill resume` as several MPI ranks (src/batch/mpi_run.c), end to end through
 * mpirun and the real binary (build/asan/spill, or $SPILL_BIN) on tests/data/tiny/tiny-smollm2.gguf, the CPU
 * engine, every rank on this machine (--oversubscribe).  Skipped, with a SKIP line, when spill was built
 * without MPI or mpirun is missing (tools/setup.sh installs OpenMPI).
 *
 * The input mixes greedy chat rows, seeded sampled rows (top_p; n = 2), greedy completions, a completions
 * prompt list (one line, two prompts: handed out as one line) and a bad row.  Checked:
 *   - mpirun -np 1, 2 and 3 answer every row as one process does, row by row (a row's tokens depend on
 *     neither its batch-mates nor its rank: its RNG is keyed by its seed and line), each custom_id once, in
 *     one DIR/results.jsonl + errors.jsonl; DIR/ranks is gone; the manifest records the attempt's ranks, and
 *     with 3 ranks more than one of them answered rows;
 *   - kill -9 of one rank mid-job (mpirun then ends the others), then `mpirun -np 2 spill resume DIR`;
 *   - kill -9 of the whole job (mpirun and every rank), then `mpirun -np 3 spill resume DIR`:
 *     each time the resumed job answers as one process does, no row twice, and the rows the dead attempt
 *     had saved in DIR/ranks/<k> are not run again (rows the resume ran + rows saved before == rows).
 * The ranks run with LeakSanitizer on, OpenMPI's own start-up allocations suppressed (tests/data/mpi/lsan.supp).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"
#define ROWS 48
#define RUN_LIMIT_S 100 /* a run that takes longer is stuck (a deadlock would hang make test otherwise) */

static const char *bin(void)
{
    const char *b = getenv("SPILL_BIN");
    return b && *b ? b : "build/asan/spill";
}

static void write_input(const char *path)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < ROWS; i++) {
        int kind = i % 6, mt = 4 + (i * 7) % 15;
        if (kind == 4)
            fprintf(f, "{\"custom_id\":\"c%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":"
                       "\"tiny\",\"prompt\":\"Once upon a time %d\",\"max_tokens\":%d,\"temperature\":0}}\n",
                    i, i * 31, mt);
        else if (kind == 5 && i == 5)
            fprintf(f, "{\"custom_id\":\"list%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{"
                       "\"model\":\"tiny\",\"prompt\":[\"The river\",\"A small house on the hill\"],\"max_tokens\":%d,"
                       "\"temperature\":0}}\n",
                    i, mt);
        else if (kind == 5 && i == 11)
            fprintf(f, "{\"custom_id\":\"bad%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
                       "\"model\":\"tiny\",\"messages\":\"not a list\"}}\n",
                    i);
        else {
            char extra[128] = ",\"temperature\":0";
            if (kind == 1)
                snprintf(extra, sizeof extra, ",\"temperature\":0.8,\"top_p\":0.9,\"seed\":%d", i);
            else if (kind == 2)
                snprintf(extra, sizeof extra, ",\"temperature\":1.0,\"seed\":%d,\"n\":2", 1000 + i);
            fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
                       "\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Question %d, answer "
                       "briefly.\"}],\"max_tokens\":%d%s}}\n",
                    i, i, mt, extra);
        }
    }
    fclose(f);
}

/* Starts argv (a session of its own, so the whole job can be killed at once) with stdout and stderr to log. */
static pid_t start(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int o = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(o, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Waits for pid (its session killed after RUN_LIMIT_S); the exit status, -signal, or -1000 when it hung. */
static int finish(pid_t pid)
{
    int st;
    for (int i = 0; i < RUN_LIMIT_S * 20; i++) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1000;
}

static int run(char *const argv[], const char *log)
{
    return finish(start(argv, log));
}

/* Lines of path that end in '\n' and parse as JSON objects (what a resume keeps). */
static int whole_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int k = 0;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_t *o = line[n - 1] == '\n' ? json_loadb(line, (size_t)n, JSON_ALLOW_NUL, NULL) : NULL;
        k += json_is_object(o);
        json_decref(o);
    }
    free(line);
    if (f)
        fclose(f);
    return k;
}

/* Whole lines in DIR's two files and in every DIR/ranks/<k>'s. */
static int saved_lines(const char *dir)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/results.jsonl", dir);
    int n = whole_lines(p);
    snprintf(p, sizeof p, "%s/errors.jsonl", dir);
    n += whole_lines(p);
    snprintf(p, sizeof p, "%s/ranks", dir);
    DIR *d = opendir(p);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.')
            for (int f = 0; f < 2; f++) {
                char q[PATH_MAX + 300];
                snprintf(q, sizeof q, "%s/ranks/%s/%s", dir, e->d_name, f ? "errors.jsonl" : "results.jsonl");
                n += whole_lines(q);
            }
    if (d)
        closedir(d);
    return n;
}

/* custom_id -> canonical answer (which file, each choice's text and finish reason, usage; ids and times
 * aside), read from DIR's two files; counts lines, custom_ids seen twice and lines that do not parse. */
static json_t *answers(const char *dir, int *n_lines, int *dups, int *bad)
{
    json_t *map = json_object();
    *n_lines = *dups = *bad = 0;
    for (int fi = 0; fi < 2; fi++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, fi ? "errors.jsonl" : "results.jsonl");
        FILE *f = fopen(path, "r");
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while (f && (n = getline(&line, &cap, f)) > 0) {
            json_t *o = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, NULL);
            const char *id = json_string_value(json_object_get(o, "custom_id"));
            if (!id) {
                (*bad)++;
                json_decref(o);
                continue;
            }
            (*n_lines)++;
            if (json_object_get(map, id))
                (*dups)++;
            json_t *body = json_object_get(json_object_get(o, "response"), "body");
            /* cached_tokens depends on the schedule (which rank ran the row, which prefixes its batch had
             * indexed), not on the answer: held to 0 <= cached <= prompt and left out of the comparison. */
            json_t *usage = json_deep_copy(json_object_get(body, "usage"));
            json_t *details = json_object_get(usage, "prompt_tokens_details");
            if (details) {
                json_int_t cached = json_integer_value(json_object_get(details, "cached_tokens"));
                if (cached < 0 || cached > json_integer_value(json_object_get(usage, "prompt_tokens")))
                    (*bad)++;
                json_object_del(usage, "prompt_tokens_details");
            }
            json_t *canon = json_pack("{s:i,s:o?,s:O?}", "file", fi, "usage", usage, "error",
                                      json_object_get(body, "error"));
            json_t *chs = json_array(), *c;
            size_t i;
            json_array_foreach(json_object_get(body, "choices"), i, c)
            {
                json_t *msg = json_object_get(c, "message");
                json_array_append_new(chs, json_pack("{s:O?,s:O?,s:O?}", "text",
                                                     msg ? json_object_get(msg, "content") : json_object_get(c, "text"),
                                                     "finish", json_object_get(c, "finish_reason"), "index",
                                                     json_object_get(c, "index")));
            }
            json_object_set_new(canon, "choices", chs);
            json_object_set_new(map, id, canon);
            json_decref(o);
        }
        free(line);
        if (f)
            fclose(f);
    }
    return map;
}

/* DIR answers every row as the reference does, each custom_id once, and its rank directories are gone. */
static void compare(const char *what, json_t *ref, const char *dir)
{
    int n, dups, bad;
    json_t *got = answers(dir, &n, &dups, &bad);
    CHECK(n == (int)json_object_size(ref) && dups == 0 && bad == 0,
          "%s: %d lines (want %zu), %d custom_ids twice, %d bad lines", what, n, json_object_size(ref), dups, bad);
    const char *id;
    json_t *v;
    int differ = 0;
    json_object_foreach(ref, id, v)
    {
        json_t *g = json_object_get(got, id);
        if (!json_equal(g, v) && differ++ < 3) {
            char *a = json_dumps(v, JSON_COMPACT), *b = g ? json_dumps(g, JSON_COMPACT) : NULL;
            fprintf(stderr, "%s: row %s differs:\n  one process: %.300s\n  ranks:       %.300s\n", what, id, a,
                    b ? b : "(missing)");
            free(a), free(b);
        }
    }
    CHECK(differ == 0, "%s: %d rows answer differently from one process", what, differ);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/ranks", dir);
    CHECK(access(p, F_OK) != 0, "%s: %s is still there after the merge", what, p);
    json_decref(got);
}

/* DIR's manifest: state, and its "mpi" attempts (a new reference, or NULL). */
static json_t *attempts(const char *dir, const char **state_out, json_t **man_out)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    json_t *m = json_load_file(p, 0, NULL);
    *man_out = m;
    *state_out = json_string_value(json_object_get(m, "state"));
    return json_object_get(m, "mpi");
}

/* The last attempt's rows_by_rank: their sum (-1 when absent) and how many ranks answered any. */
static int last_attempt_rows(json_t *att, int *ranks_with_rows, int *dropped)
{
    json_t *last = json_array_get(att, json_array_size(att) - 1), *by = json_object_get(last, "rows_by_rank"), *v;
    size_t i;
    int sum = by ? 0 : -1;
    *ranks_with_rows = 0;
    json_array_foreach(by, i, v)
    {
        sum += (int)json_integer_value(v);
        *ranks_with_rows += json_integer_value(v) > 0;
    }
    *dropped = 0;
    json_array_foreach(att, i, v)
        *dropped += (int)json_integer_value(json_object_get(v, "duplicates_dropped"));
    return sum;
}

/* The pid of rank k of the job writing into dir (its environment names the rank, its command line dir), or -1. */
static pid_t rank_pid(int k, const char *dir)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = -1;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", k);
    while (found < 0 && d && (e = readdir(d))) {
        char p[300], buf[1 << 16];
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        int fd = open(p, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        bool mine = false;
        for (ssize_t i = 0; n > 0 && i < n; i += (ssize_t)strlen(buf + i) + 1) {
            buf[n] = 0;
            mine |= strcmp(buf + i, dir) == 0;
        }
        if (!mine)
            continue;
        snprintf(p, sizeof p, "/proc/%s/environ", e->d_name);
        fd = open(p, O_RDONLY);
        n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        for (ssize_t i = 0; n > 0 && i < n; i += (ssize_t)strlen(buf + i) + 1) {
            buf[n] = 0;
            if (!strcmp(buf + i, want))
                found = (pid_t)atoi(e->d_name);
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* Kills the job with SIGKILL: every rank of it (its n ranks, found before any dies: mpirun does not keep them
 * in its process group) and mpirun. */
static void kill_job(pid_t job, const char *dir, int n)
{
    pid_t p[8];
    for (int k = 0; k < n && k < 8; k++)
        p[k] = rank_pid(k, dir);
    kill(-job, SIGKILL);
    for (int k = 0; k < n && k < 8; k++)
        if (p[k] > 0)
            kill(p[k], SIGKILL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits (at most 60 s) until the job has saved at least n whole lines in its rank directories (rank k's
 * alone when k >= 0) while it still runs; false when it ended or never got there. */
static bool wait_saved(pid_t job, const char *dir, int k, int n)
{
    for (int i = 0; i < 6000; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/ranks/%d/results.jsonl", dir, k);
        if ((k >= 0 ? whole_lines(p) : saved_lines(dir)) >= n)
            return true;
        if (waitpid(job, NULL, WNOHANG) == job)
            return false;
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

int main(void)
{
#ifndef SPILL_MPI
    fprintf(stderr, "test_mpi: SKIP — spill was built without MPI (tools/setup.sh installs libopenmpi-dev)\n");
    return 0;
#else
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_mpi: SKIP — mpirun is not on PATH (tools/setup.sh installs openmpi-bin)\n");
        return 0;
    }
    char tmp[] = "/tmp/spill_test_mpi_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char input[600], ref[600], d[600], log[700], supp[PATH_MAX + 64], cwd[PATH_MAX];
    snprintf(input, sizeof input, "%s/in.jsonl", tmp);
    write_input(input);
    const char *b = bin();
    double t0 = now_s();
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    snprintf(supp, sizeof supp, "suppressions=%s/tests/data/mpi/lsan.supp", cwd);
    /* we run as root in CI containers; mpirun refuses that without these */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
    setenv("LSAN_OPTIONS", supp, 1);

    /* the reference: one process, no MPI */
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    snprintf(log, sizeof log, "%s/ref.log", tmp);
    char *a_ref[] = {(char *)b, "run", MODEL, input, "-o", ref, "--quiet", NULL};
    CHECK(run(a_ref, log) == 0, "the one-process reference run failed (%s)", log);
    int n, dups, bad;
    json_t *refm = answers(ref, &n, &dups, &bad);
    CHECK(n == ROWS && dups == 0 && bad == 0, "reference: %d lines, %d dups, %d bad", n, dups, bad);
    /* the ranks' leak check needs whole stacks to match the suppressions (OpenMPI has no frame pointers) */
    setenv("ASAN_OPTIONS", "detect_leaks=1:fast_unwind_on_malloc=0", 1);

    for (int np = 1; np <= 3; np++) {
        char nps[16], what[64];
        snprintf(nps, sizeof nps, "%d", np);
        snprintf(d, sizeof d, "%s/np%d", tmp, np);
        snprintf(log, sizeof log, "%s/np%d.log", tmp, np);
        snprintf(what, sizeof what, "mpirun -np %d", np);
        char *a[] = {"mpirun", "--oversubscribe", "-np", nps, (char *)b, "run", MODEL, input, "-o", d, "--quiet",
                     NULL};
        int rc = run(a, log);
        CHECK(rc == 0, "%s: exit %d (%s)", what, rc, log);
        compare(what, refm, d);
        fprintf(stderr, "%s: %.1f s\n", what, now_s() - t0);
        json_t *man;
        const char *state;
        json_t *att = attempts(d, &state, &man);
        int with_rows, dropped, sum = last_attempt_rows(att, &with_rows, &dropped);
        CHECK(state && !strcmp(state, "done"), "%s: the job's state is %s, want done", what, state ? state : "?");
        CHECK(json_array_size(att) == 1 &&
                  json_integer_value(json_object_get(json_array_get(att, 0), "ranks")) == np,
              "%s: the manifest does not record one attempt of %d ranks", what, np);
        CHECK(sum == ROWS - 1 && dropped == 0, "%s: the ranks answered %d rows (want %d; the bad row is rank 0's "
              "before the start), %d dropped", what, sum, ROWS - 1, dropped);
        if (np == 3)
            CHECK(with_rows >= 2, "%s: only %d rank answered rows; rows are not shared", what, with_rows);
        json_decref(man);
    }

    /* kill -9 of one rank mid-job, then the rest with another number of ranks; and of the whole job */
    for (int whole = 0; whole <= 1; whole++) {
        const char *np0 = whole ? "2" : "3", *np1 = whole ? "3" : "2";
        char what[96];
        snprintf(what, sizeof what, whole ? "kill -9 of the whole job (%s ranks), resume on %s"
                                          : "kill -9 of rank 1 (of %s), resume on %s", np0, np1);
        snprintf(d, sizeof d, "%s/kill%d", tmp, whole);
        snprintf(log, sizeof log, "%s/kill%d.log", tmp, whole);
        char *a[] = {"mpirun", "--oversubscribe", "-np", (char *)np0, (char *)b, "run", MODEL, input, "-o", d,
                     "--quiet", "--batch", "1", NULL};
        pid_t job = start(a, log);
        bool mid = wait_saved(job, d, whole ? -1 : 1, whole ? 8 : 3);
        CHECK(mid, "%s: the job ended before it could be killed mid-way (%s)", what, log);
        if (whole)
            kill_job(job, d, atoi(np0));
        else {
            pid_t p = rank_pid(1, d);
            CHECK(p > 0, "%s: rank 1's process not found", what);
            if (p > 0)
                kill(p, SIGKILL);
        }
        int rc = finish(job);
        CHECK(rc != 0, "%s: the killed job exited 0", what);
        int saved = saved_lines(d);
        CHECK(saved > 0 && saved < ROWS, "%s: %d rows saved before the resume; the kill was not mid-job", what,
              saved);
        char rlog[720];
        snprintf(rlog, sizeof rlog, "%s.resume", log);
        char *ar[] = {"mpirun", "--oversubscribe", "-np", (char *)np1, (char *)b, "resume", d, "--quiet", NULL};
        rc = run(ar, rlog);
        CHECK(rc == 0, "%s: the resume exited %d (%s)", what, rc, rlog);
        compare(what, refm, d);
        fprintf(stderr, "%s: %.1f s\n", what, now_s() - t0);
        json_t *man;
        const char *state;
        json_t *att = attempts(d, &state, &man);
        int with_rows, dropped, ran = last_attempt_rows(att, &with_rows, &dropped);
        CHECK(state && !strcmp(state, "done"), "%s: the job's state is %s, want done", what, state ? state : "?");
        CHECK(ran + saved == ROWS && dropped == 0,
              "%s: the resume ran %d rows and %d were saved before, for %d rows (%d dropped as duplicates)", what,
              ran, saved, ROWS, dropped);
        CHECK(json_array_size(att) == 2, "%s: the manifest records %zu attempts, want 2", what, json_array_size(att));
        json_decref(man);
    }

    json_decref(refm);
    if (test_failures == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        CHECK(system(cmd) == 0, "rm -rf %s", tmp);
    }
    return test_finish("test_mpi");
#endif
}
