/*
 * safetensors.c — safetensors header reader, single files and sharded models.
 *
 * Owns: reading and validating the header of each file (pread only; the data
 * buffer is never touched), and joining shards through
 * model.safetensors.index.json.  Does not: read or convert tensor data (the
 * loaders and the streamer do, by absolute offset), or map HF names.  It
 * does pair an F8_E4M3 weight with its scale tensor (st_model_fp8_scale: the
 * naming and shape conventions of fp8 checkpoints, checked here).
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
 * Key decision: the header is parsed by a small parser for exactly this schema
 * (see "the header parser" below for why not a general JSON library); jansson
 * reads only model.safetensors.index.json.  Errors name the byte of the fault:
 * the offending character for syntax, the tensor's key for schema and layout.
 * The index's "metadata.total_size" is informational and not checked; its
 * weight_map must match the shards exactly, both ways.
 */
#include "safetensors.h"
#include "../base/util.h"

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

/* ---- the header parser: JSON restricted to the safetensors schema ---- */

/*
 * Why not a general JSON library: a general parser builds a tree of every value
 * before the schema is checked, so a 100 MB header of tiny entries costs seconds
 * and gigabytes (measured with jansson: 1M entries, 6.5 s; this parser: < 1 s).  The schema is fixed:
 * an object whose values are either the string map "__metadata__" or tensor
 * objects of three known fields.  Parsing that grammar directly allocates only
 * the result, reports the exact byte of every error, and needs no generic value
 * skipping (any value of the wrong kind is already an error).
 */
typedef struct jp {
    const char *s;
    uint64_t n, pos; /* pos indexes the header; file byte = 8 + pos */
    st_file *f;
    uint64_t *koff; /* koff[i] = header position of tensor i's key */
    size_t cap;     /* allocated entries of f->tensors and koff */
    char *err;
    size_t errlen;
} jp;

__attribute__((format(printf, 3, 4))) static int jfail(jp *p, uint64_t at, const char *fmt, ...)
{
    char msg[SPILL_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail(p->err, p->errlen, p->f->path, 8 + at, "%s", msg);
}

static void skip_ws(jp *p)
{
    while (p->pos < p->n &&
           (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

/* Fails with "expected <what>" at the current byte. */
static int syntax(jp *p, const char *what)
{
    if (p->pos >= p->n)
        return jfail(p, p->pos, "the header is not valid JSON (expected %s but the header ends); the file is corrupt.",
                     what);
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f)
        return jfail(p, p->pos, "the header is not valid JSON (expected %s but found '%c'); the file is corrupt.", what,
                     c);
    return jfail(p, p->pos, "the header is not valid JSON (expected %s but found byte 0x%02x); the file is corrupt.",
                 what, c);
}

static bool peek(jp *p, char c)
{
    skip_ws(p);
    return p->pos < p->n && p->s[p->pos] == c;
}

static int expect(jp *p, char c, const char *what)
{
    if (!peek(p, c))
        return syntax(p, what);
    p->pos++;
    return 0;
}

static int hex4(const char *s, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/*
 * Reads the JSON string at pos (after whitespace) into a fresh NUL-terminated
 * buffer (*out, caller frees), resolving escapes.  The header was checked to be
 * valid UTF-8 as a whole; escapes are checked here (surrogates paired, no \u0000,
 * since names and values are C strings).
 */
static int read_string(jp *p, char **out, const char *what)
{
    *out = NULL;
    if (!peek(p, '"'))
        return syntax(p, what);
    uint64_t start = ++p->pos, end = start;
    while (end < p->n && p->s[end] != '"') {
        if ((unsigned char)p->s[end] < 0x20)
            return jfail(p, end,
                         "the header is not valid JSON (raw control byte 0x%02x inside a string); the file is corrupt.",
                         (unsigned char)p->s[end]);
        end += p->s[end] == '\\' ? 2 : 1;
    }
    if (end >= p->n)
        return jfail(p, start - 1, "the header is not valid JSON (a string is never closed); the file is corrupt.");
    char *o = malloc(end - start + 1);
    if (!o)
        return jfail(p, start, "out of memory reading a %llu-byte string; free memory and retry.",
                     (unsigned long long)(end - start));
    size_t k = 0;
    for (uint64_t i = start; i < end;) {
        if (p->s[i] != '\\') {
            o[k++] = p->s[i++];
            continue;
        }
        char e = p->s[i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            o[k++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            i += 2;
            continue;
        }
        uint32_t cp, lo;
        if (e != 'u' || i + 6 > end || hex4(p->s + i + 2, &cp)) {
            free(o);
            return jfail(p, i, "the header is not valid JSON (invalid escape in a string); the file is corrupt.");
        }
        uint64_t at = i;
        i += 6;
        if (cp >= 0xD800 && cp < 0xDC00) {
            if (i + 6 > end || p->s[i] != '\\' || p->s[i + 1] != 'u' || hex4(p->s + i + 2, &lo) || lo < 0xDC00 ||
                lo > 0xDFFF) {
                free(o);
                return jfail(p, at,
                             "the header is not valid JSON (unpaired UTF-16 surrogate escape in a string); the file is "
                             "corrupt.");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
        } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
            free(o);
            return jfail(p, at, "the header is not valid JSON (%s escape in a string); the file is corrupt.",
                         cp ? "unpaired UTF-16 surrogate" : "\\u0000");
        }
        /* an escape is >= 6 bytes and encodes to <= 4: the buffer is large enough */
        if (cp < 0x80)
            o[k++] = (char)cp;
        else if (cp < 0x800) {
            o[k++] = (char)(0xC0 | cp >> 6);
            o[k++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            o[k++] = (char)(0xE0 | cp >> 12);
            o[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        } else {
            o[k++] = (char)(0xF0 | cp >> 18);
            o[k++] = (char)(0x80 | (cp >> 12 & 0x3F));
            o[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    o[k] = 0;
    p->pos = end + 1;
    *out = o;
    return 0;
}

/* Reads a JSON integer in [0, 2^64) at pos; false (pos unspecified) for anything else. */
static bool read_uint(jp *p, uint64_t *v)
{
    skip_ws(p);
    const char *s = p->s;
    uint64_t i = p->pos;
    if (i >= p->n || s[i] < '0' || s[i] > '9' || (s[i] == '0' && i + 1 < p->n && s[i + 1] >= '0' && s[i + 1] <= '9'))
        return false;
    *v = 0;
    for (; i < p->n && s[i] >= '0' && s[i] <= '9'; i++)
        if (!ck_mul_u64(*v, 10, v) || !ck_add_u64(*v, (uint64_t)(s[i] - '0'), v))
            return false;
    if (i < p->n && (s[i] == '.' || s[i] == 'e' || s[i] == 'E'))
        return false;
    p->pos = i;
    return true;
}

/*
 * Reads "[u, ...]" of at most `max` non-negative integers into v; *count gets
 * the number.  Returns 0, -1 (not such an array), -2 (more than max).
 */
static int read_uint_array(jp *p, uint64_t *v, uint32_t max, uint32_t *count)
{
    *count = 0;
    if (!peek(p, '['))
        return -1;
    p->pos++;
    if (peek(p, ']')) {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (*count == max)
            return -2;
        if (!read_uint(p, &v[(*count)++]))
            return -1;
        if (peek(p, ']')) {
            p->pos++;
            return 0;
        }
        if (!peek(p, ','))
            return -1;
        p->pos++;
    }
}

/* Fails for tensor i: "<file>: byte <its key>: tensor "<name>"<msg>". */
__attribute__((format(printf, 3, 4))) static int tfail(jp *p, size_t i, const char *fmt, ...)
{
    char shown[SHOWN], msg[SPILL_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jfail(p, p->koff[i], "tensor \"%s\"%s", show(p->f->tensors[i].name, shown), msg);
}

/* Parses tensor i's object {"dtype": .., "shape": [..], "data_offsets": [B, E]} and checks its size. */
static int parse_tensor(jp *p, size_t i)
{
    st_tensor *t = &p->f->tensors[i];
    if (!peek(p, '{'))
        return tfail(p, i, " is not an object; the file is corrupt.");
    p->pos++;
    bool has_dtype = false, has_shape = false, has_offs = false;
    uint64_t offs[2];
    uint32_t n_offs = 0;
    char shown[SHOWN];
    while (!peek(p, '}')) {
        if ((has_dtype || has_shape || has_offs) && expect(p, ',', "',' or '}' after a tensor field"))
            return -1;
        char *key;
        if (read_string(p, &key, "a field name") || expect(p, ':', "':' after a field name")) {
            free(key);
            return -1;
        }
        bool *seen = !strcmp(key, "dtype")          ? &has_dtype
                     : !strcmp(key, "shape")        ? &has_shape
                     : !strcmp(key, "data_offsets") ? &has_offs
                                                    : NULL;
        if (!seen || *seen) {
            int rc = tfail(p, i,
                           seen ? " has field \"%s\" twice; the file is corrupt."
                                : " has unknown field \"%s\"; the file is corrupt.",
                           show(key, shown));
            free(key);
            return rc;
        }
        *seen = true;
        if (seen == &has_dtype) {
            free(key);
            char *dt;
            if (!peek(p, '"'))
                return tfail(p, i, ": \"dtype\" is missing or not a string; the file is corrupt.");
            if (read_string(p, &dt, "a string"))
                return -1;
            t->dtype = ST_DTYPE_COUNT;
            for (uint32_t d = 0; d < ST_DTYPE_COUNT; d++)
                if (strcmp(dt, DTYPES[d].name) == 0)
                    t->dtype = d;
            if (t->dtype == ST_DTYPE_COUNT) {
                int rc = tfail(p, i, ": dtype \"%s\" is unknown; the file is corrupt or needs a newer spill.",
                               show(dt, shown));
                free(dt);
                return rc;
            }
            free(dt);
        } else if (seen == &has_shape) {
            free(key);
            int rc = read_uint_array(p, t->shape, ST_MAX_DIMS, &t->n_dims);
            if (rc == -2)
                return tfail(p, i, ": shape has more than %d dimensions; the file is corrupt.", ST_MAX_DIMS);
            if (rc)
                return tfail(p, i, ": \"shape\" is not an array of non-negative integers; the file is corrupt.");
        } else {
            free(key);
            if (read_uint_array(p, offs, 2, &n_offs) || n_offs != 2)
                return tfail(p, i,
                             ": \"data_offsets\" is not [BEGIN, END] with non-negative integers; the file is corrupt.");
        }
    }
    p->pos++;
    if (!has_dtype)
        return tfail(p, i, ": \"dtype\" is missing or not a string; the file is corrupt.");
    if (!has_shape)
        return tfail(p, i, ": \"shape\" is missing; the file is corrupt.");
    if (!has_offs)
        return tfail(p, i, ": \"data_offsets\" is missing; the file is corrupt.");
    uint64_t begin = offs[0], end = offs[1], bits = DTYPES[t->dtype].bits;
    if (end < begin)
        return tfail(p, i, ": data_offsets [%llu, %llu] end before they begin; the file is corrupt.",
                     (unsigned long long)begin, (unsigned long long)end);
    bool overflow = false, empty = false;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        overflow |= !ck_mul_u64(bits, t->shape[d], &bits);
        empty |= t->shape[d] == 0;
    }
    if (empty) /* a 0 dim makes the tensor empty whatever the other dims are */
        overflow = false, bits = 0;
    if (overflow)
        return tfail(p, i, ": the %s byte size of its shape overflows 64 bits; the file is corrupt.",
                     DTYPES[t->dtype].name);
    if (bits % 8)
        return tfail(p, i, ": its %s elements do not fill a whole number of bytes; the file is corrupt.",
                     DTYPES[t->dtype].name);
    if (end - begin != bits / 8)
        return tfail(p, i,
                     ": data_offsets [%llu, %llu] hold %llu bytes but its %s shape needs %llu; the file is corrupt.",
                     (unsigned long long)begin, (unsigned long long)end, (unsigned long long)(end - begin),
                     DTYPES[t->dtype].name, (unsigned long long)(bits / 8));
    t->offset = begin; /* relative until the layout is checked */
    t->size = end - begin;
    return 0;
}

static int by_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Parses {"k": "v", ...} into f->meta_keys/meta_vals; `at` is the header position of the key. */
static int parse_metadata(jp *p, uint64_t at)
{
    st_file *f = p->f;
    char shown[SHOWN];
    if (f->meta_keys)
        return jfail(p, at, "\"__metadata__\" appears twice in the header; the file is corrupt.");
    if (!peek(p, '{'))
        return jfail(p, at, "\"__metadata__\" is not an object of strings; the file is corrupt.");
    p->pos++;
    size_t cap = 8;
    f->meta_keys = calloc(cap, sizeof(char *));
    f->meta_vals = calloc(cap, sizeof(char *));
    if (!f->meta_keys || !f->meta_vals)
        return jfail(p, at, "out of memory reading \"__metadata__\"; free memory and retry.");
    while (!peek(p, '}')) {
        if (f->n_meta && expect(p, ',', "',' or '}' in \"__metadata__\""))
            return -1;
        if (f->n_meta == cap) {
            char **k = realloc(f->meta_keys, 2 * cap * sizeof(char *));
            if (k)
                f->meta_keys = k;
            char **v = k ? realloc(f->meta_vals, 2 * cap * sizeof(char *)) : NULL;
            if (v)
                f->meta_vals = v;
            if (!k || !v)
                return jfail(p, at, "out of memory reading \"__metadata__\"; free memory and retry.");
            cap *= 2;
        }
        size_t i = f->n_meta;
        f->meta_vals[i] = NULL;
        if (read_string(p, &f->meta_keys[i], "a string key in \"__metadata__\""))
            return -1;
        f->n_meta++;
        if (expect(p, ':', "':' after a key"))
            return -1;
        if (!peek(p, '"'))
            return jfail(p, at, "\"__metadata__\" value of \"%s\" is not a string; the file is corrupt.",
                         show(f->meta_keys[i], shown));
        if (read_string(p, &f->meta_vals[i], "a string"))
            return -1;
    }
    p->pos++;
    /* duplicate keys: sort a copy of the key pointers */
    char **sorted = malloc((f->n_meta ? f->n_meta : 1) * sizeof(char *));
    if (!sorted)
        return jfail(p, at, "out of memory reading \"__metadata__\"; free memory and retry.");
    memcpy(sorted, f->meta_keys, f->n_meta * sizeof(char *));
    qsort(sorted, f->n_meta, sizeof(char *), by_cstr);
    for (size_t i = 1; i < f->n_meta; i++)
        if (!strcmp(sorted[i - 1], sorted[i])) {
            jfail(p, at, "\"__metadata__\" has key \"%s\" twice; the file is corrupt.", show(sorted[i], shown));
            free(sorted);
            return -1;
        }
    free(sorted);
    return 0;
}

/* Makes room for one more tensor (arrays grow by doubling: bounded by the entries actually present). */
static int grow(jp *p, uint64_t at)
{
    st_file *f = p->f;
    if (f->n_tensors == MAX_TENSORS)
        return jfail(p, at, "the header lists more than %u tensors; the file is corrupt.", MAX_TENSORS);
    if (f->n_tensors < p->cap)
        return 0;
    size_t cap = p->cap ? 2 * p->cap : 64;
    st_tensor *t = realloc(f->tensors, cap * sizeof *t);
    if (t)
        f->tensors = t;
    uint64_t *k = t ? realloc(p->koff, cap * sizeof *k) : NULL;
    if (k)
        p->koff = k;
    if (!t || !k)
        return jfail(p, at, "out of memory for %zu tensors; free memory and retry.", cap);
    memset(f->tensors + p->cap, 0, (cap - p->cap) * sizeof *t);
    p->cap = cap;
    return 0;
}

/* Sort orders over (tensor, index) pairs: the index keeps the key offsets reachable. */
typedef struct ord {
    const st_tensor *t;
    size_t i;
} ord;

static int ord_by_name(const void *a, const void *b)
{
    const ord *x = a, *y = b;
    int c = strcmp(x->t->name, y->t->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static int ord_by_offset(const void *a, const void *b)
{
    const st_tensor *x = ((const ord *)a)->t, *y = ((const ord *)b)->t;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return ord_by_name(a, b);
}

/*
 * Rejects duplicate names, checks that the tensors sorted by offset tile the
 * data buffer exactly, then stores them in that order with absolute offsets.
 */
static int check_layout(jp *p)
{
    st_file *f = p->f;
    size_t n = f->n_tensors;
    ord *o = malloc((n ? n : 1) * sizeof *o);
    st_tensor *sorted = malloc((n ? n : 1) * sizeof *sorted);
    char shown[SHOWN];
    int rc = -1;
    if (!o || !sorted) {
        jfail(p, 0, "out of memory sorting %zu tensors; free memory and retry.", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        o[i] = (ord){&f->tensors[i], i};
    qsort(o, n, sizeof *o, ord_by_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(o[i - 1].t->name, o[i].t->name)) {
            tfail(p, o[i].i, " appears twice in the header; the file is corrupt.");
            goto out;
        }
    qsort(o, n, sizeof *o, ord_by_offset);
    uint64_t pos = 0, buf = f->file_size - 8 - p->n;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = o[i].t;
        if (t->offset != pos && i == 0) {
            tfail(p, o[i].i,
                  ": data begins at buffer offset %llu, which leaves a gap at the start of the data buffer; "
                  "the file is corrupt.",
                  (unsigned long long)t->offset);
            goto out;
        }
        if (t->offset != pos) {
            tfail(p, o[i].i,
                  ": data begins at buffer offset %llu but the previous tensor \"%s\" ends at %llu, %s; the "
                  "file is corrupt.",
                  (unsigned long long)t->offset, show(o[i - 1].t->name, shown), (unsigned long long)pos,
                  t->offset > pos ? "leaving a gap" : "so they overlap");
            goto out;
        }
        pos += t->size; /* cannot overflow: pos == BEGIN and BEGIN + size == END */
    }
    if (pos != buf) {
        jfail(p, p->n, "the tensors cover %llu bytes but the data buffer holds %llu; the file is %s.",
              (unsigned long long)pos, (unsigned long long)buf,
              pos > buf ? "truncated" : "corrupt (trailing bytes after the last tensor)");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        sorted[i] = *o[i].t;
        sorted[i].offset += 8 + p->n;
    }
    if (n)
        memcpy(f->tensors, sorted, n * sizeof *sorted);
    rc = 0;
out:
    free(o);
    free(sorted);
    return rc;
}

/* The top level: {"name": tensor | "__metadata__": {..}, ...} then only whitespace. */
static int parse_root(jp *p)
{
    st_file *f = p->f;
    p->pos = 1; /* the caller checked the '{' */
    while (!peek(p, '}')) {
        if ((f->n_tensors || f->meta_keys) && expect(p, ',', "',' or '}' after an entry"))
            return -1;
        skip_ws(p);
        uint64_t at = p->pos;
        char *key;
        if (read_string(p, &key, "a string key"))
            return -1;
        if (expect(p, ':', "':' after a key")) {
            free(key);
            return -1;
        }
        if (!strcmp(key, "__metadata__")) {
            free(key);
            if (parse_metadata(p, at))
                return -1;
            continue;
        }
        if (grow(p, at)) {
            free(key);
            return -1;
        }
        size_t i = f->n_tensors++;
        memset(&f->tensors[i], 0, sizeof f->tensors[i]);
        f->tensors[i].name = key;
        p->koff[i] = at;
        if (parse_tensor(p, i))
            return -1;
    }
    p->pos++;
    skip_ws(p);
    if (p->pos < p->n)
        return syntax(p, "only spaces after the closing '}'");
    return check_layout(p);
}

int st_parse_header(const char *json, uint64_t n, uint64_t file_size, const char *name, st_file **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name))) {
        free(f);
        return util_errf(err, errlen, "%s: out of memory reading the header; free memory and retry.", name);
    }
    f->file_size = file_size;
    f->header_len = n;
    jp p = {.s = json, .n = n, .f = f, .err = err, .errlen = errlen};
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
    if (parse_root(&p))
        goto out_fail;
    free(p.koff);
    *out = f;
    return 0;

out_fail:
    free(p.koff);
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

static void shape_str(const st_tensor *t, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && o < cap; d++)
        o += (size_t)snprintf(out + o, cap - o, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (o < cap)
        snprintf(out + o, cap - o, "]");
}

int st_model_fp8_scale(const st_model *m, const st_tensor *w, const char *where, const st_tensor **scale,
                       enum st_scale_kind *kind, char *err, size_t errlen)
{
    char n1[512], n2[512], sh[160];
    snprintf(n1, sizeof n1, "%s_scale", w->name);
    snprintf(n2, sizeof n2, "%s_scale_inv", w->name);
    const st_tensor *a = st_model_find(m, n1), *b = st_model_find(m, n2);
    if (w->n_dims != 2)
        return util_errf(err, errlen, "%s: F8_E4M3 tensor %s has %u dimensions; spill reads fp8 matrices of 2.", where,
                         w->name, w->n_dims);
    uint64_t N = w->shape[0], K = w->shape[1];
    if (!a && !b)
        return util_errf(err, errlen,
                         "%s: F8_E4M3 weight %s has no %s or %s tensor; spill needs the scales an fp8 checkpoint "
                         "ships beside its weights.",
                         where, w->name, n1, n2);
    if (a && b)
        return util_errf(err, errlen, "%s: F8_E4M3 weight %s has both %s and %s; keep the one its quantizer wrote.",
                         where, w->name, n1, n2);
    const st_tensor *s = a ? a : b;
    shape_str(s, sh, sizeof sh);
    if (s->dtype != ST_F32 && s->dtype != ST_BF16 && s->dtype != ST_F16)
        return util_errf(err, errlen, "%s: scale %s is %s; fp8 scales must be F32, BF16 or F16.", where, s->name,
                         st_dtype_name(s->dtype));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < s->n_dims; d++)
        numel *= s->shape[d];
    if (a) {
        bool one = numel == 1 && s->n_dims <= 2;
        bool row = N > 1 && ((s->n_dims == 1 && s->shape[0] == N) ||
                             (s->n_dims == 2 && s->shape[0] == N && s->shape[1] == 1));
        if (!one && !row)
            return util_errf(err, errlen,
                             "%s: scale %s has shape %s; for the weight's [%llu, %llu] it must hold 1 value (per "
                             "tensor) or [%llu] / [%llu, 1] (per row).",
                             where, s->name, sh, (unsigned long long)N, (unsigned long long)K, (unsigned long long)N,
                             (unsigned long long)N);
        *kind = one ? ST_SCALE_TENSOR : ST_SCALE_ROW;
    } else {
        uint64_t bn = (N + 127) / 128, bk = (K + 127) / 128;
        if (s->n_dims != 2 || s->shape[0] != bn || s->shape[1] != bk)
            return util_errf(err, errlen,
                             "%s: scale %s has shape %s; for the weight's [%llu, %llu] in 128x128 blocks it must be "
                             "[%llu, %llu].",
                             where, s->name, sh, (unsigned long long)N, (unsigned long long)K, (unsigned long long)bn,
                             (unsigned long long)bk);
        *kind = ST_SCALE_BLOCK128;
    }
    *scale = s;
    return 0;
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
