/*
 * host_share.h — one host copy of a model's streamed layers for every process on the host that streams the
 * same bytes (issue 21 item 1: MPI ranks on one host, one rank per GPU; two jobs of one model; a worker's next
 * batch).  The copy is a file in a shared-memory directory (/dev/shm unless told otherwise), named by the
 * SHA-256 of a key that the caller builds from everything the bytes depend on (the model files' identity, the
 * layout of the tensors in the arena, the build).  The first process to open a name fills it; every later one
 * maps the filled bytes and reads nothing.  The GPU engine registers the mapping with its driver
 * (cudaHostRegister), so each process pins the same physical pages: the host RAM is counted once.
 *
 * Locks (flock on the file, which the kernel drops when a process dies, kill -9 included):
 *   - the filler holds it exclusive until the bytes are complete and the header says so; a process that opens
 *     the name meanwhile waits on the lock, then finds the header ready and maps the bytes;
 *   - every user holds it shared while mapped; the last to close (its exclusive try succeeds) removes the file;
 *   - a filler that died left a header that is not ready: the next opener fills it again;
 *   - files no process holds (every user was killed) are removed by the next open in the same directory, so
 *     a kill -9 costs host RAM only until the next job starts.
 * host_share_keep: a process that runs several jobs (spill worker) keeps the last copy it closed, so its next
 * job of the same model maps it instead of reading it again; host_share_drop_kept releases it.
 */
#ifndef SPILL_HOST_SHARE_H
#define SPILL_HOST_SHARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct host_share host_share;

#define HOST_SHARE_DEFAULT_DIR "/dev/shm"

/*
 * Opens (or creates) the shared copy of `bytes` bytes named by key (any string; its SHA-256 names the file) in
 * dir (NULL: HOST_SHARE_DEFAULT_DIR).  *base: the bytes (page-aligned, 2 MiB-aligned in the file).  *fill true:
 * this process must fill them, then call host_share_ready (it holds the lock exclusive until then; others
 * wait); false: they are filled already.  Returns 0; 1 when the directory cannot hold them (missing, not
 * writable, or short of room: *why says which, and the caller keeps a private copy); -1 with a sentence.
 */
int host_share_open(const char *dir, const char *key, size_t bytes, host_share **out, uint8_t **base, bool *fill,
                    char *why, size_t whylen);

/* The filler's bytes are complete: marks the header ready and lets waiting processes map them.  0 or -1. */
int host_share_ready(host_share *s, char *err, size_t errlen);

/* Unmaps; the last process holding the name removes it (a copy never made ready is removed too).  NULL: no-op. */
void host_share_close(host_share *s);

/* The file's path (for messages and tests). */
const char *host_share_path(const host_share *s);

/* Keep mode (spill worker): host_share_close keeps the closed copy's name held (not its mapping) until the next
 * close replaces it or host_share_drop_kept. */
void host_share_keep(bool on);
void host_share_drop_kept(void);
/* Whether keep mode is on (the GPU engine keeps its HBM-resident layers between a worker's jobs too). */
bool host_share_keeping(void);
/* out = the SHA-256 hex of key (64 characters and a NUL). */
void host_share_key_hex(const char *key, char out[65]);

/* The bytes of the filled copies in dir (NULL: the default): RAM that mapping one of them does not take anew. */
uint64_t host_share_ready_bytes(const char *dir);

/* Removes the files in dir (NULL: the default) that no process holds; returns how many. */
int host_share_sweep(const char *dir);

#endif
