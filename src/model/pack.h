/*
 * pack.h — `spill pack`: rewrite any model spill reads into the streaming
 * layout (one GGUF, layer-contiguous, 4 KiB-aligned, optionally requantized).
 */
#ifndef SPILL_PACK_H
#define SPILL_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pack_quant { PACK_NONE, PACK_Q8, PACK_Q4, PACK_BF16, PACK_FP8 };

typedef struct pack_opts {
    const char *model; /* anything model_resolve accepts: .gguf, HF directory, tag */
    const char *out;   /* output .gguf */
    enum pack_quant quant;
    int threads;   /* rows are converted in parallel; 0 = every online CPU */
    bool progress; /* redraw a progress line on stderr */
} pack_opts;

typedef struct pack_tensor_report {
    char name[96]; /* canonical name */
    uint32_t src_type, dst_type;
    uint64_t src_bytes, dst_bytes;
    bool requantized; /* converted to a quantized type (else copied, or widened to F32) */
    double rel_err;   /* ||W - Wq|| / ||W|| against the source's values; 0 unless requantized */
    double alt_err;   /* q4: the error of the Q4 type not chosen (Q4_1 when Q4_0 won, and back); else 0 */
    bool permuted;    /* rows reordered for GGUF llama RoPE (HF source) */
} pack_tensor_report;

typedef struct pack_report {
    size_t n;
    pack_tensor_report *t; /* (n) in output file order */
    uint64_t src_bytes;    /* weight bytes in the source */
    uint64_t dst_bytes;    /* output file size */
    double rel_err;        /* over every requantized tensor: sqrt(Σ||W-Wq||²) / sqrt(Σ||W||²) */
    double worst_err;      /* largest per-tensor rel_err */
    double seconds;
    size_t n_q4_0, n_q4_1; /* q4: how many tensors each type won */
    bool tokenizer_json;   /* HF source: tokenizer.json embedded as spill.tokenizer.json */
} pack_report;

/*
 * Packs o->model into o->out (written atomically).  Output: every KV of a
 * GGUF source except general.alignment (general.file_type updated), or for a
 * Hugging Face directory the llama-family keys model.c reads, the chat
 * template, bos/eos, `spill.stop_ids` (the full stop set) and the whole
 * tokenizer.json as the string `spill.tokenizer.json`.  Tensors: globals
 * first, then each layer in forward-pass order, each 4096-aligned; 2-D
 * weights → Q8_0 (q8), Q4_0 or Q4_1 whichever has the lower measured error
 * (q4), BF16 (bf16), fp8 rows (fp8: GGML_F8_E4M3_ROW, one scale per row; the embedding table and
 * head BF16), or unchanged (none, and tensors already Q8_0 for q8, Q4_0/Q4_1 for
 * q4, BF16 for bf16 or fp8 rows for fp8); 1-D tensors → F32.  An fp8 safetensors source's
 * F8_E4M3 weights always convert (none: to fp8 rows) with their scales.  HF llama checkpoints get
 * their Q/K rows permuted as convert_hf_to_gguf.py does, so the GGUF `llama`
 * RoPE (consecutive pairs) computes what HF's rotate-half computed.
 * Memory: one chunk of rows at a time (16 MiB of fp32), except q4, which
 * holds both candidate encodings of one tensor (~1.2 bytes per element).
 * rep is filled on success (free with pack_report_free).
 */
int pack_model(const pack_opts *o, pack_report *rep, char *err, size_t errlen);

/* "q8", "q4", "bf16", "fp8", "none"; and back (0, or -1 for another name). */
const char *pack_quant_name(enum pack_quant q);
int pack_quant_parse(const char *s, enum pack_quant *q);
void pack_report_free(pack_report *rep);

/* `spill pack MODEL --quant q8|q4|bf16|fp8|none -o OUT.gguf|DIR` (argv after the command word; with a directory the
 * file is DIR/<model name>-<quant>.gguf).  Returns 0, 2 on bad arguments, 65 when the model cannot be packed. */
int pack_main(int argc, char **argv);

#endif
