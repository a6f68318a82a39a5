/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * First byte modulo 3 picks the mode:
 *   0: the rest is a tokenizer.json (≤ 64 KiB, see .options); if it loads,
 *      encode the input itself and a few fixed strings, decode, stream.
 *   2: the rest is a GGUF image (gguf_parse); if its tokenizer loads, the same.
 *   1: the rest is text for the SmolLM2 fixture tokenizer
 *         (tests/data/tok/smollm2.tokenizer.json, loaded once from the repo
 *         root, where fuzz/run.sh runs); encode with and without special
 *         tokens, decode, and check the oracle that the incremental decoder's
 *         output equals decode() (traps otherwise).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "text/tokenizer.h"
#include "base/util.h"

static tokenizer *smol;

static void exercise(const tokenizer *t, const char *text, size_t len, bool oracle)
{
    char err[SPILL_ERRLEN];
    int32_t *ids = NULL;
    size_t n = 0;
    for (int sp = 0; sp < 2; sp++) {
        if (tokenizer_encode(t, text, len, sp, &ids, &n, err, sizeof err) != 0)
            return;
        char *out = NULL;
        size_t olen = 0;
        if (tokenizer_decode(t, ids, n, sp, &out, &olen, err, sizeof err) != 0) {
            free(ids);
            return;
        }
        tok_stream *s = NULL;
        char *acc = malloc(olen + 1);
        size_t an = 0;
        bool ok = acc && tok_stream_init(t, sp, &s, err, sizeof err) == 0;
        for (size_t k = 0; ok && k <= n; k++) {
            char *chunk = NULL;
            size_t cl = 0;
            ok = (k < n ? tok_stream_push(s, ids[k], &chunk, &cl, err, sizeof err)
                        : tok_stream_flush(s, &chunk, &cl, err, sizeof err)) == 0;
            if (ok && oracle && (an + cl > olen || memcmp(out + an, chunk, cl) != 0))
                __builtin_trap(); /* stream diverged from decode() */
            if (ok && an + cl <= olen)
                memcpy(acc + an, chunk, cl);
            an += cl;
            free(chunk);
        }
        if (ok && oracle && an != olen)
            __builtin_trap();
        for (size_t k = 0; k < n; k++) {
            size_t bl;
            (void)tokenizer_token_bytes(t, ids[k], &bl);
            (void)tokenizer_piece(t, ids[k], &bl);
        }
        tok_stream_free(s);
        free(acc);
        free(out);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    char err[SPILL_ERRLEN];
    if (data[0] % 3 == 1) {
        if (!smol && tokenizer_from_json_file("tests/data/tok/smollm2.tokenizer.json", &smol, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_tokenizer: %s (run from the repo root)\n", err);
            abort();
        }
        exercise(smol, rest, len, true);
        return 0;
    }
    tokenizer *t = NULL;
    if (data[0] % 3 == 2) {
        gguf_file *g = NULL;
        if (gguf_parse(data + 1, len, "fuzz.gguf", &g, err, sizeof err) != 0)
            return 0;
        int rc = tokenizer_from_gguf(g, &t, err, sizeof err);
        gguf_close(g);
        if (rc != 0)
            return 0;
    } else if (tokenizer_from_json(rest, len, "fuzz.json", &t, err, sizeof err) != 0)
        return 0;
    static const char *probe[] = {"Hello world", "  a\tb\r\n  12345 'll", "\xE4\xB8\x80\xF0\x9F\x98\x80", ""};
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++)
        exercise(t, probe[i], strlen(probe[i]), false);
    exercise(t, rest, len < 512 ? len : 512, false);
    (void)tokenizer_token_id(t, "<s>", 3);
    tokenizer_free(t);
    return 0;
}
