/*
 * host_share.c — one host copy of the streamed layers for every process that streams the same bytes
 * (host_share.h says what and why).
 *
 * The file: a 2 MiB header region (so the bytes start 2 MiB-aligned in the file, where shared-memory huge
 * pages can back them), then the bytes.  Two open-file-description locks on it (fcntl F_OFD_*: per open file,
 * dropped by the kernel when the process dies, usable from any thread):
 *   byte 0, the fill lock: exclusive while a process decides what to do with the file (fill it, map it, or
 *           remove it), so those decisions never interleave;
 *   byte 1, the use lock: shared by every process that maps the bytes; whoever takes it exclusive (holding
 *           the fill lock) knows nobody maps them, and may remove the file.
 */
#include "host_share.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../base/util.h"

#define SHARE_HDR ((size_t)2 << 20)
#define SHARE_MAGIC "SPILLPIN"
#define SHARE_VERSION 1u
#define SHARE_PREFIX "spill-"
#define SHARE_SUFFIX ".pin"

typedef struct share_hdr {
    char magic[8];
    uint32_t version;
    uint32_t ready; /* 1 once the bytes are complete (written last by the filler) */
    uint64_t bytes;
    unsigned char key[32]; /* SHA-256 of the key string */
} share_hdr;

struct host_share {
    int fd;
    uint8_t *map;
    size_t map_len;
    char path[4096];
};

static struct {
    bool on;
    host_share *kept; /* keep mode: the last closed copy, its use lock held, unmapped */
} g_share;

/* Takes (type F_RDLCK/F_WRLCK) or drops (F_UNLCK) the lock on byte `at`; wait: block until granted.  0, or -1
 * (not granted without waiting, or an error). */
static int lock_byte(int fd, short type, off_t at, bool wait)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1, .l_pid = 0};
    for (;;) {
        if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

enum { FILL_BYTE = 0, USE_BYTE = 1 };

/* Removes s's file when no other process maps it; s holds the fill lock.  True when it did. */
static bool remove_if_unused(int fd, const char *path)
{
    if (lock_byte(fd, F_WRLCK, USE_BYTE, false))
        return false;
    struct stat a, b;
    bool same = fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
    if (same)
        unlink(path);
    return same;
}

/* Drops s: unmaps, removes the file when nobody else maps it, closes. */
static void release(host_share *s)
{
    if (!s)
        return;
    if (s->map)
        munmap(s->map, s->map_len);
    if (s->fd >= 0) {
        if (lock_byte(s->fd, F_WRLCK, FILL_BYTE, true) == 0)
            remove_if_unused(s->fd, s->path);
        close(s->fd); /* drops both locks */
    }
    free(s);
}

static const char *dir_or_default(const char *dir)
{
    return dir && *dir ? dir : HOST_SHARE_DEFAULT_DIR;
}

static bool is_share_name(const char *n)
{
    size_t len = strlen(n), p = strlen(SHARE_PREFIX), q = strlen(SHARE_SUFFIX);
    return len == p + 32 + q && !strncmp(n, SHARE_PREFIX, p) && !strcmp(n + len - q, SHARE_SUFFIX);
}

/* Calls fn(fd, path) for every copy's file in dir, open read-write (the locks need it); returns the sum of what
 * fn returned. */
static uint64_t each_share(const char *dir, uint64_t (*fn)(int fd, const char *path))
{
    DIR *d = opendir(dir_or_default(dir));
    if (!d)
        return 0;
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_share_name(de->d_name))
            continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir_or_default(dir), de->d_name) >= (int)sizeof path)
            continue;
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        sum += fn(fd, path);
        close(fd);
    }
    closedir(d);
    return sum;
}

static uint64_t sweep_one(int fd, const char *path)
{
    return lock_byte(fd, F_WRLCK, FILL_BYTE, false) == 0 && remove_if_unused(fd, path);
}

int host_share_sweep(const char *dir)
{
    return (int)each_share(dir, sweep_one);
}

static uint64_t ready_one(int fd, const char *path)
{
    (void)path;
    share_hdr h;
    return pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && !memcmp(h.magic, SHARE_MAGIC, 8) &&
                   h.version == SHARE_VERSION && h.ready == 1
               ? h.bytes
               : 0;
}

uint64_t host_share_ready_bytes(const char *dir)
{
    return each_share(dir, ready_one);
}

static void key_digest(const char *key, unsigned char out[32], char hex[33])
{
    unsigned int n = 32;
    EVP_Digest(key, strlen(key), out, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", out[i]);
}

/* Reserves the file's room (tmpfs: allocates its pages now, so a full directory is a sentence here rather
 * than a SIGBUS mid-fill).  0, or 1 with *why. */
static int reserve(int fd, const char *dir, size_t len, char *why, size_t whylen)
{
    if (ftruncate(fd, 0) != 0)
        return util_errf(why, whylen, "%s: cannot truncate: %s", dir, strerror(errno)), 1;
    int rc = posix_fallocate(fd, 0, (off_t)len);
    if (rc == 0)
        return 0;
    struct statvfs v;
    double avail = statvfs(dir, &v) == 0 ? (double)v.f_bavail * (double)v.f_frsize : 0;
    if (rc == ENOSPC || rc == EFBIG)
        util_errf(why, whylen, "%s has %.2f GiB free and the copy needs %.2f GiB (SPILL_SHM_DIR names another)",
                  dir, avail / (1 << 30), (double)len / (1 << 30));
    else
        util_errf(why, whylen, "%s: cannot reserve %.2f GiB: %s", dir, (double)len / (1 << 30), strerror(rc));
    ftruncate(fd, 0);
    return 1;
}

int host_share_open(const char *dir, const char *key, size_t bytes, host_share **out, uint8_t **base, bool *fill,
                    char *why, size_t whylen)
{
    *out = NULL, *base = NULL, *fill = false;
    dir = dir_or_default(dir);
    if (access(dir, W_OK | X_OK) != 0)
        return util_errf(why, whylen, "%s is not a writable directory (%s)", dir, strerror(errno)), 1;
    unsigned char dg[32];
    char hex[33];
    key_digest(key, dg, hex);
    if (g_share.kept) { /* keep mode: a kept copy of another key would double the host RAM; drop it first */
        const char *n = strrchr(g_share.kept->path, '/');
        if (!n || strncmp(n + 1 + strlen(SHARE_PREFIX), hex, 32))
            host_share_drop_kept();
    }
    host_share_sweep(dir);
    host_share *s = (host_share *)calloc(1, sizeof *s);
    if (!s)
        return util_errf(why, whylen, "out of host memory"), 1;
    s->fd = -1;
    if (snprintf(s->path, sizeof s->path, "%s/%s%s%s", dir, SHARE_PREFIX, hex, SHARE_SUFFIX) >= (int)sizeof s->path) {
        free(s);
        return util_errf(why, whylen, "%s: the directory's path is too long", dir), 1;
    }
    size_t len = SHARE_HDR + bytes;
    for (int attempt = 0;; attempt++) {
        s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (s->fd < 0) {
            util_errf(why, whylen, "%s: cannot open: %s", s->path, strerror(errno));
            free(s);
            return 1;
        }
        if (lock_byte(s->fd, F_WRLCK, FILL_BYTE, true) != 0) {
            util_errf(why, whylen, "%s: cannot lock: %s", s->path, strerror(errno));
            release(s);
            return 1;
        }
        struct stat a, b;
        if (fstat(s->fd, &a) == 0 && stat(s->path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
            break;
        close(s->fd); /* removed between our open and our lock (its last user, or a sweep): open it again */
        s->fd = -1;
        if (attempt == 8) {
            util_errf(why, whylen, "%s keeps being removed under us", s->path);
            free(s);
            return 1;
        }
    }
    struct stat st;
    share_hdr h;
    bool ready = fstat(s->fd, &st) == 0 && (size_t)st.st_size == len &&
                 pread(s->fd, &h, sizeof h, 0) == (ssize_t)sizeof h && !memcmp(h.magic, SHARE_MAGIC, 8) &&
                 h.version == SHARE_VERSION && h.ready == 1 && h.bytes == bytes && !memcmp(h.key, dg, 32);
    if (!ready) {
        /* new, or a filler died before it finished: nobody maps a copy that is not ready, so fill it here */
        if (reserve(s->fd, dir, len, why, whylen)) {
            remove_if_unused(s->fd, s->path);
            release(s);
            return 1;
        }
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (p == MAP_FAILED) {
        util_errf(why, whylen, "%s: cannot map %.2f GiB: %s", s->path, (double)len / (1 << 30), strerror(errno));
        if (!ready)
            remove_if_unused(s->fd, s->path);
        release(s);
        return 1;
    }
    s->map = (uint8_t *)p, s->map_len = len;
    if (lock_byte(s->fd, F_RDLCK, USE_BYTE, true) != 0) {
        util_errf(why, whylen, "%s: cannot lock: %s", s->path, strerror(errno));
        release(s);
        return 1;
    }
    if (!ready) {
        madvise(s->map + SHARE_HDR, bytes, MADV_HUGEPAGE); /* advisory */
        share_hdr nh = {{0}, SHARE_VERSION, 0, bytes, {0}};
        memcpy(nh.magic, SHARE_MAGIC, 8);
        memcpy(nh.key, dg, 32);
        memcpy(s->map, &nh, sizeof nh);
        *fill = true; /* the fill lock stays held until host_share_ready */
    } else {
        lock_byte(s->fd, F_UNLCK, FILL_BYTE, false);
    }
    *out = s, *base = s->map + SHARE_HDR;
    return 0;
}

int host_share_ready(host_share *s, char *err, size_t errlen)
{
    __atomic_store_n(&((share_hdr *)s->map)->ready, 1u, __ATOMIC_RELEASE);
    if (lock_byte(s->fd, F_UNLCK, FILL_BYTE, false) != 0)
        return util_errf(err, errlen, "%s: cannot unlock: %s.", s->path, strerror(errno));
    return 0;
}

void host_share_close(host_share *s)
{
    if (!s)
        return;
    share_hdr *h = (share_hdr *)s->map;
    bool ready = h && __atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) == 1;
    if (!g_share.on || !ready) {
        release(s);
        return;
    }
    munmap(s->map, s->map_len); /* keep mode: the name stays held (use lock), the mapping goes */
    s->map = NULL;
    host_share_drop_kept();
    g_share.kept = s;
}

const char *host_share_path(const host_share *s)
{
    return s->path;
}

void host_share_keep(bool on)
{
    g_share.on = on;
    if (!on)
        host_share_drop_kept();
}

bool host_share_keeping(void)
{
    return g_share.on;
}

void host_share_key_hex(const char *key, char out[65])
{
    unsigned char d[32];
    unsigned int n = 32;
    EVP_Digest(key, strlen(key), d, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

void host_share_drop_kept(void)
{
    host_share *k = g_share.kept;
    g_share.kept = NULL;
    release(k);
}
