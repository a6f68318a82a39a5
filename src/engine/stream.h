/*
 * stream.h — reading a model's layers from storage, in layer order, every
 * pass, into a ring of buffers allocated once.
 *
 * The consumer (the forward pass) asks for layer l, computes with it, and
 * gives it back; reader threads meanwhile fill the next slots of the ring
 * with the following layers (wrapping to layer 0 of the next pass), so reads
 * overlap compute.  Reads bypass the page cache (O_DIRECT) in large aligned
 * requests; the bytes land where the forward pass binds tensors directly.
 */
#ifndef SPILL_STREAM_H
#define SPILL_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"

typedef struct stream stream;

typedef struct stream_opts {
    int slots;          /* ring buffers (≥ 2); each holds the largest layer */
    int readers;        /* reader threads (requests in flight); 0 = slots - 1 */
    size_t chunk_bytes; /* largest single read, e.g. 16 MiB */
    bool direct;        /* O_DIRECT (falls back to buffered reads where the file system refuses it) */
    int first_layer;    /* layers [first_layer, L) are streamed, in order, every pass (0 = all) */
    /* The ring is one allocation of slots × slot bytes, 4 KiB-aligned; alloc/release replace
     * aligned_alloc/free when set (the GPU engine passes pinned host memory, so the copy engine reads
     * the slots directly). */
    void *(*alloc)(size_t bytes, void *ctx);
    void (*release)(void *p, void *ctx);
    void *alloc_ctx;
} stream_opts;

/* One streamed layer, valid between stream_acquire and stream_release. */
typedef struct stream_layer {
    int layer;
    /* Pointer to the byte at absolute offset `off` of file `f` in this layer's
     * data: base[f] + (off - file_off[f]).  Files the layer has no bytes in have base NULL. */
    const uint8_t **base;
    const uint64_t *file_off;
    const uint8_t *slot; /* the layer's segments back to back (see stream_slot_offset) */
    size_t slot_len;     /* bytes of them */
} stream_layer;

/* Plans the ring for the model's layers (every range with layer ≥ 0) and
 * starts the reader threads, which begin reading layer 0 at once. */
int stream_open(const model_desc *m, const stream_opts *o, stream **out, char *err, size_t errlen);

/* Waits for layer l (layers must be acquired in order first..L-1, then
 * first again for the next pass).  Several layers may be held at once (up
 * to the slot count); they are released in the order acquired.  Returns 0,
 * or -1 with a sentence on a read error. */
int stream_acquire(stream *s, int layer, stream_layer *out, char *err, size_t errlen);

/* Gives the slot of the oldest layer held back to the readers. */
void stream_release(stream *s, int layer);

/* Where byte `abs_off` of file `file` lands in layer `layer`'s slot (fixed
 * for the life of the stream), or -1 when that layer reads no such byte. */
int64_t stream_slot_offset(const stream *s, int layer, uint32_t file, uint64_t abs_off);

/* Bytes layer `layer` occupies in its slot (stream_layer.slot_len). */
size_t stream_layer_len(const stream *s, int layer);

/* Bytes of one slot (the largest layer, 4 KiB-aligned segments). */
size_t stream_slot_bytes(const stream *s);

/* Stops the readers and frees the ring.  Safe on NULL. */
void stream_close(stream *s);

/* Bytes of the ring (what streaming costs in RAM). */
size_t stream_ring_bytes(const stream *s);

/* Totals since open: bytes read from storage, seconds the consumer waited,
 * seconds readers spent in read calls. */
void stream_stats(const stream *s, uint64_t *bytes, double *wait_s, double *read_s);

#endif
