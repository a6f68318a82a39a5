/*
 * test_probe.c — `spill probe` on a small file produces a sane, loadable
 * JSON.  No timing assertions: rates only have to be positive and finite,
 * and consistent with each other (read_gbs is the best of the table).
 *
 *  - probe_main --bytes 64M --test-small with SPILL_HOME in a temporary
 *    directory writes $SPILL_HOME/calibration/probe.json; the file parses
 *    with jansson and has every documented field; probe_load reads back the
 *    same figures; the probe's test file is gone afterwards.
 *  - On tmpfs (/dev/shm, when present) O_DIRECT is refused: the probe still
 *    works, marks o_direct false and says why in `note`.
 *  - Errors: a missing or malformed probe.json names the file and field; a
 *    size below the minimum is refused; bad arguments are usage errors.
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "engine/probe.h"
#include "test.h"
#include "base/util.h"

static char home[] = "/tmp/spill_test_probe_XXXXXX";

static int count_probe_files(const char *d)
{
    DIR *dp = opendir(d);
    int n = 0;
    struct dirent *e;
    while (dp && (e = readdir(dp)))
        n += !strncmp(e->d_name, ".spill-probe-", 13);
    if (dp)
        closedir(dp);
    return n;
}

static void check_sane(const probe_result *r, const char *what)
{
    CHECK(r->ram_total > 0 && r->ram_available > 0 && r->ram_available <= r->ram_total, "%s: ram %llu / %llu", what,
          (unsigned long long)r->ram_available, (unsigned long long)r->ram_total);
    CHECK(r->fs_total > 0 && r->fs_free <= r->fs_total, "%s: fs %llu / %llu", what, (unsigned long long)r->fs_free,
          (unsigned long long)r->fs_total);
    CHECK(r->test_bytes == 64ull << 20, "%s: test file %llu bytes", what, (unsigned long long)r->test_bytes);
    CHECK(isfinite(r->write_gbs) && r->write_gbs > 0, "%s: write %g", what, r->write_gbs);
    static const int req[6] = {1, 1, 4, 4, 16, 16}, rd[6] = {1, 4, 1, 4, 1, 4};
    double best = 0;
    for (int i = 0; i < PROBE_N_READS; i++) {
        CHECK(r->reads[i].request_mib == req[i] && r->reads[i].readers == rd[i], "%s: read %d is %d MiB x %d", what, i,
              r->reads[i].request_mib, r->reads[i].readers);
        CHECK(isfinite(r->reads[i].gbs) && r->reads[i].gbs > 0, "%s: read %d rate %g", what, i, r->reads[i].gbs);
        best = r->reads[i].gbs > best ? r->reads[i].gbs : best;
    }
    CHECK(r->read_gbs == best, "%s: read_gbs %g is not the best %g", what, r->read_gbs, best);
    CHECK(isfinite(r->matmul_gflops) && r->matmul_gflops > 0 && r->threads >= 1, "%s: matmul %g GFLOP/s, %d threads",
          what, r->matmul_gflops, r->threads);
    CHECK(strlen(r->time) == 20 && r->time[19] == 'Z', "%s: time '%s'", what, r->time);
}

int main(void)
{
    if (!mkdtemp(home)) {
        CHECK(0, "mkdtemp");
        return test_finish("test_probe");
    }
    setenv("SPILL_HOME", home, 1);
    char path[600], calib[256], err[SPILL_ERRLEN];
    snprintf(calib, sizeof calib, "%s/calibration", home);
    snprintf(path, sizeof path, "%s/probe.json", calib);

    char *argv1[] = {"--bytes", "64M", "--test-small"};
    CHECK(probe_main(3, argv1) == 0, "probe_main");
    CHECK(count_probe_files(calib) == 0, "the probe's test file was left behind");

    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    CHECK(j, "%s: %s", path, je.text);
    if (j) {
        json_t *disk = json_object_get(j, "disk"), *mm = json_object_get(json_object_get(j, "cpu"), "matmul");
        CHECK(json_integer_value(json_object_get(j, "version")) == 1, "version");
        CHECK(json_is_integer(json_object_get(json_object_get(j, "ram"), "total_bytes")), "ram.total_bytes");
        CHECK(json_is_boolean(json_object_get(disk, "o_direct")), "disk.o_direct");
        CHECK(json_is_true(json_object_get(disk, "o_direct")) == json_is_null(json_object_get(disk, "note")),
              "note is null exactly when O_DIRECT worked");
        CHECK(json_array_size(json_object_get(disk, "reads")) == 6, "disk.reads");
        CHECK(json_is_number(json_object_get(disk, "read_gbs")) && json_is_number(json_object_get(disk, "write_gbs")),
              "disk rates");
        CHECK(!strcmp(json_string_value(json_object_get(mm, "dtype")) ?: "", "F16") &&
                  json_is_number(json_object_get(mm, "gflops")),
              "cpu.matmul");
        CHECK(!strcmp(json_string_value(json_object_get(disk, "dir")) ?: "", calib), "disk.dir is %s", calib);
        json_decref(j);
    }
    probe_result r, r2;
    int rc = probe_load(NULL, &r, err, sizeof err);
    CHECK(rc == 0, "probe_load: %s", err);
    if (rc == 0) {
        check_sane(&r, "stored");
        struct statfs sf;
        bool tmpfs = statfs(calib, &sf) == 0 && sf.f_type == 0x01021994; /* TMPFS_MAGIC */
        CHECK(r.direct == !tmpfs, "o_direct %d on %s", r.direct, tmpfs ? "tmpfs" : "a disk file system");
    }

    /* run + save + load round trip, in memory */
    probe_opts o = {.dir = calib, .bytes = 64ull << 20, .small_ok = true};
    rc = probe_run(&o, &r, err, sizeof err);
    CHECK(rc == 0, "probe_run: %s", err);
    if (rc == 0) {
        check_sane(&r, "run");
        char p2[600];
        snprintf(p2, sizeof p2, "%s/again.json", calib);
        CHECK(probe_save(&r, p2, err, sizeof err) == 0 && probe_load(p2, &r2, err, sizeof err) == 0, "round trip: %s",
              err);
        CHECK(fabs(r2.read_gbs - r.read_gbs) <= 1e-5 * r.read_gbs &&
                  fabs(r2.matmul_gflops - r.matmul_gflops) <= 1e-5 * r.matmul_gflops && r2.ram_total == r.ram_total &&
                  r2.test_bytes == r.test_bytes && r2.direct == r.direct && !strcmp(r2.dir, r.dir),
              "round trip changed the figures");
    }

    /* tmpfs: O_DIRECT refused, noted */
    struct statfs sf;
    if (statfs("/dev/shm", &sf) == 0 && sf.f_type == 0x01021994) {
        char shm[] = "/dev/shm/spill_test_probe_XXXXXX";
        if (mkdtemp(shm)) {
            probe_opts os = {.dir = shm, .bytes = 32ull << 20, .small_ok = true};
            rc = probe_run(&os, &r, err, sizeof err);
            CHECK(rc == 0, "tmpfs probe: %s", err);
            CHECK(rc || (!r.direct && strstr(r.note, "O_DIRECT") && r.read_gbs > 0), "tmpfs: direct %d note '%s'",
                  r.direct, r.note);
            CHECK(count_probe_files(shm) == 0, "tmpfs test file left behind");
            rmdir(shm);
        }
    } else
        fprintf(stderr, "  /dev/shm is not tmpfs here: the O_DIRECT fallback is not exercised\n");

    /* errors */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/missing.json", calib);
    CHECK(probe_load(bad, &r, err, sizeof err) != 0 && strstr(err, "missing.json") && strstr(err, "spill probe"),
          "missing: '%s'", err);
    snprintf(bad, sizeof bad, "%s/bad.json", calib);
    FILE *f = fopen(bad, "w");
    if (f) {
        fputs("{\"version\":1,\"ram\":{\"total_bytes\":1,\"available_bytes\":1},\"disk\":{\"read_gbs\":-1}}", f);
        fclose(f);
    }
    CHECK(probe_load(bad, &r, err, sizeof err) != 0 && strstr(err, "bad.json") && strstr(err, "disk.read_gbs"),
          "malformed: '%s'", err);
    probe_opts small = {.dir = calib, .bytes = 64ull << 20};
    CHECK(probe_run(&small, &r, err, sizeof err) != 0 && strstr(err, "256 MiB"), "64M without --test-small: '%s'", err);
    char *argv2[] = {"--bytes", "lots"};
    CHECK(probe_main(2, argv2) == 2, "bad --bytes is a usage error");
    char *argv3[] = {"--frobnicate"};
    CHECK(probe_main(1, argv3) == 2, "unknown flag is a usage error");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", home);
    CHECK(system(cmd) == 0, "cleanup");
    return test_finish("test_probe");
}
