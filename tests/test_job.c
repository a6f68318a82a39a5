/*
 * test_job.c — the job store under normal use, torn tails, corruption,
 * injected I/O errors and SIGKILL (reliability.md §7 rows 7, 8, 10).
 *
 * Expectations, fixed before running:
 *  - torn tail: for EVERY byte offset t of the last three (uncommitted)
 *    lines of results.jsonl, with the file cut at t and with junk appended at
 *    t (zeros as a power loss leaves, a non-object line), resume succeeds in
 *    100% of cases, keeps exactly the complete lines before t (done set
 *    exact), and the next append lands right after them;
 *  - damage inside the committed prefix, a duplicate custom_id, a file shorter
 *    than committed, a changed input: resume fails with a sentence naming it;
 *  - I/O errors: failing the N-th open/write/fsync/rename/ftruncate for every
 *    N until a run sees no failure, the failing call returns an error, the job
 *    refuses further work, nothing crashes or leaks (ASan), and a resume with
 *    healthy I/O loses no committed row and duplicates none; every one of the
 *    five call kinds fails at least once;
 *  - kill -9: >= 50 SIGKILLs at random moments of a child appending and
 *    committing a 2,000-row job (inside its resume, or inside its
 *    append/commit loop); after every other kill the parent resumes and finds
 *    every row the child reported committed, after the others the next child
 *    is the first to resume; the final files hold every row exactly once,
 *    byte-identical to what the row should be;
 *  - power loss (simulated, SQLite crash-VFS style): the I/O-error scenario
 *    with the machine dying at its N-th call for every N, 3 draws each of a
 *    crash model (files keep their synced prefix plus a random torn part of
 *    the rest, sometimes zero-filled; un-synced renames and file creations
 *    may be undone): >= 100 crashes, 100% resume with every row whose commit
 *    returned, no duplicate, exact final files;
 *  - job_check_line agrees with jansson on 100,000 mutated lines;
 *  - OOM: failing the N-th jansson allocation for every N gives a clean
 *    error and an exact resume.
 * fsync is counted but not performed in the injection, torn-tail and kill
 * tests (a fsync costs ~4 ms on this disk): they check the protocol, and
 * SIGKILL does not drop the page cache.  test_basic uses the real calls.
 */
#include "batch/job.h"
#include "test.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char root[64];   /* scratch directory of this test run */
static char input[128]; /* the input file every job hashes */

/* ------------------------------------------------------------- test rows */

static bool is_error_row(int i)
{
    return i % 7 == 3;
}

/* The line of row i: deterministic, of varying length. */
static size_t row_line(int i, char *buf, size_t cap)
{
    static const char pad[] = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs";
    int n = (i * 37) % 60;
    if (is_error_row(i))
        return (size_t)snprintf(buf, cap,
                                "{\"id\":\"batch_req_%d\",\"custom_id\":\"row-%d\",\"response\":null,\"error\":"
                                "{\"code\":\"x\",\"message\":\"%.*s\"}}",
                                i, i, n, pad);
    return (size_t)snprintf(buf, cap,
                            "{\"id\":\"batch_req_%d\",\"custom_id\":\"row-%d\",\"response\":{\"status_code\":200,"
                            "\"body\":{\"text\":\"%.*s \\u00e9\"}},\"error\":null}",
                            i, i, n, pad);
}

static int append_row(job *j, int i, char *err, size_t errlen)
{
    char line[512];
    size_t len = row_line(i, line, sizeof line);
    return is_error_row(i) ? job_append_error(j, line, len, err, errlen) : job_append_result(j, line, len, err, errlen);
}

static bool row_done(job *j, int i)
{
    char id[32];
    snprintf(id, sizeof id, "row-%d", i);
    return job_is_done(j, id);
}

/* ----------------------------------------------------------- file helpers */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}
static void rm_rf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
}

static void append_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "ab");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
}

static char *slurp(const char *dir, const char *name, size_t *len)
{
    char path[PATH_MAX], err[SPILL_ERRLEN], *buf = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *len = 0;
    if (util_read_file(path, 1u << 30, &buf, len, err, sizeof err) != 0)
        return NULL;
    return buf;
}

static uint64_t file_size(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : UINT64_MAX;
}

/*
 * Checks the final files of a job of nrows rows: every line ends in '\n' and
 * is exactly row_line(i) in the right file, every row appears exactly once.
 * Returns the number of problems (and reports the first few).
 */
static int verify_final(const char *dir, int nrows)
{
    int problems = 0;
    unsigned char *seen = calloc((size_t)nrows, 1);
    for (int k = 0; k < 2; k++) {
        size_t len;
        char *data = slurp(dir, k ? "errors.jsonl" : "results.jsonl", &len);
        if (!data) {
            problems++;
            continue;
        }
        size_t pos = 0, line = 0;
        while (pos < len) {
            char *nl = memchr(data + pos, '\n', len - pos);
            line++;
            if (!nl) {
                if (problems++ < 3)
                    fprintf(stderr, "%s file %d: line %zu has no newline\n", dir, k, line);
                break;
            }
            int i = -1;
            char want[512];
            if (sscanf(data + pos, "{\"id\":\"batch_req_%d\"", &i) != 1 || i < 0 || i >= nrows ||
                row_line(i, want, sizeof want) != (size_t)(nl - (data + pos)) ||
                memcmp(want, data + pos, (size_t)(nl - (data + pos))) != 0 || is_error_row(i) != (k == 1)) {
                if (problems++ < 3)
                    fprintf(stderr, "%s file %d: line %zu is not a valid row line: %.60s\n", dir, k, line, data + pos);
            } else if (seen[i]++) {
                if (problems++ < 3)
                    fprintf(stderr, "%s: row %d appears twice\n", dir, i);
            }
            pos = (size_t)(nl - data) + 1;
        }
        free(data);
    }
    for (int i = 0; i < nrows; i++)
        if (!seen[i] && problems++ < 3)
            fprintf(stderr, "%s: row %d is missing\n", dir, i);
    free(seen);
    return problems;
}

static void make_input(int nrows)
{
    snprintf(input, sizeof input, "%s/input.jsonl", root);
    FILE *f = fopen(input, "w");
    for (int i = 0; i < nrows; i++)
        fprintf(f, "{\"custom_id\":\"row-%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n", i);
    fclose(f);
}

static job_info info_for(int nrows)
{
    return (job_info){.command = "run",
                      .input_path = input,
                      .model_id = "smollm2:135m",
                      .model_fingerprint = "sha256:0123",
                      .engine_version = "spill 0.1",
                      .rows_total = (uint64_t)nrows};
}

/* --------------------------------------------------------- injectable I/O */

enum { IO_OPEN, IO_WRITE, IO_FSYNC, IO_RENAME, IO_FTRUNCATE, IO_KINDS };
static const char *const io_names[IO_KINDS] = {"open", "write", "fsync", "rename", "ftruncate"};
static long io_calls, io_fail_at = -1;
static unsigned io_failed_kinds;
static long io_kind_calls[IO_KINDS];

/*
 * Crash mode (test_power_loss): the N-th call is where the machine loses
 * power — it and every later call fail — and the test I/O keeps what a crash
 * may forget: per file, the size at its last fsync; whether the last
 * rename over manifest.json was followed by a directory fsync, and the
 * manifest it replaced.
 */
static bool crash_mode, crashed;
static struct {
    ino_t ino;
    off_t size;
} synced[16];
static int n_synced;
static char *prev_manifest; /* what the last rename replaced (NULL: nothing) */
static size_t prev_manifest_len;
static bool rename_pending;  /* renamed, directory not yet fsynced */
static bool entries_pending; /* results/errors.jsonl created, directory not yet fsynced */
static ino_t job_dir_ino;    /* the directory those must be synced in */

static void note_job_dir(const char *path)
{
    char dir[PATH_MAX];
    struct stat st;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    job_dir_ino = stat(dir, &st) == 0 ? st.st_ino : 0;
}

static bool fail_now(int kind)
{
    io_kind_calls[kind]++;
    if (crashed) {
        errno = EIO;
        return true;
    }
    if (++io_calls != io_fail_at)
        return false;
    io_failed_kinds |= 1u << kind;
    errno = kind == IO_WRITE ? ENOSPC : EIO;
    crashed = crash_mode;
    return true;
}

static int t_open(const char *path, int flags, mode_t mode)
{
    if (fail_now(IO_OPEN))
        return -1;
    if ((flags & O_CREAT) && strstr(path, ".jsonl")) {
        note_job_dir(path);
        entries_pending = true;
    }
    return open(path, flags, mode);
}
static ssize_t t_write(int fd, const void *buf, size_t n)
{
    if (fail_now(IO_WRITE)) {
        /* Leave half a line behind, as a failing disk may. */
        if (n > 1 && !crashed && write(fd, buf, n / 2) < 0)
            return -1;
        errno = ENOSPC;
        return -1;
    }
    return write(fd, buf, n);
}
static int t_fsync(int fd)
{
    if (fail_now(IO_FSYNC))
        return -1;
    struct stat st;
    if (fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            if (st.st_ino == job_dir_ino)
                rename_pending = entries_pending = false;
        } else {
            int k = 0;
            while (k < n_synced && synced[k].ino != st.st_ino)
                k++;
            if (k == n_synced && n_synced < 16)
                synced[n_synced++].ino = st.st_ino;
            if (k < 16)
                synced[k].size = st.st_size;
        }
    }
    return 0;
}
static int t_rename(const char *a, const char *b)
{
    if (fail_now(IO_RENAME))
        return -1;
    char err[SPILL_ERRLEN];
    free(prev_manifest);
    prev_manifest = NULL;
    if (util_is_file(b) && util_read_file(b, 1u << 20, &prev_manifest, &prev_manifest_len, err, sizeof err) != 0)
        prev_manifest = NULL;
    note_job_dir(b);
    rename_pending = true;
    return rename(a, b);
}
static int t_ftruncate(int fd, off_t len)
{
    return fail_now(IO_FTRUNCATE) ? -1 : ftruncate(fd, len);
}

/*
 * Applies what a power loss may do to the job directory: each output file
 * keeps its synced prefix plus a random part of what came after (torn-seq),
 * sometimes with zeros over part of that unsynced tail (torn-op: pages that
 * never reached the disk), an un-synced rename of manifest.json may be
 * undone, and files whose directory entry was never synced may vanish.
 */
static void apply_crash(const char *dir)
{
    if (entries_pending && rand() % 2 == 0)
        for (int k = 0; k < 2; k++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, k ? "errors.jsonl" : "results.jsonl");
            unlink(path);
        }
    for (int k = 0; k < 2; k++) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, k ? "errors.jsonl" : "results.jsonl");
        if (stat(path, &st) != 0)
            continue;
        off_t keep = 0;
        for (int i = 0; i < n_synced; i++)
            if (synced[i].ino == st.st_ino)
                keep = synced[i].size;
        off_t len = keep + (st.st_size > keep ? rand() % (st.st_size - keep + 1) : 0);
        CHECK(truncate(path, len) == 0, "crash model: truncate %s", path);
        if (len > keep && rand() % 3 == 0) {
            off_t from = keep + rand() % (len - keep), n = 1 + rand() % (len - from);
            int fd = open(path, O_WRONLY);
            char zeros[4096] = {0};
            while (fd >= 0 && n > 0) {
                ssize_t w = pwrite(fd, zeros, n < (off_t)sizeof zeros ? (size_t)n : sizeof zeros, from);
                if (w <= 0)
                    break;
                from += w;
                n -= w;
            }
            if (fd >= 0)
                close(fd);
        }
    }
    if (rename_pending && rand() % 2 == 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        if (prev_manifest)
            write_file(path, prev_manifest, prev_manifest_len);
        else
            unlink(path);
    }
}

static const job_io test_io = {t_open, t_write, t_fsync, t_rename, t_ftruncate};

/* -------------------------------------------------------------- the tests */

static void test_basic(void)
{
    char dir[256], err[SPILL_ERRLEN], line[512];
    snprintf(dir, sizeof dir, "%s/basic/job", root); /* parents are created */
    job_info info = info_for(10);
    json_t *opts = json_pack("{s:i, s:s}", "max_tokens", 16, "quant", "q4_1");
    info.options = opts;
    job *j = NULL;
    int rc = job_create(dir, &info, NULL, &j, err, sizeof err);
    json_decref(opts);
    info.options = NULL;
    CHECK(rc == 0, "create: %s", err);
    if (rc != 0)
        return;
    char id[JOB_ID_MAX];
    snprintf(id, sizeof id, "%s", job_id(j));
    /* one id: the job directory's name */
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    CHECK(!strcmp(id, base), "job id %s is not the directory's name %s", id, base);
    char fresh[JOB_ID_MAX];
    CHECK(job_new_id(fresh, sizeof fresh, err, sizeof err) == 0 && strlen(fresh) == 26 &&
              strspn(fresh, "abcdefghijklmnopqrstuvwxyz0123456789_-") == strlen(fresh),
          "a new job id %s", fresh);

    for (int i = 0; i < 6; i++)
        CHECK(append_row(j, i, err, sizeof err) == 0, "append %d: %s", i, err);
    CHECK(!row_done(j, 0), "row 0 counted as done before any commit");
    CHECK(job_rows_completed(j) == 0, "completed counted before commit");
    CHECK(job_commit(j, err, sizeof err) == 0, "commit: %s", err);
    CHECK(row_done(j, 0) && row_done(j, 3) && !row_done(j, 6), "done set after commit");
    CHECK(job_rows_completed(j) == 5 && job_rows_failed(j) == 1, "counters %llu/%llu",
          (unsigned long long)job_rows_completed(j), (unsigned long long)job_rows_failed(j));

    /* Lines the job must refuse without writing anything. */
    uint64_t before = file_size(dir, "results.jsonl");
    size_t len = row_line(1, line, sizeof line);
    CHECK(job_append_result(j, line, len, err, sizeof err) != 0 && strstr(err, "already has a line"),
          "duplicate custom_id accepted: %s", err);
    CHECK(job_append_result(j, "{\"custom_id\":\"a\"}\n{}", 20, err, sizeof err) != 0 && strstr(err, "newline"),
          "line with a newline accepted: %s", err);
    CHECK(job_append_result(j, "{\"custom_id\":5}", 15, err, sizeof err) != 0 && strstr(err, "custom_id"),
          "numeric custom_id accepted: %s", err);
    CHECK(job_append_result(j, "[1,2]", 5, err, sizeof err) != 0 && strstr(err, "not a JSON object"),
          "array accepted: %s", err);
    CHECK(job_append_result(j, "{\"custom_id\":\"a\"", 16, err, sizeof err) != 0 && strstr(err, "not valid JSON"),
          "torn line accepted: %s", err);
    CHECK(file_size(dir, "results.jsonl") == before, "a refused line changed the file");
    CHECK(!job_is_broken(j), "a refused line broke the job");
    CHECK(job_commit(j, err, sizeof err) == 0, "empty commit: %s", err);

    /* Closing as done with rows missing records "interrupted" and says so. */
    rc = job_close(j, JOB_DONE, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "interrupted"), "closed as done with 6 of 10 rows: %s", err);

    /* A second create in the same directory is refused. */
    j = NULL;
    rc = job_create(dir, &info, NULL, &j, err, sizeof err);
    CHECK(rc != 0 && j == NULL && strstr(err, "spill resume"), "create over a job: %s", err);

    rc = job_open_resume(dir, NULL, &j, err, sizeof err);
    CHECK(rc == 0, "resume: %s", err);
    if (rc != 0)
        return;
    CHECK(strcmp(job_id(j), id) == 0, "resume changed the job id: %s -> %s", id, job_id(j));
    const json_t *man = job_manifest(j);
    CHECK(json_integer_value(json_object_get(json_object_get(man, "options"), "max_tokens")) == 16,
          "job_manifest does not show the options");
    job *j2 = NULL;
    rc = job_open_resume(dir, NULL, &j2, err, sizeof err);
    CHECK(rc != 0 && j2 == NULL && strstr(err, "in use"), "second writer on a live job: %s", err);
    for (int i = 0; i < 10; i++)
        if (!row_done(j, i))
            CHECK(append_row(j, i, err, sizeof err) == 0, "append %d: %s", i, err);
    CHECK(job_close(j, JOB_DONE, err, sizeof err) == 0, "close done: %s", err);
    CHECK(verify_final(dir, 10) == 0, "final files of the basic job");

    size_t mlen;
    char *mtext = slurp(dir, "manifest.json", &mlen);
    json_error_t jerr;
    json_t *m = mtext ? json_loads(mtext, 0, &jerr) : NULL;
    CHECK(m != NULL, "manifest does not parse");
    if (m) {
        int64_t total = -1, completed = -1, failed = -1, rbytes = -1, ebytes = -1, resumes = -1, maxtok = -1;
        const char *state = "", *sha = "", *cmd = "", *fp = "";
        int urc =
            json_unpack(m, "{s:s, s:s, s:{s:s}, s:{s:I}, s:{s:s}, s:I, s:{s:I, s:I, s:I}, s:{s:I, s:I}}", "state",
                        &state, "command", &cmd, "input", "sha256", &sha, "options", "max_tokens", &maxtok, "model",
                        "fingerprint", &fp, "resumes", &resumes, "rows", "total", &total, "completed", &completed,
                        "failed", &failed, "committed", "results_bytes", &rbytes, "errors_bytes", &ebytes);
        CHECK(urc == 0, "manifest fields missing");
        CHECK(strcmp(state, "done") == 0 && strcmp(cmd, "run") == 0 && strcmp(fp, "sha256:0123") == 0 && maxtok == 16,
              "manifest values: state %s command %s", state, cmd);
        CHECK(total == 10 && completed == 9 && failed == 1 && resumes == 1, "counts %lld %lld %lld resumes %lld",
              (long long)total, (long long)completed, (long long)failed, (long long)resumes);
        CHECK((uint64_t)rbytes == file_size(dir, "results.jsonl") && (uint64_t)ebytes == file_size(dir, "errors.jsonl"),
              "committed sizes do not match the files");
        size_t ilen;
        char *in = slurp(root, "input.jsonl", &ilen);
        char hex[65];
        util_sha256_hex(in, ilen, hex);
        free(in);
        CHECK(strcmp(hex, sha) == 0, "input sha256 %s != %s", sha, hex);
        CHECK(json_is_null(json_object_get(m, "ended_at")) == false, "ended_at not set on done");
        json_decref(m);
    }
    free(mtext);
    CHECK(file_size(dir, "manifest.json.tmp") == UINT64_MAX, "manifest.json.tmp left behind");

    rc = job_open_resume(dir, NULL, &j, err, sizeof err);
    CHECK(rc != 0 && j == NULL && strstr(err, "already done"), "resumed a done job: %s", err);

    char empty[PATH_MAX];
    snprintf(empty, sizeof empty, "%s/basic/nothing", root);
    mkdir(empty, 0755);
    rc = job_open_resume(empty, NULL, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "no manifest.json"), "resume of an empty dir: %s", err);
    snprintf(empty, sizeof empty, "%s/basic/absent", root);
    rc = job_open_resume(empty, NULL, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "no such job directory"), "resume of a missing dir: %s", err);

    CHECK(job_close(NULL, JOB_DONE, err, sizeof err) == 0, "job_close(NULL)");
    char idbuf[JOB_ID_MAX], id2[JOB_ID_MAX];
    CHECK(job_new_id(idbuf, sizeof idbuf, err, sizeof err) == 0 && job_new_id(id2, sizeof id2, err, sizeof err) == 0 &&
              strcmp(idbuf, id2) != 0,
          "two job ids are equal");
    CHECK(job_new_id(idbuf, 10, err, sizeof err) != 0, "job id into 10 bytes");

    /* dir NULL: $SPILL_HOME/jobs/<id>. */
    char home[PATH_MAX];
    snprintf(home, sizeof home, "%s/home", root);
    setenv("SPILL_HOME", home, 1);
    rc = job_create(NULL, &info, NULL, &j, err, sizeof err);
    CHECK(rc == 0 && strncmp(job_dir(j), home, strlen(home)) == 0 && strstr(job_dir(j), "/jobs/"), "default dir: %s",
          rc ? err : job_dir(j));
    if (rc == 0)
        CHECK(job_close(j, JOB_INTERRUPTED, err, sizeof err) == 0, "close interrupted: %s", err);
}

/* Writes a job directory from saved bytes, results cut at t plus `tail`. */
static void lay_out(const char *dir, const char *m, size_t mlen, const char *r, size_t t, const char *tail, size_t tlen,
                    const char *e, size_t elen)
{
    char path[PATH_MAX];
    rm_rf(dir);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    write_file(path, m, mlen);
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    write_file(path, r, t);
    append_file(path, tail, tlen);
    snprintf(path, sizeof path, "%s/errors.jsonl", dir);
    write_file(path, e, elen);
}

static void test_torn_tail(void)
{
    const int nrows = 21;
    char ref[256], dir[256], err[SPILL_ERRLEN];
    snprintf(ref, sizeof ref, "%s/torn_ref", root);
    snprintf(dir, sizeof dir, "%s/torn", root);
    job_info info = info_for(nrows);
    job *j;
    io_fail_at = -1;
    if (job_create(ref, &info, &test_io, &j, err, sizeof err) != 0) {
        CHECK(0, "create: %s", err);
        return;
    }
    /* Rows 0..17 committed (3, 10 and 17 in errors.jsonl); rows 18..20, all
     * results rows, are the last three lines, appended but not committed. */
    for (int i = 0; i < 18; i++)
        append_row(j, i, err, sizeof err);
    CHECK(job_commit(j, err, sizeof err) == 0, "commit: %s", err);
    for (int i = 18; i < 21; i++)
        CHECK(!is_error_row(i) && append_row(j, i, err, sizeof err) == 0, "append %d: %s", i, err);
    job_close(j, JOB_RUNNING, err, sizeof err);

    size_t mlen, rlen, elen;
    char *m = slurp(ref, "manifest.json", &mlen), *r = slurp(ref, "results.jsonl", &rlen);
    char *e = slurp(ref, "errors.jsonl", &elen);
    /* Start of the third-to-last line. */
    size_t start = rlen, nl_seen = 0;
    while (start > 0 && !(r[start - 1] == '\n' && ++nl_seen == 4))
        start--;
    size_t cases = 0, ok = 0;
    static const char zeros[37], junk[] = "[1]\n{\"custom_id\":\"row-99\"}\n";
    struct {
        const char *bytes;
        size_t len;
    } tails[3] = {{"", 0}, {zeros, sizeof zeros}, {junk, sizeof junk - 1}};
    for (size_t t = start; t <= rlen; t++) {
        size_t complete_end = t; /* end of the last complete line before t */
        while (complete_end > 0 && r[complete_end - 1] != '\n')
            complete_end--;
        size_t complete_lines = 0;
        for (size_t p = 0; p < complete_end; p++)
            complete_lines += r[p] == '\n';
        for (int v = 0; v < 3; v++) {
            cases++;
            lay_out(dir, m, mlen, r, t, tails[v].bytes, tails[v].len, e, elen);
            int rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
            if (rc != 0) {
                if (cases - ok < 4)
                    CHECK(0, "t=%zu tail %d: resume failed: %s", t, v, err);
                continue;
            }
            uint64_t completed = job_rows_completed(j);
            bool good = completed == complete_lines && job_rows_failed(j) == 3 &&
                        file_size(dir, "results.jsonl") == complete_end;
            /* The done set is exactly rows 0..(done-1) in results order plus the error rows. */
            int n_done = 0;
            for (int i = 0; i < nrows; i++)
                n_done += row_done(j, i);
            good = good && n_done == (int)(complete_lines + 3) && !row_done(j, 99);
            for (int i = 18; i < 21; i++) {
                size_t lines_needed = (size_t)(i - 18) + 15; /* 15 results lines precede row 18 */
                good = good && row_done(j, i) == (complete_lines > lines_needed);
            }
            /* The next line lands right after the kept prefix. */
            const char *next = "{\"custom_id\":\"next\"}";
            good = good && job_append_result(j, next, strlen(next), err, sizeof err) == 0 &&
                   job_commit(j, err, sizeof err) == 0;
            job_close(j, JOB_RUNNING, err, sizeof err);
            size_t nlen;
            char *now = slurp(dir, "results.jsonl", &nlen);
            good = good && now && nlen == complete_end + strlen(next) + 1 && memcmp(now, r, complete_end) == 0 &&
                   memcmp(now + complete_end, next, strlen(next)) == 0;
            free(now);
            if (good)
                ok++;
            else if (cases - ok < 4)
                CHECK(0, "t=%zu tail %d: wrong recovery (completed %llu, want %zu)", t, v,
                      (unsigned long long)completed, complete_lines);
        }
    }
    CHECK(ok == cases, "torn tail: %zu of %zu cases recovered exactly", ok, cases);
    fprintf(stderr, "torn tail: %zu of %zu cases (every byte of the last 3 lines, 3 tails) recovered exactly\n", ok,
            cases);

    /* Damage inside the committed prefix is refused, never repaired. */
    size_t line5 = 0;
    for (int n = 0; n < 4; n++)
        line5 = (size_t)((char *)memchr(r + line5, '\n', rlen - line5) - r) + 1;
    lay_out(dir, m, mlen, r, line5 + 10, "", 0, e, elen);
    int rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "committed") && strstr(err, "results.jsonl"), "cut inside committed: %s", err);
    char *flipped = malloc(rlen);
    memcpy(flipped, r, rlen);
    flipped[line5] = '#'; /* the line's opening brace */
    lay_out(dir, m, mlen, flipped, rlen, "", 0, e, elen);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "line 5 ") && strstr(err, "committed"), "damaged line 5: %s", err);
    free(flipped);
    /* A results line repeated in errors.jsonl. */
    char *dup = malloc(elen + line5);
    memcpy(dup, e, elen);
    memcpy(dup + elen, r, line5);
    lay_out(dir, m, mlen, r, rlen, "", 0, dup, elen + line5);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "errors.jsonl: line 4 ") && strstr(err, "row-0"), "duplicate custom_id: %s", err);
    free(dup);
    /* A torn errors.jsonl tail is cut too. */
    lay_out(dir, m, mlen, r, rlen, "", 0, e, elen);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/errors.jsonl", dir);
    append_file(path, "{\"custom_id\":\"row-", 18);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc == 0 && job_rows_failed(j) == 3 && file_size(dir, "errors.jsonl") == elen, "torn errors tail: %s", err);
    if (rc == 0)
        job_close(j, JOB_RUNNING, err, sizeof err);
    /* The input changed. */
    append_file(input, "\n", 1);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "input file changed"), "changed input: %s", err);
    CHECK(truncate(input, (off_t)file_size(root, "input.jsonl") - 1) == 0, "restoring the input");
    /* A damaged manifest. */
    static const char no_id[] = "{\n \"spill_job\": 1\n}\n"; /* as commit_state formats it */
    lay_out(dir, no_id, sizeof no_id - 1, r, rlen, "", 0, e, elen);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "manifest") && strstr(err, "\"id\""), "manifest without id: %s", err);
    lay_out(dir, "{\"spill_job\":1}", 15, r, rlen, "", 0, e, elen);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "read back exactly"), "hand-written manifest: %s", err);
    /* One changed digit in a committed size. */
    char *edited = malloc(mlen);
    memcpy(edited, m, mlen);
    char *rb = strstr(edited, "\"results_bytes\": ");
    if (rb) {
        rb += strlen("\"results_bytes\": ");
        *rb = *rb == '1' ? '2' : '1';
    }
    lay_out(dir, edited, mlen, r, rlen, "", 0, e, elen);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rb && rc == 0, "a manifest with a changed number still round-trips: %s", err);
    if (rc == 0)
        job_close(j, JOB_RUNNING, err, sizeof err);
    free(edited);
    lay_out(dir, "{\"spill_job\":", 13, r, rlen, "", 0, e, elen);
    rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "manifest.json"), "torn manifest: %s", err);
    free(m);
    free(r);
    free(e);
}

/*
 * One run of the injection scenario with the fail_at-th call failing:
 * create, 20 rows committed every 6, close as running, a torn tail, resume,
 * 20 more rows, close as done.  committed[i] is set when a commit covering
 * row i returned 0.  Returns true when an injected failure happened.
 */
static bool job_started; /* the last inject_run's job_create returned success */

static bool inject_run(const char *dir, int nrows, bool *committed)
{
    char err[SPILL_ERRLEN];
    job_info info = info_for(nrows);
    job *j = NULL;
    int pending[64], npending = 0;
    bool failed = false;
    job_started = false;
    if (job_create(dir, &info, &test_io, &j, err, sizeof err) != 0) {
        CHECK(err[0] && j == NULL, "create failed without a sentence");
        return true;
    }
    job_started = true;
    for (int phase = 0; phase < 2 && !failed; phase++) {
        for (int i = phase * 20; i < phase * 20 + 20 && !failed; i++) {
            if (row_done(j, i))
                continue;
            if (append_row(j, i, err, sizeof err) != 0) {
                failed = true;
                break;
            }
            pending[npending++] = i;
            if (npending == 6) {
                if (job_commit(j, err, sizeof err) != 0) {
                    failed = true;
                    break;
                }
                while (npending)
                    committed[pending[--npending]] = true;
            }
        }
        if (failed)
            break;
        if (phase == 0) {
            if (job_commit(j, err, sizeof err) != 0) {
                failed = true;
                break;
            }
            while (npending)
                committed[pending[--npending]] = true;
            job_close(j, JOB_RUNNING, err, sizeof err);
            j = NULL;
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/results.jsonl", dir);
            append_file(path, "{\"custom_id\":\"row-3", 19);
            if (job_open_resume(dir, &test_io, &j, err, sizeof err) != 0) {
                CHECK(err[0] && j == NULL, "resume failed without a sentence");
                return true;
            }
        }
    }
    if (!failed) {
        if (job_close(j, JOB_DONE, err, sizeof err) != 0)
            return true; /* the final commit failed; nothing it covered counts */
        for (int i = 0; i < nrows; i++)
            committed[i] = true;
        return false;
    }
    CHECK(err[0] != 0, "failure without a sentence");
    CHECK(job_is_broken(j), "job usable after an I/O error: %s", err);
    CHECK(append_row(j, 39, err, sizeof err) != 0 && strstr(err, "unusable"), "append after failure: %s", err);
    CHECK(job_commit(j, err, sizeof err) != 0, "commit after failure");
    CHECK(job_close(j, JOB_DONE, err, sizeof err) != 0, "close of a broken job reported success");
    return true;
}

/*
 * After a failed or crashed run: resume with healthy I/O (or start over when
 * the job never got a manifest), check that every row whose commit returned
 * is there, finish the job, and check the final files.  True when exact.
 */
static bool recover_exact(const char *dir, int nrows, const bool *committed, long n)
{
    char err[SPILL_ERRLEN], path[PATH_MAX];
    job *j = NULL;
    job_info info = info_for(nrows);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    int rc;
    if (job_started && util_is_file(path))
        rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
    else {
        CHECK(!job_started, "N=%ld: a started job lost its manifest", n);
        rm_rf(dir); /* job_create never returned: the caller starts again */
        rc = job_create(dir, &info, &test_io, &j, err, sizeof err);
    }
    if (rc != 0 && strstr(err, "already done")) {
        /* The final commit renamed a "done" manifest in, then failed: the
         * caller saw the error, resume says the job is done — and it must
         * be, exactly. */
        int bad = verify_final(dir, nrows);
        CHECK(bad == 0, "N=%ld: job reported done but the files are not exact", n);
        return bad == 0;
    }
    if (rc != 0) {
        CHECK(0, "N=%ld: recovery failed: %s", n, err);
        return false;
    }
    int lost = 0;
    for (int i = 0; i < nrows; i++)
        lost += committed[i] && !row_done(j, i);
    CHECK(lost == 0, "N=%ld: %d committed rows lost", n, lost);
    for (int i = 0; i < nrows; i++)
        if (!row_done(j, i))
            append_row(j, i, err, sizeof err);
    rc = job_close(j, JOB_DONE, err, sizeof err);
    CHECK(rc == 0, "N=%ld: finishing after recovery: %s", n, err);
    int bad = verify_final(dir, nrows);
    CHECK(bad == 0, "N=%ld: final files not exact", n);
    return lost == 0 && rc == 0 && bad == 0;
}

static void test_io_errors(void)
{
    const int nrows = 40;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/inject", root);
    int runs = 0, exact = 0;
    io_failed_kinds = 0;
    for (long n = 1; n < 10000; n++) {
        bool committed[40] = {0};
        rm_rf(dir);
        io_calls = 0;
        io_fail_at = n;
        bool injected = inject_run(dir, nrows, committed);
        io_fail_at = -1;
        if (!injected) {
            CHECK(verify_final(dir, nrows) == 0, "run without failure (N=%ld) is not exact", n);
            break;
        }
        runs++;
        exact += recover_exact(dir, nrows, committed, n);
    }
    fprintf(stderr, "I/O errors: %d injected runs, %d recovered exactly; call kinds failed at least once:", runs,
            exact);
    for (int k = 0; k < IO_KINDS; k++) {
        fprintf(stderr, " %s", io_names[k]);
        CHECK(io_failed_kinds & (1u << k), "no %s call was ever failed", io_names[k]);
    }
    fputc('\n', stderr);
    CHECK(runs > 50 && exact == runs, "%d of %d injected runs recovered exactly", exact, runs);
}

/*
 * Power loss (reliability.md §7 row 9, simulated): the scenario of
 * test_io_errors with the machine dying at its N-th call, for every N and 3
 * draws of the crash model each; then resume must keep every row whose
 * commit returned, cut whatever the crash tore, and finish exactly.
 */
static void test_power_loss(void)
{
    const int nrows = 40;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/power", root);
    int crashes = 0, exact = 0;
    crash_mode = true;
    srand(777);
    for (long n = 1; n < 10000; n++) {
        bool clean_run = false;
        for (int draw = 0; draw < 3 && !clean_run; draw++) {
            bool committed[40] = {0};
            rm_rf(dir);
            io_calls = 0;
            io_fail_at = n;
            crashed = false;
            n_synced = 0;
            rename_pending = entries_pending = false;
            bool injected = inject_run(dir, nrows, committed);
            io_fail_at = -1;
            bool was_crash = crashed;
            crashed = false;
            if (!injected) {
                CHECK(verify_final(dir, nrows) == 0, "run without a crash (N=%ld) is not exact", n);
                clean_run = true;
                break;
            }
            CHECK(was_crash, "N=%ld: a failure that was not the crash", n);
            apply_crash(dir);
            crashes++;
            exact += recover_exact(dir, nrows, committed, n);
        }
        if (clean_run)
            break;
    }
    crash_mode = false;
    free(prev_manifest);
    prev_manifest = NULL;
    CHECK(crashes >= 100 && exact == crashes, "power loss: %d of %d crashes recovered exactly", exact, crashes);
    fprintf(stderr, "power loss: %d of %d simulated crashes recovered exactly\n", exact, crashes);
}

/*
 * The kill test's child: resume, append every missing row in order,
 * committing every 16 rows.  Reports on fd `report`: UINT64_MAX once resumed,
 * then the done count after each commit.  Exits 0 once the job is done.
 */
static void kill_child(const char *dir, int nrows, int report)
{
    char err[SPILL_ERRLEN];
    job *j;
    if (job_open_resume(dir, &test_io, &j, err, sizeof err) != 0)
        _exit(strstr(err, "already done") ? 0 : 3);
    uint64_t ready = UINT64_MAX;
    if (write(report, &ready, sizeof ready) != sizeof ready)
        _exit(6);
    int since = 0;
    for (int i = 0; i < nrows; i++) {
        if (row_done(j, i))
            continue;
        if (append_row(j, i, err, sizeof err) != 0)
            _exit(4);
        if (++since == 16) {
            if (job_commit(j, err, sizeof err) != 0)
                _exit(5);
            since = 0;
            uint64_t done = job_rows_completed(j) + job_rows_failed(j);
            if (write(report, &done, sizeof done) != sizeof done)
                _exit(6);
        }
        for (volatile int spin = 0; spin < 80000; spin++)
            ; /* ~100 us a row, so a kill lands every few dozen rows */
    }
    _exit(job_close(j, JOB_DONE, err, sizeof err) == 0 ? 0 : 7);
}

static void test_kill9(void)
{
    const int nrows = 2000;
    char dir[256], err[SPILL_ERRLEN];
    int kills = 0, jobs = 0, lost_total = 0, child_errors = 0;
    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "kill -9: seed %u\n", seed);
    srand(seed);
    while (kills < 50 && jobs < 5) {
        snprintf(dir, sizeof dir, "%s/kill%d", root, jobs++);
        job_info info = info_for(nrows);
        job *j;
        if (job_create(dir, &info, &test_io, &j, err, sizeof err) != 0) {
            CHECK(0, "create: %s", err);
            return;
        }
        job_close(j, JOB_RUNNING, err, sizeof err);
        int job_kills = 0;
        for (int round = 0; round < 2000; round++) {
            int fds[2];
            if (pipe(fds) != 0)
                break;
            pid_t pid = fork();
            if (pid == 0) {
                close(fds[0]);
                kill_child(dir, nrows, fds[1]);
            }
            close(fds[1]);
            /* A quarter of the kills land anywhere from fork on (often inside
             * the resume: scan, ftruncate, commit).  The rest wait for the
             * child to resume and then for 0-2 of its commits, and land a
             * random 0-150 us later, inside the append/commit loop: pacing
             * by commits, not by time alone, keeps each child's progress
             * small however loaded the machine is. */
            uint64_t reported = 0, v;
            long max_us = 400;
            if (rand() % 4 != 0) {
                max_us = 150;
                for (int want = 1 + rand() % 3; want > 0; want--) {
                    if (read(fds[0], &v, sizeof v) != sizeof v) {
                        max_us = 0; /* the child is gone already (done) */
                        break;
                    }
                    if (v != UINT64_MAX)
                        reported = v;
                }
            }
            struct timespec ts = {0, (rand() % (max_us + 1)) * 1000L};
            nanosleep(&ts, NULL);
            /* After 60 kills of this job the child may finish. */
            bool killed = job_kills < 60 && kill(pid, SIGKILL) == 0;
            int status = 0;
            waitpid(pid, &status, 0);
            while (read(fds[0], &v, sizeof v) == sizeof v)
                if (v != UINT64_MAX)
                    reported = v;
            close(fds[0]);
            bool finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
                child_errors++;
            if (killed && WIFSIGNALED(status)) {
                kills++;
                job_kills++;
            }
            if (finished)
                break;
            /* After every other kill the next child is the first to resume
             * (its own scan must find the uncommitted lines); after the rest,
             * the parent resumes and checks that every row the child
             * reported committed is there. */
            if (round % 2 == 1)
                continue;
            if (job_open_resume(dir, &test_io, &j, err, sizeof err) != 0) {
                if (strstr(err, "already done"))
                    break; /* killed after its final commit */
                CHECK(0, "resume after kill %d: %s", kills, err);
                return;
            }
            uint64_t done = job_rows_completed(j) + job_rows_failed(j);
            if (done < reported)
                lost_total++;
            job_close(j, JOB_RUNNING, err, sizeof err);
        }
        CHECK(verify_final(dir, nrows) == 0, "kill job %d: final files not exact", jobs);
        fprintf(stderr, "kill -9: job %d: %d kills\n", jobs, job_kills);
    }
    CHECK(child_errors == 0, "%d children exited with an error", child_errors);
    CHECK(lost_total == 0, "%d resumes found fewer rows than the child had committed", lost_total);
    CHECK(kills >= 50, "only %d kills", kills);
    fprintf(stderr, "kill -9: %d kills over %d jobs of %d rows, every row exactly once\n", kills, jobs, nrows);
}

/*
 * job_check_line against jansson (the reference parser): 100,000 mutated
 * lines, each must get the same verdict — one JSON object with a string
 * custom_id — and the same decoded custom_id (0 disagreements allowed).
 * Inputs jansson refuses for number range or depth (which job_check_line
 * does not check) are skipped; lines with a raw NUL byte must be refused.
 */
static void test_check_line(void)
{
    static const char *const bases[] = {
        "{\"id\":\"batch_req_1\",\"custom_id\":\"row-1\",\"response\":{\"status_code\":200,\"body\":{\"x\":[1,-2.5e3,"
        "true,false,null,{}]}},\"error\":null}",
        "{\"custom_id\":\"a\\u00e9\\ud83d\\ude00\\n\\\"q\\\\/\",\"t\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\",\"n\":0}",
        " { \"k\" : [ 0.5 , [ ] , { \"custom_id\" : 1 } ] , \"custom_\\u0069d\" : \"esc-key\" } ",
        "{\"custom_id\":\"first\",\"custom_id\":\"last\"}",
        "{\"custom_id\":\"x\\u0000y\",\"v\":\"\\u0000\"}",
        "{\"x\":{\"custom_id\":\"nested\"},\"y\":[\"custom_id\",\"z\"]}\t",
    };
    const int nbases = (int)(sizeof bases / sizeof *bases);
    static const char alphabet[] =
        "{}[]\",:\\u0123456789abcdefABCDEF-+.eE tnrfl\x7f\x80\xc3\xa9\xed\xa0\xf0\x9f\xff\x01\x1f\t";
    char line[512], *scratch = NULL, why[128];
    size_t cap = 0;
    int agree = 0, skipped = 0, total = 0, shown = 0, valid = 0;
    srand(12345);
    for (int it = 0; it < 100000; it++) {
        const char *b = bases[it % nbases];
        size_t n = strlen(b);
        memcpy(line, b, n);
        int muts = it < nbases ? 0 : 1 + rand() % 3;
        for (int m = 0; m < muts && n > 1 && n < sizeof line - 8; m++) {
            size_t at = (size_t)rand() % n;
            char c = alphabet[rand() % (int)(sizeof alphabet - 1)];
            switch (rand() % 4) {
            case 0:
                line[at] = c;
                break;
            case 1:
                memmove(line + at, line + at + 1, n - at - 1);
                n--;
                break;
            case 2:
                memmove(line + at + 1, line + at, n - at);
                line[at] = c;
                n++;
                break;
            default:
                if (rand() % 8 == 0)
                    line[at] = 0;
                else
                    n = at + 1; /* NUL byte, or cut */
            }
        }
        json_error_t jerr;
        json_t *o = json_loadb(line, n, JSON_ALLOW_NUL, &jerr);
        if (!o && (strstr(jerr.text, "too big") || strstr(jerr.text, "overflow") || strstr(jerr.text, "depth"))) {
            skipped++;
            continue;
        }
        json_t *cid = json_object_get(o, "custom_id");
        /* A raw NUL byte is never valid JSON, but jansson 2.14 accepts some
         * (it ends a number it reads through a C string): the RFC is the
         * reference there. */
        bool raw_nul = memchr(line, 0, n) != NULL;
        bool ref_ok = json_is_object(o) && json_is_string(cid) && !raw_nul;
        /* jansson 2.14 cannot hold a NUL in a key; RFC 8259 allows "\u0000" there (and the output writes such
         * keys), so those lines are left out of the comparison (test_bytes checks them). */
        if (!o && strstr(jerr.text, "NUL byte in object key")) {
            skipped++;
            continue;
        }
        const char *id = NULL;
        size_t idlen = 0;
        bool ok = job_check_line(line, n, &id, &idlen, &scratch, &cap, why, sizeof why) == 0;
        bool same =
            ok == ref_ok &&
            (!ok || raw_nul || (idlen == json_string_length(cid) && memcmp(id, json_string_value(cid), idlen) == 0));
        total++;
        agree += same;
        valid += ref_ok;
        if (!same && shown++ < 5)
            fprintf(stderr, "check_line disagrees with jansson (ours %d: %s, jansson %d: %s): %.*s\n", ok,
                    ok ? "" : why, ref_ok, o ? "" : jerr.text, (int)n, line);
        json_decref(o);
    }
    free(scratch);
    CHECK(total > 90000 && agree == total && valid > 5000 && valid < total - 5000,
          "job_check_line agrees with jansson on %d of %d lines (%d valid, %d skipped)", agree, total, valid, skipped);
    fprintf(stderr, "check_line: agrees with jansson on %d of %d mutated lines (%d valid; %d skipped: number range or a NUL in a key)\n",
            agree, total, valid, skipped);
}

/* Allocation failures through jansson's allocator hook (every parse of a
 * line, every manifest): each failure point gives a clean error, and a later
 * resume is exact. */
static long alloc_calls, alloc_fail_at = -1;
static void *counting_malloc(size_t n)
{
    return ++alloc_calls == alloc_fail_at ? NULL : malloc(n);
}

static void test_oom(void)
{
    const int nrows = 12;
    char dir[256], err[SPILL_ERRLEN];
    snprintf(dir, sizeof dir, "%s/oom", root);
    int points = 0, clean = 0;
    for (long n = 1; n < 100000; n++) {
        rm_rf(dir);
        job_info info = info_for(nrows);
        job *j;
        if (job_create(dir, &info, &test_io, &j, err, sizeof err) != 0) {
            CHECK(0, "create: %s", err);
            return;
        }
        for (int i = 0; i < 4; i++)
            append_row(j, i, err, sizeof err);
        job_close(j, JOB_INTERRUPTED, err, sizeof err);

        json_set_alloc_funcs(counting_malloc, free);
        alloc_calls = 0;
        alloc_fail_at = n;
        int rc = job_open_resume(dir, &test_io, &j, err, sizeof err);
        for (int i = 4; rc == 0 && i < nrows; i++) {
            rc = append_row(j, i, err, sizeof err);
            if (rc == 0 && i % 3 == 0)
                rc = job_commit(j, err, sizeof err);
        }
        if (j && rc == 0)
            rc = job_close(j, JOB_DONE, err, sizeof err);
        else if (j)
            job_close(j, JOB_INTERRUPTED, err + strlen(err), 0); /* keep the first sentence */
        alloc_fail_at = -1;
        json_set_alloc_funcs(malloc, free);
        if (alloc_calls < n) {
            CHECK(rc == 0 && verify_final(dir, nrows) == 0, "run without failure: %s", err);
            break;
        }
        points++;
        bool ok = rc != 0 && (strstr(err, "out of memory") || strstr(err, "memory ran out"));
        /* Recover with memory back: resume (unless the job got done) and finish. */
        if (job_open_resume(dir, &test_io, &j, err, sizeof err) == 0) {
            for (int i = 0; i < nrows; i++)
                if (!row_done(j, i))
                    append_row(j, i, err, sizeof err);
            int crc = job_close(j, JOB_DONE, err, sizeof err);
            ok = ok && crc == 0;
        } else
            ok = ok && strstr(err, "already done");
        ok = ok && verify_final(dir, nrows) == 0;
        if (ok)
            clean++;
        else if (points - clean < 40)
            CHECK(0, "allocation %ld: no clean error or no exact recovery: %s", n, err);
    }
    CHECK(points > 50 && clean == points, "OOM: %d of %d failure points clean and exactly recovered", clean, points);
    fprintf(stderr, "OOM: %d of %d allocation failure points gave a clean error and an exact resume\n", clean, points);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TIMED(call)                                                                                                    \
    do {                                                                                                               \
        double t0_ = now_s();                                                                                          \
        call;                                                                                                          \
        fprintf(stderr, "%s: %.2f s\n", #call, now_s() - t0_);                                                         \
    } while (0)

int main(void)
{
    /* tmpfs when there is one: the same syscalls, without ext4's ~4 ms per
     * rename/fsync of metadata that would make this test take minutes. */
    snprintf(root, sizeof root, "%s/spill_test_job.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    make_input(2000);
    TIMED(test_basic());
    TIMED(test_check_line());
    TIMED(test_torn_tail());
    TIMED(test_io_errors());
    TIMED(test_power_loss());
    TIMED(test_oom());
    TIMED(test_kill9());
    rm_rf(root);
    return test_finish("test_job");
}
