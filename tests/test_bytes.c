/*
 * test_bytes.c — every byte a token can hold, through output.c and the job
 * store, on both endpoints.
 *
 * A byte-level vocabulary has one token per byte 0x00-0xFF, and a merged
 * token can end in the middle of a UTF-8 sequence.  Each such token is put
 * where output lines carry token bytes — the generated text, the chosen
 * token's "token" and "bytes", the top_logprobs entries (chat: objects;
 * completions: an object keyed by the token's text) — and into a custom_id
 * (code point U+00bb for byte bb: custom_ids are JSON strings, valid UTF-8).
 * Each line is appended to a job, committed, and the job resumed.
 *
 * Expectations, fixed before running: all 2 × (256 + fragments) lines are
 * accepted (the byte-0x00 token wedged jobs: its completions key "\u0000"
 * was refused by the store's line check, on every resume); resume finds every
 * row done and none twice; every chat line reads back with jansson and its
 * "bytes" arrays equal the token's bytes; every completions line without a
 * NUL key reads back too (jansson 2.14 cannot load a NUL in a key, so the
 * byte-0x00 line is checked for its "\u0000" key textually); a line the
 * store refuses leaves the file untouched and the job usable; the official
 * openai types (tools/check_output_schema.py, with .venv) accept every line.
 */
#include "batch/job.h"
#include "batch/output.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <unistd.h>

static char root[] = "/tmp/spill-test-bytes-XXXXXX";

/* Token byte strings: the 256 single bytes, then fragments that are not UTF-8 on their own. */
static const char *const fragments[] = {
    "\xE2\x82",         /* first two bytes of U+20AC */
    "\xF0\x9F\x98",     /* first three of U+1F600 */
    "\x82\xAC",         /* the tail of U+20AC */
    "\xC0\xAF",         /* overlong '/' */
    "\xED\xA0\x80",     /* a UTF-16 surrogate encoded in UTF-8 */
    "a\x00z",           /* NUL inside a token */
    "\xFF\xFE\x00\x01", /* byte-order-mark bytes, NUL, control */
};
#define N_FRAG (sizeof fragments / sizeof *fragments)
static const size_t frag_len[N_FRAG] = {2, 3, 2, 2, 3, 3, 4};
#define N_TOK ((int)(256 + N_FRAG))

static void token_bytes(int t, char *buf, size_t *len)
{
    if (t < 256) {
        buf[0] = (char)t;
        *len = 1;
    } else {
        memcpy(buf, fragments[t - 256], frag_len[t - 256]);
        *len = frag_len[t - 256];
    }
}

/* custom_id of token t on endpoint e: "b-<e>-" then code point t (UTF-8) for single bytes (U+0000 is never a
 * custom_id: the input parser refuses it), else the fragment's number. */
static void custom_id(int t, int e, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "b-%d-", e);
    if (t >= 256)
        snprintf(buf + n, cap - (size_t)n, "frag%d", t - 256);
    else if (t == 0)
        snprintf(buf + n, cap - (size_t)n, "nul");
    else if (t < 0x80)
        snprintf(buf + n, cap - (size_t)n, "%c", t);
    else
        snprintf(buf + n, cap - (size_t)n, "%c%c", 0xC0 | t >> 6, 0x80 | (t & 0x3F));
}

static bool bytes_equal(json_t *arr, const char *b, size_t n)
{
    if (!json_is_array(arr) || json_array_size(arr) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != (unsigned char)b[i])
            return false;
    return true;
}

static void check_chat_line(const char *line, size_t len, const char *tok, size_t tl, int t)
{
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    CHECK(o != NULL, "token %d: chat line does not load: %s", t, je.text);
    if (!o)
        return;
    json_t *c0 = json_object_get(json_object_get(json_array_get(json_object_get(json_object_get(json_object_get(o,
                     "response"), "body"), "choices"), 0), "logprobs"), "content");
    json_t *e0 = json_array_get(c0, 0);
    CHECK(bytes_equal(json_object_get(e0, "bytes"), tok, tl), "token %d: chosen token's bytes differ", t);
    json_t *a0 = json_array_get(json_object_get(e0, "top_logprobs"), 0);
    CHECK(bytes_equal(json_object_get(a0, "bytes"), tok, tl), "token %d: top_logprobs[0].bytes differ", t);
    json_decref(o);
}

static void check_completion_line(const char *line, size_t len, const char *tok, size_t tl, int t)
{
    if (memchr(tok, 0, tl)) {
        /* jansson cannot load it (see the header); the key is there, escaped */
        CHECK(strstr(line, "\\u0000") != NULL, "token %d: no \\u0000 in the completions line", t);
        return;
    }
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    CHECK(o != NULL, "token %d: completions line does not load: %s", t, je.text);
    if (!o)
        return;
    json_t *lp = json_object_get(json_array_get(json_object_get(json_object_get(json_object_get(o, "response"), "body"),
                                                                "choices"),
                                                0),
                                 "logprobs");
    json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    CHECK(json_object_size(top) == 2, "token %d: top_logprobs has %zu keys, want 2", t, json_object_size(top));
    json_decref(o);
}

static void test_every_byte(void)
{
    char dir[PATH_MAX], input[PATH_MAX], err[SPILL_ERRLEN];
    snprintf(dir, sizeof dir, "%s/job", root);
    snprintf(input, sizeof input, "%s/input.jsonl", root);
    FILE *f = fopen(input, "w");
    fputs("{}\n", f);
    fclose(f);
    job_info info = {"run", input, NULL, "smollm2:135m", "sha256:00", "spill test", 2 * N_TOK};
    job *j = NULL;
    int rc = job_create(dir, &info, NULL, &j, err, sizeof err);
    CHECK(rc == 0, "create: %s", err);
    if (rc)
        return;
    out_stamp st = {"run1", "sha256:00", "q4_1", NULL, 0, 0, NULL};
    int accepted = 0;
    for (int e = 0; e < 2; e++)
        for (int t = 0; t < N_TOK; t++) {
            char tok[8], id[32], *line = NULL;
            size_t tl, len;
            token_bytes(t, tok, &tl);
            custom_id(t, e, id, sizeof id);
            out_alt top[2] = {{tok, tl, -0.25f}, {"zz", 2, -1.5f}};
            out_token tk[2] = {{tok, tl, -0.25f, 2, top}, {"!", 1, -0.5f, 2, top}};
            char text[16];
            memcpy(text, tok, tl);
            text[tl] = '!';
            out_choice ch = {text, tl + 1, OUT_FINISH_STOP, true, 2, tk, NULL, 0, 0, NULL, 0, NULL};
            out_result r = {id, "smollm2:135m", "fp_1", 1711475054, 1, &ch, 3, 2, &st, 0};
            rc = e == 0 ? output_chat_line(&r, NULL, &line, &len, err, sizeof err)
                        : output_completion_line(&r, NULL, &line, &len, err, sizeof err);
            CHECK(rc == 0, "endpoint %d token %d: output: %s", e, t, err);
            if (rc)
                continue;
            rc = job_append_result(j, line, len, err, sizeof err);
            CHECK(rc == 0, "endpoint %d token %d: the store refused the line: %s", e, t, err);
            accepted += rc == 0;
            if (e == 0)
                check_chat_line(line, len, tok, tl, t);
            else
                check_completion_line(line, len, tok, tl, t);
            free(line);
        }
    CHECK(accepted == 2 * N_TOK, "%d of %d lines accepted", accepted, 2 * N_TOK);

    /* A line the store refuses: nothing written, the job goes on. */
    rc = job_append_result(j, "{\"custom_id\":\"torn\"", 19, err, sizeof err);
    CHECK(rc == JOB_LINE_REFUSED && !job_is_broken(j), "a torn line: rc %d (%s)", rc, err);
    CHECK(job_commit(j, err, sizeof err) == 0, "commit: %s", err);
    CHECK(job_close(j, JOB_INTERRUPTED, err, sizeof err) == 0, "close: %s", err);

    j = NULL;
    rc = job_open_resume(dir, NULL, &j, err, sizeof err);
    CHECK(rc == 0, "resume after every byte: %s", err);
    if (rc)
        return;
    CHECK(job_rows_completed(j) == 2 * N_TOK, "resume counted %llu rows, want %d",
          (unsigned long long)job_rows_completed(j), 2 * N_TOK);
    char id[32];
    custom_id(0, 1, id, sizeof id);
    CHECK(job_is_done(j, id), "the byte-0x00 completions row is not done after resume");
    custom_id(0xFF, 0, id, sizeof id);
    CHECK(job_is_done(j, id), "the U+00FF chat row is not done after resume");
    CHECK(job_close(j, JOB_DONE, err, sizeof err) == 0, "close after resume: %s", err);

    /* The official openai types and Python's json read every line, the NUL key included. */
    if (access(".venv/bin/python", X_OK) == 0) {
        char cmd[2 * PATH_MAX];
        snprintf(cmd, sizeof cmd, ".venv/bin/python tools/check_output_schema.py %s/results.jsonl", dir);
        CHECK(system(cmd) == 0, "the openai types refused a line: %s", cmd);
    } else
        fprintf(stderr, "test_bytes: no .venv, the openai schema check is skipped (run tools/setup.sh)\n");
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_every_byte();
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_finish("test_bytes");
}
