/*
 * safetensors.h — safetensors reader: single files and sharded models through
 * model.safetensors.index.json (see safetensors.c for the layout and checks).
 *
 * Only the header is read (pread, no mmap); tensor data is addressed by
 * absolute file offsets for the loaders and the streamer.
 */
#ifndef SPILL_SAFETENSORS_H
#define SPILL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum st_dtype {
    ST_BOOL, ST_F4, ST_F6_E2M3, ST_F6_E3M2, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0,
    ST_F8_E4M3FNUZ, ST_F8_E5M2FNUZ, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_C64, ST_F64, ST_I64, ST_U64, ST_DTYPE_COUNT,
};

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    char *name;
    uint32_t dtype;            /* enum st_dtype */
    uint32_t n_dims;           /* 0 = scalar */
    uint64_t shape[ST_MAX_DIMS];
    uint64_t offset;           /* absolute file offset (8 + N + BEGIN) */
    uint64_t size;             /* END - BEGIN bytes */
    uint32_t shard;            /* index into st_model.shards (0 for a single file) */
} st_tensor;

typedef struct st_file {
    char *path;
    uint64_t file_size;
    uint64_t header_len;       /* N */
    size_t n_tensors;
    st_tensor *tensors;        /* sorted by offset */
    size_t n_meta;
    char **meta_keys, **meta_vals; /* __metadata__ string pairs */
} st_file;

/* Reads and validates one file's header (every rule of formats.md §3). */
int st_open(const char *path, st_file **out, char *err, size_t errlen);
/* Validates a header given as bytes: `json` (N bytes) for a file of `file_size` bytes (fuzz entry). */
int st_parse_header(const char *json, uint64_t n, uint64_t file_size, const char *name, st_file **out, char *err,
                    size_t errlen);
/* Validates a whole file image held in memory (prefix, header, layout); `name` is used in
 * errors.  Offsets in the result are relative to `data`, as for a file (fuzz entry). */
int st_parse_file_image(const uint8_t *data, size_t size, const char *name, st_file **out, char *err, size_t errlen);
void st_close(st_file *f);

/* A model: one file, or the shards named by an index; tensor names unique across shards. */
typedef struct st_model {
    size_t n_shards;
    st_file **shards;
    size_t n_tensors;
    st_tensor **by_name;       /* all tensors, sorted by name */
} st_model;

/* dir holds model.safetensors or model.safetensors.index.json (+ shards); dir may also be the
 * path of a single .safetensors file.  Shard names in the index must be plain file names. */
int st_model_open(const char *dir, st_model **out, char *err, size_t errlen);
void st_model_close(st_model *m);
const st_tensor *st_model_find(const st_model *m, const char *name);

/*
 * FP8 checkpoints (compressed-tensors / fbgemm / DeepSeek-V3 style): an F8_E4M3 weight NAME [N, K] carries its
 * dequantization scale in a sibling tensor, value = e4m3 * scale:
 *   NAME_scale      F32/BF16/F16, 1 value ([], [1], [1, 1]: per tensor) or N values ([N], [N, 1]: per row)
 *   NAME_scale_inv  F32/BF16, [ceil(N/128), ceil(K/128)]: one per 128x128 block (the name notwithstanding, the
 *                   multiplier, as DeepSeek-V3's weight_dequant applies it)
 * Finds and checks w's scale: 0 with *scale and *kind set, or -1 with one sentence (no scale, both kinds, a
 * shape or dtype that fits neither).  `where` names the model in the sentence.
 */
enum st_scale_kind { ST_SCALE_TENSOR = 1, ST_SCALE_ROW, ST_SCALE_BLOCK128 };
int st_model_fp8_scale(const st_model *m, const st_tensor *w, const char *where, const st_tensor **scale,
                       enum st_scale_kind *kind, char *err, size_t errlen);

const char *st_dtype_name(uint32_t dtype);
uint32_t st_dtype_bits(uint32_t dtype);

#endif
