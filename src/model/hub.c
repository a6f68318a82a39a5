/*
 * hub.c — downloads from the Hugging Face Hub (libcurl): the files a run needs of a repo, checked, into
 * $SPILL_HOME/models/hf/.
 *
 * Owns: the Hub's HTTP layout as huggingface_hub uses it — `GET {endpoint}/api/models/{repo}/revision/{rev}
 * ?blobs=true` for the commit and the file list (each sibling's size, git blob id, and LFS sha256), `GET
 * {endpoint}/{repo}/resolve/{rev}/{file}` for the bytes (redirects to LFS storage followed; the token is not sent
 * to another host) — the token (HF_TOKEN, else the file huggingface_hub's login writes: $HF_TOKEN_PATH, else
 * $HF_HOME/token, HF_HOME defaulting to ~/.cache/huggingface), the endpoint (HUB_ENDPOINT, or HF_ENDPOINT for a
 * mirror), HF_HUB_OFFLINE, which files a run needs, the local layout, resumable checked transfers, the progress
 * line, and the sentences for what goes wrong.
 * Does not own: what the files mean (model.c), whether a family runs (arch.c), sizes (size.c), which names
 * are curated tags (registry.c).
 *
 * Layout: `org/name` (revision main) lives in models/hf/org--name/, `org/name@rev` in models/hf/org--name@rev/
 * ('/' in rev becomes "--"), each holding the repo's own file names.  A download in progress keeps the marker
 * file `.spill-download` in the directory and each unfinished file as NAME.partial; a finished one has
 * `.spill-hub.json` (repo, revision, commit, files with sizes and checksums) and no marker.  A directory without
 * the marker is complete — a copied directory with neither file, as spill has always read, included — so a second
 * run resolves without the network at all (pinned to the commit it downloaded; remove the directory to update).
 *
 * Key decisions:
 *  - config.json first: the family's support state and the sizes per quant are printed, and an unsupported
 *    family or a download larger than the free disk (statvfs; SPILL_TEST_FREE_BYTES stands in for the free
 *    bytes in tests) is refused before any weight file is asked for.
 *  - Only what a run reads: config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
 *    chat_template.jinja, model.safetensors.index.json and the shards it names (else every top-level
 *    *.safetensors but Mistral's consolidated.*) — or, for org/name:QUANT, the one top-level .gguf whose name
 *    carries QUANT as a whole token.
 *  - Transfers: up to HUB_PARALLEL files at once (curl multi), each appended with write(2) to NAME.partial, so
 *    a kill (Ctrl-C) keeps every byte that arrived and the next run asks for the rest with `Range: bytes=N-`
 *    (a server that answers 200 instead starts the file over).  A dropped connection is retried from where it
 *    stopped, HUB_RETRIES times.  A finished file is checked — SHA-256 against the LFS oid, the git blob SHA-1
 *    for small files — then fsynced and renamed to its own name; a mismatch removes it and fetches it once more,
 *    then fails.
 *  - Progress: one redrawn line (bytes, rate, ETA) when stderr is a terminal, otherwise a line at the start, at
 *    each quarter and at the end.
 *  - Errors are classed for the exit code (model.h's MODEL_ERR_*): 401/403/404 are the user's to fix (66), an
 *    unsupported family is data (65), an unreachable hub is a service (69), the disk 73, a broken copy 74.
 */
#include "hub.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "arch.h"
#include "model.h"
#include "size.h"
#include "../base/util.h"

/* huggingface_hub's constants.ENDPOINT default; HF_ENDPOINT overrides it. */
#define HUB_ENDPOINT "https://huggingface.co"
#define HUB_PARALLEL 4
#define HUB_RETRIES 5
#define HUB_API_LIMIT (64u << 20) /* the file list of a repo with thousands of files fits */
#define PENDING ".spill-download"
#define META ".spill-hub.json"

/* util_errf that returns code (one of model.h's MODEL_ERR_*). */
static int fail(int code, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---------------------------------------------------------------- names */

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 96 || s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                  c == '_' || c == '.';
        if (!ok || (i + 1 < n && ((c == '-' && s[i + 1] == '-') || (c == '.' && s[i + 1] == '.'))))
            return false;
    }
    return true;
}

static bool rev_ok(const char *s, size_t n)
{
    if (n == 0 || n >= 128 || s[0] == '/' || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.' || c == '/'))
            return false;
        if (i + 1 < n && c == '.' && s[i + 1] == '.')
            return false;
    }
    return true;
}

bool hub_parse(const char *spec, hub_ref *r)
{
    memset(r, 0, sizeof *r);
    const char *slash = strchr(spec, '/');
    if (!slash || strlen(spec) >= sizeof r->spec)
        return false;
    const char *name = slash + 1;
    size_t nl = strcspn(name, "@:");
    if (!name_ok(spec, (size_t)(slash - spec)) || !name_ok(name, nl))
        return false;
    const char *p = name + nl;
    snprintf(r->repo, sizeof r->repo, "%.*s", (int)(p - spec), spec);
    snprintf(r->rev, sizeof r->rev, "main");
    bool main_rev = true;
    if (*p == '@') {
        size_t rl = strcspn(p + 1, ":");
        if (!rev_ok(p + 1, rl))
            return false;
        snprintf(r->rev, sizeof r->rev, "%.*s", (int)rl, p + 1);
        main_rev = false;
        p += 1 + rl;
    }
    if (*p == ':') {
        size_t ql = strlen(p + 1);
        if (!name_ok(p + 1, ql) || ql >= sizeof r->quant)
            return false;
        snprintf(r->quant, sizeof r->quant, "%s", p + 1);
        p += 1 + ql;
    }
    if (*p)
        return false;
    snprintf(r->spec, sizeof r->spec, "%s", spec);
    char rev_dir[256] = "";
    if (!main_rev) {
        size_t o = 0;
        for (const char *c = r->rev; *c && o + 3 < sizeof rev_dir; c++) {
            if (*c == '/') {
                rev_dir[o++] = '-';
                rev_dir[o++] = '-';
            } else
                rev_dir[o++] = *c;
        }
        rev_dir[o] = 0;
    }
    return util_pathf(r->dir, sizeof r->dir, "%s/models/hf/%.*s--%s%s%s", util_spill_home(), (int)(slash - spec),
                      spec, r->repo + (slash - spec) + 1, main_rev ? "" : "@", rev_dir) == 0;
}

bool hub_offline(void)
{
    const char *v = getenv("HF_HUB_OFFLINE");
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

/* True when name (a file name) carries the quant token q as a whole token: Q4_K_M in x.Q4_K_M.gguf, x-q4_k_m.gguf,
 * but not in x-Q4_K_M_L.gguf; case-insensitive. */
static bool carries_quant(const char *name, const char *q)
{
    size_t n = strlen(name), ql = strlen(q);
    if (n < 5 || strcasecmp(name + n - 5, ".gguf"))
        return false;
    for (size_t i = 0; i + ql <= n - 5; i++) {
        if (strncasecmp(name + i, q, ql))
            continue;
        char b = i ? name[i - 1] : '.', a = name[i + ql];
        if ((b == '.' || b == '-' || b == '_') && (a == '.' || a == '-'))
            return true;
    }
    return false;
}

/* The one complete file in dir whose name carries quant, into out; false when none is there. */
static bool find_quant_file(const char *dir, const char *quant, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d)))
        found = carries_quant(e->d_name, quant) && util_pathf(out, cap, "%s/%s", dir, e->d_name) == 0 &&
                util_is_file(out);
    if (d)
        closedir(d);
    return found;
}

bool hub_local(const hub_ref *r, char *path, size_t cap)
{
    if (!util_is_dir(r->dir))
        return false;
    /* the GGUF form is complete per file: its own name exists only once the file is checked */
    if (r->file[0])
        return util_pathf(path, cap, "%s/%s", r->dir, r->file) == 0 && util_is_file(path);
    if (r->quant[0])
        return find_quant_file(r->dir, r->quant, path, cap);
    char pending[4096], meta[4096], cfg[4096];
    if (util_pathf(pending, sizeof pending, "%s/" PENDING, r->dir) ||
        util_pathf(meta, sizeof meta, "%s/" META, r->dir) || util_pathf(cfg, sizeof cfg, "%s/config.json", r->dir))
        return false;
    if (util_is_file(pending))
        return false;
    /* a directory a GGUF download made holds .spill-hub.json and no config.json: not the safetensors form */
    if (util_is_file(meta) && !util_is_file(cfg))
        return false;
    return util_pathf(path, cap, "%s", r->dir) == 0;
}

/* ---------------------------------------------------------------- the session: endpoint, token, requests */

typedef struct hub_ctx {
    const hub_ref *r;
    char endpoint[512];
    char token_from[4096]; /* "HF_TOKEN" or the token file's path, "" when no token */
    struct curl_slist *headers;
} hub_ctx;

/* The token file huggingface_hub's login writes: $HF_TOKEN_PATH, else $HF_HOME/token, HF_HOME defaulting to
 * $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. */
static void token_file(char *out, size_t cap)
{
    const char *tp = getenv("HF_TOKEN_PATH"), *hh = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (tp && *tp)
        snprintf(out, cap, "%s", tp);
    else if (hh && *hh)
        snprintf(out, cap, "%s/token", hh);
    else if (xdg && *xdg)
        snprintf(out, cap, "%s/huggingface/token", xdg);
    else
        snprintf(out, cap, "%s/.cache/huggingface/token", home ? home : "");
}

static int ctx_open(hub_ctx *h, const hub_ref *r, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    h->r = r;
    static bool inited;
    if (!inited) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return fail(MODEL_ERR_NET, err, errlen, "libcurl could not be initialised; %s cannot be downloaded.", r->spec);
        inited = true;
    }
    const char *ep = getenv("HF_ENDPOINT");
    snprintf(h->endpoint, sizeof h->endpoint, "%s", ep && *ep ? ep : HUB_ENDPOINT);
    for (size_t n = strlen(h->endpoint); n > 0 && h->endpoint[n - 1] == '/'; n--)
        h->endpoint[n - 1] = 0;
    char tok[1024] = "";
    const char *env = getenv("HF_TOKEN");
    if (env && *env) {
        snprintf(tok, sizeof tok, "%s", env);
        snprintf(h->token_from, sizeof h->token_from, "HF_TOKEN");
    } else {
        char tf[4096], *buf = NULL;
        size_t len;
        token_file(tf, sizeof tf);
        if (util_is_file(tf) && util_read_file(tf, sizeof tok - 1, &buf, &len, NULL, 0) == 0) {
            size_t b = strspn(buf, " \t\r\n");
            size_t e = strcspn(buf + b, " \t\r\n");
            if (e) {
                snprintf(tok, sizeof tok, "%.*s", (int)e, buf + b);
                snprintf(h->token_from, sizeof h->token_from, "%s", tf);
            }
            free(buf);
        }
    }
    char ua[128];
    snprintf(ua, sizeof ua, "User-Agent: spill/%s", SPILL_GIT);
    h->headers = curl_slist_append(NULL, ua);
    if (tok[0]) {
        char auth[1100];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
        h->headers = curl_slist_append(h->headers, auth);
    }
    return 0;
}

static void ctx_close(hub_ctx *h) { curl_slist_free_all(h->headers); }

/* A response's status, the Hub's X-Error-Code and X-Repo-Commit (of the last response after redirects). */
typedef struct reply {
    long status;
    char error_code[64], commit[64];
} reply;

static size_t on_header(char *p, size_t sz, size_t n, void *u)
{
    reply *rp = u;
    size_t len = sz * n;
    if (len >= 5 && !strncmp(p, "HTTP/", 5))
        rp->error_code[0] = 0; /* a new response (after a redirect) */
    const char *keys[2] = {"X-Error-Code:", "X-Repo-Commit:"};
    char *dst[2] = {rp->error_code, rp->commit};
    for (int k = 0; k < 2; k++) {
        size_t kl = strlen(keys[k]);
        if (len > kl && !strncasecmp(p, keys[k], kl)) {
            const char *v = p + kl;
            size_t vl = len - kl;
            while (vl && (*v == ' ' || *v == '\t'))
                v++, vl--;
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
                vl--;
            snprintf(dst[k], 64, "%.*s", (int)(vl < 63 ? vl : 63), v);
        }
    }
    return len;
}

/* The options every request shares. */
static void easy_common(hub_ctx *h, CURL *c, const char *url, reply *rp)
{
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L); /* LFS files live behind a redirect */
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
    /* a stalled transfer (under 1 kB/s for 60 s) fails and is retried from where it stopped */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, rp);
}

static bool unreachable(CURLcode cc)
{
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_RESOLVE_PROXY ||
           cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_SSL_CONNECT_ERROR || cc == CURLE_PEER_FAILED_VERIFICATION ||
           cc == CURLE_SEND_ERROR || cc == CURLE_RECV_ERROR || cc == CURLE_GOT_NOTHING;
}

static int net_error(hub_ctx *h, const char *what, CURLcode cc, char *err, size_t errlen)
{
    util_errf(err, errlen,
              "cannot reach the model hub at %s for %s (%s); check the network (or HF_ENDPOINT), or work offline: "
              "copy the repository to %s and run with HF_HUB_OFFLINE=1.",
              h->endpoint, what, curl_easy_strerror(cc), h->r->dir);
    return MODEL_ERR_NET;
}

/* The sentence for an HTTP error status of a request about `what` (the repo, or one of its files). */
static int status_error(hub_ctx *h, const char *what, const reply *rp, char *err, size_t errlen)
{
    const hub_ref *r = h->r;
    char tf[4096];
    token_file(tf, sizeof tf);
    if (rp->status == 401 && !h->token_from[0]) {
        util_errf(err, errlen,
                  "%s is gated or private (HTTP 401 from %s%s%s); accept its terms on the hub, then set HF_TOKEN to "
                  "an access token (or put it in %s).",
                  r->repo, h->endpoint, rp->error_code[0] ? ", " : "", rp->error_code, tf);
        return MODEL_ERR_MISSING;
    }
    if (rp->status == 401 || rp->status == 403) {
        util_errf(err, errlen,
                  "%s refused the token from %s for %s (HTTP %ld%s%s); the repo is gated: request access on its "
                  "page with that account, or set HF_TOKEN to a token that has it.",
                  h->endpoint, h->token_from, r->repo, rp->status, rp->error_code[0] ? ", " : "", rp->error_code);
        return MODEL_ERR_MISSING;
    }
    if (rp->status == 404 && !strcmp(rp->error_code, "RevisionNotFound")) {
        util_errf(err, errlen,
                  "%s has no revision '%s' (HTTP 404 from %s); give a branch, tag or commit the repo has, or drop "
                  "@%s for main.",
                  r->repo, r->rev, h->endpoint, r->rev);
        return MODEL_ERR_MISSING;
    }
    if (rp->status == 404 && !strcmp(rp->error_code, "EntryNotFound")) {
        util_errf(err, errlen, "%s@%s lists %s but the hub at %s has no such file (HTTP 404); try again later.",
                  r->repo, r->rev, what, h->endpoint);
        return MODEL_ERR_MISSING;
    }
    if (rp->status == 404) {
        util_errf(err, errlen,
                  "%s: no such model repository on the hub at %s (HTTP 404); check the org/name spelling (a "
                  "private repo also needs HF_TOKEN).",
                  r->repo, h->endpoint);
        return MODEL_ERR_MISSING;
    }
    util_errf(err, errlen, "the hub at %s answered HTTP %ld for %s; try again later.", h->endpoint, rp->status,
              what);
    return MODEL_ERR_NET;
}

typedef struct membuf {
    char *p;
    size_t n, cap, limit;
} membuf;

static size_t on_mem(char *p, size_t sz, size_t n, void *u)
{
    membuf *b = u;
    size_t len = sz * n;
    if (b->n + len > b->limit)
        return 0;
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->n + len + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, len);
    b->n += len;
    b->p[b->n] = 0;
    return len;
}

/* GET url into a fresh JSON value (*out); `what` names it in sentences. */
static int get_json(hub_ctx *h, const char *url, const char *what, json_t **out, reply *rp, char *err,
                    size_t errlen)
{
    *out = NULL;
    membuf b = {NULL, 0, 0, HUB_API_LIMIT};
    CURL *c = curl_easy_init();
    if (!c)
        return util_errf(err, errlen, "out of memory starting a request for %s.", what);
    memset(rp, 0, sizeof *rp);
    easy_common(h, c, url, rp);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_mem);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &rp->status);
    curl_easy_cleanup(c);
    int rc = 0;
    if (cc != CURLE_OK)
        rc = unreachable(cc) ? net_error(h, what, cc, err, errlen)
                             : (util_errf(err, errlen, "the request to %s for %s failed: %s; try again later.",
                                          h->endpoint, what, curl_easy_strerror(cc)));
    else if (rp->status != 200)
        rc = status_error(h, what, rp, err, errlen);
    else {
        json_error_t je;
        *out = b.p ? json_loadb(b.p, b.n, 0, &je) : NULL;
        if (!*out)
            rc = (fail(MODEL_ERR_NET, err, errlen, "the hub at %s sent %s that is not JSON (%s); check HF_ENDPOINT.",
                            h->endpoint, what, b.p ? je.text : "an empty body"));
    }
    free(b.p);
    return rc;
}

/* {endpoint}/{repo}/resolve/{rev}/{file}, rev and file percent-encoded. */
static int resolve_url(hub_ctx *h, const char *file, char *out, size_t cap)
{
    char *rev = curl_easy_escape(NULL, h->r->rev, 0), *f = curl_easy_escape(NULL, file, 0);
    int rc = rev && f ? util_pathf(out, cap, "%s/%s/resolve/%s/%s", h->endpoint, h->r->repo, rev, f) : -1;
    curl_free(rev);
    curl_free(f);
    return rc;
}

/* ---------------------------------------------------------------- the file list */

typedef struct hub_file {
    char name[256];
    uint64_t size;
    char sha256[65]; /* LFS oid, or "" */
    char blob[41];   /* git blob id (SHA-1 of "blob <size>\0" + bytes), or "" */
} hub_file;

typedef struct repo_info {
    char commit[160];
    char gguf_arch[32]; /* the Hub's gguf.architecture for a GGUF repo, or "" */
    size_t n;
    hub_file *files; /* every sibling */
} repo_info;

static bool hex_ok(const char *s, size_t n)
{
    if (!s || strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static int get_info(hub_ctx *h, repo_info *ri, char *err, size_t errlen)
{
    memset(ri, 0, sizeof *ri);
    char url[4096], what[512];
    char *rev = curl_easy_escape(NULL, h->r->rev, 0);
    int bad = !rev || util_pathf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", h->endpoint,
                                 h->r->repo, rev);
    curl_free(rev);
    if (bad)
        return fail(MODEL_ERR_NET, err, errlen, "%s: repo id too long.", h->r->spec);
    snprintf(what, sizeof what, "%s@%s's file list", h->r->repo, h->r->rev);
    json_t *o;
    reply rp;
    int rc = get_json(h, url, what, &o, &rp, err, errlen);
    if (rc)
        return rc;
    json_t *sib = json_object_get(o, "siblings");
    const char *sha = json_string_value(json_object_get(o, "sha"));
    if (!json_is_array(sib)) {
        json_decref(o);
        return util_errf(err, errlen, "the hub at %s sent %s without a siblings list; check HF_ENDPOINT.", h->endpoint,
                         what);
    }
    snprintf(ri->commit, sizeof ri->commit, "%s", sha ? sha : h->r->rev);
    const char *ga = json_string_value(json_object_get(json_object_get(o, "gguf"), "architecture"));
    snprintf(ri->gguf_arch, sizeof ri->gguf_arch, "%s", ga ? ga : "");
    ri->files = calloc(json_array_size(sib) + 1, sizeof *ri->files);
    if (!ri->files) {
        json_decref(o);
        return fail(MODEL_ERR_DISK, err, errlen, "out of memory reading %s.", what);
    }
    size_t i;
    json_t *e;
    json_array_foreach(sib, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "rfilename"));
        if (!name || strlen(name) >= sizeof ri->files[0].name || strchr(name, '/') || name[0] == '.')
            continue; /* subfolders (original/, onnx/) and hidden files are never what a run reads */
        hub_file *f = &ri->files[ri->n++];
        snprintf(f->name, sizeof f->name, "%s", name);
        json_t *lfs = json_object_get(e, "lfs");
        json_t *size = json_object_get(json_is_object(lfs) ? lfs : e, "size");
        f->size = json_is_integer(size) && json_integer_value(size) >= 0 ? (uint64_t)json_integer_value(size) : 0;
        const char *s256 = json_string_value(json_object_get(lfs, "sha256"));
        const char *blob = json_string_value(json_object_get(e, "blobId"));
        if (hex_ok(s256, 64))
            snprintf(f->sha256, sizeof f->sha256, "%s", s256);
        else if (hex_ok(blob, 40))
            snprintf(f->blob, sizeof f->blob, "%s", blob);
    }
    json_decref(o);
    return 0;
}

static hub_file *info_find(repo_info *ri, const char *name)
{
    for (size_t i = 0; i < ri->n; i++)
        if (!strcmp(ri->files[i].name, name))
            return &ri->files[i];
    return NULL;
}

/* ---------------------------------------------------------------- transfers */

typedef struct progress {
    uint64_t total, done, done0; /* bytes of the files in flight: all, here, here at the start */
    double t0, last;
    int quarter;
    bool tty;
    const char *label;
} progress;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void progress_draw(progress *p, bool final)
{
    double t = now_s();
    if (!p->total || (!final && t - p->last < 0.25))
        return;
    p->last = t;
    double rate = t > p->t0 ? (double)(p->done - p->done0) / (t - p->t0) : 0;
    char have[32], total[32], r[32], eta[32] = "--";
    size_human(p->done, have, sizeof have);
    size_human(p->total, total, sizeof total);
    size_human((uint64_t)rate, r, sizeof r);
    if (final)
        snprintf(eta, sizeof eta, "%.1fs", t - p->t0);
    else if (rate > 0 && p->done < p->total) {
        double s = (double)(p->total - p->done) / rate;
        snprintf(eta, sizeof eta, s >= 3600 ? "%.0fh%02.0fm" : "%.0fm%02.0fs", s >= 3600 ? s / 3600 : s / 60,
                 s >= 3600 ? (double)((long)s % 3600 / 60) : (double)((long)s % 60));
    }
    int pct = (int)(100.0 * (double)p->done / (double)p->total);
    if (p->tty) {
        fprintf(stderr, "\r  %s  %3d%%  %s / %s  %s/s  %s %s\x1b[K%s", p->label, pct, have, total, r,
                final ? "in" : "ETA", eta, final ? "\n" : "");
        fflush(stderr);
    } else if (final || pct / 25 > p->quarter) {
        p->quarter = pct / 25;
        fprintf(stderr, "spill: %s: %d%%, %s of %s, %s/s, %s %s\n", p->label, pct, have, total, r,
                final ? "in" : "ETA", eta);
    }
}

typedef struct xfer {
    const hub_file *f;
    char part[4096], final[4096], url[4096];
    int fd;
    uint64_t have;
    EVP_MD_CTX *md;
    CURL *c;
    reply rp;
    int retries;
    bool refetched, started, oversize, write_failed;
    progress *pr;
} xfer;

static void md_restart(xfer *x)
{
    EVP_DigestInit_ex(x->md, x->f->sha256[0] ? EVP_sha256() : EVP_sha1(), NULL);
    if (!x->f->sha256[0]) {
        char hdr[64];
        int n = snprintf(hdr, sizeof hdr, "blob %llu", (unsigned long long)x->f->size);
        EVP_DigestUpdate(x->md, hdr, (size_t)n + 1); /* the NUL ends git's header */
    }
}

static size_t on_data(char *p, size_t sz, size_t n, void *u)
{
    xfer *x = u;
    size_t len = sz * n;
    if (!x->started) {
        x->started = true;
        curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &x->rp.status);
        if (x->rp.status == 200 && x->have > 0) { /* the server ignored the range: start over */
            x->pr->done -= x->have;
            x->have = 0;
            if (ftruncate(x->fd, 0) != 0)
                return x->write_failed = true, 0;
            md_restart(x);
        }
    }
    if (x->rp.status != 200 && x->rp.status != 206)
        return len; /* an error page: its status says what happened */
    if (x->have + len > x->f->size)
        return x->oversize = true, 0;
    for (size_t off = 0; off < len;) {
        ssize_t w = pwrite(x->fd, p + off, len - off, (off_t)(x->have + off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return x->write_failed = true, 0;
        off += (size_t)w;
    }
    EVP_DigestUpdate(x->md, p, len);
    x->have += len;
    x->pr->done += len;
    return len;
}

/* (Re)issues x's request for the bytes after x->have and adds it to m. */
static int xfer_request(hub_ctx *h, CURLM *m, xfer *x, char *err, size_t errlen)
{
    if (!x->c && !(x->c = curl_easy_init()))
        return fail(MODEL_ERR_DISK, err, errlen, "out of memory starting the download of %s.", x->f->name);
    curl_easy_reset(x->c);
    memset(&x->rp, 0, sizeof x->rp);
    x->started = false;
    easy_common(h, x->c, x->url, &x->rp);
    curl_easy_setopt(x->c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(x->c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->c, CURLOPT_PRIVATE, x);
    char range[32];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)x->have);
    curl_easy_setopt(x->c, CURLOPT_RANGE, x->have ? range : NULL);
    if (curl_multi_add_handle(m, x->c) != CURLM_OK)
        return fail(MODEL_ERR_NET, err, errlen, "libcurl refused the download of %s.", x->f->name);
    return 0;
}

/* Opens x's .partial (keeping what an earlier run left) and hashes what it holds. */
static int xfer_open(hub_ctx *h, xfer *x, char *err, size_t errlen)
{
    if (util_pathf(x->final, sizeof x->final, "%s/%s", h->r->dir, x->f->name) ||
        util_pathf(x->part, sizeof x->part, "%s.partial", x->final) || resolve_url(h, x->f->name, x->url, sizeof x->url))
        return fail(MODEL_ERR_DISK, err, errlen, "%s/%s: path too long.", h->r->dir, x->f->name);
    x->fd = open(x->part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (x->fd < 0)
        return fail(MODEL_ERR_DISK, err, errlen, "%s: cannot create: %s; check the permissions of %s or set SPILL_HOME.",
                         x->part, strerror(errno), h->r->dir);
    if (flock(x->fd, LOCK_EX | LOCK_NB) != 0) /* two downloads of one file would interleave their bytes */
        return fail(MODEL_ERR_DISK, err, errlen,
                    "%s is being downloaded by another spill process; wait for it to finish, then run again.",
                    x->part);
    if (!(x->md = EVP_MD_CTX_new()))
        return fail(MODEL_ERR_DISK, err, errlen, "out of memory hashing %s.", x->f->name);
    md_restart(x);
    struct stat st;
    if (fstat(x->fd, &st) != 0)
        return fail(MODEL_ERR_DISK, err, errlen, "%s: cannot stat: %s.", x->part, strerror(errno));
    uint64_t len = (uint64_t)st.st_size;
    if (len > x->f->size) { /* longer than the file: not a prefix of it */
        if (ftruncate(x->fd, 0) != 0)
            return fail(MODEL_ERR_DISK, err, errlen, "%s: cannot truncate: %s.", x->part, strerror(errno));
        len = 0;
    }
    static char buf[1 << 20];
    while (x->have < len) {
        ssize_t r = pread(x->fd, buf, sizeof buf < len - x->have ? sizeof buf : len - x->have, (off_t)x->have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return fail(MODEL_ERR_DISK, err, errlen, "%s: read failed at offset %llu: %s.", x->part,
                             (unsigned long long)x->have, r < 0 ? strerror(errno) : "file shrank");
        EVP_DigestUpdate(x->md, buf, (size_t)r);
        x->have += (uint64_t)r;
    }
    return 0;
}

/* x holds all its bytes (broken: more than listed): 0 when they check and the file has its own name, 1 when they did not and x starts over
 * (once), else an error. */
static int xfer_finish(xfer *x, bool broken, char *err, size_t errlen)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    EVP_DigestFinal_ex(x->md, d, &dl);
    for (unsigned i = 0; i < dl; i++)
        sprintf(hex + 2 * i, "%02x", d[i]);
    hex[2 * dl] = 0;
    const char *want = x->f->sha256[0] ? x->f->sha256 : x->f->blob;
    if (broken || (want[0] && strcmp(hex, want))) {
        if (ftruncate(x->fd, 0) != 0 || unlink(x->part) != 0) {
            fail(MODEL_ERR_DISK, err, errlen, "%s: cannot remove the broken download: %s.", x->part, strerror(errno));
            return MODEL_ERR_DISK;
        }
        if (!x->refetched) {
            fprintf(stderr, "spill: %s failed its %s check (got %.12s…, the hub lists %.12s…); removed, fetching it "
                            "again.\n",
                    x->f->name, x->f->sha256[0] ? "SHA-256" : "git blob", hex, want);
            x->refetched = true;
            x->pr->done -= x->have;
            x->have = 0;
            close(x->fd);
            x->fd = open(x->part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            md_restart(x);
            return x->fd < 0 ? (util_errf(err, errlen, "%s: cannot create: %s.", x->part, strerror(errno)))
                             : 1;
        }
        util_errf(err, errlen,
                  "%s: the download's %s is %s, not the %s the hub lists, twice; the file was removed — the hub "
                  "(or a proxy) serves a broken copy: try again later or another HF_ENDPOINT.",
                  x->final, x->f->sha256[0] ? "SHA-256" : "git blob SHA-1", hex, want);
        return MODEL_ERR_IO;
    }
    if (fsync(x->fd) != 0 || rename(x->part, x->final) != 0) {
        fail(MODEL_ERR_DISK, err, errlen, "%s: cannot finish the download: %s; check the disk.", x->final, strerror(errno));
        return MODEL_ERR_DISK;
    }
    return 0;
}

static bool transient(CURLcode cc, long status)
{
    return cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR || cc == CURLE_GOT_NOTHING ||
           cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_HTTP2 || cc == CURLE_HTTP2_STREAM ||
           (cc == CURLE_OK && (status == 500 || status == 502 || status == 503 || status == 504));
}

/* A finished request of x: 0 done, 1 x was re-requested, else an error. */
static int xfer_done(hub_ctx *h, CURLM *m, xfer *x, CURLcode cc, char *err, size_t errlen)
{
    curl_multi_remove_handle(m, x->c);
    if (!x->started)
        curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &x->rp.status);
    if (x->write_failed) {
        util_errf(err, errlen, "%s: cannot write: %s; free disk space (or set SPILL_HOME) and run again: what "
                               "arrived is kept.", x->part, strerror(errno));
        return MODEL_ERR_DISK;
    }
    bool broken = x->oversize; /* more bytes than the list says: a broken copy, like a checksum mismatch */
    if (broken || (cc == CURLE_OK && (x->rp.status == 200 || x->rp.status == 206) && x->have == x->f->size)) {
        x->oversize = false;
        int fr = xfer_finish(x, broken, err, errlen);
        if (fr != 1)
            return fr;
        return xfer_request(h, m, x, err, errlen) ? MODEL_ERR_NET : 1;
    }
    if (cc == CURLE_OK && x->rp.status != 200 && x->rp.status != 206 && !transient(cc, x->rp.status))
        return status_error(h, x->f->name, &x->rp, err, errlen);
    if ((transient(cc, x->rp.status) || cc == CURLE_OK) && x->retries < HUB_RETRIES) {
        x->retries++;
        return xfer_request(h, m, x, err, errlen) ? MODEL_ERR_NET : 1;
    }
    if (unreachable(cc) || transient(cc, x->rp.status)) {
        util_errf(err, errlen,
                  "lost the model hub at %s while downloading %s (%s); what arrived is kept in %s and the next run "
                  "resumes it — or work offline: copy the repository to %s and run with HF_HUB_OFFLINE=1.",
                  h->endpoint, x->f->name, cc ? curl_easy_strerror(cc) : "the file ended early", x->part, h->r->dir);
        return MODEL_ERR_NET;
    }
    util_errf(err, errlen, "downloading %s from %s failed: %s; try again later.", x->f->name, h->endpoint,
              curl_easy_strerror(cc));
    return MODEL_ERR_NET;
}

/* Bytes still to fetch of f: 0 when its checked file is here, else its size less what its .partial holds. */
static uint64_t still_needed(const hub_ctx *h, const hub_file *f)
{
    char p[4096];
    struct stat st;
    if (util_pathf(p, sizeof p, "%s/%s", h->r->dir, f->name) == 0 && stat(p, &st) == 0 &&
        (uint64_t)st.st_size == f->size)
        return 0;
    if (util_pathf(p, sizeof p, "%s/%s.partial", h->r->dir, f->name) == 0 && stat(p, &st) == 0 &&
        (uint64_t)st.st_size <= f->size)
        return f->size - (uint64_t)st.st_size;
    return f->size;
}

/* Downloads files[0..n) into the directory, HUB_PARALLEL at a time, with the progress line when `label`. */
static int transfer(hub_ctx *h, hub_file *const *files, size_t n, const char *label, char *err, size_t errlen)
{
    if (n == 0)
        return 0;
    xfer *xs = calloc(n, sizeof *xs);
    CURLM *m = curl_multi_init();
    progress pr = {.t0 = now_s(), .tty = isatty(STDERR_FILENO), .label = label, .quarter = 0};
    int rc = 0;
    if (!xs || !m) {
        rc = util_errf(err, errlen, "out of memory starting the downloads of %s.", h->r->spec);
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!still_needed(h, files[i]))
            continue; /* checked and renamed by an earlier run */
        xs[k].fd = -1;
        xs[k].f = files[i];
        xs[k].pr = &pr;
        pr.total += files[i]->size;
        k++;
    }
    n = k;
    size_t next = 0, active = 0;
    bool announced = false;
    while (!rc && (next < n || active)) {
        while (!rc && active < HUB_PARALLEL && next < n) {
            xfer *x = &xs[next++];
            if ((rc = xfer_open(h, x, err, errlen)))
                break;
            pr.done += x->have;
            pr.done0 += x->have;
            if (x->have == x->f->size) { /* an earlier run got every byte but stopped before the check */
                int fr = xfer_finish(x, false, err, errlen);
                if (fr <= 0) {
                    rc = fr;
                    continue;
                }
            }
            if ((rc = xfer_request(h, m, x, err, errlen)))
                break;
            active++;
        }
        if (label && !announced && !pr.tty) {
            char t[32];
            size_human(pr.total, t, sizeof t);
            fprintf(stderr, "spill: %s: %zu file%s, %s, into %s\n", label, n, n == 1 ? "" : "s", t, h->r->dir);
            announced = true;
        }
        int running = 0;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int q;
        while (!rc && (msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            xfer *x = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            int dr = xfer_done(h, m, x, msg->data.result, err, errlen);
            if (dr < 0)
                rc = dr;
            else if (dr == 0)
                active--;
        }
        if (label)
            progress_draw(&pr, false);
        if (!rc && active)
            curl_multi_poll(m, NULL, 0, 200, NULL);
    }
    if (label && !rc)
        progress_draw(&pr, true);
    else if (label && pr.tty)
        fputc('\n', stderr);
out:
    for (size_t i = 0; xs && i < n; i++) {
        if (xs[i].c) {
            curl_multi_remove_handle(m, xs[i].c);
            curl_easy_cleanup(xs[i].c);
        }
        if (xs[i].fd >= 0)
            close(xs[i].fd);
        EVP_MD_CTX_free(xs[i].md);
    }
    curl_multi_cleanup(m);
    free(xs);
    return rc;
}

/* ---------------------------------------------------------------- what a run needs */

static int mkdirs(const char *dir, char *err, size_t errlen)
{
    char p[4096];
    if (util_pathf(p, sizeof p, "%s", dir))
        return fail(MODEL_ERR_DISK, err, errlen, "%s: path too long.", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s)
            continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return fail(MODEL_ERR_DISK, err, errlen, "%s: cannot create the directory: %s; check the permissions or set "
                             "SPILL_HOME.", p, strerror(errno));
        *s = c;
        if (!c)
            return 0;
    }
}

/* Refuses a download of `need` more bytes that the disk under the directory cannot hold. */
static int disk_check(hub_ctx *h, uint64_t need, char *err, size_t errlen)
{
    uint64_t avail;
    const char *t = getenv("SPILL_TEST_FREE_BYTES"); /* tests stand in for the free space */
    struct statvfs vs;
    if (t && *t)
        avail = strtoull(t, NULL, 10);
    else if (statvfs(h->r->dir, &vs) == 0)
        avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    else
        return 0;
    if (need <= avail)
        return 0;
    char n[32], a[32];
    size_human(need, n, sizeof n);
    size_human(avail, a, sizeof a);
    util_errf(err, errlen,
              "%s needs %s more on the disk of %s, which has %s free; nothing large was downloaded: free space, or "
              "set SPILL_HOME to a larger disk.",
              h->r->spec, n, h->r->dir, a);
    return MODEL_ERR_DISK;
}

/* Writes the finished download's record (repo, revision, commit, files) and drops the in-progress marker. */
static int write_meta(hub_ctx *h, const repo_info *ri, hub_file *const *files, size_t n, char *err, size_t errlen)
{
    json_t *fs = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(fs, json_pack("{s:s,s:I,s:s}", "name", files[i]->name, "size",
                                            (json_int_t)files[i]->size, files[i]->sha256[0] ? "sha256" : "git_blob",
                                            files[i]->sha256[0] ? files[i]->sha256 : files[i]->blob));
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:o}", "repo", h->r->repo, "revision", h->r->rev, "commit", ri->commit,
                          "endpoint", h->endpoint, "files", fs);
    char *s = json_dumps(o, JSON_INDENT(1));
    json_decref(o);
    char p[4096];
    int rc = !s || util_pathf(p, sizeof p, "%s/" META, h->r->dir) || util_write_atomic(p, s, strlen(s), err, errlen);
    free(s);
    if (rc)
        return MODEL_ERR_DISK;
    if (util_pathf(p, sizeof p, "%s/" PENDING, h->r->dir) == 0)
        unlink(p);
    return 0;
}

static void list_ggufs(const repo_info *ri, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < ri->n && o + 4 < cap; i++) {
        size_t l = strlen(ri->files[i].name);
        if (l > 5 && !strcasecmp(ri->files[i].name + l - 5, ".gguf"))
            o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? ", " : "", ri->files[i].name);
    }
    if (o >= cap)
        snprintf(out + cap - 4, 4, "...");
}

static int refuse_arch(hub_ctx *h, const char *arch, const char *source, char *err, size_t errlen)
{
    const char *note;
    enum arch_state st = model_arch_state(arch, &note);
    if (st != ARCH_UNSUPPORTED)
        return 0;
    fail(MODEL_ERR_MISSING, err, errlen, "%s is a '%s' model (%s), which spill does not run: %s Nothing was downloaded.",
              h->r->spec, arch, source, note);
    return MODEL_ERR_DATA;
}

static int fetch_gguf(hub_ctx *h, repo_info *ri, char *path, size_t cap, char *err, size_t errlen)
{
    hub_file *f = NULL;
    char names[1024];
    list_ggufs(ri, names, sizeof names);
    if (h->r->file[0] && !(f = info_find(ri, h->r->file)))
        return util_errf(err, errlen, "%s@%s has no file %s (it has: %s); the curated tag is out of date.", h->r->repo,
                         h->r->rev, h->r->file, names[0] ? names : "no .gguf file");
    for (size_t i = 0; !f && i < ri->n; i++)
        if (carries_quant(ri->files[i].name, h->r->quant)) {
            for (size_t j = i + 1; j < ri->n; j++)
                if (carries_quant(ri->files[j].name, h->r->quant))
                    return util_errf(err, errlen,
                                     "%s has several %s files (%s and %s): a split GGUF, which spill does not read; "
                                     "merge it with llama.cpp's gguf-split --merge, or pick another quant of: %s.",
                                     h->r->repo, h->r->quant, ri->files[i].name, ri->files[j].name, names),
                           MODEL_ERR_DATA;
            f = &ri->files[i];
        }
    if (!f)
        return fail(MODEL_ERR_MISSING, err, errlen, "%s@%s has no .gguf file for %s; it has: %s.", h->r->repo, h->r->rev,
                         h->r->quant, names[0] ? names : "no .gguf file at all");
    int rc;
    if (ri->gguf_arch[0] && (rc = refuse_arch(h, model_arch_normalise(ri->gguf_arch), "the hub's gguf.architecture",
                                              err, errlen)))
        return rc;
    char sz[32];
    size_human(f->size, sz, sizeof sz);
    fprintf(stderr, "spill: %s (commit %.12s): %s, %s%s%s\n", h->r->spec, ri->commit, f->name, sz,
            ri->gguf_arch[0] ? ", architecture " : "", ri->gguf_arch);
    if ((rc = mkdirs(h->r->dir, err, errlen)) || (rc = disk_check(h, still_needed(h, f), err, errlen)))
        return rc;
    char label[512];
    snprintf(label, sizeof label, "%s", f->name);
    if ((rc = transfer(h, &f, 1, label, err, errlen)) || (rc = write_meta(h, ri, &f, 1, err, errlen)))
        return rc;
    return util_pathf(path, cap, "%s/%s", h->r->dir, f->name) ? MODEL_ERR_DISK : 0;
}

static bool is_weight_shard(const char *name)
{
    size_t l = strlen(name);
    return l > 12 && !strcmp(name + l - 12, ".safetensors") && strncmp(name, "consolidated", 12);
}

/* The files of a run: the small ones the repo has, then the shards the index names (else every shard). */
static int pick_files(hub_ctx *h, repo_info *ri, hub_file ***out, size_t *n, char *err, size_t errlen)
{
    static const char *const small[] = {"config.json",           "generation_config.json",
                                        "tokenizer.json",        "tokenizer_config.json",
                                        "chat_template.jinja",   "model.safetensors.index.json"};
    hub_file **v = calloc(ri->n + 1, sizeof *v);
    if (!v)
        return fail(MODEL_ERR_DISK, err, errlen, "out of memory listing %s.", h->r->spec);
    size_t k = 0;
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        hub_file *f = info_find(ri, small[i]);
        if (f)
            v[k++] = f;
    }
    json_t *map = NULL;
    char ip[4096];
    if (info_find(ri, "model.safetensors.index.json") &&
        util_pathf(ip, sizeof ip, "%s/model.safetensors.index.json", h->r->dir) == 0) {
        json_t *idx = json_load_file(ip, 0, NULL);
        map = json_incref(json_object_get(idx, "weight_map"));
        json_decref(idx);
    }
    size_t shards = 0;
    for (size_t i = 0; i < ri->n; i++) {
        hub_file *f = &ri->files[i];
        if (!is_weight_shard(f->name))
            continue;
        bool named = !map;
        const char *key;
        json_t *val;
        json_object_foreach(map, key, val) if (!named && json_is_string(val) && !strcmp(json_string_value(val), f->name))
            named = true;
        if (named) {
            v[k++] = f;
            shards++;
        }
    }
    json_decref(map);
    *out = v;
    *n = k;
    if (!shards) {
        char names[1024];
        list_ggufs(ri, names, sizeof names);
        return fail(MODEL_ERR_DATA, err, errlen, "%s@%s has no safetensors weights%s%s%s; spill reads safetensors or one GGUF "
                         "file.", h->r->repo, h->r->rev, names[0] ? "; name one GGUF file instead, as " : "",
                         names[0] ? h->r->repo : "", names[0] ? ":QUANT" : "");
    }
    if (!info_find(ri, "tokenizer.json"))
        return fail(MODEL_ERR_DATA, err, errlen, "%s@%s has no tokenizer.json, the tokenizer file spill reads; use a repo that "
                         "ships it (most do), or a GGUF of the model.", h->r->repo, h->r->rev);
    return 0;
}

/* Removes what a refused download left: the marker and config.json, and the directory when this run made it. */
static void undo_dir(hub_ctx *h, bool made)
{
    static const char *const left[] = {PENDING, "config.json", "model.safetensors.index.json"};
    char p[4096];
    for (size_t i = 0; made && i < sizeof left / sizeof left[0]; i++)
        if (util_pathf(p, sizeof p, "%s/%s", h->r->dir, left[i]) == 0)
            unlink(p);
    if (made)
        rmdir(h->r->dir);
}

static int fetch_hf(hub_ctx *h, repo_info *ri, char *path, size_t cap, char *err, size_t errlen)
{
    hub_file *cfg = info_find(ri, "config.json");
    if (!cfg) {
        char names[1024];
        list_ggufs(ri, names, sizeof names);
        if (names[0])
            return fail(MODEL_ERR_MISSING, err, errlen, "%s is a GGUF repo (no config.json); name one file as %s:QUANT, from: %s.",
                             h->r->repo, h->r->repo, names);
        return fail(MODEL_ERR_DATA, err, errlen, "%s@%s has no config.json: not a transformers model repo spill can run.",
                         h->r->repo, h->r->rev);
    }
    bool made = !util_is_dir(h->r->dir);
    int rc;
    char p[4096];
    if ((rc = mkdirs(h->r->dir, err, errlen)))
        return rc;
    if (util_pathf(p, sizeof p, "%s/" PENDING, h->r->dir) == 0 && !util_is_file(p) &&
        util_write_atomic(p, ri->commit, strlen(ri->commit), err, errlen))
        return MODEL_ERR_DISK;
    hub_file **files = NULL;
    size_t n = 0;
    json_t *c = NULL;
    hub_file *index = info_find(ri, "model.safetensors.index.json");
    hub_file *first[2] = {cfg, index};
    if ((rc = transfer(h, first, index ? 2 : 1, NULL, err, errlen)))
        goto out;
    json_error_t je;
    if (util_pathf(p, sizeof p, "%s/config.json", h->r->dir) || !(c = json_load_file(p, 0, &je))) {
        rc = (fail(MODEL_ERR_DATA, err, errlen, "%s: line %d: %s; the repo's config.json is not JSON.", p, je.line, je.text));
        undo_dir(h, made);
        goto out;
    }
    model_shape s;
    if (model_shape_from_config(c, p, &s, err, errlen)) {
        rc = MODEL_ERR_DATA;
        undo_dir(h, made);
        goto out;
    }
    if ((rc = refuse_arch(h, s.arch, "config.json model_type", err, errlen))) {
        undo_dir(h, made);
        goto out;
    }
    if ((rc = pick_files(h, ri, &files, &n, err, errlen))) {
        undo_dir(h, made);
        goto out;
    }
    uint64_t need = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        need += still_needed(h, files[i]);
        total += files[i]->size;
    }
    const char *note;
    enum arch_state st = model_arch_state(s.arch, &note);
    char q[SIZE_N_QUANTS][32], t[32], pc[32];
    for (int k = 0; k < SIZE_N_QUANTS; k++)
        size_human(model_size_estimate(&s, (enum size_quant)k), q[k], sizeof q[k]);
    size_human(total, t, sizeof t);
    double np = (double)model_param_count(&s);
    snprintf(pc, sizeof pc, np >= 1e9 ? "%.3gB" : np >= 1e6 ? "%.3gM" : "%.3gk", np >= 1e9 ? np / 1e9 : np >= 1e6 ? np / 1e6 : np / 1e3);
    fprintf(stderr, "spill: %s (commit %.12s): %s (%s), %s weights: bf16 %s, q8 %s, q4 %s; %zu files, %s\n",
            h->r->spec, ri->commit, s.arch, st == ARCH_SUPPORTED ? "supported" : "expected", pc, q[SIZE_BF16],
            q[SIZE_Q8], q[SIZE_Q4], n, t);
    if ((rc = disk_check(h, need, err, errlen))) {
        undo_dir(h, made);
        goto out;
    }
    if ((rc = transfer(h, files, n, h->r->spec, err, errlen)) || (rc = write_meta(h, ri, files, n, err, errlen)))
        goto out;
    rc = util_pathf(path, cap, "%s", h->r->dir) ? MODEL_ERR_DISK : 0;
out:
    json_decref(c);
    free(files);
    return rc;
}

int hub_fetch(const hub_ref *r, char *path, size_t cap, char *err, size_t errlen)
{
    hub_ctx h;
    repo_info ri = {0};
    int rc = ctx_open(&h, r, err, errlen);
    if (rc)
        return MODEL_ERR_NET;
    if (!(rc = get_info(&h, &ri, err, errlen)))
        rc = r->quant[0] || r->file[0] ? fetch_gguf(&h, &ri, path, cap, err, errlen)
                                       : fetch_hf(&h, &ri, path, cap, err, errlen);
    free(ri.files);
    ctx_close(&h);
    return rc;
}

int hub_fetch_config(const hub_ref *r, json_t **config, char *err, size_t errlen)
{
    hub_ctx h;
    *config = NULL;
    if (ctx_open(&h, r, err, errlen))
        return MODEL_ERR_NET;
    char url[4096], what[512];
    reply rp;
    int rc = resolve_url(&h, "config.json", url, sizeof url) ? util_errf(err, errlen, "%s: too long.", r->spec) : 0;
    snprintf(what, sizeof what, "%s@%s's config.json", r->repo, r->rev);
    if (!rc)
        rc = get_json(&h, url, what, config, &rp, err, errlen);
    ctx_close(&h);
    return rc;
}
