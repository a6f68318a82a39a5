/*
 * fuzz_schema.c — libFuzzer target for structured output's schema compiler and automaton (batch/grammar_compile.c and grammar.c,
 * batch/regex.c).  The input is a JSON schema, a NUL byte, then choices: the schema is compiled (plain and
 * wrapped in a prefix and suffix); when it compiles, the choices drive a walk through the automaton, each
 * step picking one of the bytes the state accepts.
 *
 * Beyond the sanitizers (no crash, no leak) it asserts the contracts: a refusal is one line of valid UTF-8
 * that starts with the schema's path; an accepted prefix is never a dead end (some byte is accepted or the
 * text can end); a walk that ends is a text jansson parses.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "batch/grammar.h"

static void sentence_ok(const char *s)
{
    if (strchr(s, '\n') || !util_utf8_valid(s, strlen(s)) || strncmp(s, "fuzz", 4))
        abort();
}

static void walk(const grammar *g, const uint8_t *ch, size_t n)
{
    gstate s, t;
    gstate_init(g, &s);
    char text[1024];
    size_t len = 0, at = 0;
    while (len + 1 < sizeof text && !gstate_done(&s)) {
        uint8_t ok[256];
        int nok = 0;
        for (int b = 0; b < 256; b++) {
            gstate_copy(&t, &s);
            if (gstate_feed(g, &t, (uint8_t)b) == 0)
                ok[nok++] = (uint8_t)b;
        }
        bool end = gstate_can_end(g, &s);
        if (!nok && !end)
            abort(); /* a dead end: this prefix extends to no valid text */
        if (!nok || at >= n || (end && ch[at] == 0xFF))
            break;
        uint8_t b = ok[ch[at++] % (unsigned)nok];
        if (gstate_feed(g, &s, b))
            abort();
        text[len++] = (char)b;
    }
    if (gstate_can_end(g, &s)) {
        json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
        if (!v)
            abort();
        json_decref(v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t sl = nul ? (size_t)(nul - data) : size;
    json_t *schema = json_loadb((const char *)data, sl, 0, NULL);
    if (!schema)
        return 0;
    char err[SPILL_ERRLEN], where[200];
    grammar *g = NULL;
    if (grammar_compile(schema, "fuzz", &g, where, sizeof where, err, sizeof err) == 0) {
        walk(g, nul ? nul + 1 : data + size, nul ? size - sl - 1 : 0);
        grammar_free(g);
    } else
        sentence_ok(err);
    static const char *const marks[] = {"<tool_call>", NULL};
    grammar_wrap w = {"<tool_call>\n", "\n</tool_call>", marks};
    if (grammar_compile_wrapped(schema, &w, "fuzz", &g, NULL, 0, err, sizeof err) == 0)
        grammar_free(g);
    json_decref(schema);
    return 0;
}
