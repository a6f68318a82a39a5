/*
 * gguf.h — GGUF v3 reader (see gguf.c for the byte layout and every check).
 *
 * The file is mapped read-only for parsing; every count, length, dim, type,
 * alignment and offset is validated against the remaining bytes with
 * overflow-checked arithmetic before anything is allocated.  After a
 * successful open, every accessor below is bounds-safe.
 */
#ifndef SPILL_GGUF_H
#define SPILL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_V_U8 = 0, GGUF_V_I8 = 1, GGUF_V_U16 = 2, GGUF_V_I16 = 3, GGUF_V_U32 = 4, GGUF_V_I32 = 5,
    GGUF_V_F32 = 6, GGUF_V_BOOL = 7, GGUF_V_STRING = 8, GGUF_V_ARRAY = 9, GGUF_V_U64 = 10,
    GGUF_V_I64 = 11, GGUF_V_F64 = 12,
};

/* ggml tensor types (ggml.h ids). */
enum ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7,
    GGML_Q8_0 = 8, GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13,
    GGML_Q6_K = 14, GGML_Q8_K = 15, GGML_I8 = 24, GGML_I16 = 25, GGML_I32 = 26, GGML_I64 = 27,
    GGML_F64 = 28, GGML_BF16 = 30, GGML_TYPE_COUNT = 43,
    /* spill's own tensor type (not ggml's; ggml's ids stay below GGML_TYPE_COUNT): fp8 weights, one row of K
     * elements = fp32 scale, 12 zero bytes, K OCP E4M3FN codes (K % 16 == 0; 16 + K bytes; value = scale *
     * e4m3(code)).  The scale leads so a row decodes without knowing K and the codes of every row start 16-byte
     * aligned (cuBLASLt reads the N rows in place as an FP8 matrix with leading dimension 16 + K).  Only
     * `spill pack --quant fp8` and `spill synth --quant fp8` write it; other GGUF readers refuse the file with
     * their unknown-type message instead of misreading it. */
    GGML_F8_E4M3_ROW = 200,
};

typedef struct gguf_kv {
    const char *key;      /* NUL-terminated copy owned by the file */
    uint32_t type;        /* enum gguf_vtype */
    uint32_t arr_type;    /* element type when type == GGUF_V_ARRAY */
    uint64_t arr_n;       /* element count when type == GGUF_V_ARRAY */
    union {
        uint64_t u;       /* unsigned ints and bool */
        int64_t i;        /* signed ints */
        double f;         /* F32/F64 */
        struct { const char *p; uint64_t len; } s; /* STRING: points into the mapping, not NUL-terminated */
    } v;
    const uint8_t *arr_data;   /* first element's bytes (numeric arrays) */
    const uint64_t *str_off;   /* STRING arrays: offset of each element's length prefix in the mapping */
} gguf_kv;

typedef struct gguf_tensor {
    char name[64];        /* ≤ 63 bytes + NUL */
    uint32_t n_dims;      /* 1..4 */
    uint64_t ne[4];       /* ne[0] fastest-varying; unused dims are 1 */
    uint32_t type;        /* enum ggml_type */
    uint64_t offset;      /* absolute file offset of the data */
    uint64_t size;        /* bytes */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    const uint8_t *map;   /* whole file, read-only (NULL for gguf_parse on a caller buffer) */
    const uint8_t *data;  /* == map or the caller's buffer */
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset; /* absolute offset of the tensor data section */
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    void *priv;           /* parser-owned allocations */
} gguf_file;

/* Maps and parses a GGUF file.  On failure *out is NULL and err holds one sentence
 * naming the path, the byte offset, the field and the reason. */
int gguf_open(const char *path, gguf_file **out, char *err, size_t errlen);

/* Parses an in-memory GGUF image (used by gguf_open and the fuzzer); the buffer
 * must outlive the result.  `name` is used in error messages. */
int gguf_parse(const uint8_t *data, uint64_t size, const char *name, gguf_file **out, char *err, size_t errlen);

/* Safe on NULL and on half-built objects. */
void gguf_close(gguf_file *f);

/* Key lookup: NULL when absent. */
const gguf_kv *gguf_get(const gguf_file *f, const char *key);

/* Typed scalar getters: false when absent or of an incompatible type.
 * u64/i64 accept every integer type (u64 rejects negatives); f64 accepts F32/F64. */
bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_f64(const gguf_file *f, const char *key, double *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
/* STRING value (not NUL-terminated; *len bytes). */
bool gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len);

/* Array element access; kv must be an ARRAY of the matching element type and i < arr_n. */
const char *gguf_arr_str(const gguf_file *f, const gguf_kv *kv, uint64_t i, size_t *len);
double gguf_arr_num(const gguf_kv *kv, uint64_t i); /* any numeric element type, as double */

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
const uint8_t *gguf_tensor_data(const gguf_file *f, const gguf_tensor *t);

/* Type table: name ("Q4_K"), block size in elements and bytes per block.  false for unknown/removed types.
 * A row of ne[0] elements takes ne[0] / block_elems * block_bytes + ggml_type_row_extra(type) bytes. */
bool ggml_type_info(uint32_t type, const char **name, uint32_t *block_elems, uint32_t *block_bytes);
/* Bytes a row carries besides its blocks: 16 for GGML_F8_E4M3_ROW (its scale header), 0 for ggml's types. */
uint32_t ggml_type_row_extra(uint32_t type);

#endif
