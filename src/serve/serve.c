/*
 * serve.c — `spill serve`: the OpenAI Files + Batches API on libmicrohttpd, over the same job store as
 * `spill run`, so the official `openai` client works by changing base_url.
 *
 * Store ($SPILL_HOME/serve/):
 *     files/<file-id>/meta.json   {"object": <File object>, "seq": N}   (atomic: tmp + fsync + rename + fsync dir)
 *     files/<file-id>/data        the bytes (uploads streamed here; output files are hard links to a job's lines)
 *     batches/<batch_id>.json     {"object": <Batch object>, "seq": N, "model": M}
 *     batches/<batch_id>.job/     the batch's job directory: a `spill run ... -o` job (job.c), so a batch IS a run
 *
 * The worker: one thread takes batches FIFO (by seq).  validating: spill check's library pass (check_file with
 * the batch's endpoint) — its first sentence and line go into `errors`, status failed.  in_progress: the job runs
 * in a resident child, `spill worker MODEL` (run_worker.c), started with PR_SET_PDEATHSIG so a kill -9 of the
 * server takes it with it and the next start resumes the job exactly (the job store's own guarantee).  The
 * thread writes it one line per batch on a pipe (run DATA JOBDIR CSV LOG, or resume JOBDIR CSV LOG when the
 * directory already holds a job) and reads back the job's exit code.  Decisions (issue 17): a child, not an
 * in-process runner, so an engine fault never takes the HTTP side down; one worker at a time, for one model —
 * it keeps the opened model (weights, tokenizer, template) between batches for that model, and a batch for
 * another model ends it (pipe closed) and starts one for the new model; the backend is opened per job.  A worker
 * that dies mid-job (crash, kill -9) is replaced and the batch resumed once more; a second death fails the batch
 * with its log path.  request_counts follow the job manifest's committed counts while it runs; the job writes
 * its passes to the job's passes.csv (--pass-log) for GET /v1/batches/{id}/progress, the status page's view of
 * the running job (progress.c).  Expiry: completion_window is OpenAI's "24h" or N s|m|h (spill's, up to 7 days);
 * a batch still queued or running at expires_at is stopped like a cancel and becomes `expired` (expire_batch).
 * Cancel sends the worker SIGINT: the job checkpoints and answers 75, the rows answered stay in the output file,
 * and the worker takes the next batch.  Server stop: SIGINT (the job checkpoints), then the worker is killed.
 *
 * Safety: bearer keys (constant-time compare; the keys file must not be world-readable); 401/404/413 as
 * OpenAI's error body; 413 from Content-Length before the body is read, and by counting otherwise; uploads
 * streamed to disk through libmicrohttpd's post processor (multipart/form-data, chunks of at most 16 KiB, never
 * the whole file in memory); ids made here and checked by serve_id_valid before any path is built; connection
 * timeout, per-connection memory limit, connection limit; 127.0.0.1 by default; TLS with --tls-cert/--tls-key.
 */
#include "serve.h"

/* Every path here is the store directory (checked shorter than 4096 at start) plus a checked id: a cut path
 * could only name nothing, never another file, so GCC's truncation guesses are noise in this file. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/sha.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../base/exit.h"
#include "../base/util.h"
#include "../batch/check.h"
#include "../batch/job.h"
#include "progress.h"

#define ID_CHARS 24
#define BODY_MAX (64 * 1024) /* a JSON request body (POST /v1/batches) */
#define MAX_KEYS 64
#define MAX_MODELS 16

typedef struct server {
    char home[4096], files_dir[4200], batches_dir[4200], self_exe[4096];
    char *keys[MAX_KEYS];
    int n_keys;
    const char *models[MAX_MODELS];
    int n_models;
    unsigned long long max_upload;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    json_t *files;   /* id -> meta {"object", "seq"} */
    json_t *batches; /* id -> meta {"object", "seq", "model"} */
    long long seq;
    volatile sig_atomic_t stop;
    /* the resident worker (the opening comment): its pid (0 none), command pipe, answer pipe, and its model */
    pid_t wk_pid;
    int wk_cmd, wk_ans;
    char wk_model[4096];
} server;

static server S;
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

/* ---- small pieces: ids, keys, sizes ---- */

bool serve_id_valid(const char *s, const char *prefix)
{
    if (!s || !prefix)
        return false;
    size_t p = strlen(prefix);
    if (strncmp(s, prefix, p))
        return false;
    for (size_t i = 0; i < ID_CHARS; i++) {
        char c = s[p + i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return false;
    }
    return s[p + ID_CHARS] == '\0';
}

bool serve_key_equal(const char *a, const char *b)
{
    unsigned char ha[SHA256_DIGEST_LENGTH], hb[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)a, strlen(a), ha);
    SHA256((const unsigned char *)b, strlen(b), hb);
    volatile unsigned char d = 0;
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        d |= ha[i] ^ hb[i];
    return d == 0;
}

int serve_parse_size(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10), m = 1;
    if (errno || end == s)
        return -1;
    if (*end == 'K' || *end == 'k')
        m = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        m = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        m = 1ull << 30, end++;
    if (*end || v == 0 || v > (~0ull) / m)
        return -1;
    *out = v * m;
    return 0;
}

static int new_id(const char *prefix, char *out, size_t cap)
{
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char r[ID_CHARS];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return -1;
    size_t p = strlen(prefix);
    if (cap < p + ID_CHARS + 1)
        return -1;
    memcpy(out, prefix, p);
    for (int i = 0; i < ID_CHARS; i++)
        out[p + i] = al[r[i] % 62]; /* 256 % 62 bias: ids need uniqueness, not uniformity */
    out[p + ID_CHARS] = '\0';
    return 0;
}

/* Reads the keys file: one key a line, '#' comments and blank lines skipped.  Refuses a file others can read. */
static int load_keys(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st))
        return util_errf(err, errlen, "cannot read the keys file %s: %s.", path, strerror(errno));
    if (st.st_mode & (S_IROTH | S_IWOTH))
        return util_errf(err, errlen, "the keys file %s is readable by every user; make it private (chmod 600 %s).",
                         path, path);
    FILE *f = fopen(path, "r");
    if (!f)
        return util_errf(err, errlen, "cannot open the keys file %s: %s.", path, strerror(errno));
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\r\n");
        line[n] = '\0';
        char *k = line;
        while (*k == ' ' || *k == '\t')
            k++;
        if (!*k || *k == '#')
            continue;
        if (S.n_keys == MAX_KEYS) {
            fclose(f);
            return util_errf(err, errlen, "the keys file %s holds more than %d keys.", path, MAX_KEYS);
        }
        S.keys[S.n_keys++] = strdup(k);
    }
    fclose(f);
    if (!S.n_keys)
        return util_errf(err, errlen, "the keys file %s holds no key (one key a line).", path);
    return 0;
}

/* ---- the store ---- */

static int mkdir_p(const char *p)
{
    char b[4200];
    snprintf(b, sizeof b, "%s", p);
    for (char *s = b + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(b, 0700) && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(b, 0700) && errno != EEXIST ? -1 : 0;
}

static int save_meta(const char *path, json_t *meta)
{
    char *s = json_dumps(meta, JSON_COMPACT);
    char err[SPILL_ERRLEN];
    int rc = s ? util_write_atomic(path, s, strlen(s), err, sizeof err) : -1;
    if (rc)
        fprintf(stderr, "spill serve: %s\n", s ? err : "out of memory.");
    free(s);
    return rc;
}

static int save_batch(const char *id)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s.json", S.batches_dir, id);
    return save_meta(p, json_object_get(S.batches, id));
}

static void load_store(void)
{
    DIR *d = opendir(S.files_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!serve_id_valid(e->d_name, "file-"))
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s/meta.json", S.files_dir, e->d_name);
        json_t *m = json_load_file(p, 0, NULL);
        if (m)
            json_object_set_new(S.files, e->d_name, m);
        else { /* an upload the server died in: its bytes never became a file */
            snprintf(p, sizeof p, "%s/%s/data.partial", S.files_dir, e->d_name);
            unlink(p);
            snprintf(p, sizeof p, "%s/%s", S.files_dir, e->d_name);
            rmdir(p);
        }
    }
    if (d)
        closedir(d);
    d = opendir(S.batches_dir);
    while (d && (e = readdir(d))) {
        char id[64];
        size_t n = strlen(e->d_name);
        if (n < 6 || n >= sizeof id || strcmp(e->d_name + n - 5, ".json"))
            continue;
        memcpy(id, e->d_name, n - 5);
        id[n - 5] = '\0';
        if (!serve_id_valid(id, "batch_"))
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", S.batches_dir, e->d_name);
        json_t *m = json_load_file(p, 0, NULL);
        if (m)
            json_object_set_new(S.batches, id, m);
    }
    if (d)
        closedir(d);
    const char *k;
    json_t *v;
    json_object_foreach(S.files, k, v) if (json_integer_value(json_object_get(v, "seq")) > S.seq) S.seq =
        json_integer_value(json_object_get(v, "seq"));
    json_object_foreach(S.batches, k, v) if (json_integer_value(json_object_get(v, "seq")) > S.seq) S.seq =
        json_integer_value(json_object_get(v, "seq"));
}

/* Registers a file object for bytes already at files/<id>/data.  Caller holds the lock. */
static json_t *file_register(const char *id, const char *filename, const char *purpose, long long bytes)
{
    json_t *o = json_pack("{s:s,s:s,s:I,s:I,s:s,s:s,s:s,s:n}", "id", id, "object", "file", "bytes", (json_int_t)bytes,
                          "created_at", (json_int_t)time(NULL), "filename", filename, "purpose", purpose, "status",
                          "processed", "status_details");
    json_t *m = json_pack("{s:o,s:I}", "object", o, "seq", (json_int_t)++S.seq);
    char p[4400];
    snprintf(p, sizeof p, "%s/%s/meta.json", S.files_dir, id);
    if (save_meta(p, m)) {
        json_decref(m);
        return NULL;
    }
    json_object_set_new(S.files, id, m);
    return o;
}

/* ---- HTTP replies ---- */

enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned status, const char *type, char *body)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return serve_reply(c, status, "application/json", s ? s : strdup("{}"));
}

static enum MHD_Result reply_err(struct MHD_Connection *c, unsigned status, const char *type, const char *code,
                                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_err(struct MHD_Connection *c, unsigned status, const char *type, const char *code,
                                 const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply_json(c, status,
                      json_pack("{s:{s:s,s:s,s:n,s:s?}}", "error", "message", msg, "type", type, "param", "code", code));
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* ---- per-request state ---- */

typedef struct req {
    int kind; /* 0 plain, 1 upload, 2 json body */
    unsigned long long seen;
    bool refused; /* a reply is queued; ignore the rest of the body */
    /* upload */
    struct MHD_PostProcessor *pp;
    int fd;
    char id[40], filename[256], purpose[32], partial[4400];
    bool bad_part, got_file;
    /* json body */
    char *body;
    size_t blen;
} req;

static enum MHD_Result post_iter(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                 const char *ctype, const char *enc, const char *data, uint64_t off, size_t size)
{
    req *q = cls;
    if (!strcmp(key, "file")) {
        if (q->fd < 0) {
            q->bad_part = true;
            return MHD_NO;
        }
        q->got_file = true;
        if (filename && !q->filename[0])
            snprintf(q->filename, sizeof q->filename, "%s", filename);
        for (size_t done = 0; done < size;) {
            ssize_t w = write(q->fd, data + done, size - done);
            if (w <= 0) {
                q->bad_part = true;
                return MHD_NO;
            }
            done += (size_t)w;
        }
    } else if (!strcmp(key, "purpose")) {
        size_t have = strlen(q->purpose);
        if (off + size >= sizeof q->purpose || have + size >= sizeof q->purpose) {
            q->bad_part = true;
            return MHD_NO;
        }
        memcpy(q->purpose + have, data, size);
        q->purpose[have + size] = '\0';
    }
    return MHD_YES; /* other fields (expires_after[...]) are read and ignored */
}

static void req_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    req *q = *con_cls;
    if (!q)
        return;
    if (q->pp)
        MHD_destroy_post_processor(q->pp);
    if (q->fd >= 0) {
        close(q->fd);
        unlink(q->partial);
        char dir[4400];
        snprintf(dir, sizeof dir, "%s/%s", S.files_dir, q->id);
        rmdir(dir);
    }
    free(q->body);
    free(q);
    *con_cls = NULL;
}

/* ---- routes ---- */

static bool authorized(struct MHD_Connection *c)
{
    if (!S.n_keys)
        return true; /* no --keys: loopback only (serve_main refuses another host) */
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    bool ok = false;
    for (int i = 0; i < S.n_keys; i++)
        ok |= serve_key_equal(h + 7, S.keys[i]); /* every key compared: the time does not say which matched */
    return ok;
}

static int by_seq_desc(const void *a, const void *b)
{
    long long x = json_integer_value(json_object_get(*(json_t *const *)a, "seq"));
    long long y = json_integer_value(json_object_get(*(json_t *const *)b, "seq"));
    return x < y ? 1 : x > y ? -1 : 0;
}

/* A list page of `table` (newest first), after the id `after`, at most `limit` objects; purpose filters files. */
static json_t *list_page(json_t *table, const char *after, long limit, const char *purpose)
{
    size_t n = json_object_size(table), k = 0;
    json_t **v = calloc(n ? n : 1, sizeof *v);
    const char *key;
    json_t *m;
    json_object_foreach(table, key, m) v[k++] = m;
    qsort(v, k, sizeof *v, by_seq_desc);
    size_t start = 0;
    if (after && *after) {
        start = k; /* an unknown cursor: an empty page */
        for (size_t i = 0; i < k; i++)
            if (!strcmp(json_string_value(json_object_get(json_object_get(v[i], "object"), "id")), after))
                start = i + 1;
    }
    json_t *data = json_array();
    bool more = false;
    for (size_t i = start; i < k; i++) {
        json_t *o = json_object_get(v[i], "object");
        if (purpose && *purpose && strcmp(json_string_value(json_object_get(o, "purpose")), purpose))
            continue;
        if ((long)json_array_size(data) == limit) {
            more = true;
            break;
        }
        json_array_append(data, o);
    }
    free(v);
    size_t dn = json_array_size(data);
    json_t *first = dn ? json_object_get(json_array_get(data, 0), "id") : NULL;
    json_t *last = dn ? json_object_get(json_array_get(data, dn - 1), "id") : NULL;
    return json_pack("{s:s,s:o,s:O?,s:O?,s:b}", "object", "list", "data", data, "first_id", first, "last_id", last,
                     "has_more", more);
}

static long arg_limit(struct MHD_Connection *c, long def, long max)
{
    const char *s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    if (!s)
        return def;
    char *end;
    long v = strtol(s, &end, 10);
    return (*end || v < 1 || v > max) ? -1 : v;
}

static enum MHD_Result upload_finish(struct MHD_Connection *c, req *q)
{
    if (q->bad_part || !q->got_file)
        return reply_err(c, 400, "invalid_request_error", "invalid_multipart",
                         "The request is not a multipart/form-data upload with a 'file' part.");
    if (strcmp(q->purpose, "batch"))
        return reply_err(c, 400, "invalid_request_error", "invalid_purpose",
                         "purpose must be 'batch' (the only purpose this server stores).");
    struct stat st;
    char final[4400];
    snprintf(final, sizeof final, "%s/%s/data", S.files_dir, q->id);
    if (fsync(q->fd) || fstat(q->fd, &st) || rename(q->partial, final))
        return reply_err(c, 500, "server_error", NULL, "The upload could not be stored: %s.", strerror(errno));
    close(q->fd);
    q->fd = -1;
    pthread_mutex_lock(&S.mu);
    json_t *o = file_register(q->id, q->filename[0] ? q->filename : "upload.jsonl", "batch", (long long)st.st_size);
    json_t *copy = o ? json_deep_copy(o) : NULL;
    pthread_mutex_unlock(&S.mu);
    if (!copy)
        return reply_err(c, 500, "server_error", NULL, "The file's record could not be written.");
    return reply_json(c, 200, copy);
}

/* A completion window in seconds: OpenAI's "24h", or (spill's own, for short-lived batches and tests) N followed
 * by s, m or h, at most 7 days.  -1 for anything else. */
static long window_seconds(const char *w)
{
    if (!w || !*w)
        return -1;
    char *end;
    errno = 0;
    long n = strtol(w, &end, 10);
    if (errno || n <= 0 || end == w || end[0] == '\0' || end[1] != '\0' || w[0] == '+' || w[0] == ' ')
        return -1;
    long mul = end[0] == 's' ? 1 : end[0] == 'm' ? 60 : end[0] == 'h' ? 3600 : 0;
    if (!mul || n > 7L * 86400 / mul)
        return -1;
    return n * mul;
}

static enum MHD_Result batch_create(struct MHD_Connection *c, req *q)
{
    json_error_t je;
    json_t *b = json_loadb(q->body ? q->body : "", q->blen, 0, &je);
    if (!json_is_object(b)) {
        json_decref(b);
        return reply_err(c, 400, "invalid_request_error", "invalid_json", "The body is not a JSON object.");
    }
    const char *fid = json_string_value(json_object_get(b, "input_file_id"));
    const char *ep = json_string_value(json_object_get(b, "endpoint"));
    const char *win = json_string_value(json_object_get(b, "completion_window"));
    json_t *meta = json_object_get(b, "metadata");
    enum MHD_Result rc;
    if (!ep || (strcmp(ep, "/v1/chat/completions") && strcmp(ep, "/v1/completions") && strcmp(ep, "/v1/embeddings")))
        rc = reply_err(c, 400, "invalid_request_error", "invalid_endpoint",
                       "endpoint must be /v1/chat/completions, /v1/completions or /v1/embeddings.");
    else if (window_seconds(win) < 0)
        rc = reply_err(c, 400, "invalid_request_error", "invalid_completion_window",
                       "completion_window must be '24h' (or, on spill, N followed by s, m or h, up to 7 days).");
    else if (meta && !json_is_null(meta) && (!json_is_object(meta) || json_object_size(meta) > 16))
        rc = reply_err(c, 400, "invalid_request_error", "invalid_metadata",
                       "metadata must be an object of at most 16 string pairs.");
    else {
        pthread_mutex_lock(&S.mu);
        json_t *fm = serve_id_valid(fid, "file-") ? json_object_get(S.files, fid) : NULL;
        char id[40];
        if (!fm) {
            pthread_mutex_unlock(&S.mu);
            rc = reply_err(c, 404, "invalid_request_error", "file_not_found", "No file with that input_file_id.");
        } else if (new_id("batch_", id, sizeof id)) {
            pthread_mutex_unlock(&S.mu);
            rc = reply_err(c, 500, "server_error", NULL, "The kernel gave no random bytes for an id.");
        } else {
            json_int_t now = time(NULL);
            json_t *o = json_pack(
                "{s:s,s:s,s:s,s:n,s:s,s:s,s:s,s:n,s:n,s:I,s:n,s:I,s:n,s:n,s:n,s:n,s:n,s:n,s:{s:i,s:i,s:i},s:O}", "id",
                id, "object", "batch", "endpoint", ep, "errors", "input_file_id", fid, "completion_window", win,
                "status", "validating", "output_file_id", "error_file_id", "created_at", now, "in_progress_at",
                "expires_at", now + (json_int_t)window_seconds(win), "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
                "cancelled_at", "request_counts", "total", 0, "completed", 0, "failed", 0, "metadata",
                meta ? meta : json_null());
            json_object_set_new(S.batches, id, json_pack("{s:o,s:I}", "object", o, "seq", (json_int_t)++S.seq));
            if (save_batch(id)) {
                json_object_del(S.batches, id);
                pthread_mutex_unlock(&S.mu);
                rc = reply_err(c, 500, "server_error", NULL, "The batch's record could not be written.");
            } else {
                json_t *copy = json_deep_copy(o);
                pthread_cond_signal(&S.cv);
                pthread_mutex_unlock(&S.mu);
                rc = reply_json(c, 200, copy);
            }
        }
    }
    json_decref(b);
    return rc;
}

extern const char serve_status_page[];

/* The router: every path and method of the API; ids checked by serve_id_valid before any lookup. */
static enum MHD_Result route(struct MHD_Connection *c, const char *url, const char *method, req *q)
{
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    if (get && !strcmp(url, "/health"))
        return serve_reply(c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    if (get && !strcmp(url, "/"))
        return serve_reply(c, 200, "text/html; charset=utf-8", strdup(serve_status_page));
    if (!authorized(c))
        return reply_err(c, 401, "invalid_request_error", "invalid_api_key",
                         "A valid API key is needed: send it as 'Authorization: Bearer KEY'.");
    if (get && !strcmp(url, "/v1/models")) {
        json_t *d = json_array();
        for (int i = 0; i < S.n_models; i++)
            json_array_append_new(d, json_pack("{s:s,s:s,s:i,s:s}", "id", S.models[i], "object", "model", "created",
                                               0, "owned_by", "spill"));
        return reply_json(c, 200, json_pack("{s:s,s:o}", "object", "list", "data", d));
    }
    if (!strncmp(url, "/v1/files", 9)) {
        const char *rest = url + 9;
        if (!*rest && post)
            return upload_finish(c, q);
        if (!*rest && get) {
            long lim = arg_limit(c, 10000, 10000);
            if (lim < 0)
                return reply_err(c, 400, "invalid_request_error", "invalid_limit", "limit must be 1 to 10000.");
            pthread_mutex_lock(&S.mu);
            json_t *p = list_page(S.files, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"), lim,
                                  MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "purpose"));
            json_t *copy = json_deep_copy(p);
            json_decref(p);
            pthread_mutex_unlock(&S.mu);
            return reply_json(c, 200, copy);
        }
        char id[64];
        const char *sub = "";
        if (*rest == '/') {
            const char *slash = strchr(rest + 1, '/');
            size_t n = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
            if (n < sizeof id) {
                memcpy(id, rest + 1, n);
                id[n] = '\0';
                sub = slash ? slash : "";
                if (serve_id_valid(id, "file-") && (!*sub || !strcmp(sub, "/content"))) {
                    pthread_mutex_lock(&S.mu);
                    json_t *m = json_object_get(S.files, id);
                    json_t *o = m ? json_deep_copy(json_object_get(m, "object")) : NULL;
                    if (m && del) {
                        char p[4400];
                        snprintf(p, sizeof p, "%s/%s/data", S.files_dir, id);
                        unlink(p);
                        snprintf(p, sizeof p, "%s/%s/meta.json", S.files_dir, id);
                        unlink(p);
                        snprintf(p, sizeof p, "%s/%s", S.files_dir, id);
                        rmdir(p);
                        json_object_del(S.files, id);
                    }
                    pthread_mutex_unlock(&S.mu);
                    if (o && get && !*sub)
                        return reply_json(c, 200, o);
                    if (o && del && !*sub) {
                        json_decref(o);
                        return reply_json(c, 200, json_pack("{s:s,s:s,s:b}", "id", id, "object", "file", "deleted", 1));
                    }
                    if (o && get) {
                        json_decref(o);
                        char p[4400];
                        snprintf(p, sizeof p, "%s/%s/data", S.files_dir, id);
                        int fd = open(p, O_RDONLY | O_CLOEXEC);
                        struct stat st;
                        if (fd < 0 || fstat(fd, &st)) {
                            if (fd >= 0)
                                close(fd);
                            return reply_err(c, 500, "server_error", NULL, "The file's bytes cannot be read.");
                        }
                        struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
                        MHD_add_response_header(r, "Content-Type", "application/octet-stream");
                        enum MHD_Result rc = MHD_queue_response(c, 200, r);
                        MHD_destroy_response(r);
                        return rc;
                    }
                    json_decref(o);
                    if (o)
                        return reply_err(c, 405, "invalid_request_error", NULL, "That method is not served here.");
                }
            }
        }
        return reply_err(c, 404, "invalid_request_error", "file_not_found", "No such file.");
    }
    if (!strncmp(url, "/v1/batches", 11)) {
        const char *rest = url + 11;
        if (!*rest && post)
            return batch_create(c, q);
        if (!*rest && get) {
            long lim = arg_limit(c, 20, 100);
            if (lim < 0)
                return reply_err(c, 400, "invalid_request_error", "invalid_limit", "limit must be 1 to 100.");
            pthread_mutex_lock(&S.mu);
            json_t *p = list_page(S.batches, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"), lim, NULL);
            json_t *copy = json_deep_copy(p);
            json_decref(p);
            pthread_mutex_unlock(&S.mu);
            return reply_json(c, 200, copy);
        }
        char id[64];
        if (*rest == '/') {
            const char *slash = strchr(rest + 1, '/');
            size_t n = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
            const char *sub = slash ? slash : "";
            if (n < sizeof id) {
                memcpy(id, rest + 1, n);
                id[n] = '\0';
                bool cancel = !strcmp(sub, "/cancel") && post;
                if (serve_id_valid(id, "batch_") && !strcmp(sub, "/progress") && get) {
                    /* spill's own route (the status page): the batch's job as progress.c shows it */
                    pthread_mutex_lock(&S.mu);
                    json_t *m = json_object_get(S.batches, id), *o = m ? json_object_get(m, "object") : NULL;
                    json_int_t total = json_integer_value(json_object_get(json_object_get(o, "request_counts"), "total"));
                    pthread_mutex_unlock(&S.mu);
                    if (o) {
                        char jobdir[4400], csv[4500], logp[4400], plan[4096];
                        snprintf(jobdir, sizeof jobdir, "%s/%s.job", S.batches_dir, id);
                        snprintf(csv, sizeof csv, "%s/passes.csv", jobdir);
                        snprintf(logp, sizeof logp, "%s/%s.log", S.batches_dir, id);
                        progress_plan_from_log(logp, plan, sizeof plan);
                        json_t *pj = progress_json(jobdir, csv, plan, (unsigned long long)total);
                        json_object_set_new(pj, "id", json_string(id));
                        return reply_json(c, 200, pj);
                    }
                }
                if (serve_id_valid(id, "batch_") && ((!*sub && get) || cancel)) {
                    pthread_mutex_lock(&S.mu);
                    json_t *m = json_object_get(S.batches, id), *o = m ? json_object_get(m, "object") : NULL;
                    if (o && cancel) {
                        const char *st = json_string_value(json_object_get(o, "status"));
                        if (!strcmp(st, "validating") || !strcmp(st, "in_progress")) {
                            json_object_set_new(o, "status", json_string("cancelling"));
                            json_object_set_new(o, "cancelling_at", json_integer(time(NULL)));
                            save_batch(id);
                            pthread_cond_signal(&S.cv);
                        }
                    }
                    json_t *copy = o ? json_deep_copy(o) : NULL;
                    pthread_mutex_unlock(&S.mu);
                    if (copy)
                        return reply_json(c, 200, copy);
                }
            }
        }
        return reply_err(c, 404, "invalid_request_error", "batch_not_found", "No such batch.");
    }
    return reply_err(c, 404, "invalid_request_error", "not_found", "No route %s %s.", method, url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    req *q = *con_cls;
    if (!q) { /* first call: headers only */
        q = calloc(1, sizeof *q);
        if (!q)
            return MHD_NO;
        q->fd = -1;
        *con_cls = q;
        bool post = !strcmp(method, "POST");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
        if (post && !strcmp(url, "/v1/files")) {
            if (!authorized(c)) {
                q->refused = true;
                return reply_err(c, 401, "invalid_request_error", "invalid_api_key",
                                 "A valid API key is needed: send it as 'Authorization: Bearer KEY'.");
            }
            if (len > S.max_upload) {
                q->refused = true;
                return reply_err(c, 413, "invalid_request_error", "file_too_large",
                                 "The upload is %llu bytes, above this server's --max-upload of %llu.", len,
                                 S.max_upload);
            }
            q->kind = 1;
            q->pp = MHD_create_post_processor(c, 16 * 1024, post_iter, q);
            if (!q->pp) {
                q->refused = true;
                return reply_err(c, 400, "invalid_request_error", "invalid_multipart",
                                 "POST /v1/files takes multipart/form-data.");
            }
            char dir[4400];
            if (new_id("file-", q->id, sizeof q->id) || snprintf(dir, sizeof dir, "%s/%s", S.files_dir, q->id) < 0 ||
                mkdir(dir, 0700) ||
                snprintf(q->partial, sizeof q->partial, "%s/data.partial", dir) < 0 ||
                (q->fd = open(q->partial, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
                q->refused = true;
                return reply_err(c, 500, "server_error", NULL, "The upload cannot be stored.");
            }
        } else if (post) {
            if (len > BODY_MAX) {
                q->refused = true;
                return reply_err(c, 413, "invalid_request_error", "body_too_large", "A JSON body is at most %d bytes.",
                                 BODY_MAX);
            }
            q->kind = 2;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (q->refused)
            return MHD_YES;
        q->seen += n;
        if ((q->kind == 1 && q->seen > S.max_upload) || (q->kind == 2 && q->seen > BODY_MAX)) {
            q->refused = true;
            return reply_err(c, 413, "invalid_request_error", "file_too_large",
                             "The body passed this server's limit of %llu bytes.",
                             q->kind == 1 ? S.max_upload : (unsigned long long)BODY_MAX);
        }
        if (q->kind == 1) {
            if (MHD_post_process(q->pp, upload, n) != MHD_YES)
                q->bad_part = true;
        } else if (q->kind == 2) {
            char *b = realloc(q->body, q->blen + n + 1);
            if (!b)
                return MHD_NO;
            memcpy(b + q->blen, upload, n);
            q->body = b;
            q->blen += n;
        }
        return MHD_YES;
    }
    if (q->refused)
        return MHD_YES;
    return route(c, url, method, q);
}

/* URL unescaping for libmicrohttpd: %XX decoded, except %00, which stays as the three characters so that a NUL
 * can never cut a path into a valid-looking id ("file-<24>%00" must not name file-<24>). */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else
            *w++ = *r;
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* ---- the worker ---- */

static void batch_set(json_t *o, const char *status, const char *stamp)
{
    json_object_set_new(o, "status", json_string(status));
    if (stamp)
        json_object_set_new(o, stamp, json_integer(time(NULL)));
}

/* Makes an output file object for a job file with lines, as a hard link of it; its id or NULL. */
static json_t *output_file(const char *job_path, const char *name)
{
    struct stat st;
    if (stat(job_path, &st) || st.st_size == 0)
        return json_null();
    char id[40], dir[4400], data[4500];
    if (new_id("file-", id, sizeof id))
        return json_null();
    snprintf(dir, sizeof dir, "%s/%s", S.files_dir, id);
    snprintf(data, sizeof data, "%s/data", dir);
    if (mkdir(dir, 0700) || link(job_path, data))
        return json_null();
    return file_register(id, name, "batch_output", (long long)st.st_size) ? json_string(id) : json_null();
}

static void read_counts(const char *jobdir, json_t *o)
{
    job_stored st = {0};
    char err[SPILL_ERRLEN];
    if (!job_read_stored(jobdir, &st, err, sizeof err)) {
        json_t *rc = json_object_get(o, "request_counts");
        json_object_set_new(rc, "completed", json_integer((json_int_t)st.rows_completed));
        json_object_set_new(rc, "failed", json_integer((json_int_t)st.rows_failed));
    }
    job_stored_free(&st);
}

static void finalize(const char *id, json_t *o, const char *jobdir, const char *final, const char *stamp)
{
    char p[4500];
    batch_set(o, "finalizing", "finalizing_at");
    read_counts(jobdir, o);
    snprintf(p, sizeof p, "%s/results.jsonl", jobdir);
    json_object_set_new(o, "output_file_id", output_file(p, "batch_output.jsonl"));
    snprintf(p, sizeof p, "%s/errors.jsonl", jobdir);
    json_object_set_new(o, "error_file_id", output_file(p, "batch_errors.jsonl"));
    batch_set(o, final, stamp);
    save_batch(id);
}

static void fail_batch(const char *id, json_t *o, const char *code, long line, const char *msg)
{
    json_t *e = json_pack("{s:s,s:s,s:n,s:o}", "code", code, "message", msg, "param", "line",
                          line > 0 ? json_integer(line) : json_null());
    json_object_set_new(o, "errors", json_pack("{s:s,s:[o]}", "object", "list", "data", e));
    batch_set(o, "failed", "failed_at");
    save_batch(id);
}

static bool past_window(json_t *o)
{
    json_t *e = json_object_get(o, "expires_at");
    return json_is_integer(e) && (json_int_t)time(NULL) >= json_integer_value(e);
}

/* Adds every custom_id of the JSONL file at path to set (lines that do not parse are skipped). */
static void ids_of(const char *path, json_t *set)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "custom_id"));
        if (id)
            json_object_set_new(set, id, json_true());
        json_decref(j);
    }
    free(line);
    if (f)
        fclose(f);
}

/* The completion window ran out (OpenAI's `expired`): the rows answered stay in the output file; the error file
 * is the job's errors plus one line per row never answered, code batch_expired, counted as failed.  The error
 * file is written beside the batch (tmp + fsync + rename), never into the job's own files.  Lock held. */
static void expire_batch(const char *id, json_t *o, const char *jobdir)
{
    char res[4500], errs[4500], exp[4500], data[4400];
    snprintf(res, sizeof res, "%s/results.jsonl", jobdir);
    snprintf(errs, sizeof errs, "%s/errors.jsonl", jobdir);
    snprintf(exp, sizeof exp, "%s/%s.errors.jsonl", S.batches_dir, id);
    snprintf(data, sizeof data, "%s/%s/data", S.files_dir, json_string_value(json_object_get(o, "input_file_id")));
    read_counts(jobdir, o);
    json_t *done = json_object();
    ids_of(res, done);
    ids_of(errs, done);
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    FILE *ef = fopen(errs, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (mf && ef && (n = getline(&line, &cap, ef)) > 0)
        fwrite(line, 1, (size_t)n, mf);
    if (ef)
        fclose(ef);
    long expired = 0;
    FILE *in = fopen(data, "r");
    while (mf && in && (n = getline(&line, &cap, in)) > 0) {
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        const char *cid = json_string_value(json_object_get(j, "custom_id"));
        char rid[48];
        if (cid && !json_object_get(done, cid) && !new_id("batch_req_", rid, sizeof rid)) {
            json_object_set_new(done, cid, json_true()); /* a custom_id twice in the input: one line */
            json_t *l = json_pack("{s:s,s:s,s:n,s:{s:s,s:s}}", "id", rid, "custom_id", cid, "response", "error",
                                  "code", "batch_expired", "message",
                                  "This request could not be executed before the completion window expired.");
            char *t = json_dumps(l, JSON_COMPACT);
            if (t)
                fprintf(mf, "%s\n", t);
            free(t);
            json_decref(l);
            expired++;
        }
        json_decref(j);
    }
    if (in)
        fclose(in);
    free(line);
    json_decref(done);
    if (mf)
        fclose(mf);
    char err[SPILL_ERRLEN];
    json_t *rc = json_object_get(o, "request_counts");
    json_int_t failed = json_integer_value(json_object_get(rc, "failed")) + expired;
    json_object_set_new(rc, "failed", json_integer(failed));
    json_int_t total = json_integer_value(json_object_get(rc, "completed")) + failed;
    if (json_integer_value(json_object_get(rc, "total")) < total)
        json_object_set_new(rc, "total", json_integer(total));
    json_object_set_new(o, "output_file_id", output_file(res, "batch_output.jsonl"));
    if (buf && util_write_atomic(exp, buf, len, err, sizeof err))
        fprintf(stderr, "spill serve: batch %s: %s\n", id, err);
    json_object_set_new(o, "error_file_id", output_file(exp, "batch_errors.jsonl"));
    free(buf);
    batch_set(o, "expired", "expired_at");
    save_batch(id);
}

/* Ends the resident worker: closing its command pipe ends an idle one; kill (the server stops, or it is
 * stuck) kills it first.  Waits for it. */
static void worker_end(bool kill9)
{
    if (S.wk_pid <= 0)
        return;
    if (kill9)
        kill(S.wk_pid, SIGKILL);
    close(S.wk_cmd);
    close(S.wk_ans);
    waitpid(S.wk_pid, NULL, 0);
    S.wk_pid = 0;
}

/* fd onto want in a child (clearing close-on-exec either way). */
static void move_fd(int fd, int want)
{
    if (fd == want)
        fcntl(fd, F_SETFD, 0);
    else
        dup2(fd, want);
}

/* Makes sure the resident worker runs for model (ending one for another model); 0, or -1 (fork or pipe failed). */
static int worker_for(const char *model)
{
    if (S.wk_pid > 0 && !strcmp(S.wk_model, model))
        return 0;
    worker_end(false);
    int cmd[2], ans[2];
    if (pipe2(cmd, O_CLOEXEC))
        return -1;
    if (pipe2(ans, O_CLOEXEC)) {
        close(cmd[0]), close(cmd[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a kill -9 of the server takes the job with it: the restart resumes */
        int keep_ans = ans[1] == 0 ? dup(ans[1]) : ans[1]; /* (never 0 in practice: stdin stays open) */
        move_fd(cmd[0], 0);
        move_fd(keep_ans, 3);
        int dn = open("/dev/null", O_WRONLY); /* each job's output goes to its batch's log (run_worker.c) */
        if (dn >= 0)
            dup2(dn, 1), dup2(dn, 2);
        signal(SIGPIPE, SIG_DFL);
        execl(S.self_exe, "spill", "worker", model, (char *)NULL);
        _exit(127);
    }
    close(cmd[0]);
    close(ans[1]);
    if (pid < 0) {
        close(cmd[1]), close(ans[0]);
        return -1;
    }
    S.wk_pid = pid, S.wk_cmd = cmd[1], S.wk_ans = ans[0];
    snprintf(S.wk_model, sizeof S.wk_model, "%s", model);
    return 0;
}

/* The worker's answer, without waiting: 1 with *code, 0 not yet, -1 the worker is gone (reaped). */
static int worker_answer(int *code)
{
    struct pollfd p = {S.wk_ans, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    char buf[32];
    ssize_t n = read(S.wk_ans, buf, sizeof buf - 1); /* one short line, written whole */
    if (n <= 0) {
        worker_end(true);
        return -1;
    }
    buf[n] = '\0';
    *code = atoi(buf);
    return 1;
}

/* Runs one batch's job on the resident worker; returns when it ended, was cancelled, expired, or the server
 * stops.  The lock is held on entry and exit (released while the job runs). */
static void run_batch(const char *id, json_t *o, const char *model)
{
    char jobdir[4400], data[4400], logp[4400], man[4500], csv[4500], line[20000];
    snprintf(jobdir, sizeof jobdir, "%s/%s.job", S.batches_dir, id);
    snprintf(csv, sizeof csv, "%s/passes.csv", jobdir); /* the status page's charts (the passes since this start) */
    snprintf(logp, sizeof logp, "%s/%s.log", S.batches_dir, id);
    snprintf(man, sizeof man, "%s/manifest.json", jobdir);
    snprintf(data, sizeof data, "%s/%s/data", S.files_dir, json_string_value(json_object_get(o, "input_file_id")));
    int code = -1;
    bool sent = false, expiring = false;
    for (int attempt = 0; attempt < 2; attempt++) { /* a worker that dies mid-job: resumed once more */
        if (util_is_file(man))
            snprintf(line, sizeof line, "resume\t%s\t%s\t%s\n", jobdir, csv, logp);
        else
            snprintf(line, sizeof line, "run\t%s\t%s\t%s\t%s\n", data, jobdir, csv, logp);
        pthread_mutex_unlock(&S.mu);
        size_t len = strlen(line);
        bool up = worker_for(model) == 0 && write(S.wk_cmd, line, len) == (ssize_t)len;
        if (!up) {
            worker_end(true);
            pthread_mutex_lock(&S.mu);
            continue;
        }
        sent = false;
        int got;
        for (;;) {
            got = worker_answer(&code);
            pthread_mutex_lock(&S.mu);
            if (got)
                break;
            read_counts(jobdir, o);
            bool cancel = !strcmp(json_string_value(json_object_get(o, "status")), "cancelling");
            if (!cancel && !expiring && past_window(o))
                expiring = true; /* the job checkpoints on SIGINT; its answered rows stay */
            if ((cancel || S.stop || expiring) && !sent) {
                kill(S.wk_pid, SIGINT);
                sent = true;
            }
            pthread_mutex_unlock(&S.mu);
            struct pollfd p = {S.wk_ans, POLLIN, 0};
            poll(&p, 1, 200);
        }
        if (got > 0 || S.stop || sent)
            break; /* answered; or gone while stopping, cancelled or expiring: no second try */
        code = -1;
        fprintf(stderr, "spill serve: batch %s: the worker ended mid-job%s.\n", id,
                attempt ? "" : "; resuming the batch on a fresh one");
    }
    /* the lock is held here */
    const char *st = json_string_value(json_object_get(o, "status"));
    if (S.stop && strcmp(st, "cancelling") && !expiring)
        return; /* stays in_progress: the next start resumes it */
    if (expiring && strcmp(st, "cancelling") && code != 0 && (code == SPILL_EX_TEMPFAIL || code == -1))
        expire_batch(id, o, jobdir);
    else if (!strcmp(st, "cancelling") && (code == SPILL_EX_TEMPFAIL || code == 0))
        finalize(id, o, jobdir, "cancelled", "cancelled_at");
    else if (code == 0)
        finalize(id, o, jobdir, "completed", "completed_at");
    else {
        char msg[600];
        snprintf(msg, sizeof msg, "The batch's job ended with exit code %d; its log is %s.", code, logp);
        fail_batch(id, o, "job_failed", 0, msg);
    }
}

/* Takes the oldest batch that still has work; lock held on entry and exit. */
static json_t *next_batch(const char **idp)
{
    const char *key, *best = NULL;
    json_t *m, *bm = NULL;
    json_object_foreach(S.batches, key, m)
    {
        const char *st = json_string_value(json_object_get(json_object_get(m, "object"), "status"));
        if (strcmp(st, "validating") && strcmp(st, "in_progress") && strcmp(st, "cancelling") &&
            strcmp(st, "finalizing"))
            continue;
        if (!bm || json_integer_value(json_object_get(m, "seq")) < json_integer_value(json_object_get(bm, "seq")))
            bm = m, best = key;
    }
    *idp = best;
    return bm;
}

static void *worker(void *arg)
{
    pthread_mutex_lock(&S.mu);
    while (!S.stop) {
        const char *idk;
        json_t *m = next_batch(&idk);
        if (!m) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 300 * 1000000L;
            if (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&S.cv, &S.mu, &ts);
            continue;
        }
        char id[64], jobdir[4400];
        snprintf(id, sizeof id, "%s", idk);
        snprintf(jobdir, sizeof jobdir, "%s/%s.job", S.batches_dir, id);
        json_incref(m);
        json_t *o = json_object_get(m, "object");
        const char *st = json_string_value(json_object_get(o, "status"));
        if ((!strcmp(st, "validating") || !strcmp(st, "in_progress")) && past_window(o)) {
            expire_batch(id, o, jobdir); /* waited past its window (or the server was down through it) */
            json_decref(m);
            continue;
        }
        if (!strcmp(st, "validating") || (!strcmp(st, "cancelling") && !json_is_integer(json_object_get(o, "in_progress_at")))) {
            if (!strcmp(st, "cancelling")) {
                batch_set(o, "cancelled", "cancelled_at");
                save_batch(id);
                json_decref(m);
                continue;
            }
            char data[4400], ep[64];
            snprintf(data, sizeof data, "%s/%s/data", S.files_dir, json_string_value(json_object_get(o, "input_file_id")));
            snprintf(ep, sizeof ep, "%s", json_string_value(json_object_get(o, "endpoint")));
            pthread_mutex_unlock(&S.mu);
            check_opts co = check_opts_default();
            co.endpoint = ep;
            check_report r;
            char err[SPILL_ERRLEN] = "";
            /* the sentences name the input file by its id, not by its path in the store */
            char name[64];
            snprintf(name, sizeof name, "%s", json_string_value(json_object_get(o, "input_file_id")));
            FILE *in = fopen(data, "r");
            int rc = in ? check_stream(in, name, &co, &r, NULL, err, sizeof err) : CHECK_NOINPUT;
            if (in)
                fclose(in);
            if (!in) {
                memset(&r, 0, sizeof r);
                snprintf(err, sizeof err, "The input file %s cannot be read.", name);
            }
            pthread_mutex_lock(&S.mu);
            if (!strcmp(json_string_value(json_object_get(o, "status")), "cancelling")) { /* cancelled meanwhile */
                batch_set(o, "cancelled", "cancelled_at");
                save_batch(id);
            } else if (rc != CHECK_OK) {
                fail_batch(id, o, r.first_error_code ? r.first_error_code : "invalid_file", (long)r.first_error_line,
                           r.first_error[0] ? r.first_error : err);
            } else {
                /* the model: the batch's body.model when this server offers it, else the first --model */
                const char *model = S.models[0];
                for (int i = 0; i < S.n_models; i++)
                    if (!strcmp(S.models[i], r.model))
                        model = S.models[i];
                json_object_set_new(m, "model", json_string(model));
                json_object_set_new(o, "model", json_string(r.model));
                json_object_set_new(json_object_get(o, "request_counts"), "total", json_integer((json_int_t)r.rows));
                batch_set(o, "in_progress", "in_progress_at");
                save_batch(id);
            }
        } else if (!strcmp(st, "finalizing")) { /* the server stopped between the job's end and the files */
            finalize(id, o, jobdir, "completed", "completed_at");
        } else {
            const char *model = json_string_value(json_object_get(m, "model"));
            char mbuf[4096];
            snprintf(mbuf, sizeof mbuf, "%s", model ? model : S.models[0]);
            run_batch(id, o, mbuf);
        }
        json_decref(m);
    }
    worker_end(true); /* the server stops: a running job was checkpointed (SIGINT) or resumes from its commits */
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

/* ---- the command ---- */

static void serve_usage(FILE *f)
{
    fprintf(f, "usage: spill serve --model MODEL [--model MODEL...] [--host 127.0.0.1] [--port 8000] [--keys FILE] "
               "[--tls-cert F --tls-key F] [--max-upload 200M]\n");
}

static char *slurp(const char *path, char *err, size_t errlen)
{
    char *s = NULL;
    size_t n;
    if (util_read_file(path, 1 << 20, &s, &n, err, errlen))
        return NULL;
    return s;
}

int serve_main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *keys = NULL, *cert = NULL, *key = NULL;
    int port = 8000;
    char err[SPILL_ERRLEN];
    S.max_upload = 200ull << 20;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "--host") || !strcmp(a, "--port") || !strcmp(a, "--keys") || !strcmp(a, "--model") ||
                     !strcmp(a, "--tls-cert") || !strcmp(a, "--tls-key") || !strcmp(a, "--max-upload");
        if (!takes) {
            fprintf(stderr, "spill serve: %s is not an option of spill serve; spill serve --help lists them.\n", a);
            serve_usage(stderr);
            return SPILL_EX_USAGE;
        }
        if (!v) {
            fprintf(stderr, "spill serve: %s needs a value.\n", a);
            return SPILL_EX_USAGE;
        }
        i++;
        if (!strcmp(a, "--host"))
            host = v;
        else if (!strcmp(a, "--port")) {
            char *end;
            long p = strtol(v, &end, 10);
            if (*end || p < 1 || p > 65535) {
                fprintf(stderr, "spill serve: --port takes 1 to 65535, not '%s'.\n", v);
                return SPILL_EX_USAGE;
            }
            port = (int)p;
        } else if (!strcmp(a, "--keys"))
            keys = v;
        else if (!strcmp(a, "--tls-cert"))
            cert = v;
        else if (!strcmp(a, "--tls-key"))
            key = v;
        else if (!strcmp(a, "--max-upload")) {
            if (serve_parse_size(v, &S.max_upload)) {
                fprintf(stderr, "spill serve: --max-upload takes a size such as 200M (K, M, G), not '%s'.\n", v);
                return SPILL_EX_USAGE;
            }
        } else if (S.n_models == MAX_MODELS) {
            fprintf(stderr, "spill serve: at most %d --model options.\n", MAX_MODELS);
            return SPILL_EX_USAGE;
        } else
            S.models[S.n_models++] = v;
    }
    if (!S.n_models) {
        fprintf(stderr, "spill serve: name the model batches run on with --model MODEL.\n");
        serve_usage(stderr);
        return SPILL_EX_USAGE;
    }
    if (!cert != !key) {
        fprintf(stderr, "spill serve: TLS needs both --tls-cert and --tls-key.\n");
        return SPILL_EX_USAGE;
    }
    bool loopback = !strcmp(host, "127.0.0.1") || !strcmp(host, "localhost") || !strcmp(host, "::1") ||
                    !strcmp(host, "[::1]");
    if (!keys && !loopback) {
        fprintf(stderr, "spill serve: a server on %s needs --keys FILE (without keys it listens on 127.0.0.1 only).\n",
                host);
        return SPILL_EX_USAGE;
    }
    if (keys && load_keys(keys, err, sizeof err)) {
        fprintf(stderr, "spill serve: %s\n", err);
        return SPILL_EX_USAGE;
    }
    ssize_t n = readlink("/proc/self/exe", S.self_exe, sizeof S.self_exe - 1);
    if (n <= 0) {
        fprintf(stderr, "spill serve: cannot find this binary's path (/proc/self/exe).\n");
        return SPILL_EX_SOFTWARE;
    }
    S.self_exe[n] = '\0';
    snprintf(S.home, sizeof S.home, "%s/serve", util_spill_home());
    if (strpbrk(S.home, "\t\n\r")) { /* the worker's commands are tab-separated paths under it, a line each */
        fprintf(stderr, "spill serve: the store %s has a tab or line break in its path; set SPILL_HOME to a path "
                        "without one.\n", S.home);
        return SPILL_EX_USAGE;
    }
    snprintf(S.files_dir, sizeof S.files_dir, "%s/files", S.home);
    snprintf(S.batches_dir, sizeof S.batches_dir, "%s/batches", S.home);
    if (mkdir_p(S.files_dir) || mkdir_p(S.batches_dir)) {
        fprintf(stderr, "spill serve: cannot create the store %s: %s.\n", S.home, strerror(errno));
        return SPILL_EX_CANTCREAT;
    }
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    S.files = json_object();
    S.batches = json_object();
    load_store();

    /* IPv4 (127.0.0.1, 0.0.0.0, …) or IPv6 (::1, [::1], :: — which also takes IPv4 clients where the system
     * allows dual-stack sockets) */
    struct sockaddr_storage ss = {0};
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    char h6[64] = "";
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && hl < sizeof h6 + 1 && host[hl - 1] == ']')
        snprintf(h6, sizeof h6, "%.*s", (int)(hl - 2), host + 1);
    else
        snprintf(h6, sizeof h6, "%s", host);
    bool v6 = false;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, h6, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        v6 = true;
        flags |= !strcmp(h6, "::") ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    } else {
        fprintf(stderr, "spill serve: --host takes an IPv4 or IPv6 address such as 127.0.0.1, 0.0.0.0, ::1 or ::, "
                        "not '%s'.\n", host);
        return SPILL_EX_USAGE;
    }
    char *cert_pem = NULL, *key_pem = NULL;
    if (cert) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            fprintf(stderr, "spill serve: this libmicrohttpd has no TLS; serve plain HTTP behind a TLS proxy.\n");
            return SPILL_EX_UNAVAILABLE;
        }
        if (!(cert_pem = slurp(cert, err, sizeof err)) || !(key_pem = slurp(key, err, sizeof err))) {
            fprintf(stderr, "spill serve: %s\n", err);
            free(cert_pem);
            return SPILL_EX_NOINPUT;
        }
        flags |= MHD_USE_TLS;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction act = {0};
    act.sa_handler = on_signal;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);
    pthread_t wt;
    pthread_create(&wt, NULL, worker, NULL);
    struct MHD_Daemon *d;
    if (cert)
        d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                             MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                             MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_CONNECTION_LIMIT,
                             4096u, MHD_OPTION_NOTIFY_COMPLETED, req_done, NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_HTTPS_MEM_CERT, cert_pem,
                             MHD_OPTION_HTTPS_MEM_KEY, key_pem, MHD_OPTION_END);
    else
        d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                             MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                             MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_CONNECTION_LIMIT,
                             4096u, MHD_OPTION_NOTIFY_COMPLETED, req_done, NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_END);
    int rc = 0;
    if (!d) {
        fprintf(stderr, "spill serve: cannot listen on %s%s%s:%d (in use, or the TLS certificate/key is bad).\n",
                v6 ? "[" : "", h6, v6 ? "]" : "", port);
        rc = SPILL_EX_UNAVAILABLE;
    } else {
        fprintf(stderr, "spill serve: listening on %s://%s%s%s:%d (store %s)\n", cert ? "https" : "http", v6 ? "[" : "",
                h6, v6 ? "]" : "", port, S.home);
        while (!g_signal)
            pause();
        fprintf(stderr, "spill serve: stopping (a running batch checkpoints and resumes on the next start).\n");
    }
    pthread_mutex_lock(&S.mu);
    S.stop = 1;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(wt, NULL);
    if (d)
        MHD_stop_daemon(d);
    json_decref(S.files);
    json_decref(S.batches);
    for (int i = 0; i < S.n_keys; i++)
        free(S.keys[i]);
    free(cert_pem);
    free(key_pem);
    return rc;
}
