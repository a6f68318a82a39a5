/*
 * gguf.c — GGUF v2/v3 reader: header, metadata key/values, tensor infos.
 *
 * Owns: mapping the file read-only, validating every byte of the header
 * region, and the lookup tables (key and tensor-name hashes, per-element
 * offsets of string arrays).  Does not: dequantize, interpret architecture
 * keys, or touch tensor data beyond checking that it lies inside the file.
 *
 * Byte layout (all little-endian; "str" = u64 length + bytes, no NUL):
 *   0   u32 magic "GGUF" (47 47 55 46)
 *   4   u32 version (2 or 3: same layout; v1 used u32 counts and is refused)
 *   8   u64 tensor_count
 *   16  u64 metadata_kv_count
 *   24  kv[metadata_kv_count]:   str key, u32 type, value
 *         value = scalar | str | array{u32 elem_type, u64 count, elems...}
 *       tensor_info[tensor_count]: str name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset
 *       zero padding to ALIGNMENT (general.alignment, default 32)
 *       tensor data; tensor i lives at data_start + offset_i
 *
 * Key decisions:
 *  - Every count read from the file is checked against the bytes that remain
 *    *before* anything is allocated: a KV needs at least 14 bytes (8-byte key
 *    length, 1 key byte, 4-byte type, 1 value byte), a tensor info at least 33,
 *    a string array element 8.  So every allocation is bounded by a small
 *    multiple of the file size, never by a claimed count (CVE-2024-25664..68,
 *    CVE-2025-53630/2026-27940 class bugs cannot happen here).
 *  - Hard caps besides: keys <= 65535 bytes, string values <= 64 MiB, arrays
 *    <= 16M elements, <= 1M keys and tensors, alignment a power of two <= 1 MiB.
 *  - Keys must be printable ASCII (ggml's are dotted lower_snake_case): a binary
 *    key is a corrupt or polyglot file, and it would garble error messages.
 *  - Arrays of arrays are refused (ggml's own reader refuses them, and no
 *    model uses them); this keeps gguf_kv one level deep.
 *  - Tensor dims must be >= 1.  ggml allows 0-sized dims, but no model ships an
 *    empty tensor and every consumer would need a special case for it.
 *  - Tensor data must follow ggml's rule exactly: tensor i's offset equals the
 *    padded end of tensor i-1 (stored in info order, contiguous), and the data
 *    of every tensor lies inside the file (CVE-2026-7482).
 *  - Duplicate keys and tensor names are refused; both are found through
 *    open-addressing hash tables that also serve gguf_get/gguf_find_tensor.
 *  - The mapping is MAP_PRIVATE/PROT_READ; a file truncated by someone else
 *    while mapped raises SIGBUS on access, as with any mmap reader.
 *  - Errors are one sentence: "<file>: byte <offset>: <field>: <reason>; <what to do>."
 */
#include "gguf.h"
#include "../base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_BYTES 24
#define MIN_KV_BYTES 14
#define MIN_TENSOR_INFO_BYTES 33

typedef struct gguf_priv {
    uint32_t *kv_hash; /* kv_hcap slots: kv index + 1, 0 = empty */
    uint64_t kv_hcap;
    uint32_t *t_hash; /* t_hcap slots: tensor index + 1, 0 = empty */
    uint64_t t_hcap;
} gguf_priv;

/* ---- type tables ---- */

typedef struct type_info {
    const char *name;
    uint32_t block_elems, block_bytes;
} type_info;

/* Sizes from ggml-common.h / gguf-py GGML_QUANT_SIZES; a NULL name = removed or unknown. */
static const type_info GGML_TYPES[GGML_TYPE_COUNT] = {
    [GGML_F32] = {"F32", 1, 4},       [GGML_F16] = {"F16", 1, 2},       [GGML_Q4_0] = {"Q4_0", 32, 18},
    [GGML_Q4_1] = {"Q4_1", 32, 20},   [GGML_Q5_0] = {"Q5_0", 32, 22},   [GGML_Q5_1] = {"Q5_1", 32, 24},
    [GGML_Q8_0] = {"Q8_0", 32, 34},   [GGML_Q8_1] = {"Q8_1", 32, 40},   [GGML_Q2_K] = {"Q2_K", 256, 84},
    [GGML_Q3_K] = {"Q3_K", 256, 110}, [GGML_Q4_K] = {"Q4_K", 256, 144}, [GGML_Q5_K] = {"Q5_K", 256, 176},
    [GGML_Q6_K] = {"Q6_K", 256, 210}, [GGML_Q8_K] = {"Q8_K", 256, 292}, [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},       [18] = {"IQ3_XXS", 256, 98},      [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},        [21] = {"IQ3_S", 256, 110},       [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},      [GGML_I8] = {"I8", 1, 1},         [GGML_I16] = {"I16", 1, 2},
    [GGML_I32] = {"I32", 1, 4},       [GGML_I64] = {"I64", 1, 8},       [GGML_F64] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},        [GGML_BF16] = {"BF16", 1, 2},     [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},        [39] = {"MXFP4", 32, 17},         [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},
};

bool ggml_type_info(uint32_t type, const char **name, uint32_t *block_elems, uint32_t *block_bytes)
{
    if (type == GGML_F8_E4M3_ROW) { /* spill's fp8 rows (gguf.h): 16-element "blocks" of 16 codes, plus the header */
        if (name)
            *name = "F8_E4M3";
        if (block_elems)
            *block_elems = 16;
        if (block_bytes)
            *block_bytes = 16;
        return true;
    }
    if (type >= GGML_TYPE_COUNT || !GGML_TYPES[type].name)
        return false;
    if (name)
        *name = GGML_TYPES[type].name;
    if (block_elems)
        *block_elems = GGML_TYPES[type].block_elems;
    if (block_bytes)
        *block_bytes = GGML_TYPES[type].block_bytes;
    return true;
}

uint32_t ggml_type_row_extra(uint32_t type)
{
    return type == GGML_F8_E4M3_ROW ? 16 : 0;
}

static bool ggml_type_removed(uint32_t t)
{
    return t == 4 || t == 5 || (t >= 31 && t <= 33) || (t >= 36 && t <= 38);
}

/* Bytes per element of a scalar GGUF value type; 0 for STRING/ARRAY/invalid. */
static uint32_t vtype_size(uint32_t t)
{
    static const uint8_t sz[] = {
        [GGUF_V_U8] = 1,  [GGUF_V_I8] = 1,   [GGUF_V_U16] = 2, [GGUF_V_I16] = 2, [GGUF_V_U32] = 4, [GGUF_V_I32] = 4,
        [GGUF_V_F32] = 4, [GGUF_V_BOOL] = 1, [GGUF_V_U64] = 8, [GGUF_V_I64] = 8, [GGUF_V_F64] = 8};
    return t < sizeof sz ? sz[t] : 0;
}

static const char *vtype_name(uint32_t t)
{
    static const char *names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "invalid";
}

/* ---- little-endian loads (no alignment or host-endianness assumptions) ---- */

static uint64_t le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Decodes one scalar of type t at p into kv->v. */
static void load_scalar(gguf_kv *kv, uint32_t t, const uint8_t *p)
{
    uint64_t raw = le(p, vtype_size(t));
    switch (t) {
    case GGUF_V_I8:
        kv->v.i = (int8_t)raw;
        break;
    case GGUF_V_I16:
        kv->v.i = (int16_t)raw;
        break;
    case GGUF_V_I32:
        kv->v.i = (int32_t)raw;
        break;
    case GGUF_V_I64:
        kv->v.i = (int64_t)raw;
        break;
    case GGUF_V_F32: {
        uint32_t b = (uint32_t)raw;
        float x;
        memcpy(&x, &b, 4);
        kv->v.f = x;
        break;
    }
    case GGUF_V_F64:
        memcpy(&kv->v.f, &raw, 8);
        break;
    default:
        kv->v.u = raw;
        break;
    }
}

/* ---- the reader: position, bounds, error sentences ---- */

typedef struct reader {
    const uint8_t *d;
    uint64_t size, pos;
    const char *name;
    char *err;
    size_t errlen;
} reader;

/* Writes "<name>: byte <off>: <msg>" into r->err and returns -1. */
__attribute__((format(printf, 3, 4))) static int fail(reader *r, uint64_t off, const char *fmt, ...)
{
    if (r->err && r->errlen) {
        int n = snprintf(r->err, r->errlen, "%s: byte %llu: ", r->name, (unsigned long long)off);
        if (n >= 0 && (size_t)n < r->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static uint64_t remaining(const reader *r)
{
    return r->size - r->pos;
}

/* Fails unless n more bytes are available; `what` names the field. */
static int need(reader *r, uint64_t n, const char *what)
{
    if (n <= remaining(r))
        return 0;
    return fail(r, r->pos, "%s needs %llu bytes but only %llu remain; the file is truncated or corrupt.", what,
                (unsigned long long)n, (unsigned long long)remaining(r));
}

static int read_u32(reader *r, uint32_t *v, const char *what)
{
    if (need(r, 4, what))
        return -1;
    *v = (uint32_t)le(r->d + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int read_u64(reader *r, uint64_t *v, const char *what)
{
    if (need(r, 8, what))
        return -1;
    *v = le(r->d + r->pos, 8);
    r->pos += 8;
    return 0;
}

/*
 * Renders untrusted bytes for an error message: printable ASCII as is, other
 * bytes as \xNN, at most ~40 source bytes then "...".  Always NUL-terminates.
 */
#define SHOWN 176 /* 40 bytes as \xNN + "..." + NUL */
static const char *show(const uint8_t *p, uint64_t len, char *buf, size_t cap)
{
    size_t o = 0;
    for (uint64_t i = 0; i < len && o + 8 < cap; i++) {
        if (i == 40) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\')
            buf[o++] = (char)p[i];
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", p[i]);
    }
    buf[o] = 0;
    return buf;
}

/* ---- hash tables (FNV-1a, open addressing, power-of-two capacity >= 2n) ---- */

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint32_t *hash_new(uint64_t n, uint64_t *cap)
{
    uint64_t c = 16;
    while (c < 2 * n)
        c *= 2;
    *cap = c;
    return calloc(c, sizeof(uint32_t));
}

/*
 * Finds `key` in a table whose slot values are 1-based indices resolved to
 * names by name_of(); returns the slot (empty when absent).
 */
typedef const char *(*name_fn)(const gguf_file *f, uint32_t idx);
static uint64_t hash_slot(const gguf_file *f, const uint32_t *tab, uint64_t cap, name_fn name_of, const char *key)
{
    size_t n = strlen(key);
    uint64_t s = fnv1a(key, n) & (cap - 1);
    while (tab[s] && strcmp(name_of(f, tab[s] - 1), key) != 0)
        s = (s + 1) & (cap - 1);
    return s;
}

static const char *kv_name(const gguf_file *f, uint32_t i)
{
    return f->kv[i].key;
}
static const char *tensor_name(const gguf_file *f, uint32_t i)
{
    return f->tensors[i].name;
}

/* ---- metadata ---- */

/*
 * Reads one GGUF string at r->pos (u64 length + bytes) whose length is at most
 * `cap`; on success *p and *len address it inside the image.  `what` names it.
 */
static int read_str(reader *r, uint64_t cap, const uint8_t **p, uint64_t *len, const char *what)
{
    uint64_t at = r->pos, n;
    if (read_u64(r, &n, what))
        return -1;
    if (n > cap)
        return fail(r, at, "%s: length %llu exceeds the %llu-byte limit; the file is corrupt.", what,
                    (unsigned long long)n, (unsigned long long)cap);
    if (need(r, n, what))
        return -1;
    *p = r->d + r->pos;
    *len = n;
    r->pos += n;
    return 0;
}

#define MAX_KEY_BYTES 65535u
#define MAX_STR_BYTES (64ull << 20)
#define MAX_ARR_ELEMS (16ull << 20)
#define MAX_COUNT 1000000ull
#define MAX_ALIGNMENT (1u << 20)

/* Parses the value of kv (type already read) at r->pos; `shown` is the printable key. */
static int read_value(reader *r, gguf_kv *kv, uint32_t type, const char *shown)
{
    char what[200];
    snprintf(what, sizeof what, "key \"%s\"", shown);
    if (type == GGUF_V_STRING) {
        const uint8_t *p;
        if (read_str(r, MAX_STR_BYTES, &p, &kv->v.s.len, what))
            return -1;
        kv->v.s.p = (const char *)p;
        return 0;
    }
    if (type != GGUF_V_ARRAY) {
        uint32_t sz = vtype_size(type);
        if (need(r, sz, what))
            return -1;
        if (type == GGUF_V_BOOL && r->d[r->pos] > 1)
            return fail(r, r->pos, "%s: boolean value %u is not 0 or 1; the file is corrupt.", what, r->d[r->pos]);
        load_scalar(kv, type, r->d + r->pos);
        r->pos += sz;
        return 0;
    }

    uint64_t at = r->pos;
    if (read_u32(r, &kv->arr_type, what))
        return -1;
    if (kv->arr_type == GGUF_V_ARRAY)
        return fail(r, at, "%s: arrays of arrays are not supported; the file is corrupt or not a model file.", what);
    if (kv->arr_type > GGUF_V_F64)
        return fail(r, at, "%s: array element type %u is not a valid GGUF type; the file is corrupt.", what,
                    kv->arr_type);
    at = r->pos;
    if (read_u64(r, &kv->arr_n, what))
        return -1;
    if (kv->arr_n > MAX_ARR_ELEMS)
        return fail(r, at, "%s: array of %llu elements exceeds the limit of %llu; the file is corrupt.", what,
                    (unsigned long long)kv->arr_n, MAX_ARR_ELEMS);
    /* a string element is at least its 8-byte length, so this bounds the str_off allocation by the file size */
    uint64_t esz = kv->arr_type == GGUF_V_STRING ? 8 : vtype_size(kv->arr_type), bytes;
    if (!ck_mul_u64(kv->arr_n, esz, &bytes) || bytes > remaining(r))
        return fail(r, at,
                    "%s: array of %llu %s elements cannot fit in the %llu remaining bytes; the file is truncated "
                    "or corrupt.",
                    what, (unsigned long long)kv->arr_n, vtype_name(kv->arr_type), (unsigned long long)remaining(r));
    if (kv->arr_type != GGUF_V_STRING) {
        kv->arr_data = r->d + r->pos;
        if (kv->arr_type == GGUF_V_BOOL)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if (kv->arr_data[i] > 1)
                    return fail(r, r->pos + i, "%s: boolean element %llu is %u, not 0 or 1; the file is corrupt.", what,
                                (unsigned long long)i, kv->arr_data[i]);
        r->pos += bytes;
        return 0;
    }
    uint64_t *off = malloc(kv->arr_n ? kv->arr_n * sizeof *off : 1);
    if (!off)
        return fail(r, at, "%s: out of memory indexing %llu strings; free memory and retry.", what,
                    (unsigned long long)kv->arr_n);
    kv->str_off = off;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        off[i] = r->pos;
        uint64_t len = remaining(r) >= 8 ? le(r->d + r->pos, 8) : 0;
        if (remaining(r) >= 8 && len <= MAX_STR_BYTES && len <= remaining(r) - 8) {
            r->pos += 8 + len;
            continue;
        }
        /* slow path only to word the error */
        const uint8_t *p;
        char ewhat[240];
        snprintf(ewhat, sizeof ewhat, "%s element %llu", what, (unsigned long long)i);
        return read_str(r, MAX_STR_BYTES, &p, &len, ewhat);
    }
    return 0;
}

static int check_alignment(reader *r, const gguf_kv *kv, uint64_t at, uint64_t *alignment)
{
    if (kv->type != GGUF_V_U32)
        return fail(r, at, "key \"general.alignment\" must be a u32 but is a %s; the file is corrupt.",
                    vtype_name(kv->type));
    uint64_t a = kv->v.u;
    if (a == 0 || (a & (a - 1)) || a > MAX_ALIGNMENT)
        return fail(r, at,
                    "key \"general.alignment\" is %llu, not a power of two between 1 and %u; the file is corrupt.",
                    (unsigned long long)a, MAX_ALIGNMENT);
    *alignment = a;
    return 0;
}

static int read_kvs(reader *r, gguf_file *f)
{
    gguf_priv *pv = f->priv;
    char shown[SHOWN];
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        uint64_t at = r->pos;
        const uint8_t *kp;
        uint64_t klen;
        if (read_str(r, MAX_KEY_BYTES, &kp, &klen, "metadata key"))
            return -1;
        if (klen == 0)
            return fail(r, at, "metadata key %llu is empty; the file is corrupt.", (unsigned long long)i);
        if (memchr(kp, 0, klen))
            return fail(r, at, "metadata key \"%s\" contains a NUL byte; the file is corrupt.",
                        show(kp, klen, shown, sizeof shown));
        for (uint64_t j = 0; j < klen; j++)
            if (kp[j] < 0x20 || kp[j] >= 0x7f)
                return fail(r, at, "metadata key \"%s\" is not printable ASCII; the file is corrupt.",
                            show(kp, klen, shown, sizeof shown));
        char *key = malloc(klen + 1);
        if (!key)
            return fail(r, at, "out of memory copying a metadata key; free memory and retry.");
        memcpy(key, kp, klen);
        key[klen] = 0;
        kv->key = key;
        uint64_t slot = hash_slot(f, pv->kv_hash, pv->kv_hcap, kv_name, key);
        if (pv->kv_hash[slot])
            return fail(r, at, "duplicate metadata key \"%s\"; the file is corrupt.",
                        show(kp, klen, shown, sizeof shown));
        pv->kv_hash[slot] = (uint32_t)i + 1;

        uint64_t tat = r->pos;
        char what[200];
        snprintf(what, sizeof what, "type of key \"%s\"", show(kp, klen, shown, sizeof shown));
        if (read_u32(r, &kv->type, what))
            return -1;
        if (kv->type > GGUF_V_F64)
            return fail(r, tat,
                        "key \"%s\" has unknown value type %u; the file is corrupt or from a newer GGUF version.",
                        shown, kv->type);
        if (read_value(r, kv, kv->type, shown))
            return -1;
        if (strcmp(key, "general.alignment") == 0 && check_alignment(r, kv, at, &f->alignment))
            return -1;
    }
    return 0;
}

/* ---- tensor infos ---- */

static int read_tensor(reader *r, gguf_file *f, uint64_t i, uint64_t *running)
{
    gguf_priv *pv = f->priv;
    gguf_tensor *t = &f->tensors[i];
    uint64_t at = r->pos;
    const uint8_t *np;
    uint64_t nlen;
    char shown[SHOWN];
    if (read_str(r, 63, &np, &nlen, "tensor name"))
        return -1;
    if (nlen == 0)
        return fail(r, at, "tensor %llu has an empty name; the file is corrupt.", (unsigned long long)i);
    if (memchr(np, 0, nlen))
        return fail(r, at, "tensor name \"%s\" contains a NUL byte; the file is corrupt.",
                    show(np, nlen, shown, sizeof shown));
    memcpy(t->name, np, nlen);
    t->name[nlen] = 0;
    show(np, nlen, shown, sizeof shown);
    uint64_t slot = hash_slot(f, pv->t_hash, pv->t_hcap, tensor_name, t->name);
    if (pv->t_hash[slot])
        return fail(r, at, "duplicate tensor name \"%s\"; the file is corrupt.", shown);
    pv->t_hash[slot] = (uint32_t)i + 1;

    char what[200];
    snprintf(what, sizeof what, "tensor \"%s\"", shown);
    uint64_t dat = r->pos;
    if (read_u32(r, &t->n_dims, what))
        return -1;
    if (t->n_dims < 1 || t->n_dims > 4)
        return fail(r, dat, "tensor \"%s\": n_dims %u is not between 1 and 4; the file is corrupt.", shown, t->n_dims);
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t nat = r->pos;
        if (read_u64(r, &t->ne[d], what))
            return -1;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return fail(r, nat, "tensor \"%s\": ne[%u] = %llu is not between 1 and 2^63-1; the file is corrupt.", shown,
                        d, (unsigned long long)t->ne[d]);
        if (!ck_mul_u64(nelem, t->ne[d], &nelem) || nelem > (uint64_t)INT64_MAX)
            return fail(r, nat, "tensor \"%s\": the element count overflows at ne[%u] = %llu; the file is corrupt.",
                        shown, d, (unsigned long long)t->ne[d]);
    }
    uint64_t tat = r->pos;
    if (read_u32(r, &t->type, what))
        return -1;
    const char *tname;
    uint32_t be, bb;
    if (!ggml_type_info(t->type, &tname, &be, &bb))
        return fail(r, tat, "tensor \"%s\": ggml type %u is %s; re-convert the model with a current llama.cpp.", shown,
                    t->type,
                    t->type < GGML_TYPE_COUNT ? (ggml_type_removed(t->type) ? "removed from ggml" : "not supported")
                                              : "unknown");
    if (t->ne[0] % be)
        return fail(r, tat,
                    "tensor \"%s\": ne[0] = %llu is not a multiple of the %s block size %u; the file is corrupt.",
                    shown, (unsigned long long)t->ne[0], tname, be);
    /* size = rows * (blocks per row * bytes per block + row header), rows = ne1*ne2*ne3 */
    uint64_t size;
    if (!ck_mul_u64(t->ne[0] / be, bb, &size) || !ck_add_u64(size, ggml_type_row_extra(t->type), &size) ||
        !ck_mul_u64(size, t->ne[1], &size) ||
        !ck_mul_u64(size, t->ne[2], &size) || !ck_mul_u64(size, t->ne[3], &size))
        return fail(r, tat, "tensor \"%s\": its byte size overflows 64 bits; the file is corrupt.", shown);
    t->size = size;

    uint64_t oat = r->pos;
    if (read_u64(r, &t->offset, what))
        return -1;
    if (t->offset % f->alignment)
        return fail(r, oat,
                    "tensor \"%s\": data offset %llu is not a multiple of the alignment %llu; the file is corrupt.",
                    shown, (unsigned long long)t->offset, (unsigned long long)f->alignment);
    if (t->offset != *running)
        return fail(r, oat,
                    "tensor \"%s\": data offset %llu should be %llu (tensors are stored in order, each "
                    "padded to the alignment); the file is corrupt.",
                    shown, (unsigned long long)t->offset, (unsigned long long)*running);
    uint64_t end;
    if (!ck_add_u64(t->offset, size, &end) || !ck_add_u64(end, f->alignment - 1, &end))
        return fail(r, oat, "tensor \"%s\": data offset plus size overflows 64 bits; the file is corrupt.", shown);
    *running = end / f->alignment * f->alignment;
    return 0;
}

/* ---- open / parse / close ---- */

static int parse_header(reader *r, gguf_file *f)
{
    const uint8_t *d = r->d;
    if (r->size < HEADER_BYTES)
        return fail(r, 0,
                    "the file is %llu bytes, shorter than the 24-byte GGUF header; the file is truncated or not "
                    "a GGUF file.",
                    (unsigned long long)r->size);
    if (memcmp(d, "GGUF", 4) != 0)
        return fail(r, 0, "magic bytes %02x %02x %02x %02x are not \"GGUF\"; this is not a GGUF file.", d[0], d[1],
                    d[2], d[3]);
    f->version = (uint32_t)le(d + 4, 4);
    if (f->version != 0 && (f->version & 0xFFFF) == 0)
        return fail(r, 4,
                    "version 0x%08x looks byte-swapped; big-endian GGUF files are not supported, convert the "
                    "model on a little-endian machine.",
                    f->version);
    if (f->version != 2 && f->version != 3)
        return fail(r, 4,
                    "GGUF version %u is not supported (only 2 and 3 are); re-convert the model with a current "
                    "llama.cpp.",
                    f->version);
    f->n_tensors = le(d + 8, 8);
    f->n_kv = le(d + 16, 8);
    r->pos = HEADER_BYTES;
    uint64_t need_t, need_kv;
    if (f->n_tensors > MAX_COUNT || !ck_mul_u64(f->n_tensors, MIN_TENSOR_INFO_BYTES, &need_t) || need_t > remaining(r))
        return fail(r, 8, "tensor count %llu cannot fit in the %llu remaining bytes; the file is truncated or corrupt.",
                    (unsigned long long)f->n_tensors, (unsigned long long)remaining(r));
    if (f->n_kv > MAX_COUNT || !ck_mul_u64(f->n_kv, MIN_KV_BYTES, &need_kv) || need_kv > remaining(r))
        return fail(r, 16,
                    "metadata count %llu cannot fit in the %llu remaining bytes; the file is truncated or corrupt.",
                    (unsigned long long)f->n_kv, (unsigned long long)remaining(r));
    return 0;
}

int gguf_parse(const uint8_t *data, uint64_t size, const char *name, gguf_file **out, char *err, size_t errlen)
{
    *out = NULL;
    reader r = {.d = data, .size = size, .pos = 0, .name = name, .err = err, .errlen = errlen};
    gguf_file *f = calloc(1, sizeof *f);
    gguf_priv *pv = calloc(1, sizeof *pv);
    if (!f || !pv || !(f->path = strdup(name))) {
        free(pv);
        if (f)
            free(f->path);
        free(f);
        return util_errf(err, errlen, "%s: out of memory opening the model; free memory and retry.", name);
    }
    f->priv = pv;
    f->data = data;
    f->size = size;
    f->alignment = 32;
    if (parse_header(&r, f))
        goto out_fail;
    /* counts were bounded by the remaining bytes above: these allocations are at most ~4x the file size */
    uint64_t n_kv = f->n_kv, n_t = f->n_tensors;
    f->n_kv = f->n_tensors = 0; /* what gguf_close may free, grown as arrays are allocated */
    f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(n_t ? n_t : 1, sizeof *f->tensors);
    pv->kv_hash = hash_new(n_kv, &pv->kv_hcap);
    pv->t_hash = hash_new(n_t, &pv->t_hcap);
    if (!f->kv || !f->tensors || !pv->kv_hash || !pv->t_hash) {
        fail(&r, 16, "out of memory for %llu keys and %llu tensors; free memory and retry.", (unsigned long long)n_kv,
             (unsigned long long)n_t);
        goto out_fail;
    }
    f->n_kv = n_kv;
    f->n_tensors = n_t;
    if (read_kvs(&r, f))
        goto out_fail;
    uint64_t running = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (read_tensor(&r, f, i, &running))
            goto out_fail;
    /* r.pos <= size, and size + alignment cannot overflow for any real mapping */
    f->data_offset = (r.pos + f->alignment - 1) / f->alignment * f->alignment;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        uint64_t a = 0, b = 0;
        if (!ck_add_u64(f->data_offset, t->offset, &a) || !ck_add_u64(a, t->size, &b) || b > size) {
            fail(&r, a,
                 "tensor \"%s\": data [%llu, %llu) runs past the end of the %llu-byte file; the file is "
                 "truncated or corrupt.",
                 t->name, (unsigned long long)a, (unsigned long long)b, (unsigned long long)size);
            goto out_fail;
        }
    }
    *out = f;
    return 0;

out_fail:
    gguf_close(f);
    return -1;
}

int gguf_open(const char *path, gguf_file **out, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_errf(err, errlen, "%s: cannot open: %s.", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return util_errf(err, errlen, "%s: not a regular file; pass the path of a .gguf file.", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < HEADER_BYTES) {
        close(fd);
        return util_errf(err, errlen,
                         "%s: byte 0: the file is %llu bytes, shorter than the 24-byte GGUF header; the "
                         "file is truncated or not a GGUF file.",
                         path, (unsigned long long)size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (map == MAP_FAILED)
        return util_errf(err, errlen, "%s: cannot map %llu bytes: %s.", path, (unsigned long long)size, strerror(merr));
    if (gguf_parse(map, size, path, out, err, errlen)) {
        munmap(map, size);
        return -1;
    }
    (*out)->map = map;
    return 0;
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free((void *)f->kv[i].key);
            free((void *)f->kv[i].str_off);
        }
    free(f->kv);
    free(f->tensors);
    gguf_priv *pv = f->priv;
    if (pv) {
        free(pv->kv_hash);
        free(pv->t_hash);
        free(pv);
    }
    if (f->map)
        munmap((void *)f->map, f->size);
    free(f->path);
    free(f);
}

/* ---- accessors ---- */

const gguf_kv *gguf_get(const gguf_file *f, const char *key)
{
    const gguf_priv *pv = f->priv;
    uint64_t s = hash_slot(f, pv->kv_hash, pv->kv_hcap, kv_name, key);
    return pv->kv_hash[s] ? &f->kv[pv->kv_hash[s] - 1] : NULL;
}

static bool is_unsigned(uint32_t t)
{
    return t == GGUF_V_U8 || t == GGUF_V_U16 || t == GGUF_V_U32 || t == GGUF_V_U64;
}
static bool is_signed(uint32_t t)
{
    return t == GGUF_V_I8 || t == GGUF_V_I16 || t == GGUF_V_I32 || t == GGUF_V_I64;
}

bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    const gguf_kv *kv = gguf_get(f, key);
    if (kv && is_unsigned(kv->type)) {
        *out = kv->v.u;
        return true;
    }
    if (kv && is_signed(kv->type) && kv->v.i >= 0) {
        *out = (uint64_t)kv->v.i;
        return true;
    }
    return false;
}

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_get(f, key);
    if (kv && is_signed(kv->type)) {
        *out = kv->v.i;
        return true;
    }
    if (kv && is_unsigned(kv->type) && kv->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->v.u;
        return true;
    }
    return false;
}

bool gguf_get_f64(const gguf_file *f, const char *key, double *out)
{
    const gguf_kv *kv = gguf_get(f, key);
    if (!kv || (kv->type != GGUF_V_F32 && kv->type != GGUF_V_F64))
        return false;
    *out = kv->v.f;
    return true;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    const gguf_kv *kv = gguf_get(f, key);
    if (!kv || kv->type != GGUF_V_BOOL)
        return false;
    *out = kv->v.u != 0;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len)
{
    const gguf_kv *kv = gguf_get(f, key);
    if (!kv || kv->type != GGUF_V_STRING)
        return false;
    *s = kv->v.s.p;
    *len = (size_t)kv->v.s.len;
    return true;
}

const char *gguf_arr_str(const gguf_file *f, const gguf_kv *kv, uint64_t i, size_t *len)
{
    if (!kv || kv->type != GGUF_V_ARRAY || kv->arr_type != GGUF_V_STRING || i >= kv->arr_n)
        return NULL;
    const uint8_t *p = f->data + kv->str_off[i];
    *len = (size_t)le(p, 8);
    return (const char *)p + 8;
}

double gguf_arr_num(const gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != GGUF_V_ARRAY || i >= kv->arr_n || !vtype_size(kv->arr_type))
        return NAN;
    gguf_kv tmp;
    uint32_t sz = vtype_size(kv->arr_type);
    load_scalar(&tmp, kv->arr_type, kv->arr_data + i * sz);
    if (is_signed(kv->arr_type))
        return (double)tmp.v.i;
    if (kv->arr_type == GGUF_V_F32 || kv->arr_type == GGUF_V_F64)
        return tmp.v.f;
    return (double)tmp.v.u;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    const gguf_priv *pv = f->priv;
    uint64_t s = hash_slot(f, pv->t_hash, pv->t_hcap, tensor_name, name);
    return pv->t_hash[s] ? &f->tensors[pv->t_hash[s] - 1] : NULL;
}

const uint8_t *gguf_tensor_data(const gguf_file *f, const gguf_tensor *t)
{
    return f->data + f->data_offset + t->offset;
}
