/*
 * metrics.c — the scoring behind `spill eval` (every rule is stated in
 * metrics.h; this comment records the decisions).
 *
 * Owns: parsing a metric spec and compiling what it needs once (the pattern
 * of regex:PATTERN, the steps of a JSON path, the argv of a script), scoring
 * one answer, the judge prompt and verdict, the interval.  Does not own:
 * running models (the judge model included), reading eval files, the table.
 *
 * Decisions:
 *  - Text comparison goes through one normaliser (NFC + full case folding +
 *    optional punctuation removal + whitespace collapse), used by every text
 *    metric and by json_field's strings, so "the same answer" means one thing
 *    across metrics.  Case folding is utf8proc's full folding (ß → ss), not
 *    per-code-point lowering, because lowering leaves "Straße" ≠ "STRASSE".
 *  - An array `expected` is a list of alternatives for the text metrics: eval
 *    sets commonly carry several acceptable answers, and an array answer to a
 *    text question is rare.  json_field keeps arrays as values.
 *  - Patterns run in PCRE2's interpreter, not its JIT: answers are a few KB
 *    and JIT adds a stack-limit fallback path; the match limit bounds the cost.
 *  - Scripts start with posix_spawnp (vfork semantics), not fork: the eval
 *    process may hold tens of GB of mapped weights and pinned host memory,
 *    whose page tables fork would copy (and pinned pages the kernel copies
 *    outright) for every row.  The price: no PR_SET_PDEATHSIG, so a script
 *    still running when the eval itself is killed outlives it until it
 *    finishes or writes to its closed stdout.
 *  - A script gets a socket as stdin, so writing to a script that exits
 *    without reading is EPIPE (MSG_NOSIGNAL), never SIGPIPE in the caller —
 *    no process-wide signal disposition is touched.  It runs in its own
 *    process group, so a timeout kills what it started as well.
 *  - The interval is Wilson's for 0/1 scores (right coverage near 0 and 1,
 *    where the normal approximation gives intervals past the bounds) and a t
 *    interval otherwise; bootstrap was left out (random, slower, no better at
 *    the sizes evals use).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "metrics.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "../base/util.h"

#define RX_MATCH_LIMIT 10000000u /* backtracking steps per match (PCRE2's default), then the row fails */
#define RX_HEAP_LIMIT_KB 65536u  /* backtracking memory per match */
#define JSON_SPAN_TRIES 64       /* { or [ positions tried when looking for JSON inside an answer */
#define SCRIPT_OUT_KEEP 4096     /* bytes of a script's stdout kept (the last ones) */
#define SCRIPT_ERR_KEEP 1024     /* bytes of its stderr kept */
#define QUOTE_MAX 60             /* bytes of a reply or output quoted in a sentence */

/* One step of a JSON path: an object key (key != NULL) or an array index. */
typedef struct path_step {
    char *key;
    size_t index;
} path_step;

struct metric {
    metric_kind kind;
    char *name;                /* the spec as given */
    bool nopunct;              /* exact_match / contains */
    pcre2_code *re;            /* regex:PATTERN */
    pcre2_match_context *mctx; /* limits for every match (read-only once built) */
    path_step *steps;          /* json_field: (n_steps); 0 steps is `$` */
    size_t n_steps;
    char **argv; /* script: NULL-terminated, (argc + 1), pointing into words */
    char *words; /* script: every argument's bytes, NUL-separated */
    double timeout_s;
};

static const char *row_name(const metric_row *row)
{
    return row && row->custom_id ? row->custom_id : "?";
}

/* ---- growable bytes ------------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_put(sbuf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2)
                return -1;
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int sb_str(sbuf *b, const char *s)
{
    return sb_put(b, s, strlen(s));
}

/* ---- normalise ------------------------------------------------------------------------------------------ */

/*
 * s as valid UTF-8: *out = s when it already is (nothing allocated, *owned
 * NULL), else a copy with every invalid byte replaced by U+FFFD (*owned = the
 * copy, the caller frees it).  -1 when out of memory.
 */
static int utf8_clean(const char *s, size_t n, const char **out, size_t *out_n, char **owned)
{
    *owned = NULL;
    if (util_utf8_valid(s, n)) {
        *out = s;
        *out_n = n;
        return 0;
    }
    sbuf b = {0};
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k < 1 || !util_utf8_valid(s + i, (size_t)k)) {
            if (sb_put(&b, "\xEF\xBF\xBD", 3))
                goto fail;
            i++;
        } else {
            if (sb_put(&b, s + i, (size_t)k))
                goto fail;
            i += (size_t)k;
        }
    }
    if (!b.p && sb_put(&b, "", 0))
        goto fail;
    *out = *owned = b.p;
    *out_n = b.n;
    return 0;
fail:
    free(b.p);
    return -1;
}

static bool is_space_cp(utf8proc_int32_t c)
{
    if ((c >= 9 && c <= 13) || c == 0x85 || c == ' ')
        return true;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static bool is_punct_cp(utf8proc_int32_t c)
{
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return true;
    default:
        return false;
    }
}

/*
 * normalise() of metrics.h into a fresh NUL-terminated string *out (*out_n
 * bytes, the caller frees it).  -1 when out of memory.
 */
static int normalise(const char *s, size_t n, bool nopunct, char **out, size_t *out_n)
{
    const char *clean;
    size_t clean_n;
    char *owned;
    if (utf8_clean(s, n, &clean, &clean_n, &owned))
        return -1;
    utf8proc_uint8_t *folded = NULL;
    utf8proc_ssize_t fn = utf8proc_map((const utf8proc_uint8_t *)clean, (utf8proc_ssize_t)clean_n, &folded,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_CASEFOLD);
    free(owned);
    if (fn < 0)
        return -1; /* the input is valid UTF-8 by now: only memory can fail */
    /* in place: the result is never longer than the folded text */
    size_t w = 0;
    bool space = false;
    for (utf8proc_ssize_t i = 0; i < fn;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(folded + i, fn - i, &cp);
        if (k < 1) { /* cannot happen on utf8proc's own output; keep the byte rather than loop */
            k = 1;
            cp = folded[i];
        }
        if (is_space_cp(cp)) {
            space = w > 0;
        } else if (!(nopunct && is_punct_cp(cp))) {
            if (space)
                folded[w++] = ' ';
            space = false;
            memmove(folded + w, folded + i, (size_t)k);
            w += (size_t)k;
        }
        i += k;
    }
    folded[w] = 0;
    *out = (char *)folded;
    *out_n = w;
    return 0;
}

/* ---- expected as text ---------------------------------------------------------------------------------- */

/* A real in the shortest %.Ng that reads back to the same double, with ".0" when it would read as an integer. */
static void real_text(double v, char *buf, size_t cap)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".eEin"))
        strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* One expected value as the text metrics compare it (metrics.h): malloc'd, or NULL when out of memory. */
static char *value_text(const json_t *v)
{
    char num[48];
    switch (json_typeof(v)) {
    case JSON_STRING: {
        size_t n = json_string_length(v);
        char *s = malloc(n + 1);
        if (s) {
            memcpy(s, json_string_value(v), n);
            s[n] = 0;
        }
        return s;
    }
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return strdup(num);
    case JSON_REAL:
        real_text(json_real_value(v), num, sizeof num);
        return strdup(num);
    default:
        return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    }
}

/* ---- spec parsing ---------------------------------------------------------------------------------------- */

static int compile_pattern(const char *pat, size_t n, pcre2_code **out, int *ecode, size_t *eoff)
{
    PCRE2_SIZE eo = 0;
    *out = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, ecode, &eo, NULL);
    *eoff = (size_t)eo;
    return *out ? 0 : -1;
}

static void pattern_message(int ecode, char *msg, size_t cap)
{
    if (pcre2_get_error_message(ecode, (PCRE2_UCHAR *)msg, cap) < 0)
        snprintf(msg, cap, "PCRE2 error %d", ecode);
}

static int parse_path(metric *m, const char *spec, const char *p, char *err, size_t errlen)
{
    const char *help = "write keys and [index] steps such as a.b[0].c, or $ for the whole answer";
    if (strcmp(p, "$") == 0)
        return 0;
    if (p[0] == '$' && (p[1] == '.' || p[1] == '['))
        p += p[1] == '.' ? 2 : 1; /* JSONPath's root prefix, for those who write it */
    if (!*p)
        return util_errf(err, errlen, "metric '%s': json_field needs a path after the colon; %s.", spec, help);
    size_t cap = 1;
    for (const char *q = p; *q; q++)
        cap += *q == '.' || *q == '[';
    m->steps = calloc(cap, sizeof *m->steps);
    if (!m->steps)
        return util_errf(err, errlen, "metric '%s': out of memory.", spec);
    const char *q = p;
    while (*q) {
        size_t at = (size_t)(q - p) + 1; /* 1-based character of the path, for the sentence */
        path_step *st = &m->steps[m->n_steps];
        if (*q == '[') {
            const char *d = ++q;
            size_t v = 0;
            while (*q >= '0' && *q <= '9') {
                if (v > (SIZE_MAX - 9) / 10)
                    return util_errf(
                        err, errlen,
                        "metric '%s': the index at character %zu of the path is too large; indexes must be below 2^64.",
                        spec, at);
                v = v * 10 + (size_t)(*q++ - '0');
            }
            if (q == d || *q != ']')
                return util_errf(err, errlen,
                                 "metric '%s': character %zu of the path opens an index that is not digits closed by "
                                 "']'; %s.",
                                 spec, at, help);
            q++;
            st->index = v;
        } else {
            if (m->n_steps > 0) {
                if (*q != '.')
                    return util_errf(err, errlen, "metric '%s': expected '.' or '[' at character %zu of the path; %s.",
                                     spec, at, help);
                q++;
                at++;
            }
            size_t k = strcspn(q, ".[]");
            if (k == 0)
                return util_errf(err, errlen, "metric '%s': empty key at character %zu of the path; %s.", spec, at,
                                 help);
            st->key = strndup(q, k);
            if (!st->key)
                return util_errf(err, errlen, "metric '%s': out of memory.", spec);
            q += k;
        }
        m->n_steps++;
    }
    return 0;
}

/* True when prog would be found by execvp and is executable. */
static bool program_found(const char *prog)
{
    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0 && !util_is_dir(prog);
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/bin:/usr/bin";
    for (const char *d = path;;) {
        size_t k = strcspn(d, ":");
        char full[4096];
        if (snprintf(full, sizeof full, "%.*s%s%s", (int)k, k ? d : ".", "/", prog) < (int)sizeof full &&
            access(full, X_OK) == 0 && !util_is_dir(full))
            return true;
        if (!d[k])
            return false;
        d += k + 1;
    }
}

/* Splits CMD into m->argv (metrics.h: spaces/tabs, '…', "…" with \" \\, backslash). */
static int parse_command(metric *m, const char *spec, const char *cmd, char *err, size_t errlen)
{
    size_t n = strlen(cmd), argc = 0;
    /* at most n/2+1 words; one buffer holds every word's bytes */
    m->argv = calloc(n / 2 + 2, sizeof *m->argv);
    m->words = malloc(n + 1);
    if (!m->argv || !m->words)
        return util_errf(err, errlen, "metric '%s': out of memory.", spec);
    char *w = m->words;
    const char *p = cmd;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        char *start = w;
        while (*p && *p != ' ' && *p != '\t') {
            if (*p == '\'') {
                const char *e = strchr(p + 1, '\'');
                if (!e)
                    return util_errf(err, errlen,
                                     "metric '%s': the ' at character %zu of the command is never closed; "
                                     "close it or escape it with a backslash.",
                                     spec, (size_t)(p - cmd) + 1);
                memcpy(w, p + 1, (size_t)(e - p - 1));
                w += e - p - 1;
                p = e + 1;
            } else if (*p == '"') {
                const char *open = p++;
                while (*p && *p != '"') {
                    if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
                        p++;
                    *w++ = *p++;
                }
                if (!*p)
                    return util_errf(err, errlen,
                                     "metric '%s': the \" at character %zu of the command is never "
                                     "closed; close it or escape it with a backslash.",
                                     spec, (size_t)(open - cmd) + 1);
                p++;
            } else if (*p == '\\' && p[1]) {
                *w++ = p[1];
                p += 2;
            } else {
                *w++ = *p++;
            }
        }
        *w++ = 0;
        m->argv[argc++] = start;
    }
    if (argc == 0)
        return util_errf(err, errlen,
                         "metric '%s': script needs a command after the colon, e.g. "
                         "script:python3 score.py.",
                         spec);
    if (!program_found(m->argv[0]))
        return strchr(m->argv[0], '/')
                   ? util_errf(err, errlen,
                               "metric '%s': '%s' is not an executable file; make it executable "
                               "(chmod +x) or name its interpreter first (script:sh FILE).",
                               spec, m->argv[0])
                   : util_errf(err, errlen,
                               "metric '%s': the program '%s' is not on PATH; give its path or install "
                               "it.",
                               spec, m->argv[0]);
    return 0;
}

int metric_parse(const char *spec, metric **out, char *err, size_t errlen)
{
    *out = NULL;
    metric *m = calloc(1, sizeof *m);
    if (!m || !(m->name = strdup(spec))) {
        free(m);
        return util_errf(err, errlen, "metric '%s': out of memory.", spec);
    }
    m->timeout_s = METRIC_TIMEOUT_S;
    const char *colon = strchr(spec, ':');
    size_t head = colon ? (size_t)(colon - spec) : strlen(spec);
    const char *arg = colon ? colon + 1 : NULL;
#define IS(word) (head == strlen(word) && memcmp(spec, word, head) == 0)
    if (IS("exact_match") || IS("contains")) {
        m->kind = IS("exact_match") ? METRIC_EXACT_MATCH : METRIC_CONTAINS;
        if (arg && strcmp(arg, "nopunct") != 0) {
            util_errf(err, errlen, "metric '%s': unknown option '%s'; %.*s takes ':nopunct' or nothing.", spec, arg,
                      (int)head, spec);
            goto fail;
        }
        m->nopunct = arg != NULL;
    } else if (IS("regex")) {
        m->kind = arg ? METRIC_REGEX_EXTRACT : METRIC_REGEX;
        if (arg) {
            int ec;
            size_t eo;
            if (!*arg) {
                util_errf(err, errlen,
                          "metric '%s': the pattern after 'regex:' is empty; give a pattern, or write "
                          "'regex' alone to use each row's expected as its pattern.",
                          spec);
                goto fail;
            }
            if (compile_pattern(arg, strlen(arg), &m->re, &ec, &eo)) {
                char msg[160];
                pattern_message(ec, msg, sizeof msg);
                util_errf(err, errlen, "metric '%s': the pattern does not compile at offset %zu: %s; fix the pattern.",
                          spec, eo, msg);
                goto fail;
            }
        }
    } else if (IS("json_field")) {
        m->kind = METRIC_JSON_FIELD;
        if (parse_path(m, spec, arg ? arg : "", err, errlen))
            goto fail;
    } else if (IS("script")) {
        m->kind = METRIC_SCRIPT;
        if (parse_command(m, spec, arg ? arg : "", err, errlen))
            goto fail;
    } else if (IS("judge")) {
        m->kind = METRIC_JUDGE;
        if (arg) {
            util_errf(err, errlen, "metric '%s': judge takes no option; write 'judge' alone.", spec);
            goto fail;
        }
    } else {
        util_errf(err, errlen,
                  "metric '%s': unknown metric '%.*s'; use exact_match[:nopunct], contains[:nopunct], "
                  "regex, regex:PATTERN, json_field:PATH, script:CMD or judge.",
                  spec, (int)head, spec);
        goto fail;
    }
#undef IS
    if (m->kind == METRIC_REGEX || m->kind == METRIC_REGEX_EXTRACT) {
        m->mctx = pcre2_match_context_create(NULL);
        if (!m->mctx) {
            util_errf(err, errlen, "metric '%s': out of memory.", spec);
            goto fail;
        }
        pcre2_set_match_limit(m->mctx, RX_MATCH_LIMIT);
        pcre2_set_heap_limit(m->mctx, RX_HEAP_LIMIT_KB);
    }
    *out = m;
    return 0;
fail:
    metric_free(m);
    return -1;
}

void metric_free(metric *m)
{
    if (!m)
        return;
    free(m->name);
    pcre2_code_free(m->re);
    pcre2_match_context_free(m->mctx);
    for (size_t i = 0; i < m->n_steps; i++)
        free(m->steps[i].key);
    free(m->steps);
    free(m->words);
    free(m->argv);
    free(m);
}

const char *metric_name(const metric *m)
{
    return m->name;
}

metric_kind metric_get_kind(const metric *m)
{
    return m->kind;
}

int metric_set_timeout(metric *m, double seconds, char *err, size_t errlen)
{
    if (!(seconds > 0 && seconds <= 86400))
        return util_errf(err, errlen, "metric '%s': the timeout %g s is out of range; give seconds in (0, 86400].",
                         m->name, seconds);
    m->timeout_s = seconds;
    return 0;
}

/* ---- text metrics ----------------------------------------------------------------------------------------- */

/*
 * Searches re in [s, s+n).  Returns 1 with [*start, *end) the first match's
 * group 1 (or the whole match, metrics.h), 0 for no match, -1 with a sentence.
 */
static int rx_search(const metric *m, const pcre2_code *re, const char *s, size_t n, size_t *start, size_t *end,
                     const metric_row *row, char *err, size_t errlen)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return util_errf(err, errlen, "row '%s': out of memory for the pattern match.", row_name(row));
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, m->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) {
        pcre2_match_data_free(md);
        return 0;
    }
    if (rc < 0) {
        char msg[160];
        pattern_message(rc, msg, sizeof msg);
        pcre2_match_data_free(md);
        return util_errf(err, errlen,
                         "row '%s': the pattern could not be matched against the answer: %s; simplify "
                         "the pattern (nested repeats backtrack without bound).",
                         row_name(row), msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    /* group 1 when the pattern has one and it took part, else the whole match */
    int g = rc >= 2 && ov[2] != PCRE2_UNSET ? 1 : 0;
    *start = ov[2 * g];
    *end = ov[2 * g + 1];
    pcre2_match_data_free(md);
    return 1;
}

/* exact_match / contains / regex:PATTERN's comparison of `text` with every alternative of expected. */
static int text_compare(const metric *m, const metric_row *row, const char *text, size_t n, double *score, char *err,
                        size_t errlen)
{
    const json_t *e = row->expected;
    size_t n_alt = json_is_array(e) ? json_array_size(e) : 1;
    if (n_alt == 0)
        return util_errf(err, errlen, "row '%s': expected is an empty array; list at least one acceptable answer.",
                         row_name(row));
    char *na;
    size_t na_len;
    if (normalise(text, n, m->nopunct, &na, &na_len))
        return util_errf(err, errlen, "row '%s': out of memory normalising the answer.", row_name(row));
    int rc = 0;
    *score = 0;
    for (size_t i = 0; i < n_alt && *score == 0; i++) {
        const json_t *alt = json_is_array(e) ? json_array_get(e, i) : e;
        char *t = value_text(alt), *ne = NULL;
        size_t nne = 0;
        if (!t || normalise(t, strlen(t), m->nopunct, &ne, &nne)) {
            free(t);
            rc = util_errf(err, errlen, "row '%s': out of memory normalising expected.", row_name(row));
            break;
        }
        free(t);
        if (m->kind == METRIC_CONTAINS) {
            if (nne == 0) {
                rc = util_errf(err, errlen,
                               "row '%s': expected%s is empty after normalisation, so contains would match any answer; "
                               "give a non-empty expected.",
                               row_name(row), json_is_array(e) ? " holds an answer that" : "");
                free(ne);
                break;
            }
            if (memmem(na, na_len, ne, nne))
                *score = 1;
        } else if (nne == na_len && memcmp(na, ne, nne) == 0) {
            *score = 1;
        }
        free(ne);
    }
    free(na);
    return rc;
}

/* "regex": every row pattern in expected, 1 when one matches anywhere in the raw answer. */
static int regex_row(const metric *m, const metric_row *row, const char *a, size_t n, double *score, char *err,
                     size_t errlen)
{
    const json_t *e = row->expected;
    size_t n_alt = json_is_array(e) ? json_array_size(e) : 1;
    if (n_alt == 0)
        return util_errf(err, errlen, "row '%s': expected is an empty array; list at least one pattern.",
                         row_name(row));
    *score = 0;
    for (size_t i = 0; i < n_alt && *score == 0; i++) {
        const json_t *p = json_is_array(e) ? json_array_get(e, i) : e;
        if (!json_is_string(p))
            return util_errf(err, errlen,
                             "row '%s': expected%s is not a string, and the regex metric reads it as a "
                             "pattern; write the pattern as a JSON string.",
                             row_name(row), json_is_array(e) ? " holds a value that" : "");
        pcre2_code *re;
        int ec;
        size_t eo, s, t;
        if (compile_pattern(json_string_value(p), json_string_length(p), &re, &ec, &eo)) {
            char msg[160];
            pattern_message(ec, msg, sizeof msg);
            return util_errf(err, errlen,
                             "row '%s': the pattern in expected does not compile at offset %zu: %s; fix "
                             "the row's expected.",
                             row_name(row), eo, msg);
        }
        int rc = rx_search(m, re, a, n, &s, &t, row, err, errlen);
        pcre2_code_free(re);
        if (rc < 0)
            return -1;
        *score = rc;
    }
    return 0;
}

/* ---- json_field -------------------------------------------------------------------------------------------- */

static bool ws_byte(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* The answer's JSON (metrics.h's three places, in order), a new reference, or NULL. */
static json_t *answer_json(const char *a, size_t n)
{
    size_t b = 0, e = n;
    while (b < e && ws_byte(a[b]))
        b++;
    while (e > b && ws_byte(a[e - 1]))
        e--;
    json_t *v = json_loadb(a + b, e - b, JSON_DECODE_ANY, NULL);
    if (v)
        return v;
    /* fenced blocks: ``` TAG \n CONTENT ``` */
    for (const char *p = a, *end = a + n;;) {
        const char *f = memmem(p, (size_t)(end - p), "```", 3);
        if (!f)
            break;
        const char *tag = f + 3, *nl = memchr(tag, '\n', (size_t)(end - tag));
        if (!nl)
            break;
        const char *close = memmem(nl + 1, (size_t)(end - nl - 1), "```", 3);
        if (!close)
            break;
        const char *t = tag, *te = nl;
        while (t < te && ws_byte(*t))
            t++;
        while (te > t && ws_byte(te[-1]))
            te--;
        if (te == t || (te - t == 4 && strncasecmp(t, "json", 4) == 0)) {
            v = json_loadb(nl + 1, (size_t)(close - nl - 1), JSON_DECODE_ANY, NULL);
            if (v)
                return v;
        }
        p = close + 3;
    }
    int tries = 0;
    for (size_t i = 0; i < n && tries < JSON_SPAN_TRIES; i++) {
        if (a[i] != '{' && a[i] != '[')
            continue;
        tries++;
        v = json_loadb(a + i, n - i, JSON_DISABLE_EOF_CHECK, NULL);
        if (v)
            return v;
    }
    return NULL;
}

/* JSON equality of metrics.h.  -1 when out of memory normalising strings. */
static int json_same(const json_t *x, const json_t *y)
{
    if (json_is_number(x) && json_is_number(y)) {
        if (json_is_integer(x) && json_is_integer(y))
            return json_integer_value(x) == json_integer_value(y);
        return json_number_value(x) == json_number_value(y);
    }
    if (json_typeof(x) != json_typeof(y))
        return 0;
    switch (json_typeof(x)) {
    case JSON_STRING: {
        char *a, *b;
        size_t an, bn;
        if (normalise(json_string_value(x), json_string_length(x), false, &a, &an))
            return -1;
        if (normalise(json_string_value(y), json_string_length(y), false, &b, &bn)) {
            free(a);
            return -1;
        }
        int same = an == bn && memcmp(a, b, an) == 0;
        free(a);
        free(b);
        return same;
    }
    case JSON_ARRAY:
        if (json_array_size(x) != json_array_size(y))
            return 0;
        for (size_t i = 0; i < json_array_size(x); i++) {
            int s = json_same(json_array_get(x, i), json_array_get(y, i));
            if (s != 1)
                return s;
        }
        return 1;
    case JSON_OBJECT: {
        if (json_object_size(x) != json_object_size(y))
            return 0;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)x, k, v)
        {
            const json_t *w = json_object_get(y, k);
            int s = w ? json_same(v, w) : 0;
            if (s != 1)
                return s;
        }
        return 1;
    }
    default: /* true, false, null: the type is the value */
        return 1;
    }
}

static int json_field(const metric *m, const metric_row *row, const char *a, size_t n, double *score, char *err,
                      size_t errlen)
{
    *score = 0;
    json_t *doc = answer_json(a, n);
    if (!doc)
        return 0;
    const json_t *v = doc;
    for (size_t i = 0; i < m->n_steps && v; i++)
        v = m->steps[i].key ? json_object_get(v, m->steps[i].key) : json_array_get(v, m->steps[i].index);
    int same = v ? json_same(v, row->expected) : 0;
    json_decref(doc);
    if (same < 0)
        return util_errf(err, errlen, "row '%s': out of memory comparing the field.", row_name(row));
    *score = same;
    return 0;
}

/* ---- script -------------------------------------------------------------------------------------------- */

/* Appends to a buffer that keeps only its last `keep` bytes. */
static void tail_put(char *buf, size_t keep, size_t *n, const char *s, size_t k)
{
    if (k >= keep) {
        memcpy(buf, s + k - keep, keep);
        *n = keep;
        return;
    }
    if (*n + k > keep) {
        size_t drop = *n + k - keep;
        memmove(buf, buf + drop, *n - drop);
        *n -= drop;
    }
    memcpy(buf + *n, s, k);
    *n += k;
}

/* The last non-empty line of [s, s+n), trimmed: sets *b and *len. */
static void last_line(const char *s, size_t n, const char **b, size_t *len)
{
    size_t e = n;
    while (e > 0 && ws_byte(s[e - 1]))
        e--;
    size_t st = e;
    while (st > 0 && s[st - 1] != '\n')
        st--;
    while (st < e && ws_byte(s[st]))
        st++;
    *b = s + st;
    *len = e - st;
}

/* Up to QUOTE_MAX bytes of s for a sentence: printable ASCII kept, other bytes as '?', "…" when cut. */
static void quote(const char *s, size_t n, char out[QUOTE_MAX + 8])
{
    size_t k = n < QUOTE_MAX ? n : QUOTE_MAX, w = 0;
    for (size_t i = 0; i < k; i++)
        out[w++] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    if (n > k) {
        memcpy(out + w, "...", 3);
        w += 3;
    }
    out[w] = 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The row as the script reads it (metrics.h), a malloc'd line, or NULL when out of memory. */
static char *script_input(const metric_row *row, const char *a, size_t n)
{
    const char *clean;
    size_t clean_n;
    char *owned, *line = NULL;
    if (utf8_clean(a, n, &clean, &clean_n, &owned))
        return NULL;
    json_t *o = json_object();
    /* json_object_set takes its own reference to the borrowed values */
    if (o && (!row->custom_id || json_object_set_new(o, "custom_id", json_string(row->custom_id)) == 0) &&
        (!row->messages || json_object_set(o, "messages", row->messages) == 0) &&
        (!row->prompt || json_object_set(o, "prompt", row->prompt) == 0) &&
        (!row->expected || json_object_set(o, "expected", row->expected) == 0) &&
        json_object_set_new(o, "answer", json_stringn(clean, clean_n)) == 0) {
        char *s = json_dumps(o, JSON_COMPACT);
        if (s) {
            size_t k = strlen(s);
            line = realloc(s, k + 2);
            if (line)
                memcpy(line + k, "\n", 2);
            else
                free(s);
        }
    }
    json_decref(o);
    free(owned);
    return line;
}

/*
 * Reads the score from the script's stdout.  0 with *score, or -1 with a
 * sentence (`who` names the row and the command).
 */
static int script_verdict(const char *who, const char *out, size_t n, double *score, char *err, size_t errlen)
{
    const char *l;
    size_t k;
    char q[QUOTE_MAX + 8], num[64];
    last_line(out, n, &l, &k);
    if (k == 0)
        return util_errf(err, errlen, "%s printed no score; print one number in [0, 1] or true/false.", who);
    if (k == 4 && strncasecmp(l, "true", 4) == 0) {
        *score = 1;
        return 0;
    }
    if (k == 5 && strncasecmp(l, "false", 5) == 0) {
        *score = 0;
        return 0;
    }
    quote(l, k, q);
    if (k < sizeof num) {
        memcpy(num, l, k);
        num[k] = 0;
        char *e;
        errno = 0;
        double v = strtod(num, &e);
        if (e != num && !*e && errno == 0 && isfinite(v)) {
            if (v >= 0 && v <= 1) {
                *score = v;
                return 0;
            }
            return util_errf(err, errlen, "%s printed the score %s, outside [0, 1]; print a score in [0, 1].", who, q);
        }
    }
    return util_errf(err, errlen,
                     "%s printed '%s' where a score was expected; print one number in [0, 1] or "
                     "true/false as the last line of stdout.",
                     who, q);
}

/*
 * Starts argv with stdin/stdout/stderr on in/out/errfd, in a new process
 * group, SIGPIPE at its default and no signal blocked.  0 with *pid, or an
 * errno (a failed exec included: glibc's posix_spawn reports it).
 */
static int script_spawn(char *const *argv, int in, int out, int errfd, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int e = posix_spawn_file_actions_init(&fa);
    if (e)
        return e;
    e = posix_spawnattr_init(&at);
    if (e) {
        posix_spawn_file_actions_destroy(&fa);
        return e;
    }
    sigset_t none, pipe_default;
    sigemptyset(&none);
    sigemptyset(&pipe_default);
    sigaddset(&pipe_default, SIGPIPE);
    if (!(e = posix_spawn_file_actions_adddup2(&fa, in, 0)) && !(e = posix_spawn_file_actions_adddup2(&fa, out, 1)) &&
        !(e = posix_spawn_file_actions_adddup2(&fa, errfd, 2)) &&
        !(e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)) &&
        !(e = posix_spawnattr_setpgroup(&at, 0)) && !(e = posix_spawnattr_setsigmask(&at, &none)) &&
        !(e = posix_spawnattr_setsigdefault(&at, &pipe_default)))
        e = posix_spawnp(pid, argv[0], &fa, &at, argv, environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    return e;
}

static int script_score(const metric *m, const metric_row *row, const char *a, size_t n, double *score, char *err,
                        size_t errlen)
{
    char who[512];
    snprintf(who, sizeof who, "row '%s': the script '%s'", row_name(row), m->argv[0]);
    char *input = script_input(row, a, n);
    if (!input)
        return util_errf(err, errlen, "%s could not be given the row: out of memory.", who);
    size_t in_len = strlen(input), in_off = 0;
    int sv[2] = {-1, -1}, po[2] = {-1, -1}, pe[2] = {-1, -1}, rc = -1, status = 0;
    char out[SCRIPT_OUT_KEEP], errb[SCRIPT_ERR_KEEP];
    size_t out_n = 0, err_n = 0;
    pid_t pid;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) || pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        util_errf(err, errlen, "%s could not be started: %s.", who, strerror(errno));
        goto out_close;
    }
    int e = script_spawn(m->argv, sv[1], po[1], pe[1], &pid);
    if (e) {
        util_errf(err, errlen, "%s could not be started: %s; check the command and its #! line.", who, strerror(e));
        goto out_close;
    }
    close(sv[1]);
    close(po[1]);
    close(pe[1]);
    sv[1] = po[1] = pe[1] = -1;
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);

    double deadline = now_s() + m->timeout_s;
    bool timed_out = false, reaped = false;
    int fd_in = sv[0], fd_out = po[0], fd_err = pe[0];
    while (fd_out >= 0 || fd_err >= 0 || !reaped) {
        double left = deadline - now_s();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        if (fd_out < 0 && fd_err < 0) { /* both closed: the script may still run; wait for it within the limit */
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) {
                reaped = true;
                break;
            }
            if (w < 0 && errno != EINTR) {
                util_errf(err, errlen, "%s could not be waited for: %s.", who, strerror(errno));
                goto out_kill;
            }
            struct timespec nap = {0, 2000000};
            nanosleep(&nap, NULL);
            continue;
        }
        struct pollfd pf[3] = {
            {fd_in >= 0 && in_off < in_len ? fd_in : -1, POLLOUT, 0},
            {fd_out, POLLIN, 0},
            {fd_err, POLLIN, 0},
        };
        int timeout_ms = (int)(left * 1000) + 1;
        int np = poll(pf, 3, timeout_ms);
        if (np < 0 && errno != EINTR) {
            util_errf(err, errlen, "%s could not be watched: poll: %s.", who, strerror(errno));
            goto out_kill;
        }
        if (np <= 0)
            continue;
        if (pf[0].revents) {
            ssize_t w = send(fd_in, input + in_off, in_len - in_off, MSG_NOSIGNAL);
            if (w > 0)
                in_off += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                in_off = in_len; /* the script stopped reading (EPIPE, …): what it prints still decides */
            if (in_off == in_len) {
                close(fd_in);
                sv[0] = fd_in = -1;
            }
        }
        for (int k = 1; k <= 2; k++) {
            if (!pf[k].revents)
                continue;
            char chunk[4096];
            ssize_t got = read(pf[k].fd, chunk, sizeof chunk);
            if (got < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (got <= 0) {
                close(pf[k].fd);
                if (k == 1)
                    po[0] = fd_out = -1;
                else
                    pe[0] = fd_err = -1;
            } else if (k == 1) {
                tail_put(out, sizeof out, &out_n, chunk, (size_t)got);
            } else {
                tail_put(errb, sizeof errb, &err_n, chunk, (size_t)got);
            }
        }
    }
    if (timed_out) {
        util_errf(err, errlen, "%s did not finish within %g s and was killed; make it faster or raise the timeout.",
                  who, m->timeout_s);
        goto out_kill;
    }
    const char *el;
    size_t ek;
    char eq[QUOTE_MAX + 8];
    last_line(errb, err_n, &el, &ek);
    quote(el, ek, eq);
    if (WIFSIGNALED(status)) {
        util_errf(err, errlen, "%s crashed (signal %d, %s)%s%s%s; fix the script.", who, WTERMSIG(status),
                  strsignal(WTERMSIG(status)), ek ? ": '" : "", eq, ek ? "'" : "");
        goto out_close;
    }
    if (WEXITSTATUS(status) != 0) {
        util_errf(err, errlen, "%s exited with status %d%s%s%s; fix the script or the row.", who, WEXITSTATUS(status),
                  ek ? ": '" : "", eq, ek ? "'" : "");
        goto out_close;
    }
    rc = script_verdict(who, out, out_n, score, err, errlen);
    goto out_close;

out_kill:
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
out_close:
    for (int i = 0; i < 2; i++) {
        int *fds[] = {sv, po, pe};
        for (int k = 0; k < 3; k++)
            if (fds[k][i] >= 0)
                close(fds[k][i]);
    }
    free(input);
    return rc;
}

/* ---- scoring ----------------------------------------------------------------------------------------------- */

int metric_score(const metric *m, const metric_row *row, const char *answer, size_t len, double *score, char *err,
                 size_t errlen)
{
    *score = 0;
    if (m->kind == METRIC_JUDGE)
        return util_errf(err, errlen,
                         "row '%s': the judge metric is scored by a judge model, not by metric_score; "
                         "build its chat with metric_judge_messages.",
                         row_name(row));
    if (!row->expected && m->kind != METRIC_SCRIPT)
        return util_errf(err, errlen,
                         "row '%s': the row has no expected value for metric '%s'; add \"expected\" "
                         "to the row.",
                         row_name(row), m->name);
    switch (m->kind) {
    case METRIC_EXACT_MATCH:
    case METRIC_CONTAINS:
        return text_compare(m, row, answer, len, score, err, errlen);
    case METRIC_REGEX:
        return regex_row(m, row, answer, len, score, err, errlen);
    case METRIC_REGEX_EXTRACT: {
        size_t s, e;
        int rc = rx_search(m, m->re, answer, len, &s, &e, row, err, errlen);
        if (rc <= 0)
            return rc;
        return text_compare(m, row, answer + s, e - s, score, err, errlen);
    }
    case METRIC_JSON_FIELD:
        return json_field(m, row, answer, len, score, err, errlen);
    case METRIC_SCRIPT:
        return script_score(m, row, answer, len, score, err, errlen);
    default:
        return util_errf(err, errlen, "row '%s': metric '%s' has no scorer.", row_name(row), m->name);
    }
}

/* ---- interval ---------------------------------------------------------------------------------------------- */

/* Student's t 0.975 quantile for df 1..30 (standard tables, to 9 decimals; test_metrics.c rechecks some). */
static const double T975[30] = {
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252, 2.306004135,
    2.262157163,  2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546, 2.119905299,
    2.109815578,  2.100922040, 2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
    2.059538553,  2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456,
};

#define Z975 1.959963984540054

static double t975(size_t df)
{
    if (df >= 1 && df <= 30)
        return T975[df - 1];
    /* Cornish–Fisher expansion of Student's t around the normal quantile (four terms): error < 3e-8 for df > 30 */
    double z = Z975, z2 = z * z, d = (double)df;
    double g1 = (z2 + 1) * z / 4, g2 = ((5 * z2 + 16) * z2 + 3) * z / 96,
           g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384,
           g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160;
    return z + (g1 + (g2 + (g3 + g4 / d) / d) / d) / d;
}

static double clip01(double v)
{
    return v < 0 ? 0 : v > 1 ? 1 : v;
}

void metric_interval(const double *scores, size_t n, double *mean, double *lo, double *hi)
{
    if (n == 0) {
        *mean = *lo = *hi = NAN;
        return;
    }
    double sum = 0;
    bool binary = true;
    for (size_t i = 0; i < n; i++) {
        sum += scores[i];
        binary = binary && (scores[i] == 0 || scores[i] == 1);
    }
    double dn = (double)n, p = sum / dn;
    *mean = p;
    if (binary) {
        double z2 = Z975 * Z975, d = 1 + z2 / dn;
        double c = (p + z2 / (2 * dn)) / d, h = Z975 * sqrt(p * (1 - p) / dn + z2 / (4 * dn * dn)) / d;
        *lo = clip01(c - h);
        *hi = clip01(c + h);
        return;
    }
    if (n == 1) {
        *lo = 0;
        *hi = 1;
        return;
    }
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (scores[i] - p) * (scores[i] - p);
    double se = sqrt(ss / (dn - 1) / dn), h = t975(n - 1) * se;
    *lo = clip01(p - h);
    *hi = clip01(p + h);
}

/* ---- judge ----------------------------------------------------------------------------------------------- */

/* A message's text: the content string, or its text parts joined by newlines. */
static int message_text(const json_t *msg, sbuf *b)
{
    const json_t *c = json_object_get(msg, "content");
    if (json_is_string(c))
        return sb_put(b, json_string_value(c), json_string_length(c));
    size_t i, parts = 0;
    const json_t *part;
    json_array_foreach(c, i, part)
    {
        const json_t *t = json_object_get(part, "text");
        if (!json_is_string(t))
            continue;
        if ((parts++ && sb_str(b, "\n")) || sb_put(b, json_string_value(t), json_string_length(t)))
            return -1;
    }
    return 0;
}

char *metric_judge_question(const metric_row *row)
{
    sbuf b = {0};
    if (row->prompt) {
        if (json_is_string(row->prompt))
            return strndup(json_string_value(row->prompt), json_string_length(row->prompt));
        return json_dumps(row->prompt, JSON_COMPACT | JSON_ENCODE_ANY);
    }
    const char *role0 = json_string_value(json_object_get(json_array_get(row->messages, 0), "role"));
    if (json_array_size(row->messages) == 1 && role0 && strcmp(role0, "user") == 0) {
        if (message_text(json_array_get(row->messages, 0), &b))
            goto fail;
    } else {
        size_t i;
        const json_t *msg;
        json_array_foreach(row->messages, i, msg)
        {
            sbuf t = {0};
            if (message_text(msg, &t)) {
                free(t.p);
                goto fail;
            }
            if (t.n > 0) {
                const char *role = json_string_value(json_object_get(msg, "role"));
                if ((b.n && sb_str(&b, "\n\n")) || sb_str(&b, role ? role : "unknown") || sb_str(&b, ": ") ||
                    sb_put(&b, t.p, t.n)) {
                    free(t.p);
                    goto fail;
                }
            }
            free(t.p);
        }
    }
    if (!b.p && sb_put(&b, "", 0))
        goto fail;
    return b.p;
fail:
    free(b.p);
    return NULL;
}

/* Appends [s, s+n) with invalid UTF-8 as U+FFFD. */
static int sb_clean(sbuf *b, const char *s, size_t n)
{
    const char *c;
    size_t cn;
    char *owned;
    if (utf8_clean(s, n, &c, &cn, &owned))
        return -1;
    int rc = sb_put(b, c, cn);
    free(owned);
    return rc;
}

json_t *metric_judge_messages(const char *question, const json_t *expected, const char *answer, size_t len)
{
    sbuf b = {0};
    json_t *msgs = NULL;
    if (sb_str(&b, METRIC_JUDGE_INSTRUCTIONS "\n\n<question>\n") || sb_clean(&b, question, strlen(question)) ||
        sb_str(&b, "\n</question>\n\n<reference>\n"))
        goto out;
    if (expected) {
        size_t n_alt = json_is_array(expected) ? json_array_size(expected) : 1;
        for (size_t i = 0; i < n_alt; i++) {
            char *t = value_text(json_is_array(expected) ? json_array_get(expected, i) : expected);
            int bad = !t || (json_is_array(expected) && ((i && sb_str(&b, "\n")) || sb_str(&b, "- "))) ||
                      sb_clean(&b, t, strlen(t));
            free(t);
            if (bad)
                goto out;
        }
    }
    if (sb_str(&b, "\n</reference>\n\n<answer>\n") || sb_clean(&b, answer, len) || sb_str(&b, "\n</answer>"))
        goto out;
    json_t *msg = json_pack("{s:s, s:s%}", "role", "user", "content", b.p, b.n);
    msgs = msg ? json_pack("[o]", msg) : NULL;
out:
    free(b.p);
    return msgs;
}

/* Case-insensitive: does [s, s+n) start with the word w (not followed by a letter)? */
static bool word_at(const char *s, size_t n, const char *w)
{
    size_t k = strlen(w);
    return n >= k && strncasecmp(s, w, k) == 0 && (n == k || !isalpha((unsigned char)s[k]));
}

int metric_judge_parse(const char *text, size_t len, double *score, char *err, size_t errlen)
{
    int found = -1;
    for (size_t i = 0; i + 7 <= len; i++) {
        if (strncasecmp(text + i, "verdict", 7) != 0)
            continue;
        size_t j = i + 7;
        while (j < len && (text[j] == ' ' || text[j] == '\t' || text[j] == ':' || text[j] == '*'))
            j++;
        if (word_at(text + j, len - j, "incorrect"))
            found = 0;
        else if (word_at(text + j, len - j, "correct"))
            found = 1;
    }
    if (found < 0) {
        size_t b = 0, e = len;
        while (b < e && (ws_byte(text[b]) || text[b] == '*'))
            b++;
        while (e > b && (ws_byte(text[e - 1]) || text[e - 1] == '*' || text[e - 1] == '.'))
            e--;
        if (e - b == 7 && strncasecmp(text + b, "correct", 7) == 0)
            found = 1;
        else if (e - b == 9 && strncasecmp(text + b, "incorrect", 9) == 0)
            found = 0;
    }
    if (found < 0) {
        char q[QUOTE_MAX + 8];
        quote(text, len, q);
        return util_errf(err, errlen,
                         "the judge's reply '%s' has no line 'VERDICT: CORRECT' or 'VERDICT: "
                         "INCORRECT'; check that the judge model follows the prompt, or use a stronger judge.",
                         q);
    }
    *score = found;
    return 0;
}
