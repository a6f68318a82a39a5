/*
 * fuzz_serve.c — the gateway's gates on client strings: serve_id_valid (the only step between a URL segment and
 * a path in the store) must accept exactly prefix + 24 of [A-Za-z0-9] — checked here against the rule itself —
 * and serve_parse_size / serve_key_equal must take any bytes.  The multipart parsing is libmicrohttpd's post
 * processor (not fuzzed here: it needs a live connection).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

static int rule(const char *s, const char *p)
{
    size_t n = strlen(p);
    if (strlen(s) != n + 24 || strncmp(s, p, n))
        return 0;
    for (size_t i = n; i < n + 24; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    if (serve_id_valid(s, "file-") != rule(s, "file-") || serve_id_valid(s, "batch_") != rule(s, "batch_"))
        abort();
    unsigned long long v;
    (void)serve_parse_size(s, &v);
    size_t half = strlen(s) / 2;
    char *b = strdup(s + half);
    s[half] = '\0';
    if (b && serve_key_equal(s, b) != !strcmp(s, b))
        abort();
    free(b);
    free(s);
    return 0;
}
