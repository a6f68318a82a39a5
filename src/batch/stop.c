/*
 * stop.c — stop strings matched across detokenizer pieces.
 *
 * Owns: finding a row's stop strings in its generated text as the text
 * arrives, and deciding which bytes can be shown before the row ends.  Does
 * not own: detokenization (including holding back incomplete UTF-8, which the
 * detokenizer does), end-of-sequence token ids, max_tokens.
 *
 * Key decision: one Knuth-Morris-Pratt automaton per stop string, fed byte by
 * byte.  Its state q[i] is exactly the length of the longest suffix of the
 * text that is a prefix of stop i, so the bytes to hold back are the last
 * max_i q[i] (at most STOP_MAX_BYTES - 1) and everything before them can
 * never become part of a match.  This makes the result independent of how
 * the text is cut into pieces, and each byte costs amortised O(1) per stop
 * string.  The alternative — re-searching a window of the last
 * max_len + piece bytes after every piece (vLLM) — is simpler but picks
 * among stops by list order, not by position, and rescans held bytes.
 *
 * Which stop wins: the text ends at the earliest byte that completes any stop
 * string (what a model emitting one byte per token would do); among stops
 * completing at that byte the longest wins, so the text is cut at the
 * earliest start.
 */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

int stop_init(stop_matcher *m, const char *const *stops, const size_t *lens, int n, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->matched = -1;
    if (n < 0 || n > STOP_MAX)
        return util_errf(err, errlen, "stop: %d stop strings given; OpenAI allows at most %d, remove the rest", n,
                         STOP_MAX);
    size_t bytes = 0, max_len = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] == 0 || lens[i] > STOP_MAX_BYTES)
            return util_errf(err, errlen, "stop: stop string %d is %zu bytes; each must be 1 to %d bytes", i, lens[i],
                             STOP_MAX_BYTES);
        /* bounded by STOP_MAX × STOP_MAX_BYTES × 5: no overflow possible */
        bytes += lens[i] * sizeof(uint32_t) + lens[i];
        if (lens[i] > max_len)
            max_len = lens[i];
    }
    if (n == 0)
        return 0;
    m->max_held = max_len - 1;
    m->mem = malloc(bytes + m->max_held + 1);
    if (!m->mem)
        return util_errf(err, errlen, "stop: out of memory for %zu bytes of stop strings", bytes);
    /* layout: every fail table first (malloc alignment suits uint32), then the strings, then held */
    char *p = m->mem;
    for (int i = 0; i < n; i++) {
        m->fail[i] = (uint32_t *)(void *)p;
        p += lens[i] * sizeof(uint32_t);
    }
    for (int i = 0; i < n; i++) {
        memcpy(p, stops[i], lens[i]);
        m->str[i] = p;
        p += lens[i];
    }
    m->held = p;
    for (int i = 0; i < n; i++) {
        m->len[i] = lens[i];
        const char *s = m->str[i];
        uint32_t *f = m->fail[i];
        f[0] = 0;
        for (size_t j = 1, k = 0; j < lens[i]; j++) {
            while (k > 0 && s[j] != s[k])
                k = f[k - 1];
            if (s[j] == s[k])
                k++;
            f[j] = (uint32_t)k;
        }
    }
    m->n = n;
    return 0;
}

void stop_free(stop_matcher *m)
{
    free(m->mem);
    memset(m, 0, sizeof *m);
    m->matched = -1;
}

size_t stop_out_cap(const stop_matcher *m, size_t n)
{
    size_t cap;
    return ck_add_size(m->n_held, n, &cap) ? cap : SIZE_MAX;
}

int stop_push(stop_matcher *m, const char *in, size_t n, char *out, size_t out_cap, size_t *out_len, char *err,
              size_t errlen)
{
    *out_len = 0;
    if (m->done)
        return m->matched >= 0;
    if (out_cap < stop_out_cap(m, n))
        return util_errf(err, errlen,
                         "stop: output buffer of %zu bytes is smaller than the %zu held plus %zu new bytes; "
                         "size it with stop_out_cap",
                         out_cap, m->n_held, n);
    if (m->n == 0) {
        if (n)
            memcpy(out, in, n);
        *out_len = n;
        return 0;
    }
    memcpy(out, m->held, m->n_held);
    size_t len = m->n_held;
    for (size_t b = 0; b < n; b++) {
        char c = in[b];
        out[len++] = c;
        int hit = -1;
        for (int i = 0; i < m->n; i++) {
            const char *s = m->str[i];
            size_t q = m->q[i];
            while (q > 0 && s[q] != c)
                q = m->fail[i][q - 1];
            if (s[q] == c)
                q++;
            m->q[i] = q;
            if (q == m->len[i] && (hit < 0 || m->len[i] > m->len[hit]))
                hit = i;
        }
        if (hit >= 0) {
            *out_len = len - m->len[hit];
            m->matched = hit;
            m->done = true;
            m->n_held = 0;
            return 1;
        }
    }
    size_t h = 0;
    for (int i = 0; i < m->n; i++)
        if (m->q[i] > h)
            h = m->q[i];
    memcpy(m->held, out + len - h, h);
    m->n_held = h;
    *out_len = len - h;
    return 0;
}

int stop_finish(stop_matcher *m, char *out, size_t out_cap, size_t *out_len, char *err, size_t errlen)
{
    *out_len = 0;
    if (m->done)
        return 0;
    if (out_cap < m->n_held)
        return util_errf(err, errlen,
                         "stop: output buffer of %zu bytes cannot take the %zu held bytes; size it with stop_out_cap",
                         out_cap, m->n_held);
    if (m->n_held)
        memcpy(out, m->held, m->n_held);
    *out_len = m->n_held;
    m->n_held = 0;
    m->done = true;
    return 0;
}
