/*
 * test_host_share.c — the host's one shared copy of streamed layers (engine/host_share.h) across processes:
 * the first opener fills and the next maps what it filled; an opener waits while another fills; a filler
 * killed mid-fill leaves a copy the next opener fills again; the last close removes the file; files whose
 * every user was killed are swept; keep mode (spill worker) holds the last copy between jobs; a directory
 * that cannot hold the copy is a reason to keep a private one, never a crash.  Processes are fork()ed
 * children that report through their exit status.
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/host_share.h"
#include "test.h"

#define BYTES ((size_t)3 << 20) /* 3 MiB: more than one huge page, not a multiple of one */

static char g_dir[256];

static int count_files(void)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += de->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void fill_pattern(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + seed);
}

static bool has_pattern(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(i * 31 + seed))
            return false;
    return true;
}

/* A child's open: 0 it mapped a filled copy with the pattern, 1 it had to fill, 2 it failed. */
static int child_open_and_check(const char *key, uint8_t seed)
{
    host_share *s;
    uint8_t *base;
    bool fill;
    char why[256];
    if (host_share_open(g_dir, key, BYTES, &s, &base, &fill, why, sizeof why) != 0)
        return 2;
    int rc = fill ? 1 : has_pattern(base, BYTES, seed) ? 0 : 2;
    host_share_close(s);
    return rc;
}

static int wait_child(pid_t pid)
{
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void test_fill_then_map(void)
{
    host_share *s;
    uint8_t *base;
    bool fill = false;
    char why[256] = "";
    int rc = host_share_open(g_dir, "model A layout 1", BYTES, &s, &base, &fill, why, sizeof why);
    CHECK(rc == 0 && fill, "the first open fills (rc %d fill %d: %s)", rc, fill, why);
    if (rc)
        return;
    CHECK(((uintptr_t)base & 4095) == 0, "the bytes are page-aligned for cudaHostRegister");
    fill_pattern(base, BYTES, 7);
    CHECK(host_share_ready_bytes(g_dir) == 0, "a copy being filled is no RAM to map yet");
    CHECK(host_share_ready(s, why, sizeof why) == 0, "ready: %s", why);
    CHECK(host_share_ready_bytes(g_dir) == BYTES, "a filled copy is (%llu bytes)",
          (unsigned long long)host_share_ready_bytes(g_dir));
    pid_t pid = fork();
    if (pid == 0)
        _exit(child_open_and_check("model A layout 1", 7));
    CHECK(wait_child(pid) == 0, "another process maps the filled bytes and reads nothing");
    pid = fork();
    if (pid == 0)
        _exit(child_open_and_check("model A layout 2", 7));
    CHECK(wait_child(pid) == 1, "another key is another copy (its opener fills it)");
    CHECK(count_files() == 1, "the other key's copy went with its last user (%d files)", count_files());
    CHECK(access(host_share_path(s), F_OK) == 0, "a copy in use stays");
    host_share_close(s);
    CHECK(count_files() == 0, "the last close removes the copy (%d files)", count_files());
}

static void test_waits_for_filler(void)
{
    int go[2];
    if (pipe(go))
        return;
    pid_t pid = fork();
    if (pid == 0) { /* the filler: opens, says so, fills slowly, marks ready, holds it a moment */
        host_share *s;
        uint8_t *base;
        bool fill;
        char why[256];
        if (host_share_open(g_dir, "slow fill", BYTES, &s, &base, &fill, why, sizeof why) || !fill)
            _exit(2);
        if (write(go[1], "x", 1) != 1)
            _exit(2);
        usleep(300 * 1000);
        fill_pattern(base, BYTES, 3);
        if (host_share_ready(s, why, sizeof why))
            _exit(2);
        usleep(300 * 1000);
        host_share_close(s);
        _exit(0);
    }
    char c;
    CHECK(read(go[0], &c, 1) == 1, "the filler started");
    host_share *s;
    uint8_t *base;
    bool fill = true;
    char why[256] = "";
    int rc = host_share_open(g_dir, "slow fill", BYTES, &s, &base, &fill, why, sizeof why);
    CHECK(rc == 0 && !fill, "an opener during the fill waits for it and fills nothing (rc %d fill %d)", rc, fill);
    if (rc == 0) {
        CHECK(has_pattern(base, BYTES, 3), "and sees every byte the filler wrote");
        host_share_close(s);
    }
    CHECK(wait_child(pid) == 0, "the filler finished");
    CHECK(count_files() == 0, "both closed: removed (%d files)", count_files());
    close(go[0]);
    close(go[1]);
}

static void test_filler_killed(void)
{
    int go[2];
    if (pipe(go))
        return;
    pid_t pid = fork();
    if (pid == 0) { /* fills half, then waits to be killed */
        host_share *s;
        uint8_t *base;
        bool fill;
        char why[256];
        if (host_share_open(g_dir, "killed fill", BYTES, &s, &base, &fill, why, sizeof why) || !fill)
            _exit(2);
        fill_pattern(base, BYTES / 2, 9);
        if (write(go[1], "x", 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    char c;
    CHECK(read(go[0], &c, 1) == 1, "the filler started");
    kill(pid, SIGKILL);
    CHECK(wait_child(pid) == 100 + SIGKILL, "the filler was killed");
    host_share *s;
    uint8_t *base;
    bool fill = false;
    char why[256] = "";
    int rc = host_share_open(g_dir, "killed fill", BYTES, &s, &base, &fill, why, sizeof why);
    CHECK(rc == 0 && fill, "a copy never made ready is filled again by the next opener (rc %d fill %d)", rc, fill);
    if (rc == 0) {
        fill_pattern(base, BYTES, 9);
        host_share_ready(s, why, sizeof why);
        host_share_close(s);
    }
    CHECK(count_files() == 0, "removed at the last close (%d files)", count_files());
    close(go[0]);
    close(go[1]);
}

static void test_sweep(void)
{
    pid_t pid = fork();
    if (pid == 0) { /* fills, marks ready, and dies holding it (kill -9 of every user) */
        host_share *s;
        uint8_t *base;
        bool fill;
        char why[256];
        if (host_share_open(g_dir, "orphan", BYTES, &s, &base, &fill, why, sizeof why) || !fill)
            _exit(2);
        fill_pattern(base, BYTES, 1);
        host_share_ready(s, why, sizeof why);
        raise(SIGKILL);
        _exit(0);
    }
    CHECK(wait_child(pid) == 100 + SIGKILL, "the only user was killed");
    CHECK(count_files() == 1, "its copy is left behind (%d files)", count_files());
    CHECK(host_share_sweep(g_dir) == 1, "a sweep removes a copy that no process holds");
    CHECK(count_files() == 0, "gone (%d files)", count_files());

    /* a copy in use is never swept */
    host_share *s;
    uint8_t *base;
    bool fill;
    char why[256] = "";
    if (host_share_open(g_dir, "in use", BYTES, &s, &base, &fill, why, sizeof why) == 0) {
        host_share_ready(s, why, sizeof why);
        pid = fork();
        if (pid == 0)
            _exit(host_share_sweep(g_dir));
        CHECK(wait_child(pid) == 0, "another process's sweep leaves a copy in use");
        CHECK(count_files() == 1, "still there (%d files)", count_files());
        host_share_close(s);
    }
}

static void test_keep(void)
{
    host_share_keep(true);
    host_share *s;
    uint8_t *base;
    bool fill = false;
    char why[256] = "";
    if (host_share_open(g_dir, "kept model", BYTES, &s, &base, &fill, why, sizeof why) == 0) {
        fill_pattern(base, BYTES, 5);
        host_share_ready(s, why, sizeof why);
        host_share_close(s);
    }
    CHECK(count_files() == 1, "keep mode: the closed copy stays for the next job (%d files)", count_files());
    CHECK(host_share_sweep(g_dir) == 0, "a kept copy is held: never swept");
    int rc = host_share_open(g_dir, "kept model", BYTES, &s, &base, &fill, why, sizeof why);
    CHECK(rc == 0 && !fill, "the next job of the same model maps it (rc %d fill %d)", rc, fill);
    if (rc == 0) {
        CHECK(has_pattern(base, BYTES, 5), "with the bytes the last job read");
        host_share_close(s);
    }
    rc = host_share_open(g_dir, "another model", BYTES, &s, &base, &fill, why, sizeof why);
    CHECK(rc == 0 && fill, "a job of another model fills its own");
    CHECK(count_files() == 1, "and the kept copy of the other model was let go first (%d files)", count_files());
    if (rc == 0) {
        host_share_ready(s, why, sizeof why);
        host_share_close(s);
    }
    host_share_drop_kept();
    CHECK(count_files() == 0, "dropping the kept copy removes it (%d files)", count_files());
    host_share_keep(false);
}

static void test_no_room(void)
{
    host_share *s;
    uint8_t *base;
    bool fill;
    char why[256] = "";
    int rc = host_share_open("/nonexistent/spill-shm", "k", BYTES, &s, &base, &fill, why, sizeof why);
    CHECK(rc == 1 && strstr(why, "/nonexistent/spill-shm"), "a missing directory: keep a private copy, and why (%s)",
          why);
    char ro[300];
    snprintf(ro, sizeof ro, "%s/ro", g_dir);
    mkdir(ro, 0500);
    if (geteuid() != 0) { /* root writes anywhere */
        rc = host_share_open(ro, "k", BYTES, &s, &base, &fill, why, sizeof why);
        CHECK(rc == 1 && strstr(why, "not a writable directory"), "a read-only directory: why (%s)", why);
    }
    rmdir(ro);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/spill-test-share-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fill_then_map();
    test_waits_for_filler();
    test_filler_killed();
    test_sweep();
    test_keep();
    test_no_room();
    rmdir(g_dir);
    return test_finish("test_host_share");
}
