/*
 * synth.h — `spill synth`: a GGUF with random weights of a real model's
 * exact shapes, for benchmarks and tests (no download, any size).
 */
#ifndef SPILL_SYNTH_H
#define SPILL_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A model shape.  Dimension letters: D model, H heads, K kv heads, F ffn, V vocab, L layers. */
typedef struct synth_shape {
    const char *name; /* llama3-8b, llama3-70b, qwen2.5-7b, smollm2-135m, tiny */
    const char *arch; /* GGUF general.architecture: llama | qwen2 */
    int D, H, K, F, V, L;
    double rope_theta;
    float norm_eps;
    int ctx_len;
    bool qkv_bias; /* q/k/v projections carry biases (Qwen2) */
    bool tied;     /* no output.weight: the head reuses token_embd */
    int S;         /* head size; 0 = D / H */
    int E, E_used; /* MoE: experts per layer and per token (F is then each expert's FFN dim); 0 = dense */
    bool qk_norm;  /* per-head q/k RMSNorm (Qwen3) */
} synth_shape;

/* The preset of that name, or NULL. */
const synth_shape *synth_find(const char *name);

typedef struct synth_opts {
    const char *like; /* preset name */
    int layers;       /* 0 = the preset's L; else 1..L */
    uint32_t wtype;   /* matrices: GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0 or GGML_F8_E4M3_ROW (fp8; head BF16) */
    uint64_t seed;
    int threads;      /* generator threads; 0 = every online CPU */
    const char *path; /* output .gguf */
    bool progress;    /* redraw a progress line on stderr */
    bool sparse;      /* layer matrices are left as holes (zeros, no disk): the globals and every norm are real,
                         so a model of any size fits a small disk and still gives varied tokens — for throughput
                         runs only (each layer's attention and FFN then add zero) */
} synth_opts;

typedef struct synth_stats {
    uint64_t bytes; /* file size */
    double seconds; /* wall time of the whole write, fsync included */
    bool direct;    /* data written with O_DIRECT */
} synth_stats;

/*
 * Writes the model to o->path (atomically: a temporary file renamed into
 * place).  File order: token_embd, output_norm, output (globals first, one
 * contiguous range), then each layer's tensors in the order the forward pass
 * uses them; alignment 4096, so every tensor and every layer starts on a
 * 4 KiB boundary.  Memory: one write buffer (64 MiB) whatever the model size.
 * Deterministic: the same options give the same bytes.
 */
int synth_write(const synth_opts *o, synth_stats *st, char *err, size_t errlen);

/* `spill synth --like NAME [--layers N] [--quant f16|bf16|q8|q4] [--seed N] [--sparse] -o PATH|DIR`
 * (argv: the arguments after the command word; with a directory the file is
 * DIR/<name>[-L<layers>]-<quant>.gguf).  Returns 0, 2 on bad arguments, 73
 * (EX_CANTCREAT) when the file cannot be written. */
int synth_main(int argc, char **argv);

#endif
