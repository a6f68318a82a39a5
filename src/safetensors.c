/*
 * safetensors.c — safetensors header reader, single files and sharded models.
 *
 * Owns: reading and validating the header of each file (pread only; the data
 * buffer is never touched), and joining shards through
 * model.safetensors.index.json.  Does not: read or convert tensor data (the
 * loaders and the streamer do, by absolute offset), or map HF names.
 *
 * Byte layout:
 *   0       u64 LE N (header length, <= 100,000,000)
 *   8       N bytes of UTF-8 JSON, padded with spaces:
 *             {"__metadata__": {"k": "v", ...},
 *              "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [BEGIN, END]}, ...}
 *   8+N     data buffer; tensor bytes at 8+N+BEGIN .. 8+N+END (END one past)
 *
 * Checks (the reference reader's, plus stricter ones marked *):
 *   file >= 8 bytes; N <= 100,000,000; 8+N <= file size; header starts with
 *   '{'*; valid UTF-8; valid JSON with no duplicate keys; at most 1,000,000
 *   tensors*; __metadata__ maps strings to strings; each tensor is an object
 *   with exactly* dtype (known), shape (<= 8 non-negative integers) and
 *   data_offsets [BEGIN, END] with END >= BEGIN; Πshape × bits is
 *   overflow-checked and a whole number of bytes and equals END-BEGIN; sorted
 *   by offset the tensors tile [0, last END) with no gap or overlap; and
 *   8 + N + last END == file size (no trailing bytes, so no polyglot tail).
 *
 * Key decision: jansson parses the header (JSON_REJECT_DUPLICATES).  It does
 * not report positions per value, so a tensor's error names the byte offset of
 * its key, found by searching the header for the quoted name (the header
 * start when the name is written with escapes).
 */
#include "safetensors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER 100000000ull
#define MAX_TENSORS 1000000u
#define MAX_INDEX_BYTES (64u << 20)

static const struct {
    const char *name;
    uint32_t bits;
} DTYPES[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 8},
    [ST_F4] = {"F4", 4},
    [ST_F6_E2M3] = {"F6_E2M3", 6},
    [ST_F6_E3M2] = {"F6_E3M2", 6},
    [ST_U8] = {"U8", 8},
    [ST_I8] = {"I8", 8},
    [ST_F8_E5M2] = {"F8_E5M2", 8},
    [ST_F8_E4M3] = {"F8_E4M3", 8},
    [ST_F8_E8M0] = {"F8_E8M0", 8},
    [ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [ST_I16] = {"I16", 16},
    [ST_U16] = {"U16", 16},
    [ST_F16] = {"F16", 16},
    [ST_BF16] = {"BF16", 16},
    [ST_I32] = {"I32", 32},
    [ST_U32] = {"U32", 32},
    [ST_F32] = {"F32", 32},
    [ST_C64] = {"C64", 64},
    [ST_F64] = {"F64", 64},
    [ST_I64] = {"I64", 64},
    [ST_U64] = {"U64", 64},
};

const char *st_dtype_name(uint32_t dtype)
{
    return dtype < ST_DTYPE_COUNT ? DTYPES[dtype].name : "?";
}
uint32_t st_dtype_bits(uint32_t dtype)
{
    return dtype < ST_DTYPE_COUNT ? DTYPES[dtype].bits : 0;
}

/* Writes "<name>: byte <off>: <msg>" into err and returns -1. */
__attribute__((format(printf, 5, 6))) static int fail(char *err, size_t errlen, const char *name, uint64_t off,
                                                      const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "%s: byte %llu: ", name, (unsigned long long)off);
        if (n >= 0 && (size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

/* Printable rendering of an untrusted (UTF-8) string for messages: control
 * bytes, quotes and backslashes as \xNN, at most 60 source bytes then "...". */
#define SHOWN 256
static const char *show(const char *s, char *buf)
{
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        if (i == 60) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            o += (size_t)snprintf(buf + o, SHOWN - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

/* Byte offset (in the file) of `"name"` inside the header, or of the header start. */
static uint64_t key_offset(const char *json, uint64_t n, const char *name)
{
    size_t len = strlen(name);
    char *q = malloc(len + 3);
    uint64_t off = 8;
    if (!q)
        return off;
    q[0] = '"';
    memcpy(q + 1, name, len);
    q[len + 1] = '"';
    q[len + 2] = 0;
    const char *hit = memmem(json, (size_t)n, q, len + 2);
    if (hit)
        off = 8 + (uint64_t)(hit - json);
    free(q);
    return off;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    if (f->tensors)
        for (size_t i = 0; i < f->n_tensors; i++)
            free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; f->meta_keys && i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->path);
    free(f);
}

static int parse_metadata(st_file *f, json_t *meta, const char *json, uint64_t n, char *err, size_t errlen)
{
    uint64_t at = key_offset(json, n, "__metadata__");
    if (!json_is_object(meta))
        return fail(err, errlen, f->path, at, "\"__metadata__\" is not an object of strings; the file is corrupt.");
    size_t cnt = json_object_size(meta);
    f->meta_keys = calloc(cnt ? cnt : 1, sizeof(char *));
    f->meta_vals = calloc(cnt ? cnt : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_vals)
        return fail(err, errlen, f->path, at, "out of memory reading \"__metadata__\"; free memory and retry.");
    const char *k;
    json_t *v;
    char shown[SHOWN];
    json_object_foreach(meta, k, v)
    {
        if (!json_is_string(v))
            return fail(err, errlen, f->path, at,
                        "\"__metadata__\" value of \"%s\" is not a string; the file is corrupt.", show(k, shown));
        size_t i = f->n_meta;
        f->meta_keys[i] = strdup(k);
        f->meta_vals[i] = strdup(json_string_value(v));
        f->n_meta++;
        if (!f->meta_keys[i] || !f->meta_vals[i])
            return fail(err, errlen, f->path, at, "out of memory reading \"__metadata__\"; free memory and retry.");
    }
    return 0;
}

/* Reads a non-negative JSON integer. */
static bool get_uint(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Fails for tensor t: "<file>: byte <offset of its key>: tensor "<name>"<msg>".  The key is
 * searched for only here, on the error path: searching per tensor would be quadratic. */
__attribute__((format(printf, 7, 8))) static int tfail(const st_file *f, const st_tensor *t, const char *json,
                                                       uint64_t n, char *err, size_t errlen, const char *fmt, ...)
{
    char shown[SHOWN], msg[SPILL_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail(err, errlen, f->path, key_offset(json, n, t->name), "tensor \"%s\"%s", show(t->name, shown), msg);
}

/* Validates one tensor entry into t (name already set). */
static int parse_tensor(st_file *f, st_tensor *t, json_t *v, const char *json, uint64_t n, char *err, size_t errlen)
{
    if (!json_is_object(v))
        return tfail(f, t, json, n, err, errlen, " is not an object; the file is corrupt.");
    const char *k;
    json_t *x;
    char kshown[SHOWN];
    json_object_foreach(v, k, x)
    {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return tfail(f, t, json, n, err, errlen, " has unknown field \"%s\"; the file is corrupt.",
                         show(k, kshown));
    }

    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return tfail(f, t, json, n, err, errlen, ": \"dtype\" is missing or not a string; the file is corrupt.");
    t->dtype = ST_DTYPE_COUNT;
    for (uint32_t d = 0; d < ST_DTYPE_COUNT; d++)
        if (strcmp(json_string_value(dt), DTYPES[d].name) == 0)
            t->dtype = d;
    if (t->dtype == ST_DTYPE_COUNT)
        return tfail(f, t, json, n, err, errlen,
                     ": dtype \"%s\" is unknown; the file is corrupt or needs a newer spill.",
                     show(json_string_value(dt), kshown));

    json_t *sh = json_object_get(v, "shape");
    if (!json_is_array(sh))
        return tfail(f, t, json, n, err, errlen, ": \"shape\" is missing or not an array; the file is corrupt.");
    if (json_array_size(sh) > ST_MAX_DIMS)
        return tfail(f, t, json, n, err, errlen, ": shape has %zu dimensions, more than %d; the file is corrupt.",
                     json_array_size(sh), ST_MAX_DIMS);
    t->n_dims = (uint32_t)json_array_size(sh);
    uint64_t bits = DTYPES[t->dtype].bits;
    bool overflow = false;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!get_uint(json_array_get(sh, d), &t->shape[d]))
            return tfail(f, t, json, n, err, errlen, ": shape[%u] is not a non-negative integer; the file is corrupt.",
                         d);
        overflow |= !ck_mul_u64(bits, t->shape[d], &bits);
    }

    json_t *off = json_object_get(v, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(off) || json_array_size(off) != 2 || !get_uint(json_array_get(off, 0), &begin) ||
        !get_uint(json_array_get(off, 1), &end))
        return tfail(f, t, json, n, err, errlen,
                     ": \"data_offsets\" is missing or not [BEGIN, END] with "
                     "non-negative integers; the file is corrupt.");
    if (end < begin)
        return tfail(f, t, json, n, err, errlen,
                     ": data_offsets [%llu, %llu] end before they begin; the file is corrupt.",
                     (unsigned long long)begin, (unsigned long long)end);
    /* a 0 dim makes the tensor empty whatever the other dims are */
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (t->shape[d] == 0)
            overflow = false, bits = 0;
    if (overflow)
        return tfail(f, t, json, n, err, errlen,
                     ": the %s byte size of its shape overflows 64 bits; the file is corrupt.", DTYPES[t->dtype].name);
    if (bits % 8)
        return tfail(f, t, json, n, err, errlen,
                     ": its %s elements do not fill a whole number of bytes; the file is corrupt.",
                     DTYPES[t->dtype].name);
    if (end - begin != bits / 8)
        return tfail(f, t, json, n, err, errlen,
                     ": data_offsets [%llu, %llu] hold %llu bytes but its %s shape needs %llu; the file is corrupt.",
                     (unsigned long long)begin, (unsigned long long)end, (unsigned long long)(end - begin),
                     DTYPES[t->dtype].name, (unsigned long long)(bits / 8));
    t->offset = begin; /* relative until the layout is checked */
    t->size = end - begin;
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Checks that the sorted tensors tile the data buffer exactly, then makes offsets absolute. */
static int check_layout(st_file *f, const char *json, uint64_t n, char *err, size_t errlen)
{
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, by_offset);
    uint64_t pos = 0, buf = f->file_size - 8 - n;
    char shown[SHOWN], pshown[SHOWN];
    for (size_t i = 0; i < f->n_tensors; i++) {
        st_tensor *t = &f->tensors[i];
        if (t->offset != pos) {
            const char *how = t->offset > pos ? "leaving a gap" : "so they overlap";
            if (i == 0)
                return fail(err, errlen, f->path, key_offset(json, n, t->name),
                            "tensor \"%s\": data begins at "
                            "buffer offset %llu, which leaves a gap at the start of the data buffer; the file is "
                            "corrupt.",
                            show(t->name, shown), (unsigned long long)t->offset);
            return fail(err, errlen, f->path, key_offset(json, n, t->name),
                        "tensor \"%s\": data begins at buffer "
                        "offset %llu but the previous tensor \"%s\" ends at %llu, %s; the file is corrupt.",
                        show(t->name, shown), (unsigned long long)t->offset, show(f->tensors[i - 1].name, pshown),
                        (unsigned long long)pos, how);
        }
        pos += t->size; /* cannot overflow: pos == offset and offset + size == END */
    }
    if (pos != buf)
        return fail(err, errlen, f->path, 8 + n,
                    "the tensors cover %llu bytes but the data buffer holds %llu; the file is %s.",
                    (unsigned long long)pos, (unsigned long long)buf,
                    pos > buf ? "truncated" : "corrupt (trailing bytes after the last tensor)");
    for (size_t i = 0; i < f->n_tensors; i++)
        f->tensors[i].offset += 8 + n;
    return 0;
}

int st_parse_header(const char *json, uint64_t n, uint64_t file_size, const char *name, st_file **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    json_t *root = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name))) {
        free(f);
        return util_errf(err, errlen, "%s: out of memory reading the header; free memory and retry.", name);
    }
    f->file_size = file_size;
    f->header_len = n;
    if (n > MAX_HEADER || 8 + n > file_size) {
        fail(err, errlen, name, 0,
             "header length %llu does not fit in the %llu-byte file; the file is truncated or corrupt.",
             (unsigned long long)n, (unsigned long long)file_size);
        goto out_fail;
    }
    if (n == 0 || json[0] != '{') {
        fail(err, errlen, name, 8, "the header does not start with '{'; this is not a safetensors file.");
        goto out_fail;
    }
    if (!util_utf8_valid(json, (size_t)n)) {
        fail(err, errlen, name, 8, "the header is not valid UTF-8; the file is corrupt.");
        goto out_fail;
    }
    json_error_t je;
    root = json_loadb(json, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fail(err, errlen, name, 8 + (uint64_t)(je.position > 0 ? je.position : 0),
             "the header is not valid JSON (%s); the file is corrupt.", je.text);
        goto out_fail;
    }
    json_t *meta = json_object_get(root, "__metadata__");
    size_t cnt = json_object_size(root) - (meta ? 1 : 0);
    if (cnt > MAX_TENSORS) {
        fail(err, errlen, name, 8, "the header lists %zu tensors, more than the limit of %u; the file is corrupt.", cnt,
             MAX_TENSORS);
        goto out_fail;
    }
    if (meta && parse_metadata(f, meta, json, n, err, errlen))
        goto out_fail;
    f->tensors = calloc(cnt ? cnt : 1, sizeof *f->tensors);
    if (!f->tensors) {
        fail(err, errlen, name, 8, "out of memory for %zu tensors; free memory and retry.", cnt);
        goto out_fail;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        if (strcmp(k, "__metadata__") == 0)
            continue;
        st_tensor *t = &f->tensors[f->n_tensors++];
        if (!(t->name = strdup(k))) {
            fail(err, errlen, name, 8, "out of memory for tensor names; free memory and retry.");
            goto out_fail;
        }
        if (parse_tensor(f, t, v, json, n, err, errlen))
            goto out_fail;
    }
    if (check_layout(f, json, n, err, errlen))
        goto out_fail;
    json_decref(root);
    *out = f;
    return 0;

out_fail:
    json_decref(root);
    st_close(f);
    return -1;
}

/* Checks the 8-byte length prefix of a file of `size` bytes; sets *n. */
static int check_prefix(const uint8_t *p, uint64_t size, const char *name, uint64_t *n, char *err, size_t errlen)
{
    if (size < 8)
        return fail(err, errlen, name, 0,
                    "the file is %llu bytes, shorter than the 8-byte header length; the file is "
                    "truncated or not a safetensors file.",
                    (unsigned long long)size);
    *n = 0;
    for (int i = 0; i < 8; i++)
        *n |= (uint64_t)p[i] << (8 * i);
    if (*n > MAX_HEADER)
        return fail(err, errlen, name, 0,
                    "header length %llu exceeds the 100000000-byte limit; the file is corrupt "
                    "or not a safetensors file.",
                    (unsigned long long)*n);
    if (8 + *n > size)
        return fail(err, errlen, name, 0,
                    "header length %llu does not fit in the %llu-byte file; the file is truncated or corrupt.",
                    (unsigned long long)*n, (unsigned long long)size);
    return 0;
}

int st_parse_file_image(const uint8_t *data, size_t size, const char *name, st_file **out, char *err, size_t errlen)
{
    uint64_t n;
    *out = NULL;
    if (check_prefix(data, size, name, &n, err, errlen))
        return -1;
    return st_parse_header((const char *)data + 8, n, size, name, out, err, errlen);
}

static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

int st_open(const char *path, st_file **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = -1;
    char *json = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_errf(err, errlen, "%s: cannot open: %s.", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        util_errf(err, errlen, "%s: not a regular file; pass the path of a .safetensors file.", path);
        goto out_close_fd;
    }
    uint8_t pre[8] = {0};
    uint64_t size = (uint64_t)st.st_size, n;
    if (size >= 8 && pread_full(fd, pre, 8, 0)) {
        util_errf(err, errlen, "%s: read failed at byte 0: %s.", path, strerror(errno));
        goto out_close_fd;
    }
    if (check_prefix(pre, size, path, &n, err, errlen))
        goto out_close_fd;
    json = malloc(n + 1); /* n <= 100 MB and <= the file size */
    if (!json) {
        util_errf(err, errlen, "%s: out of memory reading a %llu-byte header; free memory and retry.", path,
                  (unsigned long long)n);
        goto out_close_fd;
    }
    if (pread_full(fd, json, (size_t)n, 8)) {
        util_errf(err, errlen, "%s: read failed at byte 8: the file shrank or cannot be read.", path);
        goto out_free_json;
    }
    json[n] = 0;
    rc = st_parse_header(json, n, size, path, out, err, errlen);
out_free_json:
    free(json);
out_close_fd:
    close(fd);
    return rc;
}

/* ---- models: one file or an index + shards ---- */

void st_model_close(st_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; m->shards && i < m->n_shards; i++)
        st_close(m->shards[i]);
    free(m->shards);
    free(m->by_name);
    free(m);
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(st_tensor *const *)a)->name, (*(st_tensor *const *)b)->name);
}

/* Name, then shard: a deterministic order for reporting a name held by two shards. */
static int by_name_shard(const void *a, const void *b)
{
    const st_tensor *x = *(st_tensor *const *)a, *y = *(st_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->shard > y->shard) - (x->shard < y->shard);
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const st_tensor *st_model_find(const st_model *m, const char *name)
{
    st_tensor key = {.name = (char *)name}, *kp = &key;
    st_tensor **hit = bsearch(&kp, m->by_name, m->n_tensors, sizeof *m->by_name, by_name);
    return hit ? *hit : NULL;
}

/* Builds m->by_name from the shards and rejects names found in two shards. */
static int index_tensors(st_model *m, const char *where, char *err, size_t errlen)
{
    size_t total = 0;
    for (size_t s = 0; s < m->n_shards; s++)
        total += m->shards[s]->n_tensors;
    m->by_name = malloc((total ? total : 1) * sizeof *m->by_name);
    if (!m->by_name)
        return util_errf(err, errlen, "%s: out of memory indexing %zu tensors; free memory and retry.", where, total);
    for (size_t s = 0; s < m->n_shards; s++)
        for (size_t i = 0; i < m->shards[s]->n_tensors; i++) {
            m->shards[s]->tensors[i].shard = (uint32_t)s;
            m->by_name[m->n_tensors++] = &m->shards[s]->tensors[i];
        }
    qsort(m->by_name, m->n_tensors, sizeof *m->by_name, by_name_shard);
    char shown[SHOWN];
    for (size_t i = 1; i < m->n_tensors; i++)
        if (strcmp(m->by_name[i - 1]->name, m->by_name[i]->name) == 0)
            return util_errf(err, errlen, "%s: tensor \"%s\" appears in both %s and %s; the shards are inconsistent.",
                             where, show(m->by_name[i]->name, shown), m->shards[m->by_name[i - 1]->shard]->path,
                             m->shards[m->by_name[i]->shard]->path);
    return 0;
}

static bool plain_basename(const char *s)
{
    return *s && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\\');
}

static const char *path_base(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Opens the shards named by the index at idx (JSON already validated to be an object). */
static int open_index(st_model *m, const char *dir, const char *idx, char *err, size_t errlen)
{
    int rc = -1;
    char *text = NULL;
    size_t len;
    const char **names = NULL;
    json_t *root = NULL;
    char shown[SHOWN], fshown[SHOWN];
    if (util_read_file(idx, MAX_INDEX_BYTES, &text, &len, err, errlen))
        return -1;
    json_error_t je;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        util_errf(err, errlen, "%s: line %d column %d: not valid JSON (%s); the index is corrupt.", idx, je.line,
                  je.column, je.text);
        goto out;
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        util_errf(err, errlen, "%s: \"weight_map\" is missing or not an object; the index is corrupt.", idx);
        goto out;
    }
    size_t nw = json_object_size(wm), nn = 0;
    names = malloc((nw ? nw : 1) * sizeof *names);
    if (!names) {
        util_errf(err, errlen, "%s: out of memory for %zu weight_map entries; free memory and retry.", idx, nw);
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v)
    {
        if (!json_is_string(v) || !plain_basename(json_string_value(v))) {
            util_errf(err, errlen,
                      "%s: weight_map entry \"%s\" must name a plain file in the model directory "
                      "(no '/', '\\' or \"..\"); the index is corrupt or malicious.",
                      idx, show(k, shown));
            goto out;
        }
        names[nn++] = json_string_value(v);
    }
    qsort(names, nn, sizeof *names, by_str);
    size_t nu = 0;
    for (size_t i = 0; i < nn; i++)
        if (nu == 0 || strcmp(names[nu - 1], names[i]))
            names[nu++] = names[i];
    m->shards = calloc(nu ? nu : 1, sizeof *m->shards);
    if (!m->shards) {
        util_errf(err, errlen, "%s: out of memory for %zu shards; free memory and retry.", idx, nu);
        goto out;
    }
    for (size_t i = 0; i < nu; i++) {
        char path[4096];
        if (util_pathf(path, sizeof path, "%s/%s", dir, names[i])) {
            util_errf(err, errlen, "%s: shard path for \"%s\" is too long; move the model to a shorter path.", idx,
                      show(names[i], shown));
            goto out;
        }
        if (st_open(path, &m->shards[i], err, errlen))
            goto out;
        m->n_shards++;
    }
    if (index_tensors(m, dir, err, errlen))
        goto out;
    json_object_foreach(wm, k, v)
    {
        const st_tensor *t = st_model_find(m, k);
        const char *want = json_string_value(v);
        if (!t || strcmp(path_base(m->shards[t->shard]->path), want) != 0) {
            util_errf(err, errlen,
                      "%s: tensor \"%s\" is mapped to %s but that shard does not hold it; the index and "
                      "the shards disagree.",
                      idx, show(k, shown), show(want, fshown));
            goto out;
        }
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!json_object_get(wm, m->by_name[i]->name)) {
            util_errf(err, errlen,
                      "%s: tensor \"%s\" in %s is missing from weight_map; the index and the shards disagree.", idx,
                      show(m->by_name[i]->name, shown), m->shards[m->by_name[i]->shard]->path);
            goto out;
        }
    rc = 0;
out:
    json_decref(root);
    free(names);
    free(text);
    return rc;
}

int st_model_open(const char *dir, st_model **out, char *err, size_t errlen)
{
    *out = NULL;
    st_model *m = calloc(1, sizeof *m);
    if (!m)
        return util_errf(err, errlen, "%s: out of memory opening the model; free memory and retry.", dir);
    char idx[4096], single[4096];
    if (util_pathf(idx, sizeof idx, "%s/model.safetensors.index.json", dir) ||
        util_pathf(single, sizeof single, "%s/model.safetensors", dir)) {
        util_errf(err, errlen, "%s: path is too long; move the model to a shorter path.", dir);
        goto out_fail;
    }
    if (util_is_file(dir) || (!util_is_file(idx) && util_is_file(single))) {
        m->shards = calloc(1, sizeof *m->shards);
        if (!m->shards) {
            util_errf(err, errlen, "%s: out of memory opening the model; free memory and retry.", dir);
            goto out_fail;
        }
        if (st_open(util_is_file(dir) ? dir : single, &m->shards[0], err, errlen))
            goto out_fail;
        m->n_shards = 1;
        if (index_tensors(m, dir, err, errlen))
            goto out_fail;
    } else if (util_is_file(idx)) {
        if (open_index(m, dir, idx, err, errlen))
            goto out_fail;
    } else {
        util_errf(err, errlen,
                  "%s: holds neither model.safetensors nor model.safetensors.index.json; pass the "
                  "directory of a safetensors model.",
                  dir);
        goto out_fail;
    }
    *out = m;
    return 0;
out_fail:
    st_model_close(m);
    return -1;
}
