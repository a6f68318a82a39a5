/*
 * job.h — the durable job store: one directory per job holding
 * manifest.json, results.jsonl and errors.jsonl, appended by one writer and
 * committed in groups so that a job killed at any instant resumes exactly
 * (no committed row lost, no row duplicated).  See job.c for the on-disk
 * layout, the commit protocol and the resume scan.
 *
 * Usage (one thread owns a job):
 *
 *     job *j;
 *     job_create(dir, &info, NULL, &j, err, sizeof err)       // or job_open_resume(dir, NULL, &j, ...)
 *     for each row: if (!job_is_done(j, id)) {
 *         ... job_append_result(j, line, len, ...) or job_append_error(...)
 *         every K rows / T ms: job_commit(j, ...)              // rows count as done from here on
 *     }
 *     job_close(j, JOB_DONE, err, sizeof err)                  // commits, writes the final state
 *
 * Any failed write/fsync/rename/ftruncate makes the job unusable: the call
 * fails with a sentence, every later call fails too, and the caller exits;
 * `spill resume` is then exact.  No retries (PostgreSQL "fsyncgate").
 */
#ifndef SPILL_JOB_H
#define SPILL_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define JOB_ID_MAX 64          /* bytes of a job id, including the NUL */
#define JOB_MANIFEST_VERSION 1 /* "spill_job" key of manifest.json */

typedef struct job job;

typedef enum job_state {
    JOB_RUNNING = 0, /* a writer holds the job (or died holding it: resume treats it as interrupted) */
    JOB_INTERRUPTED, /* the writer stopped early (SIGINT, sticky GPU error, ...) and committed first */
    JOB_DONE,        /* every row has a line in results.jsonl or errors.jsonl */
} job_state;

/*
 * Every system call that changes the job directory goes through this table
 * so tests can fail the N-th call.  Each entry has the libc signature and
 * errno convention.  NULL table = the real calls.
 */
typedef struct job_io {
    int (*open)(const char *path, int flags, mode_t mode);
    ssize_t (*write)(int fd, const void *buf, size_t n);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
    int (*ftruncate)(int fd, off_t len);
} job_io;

/* What the caller knows when a job starts; all strings are copied. */
typedef struct job_info {
    const char *command;           /* "run", "distill", "eval", "serve", ... */
    const char *input_path;        /* the input JSONL; job_create hashes it (SHA-256, streamed) */
    json_t *options;               /* borrowed, may be NULL: the options object, copied into the manifest */
    const char *model_id;          /* what the user named: tag, path or repo id */
    const char *model_fingerprint; /* hash of config, shard names/sizes and headers */
    const char *engine_version;
    uint64_t rows_total; /* rows of the input (completed + failed == total when done) */
} job_info;

/*
 * Writes a fresh job id into out: "<UTC yyyymmdd-hhmmss>-<10 random
 * [a-z0-9]>", only [a-z0-9_-], sortable by start time.  Fails only when the
 * kernel gives no random bytes (getrandom) or cap < JOB_ID_MAX.
 */
int job_new_id(char *out, size_t cap, char *err, size_t errlen);

/*
 * Records key (not one of the store's own: id, state, rows, ...) in the manifest, stealing value; it is
 * written with the next commit.  0, or -1 with a sentence.
 */
int job_set_info(job *j, const char *key, json_t *value, char *err, size_t errlen);

/*
 * Creates a job.  dir NULL means $SPILL_HOME/jobs/<new id>; the job's id is the directory's name (its last
 * component), the run id every row's stamp and the manifest carry.  The directory
 * (and its parents) is created; an existing directory must be empty, else
 * the call fails with a sentence pointing at `spill resume`.  Creates empty
 * results.jsonl and errors.jsonl and the first manifest (state running) —
 * all durable, parent directory entry included, before it returns.  The job
 * holds an exclusive flock on its directory until job_close, so a second
 * writer (a `spill resume` of a job still running) is refused.  io NULL = real syscalls; the table must
 * outlive the job.  On failure *out is NULL and nothing is left open.
 */
int job_create(const char *dir, const job_info *info, const job_io *io, job **out, char *err, size_t errlen);

/*
 * Reopens a job for more rows.  Reads manifest.json, checks that the input
 * file still has the recorded SHA-256, scans both output files from byte 0
 * (the done set needs every custom_id), keeps the longest prefix of lines
 * that end in '\n' and parse as JSON objects with a string custom_id,
 * ftruncates anything after it and fsyncs.  A bad line inside the committed
 * prefix, a file shorter than its committed size, or a custom_id seen twice
 * is corruption: the call fails naming file, line and byte offset.  Then
 * commits (new offsets and counters, state running) before returning.
 * Refuses a job whose state is done, or whose directory another process
 * holds (the flock dies with its holder, so kill -9 never leaves it stuck).
 */
int job_open_resume(const char *dir, const job_io *io, job **out, char *err, size_t errlen);

/*
 * The rule every results/errors line obeys: [line, line+len) is one JSON
 * object (RFC 8259, well-formed UTF-8) with a top-level string "custom_id".
 * RFC 8259 allows "\u0000" anywhere, keys included, and the output holds
 * such keys (a completions row's top_logprobs is keyed by token text, and
 * the byte-0x00 token is in every byte-level vocabulary); jansson 2.14 cannot
 * load a NUL in a key, so a reader of results lines that uses jansson must
 * expect it to refuse those lines (Python's json and the openai client read
 * them).
 * On success *id / *idlen give the decoded custom_id: a pointer into line, or
 * into *scratch (capacity *cap, grown with realloc; caller frees) when it had
 * escapes.  On failure err gets a phrase such as "is not valid JSON (at byte
 * 12 of the line)" to embed in a sentence.  Allocates nothing else.
 */
int job_check_line(const char *line, size_t len, const char **id, size_t *idlen, char **scratch, size_t *cap, char *err,
                   size_t errlen);

/* True when custom_id has a committed line in results.jsonl or errors.jsonl. */
bool job_is_done(const job *j, const char *custom_id);

/*
 * Appends one output line (results.jsonl) or one error line (errors.jsonl).
 * `line` is one JSON object with a string "custom_id" and no '\n' (as
 * output.c builds it); len excludes any terminator, the job adds '\n' and
 * writes the whole line with one write(2) loop.  Fails without touching the
 * file when the line is not such an object or its custom_id already has a
 * line (committed or pending) — returning JOB_LINE_REFUSED: nothing was
 * written and the job goes on, so the caller can fail that row instead —
 * and returns -1 and makes the job unusable when the write fails (or when
 * memory runs out).  The row is durable only after the next job_commit.
 */
#define JOB_LINE_REFUSED (-2)
int job_append_result(job *j, const char *line, size_t len, char *err, size_t errlen);
int job_append_error(job *j, const char *line, size_t len, char *err, size_t errlen);

/*
 * Group commit: fsyncs results.jsonl and errors.jsonl, then rewrites
 * manifest.json atomically (manifest.json.tmp in the job dir, write, fsync,
 * rename, fsync the dir) with the new committed sizes and counters.  A row
 * is done exactly when the commit covering its line returns 0.  Nothing to
 * commit → returns 0 without I/O.
 */
int job_commit(job *j, char *err, size_t errlen);

/* job_commit, and the manifest rewritten even when no line is pending: job_set_info's values durable now. */
int job_commit_manifest(job *j, char *err, size_t errlen);

/*
 * Commits and records the final state (JOB_DONE or JOB_INTERRUPTED; with
 * JOB_DONE the committed completed + failed must equal rows_total) and the
 * end time, then frees everything.  On an unusable job, or with final ==
 * JOB_RUNNING, it only closes and frees (the manifest keeps the last
 * commit).  Returns the commit's status; j is freed in every case.  NULL is
 * a no-op.
 */
int job_close(job *j, job_state final, char *err, size_t errlen);

/*
 * How a job was started, as its manifest records it.  job_read_stored reads
 * dir/manifest.json without opening the job (no lock, no scan), so that
 * `spill resume` can open the job's model with its options before
 * job_open_resume checks the rest.  Everything is a copy the caller frees
 * with job_stored_free (safe on a zeroed or failed one).
 */
typedef struct job_stored {
    char *input_path;        /* input.path, absolute */
    char *model_id;          /* model.id: what the user named (tag, path or repo id) */
    char *model_fingerprint; /* model.fingerprint; NULL when the job recorded none */
    json_t *options;         /* options: the object job_create was given ({} when none) */
    bool done;               /* state "done": every row has its line */
    uint64_t rows_completed, rows_failed;
} job_stored;

/* 0; -1 with a sentence when dir holds no readable manifest (not a job directory); -2 with a sentence when
 * the manifest lacks model.id or input.path (not a job that `spill run` started). */
int job_read_stored(const char *dir, job_stored *st, char *err, size_t errlen);
void job_stored_free(job_stored *st);

/*
 * Undoes job_create for a job that never started: closes it and removes its
 * files (and its directory, when job_create made it), best effort.  For a
 * set-up error found after the job existed (the memory plan needs the rows,
 * which are read into the job), so that the error exits once, non-resumable,
 * and leaves no job that `spill resume` would fail on again.  Never call it
 * on a resumed job or after a row was answered.  Safe on NULL.
 */
void job_discard(job *j);

/* Accessors. */
const char *job_id(const job *j);
const json_t *job_manifest(const job *j); /* borrowed, read-only: model, options, input of the job */
const char *job_dir(const job *j);
uint64_t job_rows_total(const job *j);
uint64_t job_rows_completed(const job *j); /* committed lines of results.jsonl */
uint64_t job_rows_failed(const job *j);    /* committed lines of errors.jsonl */
bool job_is_broken(const job *j);          /* an earlier I/O error made it unusable */

#endif
