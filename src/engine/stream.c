/*
 * stream.c — the layer streamer (see stream.h).
 *
 * Plan: each layer is a list of segments, one per file it has bytes in,
 * widened to 4 KiB boundaries (O_DIRECT needs 4096-aligned offset, length and
 * buffer); a slot of the ring holds one layer's segments back to back, each
 * starting 4 KiB-aligned.  Slot size = the largest layer.
 *
 * Concurrency: reads are numbered k = pass * L + layer.  Read k goes to slot
 * k % slots.  Each reader thread takes the next k whose slot is free, reads
 * the whole layer in chunk_bytes requests, and marks the slot ready; with R
 * readers, R layers are in flight at once, which keeps several requests
 * queued at the device (what an SSD needs to reach its sequential rate)
 * without io_uring.  The consumer takes slots strictly in k order.
 * Alternatives left out: io_uring (one more dependency and code path for the
 * same queue depth at MiB-sized requests) and mmap (the prototype measured
 * 8-13% of disk rate through the page cache).
 */
#include "stream.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/util.h"

#define ALIGN 4096u

typedef struct seg {
    uint32_t file;
    uint64_t off, len;   /* aligned file range */
    uint64_t need_end;   /* bytes up to here must be read (the data's real end) */
    uint64_t slot_off;   /* where it lands in the slot */
} seg;

typedef struct layer_plan {
    size_t n_seg;
    seg *segs;
    size_t len; /* sum of the segments' lengths */
} layer_plan;

enum { SLOT_FREE, SLOT_READING, SLOT_READY, SLOT_ERROR };

typedef struct slot {
    uint8_t *buf;
    int state;
    uint64_t k;          /* read number held */
    const uint8_t **base;/* (n_files) */
    uint64_t *file_off;  /* (n_files) */
} slot;

struct stream {
    const model_desc *m;
    int n_layers, first; /* streams layers [first, n_layers) */
    int n_stream;        /* n_layers - first */
    uint8_t *arena;      /* n_slots × slot_bytes */
    stream_opts o;
    size_t n_files;
    int *fds;
    layer_plan *plan;
    int n_slots;
    slot *slots;
    size_t slot_bytes, chunk;
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next_read, next_acquire, next_consume; /* read numbers: next to read, hand out, take back */
    bool stop;
    char err[SPILL_ERRLEN];
    uint64_t bytes;
    double wait_s, read_s;
};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int read_seg(stream *s, const seg *g, uint8_t *dst, const char *path, char *err, size_t errlen)
{
    uint64_t done = 0;
    while (g->off + done < g->need_end) {
        uint64_t want = g->len - done;
        if (want > s->chunk)
            want = s->chunk;
        ssize_t r = pread(s->fds[g->file], dst + done, (size_t)want, (off_t)(g->off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return util_errf(err, errlen, "%s: read of %llu bytes at offset %llu failed: %s.", path,
                             (unsigned long long)want, (unsigned long long)(g->off + done),
                             r < 0 ? strerror(errno) : "unexpected end of file");
        done += (uint64_t)r;
        if ((size_t)r < want && g->off + done < g->need_end && (r % ALIGN) != 0)
            return util_errf(err, errlen, "%s: short read at offset %llu.", path,
                             (unsigned long long)(g->off + done));
    }
    __atomic_add_fetch(&s->bytes, done, __ATOMIC_RELAXED);
    return 0;
}

static void *reader_main(void *arg)
{
    stream *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->slots[s->next_read % (uint64_t)s->n_slots].state != SLOT_FREE)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        uint64_t k = s->next_read++;
        slot *sl = &s->slots[k % (uint64_t)s->n_slots];
        sl->state = SLOT_READING;
        sl->k = k;
        pthread_mutex_unlock(&s->mu);

        const layer_plan *lp = &s->plan[s->first + (int)(k % (uint64_t)s->n_stream)];
        char err[SPILL_ERRLEN] = "";
        double t0 = mono();
        int rc = 0;
        for (size_t f = 0; f < s->n_files; f++)
            sl->base[f] = NULL, sl->file_off[f] = 0;
        for (size_t i = 0; i < lp->n_seg && rc == 0; i++) {
            const seg *g = &lp->segs[i];
            rc = read_seg(s, g, sl->buf + g->slot_off, s->m->files[g->file].path, err, sizeof err);
            sl->base[g->file] = sl->buf + g->slot_off;
            sl->file_off[g->file] = g->off;
        }
        double dt = mono() - t0;
        pthread_mutex_lock(&s->mu);
        s->read_s += dt;
        sl->state = rc ? SLOT_ERROR : SLOT_READY;
        if (rc && !s->err[0])
            memcpy(s->err, err, sizeof s->err);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

int stream_open(const model_desc *m, const stream_opts *o, stream **out, char *err, size_t errlen)
{
    *out = NULL;
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return util_errf(err, errlen, "out of memory.");
    s->m = m;
    s->o = *o;
    s->n_layers = m->n_layers;
    s->first = o->first_layer > 0 ? o->first_layer : 0;
    s->n_stream = s->n_layers - s->first;
    if (s->n_stream <= 0) {
        free(s);
        return util_errf(err, errlen, "stream: no layers from %d of %d to stream.", o->first_layer, m->n_layers);
    }
    s->n_files = m->n_files;
    s->chunk = o->chunk_bytes ? (o->chunk_bytes + ALIGN - 1) / ALIGN * ALIGN : (16u << 20);
    s->n_slots = o->slots >= 2 ? o->slots : 2;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->fds = malloc(m->n_files * sizeof *s->fds);
    s->plan = calloc((size_t)m->n_layers, sizeof *s->plan);
    if (!s->fds || !s->plan)
        goto oom;
    for (size_t f = 0; f < m->n_files; f++)
        s->fds[f] = -1;
    for (size_t f = 0; f < m->n_files; f++) {
        int fd = o->direct ? open(m->files[f].path, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
        if (fd < 0) /* tmpfs and some FUSE mounts refuse O_DIRECT: buffered reads still work */
            fd = open(m->files[f].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            util_errf(err, errlen, "%s: cannot open for streaming: %s.", m->files[f].path, strerror(errno));
            goto fail;
        }
        s->fds[f] = fd;
    }
    /* plan: one segment per (layer, file) range */
    for (size_t i = 0; i < m->n_ranges; i++) {
        const layer_range *r = &m->ranges[i];
        if (r->layer < 0)
            continue;
        layer_plan *lp = &s->plan[r->layer];
        seg *ns = realloc(lp->segs, (lp->n_seg + 1) * sizeof *ns);
        if (!ns)
            goto oom;
        lp->segs = ns;
        seg *g = &lp->segs[lp->n_seg++];
        g->file = r->file;
        g->off = r->begin / ALIGN * ALIGN;
        g->need_end = r->end;
        g->len = (r->end + ALIGN - 1) / ALIGN * ALIGN - g->off;
    }
    for (int l = s->first; l < m->n_layers; l++) {
        size_t at = 0;
        if (!s->plan[l].n_seg) {
            util_errf(err, errlen, "%s: layer %d has no tensors to stream.", m->source, l);
            goto fail;
        }
        for (size_t i = 0; i < s->plan[l].n_seg; i++) {
            s->plan[l].segs[i].slot_off = at;
            at += (size_t)s->plan[l].segs[i].len;
        }
        s->plan[l].len = at;
        if (at > s->slot_bytes)
            s->slot_bytes = at;
    }
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    if (!s->slots)
        goto oom;
    size_t arena_bytes = s->slot_bytes * (size_t)s->n_slots; /* slot_bytes is a multiple of ALIGN */
    s->arena = o->alloc ? o->alloc(arena_bytes, o->alloc_ctx) : aligned_alloc(ALIGN, arena_bytes);
    if (!s->arena)
        goto oom;
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].buf = s->arena + (size_t)i * s->slot_bytes;
        s->slots[i].base = calloc(m->n_files, sizeof *s->slots[i].base);
        s->slots[i].file_off = calloc(m->n_files, sizeof *s->slots[i].file_off);
        if (!s->slots[i].base || !s->slots[i].file_off)
            goto oom;
    }
    s->n_threads = o->readers > 0 ? o->readers : s->n_slots - 1;
    if (s->n_threads > s->n_slots)
        s->n_threads = s->n_slots;
    s->threads = calloc((size_t)s->n_threads, sizeof *s->threads);
    if (!s->threads)
        goto oom;
    for (int i = 0; i < s->n_threads; i++)
        if (pthread_create(&s->threads[i], NULL, reader_main, s) != 0) {
            s->n_threads = i;
            util_errf(err, errlen, "cannot start stream reader threads.");
            goto fail;
        }
    *out = s;
    return 0;
oom:
    util_errf(err, errlen, "out of memory for a stream ring of %d slots of %zu bytes; lower --stream-slots.",
              s->n_slots, s->slot_bytes);
fail:
    stream_close(s);
    return -1;
}

int stream_acquire(stream *s, int layer, stream_layer *out, char *err, size_t errlen)
{
    uint64_t k = s->next_acquire;
    int want = s->first + (int)(k % (uint64_t)s->n_stream);
    if (want != layer)
        return util_errf(err, errlen, "stream: layer %d requested out of order (expected %d).", layer, want);
    if (k >= s->next_consume + (uint64_t)s->n_slots)
        return util_errf(err, errlen, "stream: all %d slots are held; release one before acquiring layer %d.",
                         s->n_slots, layer);
    slot *sl = &s->slots[k % (uint64_t)s->n_slots];
    double t0 = mono();
    pthread_mutex_lock(&s->mu);
    while (!(sl->k == k && (sl->state == SLOT_READY || sl->state == SLOT_ERROR)))
        pthread_cond_wait(&s->cv, &s->mu);
    int st = sl->state;
    s->wait_s += mono() - t0;
    pthread_mutex_unlock(&s->mu);
    if (st == SLOT_ERROR)
        return util_errf(err, errlen, "%s", s->err);
    out->layer = layer;
    out->base = sl->base;
    out->file_off = sl->file_off;
    out->slot = sl->buf;
    out->slot_len = s->plan[layer].len;
    s->next_acquire++;
    return 0;
}

void stream_release(stream *s, int layer)
{
    (void)layer;
    pthread_mutex_lock(&s->mu);
    s->slots[s->next_consume % (uint64_t)s->n_slots].state = SLOT_FREE;
    s->next_consume++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void stream_close(stream *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_threads; i++)
        pthread_join(s->threads[i], NULL);
    free(s->threads);
    if (s->arena) {
        if (s->o.release)
            s->o.release(s->arena, s->o.alloc_ctx);
        else
            free(s->arena);
    }
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        free(s->slots[i].base);
        free(s->slots[i].file_off);
    }
    free(s->slots);
    for (int l = 0; s->plan && l < s->n_layers; l++)
        free(s->plan[l].segs);
    free(s->plan);
    for (size_t f = 0; s->fds && f < s->n_files; f++)
        if (s->fds[f] >= 0)
            close(s->fds[f]);
    free(s->fds);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

size_t stream_ring_bytes(const stream *s) { return s->slot_bytes * (size_t)s->n_slots; }

size_t stream_slot_bytes(const stream *s) { return s->slot_bytes; }

size_t stream_layer_len(const stream *s, int layer)
{
    return layer >= s->first && layer < s->n_layers ? s->plan[layer].len : 0;
}

int64_t stream_slot_offset(const stream *s, int layer, uint32_t file, uint64_t abs_off)
{
    if (layer < s->first || layer >= s->n_layers)
        return -1;
    const layer_plan *lp = &s->plan[layer];
    for (size_t i = 0; i < lp->n_seg; i++) {
        const seg *g = &lp->segs[i];
        if (g->file == file && abs_off >= g->off && abs_off < g->need_end)
            return (int64_t)(g->slot_off + (abs_off - g->off));
    }
    return -1;
}

void stream_stats(const stream *s, uint64_t *bytes, double *wait_s, double *read_s)
{
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *bytes = __atomic_load_n(&s->bytes, __ATOMIC_RELAXED);
    *wait_s = s->wait_s;
    *read_s = s->read_s;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
}
