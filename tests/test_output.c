/*
 * test_output.c — output.c against hand-written expected lines (ids fixed
 * through an injected id source) and against the reference conversions in
 * tests/data/output/reference.json (tools/gen_output_fixtures.py: numpy's
 * shortest float32 repr, Python's decode(errors="replace")).
 *
 * Expectations, fixed before running: every line equals its expected text
 * byte for byte; every float32 logprob reads back as exactly the double of
 * numpy's shortest repr (0 mismatches allowed — the repr is unique); every
 * byte string becomes exactly Python's replacement text (0 mismatches).
 * With SPILL_OUTPUT_SAMPLES=path the lines are also written to that file for
 * tools/check_output_schema.py (the official openai types).
 */
#include "batch/output.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>

/* Id source for tests: call k fills every byte with k (k = 0, 1, ...), so
 * the k-th id drawn is 24 times alphabet[k]: batch_req_AAAA…, req_BBBB…, … */
static int fixed_fill(void *ctx, void *buf, size_t n)
{
    unsigned *k = ctx;
    memset(buf, (int)(*k)++, n);
    return 0;
}

static FILE *samples;

static void expect_line(int rc, char *line, size_t len, const char *want, const char *err, const char *what)
{
    CHECK(rc == 0, "%s: failed: %s", what, err);
    if (rc != 0)
        return;
    CHECK(len == strlen(line), "%s: len %zu != strlen %zu", what, len, strlen(line));
    CHECK(strcmp(line, want) == 0, "%s:\n got  %s\n want %s", what, line, want);
    CHECK(!memchr(line, '\n', len), "%s: line contains a newline", what);
    if (samples)
        fprintf(samples, "%s\n", line);
    free(line);
}

#define A24 "AAAAAAAAAAAAAAAAAAAAAAAA"
#define B24 "BBBBBBBBBBBBBBBBBBBBBBBB"
#define C24 "CCCCCCCCCCCCCCCCCCCCCCCC"

static void test_chat_plain(void)
{
    unsigned k = 0;
    out_ids ids = {fixed_fill, &k};
    out_choice ch = {.text = "Hello!", .len = 6, .finish = OUT_FINISH_STOP};
    out_stamp st = {"run1", "sha256:aa", "q4_1", NULL, 0, 0, NULL};
    out_result r = {.custom_id = "request-1",
                    .model = "smollm2:135m",
                    .system_fingerprint = "fp_abc",
                    .created = 1711475054,
                    .n_choices = 1,
                    .choices = &ch,
                    .prompt_tokens = 24,
                    .completion_tokens = 15,
                    .stamp = &st};
    char *line, err[SPILL_ERRLEN];
    size_t len;
    int rc = output_chat_line(&r, &ids, &line, &len, err, sizeof err);
    expect_line(rc, line, len,
                "{\"id\":\"batch_req_" A24 "\",\"custom_id\":\"request-1\",\"response\":{\"status_code\":200,"
                "\"request_id\":\"req_" B24 "\",\"body\":{\"id\":\"chatcmpl-" C24 "\",\"object\":\"chat.completion\","
                "\"created\":1711475054,\"model\":\"smollm2:135m\",\"system_fingerprint\":\"fp_abc\",\"choices\":"
                "[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hello!\",\"refusal\":null},"
                "\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":24,"
                "\"completion_tokens\":15,\"total_tokens\":39,\"prompt_tokens_details\":{\"cached_tokens\":0}}}},\"error\":null,\"spill\":{\"run_id\":\"run1\","
                "\"model_fingerprint\":\"sha256:aa\",\"quant\":\"q4_1\",\"adapter\":null}}",
                err, "chat plain");
}

static void test_chat_logprobs(void)
{
    unsigned k = 0;
    out_ids ids = {fixed_fill, &k};
    out_alt top0[2] = {{"He", 2, -0.01f}, {"Hi", 2, -4.5f}};
    out_token toks[2] = {{"He", 2, -0.01f, 2, top0}, {"\xe2\x80", 2, -INFINITY, 0, NULL}};
    /* Two choices; the second's text ends in a torn character and has a stray byte. */
    out_choice ch[2] = {
        {.text = "He\xe2\x80", .len = 4, .finish = OUT_FINISH_LENGTH, .logprobs = true, .n_tokens = 2, .tokens = toks},
        {.text = "ok\xff\xe2\x82", .len = 5, .finish = OUT_FINISH_TOOL_CALLS}};
    out_result r = {.custom_id = "r\"2",
                    .model = "m",
                    .created = 5,
                    .n_choices = 2,
                    .choices = ch,
                    .prompt_tokens = 3,
                    .completion_tokens = 4};
    char *line, err[SPILL_ERRLEN];
    size_t len;
    int rc = output_chat_line(&r, &ids, &line, &len, err, sizeof err);
    expect_line(rc, line, len,
                "{\"id\":\"batch_req_" A24 "\",\"custom_id\":\"r\\\"2\",\"response\":{\"status_code\":200,"
                "\"request_id\":\"req_" B24 "\",\"body\":{\"id\":\"chatcmpl-" C24 "\",\"object\":\"chat.completion\","
                "\"created\":5,\"model\":\"m\",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"message\":"
                "{\"role\":\"assistant\",\"content\":\"He\xef\xbf\xbd\",\"refusal\":null},\"logprobs\":{\"content\":"
                "[{\"token\":\"He\",\"logprob\":-0.01,\"bytes\":[72,101],\"top_logprobs\":[{\"token\":\"He\","
                "\"logprob\":-0.01,\"bytes\":[72,101]},{\"token\":\"Hi\",\"logprob\":-4.5,\"bytes\":[72,105]}]},"
                "{\"token\":\"bytes:\\\\xe2\\\\x80\",\"logprob\":-9999.0,\"bytes\":[226,128],\"top_logprobs\":[]}],"
                "\"refusal\":null},\"finish_reason\":\"length\"},{\"index\":1,\"message\":{\"role\":\"assistant\","
                "\"content\":\"ok\xef\xbf\xbd\xef\xbf\xbd\",\"refusal\":null},\"logprobs\":null,"
                "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,"
                "\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":0}}}},\"error\":null}",
                err, "chat logprobs");
}

static void test_completion(void)
{
    unsigned k = 0;
    out_ids ids = {fixed_fill, &k};
    /* The third candidate decodes to the same string as the first: the first (best) is kept. */
    out_alt top0[3] = {{"Hi", 2, -0.5f}, {" Hi", 3, -1.25f}, {"Hi", 2, -3.0f}};
    out_token toks[3] = {{"Hi", 2, -0.5f, 3, top0}, {" th\xc3\xa9", 5, -0.25f, 0, NULL}, {"re", 2, -2.0f, 0, NULL}};
    out_choice ch = {.text = "Hi th\xc3\xa9re",
                     .len = 9,
                     .finish = OUT_FINISH_LENGTH,
                     .logprobs = true,
                     .n_tokens = 3,
                     .tokens = toks};
    out_result r = {.custom_id = "c-1",
                    .model = "m",
                    .created = 1700000000,
                    .n_choices = 1,
                    .choices = &ch,
                    .prompt_tokens = 3,
                    .completion_tokens = 3};
    char *line, err[SPILL_ERRLEN];
    size_t len;
    int rc = output_completion_line(&r, &ids, &line, &len, err, sizeof err);
    expect_line(rc, line, len,
                "{\"id\":\"batch_req_" A24 "\",\"custom_id\":\"c-1\",\"response\":{\"status_code\":200,"
                "\"request_id\":\"req_" B24 "\",\"body\":{\"id\":\"cmpl-" C24 "\",\"object\":\"text_completion\","
                "\"created\":1700000000,\"model\":\"m\",\"system_fingerprint\":null,\"choices\":[{\"text\":"
                "\"Hi th\xc3\xa9re\",\"index\":0,\"logprobs\":{\"tokens\":[\"Hi\",\" th\xc3\xa9\",\"re\"],"
                "\"token_logprobs\":[-0.5,-0.25,-2.0],\"top_logprobs\":[{\"Hi\":-0.5,\" Hi\":-1.25},{},{}],"
                "\"text_offset\":[0,2,6]},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,"
                "\"completion_tokens\":3,\"total_tokens\":6,\"prompt_tokens_details\":{\"cached_tokens\":0}}}},\"error\":null}",
                err, "completion");

    /* tool_calls is not a completions finish reason. */
    ch.finish = OUT_FINISH_TOOL_CALLS;
    rc = output_completion_line(&r, &ids, &line, &len, err, sizeof err);
    CHECK(rc != 0 && line == NULL && strstr(err, "finish reason"), "tool_calls accepted for completions: %s", err);
}

static void test_error_lines(void)
{
    unsigned k = 0;
    out_ids ids = {fixed_fill, &k};
    char *line, err[SPILL_ERRLEN];
    size_t len;
    out_stamp st = {"run9", NULL, NULL, "sha256:bb", 0, 0, NULL};
    out_http_error he = {.custom_id = "r2",
                         .status_code = 400,
                         .message = "The prompt is 9000 tokens; the model's context is 8192.",
                         .param = "messages",
                         .code = "context_length_exceeded",
                         .stamp = &st};
    int rc = output_http_error_line(&he, &ids, &line, &len, err, sizeof err);
    expect_line(rc, line, len,
                "{\"id\":\"batch_req_" A24 "\",\"custom_id\":\"r2\",\"response\":{\"status_code\":400,"
                "\"request_id\":\"req_" B24 "\",\"body\":{\"error\":{\"message\":\"The prompt is 9000 tokens; the "
                "model's context is 8192.\",\"type\":\"invalid_request_error\",\"param\":\"messages\",\"code\":"
                "\"context_length_exceeded\"}}},\"error\":null,\"spill\":{\"run_id\":\"run9\",\"model_fingerprint\":"
                "null,\"quant\":null,\"adapter\":\"sha256:bb\"}}",
                err, "http error");

    k = 0;
    rc = output_error_line("r3", OUT_CODE_BATCH_EXPIRED, OUT_MSG_BATCH_EXPIRED, NULL, &ids, &line, &len, err,
                           sizeof err);
    expect_line(rc, line, len,
                "{\"id\":\"batch_req_" A24 "\",\"custom_id\":\"r3\",\"response\":null,\"error\":{\"code\":"
                "\"batch_expired\",\"message\":\"This request could not be executed before the completion window "
                "expired.\"}}",
                err, "batch_expired");

    k = 1;
    rc = output_error_line("r4", OUT_CODE_BATCH_CANCELLED, OUT_MSG_BATCH_CANCELLED, NULL, &ids, &line, &len, err,
                           sizeof err);
    expect_line(rc, line, len,
                "{\"id\":\"batch_req_" B24 "\",\"custom_id\":\"r4\",\"response\":null,\"error\":{\"code\":"
                "\"batch_cancelled\",\"message\":\"This request was not executed because the batch was "
                "cancelled.\"}}",
                err, "batch_cancelled");

    he.status_code = 200;
    rc = output_http_error_line(&he, &ids, &line, &len, err, sizeof err);
    CHECK(rc != 0 && line == NULL && strstr(err, "400..599"), "status 200 accepted as an error: %s", err);
    rc = output_error_line("bad\xff", "c", "m", NULL, &ids, &line, &len, err, sizeof err);
    CHECK(rc != 0 && line == NULL, "invalid UTF-8 custom_id accepted");
}

static void test_bad_inputs(void)
{
    char *line, err[SPILL_ERRLEN];
    size_t len;
    out_token tok = {"a", 1, NAN, 0, NULL};
    out_choice ch = {.text = "a", .len = 1, .logprobs = true, .n_tokens = 1, .tokens = &tok};
    out_result r = {.custom_id = "x", .model = "m", .n_choices = 1, .choices = &ch};
    int rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc != 0 && line == NULL && strstr(err, "NaN") && strstr(err, "token 0"), "NaN logprob: %s", err);
    tok.logprob = INFINITY;
    rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "+inf"), "+inf logprob: %s", err);
    tok.logprob = -1;
    tok.bytes = NULL;
    rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "NULL bytes"), "NULL token bytes with length 1: %s", err);
    /* A token that decodes to nothing (an end-of-turn token) is "" with bytes []. */
    tok.len = 0;
    rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc == 0 && strstr(line, "{\"token\":\"\",\"logprob\":-1.0,\"bytes\":[],\"top_logprobs\":[]}"),
          "empty token: %s", rc ? err : line);
    if (rc == 0)
        free(line);
    r.n_choices = 0;
    rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "no choices"), "zero choices: %s", err);
    r.n_choices = 1;
    r.custom_id = NULL;
    rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc != 0 && strstr(err, "custom_id"), "NULL custom_id: %s", err);
    /* NULL err buffer is allowed by the convention. */
    rc = output_chat_line(&r, NULL, &line, &len, NULL, 0);
    CHECK(rc != 0, "NULL custom_id accepted with NULL err");
    /* An id source that fails. */
    r.custom_id = "x";
    out_ids broken = {NULL, NULL};
    rc = output_chat_line(&r, &broken, &line, &len, err, sizeof err);
    CHECK(rc == 0, "NULL fill means getrandom: %s", err);
    if (rc == 0)
        free(line);
}

static int fail_fill(void *ctx, void *buf, size_t n)
{
    return -1;
}

static int alternate_fill(void *ctx, void *buf, size_t n)
{
    unsigned *calls = ctx;
    memset(buf, (*calls)++ % 2 == 0 ? 0xf8 : 0x01, n);
    return 0;
}

static void test_random_ids(void)
{
    char a[64], b[64], err[SPILL_ERRLEN];
    CHECK(output_new_id(NULL, "batch_req_", a, sizeof a, err, sizeof err) == 0, "id: %s", err);
    CHECK(output_new_id(NULL, "batch_req_", b, sizeof b, err, sizeof err) == 0, "id: %s", err);
    CHECK(strlen(a) == 10 + 24 && strncmp(a, "batch_req_", 10) == 0, "id shape: %s", a);
    CHECK(strcmp(a, b) != 0, "two random ids are equal: %s", a);
    for (const char *p = a + 10; *p; p++)
        CHECK((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9'), "id char %c", *p);
    CHECK(output_new_id(NULL, "batch_req_", a, 34, err, sizeof err) != 0, "id accepted a 34-byte buffer");
    out_ids bad = {fail_fill, NULL};
    CHECK(output_new_id(&bad, "x", a, sizeof a, err, sizeof err) != 0 && strstr(err, "random"), "fill failure: %s",
          err);
    /* Bytes >= 248 are skipped (rejection sampling): a source alternating
     * between all-0xf8 and all-0x01 calls must give only alphabet[1] = 'B'. */
    unsigned calls = 0;
    out_ids alt = {alternate_fill, &calls};
    CHECK(output_new_id(&alt, "p_", a, sizeof a, err, sizeof err) == 0 && strcmp(a, "p_" B24) == 0,
          "rejection sampling: %s", a);
    CHECK(calls == 2, "rejection sampling used %u calls, want 2", calls);
}

static json_t *choice0(json_t *line)
{
    json_t *body = json_object_get(json_object_get(line, "response"), "body");
    return json_array_get(json_object_get(body, "choices"), 0);
}

/* Reference conversions produced by Python (see the header comment). */
static void test_reference(void)
{
    json_error_t jerr;
    json_t *ref = json_load_file("tests/data/output/reference.json", 0, &jerr);
    CHECK(ref != NULL, "cannot load tests/data/output/reference.json (run from the repo root): %s", jerr.text);
    if (!ref)
        return;
    json_t *floats = json_object_get(ref, "floats"), *utf8 = json_object_get(ref, "utf8");
    size_t nf = json_array_size(floats);
    CHECK(nf > 1000, "only %zu floats in the fixture", nf);

    /* All floats go through one chat line as the logprobs of nf tokens. */
    out_token *toks = calloc(nf, sizeof *toks);
    for (size_t i = 0; i < nf; i++) {
        uint32_t bits = (uint32_t)json_integer_value(json_array_get(json_array_get(floats, i), 0));
        float f;
        memcpy(&f, &bits, 4);
        toks[i] = (out_token){"t", 1, f, 0, NULL};
    }
    out_choice ch = {.text = "t", .len = 1, .logprobs = true, .n_tokens = nf, .tokens = toks};
    out_result r = {.custom_id = "f", .model = "m", .n_choices = 1, .choices = &ch};
    char *line, err[SPILL_ERRLEN];
    size_t len;
    int rc = output_chat_line(&r, NULL, &line, &len, err, sizeof err);
    CHECK(rc == 0, "float line: %s", err);
    size_t bad = 0;
    if (rc == 0) {
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &jerr);
        json_t *content = json_object_get(json_object_get(choice0(o), "logprobs"), "content");
        CHECK(json_array_size(content) == nf, "content has %zu entries", json_array_size(content));
        for (size_t i = 0; i < nf && i < json_array_size(content); i++) {
            json_t *lp = json_object_get(json_array_get(content, i), "logprob");
            const char *want = json_string_value(json_array_get(json_array_get(floats, i), 1));
            double got = json_number_value(lp), w = strtod(want, NULL);
            if (got != w || signbit(got) != signbit(w)) {
                if (bad++ < 5)
                    fprintf(stderr, "float %zu: got %.17g want %s\n", i, got, want);
            }
        }
        json_decref(o);
        free(line);
    }
    CHECK(bad == 0, "%zu of %zu logprobs differ from numpy's shortest float32 repr", bad, nf);
    free(toks);

    size_t nu = json_array_size(utf8);
    CHECK(nu >= 500, "only %zu byte strings in the fixture", nu);
    bad = 0;
    for (size_t i = 0; i < nu; i++) {
        const char *in_hex = json_string_value(json_array_get(json_array_get(utf8, i), 0));
        const char *out_hex = json_string_value(json_array_get(json_array_get(utf8, i), 1));
        char in[64], want[256];
        size_t nin = strlen(in_hex) / 2, nout = strlen(out_hex) / 2;
        for (size_t b = 0; b < nin; b++)
            sscanf(in_hex + 2 * b, "%2hhx", (unsigned char *)&in[b]);
        for (size_t b = 0; b < nout; b++)
            sscanf(out_hex + 2 * b, "%2hhx", (unsigned char *)&want[b]);
        out_choice c1 = {.text = in, .len = nin};
        out_result r1 = {.custom_id = "u", .model = "m", .n_choices = 1, .choices = &c1};
        rc = output_chat_line(&r1, NULL, &line, &len, err, sizeof err);
        if (rc != 0) {
            bad++;
            continue;
        }
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &jerr);
        json_t *content = json_object_get(json_object_get(choice0(o), "message"), "content");
        if (json_string_length(content) != nout || memcmp(json_string_value(content), want, nout) != 0) {
            if (bad++ < 5)
                fprintf(stderr, "utf8 %zu: input %s: want %s\n", i, in_hex, out_hex);
        }
        json_decref(o);
        free(line);
    }
    CHECK(bad == 0, "%zu of %zu byte strings decode differently from Python's errors=\"replace\"", bad, nu);
    json_decref(ref);
}

/* Allocation failure injection through jansson's allocator hook: every
 * json_t and every dumped line goes through it. */
static long alloc_calls, alloc_fail_at = -1;
static void *counting_malloc(size_t n)
{
    return ++alloc_calls == alloc_fail_at ? NULL : malloc(n);
}

/*
 * For every N, fail the N-th allocation of each builder: the call returns an
 * error with a sentence and no line, and ASan sees no leak at exit; the loop
 * ends when a call completes without reaching N.
 */
static void test_oom(void)
{
    out_alt top[2] = {{"He", 2, -0.01f}, {"\xff", 1, -4.5f}};
    out_token toks[2] = {{"He", 2, -0.01f, 2, top}, {"\xe2\x80", 2, -1.0f, 2, top}};
    out_choice ch = {
        .text = "He\xe2\x80", .len = 4, .finish = OUT_FINISH_LENGTH, .logprobs = true, .n_tokens = 2, .tokens = toks};
    out_stamp st = {"run", "fp", "q4", NULL, 0, 0, NULL};
    out_result r = {.custom_id = "oom", .model = "m", .n_choices = 1, .choices = &ch, .stamp = &st};
    out_http_error he = {.custom_id = "oom", .status_code = 400, .message = "bad", .param = "x", .stamp = &st};
    json_set_alloc_funcs(counting_malloc, free);
    int points = 0, clean = 0;
    for (int which = 0; which < 4; which++) {
        for (long n = 1; n < 100000; n++) {
            char *line = NULL, err[SPILL_ERRLEN] = "";
            size_t len = 0;
            alloc_calls = 0;
            alloc_fail_at = n;
            int rc = which == 0   ? output_chat_line(&r, NULL, &line, &len, err, sizeof err)
                     : which == 1 ? output_completion_line(&r, NULL, &line, &len, err, sizeof err)
                     : which == 2 ? output_http_error_line(&he, NULL, &line, &len, err, sizeof err)
                                  : output_error_line("oom", "c", "m", &st, NULL, &line, &len, err, sizeof err);
            alloc_fail_at = -1;
            if (alloc_calls < n) {
                CHECK(rc == 0 && line, "builder %d failed without an injected failure: %s", which, err);
                free(line);
                break;
            }
            points++;
            if (rc != 0 && line == NULL && strstr(err, "out of memory"))
                clean++;
            else {
                CHECK(0, "builder %d, allocation %ld failed: rc %d, err \"%s\" line %s", which, n, rc, err,
                      line ? line : "");
                free(line);
            }
        }
    }
    json_set_alloc_funcs(malloc, free);
    CHECK(points > 100 && clean == points, "OOM: %d of %d failure points handled cleanly", clean, points);
    fprintf(stderr, "OOM: %d of %d allocation failure points gave a clean error\n", clean, points);
}

int main(void)
{
    const char *sp = getenv("SPILL_OUTPUT_SAMPLES");
    if (sp && *sp)
        samples = fopen(sp, "w");
    test_chat_plain();
    test_chat_logprobs();
    test_completion();
    test_error_lines();
    test_bad_inputs();
    test_random_ids();
    test_reference();
    test_oom();
    if (samples)
        fclose(samples);
    return test_finish("test_output");
}
