/*
 * ref.h — the reference logits tools/gen_ref_models.py records (tests/data/ref/<name>/ref.bin, SPLREF01):
 *     char magic[8] = "SPLREF01"; u32 n_rows; u32 vocab;
 *     per row: u32 n_prompt; u32 n_total; i32 ids[n_total]; f32 logits[n_total][vocab]
 * logits[i] is transformers' fp32 output at position i (the distribution of token i + 1).
 */
#ifndef SPILL_TEST_REF_H
#define SPILL_TEST_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define REF_MAXROWS 4

typedef struct ref_row {
    uint32_t n_prompt, n_total;
    int32_t *ids;
    float *logits; /* (n_total, V) */
} ref_row;

/* 0, or -1 (a message on stderr); rows[0..*n_rows) own their arrays (ref_free). */
static inline int ref_load(const char *path, ref_row *rows, uint32_t *n_rows, uint32_t *vocab)
{
    char *buf, err[SPILL_ERRLEN];
    size_t len, off = 16;
    if (util_read_file(path, 64u << 20, &buf, &len, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    *n_rows = 0;
    uint32_t nr = 0;
    if (len >= 16 && !memcmp(buf, "SPLREF01", 8)) {
        memcpy(&nr, buf + 8, 4);
        memcpy(vocab, buf + 12, 4);
    }
    for (uint32_t r = 0; r < nr && r < REF_MAXROWS && off + 8 <= len; r++) {
        memcpy(&rows[r].n_prompt, buf + off, 4);
        memcpy(&rows[r].n_total, buf + off + 4, 4);
        off += 8;
        size_t ni = rows[r].n_total, nl = ni * *vocab;
        if (off + ni * 4 + nl * 4 > len)
            break;
        rows[r].ids = malloc(ni * 4);
        rows[r].logits = malloc(nl * 4);
        memcpy(rows[r].ids, buf + off, ni * 4);
        memcpy(rows[r].logits, buf + off + ni * 4, nl * 4);
        off += ni * 4 + nl * 4;
        *n_rows = r + 1;
    }
    free(buf);
    if (nr == 0 || nr > REF_MAXROWS || *n_rows != nr || off != len) {
        fprintf(stderr, "%s: not a SPLREF01 file of at most %d rows.\n", path, REF_MAXROWS);
        return -1;
    }
    return 0;
}

static inline void ref_free(ref_row *rows, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++)
        free(rows[r].ids), free(rows[r].logits);
}

/* log-softmax(x)[k] in double. */
static inline double ref_logprob(const float *x, int V, int k)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++)
        s += exp(x[i] - mx);
    return x[k] - mx - log(s);
}

#endif
