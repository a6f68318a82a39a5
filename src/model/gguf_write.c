/*
 * gguf_write.c — GGUF v3 writer (see gguf_write.h for the layout).
 *
 * Owns: serializing key/values and tensor infos, the tensor layout (offsets
 * padded to the alignment, in declaration order, exactly the rule gguf.c and
 * ggml check on reading), and the output file's life: temporary file, large
 * aligned writes, header last, fsync + rename + directory fsync.
 * Does not own: what the tensors contain (synth.c, pack.c) or which keys a
 * model needs (the callers, following model.c's open_gguf).
 *
 * Key decision: key/values are serialized as they are added into one growing
 * byte buffer; tensor infos are kept as structs because their type and
 * offset may change until the header is written (pack.c picks Q4_0 or Q4_1
 * per tensor after measuring both).  The header size is fixed by names and
 * ranks alone, so data can be streamed before the header exists.
 */
#include "gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/util.h"

#define DIO_ALIGN 4096u /* O_DIRECT needs 4096-aligned offset, length and buffer */

typedef struct wtensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t bytes;
} wtensor;

struct gguf_w {
    uint32_t alignment;
    uint8_t *kv; /* serialized key/values */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;        /* (n_kv) for duplicate checks */
    size_t *val_off;    /* (n_kv) offset of each value in kv, for gguf_w_patch_u32 */
    uint32_t *val_type; /* (n_kv) */
    wtensor *t;
    uint64_t n_t, t_cap;
};

/* ---------------------------------------------------------------- bytes */

static int kv_grow(gguf_w *w, size_t n)
{
    size_t need;
    if (!ck_add_size(w->kv_len, n, &need))
        return -1;
    if (need <= w->kv_cap)
        return 0;
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < need)
        if (!ck_mul_size(cap, 2, &cap))
            return -1;
    uint8_t *p = realloc(w->kv, cap);
    if (!p)
        return -1;
    w->kv = p;
    w->kv_cap = cap;
    return 0;
}

static int put(gguf_w *w, const void *p, size_t n)
{
    if (kv_grow(w, n))
        return -1;
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_u32(gguf_w *w, uint32_t v)
{
    return put(w, &v, 4);
} /* x86/ARM little-endian hosts only */
static int put_u64(gguf_w *w, uint64_t v)
{
    return put(w, &v, 8);
}
static int put_str(gguf_w *w, const char *s, size_t n)
{
    return put_u64(w, n) || put(w, s, n);
}

static uint32_t vsize(uint32_t t)
{
    static const uint8_t sz[] = {
        [GGUF_V_U8] = 1,  [GGUF_V_I8] = 1,   [GGUF_V_U16] = 2, [GGUF_V_I16] = 2, [GGUF_V_U32] = 4, [GGUF_V_I32] = 4,
        [GGUF_V_F32] = 4, [GGUF_V_BOOL] = 1, [GGUF_V_U64] = 8, [GGUF_V_I64] = 8, [GGUF_V_F64] = 8};
    return t < sizeof sz ? sz[t] : 0;
}

/* Starts a key/value: checks the key, records it, writes key + type. */
static int kv_begin(gguf_w *w, const char *key, uint32_t type, char *err, size_t errlen)
{
    size_t kl = strlen(key);
    if (kl == 0 || kl > 65535)
        return util_errf(err, errlen, "GGUF writer: key '%.40s' must be 1..65535 bytes.", key);
    if (gguf_w_has(w, key))
        return util_errf(err, errlen, "GGUF writer: key %s was added twice.", key);
    char **k = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *k);
    if (k)
        w->keys = k;
    size_t *vo = realloc(w->val_off, (size_t)(w->n_kv + 1) * sizeof *vo);
    if (vo)
        w->val_off = vo;
    uint32_t *vt = realloc(w->val_type, (size_t)(w->n_kv + 1) * sizeof *vt);
    if (vt)
        w->val_type = vt;
    if (!k || !vo || !vt)
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    if (!(k[w->n_kv] = strdup(key)))
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    w->n_kv++;
    if (put_str(w, key, kl) || put_u32(w, type))
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    w->val_off[w->n_kv - 1] = w->kv_len;
    w->val_type[w->n_kv - 1] = type;
    return 0;
}

static int kv_scalar(gguf_w *w, const char *key, uint32_t type, const void *v, char *err, size_t errlen)
{
    if (kv_begin(w, key, type, err, errlen))
        return -1;
    if (put(w, v, vsize(type)))
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    return 0;
}

/* ---------------------------------------------------------------- header */

int gguf_w_new(uint32_t alignment, gguf_w **out, char *err, size_t errlen)
{
    *out = NULL;
    if (alignment < 32 || (alignment & (alignment - 1)))
        return util_errf(err, errlen, "GGUF writer: alignment %u must be a power of two of at least 32.", alignment);
    gguf_w *w = calloc(1, sizeof *w);
    if (!w)
        return util_errf(err, errlen, "GGUF writer: out of memory.");
    w->alignment = alignment;
    if (gguf_w_u32(w, "general.alignment", alignment, err, errlen)) {
        gguf_w_free(w);
        return -1;
    }
    *out = w;
    return 0;
}

void gguf_w_free(gguf_w *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    free(w->val_off);
    free(w->val_type);
    free(w->kv);
    free(w->t);
    free(w);
}

bool gguf_w_has(const gguf_w *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return true;
    return false;
}

int gguf_w_u32(gguf_w *w, const char *key, uint32_t v, char *err, size_t errlen)
{
    return kv_scalar(w, key, GGUF_V_U32, &v, err, errlen);
}
int gguf_w_patch_u32(gguf_w *w, const char *key, uint32_t v)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) {
            if (w->val_type[i] != GGUF_V_U32)
                return -1;
            memcpy(w->kv + w->val_off[i], &v, 4);
            return 0;
        }
    return -1;
}

int gguf_w_i32(gguf_w *w, const char *key, int32_t v, char *err, size_t errlen)
{
    return kv_scalar(w, key, GGUF_V_I32, &v, err, errlen);
}
int gguf_w_u64(gguf_w *w, const char *key, uint64_t v, char *err, size_t errlen)
{
    return kv_scalar(w, key, GGUF_V_U64, &v, err, errlen);
}
int gguf_w_f32(gguf_w *w, const char *key, float v, char *err, size_t errlen)
{
    return kv_scalar(w, key, GGUF_V_F32, &v, err, errlen);
}
int gguf_w_bool(gguf_w *w, const char *key, bool v, char *err, size_t errlen)
{
    uint8_t b = v;
    return kv_scalar(w, key, GGUF_V_BOOL, &b, err, errlen);
}

int gguf_w_str(gguf_w *w, const char *key, const char *s, size_t len, char *err, size_t errlen)
{
    if (kv_begin(w, key, GGUF_V_STRING, err, errlen))
        return -1;
    if (put_str(w, s, len))
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    return 0;
}

int gguf_w_arr_str(gguf_w *w, const char *key, const char *const *strs, const size_t *lens, uint64_t n, char *err,
                   size_t errlen)
{
    if (kv_begin(w, key, GGUF_V_ARRAY, err, errlen))
        return -1;
    if (put_u32(w, GGUF_V_STRING) || put_u64(w, n))
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    for (uint64_t i = 0; i < n; i++)
        if (put_str(w, strs[i], lens ? lens[i] : strlen(strs[i])))
            return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    return 0;
}

int gguf_w_arr_num(gguf_w *w, const char *key, uint32_t elem, const void *data, uint64_t n, char *err, size_t errlen)
{
    uint64_t bytes;
    if (!vsize(elem) || !ck_mul_u64(n, vsize(elem), &bytes) || bytes > SIZE_MAX)
        return util_errf(err, errlen, "GGUF writer: key %s: bad array element type %u or count.", key, elem);
    if (kv_begin(w, key, GGUF_V_ARRAY, err, errlen))
        return -1;
    if (put_u32(w, elem) || put_u64(w, n) || put(w, data, (size_t)bytes))
        return util_errf(err, errlen, "GGUF writer: out of memory adding key %s.", key);
    return 0;
}

int gguf_w_copy_kv(gguf_w *w, const gguf_file *src, const gguf_kv *kv, char *err, size_t errlen)
{
    if (kv->type == GGUF_V_STRING)
        return gguf_w_str(w, kv->key, kv->v.s.p, (size_t)kv->v.s.len, err, errlen);
    if (kv->type != GGUF_V_ARRAY) {
        uint32_t sz = vsize(kv->type);
        if (!sz)
            return util_errf(err, errlen, "%s: key %s has value type %u, which the writer cannot copy.", src->path,
                             kv->key, kv->type);
        /* v holds the value widened: u for unsigned/bool, i for signed, f for floats */
        uint8_t b[8];
        switch (kv->type) {
        case GGUF_V_F32: {
            float f = (float)kv->v.f;
            memcpy(b, &f, 4);
            break;
        }
        case GGUF_V_F64:
            memcpy(b, &kv->v.f, 8);
            break;
        case GGUF_V_I8:
        case GGUF_V_I16:
        case GGUF_V_I32:
        case GGUF_V_I64:
            memcpy(b, &kv->v.i, sz); /* little-endian: the low bytes of the widened value */
            break;
        default:
            memcpy(b, &kv->v.u, sz);
        }
        return kv_scalar(w, kv->key, kv->type, b, err, errlen);
    }
    if (kv->arr_type != GGUF_V_STRING)
        return gguf_w_arr_num(w, kv->key, kv->arr_type, kv->arr_data, kv->arr_n, err, errlen);
    if (kv_begin(w, kv->key, GGUF_V_ARRAY, err, errlen))
        return -1;
    if (put_u32(w, GGUF_V_STRING) || put_u64(w, kv->arr_n))
        return util_errf(err, errlen, "GGUF writer: out of memory copying key %s.", kv->key);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        size_t len;
        const char *s = gguf_arr_str(src, kv, i, &len);
        if (!s || put_str(w, s, len))
            return util_errf(err, errlen, "GGUF writer: out of memory copying key %s.", kv->key);
    }
    return 0;
}

static int tensor_bytes(const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t *bytes,
                        char *err, size_t errlen)
{
    const char *tn;
    uint32_t be, bb;
    if (!ggml_type_info(type, &tn, &be, &bb))
        return util_errf(err, errlen, "GGUF writer: tensor %s: type %u is not a ggml type.", name, type);
    if (n_dims < 1 || n_dims > 4)
        return util_errf(err, errlen, "GGUF writer: tensor %s: %u dimensions (1..4 allowed).", name, n_dims);
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] == 0 || !ck_mul_u64(n, ne[d], &n))
            return util_errf(err, errlen, "GGUF writer: tensor %s: dimension %u is zero or the size overflows.", name,
                             d);
    if (ne[0] % be)
        return util_errf(err, errlen, "GGUF writer: tensor %s: %llu columns are not a whole number of %s blocks of %u.",
                         name, (unsigned long long)ne[0], tn, be);
    uint64_t extra; /* a row header (GGML_F8_E4M3_ROW's scale) per row of ne[0] elements */
    if (!ck_mul_u64(n / be, bb, bytes) || !ck_mul_u64(n / ne[0], ggml_type_row_extra(type), &extra) ||
        !ck_add_u64(*bytes, extra, bytes))
        return util_errf(err, errlen, "GGUF writer: tensor %s: size overflows.", name);
    return 0;
}

int gguf_w_tensor(gguf_w *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, char *err,
                  size_t errlen)
{
    size_t nl = strlen(name);
    if (nl == 0 || nl > 63)
        return util_errf(err, errlen, "GGUF writer: tensor name '%.63s' must be 1..63 bytes.", name);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return util_errf(err, errlen, "GGUF writer: tensor %s was declared twice.", name);
    if (w->n_t >= INT32_MAX)
        return util_errf(err, errlen, "GGUF writer: too many tensors.");
    wtensor t = {0};
    memcpy(t.name, name, nl + 1);
    t.n_dims = n_dims;
    for (int d = 0; d < 4; d++)
        t.ne[d] = d < (int)n_dims ? ne[d] : 1;
    t.type = type;
    if (tensor_bytes(name, n_dims, t.ne, type, &t.bytes, err, errlen))
        return -1;
    if (w->n_t == w->t_cap) {
        uint64_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *p = realloc(w->t, (size_t)cap * sizeof *p);
        if (!p)
            return util_errf(err, errlen, "GGUF writer: out of memory declaring tensor %s.", name);
        w->t = p;
        w->t_cap = cap;
    }
    w->t[w->n_t] = t;
    return (int)w->n_t++;
}

int gguf_w_set_type(gguf_w *w, int i, uint32_t type, char *err, size_t errlen)
{
    wtensor *t = &w->t[i];
    uint64_t b;
    if (tensor_bytes(t->name, t->n_dims, t->ne, type, &b, err, errlen))
        return -1;
    t->type = type;
    t->bytes = b;
    return 0;
}

uint64_t gguf_w_n_tensors(const gguf_w *w)
{
    return w->n_t;
}
uint64_t gguf_w_tensor_bytes(const gguf_w *w, int i)
{
    return w->t[i].bytes;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static uint64_t header_bytes(const gguf_w *w)
{
    uint64_t n = 24 + w->kv_len;
    for (uint64_t i = 0; i < w->n_t; i++)
        n += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 4 + 8;
    return n;
}

uint64_t gguf_w_data_start(const gguf_w *w)
{
    /* ggml's rule: the data section starts at the header's end rounded up to
     * general.alignment (with alignment 4096 this is also O_DIRECT-aligned) */
    return align_up(header_bytes(w), w->alignment);
}

uint64_t gguf_w_tensor_offset(const gguf_w *w, int i)
{
    uint64_t off = gguf_w_data_start(w);
    for (int k = 0; k < i; k++)
        off += align_up(w->t[k].bytes, w->alignment);
    return off;
}

uint64_t gguf_w_file_size(const gguf_w *w)
{
    return gguf_w_tensor_offset(w, (int)w->n_t);
}

int gguf_w_header(const gguf_w *w, uint8_t **buf, size_t *len, char *err, size_t errlen)
{
    uint64_t ds = gguf_w_data_start(w);
    size_t cap = (size_t)align_up(ds, DIO_ALIGN);
    uint8_t *b = aligned_alloc(DIO_ALIGN, cap);
    if (!b)
        return util_errf(err, errlen, "GGUF writer: out of memory for a %zu-byte header.", cap);
    memset(b, 0, cap);
    uint8_t *p = b;
#define PUT(src, n) (memcpy(p, (src), (n)), p += (n))
    uint32_t magic = 0x46554747u, version = 3; /* "GGUF" read as a little-endian u32 */
    uint64_t nt = w->n_t, nkv = w->n_kv;
    PUT(&magic, 4);
    PUT(&version, 4);
    PUT(&nt, 8);
    PUT(&nkv, 8);
    PUT(w->kv, w->kv_len);
    uint64_t rel = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        PUT(&nl, 8);
        PUT(t->name, nl);
        PUT(&t->n_dims, 4);
        PUT(t->ne, 8 * t->n_dims);
        PUT(&t->type, 4);
        PUT(&rel, 8);
        rel += align_up(t->bytes, w->alignment);
    }
#undef PUT
    *buf = b;
    *len = (size_t)ds;
    return 0;
}

/* ---------------------------------------------------------------- output file */

static int pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off, uint64_t *bad_off);

static int write_all(int fd, const uint8_t *p, size_t n, uint64_t off, const char *path, char *err, size_t errlen)
{
    uint64_t bad = 0;
    int e = pwrite_all(fd, p, n, off, &bad);
    if (e)
        return util_errf(err, errlen, "%s: write failed at byte %llu: %s; check free space.", path,
                         (unsigned long long)bad, strerror(e));
    return 0;
}

/* The background writer.  Ownership: while a job is in flight the writer
 * reads `job` and the caller owns o->buf; when idle, the second buffer sits in
 * `spare`.  Only whole 4096-byte blocks are handed over, so O_DIRECT offsets
 * and lengths stay aligned. */
struct gguf_out_bg {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *spare;
    const uint8_t *job; /* NULL when idle */
    size_t job_n;
    uint64_t job_off;
    bool stop;
    int err_no; /* first failed write: errno (EIO for no progress) and offset */
    uint64_t err_off;
};

static int pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off, uint64_t *bad_off)
{
    while (n) {
        ssize_t r = pwrite(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            *bad_off = off;
            return r < 0 ? errno : EIO;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static void *bg_main(void *arg)
{
    gguf_out *o = arg;
    struct gguf_out_bg *b = o->bg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->job && !b->stop)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->job)
            break;
        const uint8_t *p = b->job;
        size_t n = b->job_n;
        uint64_t off = b->job_off, bad = 0;
        pthread_mutex_unlock(&b->mu);
        int e = pwrite_all(o->fd, p, n, off, &bad);
        pthread_mutex_lock(&b->mu);
        if (e && !b->err_no)
            b->err_no = e, b->err_off = bad;
        b->spare = (uint8_t *)p;
        b->job = NULL;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Waits until the writer is idle; returns its first error, if any. */
static int bg_idle(gguf_out *o, char *err, size_t errlen)
{
    struct gguf_out_bg *b = o->bg;
    if (!b)
        return 0;
    pthread_mutex_lock(&b->mu);
    while (b->job)
        pthread_cond_wait(&b->cv, &b->mu);
    int e = b->err_no;
    uint64_t off = b->err_off;
    pthread_mutex_unlock(&b->mu);
    if (e)
        return util_errf(err, errlen, "%s: write failed at byte %llu: %s; check free space.", o->tmp,
                         (unsigned long long)off, strerror(e));
    return 0;
}

static void bg_stop(gguf_out *o)
{
    struct gguf_out_bg *b = o->bg;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->th, NULL); /* an in-flight write completes first */
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b->spare);
    free(b);
    o->bg = NULL;
}

/* Writes the buffer's whole DIO_ALIGN blocks (everything when `all`), keeping
 * the tail.  Partial flushes go to the background writer; the final one
 * drains it and writes synchronously. */
static int flush(gguf_out *o, bool all, char *err, size_t errlen)
{
    size_t n = all ? o->fill : o->fill / DIO_ALIGN * DIO_ALIGN;
    if (bg_idle(o, err, errlen))
        return -1;
    if (n == 0)
        return 0;
    if (!all && o->bg) {
        struct gguf_out_bg *b = o->bg;
        uint8_t *next = b->spare;
        memcpy(next, o->buf + n, o->fill - n);
        pthread_mutex_lock(&b->mu);
        b->job = o->buf, b->job_n = n, b->job_off = o->pos, b->spare = NULL;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        o->buf = next;
    } else {
        if (o->direct && n % DIO_ALIGN) {
            /* the file's last partial block: O_DIRECT cannot write it, so finish buffered */
            int fl = fcntl(o->fd, F_GETFL);
            if (fl < 0 || fcntl(o->fd, F_SETFL, fl & ~O_DIRECT) < 0)
                return util_errf(err, errlen, "%s: cannot leave O_DIRECT mode: %s.", o->tmp, strerror(errno));
            o->direct = false;
        }
        if (write_all(o->fd, o->buf, n, o->pos, o->tmp, err, errlen))
            return -1;
        memmove(o->buf, o->buf + n, o->fill - n);
    }
    o->written += n;
    o->pos += n;
    o->fill -= n;
    return 0;
}

int gguf_out_open(gguf_out *o, const char *path, uint64_t data_start, size_t buf_bytes, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    size_t pl = strlen(path);
    o->path = strdup(path);
    o->tmp = malloc(pl + 5);
    buf_bytes = buf_bytes < (1u << 20) ? (1u << 20) : buf_bytes / DIO_ALIGN * DIO_ALIGN;
    o->buf = aligned_alloc(DIO_ALIGN, buf_bytes);
    if (!o->path || !o->tmp || !o->buf) {
        gguf_out_abort(o);
        return util_errf(err, errlen, "%s: out of memory for the write buffer.", path);
    }
    memcpy(o->tmp, path, pl);
    memcpy(o->tmp + pl, ".tmp", 5);
    o->cap = buf_bytes;
    o->pos = data_start;
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (data_start % DIO_ALIGN == 0) {
        o->fd = open(o->tmp, flags | O_DIRECT, 0644);
        o->direct = o->fd >= 0;
    }
    if (o->fd < 0)
        o->fd = open(o->tmp, flags, 0644); /* tmpfs and some network file systems refuse O_DIRECT */
    if (o->fd < 0) {
        int e = errno;
        gguf_out_abort(o);
        return util_errf(err, errlen, "%s: cannot create %s: %s.", path, path, strerror(e));
    }
    /* the background writer is an optimisation: without it (no memory, no thread) writes are synchronous */
    struct gguf_out_bg *b = calloc(1, sizeof *b);
    if (b && (b->spare = aligned_alloc(DIO_ALIGN, buf_bytes)) != NULL) {
        pthread_mutex_init(&b->mu, NULL);
        pthread_cond_init(&b->cv, NULL);
        o->bg = b;
        if (pthread_create(&b->th, NULL, bg_main, o) == 0)
            return 0;
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->cv);
        o->bg = NULL;
    }
    if (b)
        free(b->spare);
    free(b);
    return 0;
}

int gguf_out_reserve(gguf_out *o, size_t n, uint8_t **p, char *err, size_t errlen)
{
    if (n > o->cap - DIO_ALIGN)
        return util_errf(err, errlen, "%s: internal: a write of %zu bytes exceeds the buffer.", o->path, n);
    if (o->fill + n > o->cap && flush(o, false, err, errlen))
        return -1;
    *p = o->buf + o->fill;
    return 0;
}

void gguf_out_commit(gguf_out *o, size_t n)
{
    o->fill += n;
}

int gguf_out_write(gguf_out *o, const void *p, size_t n, char *err, size_t errlen)
{
    const uint8_t *s = p;
    while (n) {
        size_t room = o->cap - o->fill;
        if (room == 0) {
            if (flush(o, false, err, errlen))
                return -1;
            continue;
        }
        size_t k = n < room ? n : room;
        memcpy(o->buf + o->fill, s, k);
        o->fill += k;
        s += k;
        n -= k;
    }
    return 0;
}

int gguf_out_skip(gguf_out *o, uint64_t n, char *err, size_t errlen)
{
    if (flush(o, true, err, errlen)) /* everything before the hole is handed to the file */
        return -1;
    o->pos += n;
    return 0;
}

uint64_t gguf_out_pos(const gguf_out *o)
{
    return o->pos + o->fill;
}

int gguf_out_pad(gguf_out *o, uint64_t alignment, char *err, size_t errlen)
{
    static const uint8_t zeros[4096];
    uint64_t pad = align_up(gguf_out_pos(o), alignment) - gguf_out_pos(o);
    while (pad) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        if (gguf_out_write(o, zeros, k, err, errlen))
            return -1;
        pad -= k;
    }
    return 0;
}

static int fsync_dir(const char *path, char *err, size_t errlen)
{
    char *d = strdup(path);
    if (!d)
        return util_errf(err, errlen, "%s: out of memory.", path);
    int fd = open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (fd < 0 || fsync(fd) != 0)
        rc = util_errf(err, errlen, "%s: cannot fsync the directory: %s.", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(d);
    return rc;
}

int gguf_out_finish(gguf_out *o, const gguf_w *w, char *err, size_t errlen)
{
    uint8_t *hdr = NULL;
    size_t hl = 0;
    int rc = -1;
    if (gguf_out_pos(o) != gguf_w_file_size(w)) {
        util_errf(err, errlen, "%s: internal: %llu bytes of data written but the layout needs %llu.", o->path,
                  (unsigned long long)gguf_out_pos(o), (unsigned long long)gguf_w_file_size(w));
        goto out;
    }
    if (flush(o, true, err, errlen) || gguf_w_header(w, &hdr, &hl, err, errlen))
        goto out;
    bg_stop(o);
    /* the header region is 4096-aligned in memory, starts at 0 and ends at the data start */
    if (o->direct && hl % DIO_ALIGN) {
        int fl = fcntl(o->fd, F_GETFL);
        if (fl >= 0)
            fcntl(o->fd, F_SETFL, fl & ~O_DIRECT);
    }
    if (write_all(o->fd, hdr, hl, 0, o->tmp, err, errlen))
        goto out;
    o->written += hl;
    /* a file that ends in a hole (gguf_out_skip) gets its length here */
    if (ftruncate(o->fd, (off_t)gguf_w_file_size(w)) != 0) {
        util_errf(err, errlen, "%s: cannot set the file size: %s.", o->tmp, strerror(errno));
        goto out;
    }
    if (fsync(o->fd) != 0) {
        util_errf(err, errlen, "%s: fsync failed: %s.", o->tmp, strerror(errno));
        goto out;
    }
    close(o->fd);
    o->fd = -1;
    if (rename(o->tmp, o->path) != 0) {
        util_errf(err, errlen, "%s: cannot rename %s into place: %s.", o->path, o->tmp, strerror(errno));
        goto out;
    }
    if (fsync_dir(o->path, err, errlen))
        goto out;
    rc = 0;
out:
    free(hdr);
    if (rc)
        gguf_out_abort(o);
    else {
        bg_stop(o);
        free(o->buf), free(o->path), free(o->tmp);
        o->buf = NULL, o->path = o->tmp = NULL;
    }
    return rc;
}

void gguf_out_abort(gguf_out *o)
{
    if (!o->path && !o->tmp && !o->buf)
        return; /* never opened, or already finished */
    bg_stop(o);
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
    if (o->tmp)
        unlink(o->tmp);
    free(o->buf), free(o->path), free(o->tmp);
    o->buf = NULL, o->path = o->tmp = NULL;
}
