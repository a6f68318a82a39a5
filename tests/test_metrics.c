/*
 * test_metrics.c — the eval metrics of src/batch/metrics.h: a table of
 * (spec, expected, answer, score) for every metric, the spec errors, the
 * per-row errors, the script metric against the small scripts in
 * tests/data/metrics/ (a scorer, and ones that crash, fail, hang, print
 * garbage, print nothing, never read stdin), scoring from several threads,
 * the judge prompt and verdicts, and the interval against values computed
 * independently (derivations next to the numbers).
 *
 * Every error must be one sentence: it starts with "metric '" (spec errors)
 * or "row '" (row errors), holds no newline, and ends with '.'.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "batch/metrics.h"
#include "test.h"

#define DATA "tests/data/metrics/"

typedef struct tcase {
    const char *spec;
    const char *expected; /* JSON text of the row's expected value */
    const char *answer;
    double want;
} tcase;

static const tcase CASES[] = {
    /* exact_match: trim, full case folding, NFC, whitespace runs */
    {"exact_match", "\"Tokyo\"", " tokyo\n", 1},
    {"exact_match", "\"Tokyo\"", "Kyoto", 0},
    {"exact_match", "\"Straße\"", "STRASSE", 1},    /* full folding: ß → ss */
    {"exact_match", "\"Σίσυφος\"", "ΣΊΣΥΦΟΣ", 1},   /* final sigma folds to σ like the other two */
    {"exact_match", "\"café\"", "CAFE\xCC\x81", 1}, /* composed é vs E + U+0301 */
    {"exact_match", "\"ﬁsh\"", "FISH", 1},          /* the ligature folds to "fi" */
    {"exact_match", "\"new york\"", "New\t\n  York ", 1},
    {"exact_match", "\"new york\"", "New\xC2\xA0York", 1},   /* NBSP (Zs) is whitespace */
    {"exact_match", "\"東京 都\"", "東京\xE3\x80\x80都", 1}, /* so is the ideographic space */
    {"exact_match", "\"New York\"", "NewYork", 0},
    {"exact_match", "\"Paris\"", "Paris.", 0},
    {"exact_match", "\"1,000\"", "1000", 0},
    {"exact_match", "\"\"", "  \n", 1},
    {"exact_match", "\"Tokyo\\ufffd\"", "Tokyo\xFF", 1}, /* invalid UTF-8 reads as U+FFFD */
    /* non-string expected: its compact JSON text */
    {"exact_match", "86", "86", 1},
    {"exact_match", "2.50", "2.5", 1},
    {"exact_match", "0.1", "0.1", 1}, /* shortest round-trip form, not 0.10000000000000001 */
    {"exact_match", "1.0", "1.0", 1},
    {"exact_match", "1.0", "1", 0}, /* documented: a real prints with ".0" */
    {"exact_match", "true", "True", 1},
    {"exact_match", "{\"a\": [1, 2]}", "{\"a\":[1,2]}", 1},
    /* arrays: any acceptable answer */
    {"exact_match", "[\"NYC\", \"New York\"]", "new york", 1},
    {"exact_match", "[\"NYC\", \"New York\"]", "Boston", 0},
    {"exact_match", "[\"four\", 4]", "4", 1},
    /* :nopunct deletes Unicode punctuation, keeps symbols */
    {"exact_match:nopunct", "\"Paris\"", "Paris.", 1},
    {"exact_match:nopunct", "\"usa\"", "U.S.A.", 1},
    {"exact_match:nopunct", "\"bonjour\"", "«Bonjour !»", 1}, /* Pi/Pf and Po; the space before ! collapses */
    {"exact_match:nopunct", "\"wellknown\"", "well-known", 1},
    {"exact_match:nopunct", "\"1000\"", "1,000", 1},
    {"exact_match:nopunct", "\"11\"", "1+1", 0}, /* + is a symbol (Sm), kept */
    {"exact_match:nopunct", "\"日本\"", "「日本」。", 1},
    /* contains: the normalised expected is a substring of the normalised answer */
    {"contains", "\"Tokyo\"", "The capital is TOKYO.", 1},
    {"contains", "\"  tokyo \"", "Tokyo", 1},
    {"contains", "\"new york\"", "in New   York city", 1},
    {"contains", "\"Kyoto\"", "Tokyo", 0},
    {"contains", "\"STRASSE\"", "die Straße ist lang", 1},
    {"contains", "[\"Tokyo\", \"Edo\"]", "the Edo period", 1},
    {"contains", "42", "it is 42.", 1},
    {"contains", "\"u.s.\"", "the US army", 0},
    {"contains:nopunct", "\"u.s.\"", "the US army", 1},
    /* regex: the row's expected is the pattern, on the raw answer */
    {"regex", "\"^\\\\s*42\\\\b\"", "42 is it", 1},
    {"regex", "\"^\\\\s*42\\\\b\"", "it is 42", 0},
    {"regex", "\"tokyo\"", "TOKYO", 0},
    {"regex", "\"(?i)tokyo\"", "TOKYO", 1},
    {"regex", "[\"paris\", \"lyon\"]", "I think lyon", 1},
    {"regex", "[\"paris\", \"lyon\"]", "Marseille", 0},
    {"regex", "\"\\\\p{Lu}{3}\"", "abc ÉTÉ", 1}, /* UCP: Unicode uppercase */
    {"regex", "\"^\\\\w+$\"", "Straße", 1},      /* \w is Unicode-aware */
    {"regex", "\"é\"", "caf\xFF é", 1},          /* invalid UTF-8 in the answer does not stop the match */
    /* regex:PATTERN extracts group 1 (or the whole match) and compares as exact_match */
    {"regex:answer is (\\d+)", "\"42\"", "The answer is 42.", 1},
    {"regex:answer is (\\d+)", "\"42\"", "The answer is 41.", 0},
    {"regex:answer is (\\d+)", "\"42\"", "no idea", 0},
    {"regex:answer is (\\d+)", "86", "so the answer is 86", 1},
    {"regex:[A-D]", "\"c\"", "I pick C", 1}, /* no group: the whole match */
    {"regex:(x)|y+", "\"yy\"", "yy", 1},     /* group 1 unset: the whole match */
    {"regex:(?:final|answer): *(.+)", "[\"Paris\", \"Lyon\"]", "final:  PARIS  ", 1},
    {"regex:Answer: (.*)", "\"straße\"", "Answer: STRASSE", 1},
    /* json_field: the answer's JSON, the field at PATH, JSON equality */
    {"json_field:a.b[0].c", "1", "{\"a\": {\"b\": [{\"c\": 1.0}]}}", 1}, /* 1 == 1.0 */
    {"json_field:a.b[0].c", "1", "{\"a\": {\"b\": [{\"c\": 1e0}]}}", 1},
    {"json_field:a.b[0].c", "1", "{\"a\": {\"b\": [{\"c\": 1.5}]}}", 0},
    {"json_field:a.b[0].c", "1", "{\"a\": {\"b\": [{\"c\": \"1\"}]}}", 0}, /* a string is not a number */
    {"json_field:a.b[1].c", "1", "{\"a\": {\"b\": [{\"c\": 1}]}}", 0},     /* no such index */
    {"json_field:answer", "\"Paris\"", "Here:\n```json\n{\"answer\": \" PARIS \"}\n```\nDone.", 1},
    {"json_field:answer", "\"Paris\"", "```\n{\"answer\": \"Paris\"}\n```", 1}, /* untagged */
    {"json_field:answer", "\"Paris\"", "```python\nx = 1\n```\n```JSON\n{\"answer\": \"Paris\"}\n```", 1},
    {"json_field:answer", "42", "Sure! Here it is: {\"answer\": 42} Hope that helps {", 1}, /* first span */
    {"json_field:a", "2", "text [not json] then {\"a\": 2}", 1},                            /* a later span */
    {"json_field:answer", "42", "The answer is 42.", 0},                                    /* no JSON */
    {"json_field:answer", "42", "{\"answer\": 43}", 0},
    {"json_field:x", "{\"k\": [1, \"A b\"]}", "{\"x\": {\"k\": [1.0, \"a  B\"]}}", 1},
    {"json_field:x", "{\"k\": [1, \"A\"]}", "{\"x\": {\"k\": [1, \"A\"], \"extra\": 0}}", 0},
    {"json_field:x", "[1, 2]", "{\"x\": [2, 1]}", 0},
    {"json_field:[1]", "\"b\"", "[\"a\", \"b\"]", 1},
    {"json_field:items[0][1]", "3", "{\"items\": [[2, 3]]}", 1},
    {"json_field:$", "[1, 2]", " [1, 2.0] ", 1},
    {"json_field:$", "7", "7", 1},
    {"json_field:$.ok", "true", "{\"ok\": true}", 1},
    {"json_field:$.ok", "false", "{\"ok\": true}", 0},
    {"json_field:$[0]", "null", "[null]", 1},
    {"json_field:big", "9007199254740993", "{\"big\": 9007199254740993}", 1}, /* two integers: exactly */
    {"json_field:big", "9007199254740993", "{\"big\": 9007199254740992}", 0},
};

/* One sentence: the given start, no newline, a final '.'. */
static bool one_sentence(const char *err, const char *start)
{
    size_t n = strlen(err);
    return n > 1 && strncmp(err, start, strlen(start)) == 0 && !strchr(err, '\n') && err[n - 1] == '.';
}

static json_t *load(const char *text)
{
    json_error_t je;
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, &je) : NULL;
    if (text && !v)
        fprintf(stderr, "test_metrics: bad JSON in a case: %s: %s\n", text, je.text);
    return v;
}

static void test_cases(void)
{
    char err[512];
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const tcase *c = &CASES[i];
        metric *m;
        if (metric_parse(c->spec, &m, err, sizeof err) != 0) {
            CHECK(0, "case %zu: metric_parse('%s') failed: %s", i, c->spec, err);
            continue;
        }
        json_t *e = load(c->expected);
        metric_row row = {"case", NULL, NULL, e};
        double s = -1;
        int rc = metric_score(m, &row, c->answer, strlen(c->answer), &s, err, sizeof err);
        CHECK(rc == 0 && s == c->want, "case %zu: %s, expected %s, answer '%s': rc %d score %g, want %g (%s)", i,
              c->spec, c->expected, c->answer, rc, s, c->want, rc ? err : "");
        json_decref(e);
        metric_free(m);
    }
}

static void test_names(void)
{
    static const struct {
        const char *spec;
        metric_kind kind;
    } k[] = {
        {"exact_match", METRIC_EXACT_MATCH},    {"exact_match:nopunct", METRIC_EXACT_MATCH},
        {"contains", METRIC_CONTAINS},          {"regex", METRIC_REGEX},
        {"regex:(\\d+)", METRIC_REGEX_EXTRACT}, {"json_field:a.b[0]", METRIC_JSON_FIELD},
        {"script:sh -c true", METRIC_SCRIPT},   {"judge", METRIC_JUDGE},
    };
    char err[512];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        metric *m;
        int rc = metric_parse(k[i].spec, &m, err, sizeof err);
        CHECK(rc == 0, "%s: %s", k[i].spec, err);
        if (rc)
            continue;
        CHECK(strcmp(metric_name(m), k[i].spec) == 0, "%s: name '%s'", k[i].spec, metric_name(m));
        CHECK(metric_get_kind(m) == k[i].kind, "%s: kind %d, want %d", k[i].spec, (int)metric_get_kind(m),
              (int)k[i].kind);
        metric_free(m);
    }
    metric_free(NULL);
}

static void test_bad_specs(void)
{
    static const struct {
        const char *spec, *says;
    } bad[] = {
        {"bleu", "unknown metric 'bleu'"},
        {"", "unknown metric ''"},
        {"exact", "unknown metric 'exact'"},
        {"exact_match:foo", "unknown option 'foo'"},
        {"contains:lower", "unknown option 'lower'"},
        {"regex:(a", "does not compile at offset 2: missing closing parenthesis"},
        {"regex:a{2,1}", "does not compile at offset"},
        {"regex:", "is empty"},
        {"json_field", "needs a path"},
        {"json_field:", "needs a path"},
        {"json_field:a..b", "empty key at character 3"},
        {"json_field:.a", "empty key at character 1"},
        {"json_field:a.", "empty key at character 3"},
        {"json_field:a[x]", "opens an index"},
        {"json_field:a[0", "opens an index"},
        {"json_field:a[]", "opens an index"},
        {"json_field:a]b", "expected '.' or '['"},
        {"json_field:a[0]b", "expected '.' or '['"},
        {"json_field:a[99999999999999999999999]", "too large"},
        {"script:", "needs a command"},
        {"script:   ", "needs a command"},
        {"script:sh 'unterminated", "' at character 4 of the command is never closed"},
        {"script:sh \"open", "\" at character 4 of the command is never closed"},
        {"script:no-such-program-for-spill-tests", "is not on PATH"},
        {"script:" DATA "missing.sh", "is not an executable file"},
        {"script:" DATA "notexec.sh", "is not an executable file"},
        {"script:" DATA, "is not an executable file"},
        {"judge:gpt", "judge takes no option"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        metric *m = (metric *)&err; /* must come back NULL */
        err[0] = 0;
        int rc = metric_parse(bad[i].spec, &m, err, sizeof err);
        CHECK(rc == -1 && m == NULL, "'%s' parsed (rc %d)", bad[i].spec, rc);
        CHECK(strstr(err, bad[i].says) != NULL, "'%s': sentence '%s' lacks '%s'", bad[i].spec, err, bad[i].says);
        CHECK(one_sentence(err, "metric '"), "'%s': not one sentence: '%s'", bad[i].spec, err);
        metric_free(rc ? NULL : m);
    }
    metric *m;
    CHECK(metric_parse("script:sh -c true", &m, err, sizeof err) == 0, "%s", err);
    CHECK(metric_set_timeout(m, 0, err, sizeof err) == -1 && one_sentence(err, "metric '"), "timeout 0: %s", err);
    CHECK(metric_set_timeout(m, -1, err, sizeof err) == -1, "timeout -1 accepted");
    CHECK(metric_set_timeout(m, NAN, err, sizeof err) == -1, "timeout NaN accepted");
    CHECK(metric_set_timeout(m, 1e6, err, sizeof err) == -1, "timeout 1e6 accepted");
    CHECK(metric_set_timeout(m, 2.5, err, sizeof err) == 0, "timeout 2.5: %s", err);
    metric_free(m);
}

/* Rows a metric cannot score: -1 and one sentence naming the row. */
static void test_row_errors(void)
{
    static const struct {
        const char *spec, *expected, *answer, *says;
    } bad[] = {
        {"exact_match", "[]", "x", "expected is an empty array"},
        {"exact_match", NULL, "x", "has no expected value"},
        {"contains", "\" \\n \"", "x", "empty after normalisation"},
        {"contains", "[\"a\", \"\"]", "x", "holds an answer that is empty"},
        {"contains:nopunct", "\"...\"", "x", "empty after normalisation"},
        {"regex", "42", "42", "is not a string"},
        {"regex", "[\"a\", 1]", "b", "holds a value that is not a string"},
        {"regex", "[]", "b", "empty array"},
        {"regex", "\"(\"", "x", "does not compile at offset 1"},
        /* exponential backtracking: (a*)* before a c that is not b; the required 'b' is present so PCRE2's
         * start-up check does not reject it early */
        {"regex", "\"(a*)*b\"", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac b", "could not be matched"},
        {"regex:(a*)*b", "\"x\"", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac b", "could not be matched"},
        {"judge", "\"x\"", "x", "scored by a judge model"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        metric *m;
        if (metric_parse(bad[i].spec, &m, err, sizeof err)) {
            CHECK(0, "%s: %s", bad[i].spec, err);
            continue;
        }
        json_t *e = load(bad[i].expected);
        metric_row row = {"q-9", NULL, NULL, e};
        double s = 0.5;
        int rc = metric_score(m, &row, bad[i].answer, strlen(bad[i].answer), &s, err, sizeof err);
        CHECK(rc == -1, "%s on %s: scored %g", bad[i].spec, bad[i].expected, s);
        CHECK(rc != -1 || strstr(err, bad[i].says), "%s on %s: sentence '%s' lacks '%s'", bad[i].spec, bad[i].expected,
              err, bad[i].says);
        CHECK(rc != -1 || one_sentence(err, "row 'q-9'"), "%s: not one sentence naming the row: '%s'", bad[i].spec,
              err);
        json_decref(e);
        metric_free(m);
    }
}

/* ---- script -------------------------------------------------------------------------------------------- */

/* Scores one row with a script spec; returns metric_score's rc, *s and err filled. */
static int score_script(const char *spec, double timeout, const char *expected, const char *answer, size_t len,
                        bool chat, double *s, char *err, size_t errlen)
{
    metric *m;
    if (metric_parse(spec, &m, err, errlen)) {
        CHECK(0, "%s: %s", spec, err);
        return -2;
    }
    if (timeout > 0)
        CHECK(metric_set_timeout(m, timeout, err, errlen) == 0, "%s", err);
    json_t *e = load(expected), *msgs = load("[{\"role\": \"user\", \"content\": \"Capital of Japan?\"}]"),
           *prompt = json_string("Capital of Japan:");
    metric_row row = {"q-7", chat ? msgs : NULL, chat ? NULL : prompt, e};
    *s = -1;
    int rc = metric_score(m, &row, answer, len, s, err, errlen);
    json_decref(e);
    json_decref(msgs);
    json_decref(prompt);
    metric_free(m);
    return rc;
}

static void test_script(void)
{
    static const struct {
        const char *spec, *expected, *answer;
        bool chat;
        double want;
    } ok[] = {
        {"script:" DATA "score.py", "\"Tokyo\"", " tokyo ", true, 1},
        {"script:" DATA "score.py", "\"Tokyo\"", "Kyoto", true, 0},
        {"script:" DATA "score.py", "\"Tokyo\"", "Tokyo", false, 1},        /* a completion row: prompt */
        {"script:python3 " DATA "score.py", "\"Tokyo\"", "TOKYO", true, 1}, /* found on PATH */
        {"script:" DATA "score.py", "\"say:0.5\"", "x", true, 0.5},
        {"script:" DATA "score.py", "\"say:  0.25  \\n\\n\"", "x", true, 0.25},
        {"script:" DATA "score.py", "\"say:thinking...\\nstill thinking\\n1e-1\\n\"", "x", true, 0.1},
        {"script:" DATA "score.py", "\"say:True\\n\"", "x", true, 1}, /* Python's print(True) */
        {"script:" DATA "score.py", "\"say:false\"", "x", true, 0},
        {"script:" DATA "score.py", "\"Tokyo\\ufffd\"", "tokyo\xFF", true, 1}, /* invalid UTF-8 as U+FFFD */
        {"script:" DATA "args.sh 'a b' \"c\\\"d\" e\\ f ''", "\"x\"", "x", true, 1},
    };
    char err[512];
    double s;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int rc = score_script(ok[i].spec, 0, ok[i].expected, ok[i].answer, strlen(ok[i].answer), ok[i].chat, &s, err,
                              sizeof err);
        CHECK(rc == 0 && s == ok[i].want, "%s on %s / '%s': rc %d score %g, want %g (%s)", ok[i].spec, ok[i].expected,
              ok[i].answer, rc, s, ok[i].want, rc ? err : "");
    }

    static const struct {
        const char *spec, *expected;
        double timeout;
        const char *says;
    } bad[] = {
        {"script:" DATA "crash.sh", "\"x\"", 0, "crashed (signal 11"},
        {"script:" DATA "fail.sh", "\"x\"", 0, "exited with status 2: 'boom: no score for this row'"},
        {"script:" DATA "score.py", "\"say:score: high\"", 0, "printed 'score: high' where a score was expected"},
        {"script:" DATA "garbage.sh", "\"x\"", 0, "printed 'score: high'"},
        {"script:" DATA "range.sh", "\"x\"", 0, "printed the score 1.5, outside [0, 1]"},
        {"script:" DATA "score.py", "\"say:nan\"", 0, "printed 'nan'"},
        {"script:" DATA "silent.sh", "\"x\"", 0, "printed no score"},
        {"script:" DATA "badexec.sh", "\"x\"", 0, "could not be started: No such file or directory"},
        {"script:" DATA "hang.sh", "\"x\"", 1, "did not finish within 1 s and was killed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = score_script(bad[i].spec, bad[i].timeout, bad[i].expected, "x", 1, true, &s, err, sizeof err);
        CHECK(rc == -1, "%s: scored %g", bad[i].spec, s);
        CHECK(rc != -1 || strstr(err, bad[i].says), "%s: sentence '%s' lacks '%s'", bad[i].spec, err, bad[i].says);
        CHECK(rc != -1 || one_sentence(err, "row 'q-7': the script '"), "%s: not one sentence naming the row: '%s'",
              bad[i].spec, err);
    }

    /* a script that never reads its stdin, given 4 MiB: EPIPE, not SIGPIPE, and its score still counts */
    size_t big = 4u << 20;
    char *a = malloc(big);
    memset(a, 'x', big);
    int rc = score_script("script:" DATA "noread.sh", 0, "\"x\"", a, big, true, &s, err, sizeof err);
    CHECK(rc == 0 && s == 1, "noread.sh: rc %d score %g (%s)", rc, s, rc ? err : "");
    free(a);
}

/* ---- several threads scoring with one metric ------------------------------------------------------------- */

typedef struct job {
    const metric *m;
    int id, good;
} job;

static void *score_rows(void *arg)
{
    job *j = arg;
    char err[512], id[32], ans[32];
    for (int r = 0; r < 6; r++) {
        snprintf(id, sizeof id, "t%d-r%d", j->id, r);
        snprintf(ans, sizeof ans, " Answer %d ", j->id * 10 + r);
        json_t *e = json_sprintf("answer %d", j->id * 10 + (r % 2 ? r : r + 1)); /* even rows are wrong */
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "q");
        metric_row row = {id, msgs, NULL, e};
        double s = -1;
        int rc = metric_score(j->m, &row, ans, strlen(ans), &s, err, sizeof err);
        j->good += rc == 0 && s == (r % 2 ? 1 : 0);
        json_decref(e);
        json_decref(msgs);
    }
    return NULL;
}

static void test_threads(void)
{
    const char *specs[] = {"exact_match", "regex:(.*)", "script:" DATA "score.py"};
    char err[512];
    for (size_t k = 0; k < 3; k++) {
        metric *m;
        if (metric_parse(specs[k], &m, err, sizeof err)) {
            CHECK(0, "%s: %s", specs[k], err);
            continue;
        }
        pthread_t t[4];
        job j[4];
        for (int i = 0; i < 4; i++) {
            j[i] = (job){m, i, 0};
            pthread_create(&t[i], NULL, score_rows, &j[i]);
        }
        int good = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(t[i], NULL);
            good += j[i].good;
        }
        CHECK(good == 24, "%s from 4 threads: %d of 24 rows scored right", specs[k], good);
        metric_free(m);
    }
}

/* ---- judge ------------------------------------------------------------------------------------------------ */

static void test_judge(void)
{
    json_t *e = json_string("Tokyo");
    json_t *msgs = metric_judge_messages("What is the capital of Japan?", e, "It is Tokyo.\xFF", 13);
    const char *want =
        METRIC_JUDGE_INSTRUCTIONS "\n\n<question>\nWhat is the capital of Japan?\n</question>\n\n"
                                  "<reference>\nTokyo\n</reference>\n\n<answer>\nIt is Tokyo.\xEF\xBF\xBD\n</answer>";
    CHECK(json_array_size(msgs) == 1, "judge chat: %zu messages, want 1", json_array_size(msgs));
    json_t *msg = json_array_get(msgs, 0);
    const char *role = json_string_value(json_object_get(msg, "role")),
               *content = json_string_value(json_object_get(msg, "content"));
    CHECK(role && strcmp(role, "user") == 0, "judge role '%s'", role ? role : "(none)");
    CHECK(content && strcmp(content, want) == 0, "judge content:\n%s\nwant:\n%s", content ? content : "(none)", want);
    CHECK(json_object_size(msg) == 2, "judge message has %zu keys", json_object_size(msg));
    json_decref(msgs);
    json_decref(e);

    e = load("[\"NYC\", 5]");
    msgs = metric_judge_messages("Q", e, "A", 1);
    content = json_string_value(json_object_get(json_array_get(msgs, 0), "content"));
    CHECK(content && strstr(content, "<reference>\n- NYC\n- 5\n</reference>"), "alternatives: %s",
          content ? content : "(none)");
    json_decref(msgs);
    json_decref(e);

    /* questions */
    static const struct {
        const char *messages, *prompt, *want;
    } q[] = {
        {"[{\"role\":\"user\",\"content\":\"Capital of Japan?\"}]", NULL, "Capital of Japan?"},
        {"[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
         "\"text\":\"Capital\"},{\"type\":\"text\",\"text\":\"of Japan?\"}]},{\"role\":\"assistant\",\"content\":null,"
         "\"tool_calls\":[]}]",
         NULL, "system: Be brief.\n\nuser: Capital\nof Japan?"},
        {NULL, "\"Capital of Japan:\"", "Capital of Japan:"},
        {NULL, "[1, 2, 3]", "[1,2,3]"},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        json_t *mj = load(q[i].messages), *pj = load(q[i].prompt);
        metric_row row = {"q", mj, pj, NULL};
        char *got = metric_judge_question(&row);
        CHECK(got && strcmp(got, q[i].want) == 0, "question %zu: '%s', want '%s'", i, got ? got : "(null)", q[i].want);
        free(got);
        json_decref(mj);
        json_decref(pj);
    }

    /* verdicts */
    static const struct {
        const char *reply;
        double want; /* -1: no verdict */
    } v[] = {
        {"VERDICT: CORRECT", 1},
        {"The answer names Kyoto.\nVERDICT: INCORRECT\n", 0},
        {"**Verdict:** Correct", 1},
        {"verdict:correct.", 1},
        {"<think>maybe VERDICT: INCORRECT</think>\nVERDICT: CORRECT", 1}, /* the last one wins */
        {"correct.", 1},
        {" **Incorrect** ", 0},
        {"VERDICT: CORRECTLY", -1},
        {"I cannot decide.", -1},
        {"The answer is incorrect", -1},
        {"", -1},
    };
    char err[512];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        double s = 0.5;
        int rc = metric_judge_parse(v[i].reply, strlen(v[i].reply), &s, err, sizeof err);
        if (v[i].want < 0)
            CHECK(rc == -1 && one_sentence(err, "the judge's reply '"),
                  "reply '%s': rc %d score %g, want an error (%s)", v[i].reply, rc, s, rc ? err : "");
        else
            CHECK(rc == 0 && s == v[i].want, "reply '%s': rc %d score %g, want %g (%s)", v[i].reply, rc, s, v[i].want,
                  rc ? err : "");
    }
}

/* ---- interval ------------------------------------------------------------------------------------------- */

/*
 * Expected values, computed independently of metrics.c's formulas:
 *  Wilson — the bounds are the two roots p of (p̂ − p)² = z² p(1 − p)/n, i.e.
 *    (1 + z²/n) p² − (2p̂ + z²/n) p + p̂² = 0, z = 1.959963984540054, solved
 *    with the quadratic formula in Python (metrics.c uses the centre ± half-width
 *    form).  8/10 gives [0.4901624715, 0.9433178485] (the textbook
 *    [0.490, 0.943]); 0/10: lower root 0, upper z²/(n + z²) = 3.841459/13.841459
 *    = 0.2775327999; 10/10 mirrors it: 0.7224672001; 1/1: [0.2065493144, 1];
 *    37/50: [0.6044684274, 0.8412847251]; 1/3: [0.0614919447, 0.7923403992].
 *  t — Student's t quantiles by Simpson integration of the t density and
 *    bisection in Python (no table): t(0.975, 3) = 3.1824463053,
 *    t(0.975, 39) = 2.0226909200, t(0.975, 30) = 2.0422724563.
 *    {0.5, 0.25, 1, 0.75}: mean 0.625, deviations ±0.125, ±0.375, squares
 *    sum 0.3125, s² = 0.3125/3, s = 0.3227486122, half-width
 *    3.1824463053 · 0.3227486122/2 = 0.5135650642 → [0.1114349358, 1.1385650642]
 *    clipped to 1.
 *    {i/39 : i = 0..39}: mean 0.5, s = 0.2997551781, n = 40 →
 *    [0.4041336432, 0.5958663568] (df 39 exercises the expansion past the table).
 *    fifteen 0.2 and sixteen 0.4: mean 9.4/31 = 0.3032258065, s = 0.1016001016,
 *    df 30 → [0.2659585883, 0.3404930246].
 * Tolerance 1e-9: the inputs are given to 10 decimals and both sides are
 * double arithmetic of a few dozen operations; the expansion's own error at
 * df 39 is 8e-9 in t, times s/√n = 0.047 → 4e-10 in the bounds.
 */
static void check_interval(const char *label, const double *x, size_t n, double mean, double lo, double hi)
{
    double m, l, h;
    metric_interval(x, n, &m, &l, &h);
    CHECK(fabs(m - mean) < 1e-9 && fabs(l - lo) < 1e-9 && fabs(h - hi) < 1e-9,
          "%s: mean %.10f [%.10f, %.10f], want %.10f [%.10f, %.10f]", label, m, l, h, mean, lo, hi);
}

static void test_interval(void)
{
    double x[64];
    struct {
        size_t k, n;
        double lo, hi;
    } w[] = {
        {8, 10, 0.4901624715, 0.9433178485},
        {0, 10, 0, 0.2775327999},
        {10, 10, 0.7224672001, 1},
        {1, 1, 0.2065493144, 1},
        {37, 50, 0.6044684274, 0.8412847251},
        {1, 3, 0.0614919447, 0.7923403992},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        for (size_t j = 0; j < w[i].n; j++)
            x[j] = j < w[i].k ? 1 : 0;
        char label[64];
        snprintf(label, sizeof label, "Wilson %zu/%zu", w[i].k, w[i].n);
        check_interval(label, x, w[i].n, (double)w[i].k / (double)w[i].n, w[i].lo, w[i].hi);
    }
    const double four[] = {0.5, 0.25, 1.0, 0.75};
    check_interval("t, n=4", four, 4, 0.625, 0.1114349358, 1);
    for (int i = 0; i < 40; i++)
        x[i] = i / 39.0;
    check_interval("t, n=40", x, 40, 0.5, 0.4041336432, 0.5958663568);
    for (int i = 0; i < 31; i++)
        x[i] = i < 15 ? 0.2 : 0.4;
    check_interval("t, n=31", x, 31, 9.4 / 31, 0.2659585883, 0.3404930246);
    const double one = 0.3;
    check_interval("one fractional score", &one, 1, 0.3, 0, 1);
    double m, l, h;
    metric_interval(x, 0, &m, &l, &h);
    CHECK(isnan(m) && isnan(l) && isnan(h), "n = 0: %g [%g, %g], want NaN", m, l, h);
}

int main(void)
{
    test_cases();
    test_names();
    test_bad_specs();
    test_row_errors();
    test_script();
    test_threads();
    test_judge();
    test_interval();
    return test_finish("test_metrics");
}
