/*
 * gguf_write.h — GGUF v3 writer: header (key/values + tensor infos) built in
 * memory, tensor data streamed to the file by the caller.
 *
 * Layout written (all little-endian, formats.md §4):
 *   u32 "GGUF" · u32 3 · u64 n_tensors · u64 n_kv · kv[] · tensor_info[] ·
 *   zeros to `alignment` · tensor data, each tensor starting at a multiple of
 *   `alignment` and followed by zeros to the next multiple (also the last one,
 *   as ggml writes it, so the file ends aligned).
 *
 * The header's size does not depend on the tensors' types or offsets (both are
 * fixed-width fields), so a writer can reserve the header region, stream the
 * data behind it while it decides each tensor's type, and write the header
 * last (gguf_out does exactly that, through a temporary file renamed into
 * place).  general.alignment is written by gguf_w_new itself.
 */
#ifndef SPILL_GGUF_WRITE_H
#define SPILL_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct gguf_w gguf_w;

/* A new header with general.alignment = alignment (a power of two ≥ 32). */
int gguf_w_new(uint32_t alignment, gguf_w **out, char *err, size_t errlen);
void gguf_w_free(gguf_w *w);

/* Key/values, in the order added.  Every setter fails (-1, sentence in err) on a
 * duplicate key, a key longer than 65535 bytes, or out of memory. */
int gguf_w_u32(gguf_w *w, const char *key, uint32_t v, char *err, size_t errlen);
int gguf_w_i32(gguf_w *w, const char *key, int32_t v, char *err, size_t errlen);
int gguf_w_u64(gguf_w *w, const char *key, uint64_t v, char *err, size_t errlen);
int gguf_w_f32(gguf_w *w, const char *key, float v, char *err, size_t errlen);
int gguf_w_bool(gguf_w *w, const char *key, bool v, char *err, size_t errlen);
int gguf_w_str(gguf_w *w, const char *key, const char *s, size_t len, char *err, size_t errlen);
/* Array of n strings: element i is strs[i] of lens[i] bytes (lens NULL: NUL-terminated). */
int gguf_w_arr_str(gguf_w *w, const char *key, const char *const *strs, const size_t *lens, uint64_t n, char *err,
                   size_t errlen);
/* Array of n numeric elements of GGUF value type `elem` (U8..F64 except STRING/ARRAY), raw little-endian bytes. */
int gguf_w_arr_num(gguf_w *w, const char *key, uint32_t elem, const void *data, uint64_t n, char *err, size_t errlen);
/* Copies one key/value of an open GGUF file, type preserved (string arrays element by element). */
int gguf_w_copy_kv(gguf_w *w, const gguf_file *src, const gguf_kv *kv, char *err, size_t errlen);
bool gguf_w_has(const gguf_w *w, const char *key);
/* Rewrites the value of an existing U32 key (the header size is unchanged); -1 when absent or not U32. */
int gguf_w_patch_u32(gguf_w *w, const char *key, uint32_t v);

/* Declares the next tensor (file order = order of calls): name ≤ 63 bytes,
 * 1..4 dims with ne[0] fastest, a type known to ggml_type_info with ne[0] a
 * whole number of blocks.  Returns the tensor's index ≥ 0, or -1. */
int gguf_w_tensor(gguf_w *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, char *err,
                  size_t errlen);
/* Changes a declared tensor's type (same shape rules); offsets of the tensors
 * after it move, the header size does not. */
int gguf_w_set_type(gguf_w *w, int i, uint32_t type, char *err, size_t errlen);

uint64_t gguf_w_n_tensors(const gguf_w *w);
/* Bytes of tensor i's data (unpadded). */
uint64_t gguf_w_tensor_bytes(const gguf_w *w, int i);
/* Absolute file offset of the data section (header size rounded up to the alignment). */
uint64_t gguf_w_data_start(const gguf_w *w);
/* Absolute file offset of tensor i's data (depends on the types of tensors 0..i-1). */
uint64_t gguf_w_tensor_offset(const gguf_w *w, int i);
/* Total file size: data start + every tensor padded to the alignment. */
uint64_t gguf_w_file_size(const gguf_w *w);

/* Serializes the header plus the zero padding up to the data start into a
 * fresh buffer of gguf_w_data_start() bytes, 4096-aligned for O_DIRECT
 * (caller frees). */
int gguf_w_header(const gguf_w *w, uint8_t **buf, size_t *len, char *err, size_t errlen);

/* ------------------------------------------------------------ output file */

/*
 * A GGUF being written: data goes to `<path>.tmp` sequentially from the data
 * start through two large aligned buffers (O_DIRECT when the file system
 * allows it, so writing a 140 GB model does not evict the page cache;
 * buffered otherwise): a background thread writes a full buffer while the
 * caller fills the other, so producing bytes overlaps the disk.  The header
 * is written last, then fsync, rename over `path`, fsync of the directory.
 * Until gguf_out_finish succeeds `path` is untouched.
 */
typedef struct gguf_out {
    int fd;
    char *path, *tmp;
    uint8_t *buf; /* (cap) 4096-aligned */
    size_t cap, fill;
    uint64_t pos;           /* absolute offset of buf[0] */
    bool direct;            /* O_DIRECT in use */
    uint64_t written;       /* bytes handed to the file so far (data + header) */
    struct gguf_out_bg *bg; /* background writer: writes one buffer while the caller fills the other */
} gguf_out;

/* Creates the temporary file; the caller then writes tensor data starting at data_start. */
int gguf_out_open(gguf_out *o, const char *path, uint64_t data_start, size_t buf_bytes, char *err, size_t errlen);
/* Appends n bytes at the current position. */
int gguf_out_write(gguf_out *o, const void *p, size_t n, char *err, size_t errlen);
/* A pointer to at least n (≤ buffer capacity) writable bytes at the current position, flushing first if
 * needed; commit them with gguf_out_commit.  Lets producers fill the write buffer in place. */
int gguf_out_reserve(gguf_out *o, size_t n, uint8_t **p, char *err, size_t errlen);
void gguf_out_commit(gguf_out *o, size_t n);
/* Leaves n bytes unwritten at the current position: a hole that reads as zeros and takes no disk space
 * where the file system supports sparse files. */
int gguf_out_skip(gguf_out *o, uint64_t n, char *err, size_t errlen);
/* Current absolute position. */
uint64_t gguf_out_pos(const gguf_out *o);
/* Zero bytes up to the next multiple of `alignment`. */
int gguf_out_pad(gguf_out *o, uint64_t alignment, char *err, size_t errlen);
/* Flushes, writes the header at offset 0, fsyncs, renames into place and fsyncs the directory.
 * Closes the file either way; on failure the temporary file is removed. */
int gguf_out_finish(gguf_out *o, const gguf_w *w, char *err, size_t errlen);
/* Abandons the file (removes the temporary); safe on a zeroed, failed-to-open or finished gguf_out. */
void gguf_out_abort(gguf_out *o);

#endif
