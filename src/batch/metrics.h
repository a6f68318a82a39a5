/*
 * metrics.h — how `spill eval` scores one answer against a row's `expected` (see metrics.c for every rule).
 *
 * Specs (the --metric argument):
 *   exact_match          the normalised answer equals the normalised expected
 *   exact_match:nopunct  the same, with Unicode punctuation (categories P*) removed from both first
 *   contains             the normalised expected is a substring of the normalised answer
 *   regex                the row's expected is a PCRE2 pattern (UTF, Unicode classes) found somewhere in the answer
 *   regex:PATTERN        PATTERN (compiled once) is searched in the answer; its first capture group (the whole
 *                        match when it has none) must equal expected under exact_match's normalisation
 *   json_field:PATH      the answer read as JSON (the whole text, else a ```json fenced block, else the span from
 *                        its first '{' or '[' to the last '}' or ']'), the value at PATH (dotted keys and [i]
 *                        indexes: a.b[0].c) equal to expected: numbers numerically, strings normalised, anything
 *                        else by JSON equality
 *   script:CMD           CMD (split on spaces, "double" or 'single' quotes group; no shell) gets the row on stdin
 *                        as JSON {"custom_id","request","expected","answer"} and prints a score: a number in
 *                        [0, 1], or true / false; it must exit 0 within 10 s (script:CMD@SECONDS sets another)
 *   judge                a second model grades the answer (spill eval --judge MODEL runs it; see
 *                        metric_judge_messages for the prompt and metric_judge_parse for the verdict)
 * Normalisation: Unicode NFC with full case folding (utf8proc), every run of white space (Unicode White_Space)
 * becomes one space, leading and trailing space removed.  An expected that is a JSON array is a list of
 * acceptable answers (the row scores 1 if any matches) for exact_match, contains and regex:PATTERN; an expected
 * that is neither a string nor an array is compared through its compact JSON text.
 */
#ifndef SPILL_METRICS_H
#define SPILL_METRICS_H

#include <jansson.h>
#include <stddef.h>

typedef struct metric metric;

/* Compiles spec; 0 with *out (metric_free it), or -1 with one sentence (unknown metric, a regex PCRE2 refuses —
 * its message and offset —, a bad JSON path, an empty command). */
int metric_parse(const char *spec, metric **out, char *err, size_t errlen);
void metric_free(metric *m);

/* The spec as given ("exact_match", "json_field:a.b", ...). */
const char *metric_name(const metric *m);

/* Scores answer (len bytes) of input row `row` (the whole input line) against expected: *score in [0, 1].  0, or
 * -1 with a per-row sentence when this metric cannot score the row (a bad per-row pattern, the script failed,
 * timed out or printed no score; judge: scored by spill eval itself, never here). */
int metric_score(const metric *m, const json_t *row, const json_t *expected, const char *answer, size_t len,
                 double *score, char *err, size_t errlen);

/* Mean of n scores and a 95% interval: Wilson's score interval when every score is 0 or 1, else the normal
 * approximation mean ± 1.96·s/√n clipped to [0, 1] (s the sample standard deviation).  n = 0 gives 0, 0, 0. */
void metric_interval(const double *scores, size_t n, double *mean, double *lo, double *hi);

/* The judge's chat messages for one row (a new reference): a system message stating the task and a user
 * message with the question, the reference answer and the candidate answer, asking for one word, CORRECT or
 * INCORRECT.  NULL when out of memory. */
json_t *metric_judge_messages(const char *question, const json_t *expected, const char *answer);

/* The judge's verdict: 1 when its reply's first verdict word is CORRECT (or YES), 0 for INCORRECT (or NO), case
 * ignored; 0 and *score, or -1 when the reply holds no verdict. */
int metric_judge_parse(const char *text, double *score);

#endif
