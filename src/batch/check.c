/*
 * check.c — file-level validation of input JSONL (see check.h for the rules,
 * the order errors are reported in, and the exit codes).
 *
 * Owns the cross-line state of one pass: the format and model of the
 * first line that set them, and a set of every custom_id seen with its line
 * (open addressing, FNV-1a, grown at half load) so a duplicate names both
 * lines; the runner's input reader uses the same set (check_ids).  Memory is that set plus one line (jsonl_reader) plus one parsed
 * request at a time.  Line-level rules are request.c's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"
#include "../base/exit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- custom_id set ----------------------------------------------------------------------------------- */

typedef struct check_id_slot {
    char *id; /* owned; NULL = empty slot */
    uint64_t hash;
    size_t line;
} id_slot;

typedef check_ids id_set;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static id_slot *id_find(id_slot *slots, size_t cap, const char *id, uint64_t h)
{
    size_t i = (size_t)h & (cap - 1);
    while (slots[i].id && (slots[i].hash != h || strcmp(slots[i].id, id) != 0))
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

static int id_grow(id_set *s)
{
    size_t cap = s->cap ? s->cap * 2 : 1024, bytes;
    if (!ck_mul_size(cap, sizeof(id_slot), &bytes))
        return -1;
    id_slot *ns = calloc(cap, sizeof(id_slot));
    if (!ns)
        return -1;
    for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i].id)
            *id_find(ns, cap, s->slots[i].id, s->slots[i].hash) = s->slots[i];
    free(s->slots);
    s->slots = ns;
    s->cap = cap;
    return 0;
}

long long check_ids_add(id_set *s, const char *id, size_t line)
{
    if ((s->n + 1) * 2 > s->cap && id_grow(s))
        return -1;
    uint64_t h = fnv1a(id);
    id_slot *slot = id_find(s->slots, s->cap, id, h);
    if (slot->id)
        return (long long)slot->line;
    slot->id = strdup(id);
    if (!slot->id)
        return -1;
    slot->hash = h;
    slot->line = line;
    s->n++;
    return 0;
}

void check_ids_free(id_set *s)
{
    for (size_t i = 0; i < s->cap; i++)
        free(s->slots[i].id);
    free(s->slots);
    memset(s, 0, sizeof *s);
}

/* ---- one pass ---------------------------------------------------------------------------------------- */

typedef struct pass {
    const char *name;
    const check_opts *o;
    check_report *r;
    FILE *out;
    id_set ids;
    size_t kind_line, model_line; /* where the file's format / model were set */
    char *model;                  /* owned copy */
    bool has_expected;
} pass;

/* Records one error sentence: prints it, keeps the first in the report. */
static void report_error(pass *p, size_t line, const char *code, const char *param, bool file_level,
                         const char *sentence)
{
    check_report *r = p->r;
    if (!r->first_error_code) {
        r->first_error_line = line;
        r->first_error_code = code;
        snprintf(r->first_error_param, sizeof r->first_error_param, "%s", param ? param : "");
        snprintf(r->first_error, sizeof r->first_error, "%s", sentence);
    }
    if (file_level)
        r->file_errors++;
    if (p->out)
        fprintf(p->out, "%s\n", sentence);
}

__attribute__((format(printf, 6, 7))) static void errorf(pass *p, size_t line, const char *code, const char *param,
                                                         bool file_level, const char *fmt, ...)
{
    char msg[SPILL_ERRLEN];
    int n =
        line ? snprintf(msg, sizeof msg, "%s line %zu: ", p->name, line) : snprintf(msg, sizeof msg, "%s: ", p->name);
    if (n >= 0 && (size_t)n < sizeof msg) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
        va_end(ap);
    }
    report_error(p, line, code, param, file_level, msg);
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t')
            return false;
    return true;
}

static bool is_eval(req_kind k)
{
    return k == REQ_KIND_EVAL_BATCH || k == REQ_KIND_EVAL_FINETUNE;
}
static bool is_batch(req_kind k)
{
    return k == REQ_KIND_BATCH || k == REQ_KIND_EVAL_BATCH;
}

/* A JSON string literal of s, cut to ~60 bytes, for sentences (escapes quotes and control bytes). */
static void quoted(const char *s, char out[80])
{
    json_t *j = json_string(s);
    char *d = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    if (!d)
        snprintf(out, 80, "\"?\"");
    else if (strlen(d) > 60) {
        size_t n = 56;
        while (n > 0 && ((unsigned char)d[n] & 0xC0) == 0x80)
            n--;
        snprintf(out, 80, "%.*s\xE2\x80\xA6\"", (int)n, d);
    } else
        snprintf(out, 80, "%s", d);
    free(d);
    json_decref(j);
}

/*
 * The rules that need earlier lines.  Reports at most one error for the line
 * (none when `report` is false: the line already has its one error) and
 * returns 1 when it did, 0 when not, -1 when out of memory.  Always records
 * the format, url, model and custom_id of this line for the lines after it.
 */
static int cross_line(pass *p, const request *q, bool report)
{
    check_report *r = p->r;
    size_t ln = q->line;
    bool quiet = !report;
    int reported = 0;
#define CROSS_ERROR(...)                                                                                               \
    do {                                                                                                               \
        if (!quiet) {                                                                                                  \
            errorf(p, ln, __VA_ARGS__);                                                                                \
            quiet = true;                                                                                              \
            reported = 1;                                                                                              \
        }                                                                                                              \
    } while (0)
    static const char batch_line[] = "an OpenAI batch line", ft_line[] = "a fine-tuning chat line ({\"messages\": …})";
    if (q->kind != REQ_KIND_UNKNOWN) {
        if (!p->kind_line) {
            p->kind_line = ln;
            r->kind = q->kind;
            r->endpoint = q->endpoint;
            p->has_expected = is_eval(q->kind);
        } else if (is_batch(q->kind) != is_batch(r->kind)) {
            CROSS_ERROR(
                "invalid_request", NULL, true, "this is %s, but line %zu is %s; a file must use one format throughout.",
                is_batch(q->kind) ? batch_line : ft_line, p->kind_line, is_batch(r->kind) ? batch_line : ft_line);
        } else if (is_eval(q->kind) != p->has_expected) {
            CROSS_ERROR("invalid_request", "expected", true,
                        "this line has %s \"expected\" field, but line %zu %s; give every line an expected answer, or "
                        "none.",
                        is_eval(q->kind) ? "an" : "no", p->kind_line, p->has_expected ? "has one" : "does not");
        }
    }
    if (q->custom_id) {
        long long prev = check_ids_add(&p->ids, q->custom_id, ln);
        if (prev < 0)
            return -1;
        if (prev > 0) {
            char qs[80];
            quoted(q->custom_id, qs);
            CROSS_ERROR("duplicate_custom_id", "custom_id", true,
                        "custom_id %s is already used on line %lld; every custom_id must be unique.", qs, prev);
        }
    }
    if (q->url && p->o->endpoint && strcmp(p->o->endpoint, q->url) != 0) {
        char a[80], b[80];
        quoted(q->url, a);
        quoted(p->o->endpoint, b);
        CROSS_ERROR("url_mismatch", is_batch(q->kind) ? "url" : NULL, true,
                    "url is %s, but --endpoint is %s; every line of this batch must use that endpoint.", a, b);
    }
    if (q->model) {
        if (!p->model_line) {
            if (!(p->model = strdup(q->model)))
                return -1;
            p->model_line = ln;
            snprintf(r->model, sizeof r->model, "%s", q->model);
            for (char *c = r->model; *c; c++) /* keep the OK line on one line */
                if ((unsigned char)*c < 0x20 || *c == 0x7f)
                    *c = '?';
        } else if (strcmp(p->model, q->model) != 0) {
            char a[80], b[80];
            quoted(q->model, a);
            quoted(p->model, b);
            CROSS_ERROR("model_mismatch", "body.model", true,
                        "body.model is %s, but line %zu uses %s; every line of a batch must name the same model.", a,
                        p->model_line, b);
        }
    }
#undef CROSS_ERROR
    return reported;
}

check_opts check_opts_default(void)
{
    return (check_opts){
        .all = false, .max_rows = CHECK_MAX_ROWS, .max_bytes = CHECK_MAX_BYTES, .max_line = 0, .endpoint = NULL};
}

/* 50000 → "50,000" */
static const char *grouped(uint64_t v, char buf[32])
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    int o = 0;
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

int check_stream(FILE *f, const char *name, const check_opts *o, check_report *r, FILE *out, char *err, size_t errlen)
{
    check_opts def = check_opts_default();
    if (!o)
        o = &def;
    memset(r, 0, sizeof *r);
    if (err && errlen)
        err[0] = 0;
    pass p = {.name = name, .o = o, .r = r, .out = out};
    jsonl_reader rd;
    int rc = CHECK_OK;
    if (jsonl_open(&rd, f, name, o->max_line, err, errlen))
        return CHECK_IOERR;
    bool stop = false, too_many = false, too_big = false;
    char n1[32], n2[32];
    while (!stop) {
        const char *line;
        size_t len;
        jsonl_status st = jsonl_next(&rd, &line, &len, err, errlen);
        if (st == JSONL_EOF)
            break;
        if (st == JSONL_IO_ERROR) {
            rc = CHECK_IOERR;
            goto out_close;
        }
        r->lines = rd.lineno;
        if (o->max_bytes && rd.offset > o->max_bytes && !too_big) {
            too_big = true;
            r->rows++;
            r->bad_rows++;
            errorf(&p, rd.lineno, "invalid_request", NULL, true,
                   "the file passes %s bytes here, the most one batch file may hold; split it into several files.",
                   grouped(o->max_bytes, n1));
            break;
        }
        if (st == JSONL_TOO_LONG) {
            r->rows++;
            r->bad_rows++;
            r->per_kind[REQ_KIND_UNKNOWN]++;
            errorf(&p, rd.lineno, "invalid_json_line", NULL, true,
                   "the line is longer than %s bytes, the limit for one request; shorten it.",
                   grouped(rd.max_line, n1));
            stop = !o->all;
            continue;
        }
        if (is_blank(line, len))
            continue;
        r->rows++;
        bool over = false; /* this row is the first past max_rows (--all keeps checking it and the rest) */
        if (o->max_rows && r->rows > o->max_rows && !too_many) {
            too_many = over = true;
            errorf(&p, rd.lineno, "too_many_tasks", NULL, true,
                   "the file has more than %s requests, the most one batch may hold; split it into several files.",
                   grouped(o->max_rows, n2));
            if (!o->all) {
                r->bad_rows++;
                break;
            }
        }
        request q;
        char perr[SPILL_ERRLEN];
        int prc = request_parse_line(line, len, rd.lineno, name, &q, perr, sizeof perr);
        r->per_kind[q.kind]++;
        bool bad = prc && q.err_file_level;
        if (bad)
            report_error(&p, q.line, q.err_code, q.err_param, true, perr);
        /* a bad line's id, url and model still count (so a later duplicate names this line), silently */
        int x = cross_line(&p, &q, !bad);
        if (x < 0) {
            request_free(&q);
            util_errf(err, errlen, "%s line %zu: out of memory recording custom_ids.", name, rd.lineno);
            rc = CHECK_IOERR;
            goto out_close;
        }
        if (!bad && x)
            bad = true;
        if (!bad && prc) {
            report_error(&p, q.line, q.err_code, q.err_param, false, perr);
            bad = true;
        }
        request_free(&q);
        if (bad || over)
            r->bad_rows++;
        else
            r->ok_rows++;
        if (bad && !o->all)
            stop = true;
    }
    if (r->rows == 0)
        errorf(&p, 0, "empty_file", NULL, true,
               "the file has no requests (it is empty or holds only blank lines); write one JSON object per line.");
    rc = r->first_error_code ? CHECK_INVALID : CHECK_OK;
    if (rc == CHECK_INVALID)
        snprintf(err, errlen, "%s", r->first_error);
out_close:
    jsonl_close(&rd);
    check_ids_free(&p.ids);
    free(p.model);
    return rc;
}

int check_file(const char *path, const check_opts *o, check_report *r, FILE *out, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        util_errf(err, errlen, "%s: cannot open: %s; check the path.", path, strerror(errno));
        goto out_noinput;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        util_errf(err, errlen, "%s: is a directory, not a JSONL file; name the file itself.", path);
        close(fd);
        goto out_noinput;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        util_errf(err, errlen, "%s: cannot open: %s.", path, strerror(errno));
        close(fd);
        goto out_noinput;
    }
    int rc = check_stream(f, path, o, r, out, err, errlen);
    fclose(f);
    return rc;
out_noinput:
    snprintf(r->first_error, sizeof r->first_error, "%s", err ? err : "");
    return CHECK_NOINPUT;
}

int check_exit_code(int rc)
{
    switch (rc) {
    case CHECK_OK:
        return 0;
    case CHECK_INVALID:
        return SPILL_EX_DATAERR;
    case CHECK_NOINPUT:
        return SPILL_EX_NOINPUT;
    default:
        return SPILL_EX_IOERR;
    }
}

int check_main(int argc, char **argv)
{
    static const char usage[] =
        "usage: spill check INPUT.jsonl [--all] [--endpoint URL]   (INPUT \"-\" reads stdin)\n";
    check_opts o = check_opts_default();
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0)
            o.all = true;
        else if (strcmp(argv[i], "--endpoint") == 0) {
            const char *u = i + 1 < argc ? argv[++i] : "";
            if (strcmp(u, "/v1/chat/completions") && strcmp(u, "/v1/completions") && strcmp(u, "/v1/embeddings")) {
                fprintf(stderr, "spill check: --endpoint takes /v1/chat/completions, /v1/completions or "
                                "/v1/embeddings, not \"%.60s\".\n", u);
                return SPILL_EX_USAGE;
            }
            o.endpoint = u;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (!path && (argv[i][0] != '-' || strcmp(argv[i], "-") == 0))
            path = argv[i];
        else {
            if (argv[i][0] == '-')
                fprintf(stderr, "spill: %s is not an option of spill check; spill check --help lists them.\n", argv[i]);
            fputs(usage, stderr);
            return SPILL_EX_USAGE;
        }
    }
    if (!path) {
        fputs(usage, stderr);
        return SPILL_EX_USAGE;
    }
    check_report r;
    char err[SPILL_ERRLEN];
    int rc = strcmp(path, "-") == 0 ? check_stream(stdin, "stdin", &o, &r, stdout, err, sizeof err)
                                    : check_file(path, &o, &r, stdout, err, sizeof err);
    const char *name = strcmp(path, "-") == 0 ? "stdin" : path;
    if (rc == CHECK_OK) {
        size_t n = r.ok_rows;
        printf("%s: OK \xE2\x80\x94 %zu %s row%s", name, n, request_kind_name(r.kind, r.endpoint), n == 1 ? "" : "s");
        if (r.model[0])
            printf(", model %s", r.model);
        putchar('\n');
    } else if (rc == CHECK_INVALID) {
        if (o.all)
            printf("%s: %zu of %zu row%s %s errors.\n", name, r.bad_rows, r.rows, r.rows == 1 ? "" : "s",
                   r.bad_rows == 1 ? "has" : "have");
    } else {
        fflush(stdout);
        fprintf(stderr, "%s\n", err);
    }
    fflush(stdout);
    return check_exit_code(rc);
}
