/*
 * util.c — shared helpers (see util.h).  Hashing goes through OpenSSL's EVP
 * interface; nothing here allocates except util_read_file.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int util_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int util_read_file(const char *path, size_t cap, char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_errf(err, errlen, "%s: cannot open: %s.", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return util_errf(err, errlen, "%s: not a regular file.", path);
    }
    if ((uint64_t)st.st_size > cap) {
        close(fd);
        return util_errf(err, errlen, "%s: file is %lld bytes, more than the %zu-byte limit for this kind of file.",
                         path, (long long)st.st_size, cap);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return util_errf(err, errlen, "%s: out of memory reading %zu bytes.", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return util_errf(err, errlen, "%s: read failed at offset %zu: %s.", path, got,
                             r < 0 ? strerror(errno) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

void util_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
    out[64] = 0;
}

bool util_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool util_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int util_pathf(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

const char *util_spill_home(void)
{
    static char buf[4096];
    const char *h = getenv("SPILL_HOME");
    if (h && *h)
        return h;
    const char *home = getenv("HOME");
    if (util_pathf(buf, sizeof buf, "%s/.streamweights", home && *home ? home : ".") != 0)
        return ".streamweights";
    return buf;
}

bool util_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else
            return false;
        if (n >= len - i)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

int util_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen)
{
    char dir[4096], tmp[4200];
    if (util_pathf(dir, sizeof dir, "%s", path) != 0)
        return util_errf(err, errlen, "%.200s...: path too long.", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return util_errf(err, errlen, "%s: path has no directory.", path);
    *slash = 0;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *ps = strrchr(parent, '/');
    if (ps && ps != parent) {
        *ps = 0;
        mkdir(parent, 0755);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return util_errf(err, errlen, "%s: cannot create: %s.", dir, strerror(errno));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = 0;
    if (fd < 0 || write(fd, data, len) != (ssize_t)len || fsync(fd) != 0)
        rc = util_errf(err, errlen, "%s: cannot write: %s.", tmp, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = util_errf(err, errlen, "%s: cannot rename: %s.", path, strerror(errno));
    if (rc == 0) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return rc;
}
