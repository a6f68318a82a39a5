/*
 * check.h — whole-file validation of an input JSONL file (`spill check`).
 * A job does not run this pass over its file first: `spill run` parses and
 * checks each line as it loads it (run_rows.c), and the gateway
 * (`spill serve`) is not built yet.
 *
 * One streaming pass (never the whole file in memory): every line goes
 * through request_parse_line (request.h), then through the rules that need
 * other lines — one line format per file (batch / fine-tuning chat / eval),
 * unique custom_id (a hash set of the ids seen, with their lines), one url
 * (`url_mismatch`), one body.model (`model_mismatch`), at most max_rows rows
 * (`too_many_tasks`), at least one (`empty_file`), at most max_bytes bytes.
 *
 * Decisions:
 *   - Blank lines (empty or spaces/tabs only, CR stripped) are skipped, as
 *     vLLM's run_batch does; they keep their line numbers.  A file of only
 *     blank lines is `empty_file`.
 *   - Per line, one error is reported: a file-level error from the line itself
 *     (bad JSON, custom_id, method, url, line format) first, then the
 *     cross-line rules, then the line's row-level error (a bad parameter; at
 *     run time such a row goes to errors.jsonl with status 400 and the others
 *     run).  `spill check` treats both as "invalid" — it is a linter.
 *   - Limits default to OpenAI's (50,000 requests, 200 MB); 0 lifts one.
 *
 * Exit codes for main() (check_exit_code, base/exit.h): 0 valid, 2 bad
 * arguments, 65 invalid data, 66 cannot open,
 * 74 read error.
 */
#ifndef SPILL_CHECK_H
#define SPILL_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "request.h"
#include "../base/util.h"

#define CHECK_MAX_ROWS 50000                   /* OpenAI: requests per batch file */
#define CHECK_MAX_BYTES (200ull * 1000 * 1000) /* OpenAI: 200 MB per batch input file */

enum {
    CHECK_OK = 0,
    CHECK_INVALID = -1, /* the data breaks a rule; the report says which */
    CHECK_NOINPUT = -2, /* cannot open / not a regular file or stream */
    CHECK_IOERR = -3,   /* a read failed part-way */
};

typedef struct check_opts {
    bool all;           /* report every bad line; false: stop at the first error */
    size_t max_rows;    /* 0 = no limit */
    uint64_t max_bytes; /* 0 = no limit */
    size_t max_line;    /* bytes per line; 0 = REQ_MAX_LINE_BYTES */
    const char *endpoint; /* --endpoint: every line's url must be this one, as in an OpenAI batch; NULL = chat
                             and completions rows may mix, as `spill run` answers them */
} check_opts;

typedef struct check_report {
    size_t lines;                 /* lines read, blank ones included */
    size_t rows;                  /* non-blank lines */
    size_t ok_rows;               /* rows with no error */
    size_t bad_rows;              /* rows with an error (each counted once) */
    size_t file_errors;           /* errors that fail the whole batch (OpenAI validation), incl. empty/too many */
    size_t per_kind[5];           /* rows per req_kind (index REQ_KIND_UNKNOWN: format not determined) */
    req_kind kind;                /* the file's format: that of the first line whose format was determined */
    req_endpoint endpoint;        /* likewise its endpoint */
    char model[256];              /* the first body.model seen ("" if none), cut at 255 bytes */
    size_t first_error_line;      /* 0 when not tied to a line (empty file, open/read failure) */
    const char *first_error_code; /* "invalid_json_line", "duplicate_custom_id", …, NULL when valid */
    char first_error_param[160];
    char first_error[SPILL_ERRLEN]; /* the first error sentence, "" when valid */
} check_report;

/* The set of custom_ids seen, each with the line that first used it (open addressing, FNV-1a, grown at half
 * load): the one duplicate-custom_id rule, for `spill check` and the runner's input (run_rows.c).  Starts
 * zeroed; check_ids_free empties it. */
typedef struct check_id_slot check_id_slot;
typedef struct check_ids {
    check_id_slot *slots; /* (cap), cap a power of two */
    size_t cap, n;
} check_ids;

/* Adds id (copied) seen on line.  Returns 0 when new, the earlier line (> 0) when already present (the set
 * keeps the first), -1 when out of memory. */
long long check_ids_add(check_ids *s, const char *id, size_t line);
void check_ids_free(check_ids *s);

/* OpenAI's limits, all = false. */
check_opts check_opts_default(void);

/*
 * Validates the stream f (not closed), naming it `name` in sentences.  Error
 * sentences go to `out` (one per line, '\n'-terminated) as they are found
 * unless out is NULL.  Returns CHECK_OK, CHECK_INVALID (report filled, err =
 * the first error sentence) or CHECK_IOERR (err says where).  The report is
 * always filled with what was read.
 */
int check_stream(FILE *f, const char *name, const check_opts *o, check_report *r, FILE *out, char *err, size_t errlen);

/* Opens path (a regular file, FIFO or character device; "-" is NOT special here) and runs check_stream.
 * Adds CHECK_NOINPUT for a file that cannot be opened or is a directory. */
int check_file(const char *path, const check_opts *o, check_report *r, FILE *out, char *err, size_t errlen);

/* CHECK_* → the process exit code documented above. */
int check_exit_code(int rc);

/*
 * The `spill check INPUT [--all]` command.  argv holds the arguments AFTER
 * the word "check" (main.c passes argc - 2, argv + 2); INPUT "-" reads stdin.  Prints the sentence(s) or
 * "INPUT: OK — N chat-completion batch rows, model X" to stdout, usage and
 * open errors to stderr; returns the exit code; never calls exit().
 */
int check_main(int argc, char **argv);

#endif
