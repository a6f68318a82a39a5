/*
 * probe.h — `spill probe`: what this machine can do, measured, and stored
 * where the planner and the ETA can read it back.
 */
#ifndef SPILL_PROBE_H
#define SPILL_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROBE_N_READS 6 /* {1, 4, 16} MiB requests × {1, 4} readers */

typedef struct probe_read {
    int request_mib;
    int readers;
    double gbs; /* GB/s (1e9 bytes per second) */
} probe_read;

typedef struct probe_result {
    char time[32];                     /* UTC, ISO 8601 */
    uint64_t ram_total, ram_available; /* bytes, /proc/meminfo */
    char dir[1024];                    /* where the disk test ran */
    uint64_t fs_free, fs_total;        /* bytes on that file system */
    bool direct;                       /* O_DIRECT honoured: rates are storage rates */
    char note[256];                    /* why not, when not */
    uint64_t test_bytes;
    double write_gbs; /* O_DIRECT write + fsync */
    probe_read reads[PROBE_N_READS];
    double read_gbs; /* best sequential read rate of the table: what streaming can hope for */
    int threads;
    int mm_n, mm_k, mm_t; /* matmul shape: W (N, K) F16, X (T, K) */
    double matmul_gflops;
} probe_result;

typedef struct probe_opts {
    const char *dir; /* NULL: $SPILL_HOME/calibration */
    uint64_t bytes;  /* test file size; 0 = 1 GiB; at least 256 MiB unless small_ok */
    bool small_ok;   /* tests: allow down to 16 MiB and a small matmul */
    bool quiet;
} probe_opts;

/* Measures everything; the test file is removed before returning. */
int probe_run(const probe_opts *o, probe_result *r, char *err, size_t errlen);

/* Reads the first size bytes of path once (O_DIRECT when direct), by `readers` threads (1 to 4) taking the next
 * req-byte request in order; *gbs = size / seconds in GB/s.  0, or -1 with a sentence. */
int probe_read_rate(const char *path, bool direct, uint64_t size, uint64_t req, int readers, double *gbs, char *err,
                    size_t errlen);

/* Writes r as JSON to path atomically (temporary file, fsync, rename, fsync of the directory). */
int probe_save(const probe_result *r, const char *path, char *err, size_t errlen);

/* Reads a stored probe (path NULL: $SPILL_HOME/calibration/probe.json).  Fails
 * with a sentence naming the file and field when it is missing or malformed. */
int probe_load(const char *path, probe_result *r, char *err, size_t errlen);

/* Prints the short table. */
void probe_print(const probe_result *r);

/* `spill probe [--dir PATH] [--bytes N]` (argv after the command word).  Prints the table, saves
 * $SPILL_HOME/calibration/probe.json.  Returns 0, 2 on bad arguments, 74 (EX_IOERR) when a measurement
 * or the save fails. */
int probe_main(int argc, char **argv);

#endif
