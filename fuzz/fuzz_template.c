/*
 * fuzz_template.c — libFuzzer target for the chat-template interpreter: the input bytes are a
 * template source, compiled and (when it compiles) rendered against a fixed small chat context
 * with tight limits, so every input finishes fast.  Any crash, leak, sanitizer report or hang
 * is a bug; errors are the expected outcome for most inputs.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "text/template.h"

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\\u65e5 <tool_response>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nx\\n</think>\\n\\nok\", \"reasoning_content\": \"r\","
    "  \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    "  \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
    " {\"role\": \"tool\", \"content\": {\"k\": \"v\"}},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}, {\"type\": \"image\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false, \"n\": 7, \"x\": -1.5, \"nothing\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *ctx;
    if (!ctx)
        ctx = json_loads(CONTEXT, 0, NULL);
    if (!ctx)
        abort();
    tmpl_limits lim;
    template_limits_default(&lim);
    lim.max_steps = 200000;
    lim.max_output = 1 << 16;
    lim.max_memory = 16 << 20;
    lim.max_range = 1000;
    lim.now = 1721980800;
    char err[512], *out = NULL;
    size_t outlen = 0;
    tmpl_t *t = NULL;
    if (template_compile((const char *)data, size, "fuzz", &t, err, sizeof err) == 0) {
        if (template_render(t, ctx, &lim, &out, &outlen, err, sizeof err) == 0 && outlen > lim.max_output)
            abort();
        free(out);
        template_free(t);
    }
    return 0;
}
