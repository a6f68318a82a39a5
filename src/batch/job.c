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
 * One writer: the job holds flock(LOCK_EX) on its directory while open, so
 * `spill resume` on a job whose writer still runs is refused; the kernel
 * drops the lock when the writer dies.  job_create also fsyncs the parent
 * directory, so the job directory itself survives a power loss.
 *
 * Resume decisions:
 *  - The scan starts at byte 0, not at the committed offset: the done set
 *    needs every custom_id, and re-validating the committed prefix costs one
 *    line check per row (job_check_line: a grammar pass that allocates
 *    nothing; 0.25 s for 50,000 rows of 1.4 KB, 70 MB, at -O2) and catches
 *    a file edited or damaged outside spill.  The files are mapped read-only.
 *  - Kept: the longest prefix of lines that end in '\n' and are one JSON
 *    object with a string custom_id.  Complete lines past the committed
 *    offset are kept too (a writer killed between append and commit left
 *    them whole; they are fsynced and committed before resume returns), so
 *    their rows are not run twice.  Everything after the first bad line is
 *    cut with ftruncate — a torn tail, or zeros a power loss left after the
 *    last synced block.  Counting lines instead of parsing them would count a
 *    torn tail as done (NVIDIA nemotron PR #120).
 *  - A bad line or end of file inside the committed prefix, or a custom_id
 *    seen twice, is corruption, never repaired silently: the call fails naming
 *    the file, line and byte offset.
 *  - The manifest's counters are rebuilt from the scan; the input file must
 *    still hash to the recorded SHA-256 (a changed input would make "skip the
 *    done custom_ids" wrong); the manifest must read back byte-identical to
 *    what commit_state wrote (load_manifest says why).
 *
 * Both JSON writers use json_dumpb into a measured buffer, never json_dumps:
 * jansson 2.14's json_dumps silently drops an object key when its buffer
 * cannot grow (dump.c ignores dump_string's result for keys).
 */
#include "job.h"
#include "../base/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MANIFEST_NAME "manifest.json"
#define MANIFEST_TMP "manifest.json.tmp"
#define MANIFEST_CAP (64u << 20) /* options are small; anything bigger is not ours */

enum { F_RESULTS = 0, F_ERRORS = 1 };
static const char *const file_names[2] = {"results.jsonl", "errors.jsonl"};
static const char *const state_names[3] = {"running", "interrupted", "done"};

/* The done set: custom_ids in append order, found through an open-addressing
 * table.  ids[0, n_committed) are committed; the rest are pending. */
typedef struct idset {
    char **ids;   /* (n) owned copies, NUL-terminated */
    size_t *lens; /* (n) byte lengths (custom_id may not contain NUL, but lengths keep it exact) */
    size_t n, cap;
    size_t n_committed;
    uint32_t *slots; /* (nslots) index + 1, 0 = empty; nslots a power of two, load <= 1/2 */
    size_t nslots;
} idset;

typedef struct job_file {
    int fd;
    uint64_t size;      /* bytes appended so far (committed + pending) */
    uint64_t committed; /* bytes covered by the last commit */
    uint64_t rows;      /* lines appended so far */
    uint64_t rows_committed;
} job_file;

struct job {
    char *dir;
    char id[JOB_ID_MAX];
    const job_io *io;
    json_t *manifest; /* owned; the dynamic keys are refreshed on every commit */
    int lock_fd;      /* the job directory, flock(LOCK_EX) while this job object lives */
    job_file f[2];
    idset done;
    uint64_t rows_total;
    bool broken;
    bool made_dir;    /* job_create made the directory (job_discard removes it again) */
    char *buf; /* one line + '\n' on its way to write(2) */
    size_t bufcap;
    char *idbuf; /* a custom_id decoded from its escapes (job_check_line's scratch) */
    size_t idcap;
};

/* ---------------------------------------------------------------- syscalls */

static int real_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
}

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

/* ------------------------------------------------------------- line check */

/*
 * The rule every line of results.jsonl / errors.jsonl obeys, checked without
 * building a JSON tree: RFC 8259 grammar, UTF-8 that is well formed (no
 * overlongs, surrogates or code points past U+10FFFF), \u escapes that pair
 * up, no \u0000 in a key, nesting at most LINE_MAX_DEPTH deep, and a top-level
 * "custom_id" whose value is a string (the last one wins when the key repeats,
 * as in jansson).  Numbers are checked for grammar only.  Why not jansson:
 * the check runs once per line at every resume, allocates nothing, and under
 * memory pressure jansson 2.14's lexer drops bytes it cannot buffer (lex_save
 * ignores a failed append) — it can misread a custom_id or hit assert(0).
 */
#define LINE_MAX_DEPTH 256

static int hex4(const unsigned char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the well-formed UTF-8 sequence at p (non-ASCII lead), 0 if none. */
static size_t utf8_len(const unsigned char *p, const unsigned char *e)
{
    size_t n = *p >= 0xC0 && *p <= 0xDF ? 2 : *p >= 0xE0 && *p <= 0xEF ? 3 : *p >= 0xF0 && *p <= 0xF7 ? 4 : 0;
    return n && (size_t)(e - p) >= n && util_utf8_valid((const char *)p, n) ? n : 0;
}

/*
 * Scans the string token at *pp (which points at its opening quote) and
 * leaves *pp after the closing quote.  *esc tells whether it had escapes.
 */
static bool scan_string(const unsigned char **pp, const unsigned char *e, bool *esc)
{
    const unsigned char *p = *pp + 1;
    *esc = false;
    while (p < e) {
        unsigned c = *p;
        if (c == '"') {
            *pp = p + 1;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c < 0x80) {
            if (c == '\\') {
                *esc = true;
                if (++p == e)
                    return false;
                if (*p != 'u') {
                    if (!strchr("\"\\/bfnrt", *p) || !*p)
                        return false;
                    p++;
                    continue;
                }
                int cp = e - p >= 5 ? hex4(p + 1) : -1;
                p += 5;
                if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                    return false;
                if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate needs its low half */
                    int lo = e - p >= 6 && p[0] == '\\' && p[1] == 'u' ? hex4(p + 2) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return false;
                    p += 6;
                }
                continue;
            }
            p++;
            continue;
        }
        size_t n = utf8_len(p, e);
        if (!n)
            return false;
        p += n;
    }
    return false;
}

/* Decodes the body of a string token (quotes excluded, already validated) into out; returns its length. */
static size_t decode_string(const unsigned char *p, const unsigned char *e, char *out)
{
    size_t o = 0;
    while (p < e) {
        if (*p != '\\') {
            out[o++] = (char)*p++;
            continue;
        }
        p++;
        unsigned char c = *p++;
        if (c != 'u') {
            out[o++] = c == 'b'   ? '\b'
                       : c == 'f' ? '\f'
                       : c == 'n' ? '\n'
                       : c == 'r' ? '\r'
                       : c == 't' ? '\t'
                                  : (char)c;
            continue;
        }
        uint32_t cp = (uint32_t)hex4(p);
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)hex4(p + 2) - 0xDC00);
            p += 6;
        }
        if (cp < 0x80)
            out[o++] = (char)cp;
        else if (cp < 0x800) {
            out[o++] = (char)(0xC0 | cp >> 6);
            out[o++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[o++] = (char)(0xE0 | cp >> 12);
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[o++] = (char)(0xF0 | cp >> 18);
            out[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return o;
}

static bool scan_number(const unsigned char **pp, const unsigned char *e)
{
    const unsigned char *p = *pp;
#define DIGIT(q) ((q) < e && *(q) >= '0' && *(q) <= '9')
    if (p < e && *p == '-')
        p++;
    if (!DIGIT(p))
        return false;
    if (*p++ != '0')
        while (DIGIT(p))
            p++;
    if (p < e && *p == '.') {
        if (!DIGIT(p + 1))
            return false;
        for (p++; DIGIT(p); p++)
            ;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-'))
            p++;
        if (!DIGIT(p))
            return false;
        while (DIGIT(p))
            p++;
    }
#undef DIGIT
    *pp = p;
    return true;
}

static const unsigned char *skip_ws(const unsigned char *p, const unsigned char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

int job_check_line(const char *line, size_t len, const char **id, size_t *idlen, char **scratch, size_t *cap, char *err,
                   size_t errlen)
{
    const unsigned char *p = (const unsigned char *)line, *e = p + len;
    const unsigned char *id_start = NULL, *id_end = NULL; /* body of the custom_id string token */
    bool id_esc = false, id_is_string = false, value_is_id = false, esc;
    unsigned char stack[LINE_MAX_DEPTH]; /* '{' or '[' per open container */
    int depth = 0;
    enum { VALUE, KEY, AFTER } state = VALUE;
    p = skip_ws(p, e);
    if (p == e || *p != '{')
        return util_errf(err, errlen, "is not a JSON object");
    for (;;) {
        p = skip_ws(p, e);
        if (state == KEY) {
            const unsigned char *k = p;
            if (p == e || *p != '"' || !scan_string(&p, e, &esc))
                goto bad;
            value_is_id = false;
            if (depth == 1 && p - k - 2 <= 64) {
                char name[64];
                size_t n = esc ? decode_string(k + 1, p - 1, name) : (size_t)(p - k - 2);
                value_is_id = n == 9 && memcmp(esc ? name : (const char *)k + 1, "custom_id", 9) == 0;
            }
            p = skip_ws(p, e);
            if (p == e || *p++ != ':')
                goto bad;
            state = VALUE;
            continue;
        }
        if (state == AFTER) {
            if (depth == 0)
                break;
            if (p == e)
                goto bad;
            unsigned char close = stack[depth - 1] == '{' ? '}' : ']';
            if (*p == ',') {
                p++;
                state = stack[depth - 1] == '{' ? KEY : VALUE;
            } else if (*p == close) {
                p++;
                depth--;
            } else
                goto bad;
            continue;
        }
        /* VALUE */
        if (p == e)
            goto bad;
        bool is_id = value_is_id && depth == 1;
        value_is_id = false;
        if (is_id)
            id_is_string = false;
        state = AFTER;
        if (*p == '{' || *p == '[') {
            if (depth == LINE_MAX_DEPTH)
                return util_errf(err, errlen, "nests deeper than %d levels", LINE_MAX_DEPTH);
            stack[depth++] = *p;
            p = skip_ws(p + 1, e);
            if (p < e && *p == (stack[depth - 1] == '{' ? '}' : ']')) {
                p++;
                depth--;
            } else
                state = stack[depth - 1] == '{' ? KEY : VALUE;
        } else if (*p == '"') {
            const unsigned char *v = p;
            if (!scan_string(&p, e, &esc))
                goto bad;
            if (is_id) {
                id_start = v + 1;
                id_end = p - 1;
                id_esc = esc;
                id_is_string = true;
            }
        } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
            if (!scan_number(&p, e))
                goto bad;
        } else {
            size_t n = (size_t)(e - p);
            if (n >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0))
                p += 4;
            else if (n >= 5 && memcmp(p, "false", 5) == 0)
                p += 5;
            else
                goto bad;
        }
    }
    if (p != e)
        goto bad;
    if (!id_is_string)
        return util_errf(err, errlen, "has no string \"custom_id\"");
    *idlen = (size_t)(id_end - id_start);
    *id = (const char *)id_start;
    if (id_esc) {
        if (*idlen + 1 > *cap) {
            char *b = realloc(*scratch, *idlen + 1);
            if (!b)
                return util_errf(err, errlen, "out of memory decoding a custom_id of %zu bytes", *idlen);
            *scratch = b;
            *cap = *idlen + 1;
        }
        *idlen = decode_string(id_start, id_end, *scratch);
        *id = *scratch;
    }
    return 0;
bad:
    return util_errf(err, errlen, "is not valid JSON (at byte %zu of the line)",
                     (size_t)(p - (const unsigned char *)line));
}

/* ------------------------------------------------------------------ helpers */

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
                return util_errf(err, errlen, "%s: cannot create directory: %s; check the path and permissions.", buf,
                                 strerror(errno));
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
        goto out_free;
    }
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, 1u << 20);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            util_errf(err, errlen, "%s: read failed at byte %llu while hashing the input: %s.", path,
                      (unsigned long long)total, strerror(errno));
            goto out_free;
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
out_free:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

static int file_path(char *out, const job *j, const char *name, char *err, size_t errlen)
{
    if (util_pathf(out, PATH_MAX, "%s/%s", j->dir, name) != 0)
        return util_errf(err, errlen, "%s/%s: path longer than %d bytes; choose a shorter job directory.", j->dir, name,
                         PATH_MAX);
    return 0;
}

static int broken_err(const job *j, char *err, size_t errlen)
{
    return util_errf(
        err, errlen,
        "job %s is unusable after an earlier I/O (or out-of-memory) error; exit and run `spill resume %s`.", j->id,
        j->dir);
}

static void job_free(job *j)
{
    if (!j)
        return;
    if (j->lock_fd >= 0)
        close(j->lock_fd); /* releases the flock */
    for (int k = 0; k < 2; k++)
        if (j->f[k].fd >= 0)
            close(j->f[k].fd);
    json_decref(j->manifest);
    idset_free(&j->done);
    free(j->buf);
    free(j->idbuf);
    free(j->dir);
    free(j);
}

static job *job_alloc(const char *dir, const job_io *io)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->f[0].fd = j->f[1].fd = j->lock_fd = -1;
    j->io = io ? io : &real_io;
    j->dir = strdup(dir);
    if (!j->dir) {
        free(j);
        return NULL;
    }
    return j;
}

/*
 * Takes the job's one-writer lock: flock on the directory itself, released
 * by the kernel when the process dies (kill -9 included), so a stale lock
 * never blocks a resume.  Not a durability call: it bypasses the io table.
 */
static int job_lock(job *j, char *err, size_t errlen)
{
    j->lock_fd = open(j->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (j->lock_fd < 0)
        return util_errf(err, errlen, "%s: cannot open the job directory: %s.", j->dir, strerror(errno));
    if (flock(j->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return util_errf(err, errlen,
                         "%s: the job is in use by another spill process; wait for it to finish or stop it, then "
                         "resume.",
                         j->dir);
    return 0;
}

/* ------------------------------------------------------------------ commit */

static int set_u64(json_t *o, const char *key, uint64_t v)
{
    return json_object_set_new(o, key, json_integer((json_int_t)v));
}

/*
 * fsyncs the files appended to since the last commit (both when forced),
 * then rewrites the manifest with `state` (any state but running also stamps
 * ended_at).  On any I/O failure the job breaks.
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
    for (int k = 0; k < 2; k++) /* a file unchanged since the last commit was synced by it */
        if ((force || j->f[k].size != j->f[k].committed) && j->io->fsync(j->f[k].fd) != 0) {
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
    /* json_dumpb, not json_dumps: see the header comment. */
    const size_t flags = JSON_INDENT(1);
    size_t len = bad ? 0 : json_dumpb(m, NULL, 0, flags);
    char *text = len ? malloc(len + 1) : NULL;
    if (text && json_dumpb(m, text, len, flags) != len) {
        free(text);
        text = NULL;
    }
    if (!text) {
        j->broken = true; /* the manifest object may be half-updated */
        return util_errf(err, errlen, "%s: out of memory building the manifest; exit and run `spill resume %s`.", path,
                         j->dir);
    }
    text[len++] = '\n';
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

int job_commit(job *j, char *err, size_t errlen)
{
    return commit_state(j, JOB_RUNNING, false, err, errlen);
}

int job_commit_manifest(job *j, char *err, size_t errlen)
{
    return commit_state(j, JOB_RUNNING, true, err, errlen);
}

int job_set_info(job *j, const char *key, json_t *value, char *err, size_t errlen)
{
    static const char *const own[] = {"spill_job", "id", "command", "state", "input", "rows", "committed",
                                      "updated_at", "ended_at", "resumes", "started_at"};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        if (!strcmp(key, own[i])) {
            json_decref(value);
            return util_errf(err, errlen, "job_set_info: \"%s\" is the job store's own key.", key);
        }
    if (!value || json_object_set_new(j->manifest, key, value))
        return util_errf(err, errlen, "out of memory recording %s in the manifest of job %s.", key, j->id);
    return 0;
}

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

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* Best effort: leaves the directory as job_create found it (the job's files
 * removed, the directory too when job_create made it), so a retry is not
 * refused as "already holds files". */
static void remove_job_files(const char *dir, bool made_dir)
{
    char path[PATH_MAX];
    for (int k = 0; k < 2; k++)
        if (util_pathf(path, sizeof path, "%s/%s", dir, file_names[k]) == 0)
            unlink(path);
    if (util_pathf(path, sizeof path, "%s/%s", dir, MANIFEST_TMP) == 0)
        unlink(path);
    if (util_pathf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME) == 0)
        unlink(path);
    if (made_dir)
        rmdir(dir);
}

int job_create(const char *dir, const job_info *info, const job_io *io, job **out, char *err, size_t errlen)
{
    *out = NULL;
    char id[JOB_ID_MAX], dirbuf[PATH_MAX], path[PATH_MAX];
    if (job_new_id(id, sizeof id, err, errlen) != 0)
        return -1;
    if (dir) { /* one id: the job directory's name is the run id everywhere */
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/')
            tmp[--n] = 0;
        const char *base = strrchr(tmp, '/') ? strrchr(tmp, '/') + 1 : tmp;
        if (*base && strlen(base) < JOB_ID_MAX && strcmp(base, ".") && strcmp(base, ".."))
            memcpy(id, base, strlen(base) + 1); /* fits: checked above */
    }
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
    if (job_lock(j, err, errlen) != 0)
        goto out_free_job;
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
    /* The job directory's own entry is durable only once its parent is synced. */
    if (util_pathf(path, sizeof path, "%s/..", dir) != 0 || io_fsync_dir(j->io, path) != 0) {
        util_errf(err, errlen, "%s: fsync of the parent directory failed: %s; check the disk and start again.", dir,
                  strerror(errno));
        goto out_free_job;
    }
    free(in_abs);
    j->made_dir = !existed;
    *out = j;
    return 0;

out_free_job:
    job_free(j);
out_remove:
    remove_job_files(dir, !existed);
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
        return util_errf(err, errlen,
                         "%s: cannot open: %s; the job directory is incomplete — restore the file or "
                         "start a new job.",
                         path, strerror(errno));
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
        char why[128] = "is torn (no final newline)";
        uint64_t len = nl ? (uint64_t)(nl - (map + pos)) : size - pos;
        const char *id = NULL;
        size_t idlen = 0;
        if (!nl || job_check_line(map + pos, len, &id, &idlen, &j->idbuf, &j->idcap, why, sizeof why) != 0) {
            if (strstr(why, "out of memory")) {
                util_errf(err, errlen, "%s: %s at line %llu while rebuilding the done set.", path, why,
                          (unsigned long long)line + 1);
                goto out_unmap;
            }
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
        if (idset_find(&j->done, id, idlen) >= 0) {
            util_errf(err, errlen,
                      "%s: line %llu (byte %llu): custom_id \"%.*s\" already has a line in this job; the output "
                      "files were changed outside spill — remove the duplicate line or start a new job.",
                      path, (unsigned long long)line + 1, (unsigned long long)pos, (int)(idlen < 80 ? idlen : 80), id);
            goto out_unmap;
        }
        if (idset_add(&j->done, id, idlen) != 0) {
            util_errf(err, errlen, "%s: out of memory at line %llu while rebuilding the done set.", path,
                      (unsigned long long)line + 1);
            goto out_unmap;
        }
        pos += len + 1;
        line++;
    }
    if (pos < size && j->io->ftruncate(f->fd, (off_t)pos) != 0) {
        j->broken = true;
        util_errf(err, errlen,
                  "%s: ftruncate to byte %llu (cutting a torn tail) failed: %s; fix the disk and resume "
                  "again.",
                  path, (unsigned long long)pos, strerror(errno));
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

/*
 * Parses manifest.json into j->manifest and checks that it reads back
 * exactly: dumped again the way commit_state wrote it, it must give the same
 * bytes.  This catches what a parse alone misses — jansson 2.14's lexer drops
 * bytes it cannot buffer when memory runs out and may then return a
 * plausible object with a shortened path or number — and a manifest edited
 * by hand, which spill does not support.
 */
static int load_manifest(job *j, const char *path, const char *text, size_t tlen, char *err, size_t errlen)
{
    json_error_t jerr;
    j->manifest = json_loadb(text, tlen, 0, &jerr);
    if (!j->manifest && !jerr.text[0])
        return util_errf(err, errlen, "%s: out of memory reading the manifest; free memory and resume again.", path);
    if (!json_is_object(j->manifest))
        return util_errf(err, errlen,
                         "%s: line %d: %s; the manifest is damaged (or memory ran out while reading it) — start a "
                         "new job.",
                         path, jerr.line, j->manifest ? "not a JSON object" : jerr.text);
    size_t n = json_dumpb(j->manifest, NULL, 0, JSON_INDENT(1));
    char *again = n ? malloc(n) : NULL;
    if (!again || json_dumpb(j->manifest, again, n, JSON_INDENT(1)) != n) {
        free(again);
        return util_errf(err, errlen, "%s: out of memory checking the manifest; free memory and resume again.", path);
    }
    bool same = tlen == n + 1 && memcmp(again, text, n) == 0 && text[n] == '\n';
    free(again);
    if (!same)
        return util_errf(err, errlen,
                         "%s: does not read back exactly as spill wrote it (edited by hand, or memory ran out while "
                         "reading it); restore it, or start a new job.",
                         path);
    return 0;
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
    if (!util_is_dir(dir)) {
        util_errf(err, errlen, "%s: no such job directory; check the path (jobs live in $SPILL_HOME/jobs/).", dir);
        goto out_free_job;
    }
    if (file_path(path, j, MANIFEST_NAME, err, errlen) != 0 || job_lock(j, err, errlen) != 0)
        goto out_free_job;
    if (util_read_file(path, MANIFEST_CAP, &text, &tlen, err, errlen) != 0) {
        if (!util_is_file(path))
            util_errf(err, errlen,
                      "%s: no manifest.json; this is not a spill job directory (or the job never "
                      "started) — start a new job.",
                      dir);
        goto out_free_job;
    }
    int lrc = load_manifest(j, path, text, tlen, err, errlen);
    free(text);
    if (lrc != 0)
        goto out_free_job;
    json_t *m = j->manifest;
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
        util_errf(err, errlen, "job %s is already done; its output is in %s/results.jsonl and %s/errors.jsonl.", j->id,
                  dir, dir);
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
    if (memchr(line, '\n', len)) {
        util_errf(err, errlen, "%s line for job %s contains a newline; output lines must be compact JSON.",
                  file_names[k], j->id);
        return JOB_LINE_REFUSED;
    }
    const char *id;
    size_t idlen;
    char why[128];
    if (job_check_line(line, len, &id, &idlen, &j->idbuf, &j->idcap, why, sizeof why) != 0) {
        util_errf(err, errlen, "%s line for job %s %s; nothing was written.", file_names[k], j->id, why);
        return JOB_LINE_REFUSED;
    }
    if (idset_find(&j->done, id, idlen) >= 0) {
        util_errf(err, errlen, "custom_id \"%.*s\" already has a line in job %s; nothing was written.",
                  (int)(idlen < 80 ? idlen : 80), id, j->id);
        return JOB_LINE_REFUSED;
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
        return util_errf(err, errlen,
                         "%s/%s: write of %zu bytes at byte %llu failed: %s; the job stops here — fix the disk, then "
                         "run `spill resume %s`.",
                         j->dir, file_names[k], need, (unsigned long long)j->f[k].size, strerror(errno), j->dir);
    }
    j->f[k].size += need;
    j->f[k].rows++;
    return 0;
out_oom:
    return util_errf(err, errlen, "out of memory appending a line of %zu bytes to job %s; nothing was written.", len,
                     j->id);
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
                               j->id, (unsigned long long)j->f[F_RESULTS].rows, (unsigned long long)j->f[F_ERRORS].rows,
                               (unsigned long long)j->rows_total, j->dir);
        } else
            rc = commit_state(j, final, true, err, errlen);
    }
    job_free(j);
    return rc;
}

int job_read_stored(const char *dir, job_stored *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    char path[PATH_MAX];
    if (util_pathf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME) != 0)
        return util_errf(err, errlen, "%s: the job directory's path is too long.", dir);
    json_error_t je;
    json_t *man = json_load_file(path, 0, &je);
    if (!man)
        return util_errf(err, errlen, "%s: cannot read the job manifest (%s); is this a job directory?", path,
                         je.text);
    json_t *model = json_object_get(man, "model"), *opt = json_object_get(man, "options");
    const char *id = json_string_value(json_object_get(model, "id"));
    const char *fp = json_string_value(json_object_get(model, "fingerprint"));
    const char *in = json_string_value(json_object_get(json_object_get(man, "input"), "path"));
    int rc = 0;
    const char *state = json_string_value(json_object_get(man, "state"));
    st->done = state && !strcmp(state, "done");
    json_t *rows = json_object_get(man, "rows");
    st->rows_completed = (uint64_t)json_integer_value(json_object_get(rows, "completed"));
    st->rows_failed = (uint64_t)json_integer_value(json_object_get(rows, "failed"));
    if (!id || !in)
        rc = -2, util_errf(err, errlen, "%s: the manifest lacks model.id or input.path; it was not written by spill run.",
                           path);
    else {
        st->model_id = strdup(id);
        st->input_path = strdup(in);
        st->model_fingerprint = fp ? strdup(fp) : NULL;
        st->options = json_is_object(opt) ? json_deep_copy(opt) : json_object();
        if (!st->model_id || !st->input_path || (fp && !st->model_fingerprint) || !st->options) {
            job_stored_free(st);
            rc = util_errf(err, errlen, "%s: out of memory reading the manifest; free memory and resume again.", path);
        }
    }
    json_decref(man);
    return rc;
}

void job_stored_free(job_stored *st)
{
    free(st->input_path);
    free(st->model_id);
    free(st->model_fingerprint);
    json_decref(st->options);
    memset(st, 0, sizeof *st);
}

void job_discard(job *j)
{
    if (!j)
        return;
    char *dir = strdup(j->dir);
    bool made = j->made_dir;
    job_free(j); /* closes the files and drops the lock first */
    if (dir)
        remove_job_files(dir, made);
    free(dir);
}

const char *job_id(const job *j)
{
    return j->id;
}
const json_t *job_manifest(const job *j)
{
    return j->manifest;
}
const char *job_dir(const job *j)
{
    return j->dir;
}
uint64_t job_rows_total(const job *j)
{
    return j->rows_total;
}
uint64_t job_rows_completed(const job *j)
{
    return j->f[F_RESULTS].rows_committed;
}
uint64_t job_rows_failed(const job *j)
{
    return j->f[F_ERRORS].rows_committed;
}
bool job_is_broken(const job *j)
{
    return j->broken;
}
