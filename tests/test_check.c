/*
 * test_check.c — the input-file checker against its corpus and the row parser
 * against hand-computed fields.
 *
 * Corpus: tests/data/check/expected.tsv (written with the sentences by
 * tests/data/check/make_corpus.py) maps each bad file to its exact first error
 * sentence, OpenAI code and line, and each good file to its row count, format
 * and model.  Expectations are exact: an error sentence is user-facing text,
 * so any change to it must show up here.  Also: `--all` listing, parsed
 * fields and OpenAI defaults, the line reader's edges (CRLF, no final newline,
 * over-long lines at a small cap and at the real 16 MiB cap), the 50,000-row
 * and byte limits, and check_main's exit codes.  Run from the repo root.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch/check.h"
#include "batch/request.h"
#include "test.h"

#define CORPUS "tests/data/check/"

/* ---- corpus ------------------------------------------------------------------------------------------ */

static void test_corpus(void)
{
    FILE *tsv = fopen(CORPUS "expected.tsv", "r");
    CHECK(tsv, "cannot open " CORPUS "expected.tsv (run from the repo root)");
    if (!tsv)
        return;
    char *row = NULL;
    size_t cap = 0;
    int n_bad = 0, n_good = 0;
    while (getline(&row, &cap, tsv) > 0) {
        if (row[0] == '#')
            continue;
        row[strcspn(row, "\n")] = 0;
        char *f[5] = {0};
        char *save = NULL, *s = row;
        for (int i = 0; i < 5 && (f[i] = strtok_r(s, "\t", &save)); i++)
            s = NULL;
        CHECK(f[0] && f[1] && f[2] && f[3], "malformed expected.tsv row");
        if (!f[3])
            continue;
        char path[512];
        snprintf(path, sizeof path, CORPUS "%s", f[0]);
        const char *base = strrchr(f[0], '/') + 1;
        FILE *in = fopen(path, "rb");
        CHECK(in, "cannot open %s", path);
        if (!in)
            continue;
        check_report r;
        char err[SPILL_ERRLEN];
        check_opts o = check_opts_default();
        if (!strncmp(base, "endpoint_", 9))
            o.endpoint = "/v1/chat/completions";
        int rc = check_stream(in, base, &o, &r, NULL, err, sizeof err);
        fclose(in);
        if (strcmp(f[1], "OK") == 0) {
            n_good++;
            CHECK(rc == CHECK_OK, "%s: expected OK, got %d: %s", f[0], rc, err);
            CHECK(r.ok_rows == (size_t)atol(f[2]) && r.rows == r.ok_rows, "%s: %zu ok rows of %zu, expected %s", f[0],
                  r.ok_rows, r.rows, f[2]);
            CHECK(strcmp(request_kind_name(r.kind, r.endpoint), f[3]) == 0, "%s: kind %s, expected %s", f[0],
                  request_kind_name(r.kind, r.endpoint), f[3]);
            const char *model = strcmp(f[4] ? f[4] : "-", "-") == 0 ? "" : f[4];
            CHECK(strcmp(r.model, model) == 0, "%s: model '%s', expected '%s'", f[0], r.model, model);
        } else {
            n_bad++;
            CHECK(rc == CHECK_INVALID, "%s: expected invalid, got %d", f[0], rc);
            CHECK(strcmp(r.first_error, f[3]) == 0, "%s:\n   got: %s\n  want: %s", f[0], r.first_error, f[3]);
            CHECK(strcmp(err, r.first_error) == 0, "%s: err and report differ", f[0]);
            CHECK(!strchr(err, '\n') && util_utf8_valid(err, strlen(err)), "%s: not one line of UTF-8", f[0]);
            CHECK(r.first_error_code && strcmp(r.first_error_code, f[1]) == 0, "%s: code %s, expected %s", f[0],
                  r.first_error_code ? r.first_error_code : "(null)", f[1]);
            CHECK(r.first_error_line == (size_t)atol(f[2]), "%s: line %zu, expected %s", f[0], r.first_error_line,
                  f[2]);
        }
    }
    free(row);
    fclose(tsv);
    CHECK(n_bad >= 40 && n_good >= 5, "corpus too small: %d bad, %d good", n_bad, n_good);
    fprintf(stderr, "corpus: %d bad files, %d good files\n", n_bad, n_good);
}

/* check_file names the file by its path and stops at the first error; --all lists every bad line. */
static void test_check_file_and_all(void)
{
    check_report r;
    char err[SPILL_ERRLEN];
    int rc = check_file(CORPUS "bad/custom_id_duplicate.jsonl", NULL, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_INVALID, "rc %d", rc);
    CHECK(strcmp(err, CORPUS "bad/custom_id_duplicate.jsonl line 3: custom_id \"a\" is already used on line 1; "
                             "every custom_id must be unique.") == 0,
          "got %s", err);
    rc = check_file(CORPUS "bad/no_such_file.jsonl", NULL, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_NOINPUT && check_exit_code(rc) == 66, "missing file rc %d", rc);
    rc = check_file(CORPUS "bad", NULL, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_NOINPUT, "directory rc %d", rc);

    static const char input[] =
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n"
        "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":0}}\n"
        "\n"
        "not json\n"
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\r\n"
        "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m2\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n"
        "{\"custom_id\":\"d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}";
    static const char want[] =
        "x.jsonl line 2: body.n is 0, but it must be between 1 and 128.\n"
        "x.jsonl line 4: the line is not valid JSON ('[' or '{' expected near 'not', column 3); each line must be one "
        "complete JSON object.\n"
        "x.jsonl line 5: custom_id \"a\" is already used on line 1; every custom_id must be unique.\n"
        "x.jsonl line 6: body.model is \"m2\", but line 1 uses \"m\"; every line of a batch must name the same "
        "model.\n";
    FILE *in = fmemopen((void *)input, sizeof input - 1, "rb");
    char *got = NULL;
    size_t got_len = 0;
    FILE *out = open_memstream(&got, &got_len);
    check_opts o = check_opts_default();
    o.all = true;
    rc = check_stream(in, "x.jsonl", &o, &r, out, err, sizeof err);
    fclose(out);
    fclose(in);
    CHECK(rc == CHECK_INVALID, "--all rc %d", rc);
    CHECK(got && strcmp(got, want) == 0, "--all listing:\n%s\nwant:\n%s", got ? got : "", want);
    CHECK(r.lines == 7 && r.rows == 6 && r.bad_rows == 4 && r.ok_rows == 2 && r.file_errors == 3,
          "counts lines %zu rows %zu bad %zu ok %zu file-level %zu", r.lines, r.rows, r.bad_rows, r.ok_rows,
          r.file_errors);
    CHECK(r.first_error_line == 2 && strcmp(r.first_error_code, "invalid_request") == 0 &&
              strcmp(r.first_error_param, "body.n") == 0,
          "first error line %zu code %s param %s", r.first_error_line, r.first_error_code, r.first_error_param);
    CHECK(r.per_kind[REQ_KIND_BATCH] == 5 && r.per_kind[REQ_KIND_UNKNOWN] == 1, "per-kind %zu/%zu",
          r.per_kind[REQ_KIND_BATCH], r.per_kind[REQ_KIND_UNKNOWN]);
    free(got);

    /* one sentence per line even when a line breaks several rules (bad method + duplicate id + other model),
     * and the line's id still counts: line 3 names line 2 */
    static const char multi[] =
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n"
        "{\"custom_id\":\"b\",\"method\":\"GET\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m2\","
        "\"messages\":[]}}\n"
        "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
        "\"messages\":[]}}\n";
    static const char want_multi[] =
        "m.jsonl line 2: method is \"GET\", but batch requests must use \"POST\".\n"
        "m.jsonl line 3: custom_id \"b\" is already used on line 2; every custom_id must be unique.\n";
    in = fmemopen((void *)multi, sizeof multi - 1, "rb");
    got = NULL;
    out = open_memstream(&got, &got_len);
    rc = check_stream(in, "m.jsonl", &o, &r, out, err, sizeof err);
    fclose(out);
    fclose(in);
    CHECK(rc == CHECK_INVALID && got && strcmp(got, want_multi) == 0, "one sentence per line:\n%s", got ? got : "");
    CHECK(r.bad_rows == 2 && r.ok_rows == 1 && r.file_errors == 2, "multi counts bad %zu ok %zu file %zu", r.bad_rows,
          r.ok_rows, r.file_errors);
    free(got);

    /* without --all the pass stops at line 2 */
    in = fmemopen((void *)input, sizeof input - 1, "rb");
    o.all = false;
    rc = check_stream(in, "x.jsonl", &o, &r, NULL, err, sizeof err);
    fclose(in);
    CHECK(rc == CHECK_INVALID && r.rows == 2 && r.bad_rows == 1, "first-error mode read %zu rows", r.rows);
}

/* ---- the row parser ---------------------------------------------------------------------------------- */

static int parse(const char *s, request *q, char *err)
{
    return request_parse_line(s, strlen(s), 9, "t.jsonl", q, err, SPILL_ERRLEN);
}

static void test_parse_fields(void)
{
    request q;
    char err[SPILL_ERRLEN];
    /* defaults: OpenAI's (temperature 1, top_p 1, n 1; chat max_tokens unset) */
    int rc =
        parse("{\"custom_id\":\"x\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
              "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}",
              &q, err);
    CHECK(rc == 0, "%s", err);
    CHECK(q.kind == REQ_KIND_BATCH && q.endpoint == REQ_EP_CHAT && q.line == 9, "kind/endpoint/line");
    CHECK(strcmp(q.custom_id, "x") == 0 && strcmp(q.model, "m") == 0 && strcmp(q.url, "/v1/chat/completions") == 0,
          "ids");
    CHECK(json_array_size(q.messages) == 1 && !q.prompt && !q.expected && !q.tools, "payload");
    CHECK(q.s.max_tokens == -1 && q.s.temperature == 1 && q.s.top_p == 1 && q.s.n == 1 && q.s.n_stop == 0 &&
              !q.s.has_seed && !q.s.logprobs && q.s.top_logprobs == 0 && q.s.frequency_penalty == 0 &&
              q.s.presence_penalty == 0 && q.s.n_logit_bias == 0 && !q.s.echo,
          "chat defaults");
    request_free(&q);

    /* every sampling field set */
    rc = parse("{\"custom_id\":\"y\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":77,"
               "\"temperature\":0.25,\"top_p\":0.5,\"n\":3,\"stop\":[\"A\",\"BB\"],\"seed\":-5,\"logprobs\":true,"
               "\"top_logprobs\":20,\"frequency_penalty\":1.5,\"presence_penalty\":-2,"
               "\"logit_bias\":{\"7\":-100,\"2147483647\":5.0},\"tools\":[{\"type\":\"function\",\"function\":"
               "{\"name\":\"f\"}}]}}",
               &q, err);
    CHECK(rc == 0, "%s", err);
    CHECK(q.s.max_tokens == 77 && q.s.temperature == 0.25 && q.s.top_p == 0.5 && q.s.n == 3, "numbers");
    CHECK(q.s.n_stop == 2 && strcmp(q.s.stop[0], "A") == 0 && q.s.stop_len[1] == 2, "stop");
    CHECK(q.s.has_seed && q.s.seed == -5 && q.s.logprobs && q.s.top_logprobs == 20, "seed/logprobs");
    CHECK(q.s.frequency_penalty == 1.5 && q.s.presence_penalty == -2, "penalties");
    CHECK(q.s.n_logit_bias == 2 && q.s.logit_bias_id[0] == 7 && q.s.logit_bias[0] == -100 &&
              q.s.logit_bias_id[1] == 2147483647 && q.s.logit_bias[1] == 5,
          "logit_bias");
    CHECK(json_array_size(q.tools) == 1, "tools");
    request_free(&q);

    /* completions: max_tokens defaults to 16; logprobs k → logprobs + top_logprobs k */
    rc = parse("{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\","
               "\"prompt\":[[1,2],[3]],\"logprobs\":0,\"echo\":true,\"stop\":\"\\n\"}}",
               &q, err);
    CHECK(rc == 0, "%s", err);
    CHECK(q.endpoint == REQ_EP_COMPLETIONS && q.s.max_tokens == 16 && q.n_prompts == 2 && q.s.logprobs &&
              q.s.top_logprobs == 0 && q.s.echo && q.s.n_stop == 1 && strcmp(q.s.stop[0], "\n") == 0,
          "completions fields");
    request_free(&q);
    rc = parse("{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\","
               "\"prompt\":[5,6,7],\"max_tokens\":3}}",
               &q, err);
    CHECK(rc == 0 && q.n_prompts == 1 && q.s.max_tokens == 3 && !q.s.logprobs, "token prompt %s", err);
    request_free(&q);

    /* fine-tuning / eval lines: custom_id row-<line>, model optional, expected borrowed */
    rc = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"expected\":\"4\"}", &q, err);
    CHECK(rc == 0, "%s", err);
    CHECK(q.kind == REQ_KIND_EVAL_FINETUNE && q.endpoint == REQ_EP_CHAT && strcmp(q.custom_id, "row-9") == 0 &&
              !q.model && json_is_string(q.expected) && q.body == q.root,
          "eval fine-tuning fields");
    request_free(&q);
    rc = parse("{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
               "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]},\"expected\":[\"a\"]}",
               &q, err);
    CHECK(rc == 0 && q.kind == REQ_KIND_EVAL_BATCH && !q.model && json_is_array(q.expected),
          "eval batch without model: %s", err);
    request_free(&q);

    /* a failing row still names itself: custom_id, model and the error's code/param/level survive */
    rc = parse("{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
               "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":\"hot\"}}",
               &q, err);
    CHECK(rc == -1 && strcmp(q.custom_id, "bad") == 0 && strcmp(q.model, "m") == 0 && !q.err_file_level &&
              strcmp(q.err_code, "invalid_request") == 0 && strcmp(q.err_param, "body.temperature") == 0,
          "row-level failure fields");
    CHECK(strcmp(err, "t.jsonl line 9: body.temperature is \"hot\", but it must be a number between 0 and 2.") == 0,
          "got %s", err);
    request_free(&q);
    rc = request_parse_line("{\"a\":", 5, 1, "t.jsonl", &q, err, sizeof err);
    CHECK(rc == -1 && q.err_file_level && strcmp(q.err_code, "invalid_json_line") == 0 && !q.custom_id &&
              q.kind == REQ_KIND_UNKNOWN,
          "bad JSON fields");
    request_free(&q);
    request_free(&q); /* idempotent on a zeroed request */

    /* values in sentences are cut to about 60 bytes, at a UTF-8 boundary, control bytes escaped */
    rc = parse("{\"custom_id\":\"x\",\"method\":\"PUT\\nPUT ééééééééééééééééééééééééééééééééééééééééééééééééééé\","
               "\"url\":\"/v1/chat/completions\",\"body\":{}}",
               &q, err);
    CHECK(rc == -1 && strstr(err, "method is \"PUT\\nPUT \xc3\xa9") && strstr(err, "\xE2\x80\xA6\", but") &&
              strlen(err) < 140,
          "long value: %s", err);
    request_free(&q);
    /* the parser reads only len bytes: a line cut short inside a string is invalid, not over-read */
    const char *full = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    rc = request_parse_line(full, strlen(full) - 3, 1, "t.jsonl", &q, err, sizeof err);
    CHECK(rc == -1 && strcmp(q.err_code, "invalid_json_line") == 0, "prefix must fail");
    request_free(&q);
}

/* ---- the line reader --------------------------------------------------------------------------------- */

static void test_reader(void)
{
    static const char data[] = "a\r\n\nbb\r\ncccccccccc\nd\r\r\ne";
    FILE *f = fmemopen((void *)data, sizeof data - 1, "rb");
    jsonl_reader rd;
    char err[SPILL_ERRLEN];
    CHECK(jsonl_open(&rd, f, "mem", 8, err, sizeof err) == 0, "open");
    const char *line;
    size_t len;
    static const char *const want[] = {"a", "", "bb", NULL, "d\r", "e"};
    for (int i = 0; i < 6; i++) {
        jsonl_status st = jsonl_next(&rd, &line, &len, err, sizeof err);
        CHECK(rd.lineno == (size_t)i + 1, "line number %zu, want %d", rd.lineno, i + 1);
        if (!want[i])
            CHECK(st == JSONL_TOO_LONG, "line %d: over-long line status %d", i + 1, st);
        else
            CHECK(st == JSONL_LINE && len == strlen(want[i]) && memcmp(line, want[i], len) == 0,
                  "line %d: status %d '%.*s'", i + 1, st, (int)len, line);
    }
    CHECK(jsonl_next(&rd, &line, &len, err, sizeof err) == JSONL_EOF, "EOF after the last line");
    CHECK(jsonl_next(&rd, &line, &len, err, sizeof err) == JSONL_EOF, "EOF stays EOF");
    CHECK(rd.offset == sizeof data - 1, "offset %llu", (unsigned long long)rd.offset);
    jsonl_close(&rd);
    jsonl_close(&rd);
    fclose(f);
}

/* A line of 16 MiB + 1 byte at the default cap is named; the line after it still parses. */
static void test_real_line_cap(void)
{
    FILE *f = tmpfile();
    CHECK(f, "tmpfile");
    if (!f)
        return;
    static const char ok[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n";
    fputs(ok, f);
    fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"", f);
    size_t pad = REQ_MAX_LINE_BYTES + 1 - strlen("{\"messages\":[{\"role\":\"user\",\"content\":\"") - 4;
    char block[4096];
    memset(block, 'x', sizeof block);
    for (size_t left = pad; left;) {
        size_t n = left < sizeof block ? left : sizeof block;
        fwrite(block, 1, n, f);
        left -= n;
    }
    fputs("\"}]}\n", f); /* 16 MiB + 1 bytes before the '\n' */
    fputs(ok, f);
    rewind(f);
    check_report r;
    char err[SPILL_ERRLEN];
    check_opts o = check_opts_default();
    o.all = true;
    int rc = check_stream(f, "big.jsonl", &o, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_INVALID && r.rows == 3 && r.ok_rows == 2 && r.first_error_line == 2, "rc %d rows %zu ok %zu", rc,
          r.rows, r.ok_rows);
    CHECK(strcmp(err, "big.jsonl line 2: the line is longer than 16,777,216 bytes, the limit for one request; "
                      "shorten it.") == 0,
          "got %s", err);
    /* exactly at the cap is accepted (JSON of exactly 16 MiB) */
    rewind(f);
    CHECK(ftruncate(fileno(f), 0) == 0, "truncate");
    fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"", f);
    for (size_t left = pad - 1; left;) {
        size_t n = left < sizeof block ? left : sizeof block;
        fwrite(block, 1, n, f);
        left -= n;
    }
    fputs("\"}]}", f);
    rewind(f);
    rc = check_stream(f, "big.jsonl", &o, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_OK && r.ok_rows == 1, "16 MiB line: rc %d %s", rc, err);
    fclose(f);
}

/* 50,001 rows → too_many_tasks on line 50,001; a byte cap names the line that crosses it. */
static void test_limits(void)
{
    FILE *f = tmpfile();
    CHECK(f, "tmpfile");
    if (!f)
        return;
    for (int i = 1; i <= CHECK_MAX_ROWS + 1; i++)
        fprintf(f, "{\"custom_id\":\"%d\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}\n", i);
    rewind(f);
    check_report r;
    char err[SPILL_ERRLEN];
    int rc = check_stream(f, "many.jsonl", NULL, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_INVALID && strcmp(r.first_error_code, "too_many_tasks") == 0 &&
              r.first_error_line == CHECK_MAX_ROWS + 1 && r.ok_rows == CHECK_MAX_ROWS,
          "rc %d code %s line %zu ok %zu", rc, r.first_error_code, r.first_error_line, r.ok_rows);
    CHECK(strcmp(err, "many.jsonl line 50001: the file has more than 50,000 requests, the most one batch may hold; "
                      "split it into several files.") == 0,
          "got %s", err);
    rewind(f);
    check_opts o = check_opts_default();
    o.all = true; /* --all: the row past the limit is the one bad row, and still checked */
    rc = check_stream(f, "many.jsonl", &o, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_INVALID && r.rows == CHECK_MAX_ROWS + 1 && r.bad_rows == 1 && r.ok_rows == CHECK_MAX_ROWS,
          "--all over the row limit: rows %zu bad %zu ok %zu", r.rows, r.bad_rows, r.ok_rows);
    rewind(f);
    o.all = false;
    o.max_rows = 0;
    rc = check_stream(f, "many.jsonl", &o, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_OK && r.ok_rows == CHECK_MAX_ROWS + 1, "no row limit: rc %d %s", rc, err);
    rewind(f);
    o.max_bytes = 1000; /* lines 1-9 are 60 bytes, 10-99 are 61: line 17 ends at byte 1045 */
    rc = check_stream(f, "many.jsonl", &o, &r, NULL, err, sizeof err);
    CHECK(rc == CHECK_INVALID && r.first_error_line == 17 && strstr(err, "passes 1,000 bytes here"),
          "byte cap: line %zu %s", r.first_error_line, err);
    fclose(f);
}

/* Odd inputs to the cross-line rules and the stream: long ids are cut in sentences, control bytes in a model
 * name never break the report onto two lines, a read error is CHECK_IOERR (exit 74), not "invalid". */
static void test_edges(void)
{
    char id[200], line[1024], input[4096];
    memset(id, 'k', sizeof id - 1);
    id[sizeof id - 1] = 0;
    snprintf(line, sizeof line,
             "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
             "\"a\\tb\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n",
             id);
    snprintf(input, sizeof input, "%s%s", line, line);
    FILE *in = fmemopen(input, strlen(input), "rb");
    check_report r;
    char err[SPILL_ERRLEN];
    int rc = check_stream(in, "long.jsonl", NULL, &r, NULL, err, sizeof err);
    fclose(in);
    CHECK(rc == CHECK_INVALID && strcmp(r.first_error_code, "duplicate_custom_id") == 0, "rc %d", rc);
    CHECK(strstr(err, "long.jsonl line 2: custom_id \"kkkkk") &&
              strstr(err, "k\xE2\x80\xA6\" is already used on line 1;") && strlen(err) < 200,
          "long id sentence: %s", err);
    CHECK(strcmp(r.model, "a?b") == 0, "model with a tab is reported as '%s'", r.model);

    FILE *dir = fopen(CORPUS "good", "r"); /* opens on Linux; the first read fails with EISDIR */
    if (dir) {
        rc = check_stream(dir, "dir", NULL, &r, NULL, err, sizeof err);
        fclose(dir);
        CHECK(rc == CHECK_IOERR && check_exit_code(rc) == 74 && strstr(err, "dir: read failed at byte 0"),
              "read error: rc %d %s", rc, err);
    }
}

static void test_main_exit_codes(void)
{
    /* argv = the arguments after "check", as main.c passes them */
    char *good[] = {CORPUS "good/chat_batch.jsonl", NULL};
    char *bad[] = {"--all", CORPUS "bad/top_logprobs_25.jsonl", NULL};
    char *missing[] = {CORPUS "none.jsonl", NULL};
    char *dir[] = {CORPUS "good", NULL};
    char *usage2[] = {"a", "b", NULL};
    char *flag[] = {"--bogus", "a", NULL};
    CHECK(check_main(1, good) == 0, "good → 0");
    CHECK(check_main(2, bad) == 65, "bad → 65");
    CHECK(check_main(1, missing) == 66, "missing → 66");
    CHECK(check_main(1, dir) == 66, "directory → 66");
    CHECK(check_main(0, missing + 1) == 2, "no args → 2");
    CHECK(check_main(2, usage2) == 2, "two inputs → 2");
    CHECK(check_main(2, flag) == 2, "unknown flag → 2");
}

int main(void)
{
    test_corpus();
    test_check_file_and_all();
    test_parse_fields();
    test_reader();
    test_real_line_cap();
    test_limits();
    test_edges();
    test_main_exit_codes();
    return test_finish("test_check");
}
