/*
 * util.h — the few helpers every stage shares: error reporting into a
 * caller-owned buffer, overflow-checked arithmetic, bounded file reads,
 * hashing.
 *
 * Error convention (whole project): a function that can fail returns 0 on
 * success or a negative value on failure and, on failure, writes one sentence
 * into `err` (capacity `errlen`, always NUL-terminated when errlen > 0).  The
 * sentence names what, where (file, line/offset, field) and what to do.
 * Library code never exits; only main() turns errors into exit codes.
 */
#ifndef SPILL_UTIL_H
#define SPILL_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPILL_ERRLEN 512

/* Writes a printf-style message into err (if err && errlen) and returns -1. */
int util_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Overflow-checked arithmetic: return true when the result fits. */
static inline bool ck_add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static inline bool ck_add_size(size_t a, size_t b, size_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool ck_mul_size(size_t a, size_t b, size_t *r) { return !__builtin_mul_overflow(a, b, r); }

/*
 * Reads a whole file into a fresh NUL-terminated buffer (caller frees *out).
 * Fails with a sentence if the file cannot be opened/read or is larger than
 * `cap` bytes (the check happens before allocation).
 */
int util_read_file(const char *path, size_t cap, char **out, size_t *len, char *err, size_t errlen);

/* Hex SHA-256 (65 bytes incl. NUL) of a buffer. */
void util_sha256_hex(const void *data, size_t len, char out[65]);

/* True if path names an existing regular file / directory. */
bool util_is_file(const char *path);
bool util_is_dir(const char *path);

/* snprintf that reports truncation as failure (returns -1). */
int util_pathf(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes path atomically and durably: path.tmp, fsync, rename, fsync of the
 * directory; creates the directory and its parent when missing. */
int util_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);

/* The spill home directory: $SPILL_HOME, else $HOME/.streamweights. */
const char *util_spill_home(void);

/* Validates that [s, s+len) is well-formed UTF-8 (no overlongs, no surrogates). */
bool util_utf8_valid(const char *s, size_t len);

#endif
