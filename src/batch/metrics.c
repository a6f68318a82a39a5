/*
 * metrics.c — the scoring rules of `spill eval` (metrics.h states them).  Normalisation uses utf8proc (NFC,
 * case folding, the White_Space and punctuation categories); regular expressions PCRE2 with UTF and Unicode
 * properties; the script metric forks and execs the command directly (no shell), feeds the row on a pipe and
 * reads at most 64 KiB of its output within the timeout, then kills it.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "metrics.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pcre2.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "../base/util.h"

enum mkind { M_EXACT, M_CONTAINS, M_REGEX_ROW, M_REGEX, M_JSON_FIELD, M_SCRIPT, M_JUDGE };

#define MAX_PATH_STEPS 32
#define MAX_ARGS 32

typedef struct path_step {
    char *key; /* NULL: an index */
    size_t index;
} path_step;

struct metric {
    enum mkind kind;
    bool nopunct;
    char *spec;
    pcre2_code *re;
    path_step steps[MAX_PATH_STEPS];
    int n_steps;
    char *args[MAX_ARGS + 1];
    double timeout_s;
};

/* ---------------------------------------------------------------- normalisation */

/* NFC + case fold, white space runs -> one space, trimmed, punctuation dropped with nopunct; malloc'd. */
static char *normalise(const char *s, size_t len, bool nopunct)
{
    utf8proc_uint8_t *folded = NULL;
    utf8proc_ssize_t n =
        utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &folded,
                     UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_CASEFOLD | UTF8PROC_IGNORE);
    if (n < 0) { /* invalid UTF-8: compare the bytes as they are */
        folded = malloc(len + 1);
        if (!folded)
            return NULL;
        memcpy(folded, s, len);
        folded[len] = 0;
        n = (utf8proc_ssize_t)len;
    }
    char *out = malloc((size_t)n + 1);
    if (!out) {
        free(folded);
        return NULL;
    }
    size_t o = 0;
    bool space = false;
    for (utf8proc_ssize_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(folded + i, n - i, &cp);
        if (k <= 0) { /* a stray byte */
            out[o++] = (char)folded[i++];
            space = false;
            continue;
        }
        utf8proc_category_t cat = utf8proc_category(cp);
        bool ws = cp == '\t' || cp == '\n' || cp == '\r' || cp == '\f' || cp == '\v' || cat == UTF8PROC_CATEGORY_ZS ||
                  cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP || cp == 0x85;
        bool punct = cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
        if (ws)
            space = true;
        else if (!(nopunct && punct)) {
            if (space && o > 0)
                out[o++] = ' ';
            space = false;
            memcpy(out + o, folded + i, (size_t)k);
            o += (size_t)k;
        }
        i += k;
    }
    out[o] = 0;
    free(folded);
    return out;
}

/* The text an expected value stands for: a string's own, else its compact JSON. */
static char *expected_text(const json_t *e)
{
    if (json_is_string(e))
        return strndup(json_string_value(e), json_string_length(e));
    return json_dumps(e, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* ---------------------------------------------------------------- parse */

static int parse_path(metric *m, const char *p, char *err, size_t errlen)
{
    if (!*p)
        return util_errf(err, errlen, "json_field needs a path after the colon (json_field:answer or json_field:a.b[0]).");
    while (*p) {
        if (m->n_steps == MAX_PATH_STEPS)
            return util_errf(err, errlen, "json_field path %s has more than %d steps.", m->spec, MAX_PATH_STEPS);
        path_step *s = &m->steps[m->n_steps];
        if (*p == '[') {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(p + 1, &end, 10);
            if (end == p + 1 || *end != ']' || errno)
                return util_errf(err, errlen, "json_field path %s: \"%.20s\" is not an index like [0].", m->spec, p);
            s->key = NULL;
            s->index = (size_t)v;
            p = end + 1;
        } else {
            size_t n = strcspn(p, ".[");
            if (n == 0)
                return util_errf(err, errlen, "json_field path %s has an empty key; write keys as a.b[0].c.", m->spec);
            s->key = strndup(p, n);
            if (!s->key)
                return util_errf(err, errlen, "out of memory.");
            p += n;
        }
        m->n_steps++;
        if (*p == '.') {
            p++;
            if (!*p || *p == '.' || *p == '[')
                return util_errf(err, errlen, "json_field path %s has an empty key; write keys as a.b[0].c.", m->spec);
        } else if (*p && *p != '[')
            return util_errf(err, errlen, "json_field path %s: unexpected \"%.20s\".", m->spec, p);
    }
    return 0;
}

static pcre2_code *compile_re(const char *pat, size_t len, char *err, size_t errlen, const char *what)
{
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        util_errf(err, errlen, "%s regex %.200s is not valid: %s at offset %zu.", what, pat, (const char *)msg,
                  (size_t)off);
    }
    return re;
}

static int parse_args(metric *m, const char *cmd, char *err, size_t errlen)
{
    int na = 0;
    const char *p = cmd;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        if (na == MAX_ARGS)
            return util_errf(err, errlen, "script command has more than %d words.", MAX_ARGS);
        char *w = malloc(strlen(p) + 1);
        if (!w)
            return util_errf(err, errlen, "out of memory.");
        size_t o = 0;
        char q = 0;
        while (*p && (q || (*p != ' ' && *p != '\t'))) {
            if (!q && (*p == '"' || *p == '\''))
                q = *p;
            else if (q && *p == q)
                q = 0;
            else
                w[o++] = *p;
            p++;
        }
        w[o] = 0;
        m->args[na++] = w;
        if (q)
            return util_errf(err, errlen, "script command %s has an unclosed %c quote.", cmd, q);
    }
    if (!na)
        return util_errf(err, errlen, "script: needs a command after the colon (script:python3 grade.py).");
    m->args[na] = NULL;
    return 0;
}

int metric_parse(const char *spec, metric **out, char *err, size_t errlen)
{
    *out = NULL;
    metric *m = calloc(1, sizeof *m);
    if (!m || !(m->spec = strdup(spec))) {
        free(m);
        return util_errf(err, errlen, "out of memory.");
    }
    m->timeout_s = 10;
    int rc = 0;
    if (!strcmp(spec, "exact_match"))
        m->kind = M_EXACT;
    else if (!strcmp(spec, "exact_match:nopunct"))
        m->kind = M_EXACT, m->nopunct = true;
    else if (!strcmp(spec, "contains"))
        m->kind = M_CONTAINS;
    else if (!strcmp(spec, "regex"))
        m->kind = M_REGEX_ROW;
    else if (!strncmp(spec, "regex:", 6)) {
        m->kind = M_REGEX;
        if (!(m->re = compile_re(spec + 6, strlen(spec + 6), err, errlen, "--metric")))
            rc = -1;
    } else if (!strncmp(spec, "json_field:", 11)) {
        m->kind = M_JSON_FIELD;
        rc = parse_path(m, spec + 11, err, errlen);
    } else if (!strncmp(spec, "script:", 7)) {
        m->kind = M_SCRIPT;
        char *cmd = strdup(spec + 7);
        char *at = cmd ? strrchr(cmd, '@') : NULL;
        if (at) {
            char *end;
            double t = strtod(at + 1, &end);
            if (end != at + 1 && !*end && t > 0)
                m->timeout_s = t, *at = 0;
        }
        rc = cmd ? parse_args(m, cmd, err, errlen) : util_errf(err, errlen, "out of memory.");
        free(cmd);
    } else if (!strcmp(spec, "judge"))
        m->kind = M_JUDGE;
    else
        rc = util_errf(err, errlen,
                       "unknown metric \"%s\"; use exact_match, exact_match:nopunct, contains, regex, regex:PATTERN, "
                       "json_field:PATH, judge or script:CMD.",
                       spec);
    if (rc) {
        metric_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void metric_free(metric *m)
{
    if (!m)
        return;
    free(m->spec);
    if (m->re)
        pcre2_code_free(m->re);
    for (int i = 0; i < m->n_steps; i++)
        free(m->steps[i].key);
    for (int i = 0; m->args[i]; i++)
        free(m->args[i]);
    free(m);
}

const char *metric_name(const metric *m)
{
    return m->spec;
}

/* ---------------------------------------------------------------- text metrics */

/* 1 when pattern re finds a match in s; with extract, *cap and *caplen get group 1 (or the whole match). */
static int re_find(const pcre2_code *re, const char *s, size_t len, bool extract, char **cap, size_t *caplen)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return -1;
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, 0, 0, md, NULL);
    int found = rc > 0 || rc == 0;
    if (found && extract) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        int g = rc > 1 && ov[2] != PCRE2_UNSET ? 1 : 0;
        *caplen = ov[2 * g + 1] - ov[2 * g];
        *cap = strndup(s + ov[2 * g], *caplen);
    }
    pcre2_match_data_free(md);
    return rc < 0 && rc != PCRE2_ERROR_NOMATCH ? -1 : found;
}

/* One acceptable expected value (a string's text or JSON text) against the answer. */
static int score_one(const metric *m, const char *exp, const char *answer, size_t len, double *score, char *err,
                     size_t errlen)
{
    char *na = NULL, *ne = NULL;
    int rc = 0;
    switch (m->kind) {
    case M_EXACT:
    case M_CONTAINS:
        na = normalise(answer, len, m->nopunct);
        ne = normalise(exp, strlen(exp), m->nopunct);
        if (!na || !ne)
            rc = util_errf(err, errlen, "out of memory.");
        else
            *score = m->kind == M_EXACT ? !strcmp(na, ne) : strstr(na, ne) != NULL;
        break;
    case M_REGEX_ROW: {
        pcre2_code *re = compile_re(exp, strlen(exp), err, errlen, "the row's expected");
        if (!re)
            return -1;
        int f = re_find(re, answer, len, false, NULL, NULL);
        pcre2_code_free(re);
        if (f < 0)
            return util_errf(err, errlen, "the row's regex %.200s failed to run on the answer.", exp);
        *score = f;
        break;
    }
    case M_REGEX: {
        char *cap = NULL;
        size_t cl = 0;
        int f = re_find(m->re, answer, len, true, &cap, &cl);
        if (f < 0)
            return util_errf(err, errlen, "regex %s failed to run on the answer.", m->spec + 6);
        if (!f) {
            *score = 0;
            break;
        }
        na = cap ? normalise(cap, cl, false) : NULL;
        ne = normalise(exp, strlen(exp), false);
        free(cap);
        if (!na || !ne)
            rc = util_errf(err, errlen, "out of memory.");
        else
            *score = !strcmp(na, ne);
        break;
    }
    default:
        rc = util_errf(err, errlen, "metric %s does not score text.", m->spec);
    }
    free(na);
    free(ne);
    return rc;
}

/* ---------------------------------------------------------------- json_field */

/* The answer as JSON: the whole (trimmed) text, a ```json fence, or the outermost {...} / [...] span. */
static json_t *answer_json(const char *a, size_t len)
{
    json_t *j = json_loadb(a, len, JSON_DECODE_ANY, NULL);
    if (j)
        return j;
    const char *f = memmem(a, len, "```", 3);
    if (f) {
        const char *body = memchr(f + 3, '\n', len - (size_t)(f + 3 - a));
        const char *end = body ? memmem(body, len - (size_t)(body - a), "```", 3) : NULL;
        if (body && end && (j = json_loadb(body + 1, (size_t)(end - body - 1), JSON_DECODE_ANY, NULL)))
            return j;
    }
    for (int k = 0; k < 2; k++) {
        char open = k ? '[' : '{', close = k ? ']' : '}';
        const char *s = memchr(a, open, len), *e = NULL;
        for (const char *p = a + len; p > a && !e; p--)
            if (p[-1] == close)
                e = p;
        if (s && e && e > s && (j = json_loadb(s, (size_t)(e - s), 0, NULL)))
            return j;
    }
    return NULL;
}

static double json_field_score(const metric *m, const json_t *expected, const char *answer, size_t len)
{
    json_t *doc = answer_json(answer, len);
    const json_t *v = doc;
    for (int i = 0; v && i < m->n_steps; i++)
        v = m->steps[i].key ? json_object_get(v, m->steps[i].key) : json_array_get(v, m->steps[i].index);
    double s = 0;
    if (v) {
        if (json_is_number(v) && json_is_number(expected))
            s = json_number_value(v) == json_number_value(expected);
        else if (json_is_string(v) && json_is_string(expected)) {
            char *a = normalise(json_string_value(v), json_string_length(v), false),
                 *b = normalise(json_string_value(expected), json_string_length(expected), false);
            s = a && b && !strcmp(a, b);
            free(a), free(b);
        } else
            s = json_equal(v, expected);
    }
    json_decref(doc);
    return s;
}

/* ---------------------------------------------------------------- script */

static double mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int script_score(const metric *m, const json_t *row, const json_t *expected, const char *answer, size_t len,
                        double *score, char *err, size_t errlen)
{
    const char *id = json_string_value(json_object_get(row, "custom_id"));
    json_t *in = json_pack("{s:s?,s:O,s:O,s:s%}", "custom_id", id, "request", row, "expected", expected, "answer",
                           answer, len);
    char *text = in ? json_dumps(in, JSON_COMPACT) : NULL;
    json_decref(in);
    if (!text)
        return util_errf(err, errlen, "out of memory.");
    int pin[2], pout[2];
    if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC)) {
        free(text);
        return util_errf(err, errlen, "script %s: cannot make a pipe: %s.", m->args[0], strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        free(text);
        close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
        return util_errf(err, errlen, "script %s: cannot start: %s.", m->args[0], strerror(errno));
    }
    if (pid == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        execvp(m->args[0], m->args);
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    signal(SIGPIPE, SIG_IGN);
    size_t tl = strlen(text), w = 0;
    char buf[65536];
    size_t got = 0;
    bool timed_out = false;
    double t_end = mono() + m->timeout_s;
    fcntl(pin[1], F_SETFL, O_NONBLOCK);
    int infd = pin[1];
    for (;;) {
        struct pollfd pf[2] = {{pout[0], POLLIN, 0}, {infd, POLLOUT, 0}};
        double left = t_end - mono();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        int pr = poll(pf, infd >= 0 ? 2 : 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            break;
        if (infd >= 0 && (pf[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = write(infd, text + w, tl - w);
            if (k > 0)
                w += (size_t)k;
            if (k < 0 && errno != EAGAIN) /* the script stopped reading: fine, it may not need all of it */
                w = tl;
            if (w == tl) {
                close(infd);
                infd = -1;
            }
        }
        if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t k = read(pout[0], buf + got, sizeof buf - 1 - got);
            if (k <= 0)
                break; /* EOF: the script closed its output */
            got += (size_t)k;
            if (got == sizeof buf - 1)
                break;
        }
    }
    if (infd >= 0)
        close(infd);
    close(pout[0]);
    free(text);
    if (timed_out)
        kill(pid, SIGKILL);
    int st = 0;
    /* after EOF the script gets the rest of its timeout to exit */
    while (!timed_out) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            break;
        if (mono() > t_end) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    if (timed_out) {
        waitpid(pid, &st, 0);
        return util_errf(err, errlen, "row %s: script %s did not finish within %.0f s and was killed.", id ? id : "?",
                         m->args[0], m->timeout_s);
    }
    if (WIFSIGNALED(st))
        return util_errf(err, errlen, "row %s: script %s died of signal %d.", id ? id : "?", m->args[0], WTERMSIG(st));
    if (WEXITSTATUS(st) == 127)
        return util_errf(err, errlen, "row %s: script %s could not be run (not found or not executable).",
                         id ? id : "?", m->args[0]);
    if (WEXITSTATUS(st))
        return util_errf(err, errlen, "row %s: script %s exited %d.", id ? id : "?", m->args[0], WEXITSTATUS(st));
    buf[got] = 0;
    char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    size_t n = strcspn(p, " \t\r\n");
    char *end;
    double v = strtod(p, &end);
    if (n == 4 && !strncasecmp(p, "true", 4))
        v = 1, end = p + 4;
    else if (n == 5 && !strncasecmp(p, "false", 5))
        v = 0, end = p + 5;
    if (end != p + n || n == 0 || !(v >= 0 && v <= 1))
        return util_errf(err, errlen, "row %s: script %s printed \"%.40s\", not a score in [0, 1] or true/false.",
                         id ? id : "?", m->args[0], p);
    *score = v;
    return 0;
}

/* ---------------------------------------------------------------- score */

int metric_score(const metric *m, const json_t *row, const json_t *expected, const char *answer, size_t len,
                 double *score, char *err, size_t errlen)
{
    *score = 0;
    if (m->kind == M_JUDGE)
        return util_errf(err, errlen, "the judge metric is scored by spill eval's judge run.");
    if (m->kind == M_JSON_FIELD) {
        *score = json_field_score(m, expected, answer, len);
        return 0;
    }
    if (m->kind == M_SCRIPT)
        return script_score(m, row, expected, answer, len, score, err, errlen);
    /* a list of acceptable answers: any one */
    size_t n = json_is_array(expected) && m->kind != M_REGEX_ROW ? json_array_size(expected) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(expected) && m->kind != M_REGEX_ROW ? json_array_get(expected, i) : expected;
        char *t = expected_text(e);
        if (!t)
            return util_errf(err, errlen, "out of memory.");
        double s = 0;
        int rc = score_one(m, t, answer, len, &s, err, errlen);
        free(t);
        if (rc)
            return -1;
        if (s > *score)
            *score = s;
        if (*score >= 1)
            break;
    }
    return 0;
}

void metric_interval(const double *s, size_t n, double *mean, double *lo, double *hi)
{
    *mean = *lo = *hi = 0;
    if (n == 0)
        return;
    double sum = 0;
    bool binary = true;
    for (size_t i = 0; i < n; i++)
        sum += s[i], binary &= s[i] == 0 || s[i] == 1;
    double p = sum / (double)n, z = 1.959963984540054;
    *mean = p;
    if (binary) { /* Wilson score interval */
        double z2n = z * z / (double)n, den = 1 + z2n;
        double centre = (p + z2n / 2) / den;
        double half = z * sqrt(p * (1 - p) / (double)n + z * z / (4.0 * (double)n * (double)n)) / den;
        *lo = centre - half < 0 ? 0 : centre - half;
        *hi = centre + half > 1 ? 1 : centre + half;
        return;
    }
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (s[i] - p) * (s[i] - p);
    double sd = n > 1 ? sqrt(ss / (double)(n - 1)) : 0, half = z * sd / sqrt((double)n);
    *lo = p - half < 0 ? 0 : p - half;
    *hi = p + half > 1 ? 1 : p + half;
}

/* ---------------------------------------------------------------- judge */

json_t *metric_judge_messages(const char *question, const json_t *expected, const char *answer)
{
    char *exp = expected_text(expected);
    if (!exp)
        return NULL;
    size_t cap = strlen(question) + strlen(exp) + strlen(answer) + 256;
    char *user = malloc(cap);
    json_t *msgs = NULL;
    if (user) {
        snprintf(user, cap, "Question:\n%s\n\nReference answer:\n%s\n\nCandidate answer:\n%s\n\nIs the candidate "
                            "answer correct? Reply with exactly one word: CORRECT or INCORRECT.",
                 question, exp, answer);
        msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "content",
                         "You grade answers. Compare the candidate answer with the reference answer: the candidate is "
                         "CORRECT when it gives the same answer in substance (wording, format and extra explanation "
                         "do not matter), else INCORRECT.",
                         "role", "user", "content", user);
    }
    free(user);
    free(exp);
    return msgs;
}

/* Whether the word w (case ignored) starts at p, on word boundaries. */
static bool word_at(const char *text, const char *p, const char *w)
{
    size_t n = strlen(w);
    return (p == text || !isalpha((unsigned char)p[-1])) && !strncasecmp(p, w, n) && !isalpha((unsigned char)p[n]);
}

int metric_judge_parse(const char *text, double *score)
{
    for (const char *p = text; *p; p++) {
        if (word_at(text, p, "incorrect") || word_at(text, p, "no")) {
            *score = 0;
            return 0;
        }
        if (word_at(text, p, "correct") || word_at(text, p, "yes")) {
            *score = 1;
            return 0;
        }
    }
    return -1;
}
