/*
 * test_metrics.c — the scoring rules of spill eval (src/batch/metrics.h), table-driven: exact_match with its
 * normalisation (NFC, Unicode case folding — "Straße" folds to "strasse" —, white space runs, trimming) and
 * :nopunct, contains, regex (the row's pattern) and regex:PATTERN (capture compared), json_field (whole text,
 * a fenced block, an embedded object; 1 == 1.0; strings normalised; missing field 0), lists of acceptable
 * answers; the script metric (a score, a crash, a hang killed at 1 s, garbage, a missing program); the judge's
 * prompt and verdicts; bad specs (one sentence each); and the 95% intervals against values computed apart
 * (Python's math and statistics, z = 1.959963984540054):
 *   Wilson, 7 of 10 correct: centre (0.7 + z²/20) / (1 + z²/10) = 0.644493, half 0.247715 -> [0.396778, 0.892209];
 *   Wilson, 0 of 4: centre = half = (z²/8) / (1 + z²/4) -> [0, 0.489891];
 *   normal, {0.5, 0.25, 1, 0.75}: mean 0.625, s = 0.322749, half 1.959964·0.322749/2 = 0.316288 ->
 *     [0.308712, 0.941288].
 */
#include <math.h>
#include <stdlib.h>

#include "base/util.h"
#include "batch/metrics.h"
#include "test.h"

static double score(const char *spec, const char *expected_json, const char *answer, int *rc, char *err, size_t n)
{
    metric *m = NULL;
    char e2[SPILL_ERRLEN];
    if (metric_parse(spec, &m, e2, sizeof e2)) {
        CHECK(0, "%s: %s", spec, e2);
        *rc = -2;
        return -1;
    }
    json_t *exp = json_loads(expected_json, JSON_DECODE_ANY, NULL);
    json_t *row = json_pack("{s:s}", "custom_id", "r1");
    double s = -1;
    *rc = metric_score(m, row, exp, answer, strlen(answer), &s, err, n);
    json_decref(exp);
    json_decref(row);
    metric_free(m);
    return s;
}

int main(void)
{
    static const struct {
        const char *spec, *expected, *answer;
        double want;
    } cases[] = {
        {"exact_match", "\"Paris\"", "Paris", 1},
        {"exact_match", "\"paris\"", "  PARIS \n", 1},
        {"exact_match", "\"Straße\"", "STRASSE", 1},
        {"exact_match", "\"the  quick\\tfox\"", "The quick fox", 1},
        {"exact_match", "\"Paris.\"", "Paris", 0},
        {"exact_match:nopunct", "\"Paris.\"", "¡Paris!", 1},
        {"exact_match", "\"e\\u0301\"", "\u00e9", 1}, /* NFC */
        {"exact_match", "42", "42", 1},                  /* a non-string expected: its JSON text */
        {"exact_match", "[\"Rome\", \"Paris\"]", "paris", 1},
        {"exact_match", "[\"Rome\", \"Lyon\"]", "paris", 0},
        {"contains", "\"  Blue \"", "The sky is blue today.", 1},
        {"contains", "\"green\"", "The sky is blue today.", 0},
        {"contains", "\"ÉTÉ\"", "un bel été", 1},
        {"regex", "\"^\\\\d{3}-\\\\d{4}$\"", "555-1234", 1},
        {"regex", "\"\\\\p{Lu}{3}\"", "abc DEF", 1},
        {"regex", "\"^x\"", "yx", 0},
        {"regex:answer is (\\w+)", "\"B\"", "I think the answer is b, clearly", 1},
        {"regex:answer is (\\w+)", "\"C\"", "I think the answer is b", 0},
        {"regex:\\d+", "\"12\"", "there are 12 of them", 1},
        {"regex:answer is (\\w+)", "\"B\"", "no match here", 0},
        {"json_field:a.b[1]", "2", "{\"a\":{\"b\":[1,2.0]}}", 1},
        {"json_field:name", "\"Ada\"", "Here you go:\n```json\n{\"name\": \" ada \"}\n```\n", 1},
        {"json_field:x", "true", "Result: {\"x\": true} done", 1},
        {"json_field:x", "true", "Result: {\"y\": true}", 0},
        {"json_field:x[0].y", "{\"z\":1}", "{\"x\":[{\"y\":{\"z\":1}}]}", 1},
        {"json_field:x", "1", "not json at all", 0},
        {"script:tests/data/metrics/grade.sh", "\"x\"", "well yes", 1},
        {"script:tests/data/metrics/grade.sh", "\"x\"", "no", 0.25},
    };
    char err[SPILL_ERRLEN];
    int rc;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double s = score(cases[i].spec, cases[i].expected, cases[i].answer, &rc, err, sizeof err);
        CHECK(rc == 0 && s == cases[i].want, "%s, expected %s, answer \"%s\": score %.3g (want %.3g) rc %d %s",
              cases[i].spec, cases[i].expected, cases[i].answer, s, cases[i].want, rc, rc ? err : "");
    }
    /* per-row failures: one sentence each */
    static const struct {
        const char *spec, *needle;
    } fails[] = {{"script:tests/data/metrics/crash.sh", "signal"},
                 {"script:tests/data/metrics/hang.sh@1", "within 1 s"},
                 {"script:tests/data/metrics/garbage.sh", "not a score"},
                 {"script:tests/data/metrics/no-such-program", "could not be run"}};
    for (size_t i = 0; i < sizeof fails / sizeof *fails; i++) {
        score(fails[i].spec, "\"x\"", "answer", &rc, err, sizeof err);
        CHECK(rc == -1 && strstr(err, fails[i].needle) && strstr(err, "r1"), "%s: rc %d, %s", fails[i].spec, rc, err);
    }
    score("regex", "\"(unclosed\"", "x", &rc, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "offset"), "a row's bad pattern: %s", err);
    /* bad specs */
    static const char *const bad[] = {"nosuch", "regex:(", "json_field:", "json_field:a..b", "json_field:a[x]",
                                      "script:", "script:\"unclosed"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        metric *m = NULL;
        CHECK(metric_parse(bad[i], &m, err, sizeof err) == -1 && m == NULL && err[0] && strlen(err) < 400,
              "bad spec %s accepted or no sentence", bad[i]);
    }
    /* intervals */
    double mean, lo, hi;
    double seven[10] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, zero[4] = {0}, frac[4] = {0.5, 0.25, 1, 0.75};
    metric_interval(seven, 10, &mean, &lo, &hi);
    CHECK(fabs(mean - 0.7) < 1e-12 && fabs(lo - 0.396778) < 1e-5 && fabs(hi - 0.892209) < 1e-5, "wilson 7/10: %.6f "
                                                                                               "[%.6f, %.6f]",
          mean, lo, hi);
    metric_interval(zero, 4, &mean, &lo, &hi);
    CHECK(mean == 0 && lo == 0 && fabs(hi - 0.489891) < 1e-5, "wilson 0/4: [%.6f, %.6f]", lo, hi);
    metric_interval(frac, 4, &mean, &lo, &hi);
    CHECK(fabs(mean - 0.625) < 1e-12 && fabs(lo - 0.308712) < 1e-5 && fabs(hi - 0.941288) < 1e-5,
          "normal: %.6f [%.6f, %.6f]", mean, lo, hi);
    /* the judge */
    json_t *exp = json_string("Paris");
    json_t *msgs = metric_judge_messages("Capital of France?", exp, "It is Paris.");
    const char *user = json_string_value(json_object_get(json_array_get(msgs, 1), "content"));
    CHECK(json_array_size(msgs) == 2 && user && strstr(user, "Capital of France?") && strstr(user, "Paris") &&
              strstr(user, "CORRECT or INCORRECT"),
          "judge prompt");
    json_decref(msgs);
    json_decref(exp);
    static const struct {
        const char *text;
        int rc;
        double s;
    } verdicts[] = {{"CORRECT", 0, 1}, {"  incorrect.", 0, 0}, {"Verdict: Correct", 0, 1}, {"No.", 0, 0},
                    {"yes", 0, 1},     {"I cannot tell", -1, 0}, {"uncorrected", -1, 0}};
    for (size_t i = 0; i < sizeof verdicts / sizeof *verdicts; i++) {
        double s = -1;
        int r = metric_judge_parse(verdicts[i].text, &s);
        CHECK(r == verdicts[i].rc && (r || s == verdicts[i].s), "judge verdict \"%s\": rc %d score %.1f",
              verdicts[i].text, r, s);
    }
    return test_finish("test_metrics");
}
