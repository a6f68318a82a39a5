/*
 * eval.c — `spill eval INPUT MODEL [MODEL...] --metric M [--metric M2...] [--judge MODEL] [--rerun] [-o DIR]`.
 *
 * Each MODEL (a tag, a path, or BASE+ADAPTER) answers INPUT's rows in its own job — a `spill run` of this same
 * binary, so it is durable, resumable and shows its progress — and every row's answer is scored by each metric
 * (metrics.h) against the row's `expected`.  One table (stdout, DIR/table.md, DIR/table.csv): per model the
 * rows, failures, each metric's mean with its 95% interval, p50/p95 row latency (the rows' latency_s), prompt and
 * completion tokens, tok/s, and whether the run was reused.  DIR/diff.jsonl holds the rows where the models'
 * scores disagree, with every model's answer.
 *
 * Runs are reused: a run's key is the SHA-256 of (the input's SHA-256, the model's weight fingerprint, its
 * quant, the adapter's full hash, the generation options); $SPILL_HOME/evals/cache/<key> links the run that
 * answered it.  A finished run is reused ("cached"), an interrupted one resumed (a killed eval resumes where it
 * stopped), none is made fresh under DIR/runs/.  --rerun makes every run fresh.  The judge's runs are keyed the
 * same way over the judge input built from a model's answers, so a re-run judges nothing twice.
 *
 * Failed rows (no answer: an error line) score 0 for every metric and are counted.  Rows without `expected` are
 * refused before any model runs, one sentence naming the line, as `spill check` does for eval files.
 */
#include "eval.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../base/exit.h"
#include "../base/util.h"
#include "../model/arch.h"
#include "../model/lora.h"
#include "../model/model.h"
#include "metrics.h"
#include "request.h"

extern char **environ;

#define MAX_MODELS 16
#define MAX_METRICS 16
#define MAX_FWD 48

typedef struct eval_row {
    char *id;
    json_t *root;           /* the input line (owned) */
    const json_t *expected; /* borrowed from root */
    metric_row mrow;        /* what the metrics read (borrowed from root) */
    char *question;         /* what the judge sees (metric_judge_question) */
} eval_row;

typedef struct model_run {
    const char *spec;
    char suffix[16];  /* a shared run (models of one base in one job): this model's custom_id suffix, "#k" */
    int shared;       /* models in the run this one's answers come from (1 = its own) */
    char slug[160];
    char dir[PATH_MAX];
    bool cached;
    char **answer;   /* (n_rows) NULL when the row failed */
    double *latency; /* (n_rows) NAN when unknown */
    double **score;  /* [metric][row] */
    uint64_t prompt_tokens, completion_tokens;
    double tok_s;
    size_t failed;
} model_run;

typedef struct eval_ctx {
    const char *input;
    char input_sha[65];
    const char *models[MAX_MODELS];
    int n_models;
    metric *metrics[MAX_METRICS];
    int n_metrics;
    const char *judge;
    bool rerun, quiet;
    char dir[PATH_MAX];
    const char *fwd[MAX_FWD]; /* spill run options passed through */
    int n_fwd;
    eval_row *rows;
    size_t n_rows;
    model_run runs[MAX_MODELS];
} eval_ctx;

/* ---------------------------------------------------------------- helpers */

static int sha256_file_hex(const char *path, char out[65], char *err, size_t errlen)
{
    char *buf;
    size_t len;
    if (util_read_file(path, (size_t)4 << 30, &buf, &len, err, errlen))
        return -1;
    util_sha256_hex(buf, len, out);
    free(buf);
    return 0;
}

static void slugify(const char *spec, int index, char *out, size_t cap)
{
    size_t o = 0;
    o += (size_t)snprintf(out, cap, "%d-", index + 1);
    for (const char *p = spec; *p && o + 1 < cap && o < 80; p++) {
        char c = *p;
        out[o++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-'
                       ? c
                       : '_';
    }
    out[o] = 0;
}

/* Runs `spill ARGS...` (this binary) and waits; the child's exit code, or -1. */
static int spawn_spill(const char *const *args)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = 0;
    pid_t pid;
    if (posix_spawn(&pid, self, NULL, NULL, (char *const *)args, environ))
        return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static json_t *read_lines(const char *path)
{
    json_t *a = json_array();
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (a && f && (n = getline(&line, &cap, f)) > 0) {
        json_t *o = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, NULL);
        if (o)
            json_array_append_new(a, o);
    }
    free(line);
    if (f)
        fclose(f);
    return a;
}

/* The answer text of a results line: chat message content or completion text; NULL when none. */
static const char *answer_of(const json_t *line, size_t *len)
{
    const json_t *ch = json_array_get(
        json_object_get(json_object_get(json_object_get(line, "response"), "body"), "choices"), 0);
    const json_t *t = json_object_get(json_object_get(ch, "message"), "content");
    if (!json_is_string(t))
        t = json_object_get(ch, "text");
    if (!json_is_string(t))
        return NULL;
    *len = json_string_length(t);
    return json_string_value(t);
}

/* ---------------------------------------------------------------- the input */

static int load_rows(eval_ctx *c, char *err, size_t errlen)
{
    FILE *f = fopen(c->input, "rb");
    if (!f)
        return util_errf(err, errlen, "%s: cannot open: %s.", c->input, strerror(errno));
    jsonl_reader rd;
    if (jsonl_open(&rd, f, c->input, 0, err, errlen)) {
        fclose(f);
        return -1;
    }
    size_t cap = 0;
    int rc = 0;
    const char *line;
    size_t len;
    for (;;) {
        jsonl_status st = jsonl_next(&rd, &line, &len, err, errlen);
        if (st == JSONL_EOF)
            break;
        if (st == JSONL_IO_ERROR || st == JSONL_TOO_LONG) {
            rc = st == JSONL_TOO_LONG ? util_errf(err, errlen, "%s line %zu: the line is too long.", c->input, rd.lineno)
                                      : -1;
            break;
        }
        if (len == 0)
            continue;
        request q = {0};
        char e2[SPILL_ERRLEN];
        if (request_parse_line(line, len, rd.lineno, c->input, &q, e2, sizeof e2)) {
            request_free(&q);
            rc = util_errf(err, errlen, "%s", e2);
            break;
        }
        if (!q.expected) {
            rc = util_errf(err, errlen,
                           "%s line %zu: the row has no \"expected\" value, so no metric can score it; add the answer "
                           "it should give (spill check %s --all lists every such line).",
                           c->input, rd.lineno, c->input);
            request_free(&q);
            break;
        }
        if (c->n_rows == cap) {
            cap = cap ? cap * 2 : 64;
            eval_row *nr = realloc(c->rows, cap * sizeof *nr);
            if (!nr) {
                request_free(&q);
                rc = util_errf(err, errlen, "out of memory reading %s.", c->input);
                break;
            }
            c->rows = nr;
        }
        eval_row *w = &c->rows[c->n_rows++];
        w->id = strdup(q.custom_id);
        w->root = json_incref(q.root);
        w->expected = q.expected;
        w->mrow = (metric_row){w->id, q.messages, q.prompt, q.expected};
        w->question = metric_judge_question(&w->mrow);
        request_free(&q);
        if (!w->id || !w->question) {
            rc = util_errf(err, errlen, "out of memory reading %s.", c->input);
            break;
        }
    }
    jsonl_close(&rd);
    fclose(f);
    if (!rc && c->n_rows == 0)
        rc = util_errf(err, errlen, "%s holds no rows; an eval file has one request per line with \"expected\".",
                       c->input);
    return rc;
}

/* ---------------------------------------------------------------- runs and their cache */

/* The key of a run: what makes its answers what they are. */
static int run_key(eval_ctx *c, const char *spec, const char *input_sha, char key[65], char *err, size_t errlen)
{
    char base[4096], ad[4096], path[4096];
    if (lora_split_spec(spec, base, sizeof base, ad, sizeof ad, err, errlen) < 0 ||
        model_resolve(base, path, sizeof path, err, errlen))
        return -1;
    model_desc *m;
    if (model_open(path, &m, err, errlen))
        return -1;
    char fp[65], ahash[65] = "";
    model_fingerprint(m, fp);
    int rc = 0;
    if (ad[0]) {
        arch_layout al;
        char adir[4096];
        lora_adapter *la = NULL;
        rc = model_arch_resolve(m, ARCH_ENGINE_CPU, &al, err, errlen) || lora_resolve(ad, adir, sizeof adir, err, errlen) ||
             lora_load(m, &al, adir, &la, err, errlen);
        if (!rc)
            snprintf(ahash, sizeof ahash, "%s", la->hash);
        lora_free(la);
    }
    if (!rc) {
        json_t *k = json_pack("{s:s,s:s,s:s,s:s,s:[]}", "input", input_sha, "model", fp, "quant", m->quant_summary,
                              "adapter", ahash, "options");
        for (int i = 0; k && i < c->n_fwd; i++)
            json_array_append_new(json_object_get(k, "options"), json_string(c->fwd[i]));
        char *d = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(k);
        if (!d)
            rc = util_errf(err, errlen, "out of memory.");
        else
            util_sha256_hex(d, strlen(d), key);
        free(d);
    }
    model_close(m);
    return rc ? -1 : 0;
}

/* "done", "interrupted", "running" or NULL (no job there). */
static char *job_state_of(const char *dir)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    json_t *m = json_load_file(p, 0, NULL);
    const char *s = json_string_value(json_object_get(m, "state"));
    char *r = s ? strdup(s) : NULL;
    json_decref(m);
    return r;
}

/* Points the cache entry link at run directory dir (made now if missing), atomically: a run killed before it
 * finishes is found there and resumed by the next eval.  0, or -1 (errno). */
static int point_cache(const char *cache, const char *link, const char *dir)
{
    char evals[PATH_MAX], abs[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(evals, sizeof evals, "%s/evals", util_spill_home());
    mkdir(util_spill_home(), 0755);
    mkdir(evals, 0755);
    if (mkdir(cache, 0755) && errno != EEXIST)
        return -1;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return -1;
    if (!realpath(dir, abs))
        return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp", link);
    unlink(tmp);
    if (symlink(abs, tmp) || rename(tmp, link))
        return -1;
    return 0;
}

/* Answers INPUT (input, input_sha) with model spec into a run directory (cached, resumed or fresh); fills dir
 * and *cached.  0, or -1 with a sentence. */
static int answer_with(eval_ctx *c, const char *spec, const char *input, const char *input_sha, const char *slug,
                       char *dir, size_t cap, bool *cached, char *err, size_t errlen)
{
    char key[65], cache[PATH_MAX], link[PATH_MAX];
    if (run_key(c, spec, input_sha, key, err, errlen))
        return -1;
    if (util_pathf(cache, sizeof cache, "%s/evals/cache", util_spill_home()) ||
        util_pathf(link, sizeof link, "%s/%s", cache, key))
        return util_errf(err, errlen, "SPILL_HOME is too long for the eval cache.");
    *cached = false;
    char prev[PATH_MAX];
    ssize_t n = c->rerun ? -1 : readlink(link, prev, sizeof prev - 1);
    char *state = NULL;
    if (n > 0) {
        prev[n] = 0;
        state = job_state_of(prev);
    }
    const char *args[MAX_FWD + 16];
    int na = 0;
    args[na++] = "spill";
    if (state && !strcmp(state, "done")) {
        *cached = true;
        snprintf(dir, cap, "%s", prev);
    } else if (state) { /* an interrupted run of this key: finish it */
        snprintf(dir, cap, "%s", prev);
        args[na++] = "resume";
        args[na++] = dir;
    } else {
        for (int k = 0;; k++) {
            if (k == 0 ? util_pathf(dir, cap, "%s/runs/%s", c->dir, slug)
                       : util_pathf(dir, cap, "%s/runs/%s-%d", c->dir, slug, k))
                return util_errf(err, errlen, "%s: the eval directory's path is too long.", c->dir);
            if (!util_is_dir(dir))
                break;
        }
        args[na++] = "run";
        args[na++] = spec;
        args[na++] = input;
        args[na++] = "-o";
        args[na++] = dir;
        for (int i = 0; i < c->n_fwd; i++)
            args[na++] = c->fwd[i];
    }
    free(state);
    if (c->quiet && !*cached)
        args[na++] = "--quiet";
    args[na] = NULL;
    if (!*cached && !strcmp(args[1], "run") && point_cache(cache, link, dir) != 0)
        return util_errf(err, errlen, "%s: cannot record the run in the eval cache: %s.", link, strerror(errno));
    if (!*cached) {
        if (!c->quiet)
            fprintf(stderr, "spill eval: %s %s\n", args[1], spec);
        int rc = spawn_spill(args);
        if (rc != 0)
            return util_errf(err, errlen,
                             "the run of %s on %s ended with exit %d (see its messages above); fix that and run the "
                             "same spill eval again: finished rows are kept.",
                             spec, input, rc);
    }
    char abs[PATH_MAX];
    if (realpath(dir, abs))
        snprintf(dir, cap, "%s", abs);
    if (*cached) { /* the reused run is reachable from this eval's directory too */
        char here[PATH_MAX + 200];
        if (!util_pathf(here, sizeof here, "%s/runs/%s", c->dir, slug) && !util_is_dir(here))
            if (symlink(dir, here) != 0) { /* best effort: the table names the run's directory anyway */
            }
    }
    return 0;
}

/* Reads a run's answers, latencies, tokens and throughput. */
static int read_run(eval_ctx *c, model_run *mr, char *err, size_t errlen)
{
    size_t sl = strlen(mr->suffix);
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/results.jsonl", mr->dir);
    json_t *lines = read_lines(p);
    mr->answer = calloc(c->n_rows, sizeof *mr->answer);
    mr->latency = malloc(c->n_rows * sizeof *mr->latency);
    if (!lines || !mr->answer || !mr->latency) {
        json_decref(lines);
        return util_errf(err, errlen, "out of memory reading %s.", p);
    }
    for (size_t i = 0; i < c->n_rows; i++)
        mr->latency[i] = NAN;
    /* custom_id -> row index */
    json_t *index = json_object();
    for (size_t i = 0; i < c->n_rows; i++)
        json_object_set_new(index, c->rows[i].id, json_integer((json_int_t)i));
    size_t k;
    json_t *l;
    json_array_foreach(lines, k, l)
    {
        const char *id = json_string_value(json_object_get(l, "custom_id"));
        size_t il = id ? strlen(id) : 0;
        if (sl && (il <= sl || strcmp(id + il - sl, mr->suffix)))
            continue; /* another model's row of a shared run */
        json_t *ix = id ? json_object_getn(index, id, il - sl) : NULL;
        size_t alen = 0;
        const char *a = answer_of(l, &alen);
        if (!ix || !a)
            continue;
        size_t i = (size_t)json_integer_value(ix);
        mr->answer[i] = strndup(a, alen);
        json_t *lat = json_object_get(json_object_get(l, "spill"), "latency_s");
        if (json_is_number(lat))
            mr->latency[i] = json_number_value(lat);
        json_t *u = json_object_get(json_object_get(json_object_get(l, "response"), "body"), "usage");
        mr->prompt_tokens += (uint64_t)json_integer_value(json_object_get(u, "prompt_tokens"));
        mr->completion_tokens += (uint64_t)json_integer_value(json_object_get(u, "completion_tokens"));
    }
    json_decref(index);
    json_decref(lines);
    for (size_t i = 0; i < c->n_rows; i++)
        mr->failed += mr->answer[i] == NULL;
    snprintf(p, sizeof p, "%s/manifest.json", mr->dir);
    json_t *m = json_load_file(p, 0, NULL);
    mr->tok_s = json_number_value(json_object_get(json_object_get(m, "throughput"), "tok_s"));
    json_decref(m);
    return 0;
}

/* ---------------------------------------------------------------- shared runs */

/* Models of one base (BASE, BASE+A, BASE+B, ...) answer in one job, so one pass over the base's weights
 * serves every adapter (the runner applies each row's adapter): the input again, each line once per member
 * with custom_id "<id>#<k>" and body.model the member's spec (a fine-tuning line becomes the batch line it
 * stands for).  0 with path and sha filled, or -1 with a sentence. */
static int shared_input(eval_ctx *c, const int *members, int n, int group, char *path, size_t cap, char sha[65],
                        char *err, size_t errlen)
{
    if (util_pathf(path, cap, "%s/shared-%d.jsonl", c->dir, group))
        return util_errf(err, errlen, "%s: the eval directory's path is too long.", c->dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return util_errf(err, errlen, "%s: cannot create: %s.", path, strerror(errno));
    int bad = 0;
    for (size_t i = 0; i < c->n_rows && !bad; i++)
        for (int k = 0; k < n && !bad; k++) {
            model_run *mr = &c->runs[members[k]];
            json_t *o = json_deep_copy(c->rows[i].root), *body = json_object_get(o, "body");
            char id[600];
            snprintf(id, sizeof id, "%s%s", c->rows[i].id, mr->suffix);
            if (!o)
                bad = 1;
            else if (body)
                bad |= json_object_set_new(body, "model", json_string(mr->spec));
            else { /* a fine-tuning line: the chat request it stands for (its final assistant turn is the
                    * reference answer, not part of the prompt, as spill run reads such lines) */
                json_t *msgs = json_deep_copy(json_object_get(o, "messages"));
                size_t nm = json_array_size(msgs);
                if (nm >= 2 && !strcmp(json_string_value(json_object_get(json_array_get(msgs, nm - 1), "role")) ?: "",
                                       "assistant"))
                    json_array_remove(msgs, nm - 1);
                json_t *b = json_pack("{s:s,s:o}", "model", mr->spec, "messages", msgs);
                if (b && json_object_get(o, "tools"))
                    json_object_set(b, "tools", json_object_get(o, "tools"));
                json_t *line = b ? json_pack("{s:s,s:s,s:o,s:O}", "method", "POST", "url", "/v1/chat/completions",
                                             "body", b, "expected", json_object_get(o, "expected"))
                                 : NULL;
                json_decref(o);
                o = line;
                bad |= !o;
            }
            bad |= !o || json_object_set_new(o, "custom_id", json_string(id));
            char *d = bad ? NULL : json_dumps(o, JSON_COMPACT);
            json_decref(o);
            if (!d)
                bad = 1;
            else
                fprintf(f, "%s\n", d);
            free(d);
        }
    if (fclose(f) || bad)
        return util_errf(err, errlen, "%s: cannot write the shared input.", path);
    return sha256_file_hex(path, sha, err, errlen);
}

/* ---------------------------------------------------------------- the judge */

/* Judges model run mr's answers with c->judge: one chat row per answered row; its verdicts into scores. */
static int judge_run(eval_ctx *c, model_run *mr, double *scores, char *err, size_t errlen)
{
    char in[PATH_MAX + 64], sha[65];
    snprintf(in, sizeof in, "%s/judge-%s.jsonl", c->dir, mr->slug);
    FILE *f = fopen(in, "w");
    if (!f)
        return util_errf(err, errlen, "%s: cannot create: %s.", in, strerror(errno));
    for (size_t i = 0; i < c->n_rows; i++) {
        if (!mr->answer[i])
            continue;
        json_t *msgs =
            metric_judge_messages(c->rows[i].question, c->rows[i].expected, mr->answer[i], strlen(mr->answer[i]));
        json_t *row = msgs ? json_pack("{s:s,s:s,s:s,s:{s:s,s:o,s:i,s:i}}", "custom_id", c->rows[i].id, "method",
                                       "POST", "url", "/v1/chat/completions", "body", "model", "judge", "messages",
                                       msgs, "temperature", 0, "max_tokens", 256)
                           : NULL;
        char *d = row ? json_dumps(row, JSON_COMPACT) : NULL;
        json_decref(row);
        if (!d) {
            fclose(f);
            return util_errf(err, errlen, "out of memory building the judge's input.");
        }
        fprintf(f, "%s\n", d);
        free(d);
    }
    if (fclose(f))
        return util_errf(err, errlen, "%s: cannot write: %s.", in, strerror(errno));
    if (sha256_file_hex(in, sha, err, errlen))
        return -1;
    char slug[200], dir[PATH_MAX];
    snprintf(slug, sizeof slug, "judge-%s", mr->slug);
    bool cached;
    if (answer_with(c, c->judge, in, sha, slug, dir, sizeof dir, &cached, err, errlen))
        return -1;
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/results.jsonl", dir);
    json_t *lines = read_lines(p);
    for (size_t i = 0; i < c->n_rows; i++)
        scores[i] = 0;
    size_t k;
    json_t *l;
    json_array_foreach(lines, k, l)
    {
        const char *id = json_string_value(json_object_get(l, "custom_id"));
        size_t alen;
        const char *a = answer_of(l, &alen);
        for (size_t i = 0; id && a && i < c->n_rows; i++)
            if (!strcmp(c->rows[i].id, id)) {
                double s;
                char e2[SPILL_ERRLEN];
                if (metric_judge_parse(a, alen, &s, e2, sizeof e2) == 0)
                    scores[i] = s;
                else if (!c->quiet)
                    fprintf(stderr, "spill eval: the judge of row %s: %s (scored 0)\n", id, e2);
                break;
            }
    }
    json_decref(lines);
    return 0;
}

/* ---------------------------------------------------------------- the table */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *v, size_t n, double q)
{
    double *s = malloc((n ? n : 1) * sizeof *s);
    size_t m = 0;
    for (size_t i = 0; s && i < n; i++)
        if (!isnan(v[i]))
            s[m++] = v[i];
    double r = NAN;
    if (m) {
        qsort(s, m, sizeof *s, cmp_double);
        double pos = q * (double)(m - 1);
        size_t lo = (size_t)pos;
        r = lo + 1 < m ? s[lo] + (pos - (double)lo) * (s[lo + 1] - s[lo]) : s[lo];
    }
    free(s);
    return r;
}

static int write_table(eval_ctx *c, char *err, size_t errlen)
{
    char md[PATH_MAX + 32], csv[PATH_MAX + 32];
    snprintf(md, sizeof md, "%s/table.md", c->dir);
    snprintf(csv, sizeof csv, "%s/table.csv", c->dir);
    FILE *fm = fopen(md, "w"), *fc = fopen(csv, "w");
    if (!fm || !fc) {
        if (fm)
            fclose(fm);
        if (fc)
            fclose(fc);
        return util_errf(err, errlen, "%s: cannot write the table: %s.", c->dir, strerror(errno));
    }
    FILE *outs[2] = {stdout, fm};
    for (int o = 0; o < 2; o++) {
        fprintf(outs[o], "| model | rows | failed |");
        for (int k = 0; k < c->n_metrics; k++)
            fprintf(outs[o], " %s (95%% CI) |", metric_name(c->metrics[k]));
        fprintf(outs[o], " p50 s | p95 s | prompt tok | completion tok | tok/s | run |\n|---|---:|---:|");
        for (int k = 0; k < c->n_metrics; k++)
            fprintf(outs[o], "---:|");
        fprintf(outs[o], "---:|---:|---:|---:|---:|---|\n");
    }
    fprintf(fc, "model,rows,failed");
    for (int k = 0; k < c->n_metrics; k++)
        fprintf(fc, ",%s,%s_lo,%s_hi", metric_name(c->metrics[k]), metric_name(c->metrics[k]),
                metric_name(c->metrics[k]));
    fprintf(fc, ",p50_s,p95_s,prompt_tokens,completion_tokens,tok_s,shared,cached,run_dir\n");
    for (int m = 0; m < c->n_models; m++) {
        model_run *mr = &c->runs[m];
        double p50 = quantile(mr->latency, c->n_rows, 0.5), p95 = quantile(mr->latency, c->n_rows, 0.95);
        for (int o = 0; o < 2; o++) {
            fprintf(outs[o], "| %s | %zu | %zu |", mr->spec, c->n_rows, mr->failed);
            for (int k = 0; k < c->n_metrics; k++) {
                double mean, lo, hi;
                metric_interval(mr->score[k], c->n_rows, &mean, &lo, &hi);
                fprintf(outs[o], " %.3f [%.3f, %.3f] |", mean, lo, hi);
            }
            char how[64];
            snprintf(how, sizeof how, "%s%s", mr->cached ? "cached" : "ran",
                     mr->shared > 1 ? (snprintf(how + 32, 32, " (one job, %d models)", mr->shared), how + 32) : "");
            fprintf(outs[o], " %.2f | %.2f | %llu | %llu | %.1f | %s |\n", p50, p95,
                    (unsigned long long)mr->prompt_tokens, (unsigned long long)mr->completion_tokens, mr->tok_s, how);
        }
        fprintf(fc, "\"%s\",%zu,%zu", mr->spec, c->n_rows, mr->failed);
        for (int k = 0; k < c->n_metrics; k++) {
            double mean, lo, hi;
            metric_interval(mr->score[k], c->n_rows, &mean, &lo, &hi);
            fprintf(fc, ",%.6f,%.6f,%.6f", mean, lo, hi);
        }
        fprintf(fc, ",%.4f,%.4f,%llu,%llu,%.3f,%d,%d,\"%s\"\n", p50, p95, (unsigned long long)mr->prompt_tokens,
                (unsigned long long)mr->completion_tokens, mr->tok_s, mr->shared, mr->cached, mr->dir);
    }
    int bad = ferror(fm) | ferror(fc);
    bad |= fclose(fm) | fclose(fc);
    return bad ? util_errf(err, errlen, "%s: cannot write the table.", c->dir) : 0;
}

/* Rows where the models' scores differ (any metric), with every model's answer. */
static int write_diff(eval_ctx *c, size_t *n_diff, char *err, size_t errlen)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/diff.jsonl", c->dir);
    FILE *f = fopen(p, "w");
    if (!f)
        return util_errf(err, errlen, "%s: cannot create: %s.", p, strerror(errno));
    *n_diff = 0;
    for (size_t i = 0; i < c->n_rows && c->n_models > 1; i++) {
        bool differ = false;
        for (int k = 0; k < c->n_metrics && !differ; k++)
            for (int m = 1; m < c->n_models; m++)
                differ |= c->runs[m].score[k][i] != c->runs[0].score[k][i];
        if (!differ)
            continue;
        json_t *o = json_pack("{s:s,s:O,s:{},s:{}}", "custom_id", c->rows[i].id, "expected", c->rows[i].expected,
                              "answers", "scores");
        for (int m = 0; o && m < c->n_models; m++) {
            json_object_set_new(json_object_get(o, "answers"), c->runs[m].spec,
                                c->runs[m].answer[i] ? json_string(c->runs[m].answer[i]) : json_null());
            json_t *s = json_object();
            for (int k = 0; s && k < c->n_metrics; k++)
                json_object_set_new(s, metric_name(c->metrics[k]), json_real(c->runs[m].score[k][i]));
            json_object_set_new(json_object_get(o, "scores"), c->runs[m].spec, s);
        }
        char *d = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (d)
            fprintf(f, "%s\n", d);
        free(d);
        (*n_diff)++;
    }
    return fclose(f) ? util_errf(err, errlen, "%s: cannot write.", p) : 0;
}

/* ---------------------------------------------------------------- the command */

static void usage(FILE *f)
{
    fprintf(f, "usage: spill eval INPUT.jsonl MODEL [MODEL...] --metric M [--metric M2...] [--judge MODEL] [--rerun] "
               "[-o DIR] [run options]\n"
               "  runs (or reuses) each model on INPUT, scores every row against its \"expected\", prints one table\n"
               "\noptions:\n"
               "  --metric M                 a score per row (repeatable): exact_match, exact_match:nopunct, contains, "
               "regex, regex:PATTERN, json_field:PATH, judge, script:CMD\n"
               "  --judge MODEL              the model that grades the judge metric\n"
               "  --rerun                    run every model again, even when a cached run matches\n"
               "  -o DIR                     where the table, the diff and the per-model runs go\n"
               "  --quiet, -q                no progress lines\n"
               "  --help, -h                 this list\n"
               "\nrun options, passed to each model's run (spill run --help says what each does):\n"
               "  --quant Q\n  --batch N\n  --threads N\n  --prefill-chunk N\n  --mem-budget BYTES\n  --kv-mem BYTES\n"
               "  --stream\n  --resident\n  --cpu\n  --gpu\n  --gpu-mem BYTES\n");
}

static void ctx_free(eval_ctx *c)
{
    for (int k = 0; k < c->n_metrics; k++)
        metric_free(c->metrics[k]);
    for (int m = 0; m < c->n_models; m++) {
        model_run *mr = &c->runs[m];
        for (size_t i = 0; mr->answer && i < c->n_rows; i++)
            free(mr->answer[i]);
        free(mr->answer);
        free(mr->latency);
        for (int k = 0; mr->score && k < c->n_metrics; k++)
            free(mr->score[k]);
        free(mr->score);
    }
    for (size_t i = 0; i < c->n_rows; i++) {
        free(c->rows[i].id);
        free(c->rows[i].question);
        json_decref(c->rows[i].root);
    }
    free(c->rows);
}

int eval_main(int argc, char **argv)
{
    static eval_ctx c; /* large: not on the stack */
    memset(&c, 0, sizeof c);
    static const char *const with_value[] = {"--quant", "--batch", "--threads", "--prefill-chunk", "--mem-budget", "--kv-mem",
                                             "--gpu-mem", "--page-tokens"};
    static const char *const flags[] = {"--stream", "--resident", "--cpu", "--gpu", "--from-disk"};
    const char *out = NULL;
    char err[SPILL_ERRLEN];
    int code = SPILL_EX_USAGE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool fv = false, ff = false;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
            fv |= !strcmp(a, with_value[k]);
        for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
            ff |= !strcmp(a, flags[k]);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return SPILL_EX_OK;
        } else if ((!strcmp(a, "--metric") || !strcmp(a, "--judge") || !strcmp(a, "-o") || fv) && i + 1 >= argc) {
            fprintf(stderr, "spill: %s needs a value.\n", a);
            goto out;
        } else if (!strcmp(a, "--metric")) {
            if (c.n_metrics == MAX_METRICS) {
                fprintf(stderr, "spill: at most %d metrics.\n", MAX_METRICS);
                goto out;
            }
            if (metric_parse(argv[++i], &c.metrics[c.n_metrics], err, sizeof err)) {
                fprintf(stderr, "spill: --metric %s: %s\n", argv[i], err);
                goto out;
            }
            c.n_metrics++;
        } else if (!strcmp(a, "--judge"))
            c.judge = argv[++i];
        else if (!strcmp(a, "-o"))
            out = argv[++i];
        else if (!strcmp(a, "--rerun"))
            c.rerun = true;
        else if (!strcmp(a, "--quiet") || !strcmp(a, "-q"))
            c.quiet = true;
        else if (fv || ff) {
            if (c.n_fwd + 2 > MAX_FWD)
                goto out;
            c.fwd[c.n_fwd++] = a;
            if (fv)
                c.fwd[c.n_fwd++] = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "spill: %s is not an option of spill eval; spill eval --help lists them.\n", a);
            goto out;
        } else if (!c.input)
            c.input = a;
        else if (c.n_models < MAX_MODELS)
            c.models[c.n_models++] = a;
        else {
            fprintf(stderr, "spill: at most %d models in one eval.\n", MAX_MODELS);
            goto out;
        }
    }
    if (!c.input || c.n_models == 0 || c.n_metrics == 0) {
        usage(stderr);
        goto out;
    }
    bool judged = false;
    for (int k = 0; k < c.n_metrics; k++)
        judged |= metric_get_kind(c.metrics[k]) == METRIC_JUDGE;
    if (judged != (c.judge != NULL)) {
        fprintf(stderr, judged ? "spill: --metric judge needs --judge MODEL, the model that grades the answers.\n"
                               : "spill: --judge MODEL grades answers for --metric judge; add that metric.\n");
        goto out;
    }
    code = SPILL_EX_NOINPUT;
    if (access(c.input, R_OK)) {
        fprintf(stderr, "spill: %s: cannot read the input file: %s.\n", c.input, strerror(errno));
        goto out;
    }
    code = SPILL_EX_DATAERR;
    if (load_rows(&c, err, sizeof err) || sha256_file_hex(c.input, c.input_sha, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        goto out;
    }
    code = SPILL_EX_CANTCREAT;
    if (out)
        snprintf(c.dir, sizeof c.dir, "%s", out);
    else {
        time_t now = time(NULL);
        struct tm tm;
        char stamp[32];
        gmtime_r(&now, &tm);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        snprintf(c.dir, sizeof c.dir, "%s/evals/%s", util_spill_home(), stamp);
    }
    {
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/runs", c.dir);
        char evals[PATH_MAX];
        snprintf(evals, sizeof evals, "%s/evals", util_spill_home());
        mkdir(util_spill_home(), 0755);
        mkdir(evals, 0755);
        if ((mkdir(c.dir, 0755) && errno != EEXIST) || (mkdir(p, 0755) && errno != EEXIST)) {
            fprintf(stderr, "spill: %s: cannot create the eval directory: %s.\n", c.dir, strerror(errno));
            goto out;
        }
    }
    code = SPILL_EX_SOFTWARE;
    for (int m = 0; m < c.n_models; m++) {
        c.runs[m].spec = c.models[m];
        c.runs[m].shared = 1;
        slugify(c.runs[m].spec, m, c.runs[m].slug, sizeof c.runs[m].slug);
    }
    /* models of one base share one job (one pass over the base serves every adapter) */
    char bases[MAX_MODELS][4096];
    for (int m = 0; m < c.n_models; m++) {
        char ad[4096];
        if (lora_split_spec(c.models[m], bases[m], sizeof bases[m], ad, sizeof ad, err, sizeof err) < 0) {
            fprintf(stderr, "spill: %s\n", err);
            code = SPILL_EX_DATAERR;
            goto out;
        }
    }
    for (int m = 0, group = 0; m < c.n_models; m++) {
        int members[MAX_MODELS], n = 0;
        for (int k = m; k < c.n_models; k++)
            if (c.runs[k].shared == 1 && !strcmp(bases[k], bases[m]) && c.runs[k].suffix[0] == 0) {
                bool dup = false;
                for (int j = 0; j < n; j++)
                    dup |= !strcmp(c.models[members[j]], c.models[k]);
                if (!dup)
                    members[n++] = k;
            }
        if (n < 2)
            continue;
        char path[PATH_MAX], sha[65], key[65], dir[PATH_MAX], slug[64];
        for (int j = 0; j < n; j++)
            snprintf(c.runs[members[j]].suffix, sizeof c.runs[members[j]].suffix, "#%d", j);
        /* the shared input's hash, with every member's key (its adapter's hash among them) */
        int rc = shared_input(&c, members, n, group, path, sizeof path, sha, err, sizeof err);
        for (int j = 0; rc == 0 && j < n; j++) {
            char both[200];
            rc = run_key(&c, c.models[members[j]], c.input_sha, key, err, sizeof err);
            snprintf(both, sizeof both, "%s%s", sha, key);
            util_sha256_hex(both, strlen(both), sha);
        }
        bool cached = false;
        snprintf(slug, sizeof slug, "shared-%d", group++);
        if (rc || answer_with(&c, bases[m], path, sha, slug, dir, sizeof dir, &cached, err, sizeof err)) {
            fprintf(stderr, "spill: %s\n", err);
            code = SPILL_EX_TEMPFAIL;
            goto out;
        }
        for (int j = 0; j < n; j++) {
            model_run *mr = &c.runs[members[j]];
            snprintf(mr->dir, sizeof mr->dir, "%s", dir);
            mr->cached = cached;
            mr->shared = n;
        }
        if (!c.quiet)
            fprintf(stderr, "spill eval: %d models of %s answered in one job (%s)\n", n, bases[m], dir);
    }
    for (int m = 0; m < c.n_models; m++) {
        model_run *mr = &c.runs[m];
        if ((mr->shared == 1 && answer_with(&c, mr->spec, c.input, c.input_sha, mr->slug, mr->dir, sizeof mr->dir,
                                            &mr->cached, err, sizeof err)) ||
            read_run(&c, mr, err, sizeof err)) {
            fprintf(stderr, "spill: %s\n", err);
            code = SPILL_EX_TEMPFAIL;
            goto out;
        }
        if (!c.quiet)
            fprintf(stderr, "spill eval: %s: %s (%zu rows, %zu failed) in %s\n", mr->spec,
                    mr->cached ? "cached" : "answered", c.n_rows, mr->failed, mr->dir);
        mr->score = calloc((size_t)c.n_metrics, sizeof *mr->score);
        if (!mr->score)
            goto out;
        for (int k = 0; k < c.n_metrics; k++) {
            double *s = mr->score[k] = calloc(c.n_rows, sizeof *s);
            if (!s)
                goto out;
            if (metric_get_kind(c.metrics[k]) == METRIC_JUDGE) {
                if (judge_run(&c, mr, s, err, sizeof err)) {
                    fprintf(stderr, "spill: %s\n", err);
                    code = SPILL_EX_TEMPFAIL;
                    goto out;
                }
                continue;
            }
            size_t unscored = 0;
            for (size_t i = 0; i < c.n_rows; i++) {
                if (!mr->answer[i]) {
                    s[i] = 0; /* a failed row is a wrong answer */
                    continue;
                }
                char e2[SPILL_ERRLEN];
                if (metric_score(c.metrics[k], &c.rows[i].mrow, mr->answer[i], strlen(mr->answer[i]), &s[i], e2,
                                 sizeof e2)) {
                    if (unscored++ < 3)
                        fprintf(stderr, "spill eval: %s, row %s: %s\n", mr->spec, c.rows[i].id, e2);
                    s[i] = 0;
                }
            }
            if (unscored > 3)
                fprintf(stderr, "spill eval: %s: %zu rows could not be scored by %s (scored 0).\n", mr->spec, unscored,
                        metric_name(c.metrics[k]));
        }
    }
    size_t n_diff = 0;
    if (write_table(&c, err, sizeof err) || write_diff(&c, &n_diff, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        code = SPILL_EX_IOERR;
        goto out;
    }
    if (!c.quiet)
        fprintf(stderr, "spill eval: table in %s/table.md (and .csv); %zu rows where the models disagree in %s/diff.jsonl\n",
                c.dir, n_diff, c.dir);
    code = SPILL_EX_OK;
out:
    ctx_free(&c);
    return code;
}
