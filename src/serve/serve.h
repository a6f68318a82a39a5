/*
 * serve.h — `spill serve`: the OpenAI Files + Batches HTTP API over the job store (see serve.c).
 */
#ifndef SPILL_SERVE_H
#define SPILL_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <microhttpd.h>

/* `spill serve [OPTIONS]`; argv holds the arguments after the word "serve".  Returns the process exit code and
 * never exits. */
int serve_main(int argc, char **argv);

/* True when s is a server-made id: prefix ("file-" or "batch_") then exactly 24 of [A-Za-z0-9], nothing else.
 * The only gate between a client's string and a path in the store. */
bool serve_id_valid(const char *s, const char *prefix);

/* Constant-time equality of two keys (both hashed with SHA-256 first, so neither length nor content leaks). */
bool serve_key_equal(const char *a, const char *b);

/* Queues body (malloc'd; freed by libmicrohttpd) as the response, with its Content-Type and Cache-Control: no-store.
 * Both of spill's servers (serve.c, progress.c's status page) answer through it. */
enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned status, const char *type, char *body);

/* Parses "200M"-style sizes (K, M, G: powers of 1024; none: bytes).  0, or -1 on a bad or zero size. */
int serve_parse_size(const char *s, unsigned long long *out);

#endif
