/*
 * progress.c — one running job as the status pages show it (progress.h): counts from the job's manifest, its
 * passes from a --pass-log CSV (read whole each time: a job of 100,000 passes is ~6 MB, read in a few ms, and a
 * page polls once a second), the two charts drawn by svg.c into memory, the tail of results.jsonl read from its
 * last 64 KiB.  Every file is read as it is at that moment: a pass line or result line being written (no newline
 * yet) is left for the next poll.
 *
 * status_server: libmicrohttpd's internal polling thread on 127.0.0.1 only, two routes, a 5 s connection timeout
 * and at most 16 connections; the key compared in constant time (serve_key_equal).
 */
#include "progress.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "../base/util.h"
#include "../batch/job.h"
#include "../batch/svg.h"
#include "serve.h"

#define CHART_PASSES 400
#define TAIL_ROWS 8
#define TAIL_BYTES (64 * 1024)
#define TEXT_CUT 200

typedef struct pass_pt {
    double pass, seconds, tok_s, rows, rss, kv;
} pass_pt;

/* The passes of a --pass-log CSV (header skipped, a line without its newline ignored); *n of them. */
static pass_pt *read_passes(const char *path, size_t *n)
{
    *n = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return NULL;
    size_t cap = 0;
    pass_pt *v = NULL;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (!len || line[len - 1] != '\n')
            break; /* being written */
        int p, seqs, dec, pre, kv;
        double s, el;
        unsigned long long rss;
        if (sscanf(line, "%d,%d,%d,%d,%lf,%lf,%llu,%d", &p, &seqs, &dec, &pre, &s, &el, &rss, &kv) != 8)
            continue; /* the header */
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 256;
            pass_pt *t = realloc(v, nc * sizeof *t);
            if (!t)
                break;
            v = t;
            cap = nc;
        }
        v[(*n)++] = (pass_pt){p, s, s > 0 ? dec / s : 0, seqs, (double)rss, kv};
    }
    fclose(f);
    return v;
}

/* One line chart of y over the pass number, as an SVG string ("" when there are no points). */
static char *chart(const pass_pt *p, size_t n, bool tok_s, const char *title, const char *ylab)
{
    if (!n)
        return strdup("");
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = x && y ? open_memstream(&buf, &len) : NULL;
    if (f) {
        for (size_t i = 0; i < n; i++) {
            x[i] = p[i].pass;
            y[i] = tok_s ? p[i].tok_s : p[i].seconds;
        }
        svg_series se = {tok_s ? "tok/s" : "seconds", (int)n, x, y, NULL};
        char cap[160];
        snprintf(cap, sizeof cap, "passes %.0f to %.0f", p[0].pass, p[n - 1].pass);
        const char *caps[1] = {cap};
        svg_chart c = {title, "pass", ylab, SVG_LINEAR, SVG_LINEAR, &se, 1, caps, 1};
        svg_chart_write(f, &c);
        fclose(f);
    }
    free(x), free(y);
    return buf ? buf : strdup("");
}

/* s cut to at most cap bytes, not inside a UTF-8 sequence. */
static json_t *cut_text(const char *s)
{
    size_t n = strlen(s);
    if (n > TEXT_CUT) {
        n = TEXT_CUT;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    return json_stringn_nocheck(s, n);
}

/* One results.jsonl line as the tail shows it. */
static json_t *tail_row(const char *line, size_t len)
{
    json_t *j = json_loadb(line, len, 0, NULL);
    if (!j)
        return NULL;
    json_t *resp = json_object_get(j, "response"), *body = json_object_get(resp, "body");
    json_t *ch = json_array_get(json_object_get(body, "choices"), 0);
    const char *text = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    if (!text)
        text = json_string_value(json_object_get(ch, "text"));
    if (!text)
        text = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    if (!text)
        text = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
    json_t *r = json_object();
    json_object_set(r, "custom_id", json_object_get(j, "custom_id"));
    json_object_set(r, "status_code", json_object_get(resp, "status_code"));
    json_object_set(r, "finish_reason", json_object_get(ch, "finish_reason"));
    json_object_set_new(r, "text", cut_text(text ? text : ""));
    json_decref(j);
    return r;
}

/* The last TAIL_ROWS complete lines of results.jsonl, oldest first. */
static json_t *read_tail(const char *jobdir)
{
    json_t *a = json_array();
    char p[4200];
    snprintf(p, sizeof p, "%s/results.jsonl", jobdir);
    FILE *f = fopen(p, "rb");
    if (!f)
        return a;
    char *buf = malloc(TAIL_BYTES + 1);
    size_t n = 0;
    if (buf && fseeko(f, 0, SEEK_END) == 0) {
        off_t end = ftello(f), from = end > TAIL_BYTES ? end - TAIL_BYTES : 0;
        if (fseeko(f, from, SEEK_SET) == 0)
            n = fread(buf, 1, TAIL_BYTES, f);
    }
    fclose(f);
    if (!buf)
        return a;
    while (n && buf[n - 1] != '\n') /* a line being written */
        n--;
    size_t starts[TAIL_ROWS + 1], k = 0, e = n;
    /* walk back over complete lines; the first one in the buffer may be cut, so it counts only from offset 0 */
    while (e > 0 && k < TAIL_ROWS) {
        size_t s = e - 1;
        while (s > 0 && buf[s - 1] != '\n')
            s--;
        if (s == 0 && n == TAIL_BYTES)
            break;
        starts[k++] = s;
        e = s;
    }
    for (size_t i = k; i-- > 0;) {
        size_t s = starts[i], l = 0;
        while (s + l < n && buf[s + l] != '\n')
            l++;
        json_t *r = tail_row(buf + s, l);
        if (r)
            json_array_append_new(a, r);
    }
    free(buf);
    return a;
}

json_t *progress_json(const char *jobdir, const char *pass_csv, const char *plan_line, unsigned long long total)
{
    json_t *o = json_object();
    job_stored st = {0};
    char err[SPILL_ERRLEN];
    json_t *counts = json_pack("{s:I,s:I,s:I}", "total", (json_int_t)total, "completed", (json_int_t)0, "failed",
                               (json_int_t)0);
    if (!job_read_stored(jobdir, &st, err, sizeof err)) {
        json_object_set_new(counts, "completed", json_integer((json_int_t)st.rows_completed));
        json_object_set_new(counts, "failed", json_integer((json_int_t)st.rows_failed));
    }
    job_stored_free(&st);
    json_object_set_new(o, "counts", counts);
    json_object_set_new(o, "plan", json_string(plan_line && util_utf8_valid(plan_line, strlen(plan_line)) ? plan_line : ""));
    size_t n = 0;
    pass_pt *p = read_passes(pass_csv, &n);
    json_object_set_new(o, "passes", json_integer((json_int_t)n));
    if (n) {
        const pass_pt *l = &p[n - 1];
        json_object_set_new(o, "last_pass",
                            json_pack("{s:f,s:f,s:I,s:I,s:I}", "seconds", l->seconds, "tok_s", l->tok_s, "rows",
                                      (json_int_t)l->rows, "rss_bytes", (json_int_t)l->rss, "kv_pages", (json_int_t)l->kv));
    }
    size_t from = n > CHART_PASSES ? n - CHART_PASSES : 0;
    char *cs = chart(p + from, n - from, false, "seconds per pass", "s");
    char *ct = chart(p + from, n - from, true, "tokens per second", "tok/s");
    json_object_set_new(o, "chart_seconds", json_string(cs ? cs : ""));
    json_object_set_new(o, "chart_tok_s", json_string(ct ? ct : ""));
    free(cs), free(ct);
    free(p);
    json_object_set_new(o, "tail", read_tail(jobdir));
    return o;
}

void progress_plan_from_log(const char *path, char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "spill run: ", 11) && strncmp(line, "spill resume: ", 14))
            continue;
        line[strcspn(line, "\n")] = 0;
        snprintf(out, cap, "%s", line);
    }
    fclose(f);
}

/* ---------------------------------------------------------------- spill run --status-port */

extern const char serve_job_page[];

struct status_server {
    struct MHD_Daemon *d;
    char key[33];
    const char *jobdir, *pass_csv, *plan;
    unsigned long long total;
};

static enum MHD_Result on_status(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **ctx)
{
    status_server *s = cls;
    if (strcmp(method, "GET"))
        return serve_reply(c, 405, "application/json", strdup("{\"error\":{\"message\":\"Only GET is served here.\"}}"));
    if (!strcmp(url, "/"))
        return serve_reply(c, 200, "text/html; charset=utf-8", strdup(serve_job_page));
    if (strcmp(url, "/progress"))
        return serve_reply(c, 404, "application/json", strdup("{\"error\":{\"message\":\"No such page: / and /progress.\"}}"));
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) || !serve_key_equal(h + 7, s->key))
        return serve_reply(c, 401, "application/json",
                     strdup("{\"error\":{\"message\":\"The key the run printed is needed: open the URL it gave.\"}}"));
    json_t *j = progress_json(s->jobdir, s->pass_csv, s->plan, s->total);
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return serve_reply(c, 200, "application/json", body ? body : strdup("{}"));
}

status_server *status_server_start(int port, const char *jobdir, const char *pass_csv, const char *plan_line,
                                   unsigned long long total, char *key, size_t cap, char *err, size_t errlen)
{
    unsigned char rnd[16];
    if (port <= 0 || port > 65535 || cap < 33) {
        util_errf(err, errlen, "--status-port %d is not a port (1-65535).", port);
        return NULL;
    }
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        util_errf(err, errlen, "no random bytes for the status page's key.");
        return NULL;
    }
    status_server *s = calloc(1, sizeof *s);
    if (!s) {
        util_errf(err, errlen, "out of memory starting the status page.");
        return NULL;
    }
    for (int i = 0; i < 16; i++)
        snprintf(s->key + 2 * i, 3, "%02x", rnd[i]);
    s->jobdir = jobdir;
    s->pass_csv = pass_csv;
    s->plan = plan_line;
    s->total = total;
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL, NULL,
                            on_status, s, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_TIMEOUT, 5u,
                            MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_END);
    if (!s->d) {
        util_errf(err, errlen, "the status page cannot listen on 127.0.0.1:%d (in use?); pick another --status-port.",
                  port);
        free(s);
        return NULL;
    }
    snprintf(key, cap, "%s", s->key);
    return s;
}

void status_server_stop(status_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    free(s);
}
