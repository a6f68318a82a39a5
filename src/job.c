/*
 * job.c — the durable job store (see job.h for the API).
 *
 * Owns: the job directory, its three files, the commit protocol, the resume
 * scan and the done set of custom_ids.  Does not: build output lines
 * (output.c), read the input rows (request.c), decide when to commit (the
 * runner: every K rows or T ms), or write the run store (runs/<id>/).
 *
 * Directory layout (one job):
 *   manifest.json      one JSON object, rewritten atomically on every commit:
 *     {"spill_job":1, "id", "command", "state":"running|interrupted|done",
 *      "input":{"path" (absolute), "sha256", "bytes"}, "options":{...},
 *      "model":{"id","fingerprint"}, "engine_version",
 *      "started_at", "updated_at", "ended_at" (unix s, ended_at null while running),
 *      "resumes" (times reopened),
 *      "rows":{"total","completed","failed"},
 *      "committed":{"results_bytes","errors_bytes"}}
 *   results.jsonl      one BatchRequestOutput line per successful row
 *   errors.jsonl       one line per failed row
 *   manifest.json.tmp  only between the write and the rename of a commit
 * Both .jsonl files are sequences of lines, each one JSON object with a string
 * "custom_id", terminated by '\n'.  "completed"/"failed" count the committed
 * lines of results.jsonl/errors.jsonl (OpenAI's request_counts names).
 *
 * Commit protocol (reliability.md §3): lines are appended with O_APPEND by
 * the only writer, one write(2) loop per line.  job_commit fsyncs both files,
 * then writes manifest.json.tmp, fsyncs it, renames it over manifest.json and
 * fsyncs the directory.  A row is done iff the commit covering its line
 * returned.  Any failing write/fsync/rename/ftruncate marks the job broken: no
 * retry, because after a writeback error Linux may report a later fsync as
 * successful without the data reaching disk (PostgreSQL "fsyncgate").
 *
 * Resume decisions:
 *  - The scan starts at byte 0, not at the committed offset: the done set
 *    needs every custom_id, and re-validating the committed prefix costs one
 *    JSON parse per row (milliseconds for 50,000 rows) and catches a file
 *    edited or damaged outside spill.  The files are mapped read-only.
 *  - Kept: the longest prefix of lines that end in '\n' and parse as objects
 *    with a string custom_id.  Complete lines past the committed offset are
 *    kept too (a writer killed between append and commit left them whole;
 *    they are fsynced and committed before resume returns), so their rows are
 *    not run twice.  Everything after the first bad line is cut with
 *    ftruncate — a torn tail, or zeros a power loss left after the last synced
 *    block.  Counting lines instead of parsing them would count a torn tail as
 *    done (NVIDIA nemotron PR #120).
 *  - A bad line or end of file inside the committed prefix, or a custom_id
 *    seen twice, is corruption, never repaired silently: the call fails naming
 *    the file, line and byte offset.
 *  - The manifest's counters are rebuilt from the scan; the input file must
 *    still hash to the recorded SHA-256 (a changed input would make "skip the
 *    done custom_ids" wrong).
 */
#include "job.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#define MANIFEST_NAME "manifest.json"
#define MANIFEST_TMP "manifest.json.tmp"
#define MANIFEST_CAP (64u << 20) /* options are small; anything bigger is not ours */

enum { F_RESULTS = 0, F_ERRORS = 1 };
static const char *const file_names[2] = {"results.jsonl", "errors.jsonl"};
static const char *const state_names[3] = {"running", "interrupted", "done"};

/* The done set: custom_ids in append order, found through an open-addressing
 * table.  ids[0, n_committed) are committed; the rest are pending. */
typedef struct idset {
    char **ids;       /* (n) owned copies, NUL-terminated */
    size_t *lens;     /* (n) byte lengths (custom_id may not contain NUL, but lengths keep it exact) */
    size_t n, cap;
    size_t n_committed;
    uint32_t *slots;  /* (nslots) index + 1, 0 = empty; nslots a power of two, load <= 1/2 */
    size_t nslots;
} idset;

typedef struct job_file {
    int fd;
    uint64_t size;           /* bytes appended so far (committed + pending) */
    uint64_t committed;      /* bytes covered by the last commit */
    uint64_t rows;           /* lines appended so far */
    uint64_t rows_committed;
} job_file;

struct job {
    char *dir;
    char id[JOB_ID_MAX];
    const job_io *io;
    json_t *manifest;        /* owned; the dynamic keys are refreshed on every commit */
    job_file f[2];
    idset done;
    uint64_t rows_total;
    bool broken;
    char *buf;               /* one line + '\n' on its way to write(2) */
    size_t bufcap;
};

/* ---------------------------------------------------------------- syscalls */

static int real_open(const char *path, int flags, mode_t mode) { return open(path, flags, mode); }

static const job_io real_io = {real_open, write, fsync, rename, ftruncate};

static int io_write_all(const job_io *io, int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = io->write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO; /* a regular file never accepts 0 bytes without an error */
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int io_fsync_dir(const job_io *io, const char *dir)
{
    int fd = io->open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int rc = io->fsync(fd);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* ------------------------------------------------------------------ done set */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Returns the index of (s, n), or -1. */
static long idset_find(const idset *set, const char *s, size_t n)
{
    if (!set->nslots)
        return -1;
    size_t mask = set->nslots - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = set->slots[i];
        if (!v)
            return -1;
        size_t k = v - 1;
        if (set->lens[k] == n && memcmp(set->ids[k], s, n) == 0)
            return (long)k;
    }
}

static int idset_rehash(idset *set, size_t nslots)
{
    uint32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t k = 0; k < set->n; k++) {
        size_t i = hash_bytes(set->ids[k], set->lens[k]) & (nslots - 1);
        while (slots[i])
            i = (i + 1) & (nslots - 1);
        slots[i] = (uint32_t)(k + 1);
    }
    free(set->slots);
    set->slots = slots;
    set->nslots = nslots;
    return 0;
}

/* Adds (s, n), which must not be present.  Returns 0, or -1 when out of memory. */
static int idset_add(idset *set, const char *s, size_t n)
{
    if (set->n >= UINT32_MAX - 1)
        return -1;
    if (set->n == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 1024;
        char **ids = realloc(set->ids, cap * sizeof *ids);
        if (!ids)
            return -1;
        set->ids = ids;
        size_t *lens = realloc(set->lens, cap * sizeof *lens);
        if (!lens)
            return -1;
        set->lens = lens;
        set->cap = cap;
    }
    if ((set->n + 1) * 2 > set->nslots && idset_rehash(set, set->nslots ? set->nslots * 2 : 2048) != 0)
        return -1;
    char *copy = malloc(n + 1);
    if (!copy)
        return -1;
    memcpy(copy, s, n);
    copy[n] = 0;
    size_t mask = set->nslots - 1;
    size_t i = hash_bytes(s, n) & mask;
    while (set->slots[i])
        i = (i + 1) & mask;
    set->ids[set->n] = copy;
    set->lens[set->n] = n;
    set->slots[i] = (uint32_t)(++set->n);
    return 0;
}

static void idset_free(idset *set)
{
    for (size_t k = 0; k < set->n; k++)
        free(set->ids[k]);
    free(set->ids);
    free(set->lens);
    free(set->slots);
    memset(set, 0, sizeof *set);
}

/* ------------------------------------------------------------------ helpers */

/* Parses one line (no '\n') as an object with a string custom_id; returns
 * the parsed object (caller decrefs) and points *id, *idlen into it. */
static json_t *parse_line(const char *line, size_t len, const char **id, size_t *idlen, const char **why)
{
    json_error_t jerr;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &jerr); /* text may hold U+0000 */
    if (!o) {
        *why = "is not valid JSON";
        return NULL;
    }
    json_t *cid = json_object_get(o, "custom_id");
    if (!json_is_object(o) || !json_is_string(cid)) {
        *why = json_is_object(o) ? "has no string \"custom_id\"" : "is not a JSON object";
        json_decref(o);
        return NULL;
    }
    *id = json_string_value(cid);
    *idlen = json_string_length(cid);
    return o;
}

static int mkdir_p(const char *path, char *err, size_t errlen)
{
    char buf[PATH_MAX];
    if (util_pathf(buf, sizeof buf, "%s", path) != 0)
        return util_errf(err, errlen, "job directory path is longer than %d bytes; choose a shorter -o path.",
                         PATH_MAX);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return util_errf(err, errlen, "%s: cannot create directory: %s; check the path and permissions.",
                                 buf, strerror(errno));
            *p = c;
            if (!c)
                break;
        }
    }
    if (!util_is_dir(path))
        return util_errf(err, errlen, "%s exists and is not a directory; choose another job directory.", path);
    return 0;
}

/* 1 when dir has any entry, 0 when empty, -1 (with err) when unreadable. */
static int dir_nonempty(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return util_errf(err, errlen, "%s: cannot read directory: %s.", dir, strerror(errno));
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            found = 1;
            break;
        }
    closedir(d);
    return found;
}

/* Streams a file through SHA-256; fills hex and *bytes. */
static int sha256_file(const char *path, char hex[65], uint64_t *bytes, char *err, size_t errlen)
{
    int rc = -1;
    unsigned char *buf = NULL;
    EVP_MD_CTX *ctx = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_errf(err, errlen, "%s: cannot open the input file: %s.", path, strerror(errno));
    buf = malloc(1u << 20);
    ctx = EVP_MD_CTX_new();
    if (!buf || !ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        util_errf(err, errlen, "%s: out of memory hashing the input file.", path);
        goto out;
    }
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, 1u << 20);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            util_errf(err, errlen, "%s: read failed at byte %llu while hashing the input: %s.", path,
                      (unsigned long long)total, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        EVP_DigestUpdate(ctx, buf, (size_t)r);
        total += (uint64_t)r;
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    *bytes = total;
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

static int file_path(char *out, const job *j, const char *name, char *err, size_t errlen)
{
    if (util_pathf(out, PATH_MAX, "%s/%s", j->dir, name) != 0)
        return util_errf(err, errlen, "%s/%s: path longer than %d bytes; choose a shorter job directory.", j->dir,
                         name, PATH_MAX);
    return 0;
}

static int broken_err(const job *j, char *err, size_t errlen)
{
    return util_errf(err, errlen,
                     "job %s is unusable after an earlier write or fsync error; exit and run `spill resume %s`.",
                     j->id, j->dir);
}

static void job_free(job *j)
{
    if (!j)
        return;
    for (int k = 0; k < 2; k++)
        if (j->f[k].fd >= 0)
            close(j->f[k].fd);
    json_decref(j->manifest);
    idset_free(&j->done);
    free(j->buf);
    free(j->dir);
    free(j);
}

static job *job_alloc(const char *dir, const job_io *io)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->f[0].fd = j->f[1].fd = -1;
    j->io = io ? io : &real_io;
    j->dir = strdup(dir);
    if (!j->dir) {
        free(j);
        return NULL;
    }
    return j;
}

/* ------------------------------------------------------------------ commit */

static int set_u64(json_t *o, const char *key, uint64_t v)
{
    return json_object_set_new(o, key, json_integer((json_int_t)v));
}

/*
 * fsyncs both files (when dirty or forced) and rewrites the manifest with
 * `state`.  ended: also stamp ended_at.  On any I/O failure the job breaks.
 */
static int commit_state(job *j, job_state state, bool force, char *err, size_t errlen)
{
    if (j->broken)
        return broken_err(j, err, errlen);
    bool dirty = j->f[0].size != j->f[0].committed || j->f[1].size != j->f[1].committed;
    if (!dirty && !force)
        return 0;
    char path[PATH_MAX], tmp[PATH_MAX];
    if (file_path(path, j, MANIFEST_NAME, err, errlen) != 0 || file_path(tmp, j, MANIFEST_TMP, err, errlen) != 0)
        return -1;
    for (int k = 0; k < 2; k++)
        if (j->io->fsync(j->f[k].fd) != 0) {
            j->broken = true;
            return util_errf(err, errlen,
                             "%s/%s: fsync failed: %s; the job stops here (no retry) — fix the disk, then run "
                             "`spill resume %s`.",
                             j->dir, file_names[k], strerror(errno), j->dir);
        }

    json_t *m = j->manifest;
    json_t *rows = json_object(), *committed = json_object();
    time_t now = time(NULL);
    int bad = !rows || !committed;
    bad |= set_u64(rows, "total", j->rows_total) | set_u64(rows, "completed", j->f[F_RESULTS].rows) |
           set_u64(rows, "failed", j->f[F_ERRORS].rows);
    bad |= set_u64(committed, "results_bytes", j->f[F_RESULTS].size) |
           set_u64(committed, "errors_bytes", j->f[F_ERRORS].size);
    bad |= json_object_set_new(m, "rows", rows) | json_object_set_new(m, "committed", committed);
    bad |= json_object_set_new(m, "state", json_string(state_names[state]));
    bad |= json_object_set_new(m, "updated_at", json_integer((json_int_t)now));
    bad |= json_object_set_new(m, "ended_at", state == JOB_RUNNING ? json_null() : json_integer((json_int_t)now));
    char *text = bad ? NULL : json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (!text) {
        j->broken = true; /* the manifest object may be half-updated */
        return util_errf(err, errlen, "%s: out of memory building the manifest; exit and run `spill resume %s`.",
                         path, j->dir);
    }
    size_t len = strlen(text);
    text[len++] = '\n'; /* replaces the NUL: the buffer is written by length */
    const char *what = "open", *where = tmp;
    int rc = -1;
    int fd = j->io->open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        what = "write";
        if (io_write_all(j->io, fd, text, len) == 0) {
            what = "fsync";
            if (j->io->fsync(fd) == 0)
                rc = 0;
        }
        int saved = errno;
        close(fd);
        errno = saved;
    }
    free(text);
    if (rc == 0) {
        what = "rename to manifest.json";
        rc = j->io->rename(tmp, path);
    }
    if (rc == 0) {
        what = "fsync";
        where = j->dir;
        rc = io_fsync_dir(j->io, j->dir);
    }
    if (rc != 0) {
        j->broken = true;
        return util_errf(err, errlen,
                         "%s: %s failed while committing the manifest: %s; the job stops here (no retry) — fix the "
                         "disk, then run `spill resume %s`.",
                         where, what, strerror(errno), j->dir);
    }
    for (int k = 0; k < 2; k++) {
        j->f[k].committed = j->f[k].size;
        j->f[k].rows_committed = j->f[k].rows;
    }
    j->done.n_committed = j->done.n;
    return 0;
}

int job_commit(job *j, char *err, size_t errlen) { return commit_state(j, JOB_RUNNING, false, err, errlen); }

/* ------------------------------------------------------------------ create */

int job_new_id(char *out, size_t cap, char *err, size_t errlen)
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    if (cap < JOB_ID_MAX)
        return util_errf(err, errlen, "job id buffer of %zu bytes is smaller than %d.", cap, JOB_ID_MAX);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    size_t n = strftime(out, cap, "%Y%m%d-%H%M%S-", &tm);
    unsigned char rnd[10];
    ssize_t got;
    do
        got = getrandom(rnd, sizeof rnd, 0);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof rnd)
        return util_errf(err, errlen, "cannot read random bytes for a job id: %s.",
                         got < 0 ? strerror(errno) : "short read");
    for (size_t i = 0; i < sizeof rnd; i++)
        out[n++] = alphabet[rnd[i] % 36]; /* 256 % 36 = 4: a bias of ~1.6% is harmless for a unique name */
    out[n] = 0;
    return 0;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

int job_create(const char *dir, const job_info *info, const job_io *io, job **out, char *err, size_t errlen)
{
    *out = NULL;
    char id[JOB_ID_MAX], dirbuf[PATH_MAX], path[PATH_MAX];
    if (job_new_id(id, sizeof id, err, errlen) != 0)
        return -1;
    if (!dir) {
        if (util_pathf(dirbuf, sizeof dirbuf, "%s/jobs/%s", util_spill_home(), id) != 0)
            return util_errf(err, errlen, "SPILL_HOME path is too long for a job directory; set a shorter one.");
        dir = dirbuf;
    }
    if (!info || !info->command || !info->input_path)
        return util_errf(err, errlen, "job_create: command and input_path are required.");
    char hex[65];
    uint64_t in_bytes = 0;
    char *in_abs = realpath(info->input_path, NULL);
    if (!in_abs)
        return util_errf(err, errlen, "%s: cannot resolve the input path: %s.", info->input_path, strerror(errno));
    if (sha256_file(in_abs, hex, &in_bytes, err, errlen) != 0) {
        free(in_abs);
        return -1;
    }

    bool existed = util_is_dir(dir);
    if (mkdir_p(dir, err, errlen) != 0)
        goto out_free_in;
    int ne = dir_nonempty(dir, err, errlen);
    if (ne != 0) {
        if (ne > 0)
            util_errf(err, errlen,
                      "%s already holds files; run `spill resume %s` to continue that job, or choose an empty or "
                      "new directory.",
                      dir, dir);
        goto out_free_in;
    }

    job *j = job_alloc(dir, io);
    if (!j) {
        util_errf(err, errlen, "out of memory creating job %s.", dir);
        goto out_remove;
    }
    memcpy(j->id, id, sizeof id);
    j->rows_total = info->rows_total;
    for (int k = 0; k < 2; k++) {
        if (file_path(path, j, file_names[k], err, errlen) != 0)
            goto out_free_job;
        j->f[k].fd = j->io->open(path, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (j->f[k].fd < 0) {
            util_errf(err, errlen, "%s: cannot create: %s; check the directory's permissions and free space.", path,
                      strerror(errno));
            goto out_free_job;
        }
    }

    json_t *m = json_object();
    j->manifest = m;
    json_t *input = json_object(), *model = json_object();
    time_t now = time(NULL);
    int bad = !m || !input || !model;
    bad |= json_object_set_new(m, "spill_job", json_integer(JOB_MANIFEST_VERSION));
    bad |= json_object_set_new(m, "id", json_string(id));
    bad |= json_object_set_new(m, "command", json_string(info->command));
    bad |= json_object_set_new(m, "state", json_string("running"));
    bad |= json_object_set_new(input, "path", json_string(in_abs));
    bad |= json_object_set_new(input, "sha256", json_string(hex));
    bad |= set_u64(input, "bytes", in_bytes);
    bad |= json_object_set_new(m, "input", input);
    input = NULL;
    bad |= json_object_set_new(m, "options", info->options ? json_deep_copy(info->options) : json_object());
    bad |= json_object_set_new(model, "id", str_or_null(info->model_id));
    bad |= json_object_set_new(model, "fingerprint", str_or_null(info->model_fingerprint));
    bad |= json_object_set_new(m, "model", model);
    model = NULL;
    bad |= json_object_set_new(m, "engine_version", str_or_null(info->engine_version));
    bad |= json_object_set_new(m, "started_at", json_integer((json_int_t)now));
    bad |= json_object_set_new(m, "resumes", json_integer(0));
    if (bad) {
        util_errf(err, errlen, "out of memory building the manifest of job %s.", dir);
        goto out_free_job;
    }
    if (commit_state(j, JOB_RUNNING, true, err, errlen) != 0)
        goto out_free_job;
    free(in_abs);
    *out = j;
    return 0;

out_free_job:
    job_free(j);
out_remove:
    /* Best effort: leave the directory as we found it so a retry is not
     * refused as "already holds files". */
    for (int k = 0; k < 2; k++)
        if (util_pathf(path, sizeof path, "%s/%s", dir, file_names[k]) == 0)
            unlink(path);
    if (util_pathf(path, sizeof path, "%s/%s", dir, MANIFEST_TMP) == 0)
        unlink(path);
    if (util_pathf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME) == 0)
        unlink(path);
    if (!existed)
        rmdir(dir);
out_free_in:
    free(in_abs);
    return -1;
}

/* ------------------------------------------------------------------ resume */

static int get_u64(json_t *o, const char *key, uint64_t *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return -1;
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

/*
 * Scans file k from byte 0: keeps the valid prefix (adding its custom_ids to
 * the done set), cuts the rest, fsyncs.  `committed` is the manifest's size.
 */
static int scan_file(job *j, int k, uint64_t committed, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (file_path(path, j, file_names[k], err, errlen) != 0)
        return -1;
    job_file *f = &j->f[k];
    f->fd = j->io->open(path, O_RDWR | O_APPEND | O_CLOEXEC, 0);
    if (f->fd < 0)
        return util_errf(err, errlen, "%s: cannot open: %s; the job directory is incomplete — restore the file or "
                         "start a new job.", path, strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return util_errf(err, errlen, "%s: not a regular file; restore it or start a new job.", path);
    uint64_t size = (uint64_t)st.st_size;
    if (size < committed)
        return util_errf(err, errlen,
                         "%s: file is %llu bytes but %llu bytes were committed; it was truncated outside spill — "
                         "restore it or start a new job.",
                         path, (unsigned long long)size, (unsigned long long)committed);
    const char *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, f->fd, 0);
        if (map == MAP_FAILED)
            return util_errf(err, errlen, "%s: cannot map %llu bytes: %s.", path, (unsigned long long)size,
                             strerror(errno));
    }
    int rc = -1;
    uint64_t pos = 0, line = 0;
    while (pos < size) {
        const char *nl = memchr(map + pos, '\n', size - pos);
        const char *why = "is torn (no final newline)";
        uint64_t len = nl ? (uint64_t)(nl - (map + pos)) : size - pos;
        const char *id = NULL;
        size_t idlen = 0;
        json_t *o = nl ? parse_line(map + pos, len, &id, &idlen, &why) : NULL;
        if (!o) {
            if (pos < committed) {
                util_errf(err, errlen,
                          "%s: line %llu (byte %llu) %s but lies inside the %llu committed bytes; the file was "
                          "changed outside spill — restore it or start a new job.",
                          path, (unsigned long long)line + 1, (unsigned long long)pos, why,
                          (unsigned long long)committed);
                goto out_unmap;
            }
            break;
        }
        long dup = idset_find(&j->done, id, idlen);
        if (dup >= 0) {
            util_errf(err, errlen,
                      "%s: line %llu (byte %llu): custom_id \"%.80s\" already has a line in this job; the output "
                      "files were changed outside spill — remove the duplicate line or start a new job.",
                      path, (unsigned long long)line + 1, (unsigned long long)pos, id);
            json_decref(o);
            goto out_unmap;
        }
        int added = idset_add(&j->done, id, idlen);
        json_decref(o);
        if (added != 0) {
            util_errf(err, errlen, "%s: out of memory at line %llu while rebuilding the done set.", path,
                      (unsigned long long)line + 1);
            goto out_unmap;
        }
        pos += len + 1;
        line++;
    }
    if (pos < size && j->io->ftruncate(f->fd, (off_t)pos) != 0) {
        j->broken = true;
        util_errf(err, errlen, "%s: ftruncate to byte %llu (cutting a torn tail) failed: %s; fix the disk and resume "
                  "again.", path, (unsigned long long)pos, strerror(errno));
        goto out_unmap;
    }
    if (j->io->fsync(f->fd) != 0) {
        j->broken = true;
        util_errf(err, errlen, "%s: fsync failed: %s; fix the disk and resume again.", path, strerror(errno));
        goto out_unmap;
    }
    f->size = f->committed = pos;
    f->rows = f->rows_committed = line;
    rc = 0;
out_unmap:
    if (map)
        munmap((void *)map, size);
    return rc;
}

int job_open_resume(const char *dir, const job_io *io, job **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[PATH_MAX];
    char *text = NULL;
    size_t tlen = 0;
    job *j = job_alloc(dir, io);
    if (!j)
        return util_errf(err, errlen, "out of memory opening job %s.", dir);
    if (file_path(path, j, MANIFEST_NAME, err, errlen) != 0)
        goto out_free_job;
    if (util_read_file(path, MANIFEST_CAP, &text, &tlen, err, errlen) != 0) {
        if (!util_is_file(path))
            util_errf(err, errlen, "%s: no manifest.json; this is not a spill job directory (or the job never "
                      "started) — start a new job.", dir);
        goto out_free_job;
    }
    json_error_t jerr;
    j->manifest = json_loadb(text, tlen, 0, &jerr);
    free(text);
    json_t *m = j->manifest;
    if (!json_is_object(m)) {
        util_errf(err, errlen, "%s: line %d: not a JSON object (%s); the manifest is damaged — start a new job.",
                  path, jerr.line, m ? "wrong type" : jerr.text);
        goto out_free_job;
    }
    json_t *ver = json_object_get(m, "spill_job"), *idv = json_object_get(m, "id");
    json_t *state = json_object_get(m, "state"), *input = json_object_get(m, "input");
    json_t *rows = json_object_get(m, "rows"), *com = json_object_get(m, "committed");
    uint64_t total = 0, cres = 0, cerr = 0, resumes = 0;
    const char *field = NULL;
    if (!json_is_integer(ver) || json_integer_value(ver) != JOB_MANIFEST_VERSION)
        field = "spill_job (format version 1)";
    else if (!json_is_string(idv) || json_string_length(idv) >= JOB_ID_MAX)
        field = "id";
    else if (!json_is_string(state))
        field = "state";
    else if (!json_is_object(input) || !json_is_string(json_object_get(input, "path")) ||
             !json_is_string(json_object_get(input, "sha256")))
        field = "input.path / input.sha256";
    else if (!json_is_object(rows) || get_u64(rows, "total", &total) != 0)
        field = "rows.total";
    else if (!json_is_object(com) || get_u64(com, "results_bytes", &cres) != 0 ||
             get_u64(com, "errors_bytes", &cerr) != 0)
        field = "committed.results_bytes / committed.errors_bytes";
    else if (get_u64(m, "resumes", &resumes) != 0)
        field = "resumes";
    if (field) {
        util_errf(err, errlen, "%s: field \"%s\" is missing or invalid; the manifest is damaged — start a new job.",
                  path, field);
        goto out_free_job;
    }
    snprintf(j->id, sizeof j->id, "%s", json_string_value(idv));
    j->rows_total = total;
    if (strcmp(json_string_value(state), "done") == 0) {
        util_errf(err, errlen, "job %s is already done; its output is in %s/results.jsonl and %s/errors.jsonl.",
                  j->id, dir, dir);
        goto out_free_job;
    }

    const char *in_path = json_string_value(json_object_get(input, "path"));
    char hex[65];
    uint64_t in_bytes;
    if (sha256_file(in_path, hex, &in_bytes, err, errlen) != 0)
        goto out_free_job;
    if (strcmp(hex, json_string_value(json_object_get(input, "sha256"))) != 0) {
        util_errf(err, errlen,
                  "%s: the input file changed since job %s started (SHA-256 differs); resuming would skip the wrong "
                  "rows — restore the original input or start a new job.",
                  in_path, j->id);
        goto out_free_job;
    }

    if (scan_file(j, F_RESULTS, cres, err, errlen) != 0 || scan_file(j, F_ERRORS, cerr, err, errlen) != 0)
        goto out_free_job;
    j->done.n_committed = j->done.n;
    if (json_object_set_new(m, "resumes", json_integer((json_int_t)(resumes + 1))) != 0) {
        util_errf(err, errlen, "out of memory resuming job %s.", dir);
        goto out_free_job;
    }
    if (commit_state(j, JOB_RUNNING, true, err, errlen) != 0)
        goto out_free_job;
    *out = j;
    return 0;

out_free_job:
    job_free(j);
    return -1;
}

/* ------------------------------------------------------------------ append */

bool job_is_done(const job *j, const char *custom_id)
{
    long k = idset_find(&j->done, custom_id, strlen(custom_id));
    return k >= 0 && (size_t)k < j->done.n_committed;
}

static int append(job *j, int k, const char *line, size_t len, char *err, size_t errlen)
{
    if (j->broken)
        return broken_err(j, err, errlen);
    if (memchr(line, '\n', len))
        return util_errf(err, errlen, "%s line for job %s contains a newline; output lines must be compact JSON.",
                         file_names[k], j->id);
    const char *id, *why;
    size_t idlen;
    json_t *o = parse_line(line, len, &id, &idlen, &why);
    if (!o)
        return util_errf(err, errlen, "%s line for job %s %s; nothing was written.", file_names[k], j->id, why);
    int rc = -1;
    if (idset_find(&j->done, id, idlen) >= 0) {
        util_errf(err, errlen, "custom_id \"%.80s\" already has a line in job %s; nothing was written.", id, j->id);
        goto out_decref;
    }
    size_t need;
    if (!ck_add_size(len, 1, &need))
        goto out_oom;
    if (need > j->bufcap) {
        size_t cap = need < 4096 ? 4096 : need;
        char *b = realloc(j->buf, cap);
        if (!b)
            goto out_oom;
        j->buf = b;
        j->bufcap = cap;
    }
    /* Add to the set first: if that fails nothing was written; if the write
     * fails the job is broken and the set no longer matters. */
    if (idset_add(&j->done, id, idlen) != 0)
        goto out_oom;
    memcpy(j->buf, line, len);
    j->buf[len] = '\n';
    if (io_write_all(j->io, j->f[k].fd, j->buf, need) != 0) {
        j->broken = true;
        util_errf(err, errlen,
                  "%s/%s: write of %zu bytes at byte %llu failed: %s; the job stops here — fix the disk, then run "
                  "`spill resume %s`.",
                  j->dir, file_names[k], need, (unsigned long long)j->f[k].size, strerror(errno), j->dir);
        goto out_decref;
    }
    j->f[k].size += need;
    j->f[k].rows++;
    rc = 0;
    goto out_decref;
out_oom:
    util_errf(err, errlen, "out of memory appending a line of %zu bytes to job %s; nothing was written.", len, j->id);
out_decref:
    json_decref(o);
    return rc;
}

int job_append_result(job *j, const char *line, size_t len, char *err, size_t errlen)
{
    return append(j, F_RESULTS, line, len, err, errlen);
}

int job_append_error(job *j, const char *line, size_t len, char *err, size_t errlen)
{
    return append(j, F_ERRORS, line, len, err, errlen);
}

/* ------------------------------------------------------------------ close */

int job_close(job *j, job_state final, char *err, size_t errlen)
{
    if (!j)
        return 0;
    int rc = 0;
    if (j->broken)
        rc = broken_err(j, err, errlen);
    else if (final != JOB_RUNNING) {
        uint64_t accounted = j->f[F_RESULTS].rows + j->f[F_ERRORS].rows;
        if (final == JOB_DONE && accounted != j->rows_total) {
            rc = commit_state(j, JOB_INTERRUPTED, true, err, errlen);
            if (rc == 0)
                rc = util_errf(err, errlen,
                               "job %s cannot be closed as done: %llu completed + %llu failed rows != %llu total; "
                               "it was recorded as interrupted — run `spill resume %s`.",
                               j->id, (unsigned long long)j->f[F_RESULTS].rows,
                               (unsigned long long)j->f[F_ERRORS].rows, (unsigned long long)j->rows_total, j->dir);
        } else
            rc = commit_state(j, final, true, err, errlen);
    }
    job_free(j);
    return rc;
}

const char *job_id(const job *j) { return j->id; }
const char *job_dir(const job *j) { return j->dir; }
uint64_t job_rows_total(const job *j) { return j->rows_total; }
uint64_t job_rows_completed(const job *j) { return j->f[F_RESULTS].rows_committed; }
uint64_t job_rows_failed(const job *j) { return j->f[F_ERRORS].rows_committed; }
bool job_is_broken(const job *j) { return j->broken; }
