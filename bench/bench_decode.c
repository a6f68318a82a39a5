/*
 * bench_decode.c — decode throughput of the CPU engine on a real model, the
 * spill half of benchmark B4 (tools/bench_b4.py runs llama.cpp beside it).
 *
 *   build/bench/bench_decode MODEL [--batch 1,8,32] [--tokens N] [--prompt N]
 *                            [--threads N] [--exact] [--stream]
 *
 * For each batch size B: B rows each prefill the same P-token prompt (one
 * pass), then decode N tokens together (greedy, EOS ignored so every row runs
 * N steps).  Prints one JSON line per B: decode tok/s (B·N / decode seconds),
 * pass time, and the weight bytes each pass reads against the machine's
 * memory bandwidth is not claimed here — tok/s vs the peer is the figure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "model/model.h"
#include "base/util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_decode MODEL [--batch 1,8,32] [--tokens N] [--prompt N] [--threads N] "
                        "[--exact] [--stream]\n");
        return 2;
    }
    const char *batches = "1,8,32";
    int n_tok = 64, n_prompt = 32, threads = 0;
    bool exact = false, streamed = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batches = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_tok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exact"))
            exact = true;
        else if (!strcmp(argv[i], "--stream"))
            streamed = true;
    }
    char path[4096], err[SPILL_ERRLEN];
    model_desc *m;
    if (model_resolve(argv[1], path, sizeof path, err, sizeof err) || model_open(path, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int maxB = 1;
    for (const char *p = batches; *p;) {
        int b = atoi(p);
        maxB = b > maxB ? b : maxB;
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
    }
    int T = maxB * n_prompt > maxB ? maxB * n_prompt : maxB;
    int ctx = n_prompt + n_tok + 1;
    engine_opts o = {.threads = threads,
                     .max_pass_tokens = T,
                     .max_pass_seqs = maxB,
                     .page_tokens = 16,
                     .kv_pages = (int32_t)(maxB * ((ctx + 15) / 16) + 8),
                     .stream = streamed,
                     .stream_slots = 3,
                     .direct_io = true,
                     .q8_activations = !exact};
    spill_engine *e;
    if (engine_open(m, &o, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = 100 + (i * 7919) % (m->vocab - 200);
    kv_row *kr = calloc((size_t)maxB, sizeof *kr);
    fwd_seq *sq = calloc((size_t)maxB, sizeof *sq);
    int32_t *next = calloc((size_t)maxB, sizeof *next);
    float *logits = malloc((size_t)maxB * (size_t)m->vocab * sizeof(float));
    for (const char *p = batches; *p;) {
        int B = atoi(p);
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
        if (B <= 0)
            continue;
        for (int b = 0; b < B; b++) {
            kv_row_release(engine_kv(e), &kr[b]);
            kv_row_reserve(engine_kv(e), &kr[b], ctx);
            sq[b] = (fwd_seq){&kr[b], 0, n_prompt, prompt, true, false, 0, 0};
        }
        double t0 = now_s();
        if (engine_forward(e, sq, B, logits, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        double t_prefill = now_s() - t0;
        t0 = now_s();
        for (int step = 0; step < n_tok; step++) {
            for (int b = 0; b < B; b++) {
                const float *l = logits + (size_t)b * (size_t)m->vocab;
                int best = 0;
                for (int v = 1; v < m->vocab; v++)
                    if (l[v] > l[best])
                        best = v;
                next[b] = best;
                sq[b] = (fwd_seq){&kr[b], n_prompt + step, 1, &next[b], true, false, 0, 0};
            }
            if (engine_forward(e, sq, B, logits, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
        }
        double t_dec = now_s() - t0;
        size_t ring = 0;
        uint64_t rb = 0;
        double wait_s = 0, read_s = 0;
        bool st = engine_stream_stats(e, &ring, &rb, &wait_s, &read_s);
        static uint64_t rb_prev;
        static double read_prev, wait_prev;
        char extra[256] = "";
        if (st) /* bytes/seconds of this batch size's passes only (prefill + decode) */
            snprintf(extra, sizeof extra,
                     ",\"stream_bytes\":%llu,\"stream_read_s\":%.3f,\"compute_wait_s\":%.3f,\"ring_bytes\":%zu,"
                     "\"achieved_gbs\":%.3f",
                     (unsigned long long)(rb - rb_prev), read_s - read_prev, wait_s - wait_prev, ring,
                     (double)(rb - rb_prev) / 1e9 / (t_dec + t_prefill));
        rb_prev = rb, read_prev = read_s, wait_prev = wait_s;
        printf("{\"batch\":%d,\"threads\":%d,\"q8_activations\":%s,\"streamed\":%s,\"prompt\":%d,\"tokens\":%d,"
               "\"prefill_s\":%.4f,\"prefill_tok_s\":%.1f,\"decode_s\":%.4f,\"pass_ms\":%.3f,\"decode_tok_s\":%.2f%s}\n",
               B, engine_threads(e), exact ? "false" : "true", streamed ? "true" : "false", n_prompt, n_tok,
               t_prefill, (double)(B * n_prompt) / t_prefill, t_dec, t_dec / n_tok * 1e3, (double)(B * n_tok) / t_dec,
               extra);
        fflush(stdout);
    }
    for (int b = 0; b < maxB; b++)
        kv_row_free(engine_kv(e), &kr[b]);
    free(kr), free(sq), free(next), free(logits), free(prompt);
    engine_close(e);
    model_close(m);
    return 0;
}
