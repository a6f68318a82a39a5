/*
 * probe.c — `spill probe`: RAM, free disk, O_DIRECT write and read rates,
 * CPU matmul rate; stored as $SPILL_HOME/calibration/probe.json.
 *
 * Owns: the measurements and the JSON file (write and load).  Does not own:
 * GPU figures (the CUDA backend's cuda_probe_h2d measures the H2D rate for
 * bench/cuda/bench_pass; nothing stores GPU figures here) nor any decision
 * made from them.  Nothing reads the file back yet: probe_load is there for
 * the planner and the ETA, which today take their figures elsewhere (the
 * memory plan from --mem-budget or /proc/meminfo in batch/plan.c, pass times
 * from calib.c's fits of measured passes).
 *
 * Key decisions:
 *  - The page cache is bypassed on both sides: the test file is written with
 *    O_DIRECT from an aligned buffer and fsynced, then read back with
 *    O_DIRECT.  The prototype's probe wrote through the cache and "measured"
 *    16.5 GB/s by reading its own file from RAM.  Nothing is dropped with
 *    root tricks (drop_caches): O_DIRECT is the bypass.  Where the file
 *    system refuses O_DIRECT (tmpfs, some network and overlay file systems)
 *    the probe falls back to buffered I/O, says so in `note`, and marks the
 *    rates as not storage rates (`o_direct: false`); the same on tmpfs/ramfs,
 *    which recent kernels let O_DIRECT open although the file is in RAM.
 *  - The buffer is filled with pseudo-random bytes, so compressing or
 *    deduplicating file systems cannot shortcut the write.
 *  - Reads: the whole file once per configuration, requests of 1, 4 and 16
 *    MiB, by 1 and 4 reader threads that take the next offset in order (one
 *    sequential stream with up to 4 requests in flight, what stream.c does).
 *    `read_gbs` is the best of the six: the rate streaming can reach.
 *  - Matmul: cpu_matmul on an F16 weight matrix (4096×4096) with T = 64
 *    activation rows on every core; GFLOP/s = 2·T·N·K / time, best of a few
 *    runs after a warm-up.  (F16 because it is the dtype of synthetic and
 *    most HF weights; quantized types are slower per FLOP on the exact path.)
 *
 * JSON layout (version 1):
 *   {"version":1, "time":"…Z", "ram":{"total_bytes","available_bytes"},
 *    "disk":{"dir","fs_free_bytes","fs_total_bytes","o_direct","note","test_bytes","write_gbs",
 *            "reads":[{"request_mib","readers","gbs"}×6], "read_gbs"},
 *    "cpu":{"threads","matmul":{"dtype":"F16","n","k","t","gflops"}}}
 */
#include "probe.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "cpu.h"
#include "../model/gguf.h"
#include "../model/quant.h"
#include "../base/util.h"
#include "../base/exit.h"

#define DIO_ALIGN 4096u /* O_DIRECT needs 4096-aligned offset, length and buffer */
#define MIB (1024ull * 1024)
#define TMPFS_MAGIC_ 0x01021994 /* linux/magic.h */
#define RAMFS_MAGIC_ 0x858458f6

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- RAM */

static int read_meminfo(probe_result *r, char *err, size_t errlen)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return util_errf(err, errlen, "/proc/meminfo: cannot open: %s.", strerror(errno));
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            r->ram_total = kb * 1024;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            r->ram_available = kb * 1024;
    }
    fclose(f);
    if (!r->ram_total)
        return util_errf(err, errlen, "/proc/meminfo: field MemTotal is missing.");
    return 0;
}

/* ---------------------------------------------------------------- disk */

typedef struct rd_ctx {
    int fd;
    uint64_t size, req;
    _Atomic uint64_t next;
    _Atomic int failed;
} rd_ctx;

static void *reader(void *arg)
{
    rd_ctx *c = arg;
    uint8_t *buf = aligned_alloc(DIO_ALIGN, (size_t)c->req);
    if (!buf) {
        c->failed = ENOMEM;
        return NULL;
    }
    for (;;) {
        uint64_t off = atomic_fetch_add(&c->next, c->req);
        if (off >= c->size || c->failed)
            break;
        uint64_t n = c->size - off < c->req ? c->size - off : c->req;
        while (n) {
            /* O_DIRECT wants whole blocks: a file's tail is asked for rounded up (the read comes back short) */
            uint64_t ask = (n + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
            ssize_t k = pread(c->fd, buf, (size_t)(ask < c->req ? ask : c->req), (off_t)off);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                c->failed = k < 0 ? errno : EIO;
                break;
            }
            uint64_t got = (uint64_t)k < n ? (uint64_t)k : n;
            n -= got;
            off += got;
        }
    }
    free(buf);
    return NULL;
}

int probe_read_rate(const char *path, bool direct, uint64_t size, uint64_t req, int readers, double *gbs, char *err,
                     size_t errlen)
{
    rd_ctx c = {.size = size, .req = req};
    c.fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (c.fd < 0)
        return util_errf(err, errlen, "%s: cannot open the probe file for reading: %s.", path, strerror(errno));
    pthread_t th[4];
    int started = 0;
    double t0 = now();
    for (; started < readers; started++)
        if (pthread_create(&th[started], NULL, reader, &c) != 0)
            break;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    double dt = now() - t0;
    close(c.fd);
    if (started < readers)
        return util_errf(err, errlen, "probe: cannot start %d reader threads.", readers);
    if (c.failed)
        return util_errf(err, errlen, "%s: read failed: %s.", path, strerror(c.failed));
    *gbs = (double)size / 1e9 / (dt > 1e-9 ? dt : 1e-9);
    return 0;
}

/* Fills buf with xorshift64* bytes. */
static void fill_random(uint8_t *buf, size_t n, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint64_t v = x * 0x2545F4914F6CDD1Dull;
        memcpy(buf + i, &v, 8);
    }
}

static int disk_probe(const probe_opts *o, const char *dir, probe_result *r, char *err, size_t errlen)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0)
        return util_errf(err, errlen, "%s: cannot read the file system's free space: %s.", dir, strerror(errno));
    r->fs_free = (uint64_t)sv.f_bavail * sv.f_frsize;
    r->fs_total = (uint64_t)sv.f_blocks * sv.f_frsize;
    uint64_t n = r->test_bytes;
    if (r->fs_free < n + n / 4)
        return util_errf(err, errlen,
                         "%s: the disk test needs %.2f GB free and the file system has %.2f GB; free space or pass a "
                         "smaller --bytes.",
                         dir, n * 1.25 / 1e9, r->fs_free / 1e9);
    char path[1200];
    if (util_pathf(path, sizeof path, "%s/.spill-probe-%ld.tmp", dir, (long)getpid()) != 0)
        return util_errf(err, errlen, "%s: path too long.", dir);
    size_t chunk = 16 * MIB;
    uint8_t *buf = aligned_alloc(DIO_ALIGN, chunk);
    if (!buf)
        return util_errf(err, errlen, "probe: out of memory for a 16 MiB buffer.");
    fill_random(buf, chunk, (uint64_t)getpid());
    int rc = -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    r->direct = fd >= 0;
    struct statfs sf;
    bool ram_fs = statfs(dir, &sf) == 0 && (sf.f_type == TMPFS_MAGIC_ || sf.f_type == RAMFS_MAGIC_);
    if (ram_fs) { /* recent kernels accept O_DIRECT on tmpfs, but the file is in RAM either way */
        r->direct = false;
        snprintf(r->note, sizeof r->note,
                 "%s is on a RAM file system (tmpfs/ramfs): O_DIRECT has no storage to reach, the rates below are "
                 "memory rates",
                 dir);
    }
    if (fd < 0 && errno == EINVAL) {
        snprintf(r->note, sizeof r->note,
                 "the file system at %s refuses O_DIRECT (tmpfs?): the rates below went through the page cache and are "
                 "not storage rates",
                 dir);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (fd < 0) {
        util_errf(err, errlen, "%s: cannot create the probe file: %s.", path, strerror(errno));
        goto out_free;
    }
    double t0 = now();
    for (uint64_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? (size_t)(n - off) : chunk;
        buf[0] = (uint8_t)(off >> 24); /* no two chunks identical, for deduplicating file systems */
        ssize_t w = pwrite(fd, buf, k, (off_t)off);
        if (w != (ssize_t)k) {
            util_errf(err, errlen, "%s: write failed at byte %llu: %s; check free space.", path,
                      (unsigned long long)off, w < 0 ? strerror(errno) : "short write");
            goto out_close;
        }
    }
    if (fsync(fd) != 0) {
        util_errf(err, errlen, "%s: fsync failed: %s.", path, strerror(errno));
        goto out_close;
    }
    r->write_gbs = (double)n / 1e9 / (now() - t0);
    close(fd);
    fd = -1;
    static const int reqs[3] = {1, 4, 16}, rds[2] = {1, 4};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            probe_read *pr = &r->reads[i * 2 + j];
            pr->request_mib = reqs[i];
            pr->readers = rds[j];
            if (probe_read_rate(path, r->direct, n, (uint64_t)reqs[i] * MIB, rds[j], &pr->gbs, err, errlen))
                goto out_close;
            if (pr->gbs > r->read_gbs)
                r->read_gbs = pr->gbs;
        }
    rc = 0;
out_close:
    if (fd >= 0)
        close(fd);
    unlink(path);
out_free:
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- matmul */

static int matmul_probe(const probe_opts *o, probe_result *r, char *err, size_t errlen)
{
    int64_t N = o->small_ok ? 512 : 4096, K = N, T = o->small_ok ? 8 : 64;
    int rc = -1;
    cpu_pool *pool = NULL;
    uint16_t *W = malloc((size_t)(N * K) * sizeof *W);
    float *X = malloc((size_t)(T * K) * sizeof *X), *Y = malloc((size_t)(T * N) * sizeof *Y);
    if (!W || !X || !Y) {
        util_errf(err, errlen, "probe: out of memory for the matmul test.");
        goto out;
    }
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < N * K; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        W[i] = quant_fp32_to_fp16(((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 0.04f);
    }
    for (int64_t i = 0; i < T * K; i++)
        X[i] = (float)((i * 7919) % 101) / 101.0f - 0.5f;
    if (cpu_pool_create(0, cpu_matmul_scratch_bytes(K), &pool, err, errlen))
        goto out;
    r->threads = cpu_pool_threads(pool);
    r->mm_n = (int)N, r->mm_k = (int)K, r->mm_t = (int)T;
    if (cpu_matmul(pool, W, GGML_F16, N, K, X, T, Y, err, errlen)) /* warm-up */
        goto out;
    double best = 1e30, t_end = now() + (o->small_ok ? 0.05 : 1.0);
    for (int it = 0; it < 3 || (now() < t_end && it < 50); it++) {
        double t0 = now();
        if (cpu_matmul(pool, W, GGML_F16, N, K, X, T, Y, err, errlen))
            goto out;
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    r->matmul_gflops = 2.0 * (double)T * (double)N * (double)K / 1e9 / best;
    rc = 0;
out:
    cpu_pool_free(pool);
    free(W), free(X), free(Y);
    return rc;
}

/* ---------------------------------------------------------------- run, save, load */

static int mkdir_p(const char *path)
{
    char tmp[1024];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return -1;
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int probe_run(const probe_opts *o, probe_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(r->time, sizeof r->time, "%Y-%m-%dT%H:%M:%SZ", &tm);
    uint64_t min = o->small_ok ? 16 * MIB : 256 * MIB;
    r->test_bytes = o->bytes ? o->bytes : 1024 * MIB;
    if (r->test_bytes < min)
        return util_errf(err, errlen,
                         "probe: --bytes %llu is below the minimum of %llu MiB (smaller files measure "
                         "the drive's cache, not its sustained rate).",
                         (unsigned long long)r->test_bytes, (unsigned long long)(min / MIB));
    r->test_bytes =
        r->test_bytes / (16 * MIB) * (16 * MIB); /* whole 16 MiB requests, so O_DIRECT lengths stay aligned */
    if (o->dir)
        snprintf(r->dir, sizeof r->dir, "%s", o->dir);
    else if (util_pathf(r->dir, sizeof r->dir, "%s/calibration", util_spill_home()) != 0)
        return util_errf(err, errlen, "probe: $SPILL_HOME path too long.");
    if (mkdir_p(r->dir) != 0 || !util_is_dir(r->dir))
        return util_errf(err, errlen, "%s: cannot create the directory: %s.", r->dir, strerror(errno));
    if (read_meminfo(r, err, errlen) || disk_probe(o, r->dir, r, err, errlen) || matmul_probe(o, r, err, errlen))
        return -1;
    return 0;
}

static int write_atomic(const char *path, const char *data, size_t len, char *err, size_t errlen)
{
    char tmp[1100], d[1024];
    if (util_pathf(tmp, sizeof tmp, "%s.tmp", path) != 0 || util_pathf(d, sizeof d, "%s", path) != 0)
        return util_errf(err, errlen, "%s: path too long.", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return util_errf(err, errlen, "%s: cannot create: %s.", tmp, strerror(errno));
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            unlink(tmp);
            return util_errf(err, errlen, "%s: write failed: %s.", tmp, strerror(errno));
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0) {
        close(fd);
        unlink(tmp);
        return util_errf(err, errlen, "%s: fsync failed: %s.", tmp, strerror(errno));
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return util_errf(err, errlen, "%s: cannot rename into place: %s.", path, strerror(errno));
    }
    int dfd = open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        if (dfd >= 0)
            close(dfd);
        return util_errf(err, errlen, "%s: cannot fsync the directory.", path);
    }
    close(dfd);
    return 0;
}

int probe_save(const probe_result *r, const char *path, char *err, size_t errlen)
{
    json_t *reads = json_array();
    for (int i = 0; i < PROBE_N_READS; i++)
        json_array_append_new(reads, json_pack("{s:i, s:i, s:f}", "request_mib", r->reads[i].request_mib, "readers",
                                               r->reads[i].readers, "gbs", r->reads[i].gbs));
    json_t *j = json_pack(
        "{s:i, s:s, s:{s:I, s:I}, s:{s:s, s:I, s:I, s:b, s:o, s:I, s:f, s:o, s:f}, s:{s:i, s:{s:s, s:i, s:i, s:i, "
        "s:f}}}",
        "version", 1, "time", r->time, "ram", "total_bytes", (json_int_t)r->ram_total, "available_bytes",
        (json_int_t)r->ram_available, "disk", "dir", r->dir, "fs_free_bytes", (json_int_t)r->fs_free, "fs_total_bytes",
        (json_int_t)r->fs_total, "o_direct", r->direct, "note", r->note[0] ? json_string(r->note) : json_null(),
        "test_bytes", (json_int_t)r->test_bytes, "write_gbs", r->write_gbs, "reads", reads, "read_gbs", r->read_gbs,
        "cpu", "threads", r->threads, "matmul", "dtype", "F16", "n", r->mm_n, "k", r->mm_k, "t", r->mm_t, "gflops",
        r->matmul_gflops);
    if (!j)
        return util_errf(err, errlen, "%s: cannot build the JSON (invalid UTF-8 in the directory name?).", path);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    json_decref(j);
    if (!s)
        return util_errf(err, errlen, "%s: out of memory.", path);
    size_t len = strlen(s);
    char *withnl = realloc(s, len + 2);
    if (!withnl) {
        free(s);
        return util_errf(err, errlen, "%s: out of memory.", path);
    }
    withnl[len] = '\n', withnl[len + 1] = 0;
    int rc = write_atomic(path, withnl, len + 1, err, errlen);
    free(withnl);
    return rc;
}

/* Reads number `key` of object o into *v; false when absent or not a number. */
static bool jnum(json_t *o, const char *key, double *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_number(x))
        return false;
    *v = json_number_value(x);
    return true;
}

int probe_load(const char *path, probe_result *r, char *err, size_t errlen)
{
    char def[1100];
    memset(r, 0, sizeof *r);
    if (!path) {
        if (util_pathf(def, sizeof def, "%s/calibration/probe.json", util_spill_home()) != 0)
            return util_errf(err, errlen, "probe: $SPILL_HOME path too long.");
        path = def;
    }
    if (!util_is_file(path))
        return util_errf(err, errlen, "%s: no hardware probe stored; run `spill probe`.", path);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return util_errf(err, errlen, "%s: line %d, column %d: %s; run `spill probe` again.", path, je.line, je.column,
                         je.text);
    int rc = -1;
    json_t *ram = json_object_get(j, "ram"), *disk = json_object_get(j, "disk"), *cpu = json_object_get(j, "cpu");
    json_t *mm = json_object_get(cpu, "matmul"), *reads = json_object_get(disk, "reads");
    double v, a, b, c;
    const char *field = NULL;
    if (!jnum(j, "version", &v) || v != 1)
        field = "version (must be 1)";
    else if (!jnum(ram, "total_bytes", &a) || !jnum(ram, "available_bytes", &b))
        field = "ram";
    else if (!jnum(disk, "read_gbs", &c) || c <= 0)
        field = "disk.read_gbs";
    else if (!jnum(mm, "gflops", &v) || v <= 0)
        field = "cpu.matmul.gflops";
    else if (!json_is_array(reads) || json_array_size(reads) != PROBE_N_READS)
        field = "disk.reads";
    if (field) {
        util_errf(err, errlen, "%s: field %s is missing or invalid; run `spill probe` again.", path, field);
        goto out;
    }
    r->ram_total = (uint64_t)a, r->ram_available = (uint64_t)b, r->read_gbs = c, r->matmul_gflops = v;
    const char *s = json_string_value(json_object_get(j, "time"));
    snprintf(r->time, sizeof r->time, "%s", s ? s : "");
    s = json_string_value(json_object_get(disk, "dir"));
    snprintf(r->dir, sizeof r->dir, "%s", s ? s : "");
    s = json_string_value(json_object_get(disk, "note"));
    snprintf(r->note, sizeof r->note, "%s", s ? s : "");
    r->direct = json_is_true(json_object_get(disk, "o_direct"));
    if (jnum(disk, "fs_free_bytes", &v))
        r->fs_free = (uint64_t)v;
    if (jnum(disk, "fs_total_bytes", &v))
        r->fs_total = (uint64_t)v;
    if (jnum(disk, "test_bytes", &v))
        r->test_bytes = (uint64_t)v;
    if (jnum(disk, "write_gbs", &v))
        r->write_gbs = v;
    for (int i = 0; i < PROBE_N_READS; i++) {
        json_t *e = json_array_get(reads, (size_t)i);
        double q, n, g;
        if (!jnum(e, "request_mib", &q) || !jnum(e, "readers", &n) || !jnum(e, "gbs", &g)) {
            util_errf(err, errlen, "%s: field disk.reads[%d] is malformed; run `spill probe` again.", path, i);
            goto out;
        }
        r->reads[i] = (probe_read){(int)q, (int)n, g};
    }
    if (jnum(cpu, "threads", &v))
        r->threads = (int)v;
    if (jnum(mm, "n", &v))
        r->mm_n = (int)v;
    if (jnum(mm, "k", &v))
        r->mm_k = (int)v;
    if (jnum(mm, "t", &v))
        r->mm_t = (int)v;
    rc = 0;
out:
    json_decref(j);
    return rc;
}

void probe_print(const probe_result *r)
{
    printf("RAM        %.1f GiB total, %.1f GiB available\n", r->ram_total / (double)(1ull << 30),
           r->ram_available / (double)(1ull << 30));
    printf("disk       %s: %.1f GB free of %.1f GB\n", r->dir, r->fs_free / 1e9, r->fs_total / 1e9);
    if (r->note[0])
        printf("           note: %s\n", r->note);
    printf("write      %.2f GB/s (%s, %.2f GB file, fsync included)\n", r->write_gbs,
           r->direct ? "O_DIRECT" : "buffered", r->test_bytes / 1e9);
    printf("read       request   1 reader   4 readers   (%s)\n",
           r->direct ? "O_DIRECT, page cache bypassed" : "buffered");
    for (int i = 0; i < PROBE_N_READS; i += 2)
        printf("           %3d MiB   %6.2f GB/s %6.2f GB/s\n", r->reads[i].request_mib, r->reads[i].gbs,
               r->reads[i + 1].gbs);
    printf("           best %.2f GB/s\n", r->read_gbs);
    printf("matmul     %.1f GFLOP/s (F16 W %dx%d, T=%d, %d threads)\n", r->matmul_gflops, r->mm_n, r->mm_k, r->mm_t,
           r->threads);
}

/* ---------------------------------------------------------------- command */

/* "1G", "256M", "65536" → bytes; false on junk. */
static bool parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return false;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = MIB, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024 * MIB, end++;
    if (*end == 'i' && mul > 1)
        end++;
    if (*end == 'B')
        end++;
    return *end == 0 && ck_mul_u64(v, mul, out);
}

int probe_main(int argc, char **argv)
{
    probe_opts o = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dir") && v)
            o.dir = v, i++;
        else if (!strcmp(a, "--bytes") && v) {
            if (!parse_bytes(v, &o.bytes)) {
                fprintf(stderr, "spill probe: --bytes '%s' must be a size such as 1G or 512M.\n", v);
                return SPILL_EX_USAGE;
            }
            i++;
        } else if (!strcmp(a, "--test-small")) /* hidden: tests probe a 16-64 MiB file and a small matmul */
            o.small_ok = true;
        else {
            fprintf(stderr, "usage: spill probe [--dir PATH] [--bytes N]\n");
            return SPILL_EX_USAGE;
        }
    }
    probe_result r;
    char err[SPILL_ERRLEN] = "", path[1100];
    if (probe_run(&o, &r, err, sizeof err) != 0) {
        fprintf(stderr, "spill probe: %s\n", err);
        return SPILL_EX_IOERR;
    }
    probe_print(&r);
    if (util_pathf(path, sizeof path, "%s/calibration", util_spill_home()) != 0 || mkdir_p(path) != 0 ||
        util_pathf(path, sizeof path, "%s/calibration/probe.json", util_spill_home()) != 0 ||
        probe_save(&r, path, err, sizeof err) != 0) {
        if (!err[0])
            util_errf(err, sizeof err, "%s: cannot create the calibration directory.", path);
        fprintf(stderr, "spill probe: %s\n", err);
        return SPILL_EX_IOERR;
    }
    printf("saved      %s\n", path);
    return 0;
}
