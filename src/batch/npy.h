/*
 * npy.h — one row's logits as a float16 NumPy file (`spill distill --full-logits`): DIR/logits/<name>.npy,
 * shape (tokens, vocab), C order, written row by row while the answer runs and made durable before the row
 * counts as done.
 *
 * The file is written as NAME.npy.part at fixed offsets (header, then row i at header + i·V·2), so a row
 * that is preempted and recomputed, or a job resumed after a crash, overwrites the same bytes; npy_finish
 * writes the header with the final shape, truncates, fsyncs, renames to NAME.npy and fsyncs the directory.
 * The header is NumPy format 1.0, padded to 128 bytes (numpy.load reads it; `np.load(f).shape == (n, V)`).
 */
#ifndef SPILL_NPY_H
#define SPILL_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_HEADER_BYTES 128

typedef struct npy_rows {
    int fd;            /* -1 when closed */
    int32_t vocab;
    int32_t n_rows;    /* rows written so far (the highest index + 1) */
    uint16_t *buf;     /* (vocab) one row in float16 */
    char path[4096];   /* the final NAME.npy */
} npy_rows;

/* A file name for custom_id: [A-Za-z0-9._-] kept, anything else '_', no leading '.'; when anything changed or
 * the id is longer than 120 bytes, "-" and 16 hex digits of its SHA-256 follow, so two ids never share a name. */
void npy_safe_name(const char *custom_id, char *out, size_t cap);

/* Opens dir/NAME.npy.part for writing (dir created if missing).  0, or -1 with a sentence. */
int npy_open(npy_rows *f, const char *dir, const char *name, int32_t vocab, char *err, size_t errlen);

/* Writes logits (vocab floats) as float16 (round to nearest even; NaN stays NaN, overflow becomes inf) as row
 * index.  0, or -1 with a sentence. */
int npy_write_row(npy_rows *f, int32_t index, const float *logits, char *err, size_t errlen);

/* Header for n_rows rows, truncate, fsync, rename to NAME.npy, fsync the directory, close.  0, or -1. */
int npy_finish(npy_rows *f, int32_t n_rows, char *err, size_t errlen);

/* Closes without finishing (the .part stays, to be overwritten); safe on a closed one. */
void npy_abort(npy_rows *f);

/* Bytes a file of n_rows rows takes. */
uint64_t npy_bytes(int64_t n_rows, int32_t vocab);

/* float32 -> IEEE binary16 bits, round to nearest even. */
uint16_t npy_f16(float x);

#endif
