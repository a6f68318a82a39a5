/*
 * fuzz_stop.c — the stop-string matcher against a naive whole-text search.
 *
 * Input: byte 0 picks the number of stop strings (1..4); for each, one byte
 * gives its length (1..8) and that many bytes follow; the rest is the text,
 * where each 0xFF byte is a cut between pieces (and not part of the text).
 * Checked on every input: the concatenated output equals the text before the
 * earliest-ending (then longest) stop match; after each piece without a match
 * exactly the bytes that can no longer start a match have been emitted;
 * push returns 1 in exactly the piece that completes the match.  A violation
 * traps (this is a harness: the library itself never aborts).
 */
#include <stdint.h>
#include <string.h>

#include "batch/stop.h"

#define MAX_TEXT 4096

static long ref_cut(const uint8_t *t, size_t n, const char *const *s, const size_t *l, int ns, int *which)
{
    for (size_t e = 1; e <= n; e++) {
        int best = -1;
        for (int i = 0; i < ns; i++)
            if (l[i] <= e && memcmp(t + e - l[i], s[i], l[i]) == 0 && (best < 0 || l[i] > l[best]))
                best = i;
        if (best >= 0) {
            *which = best;
            return (long)(e - l[best]);
        }
    }
    *which = -1;
    return -1;
}

static size_t ref_hold(const uint8_t *t, size_t p, const char *const *s, const size_t *l, int ns)
{
    size_t h = 0;
    for (int i = 0; i < ns; i++)
        for (size_t k = l[i] - 1; k > h; k--)
            if (k <= p && memcmp(t + p - k, s[i], k) == 0) {
                h = k;
                break;
            }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t text[MAX_TEXT], got[MAX_TEXT];
    static char out[MAX_TEXT + STOP_MAX_BYTES];
    static size_t cut_at[MAX_TEXT];
    char err[256];
    if (size < 3)
        return 0;
    size_t at = 0;
    int ns = 1 + data[at++] % STOP_MAX;
    const char *s[STOP_MAX];
    size_t l[STOP_MAX];
    for (int i = 0; i < ns; i++) {
        if (at >= size)
            return 0;
        l[i] = 1 + data[at++] % 8;
        if (size - at < l[i])
            return 0;
        s[i] = (const char *)data + at;
        at += l[i];
    }
    size_t n = 0, nc = 0;
    for (; at < size && n < MAX_TEXT; at++) {
        if (data[at] == 0xFF)
            cut_at[nc++] = n;
        else
            text[n++] = data[at];
    }
    cut_at[nc++] = n;

    int which;
    long cut = ref_cut(text, n, s, l, ns, &which);
    size_t want = cut >= 0 ? (size_t)cut : n, ngot = 0, pos = 0, len;
    int matched_piece = -1;
    stop_matcher m;
    if (stop_init(&m, s, l, ns, err, sizeof err) < 0)
        __builtin_trap();
    for (size_t k = 0; k < nc; k++) {
        size_t end = cut_at[k];
        int rc = stop_push(&m, (const char *)text + pos, end - pos, out, sizeof out, &len, err, sizeof err);
        if (rc < 0)
            __builtin_trap();
        memcpy(got + ngot, out, len);
        ngot += len;
        if (rc == 1 && matched_piece < 0) {
            matched_piece = (int)k;
            if (cut < 0 || (size_t)cut + l[which] <= pos || (size_t)cut + l[which] > end)
                __builtin_trap();
        }
        if (rc == 0 && ngot != end - ref_hold(text, end, s, l, ns))
            __builtin_trap();
        pos = end;
    }
    if (stop_finish(&m, out, sizeof out, &len, err, sizeof err) < 0)
        __builtin_trap();
    memcpy(got + ngot, out, len);
    ngot += len;
    if (ngot != want || memcmp(got, text, want) != 0)
        __builtin_trap();
    if ((cut >= 0) != (matched_piece >= 0) || m.matched != which)
        __builtin_trap();
    stop_free(&m);
    return 0;
}
