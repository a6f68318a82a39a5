/*
 * npy.c — float16 .npy files of one row's logits (see npy.h).  NumPy's format 1.0 by hand: the magic
 * "\x93NUMPY", version 1.0, a little-endian u16 header length, then a Python dict literal padded with spaces
 * and ended by '\n' so that the data starts at a multiple of 64 bytes (here 128).
 */
#include "npy.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/util.h"

uint16_t npy_f16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t sign = (b >> 16) & 0x8000u, e = (b >> 23) & 0xFFu, man = b & 0x7FFFFFu;
    if (e == 0xFF) /* inf, NaN (kept a NaN: a quiet bit set) */
        return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0));
    int32_t ex = (int32_t)e - 127 + 15;
    if (ex >= 31)
        return (uint16_t)(sign | 0x7C00u);
    if (ex <= 0) { /* subnormal half, or zero */
        if (ex < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - ex);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)ex << 10) | (man >> 13), rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is right, up to inf */
    return (uint16_t)(sign | h);
}

void npy_safe_name(const char *id, char *out, size_t cap)
{
    size_t n = strlen(id), o = 0;
    bool changed = n > 120 || n == 0;
    for (size_t i = 0; i < n && i < 120 && o + 1 < cap; i++) {
        char c = id[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                  c == '_' || (c == '.' && i > 0);
        out[o++] = ok ? c : '_';
        changed |= !ok;
    }
    out[o] = 0;
    if (changed) {
        char h[65];
        util_sha256_hex(id, n, h);
        snprintf(out + o, cap - o, "-%.16s", h);
    }
}

uint64_t npy_bytes(int64_t n_rows, int32_t vocab)
{
    return NPY_HEADER_BYTES + (uint64_t)n_rows * (uint64_t)vocab * 2;
}

int npy_open(npy_rows *f, const char *dir, const char *name, int32_t vocab, char *err, size_t errlen)
{
    f->fd = -1;
    f->vocab = vocab;
    f->n_rows = 0;
    f->buf = NULL;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return util_errf(err, errlen, "%s: cannot create the logits directory: %s.", dir, strerror(errno));
    char part[4200];
    if (util_pathf(f->path, sizeof f->path, "%s/%s.npy", dir, name) ||
        util_pathf(part, sizeof part, "%s.part", f->path))
        return util_errf(err, errlen, "%s/%s.npy: the path is too long.", dir, name);
    f->buf = malloc((size_t)vocab * 2);
    if (!f->buf)
        return util_errf(err, errlen, "out of memory for a logits row of %d.", vocab);
    f->fd = open(part, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        free(f->buf), f->buf = NULL;
        return util_errf(err, errlen, "%s: cannot create: %s.", part, strerror(errno));
    }
    return 0;
}

static int pwrite_all(int fd, const void *p, size_t n, off_t off)
{
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w, n -= (size_t)w, off += w;
    }
    return 0;
}

int npy_write_row(npy_rows *f, int32_t index, const float *logits, char *err, size_t errlen)
{
    for (int32_t i = 0; i < f->vocab; i++)
        f->buf[i] = npy_f16(logits[i]); /* little-endian host (x86-64, aarch64) */
    off_t off = (off_t)npy_bytes(index, f->vocab);
    if (pwrite_all(f->fd, f->buf, (size_t)f->vocab * 2, off))
        return util_errf(err, errlen, "%s.part: cannot write logits row %d: %s.", f->path, index, strerror(errno));
    if (index + 1 > f->n_rows)
        f->n_rows = index + 1;
    return 0;
}

int npy_finish(npy_rows *f, int32_t n_rows, char *err, size_t errlen)
{
    char h[NPY_HEADER_BYTES];
    memset(h, ' ', sizeof h);
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    uint16_t hl = NPY_HEADER_BYTES - 10;
    h[8] = (char)(hl & 0xFF), h[9] = (char)(hl >> 8);
    int dl = snprintf(h + 10, sizeof h - 10, "{'descr': '<f2', 'fortran_order': False, 'shape': (%d, %d), }", n_rows,
                      f->vocab);
    h[10 + dl] = ' ';
    h[NPY_HEADER_BYTES - 1] = '\n';
    char part[4200];
    snprintf(part, sizeof part, "%s.part", f->path);
    int rc = 0;
    if (pwrite_all(f->fd, h, sizeof h, 0) || ftruncate(f->fd, (off_t)npy_bytes(n_rows, f->vocab)) || fsync(f->fd))
        rc = util_errf(err, errlen, "%s: cannot write: %s.", part, strerror(errno));
    close(f->fd);
    f->fd = -1;
    free(f->buf);
    f->buf = NULL;
    if (rc)
        return rc;
    if (rename(part, f->path))
        return util_errf(err, errlen, "%s: cannot rename into place: %s.", f->path, strerror(errno));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", f->path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd)) {
        if (dfd >= 0)
            close(dfd);
        return util_errf(err, errlen, "%s: cannot sync the directory: %s.", dir, strerror(errno));
    }
    close(dfd);
    return 0;
}

void npy_abort(npy_rows *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    free(f->buf);
    f->buf = NULL;
}
