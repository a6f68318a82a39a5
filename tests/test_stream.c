/*
 * test_stream.c — the layer streamer (stream.h) read back against the files.
 *
 * For a safetensors fixture (tensor offsets not aligned to anything) and the
 * tiny GGUF, with every combination of: all layers or a suffix
 * (first_layer), 2 or 3 slots, 1 or 2 readers, O_DIRECT or buffered, default
 * or caller-provided ring memory:
 *  - two passes acquire the layers in order, holding as many slots at once as
 *    the ring has (what the GPU engine does while copies are in flight);
 *  - every tensor of every layer is byte-equal to the file at
 *    slot + stream_slot_offset, and base[f] + (off - file_off[f]) names the
 *    same byte (the CPU engine's view);
 *  - slot_len is stream_layer_len and fits stream_slot_bytes;
 *  - the caller's allocator is called once for slots × slot bytes and its
 *    release once at close;
 *  - out-of-order acquires, holding more than the ring, and an empty layer
 *    range fail with a sentence instead of hanging.
 */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "model/model.h"
#include "engine/stream.h"
#include "test.h"
#include "base/util.h"

typedef struct counted {
    int allocs, releases;
    size_t bytes;
} counted;

static void *c_alloc(size_t bytes, void *ctx)
{
    counted *c = ctx;
    c->allocs++;
    c->bytes = bytes;
    return aligned_alloc(4096, bytes);
}

static void c_release(void *p, void *ctx)
{
    ((counted *)ctx)->releases++;
    free(p);
}

/* Compares layer l's tensors in the acquired slot with the file. */
static void check_layer(const model_desc *m, const stream *s, const stream_layer *sl, int l, const char *what)
{
    CHECK(sl->layer == l && sl->slot_len == stream_layer_len(s, l) && sl->slot_len <= stream_slot_bytes(s),
          "%s: layer %d: slot_len %zu, layer len %zu, slot bytes %zu", what, l, sl->slot_len, stream_layer_len(s, l),
          stream_slot_bytes(s));
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (t->layer != l)
            continue;
        int64_t at = stream_slot_offset(s, l, t->file, t->offset);
        CHECK(at >= 0 && (uint64_t)at + t->size <= sl->slot_len, "%s: %s: slot offset %lld of %zu", what, t->name,
              (long long)at, sl->slot_len);
        if (at < 0 || (uint64_t)at + t->size > sl->slot_len)
            continue;
        const uint8_t *p = sl->slot + at;
        CHECK(sl->base[t->file] && sl->base[t->file] + (t->offset - sl->file_off[t->file]) == p,
              "%s: %s: base/file_off disagree with the slot offset", what, t->name);
        uint8_t *want = malloc(t->size);
        int fd = open(m->files[t->file].path, O_RDONLY);
        CHECK(want && fd >= 0 && pread(fd, want, t->size, (off_t)t->offset) == (ssize_t)t->size, "%s: reading %s",
              what, t->name);
        if (fd >= 0)
            close(fd);
        CHECK(want && !memcmp(p, want, t->size), "%s: %s differs from the file", what, t->name);
        free(want);
    }
}

static void run_one(const model_desc *m, int first, int slots, int readers, bool direct, bool own_alloc)
{
    char what[160], err[SPILL_ERRLEN] = "";
    snprintf(what, sizeof what, "%s first %d slots %d readers %d %s %s", m->source, first, slots, readers,
             direct ? "direct" : "buffered", own_alloc ? "own alloc" : "default alloc");
    counted c = {0};
    stream_opts o = {.slots = slots, .readers = readers, .chunk_bytes = 8192, .direct = direct, .first_layer = first};
    if (own_alloc)
        o.alloc = c_alloc, o.release = c_release, o.alloc_ctx = &c;
    stream *s = NULL;
    int rc = stream_open(m, &o, &s, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", what, err);
    if (rc)
        return;
    if (own_alloc)
        CHECK(c.allocs == 1 && c.bytes == stream_slot_bytes(s) * (size_t)slots && c.bytes == stream_ring_bytes(s),
              "%s: %d allocations of %zu bytes for %d slots of %zu", what, c.allocs, c.bytes, slots,
              stream_slot_bytes(s));
    CHECK(stream_slot_offset(s, first - 1, 0, 0) == -1 || first == 0, "%s: a layer before first has an offset",
          what);
    /* two passes, holding up to `slots` layers at once, released oldest first */
    int held = 0, next_release = first;
    for (int pass = 0; pass < 2; pass++)
        for (int l = first; l < m->n_layers; l++) {
            if (held == slots) {
                stream_release(s, next_release);
                next_release = next_release + 1 < m->n_layers ? next_release + 1 : first;
                held--;
            }
            stream_layer sl;
            rc = stream_acquire(s, l, &sl, err, sizeof err);
            CHECK(rc == 0, "%s: pass %d layer %d: %s", what, pass, l, err);
            if (rc) {
                stream_close(s);
                return;
            }
            held++;
            check_layer(m, s, &sl, l, what);
        }
    /* holding every slot, one more acquire must refuse rather than wait forever */
    if (held == slots) {
        stream_layer sl;
        int l = first + (next_release - first + held) % (m->n_layers - first);
        CHECK(stream_acquire(s, l, &sl, err, sizeof err) == -1 && strstr(err, "slots are held"),
              "%s: acquire with the ring held: %s", what, err);
    }
    /* out of order */
    while (held > 0) {
        stream_release(s, next_release);
        next_release = next_release + 1 < m->n_layers ? next_release + 1 : first;
        held--;
    }
    stream_layer sl;
    int wrong = first + (next_release - first + 1) % (m->n_layers - first);
    if (wrong != next_release)
        CHECK(stream_acquire(s, wrong, &sl, err, sizeof err) == -1 && strstr(err, "out of order"),
              "%s: out-of-order acquire: %s", what, err);
    uint64_t bytes;
    double wait_s, read_s;
    stream_stats(s, &bytes, &wait_s, &read_s);
    CHECK(bytes > 0, "%s: no bytes counted", what);
    stream_close(s);
    if (own_alloc)
        CHECK(c.releases == 1, "%s: ring released %d times", what, c.releases);
}

static void run_model(const char *path)
{
    char err[SPILL_ERRLEN];
    model_desc *m = NULL;
    int rc = model_open(path, &m, err, sizeof err);
    CHECK(rc == 0, "%s: %s", path, err);
    if (rc)
        return;
    for (int first = 0; first < m->n_layers; first += m->n_layers - 1)
        for (int slots = 2; slots <= 3; slots++)
            for (int readers = 1; readers <= 2; readers++)
                for (int direct = 0; direct < 2; direct++)
                    run_one(m, first, slots, readers, direct, (slots + readers + direct) % 2 == 0);
    stream_opts o = {.slots = 2, .first_layer = m->n_layers};
    stream *s = NULL;
    CHECK(stream_open(m, &o, &s, err, sizeof err) == -1 && strstr(err, "no layers") && !s,
          "first_layer = L must fail: %s", err);
    model_close(m);
}

int main(void)
{
    run_model("tests/data/ref/qwen2_bias");
    run_model("tests/data/tiny/tiny-smollm2.gguf");
    return test_finish("test_stream");
}
