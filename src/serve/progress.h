/*
 * progress.h — what the status pages show of one job while it runs: its committed row counts, two charts of its
 * passes (seconds per pass and tok/s, SVG drawn by svg.c), its memory plan (the job's pre-run line and the last
 * pass's resident memory and KV pages) and the tail of its answered rows.  `spill serve` serves it per batch at
 * GET /v1/batches/{id}/progress; `spill run --status-port N` serves it for a job started on the command line
 * (status_server below).  Both need a key: the tail holds row content.
 */
#ifndef SPILL_PROGRESS_H
#define SPILL_PROGRESS_H

#include <jansson.h>
#include <stddef.h>

/* The job in jobdir as a JSON object (a new reference, never NULL):
 *   {"counts": {"total", "completed", "failed"},               total as given; the manifest's committed counts
 *    "plan": "spill run: …",                                   plan_line, or "" when NULL
 *    "passes": N, "last_pass": {"seconds", "tok_s", "rows", "rss_bytes", "kv_pages"},   from pass_csv
 *    "chart_seconds": "<svg …>", "chart_tok_s": "<svg …>",   the last 400 passes ("" before the first)
 *    "tail": [{"custom_id", "status_code", "finish_reason", "text"}]}   the last 8 lines of results.jsonl,
 *                                                             text cut at 200 bytes (on a UTF-8 boundary)
 * pass_csv is a `--pass-log` file (NULL: no passes); a file that is missing or cut mid-line reads as what it holds. */
json_t *progress_json(const char *jobdir, const char *pass_csv, const char *plan_line, unsigned long long total);

/* The last line of the text file at path that starts with "spill run: " or "spill resume: " (a batch's log holds
 * its job's pre-run lines), into out; "" when there is none. */
void progress_plan_from_log(const char *path, char *out, size_t cap);

/* `spill run --status-port N`: an HTTP server on 127.0.0.1:port in its own thread, serving the job page at `/`
 * and progress_json at /progress to a client that sends `Authorization: Bearer KEY`, KEY made here (32 hex
 * characters from getrandom) and written to key (cap >= 33).  plan_line is read at each request (the caller keeps
 * it alive and may fill it later).  Returns NULL with a sentence in err when the port cannot be bound. */
typedef struct status_server status_server;
status_server *status_server_start(int port, const char *jobdir, const char *pass_csv, const char *plan_line,
                                   unsigned long long total, char *key, size_t cap, char *err, size_t errlen);
void status_server_stop(status_server *s);

#endif
