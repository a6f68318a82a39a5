/*
 * fuzz_jsonl.c — libFuzzer target for input files: the bytes go (1) to
 * request_parse_line as one line and (2) through check_stream as a whole file
 * (fmemopen, --all mode, small caps so over-long lines, the row cap and the
 * byte cap are all reachable at fuzzing sizes).
 *
 * Beyond the sanitizers it asserts the error contract: every sentence is one
 * line of valid UTF-8 and every failure carries an OpenAI code; a parsed row
 * holds values inside OpenAI's ranges.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/check.h"
#include "batch/request.h"
#include "base/util.h"

static void sentence_ok(const char *s)
{
    if (strchr(s, '\n') || !util_utf8_valid(s, strlen(s)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    request q;
    char err[SPILL_ERRLEN];
    if (request_parse_line((const char *)data, size, 1, "fuzz.jsonl", &q, err, sizeof err) == 0) {
        if (!q.custom_id || q.kind == REQ_KIND_UNKNOWN || q.endpoint == REQ_EP_UNKNOWN || q.s.n < 1 || q.s.n > 128 ||
            q.s.n_stop > REQ_MAX_STOP || q.s.temperature < 0 || q.s.temperature > 2 || q.s.top_p < 0 || q.s.top_p > 1 ||
            q.s.top_logprobs < 0 || q.s.top_logprobs > 20 ||
            (q.endpoint == REQ_EP_CHAT ? !q.messages : !q.prompt || !q.n_prompts))
            abort();
        for (size_t i = 0; i < q.s.n_logit_bias; i++)
            if (q.s.logit_bias_id[i] < 0 || q.s.logit_bias[i] < -100 || q.s.logit_bias[i] > 100)
                abort();
    } else {
        if (!q.err_code)
            abort();
        sentence_ok(err);
    }
    request_free(&q);

    if (size == 0)
        return 0; /* fmemopen refuses an empty buffer on older glibc */
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f)
        return 0;
    check_opts o = {.all = true, .max_rows = 64, .max_bytes = 1 << 20, .max_line = 8192};
    check_report r;
    int rc = check_stream(f, "fuzz.jsonl", &o, &r, NULL, err, sizeof err);
    fclose(f);
    if (rc == CHECK_INVALID) {
        if (!r.first_error_code)
            abort();
        sentence_ok(r.first_error);
    } else if (rc == CHECK_OK && (r.ok_rows == 0 || r.ok_rows != r.rows)) {
        abort();
    }
    return 0;
}
