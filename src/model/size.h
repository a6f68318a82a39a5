/*
 * size.h — how big a model is per quant, from its config's shapes alone (no weight file read): what `spill
 * models` lists, what the hub checks against the free disk before a download, and what a run's --quant choice
 * can weigh.  See size.c.
 */
#ifndef SPILL_SIZE_H
#define SPILL_SIZE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* The quants spill stores weights in, for the estimate: bf16 (2 bytes per weight), q8 (Q8_0: 34 bytes per 32),
 * q4 (Q4_1's 20 bytes per 32: the larger of spill pack's two choices, so the figure is an upper bound), fp8
 * (spill pack's fp8 rows: 1 byte + a 16-byte scale header per row; the embedding table and head bf16). */
enum size_quant { SIZE_BF16, SIZE_Q8, SIZE_Q4, SIZE_FP8, SIZE_N_QUANTS };

/* The shapes an estimate needs (dimension letters as model.h: L D H K S F V, E experts of FE, shared FS). */
typedef struct model_shape {
    char arch[32];             /* normalised family name (arch.c), e.g. llama */
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, ffn_dim, vocab;
    int n_experts, expert_ffn_dim, shared_ffn_dim;
    int n_sparse_layers;       /* layers whose FFN is the experts (all of them for Mixtral, fewer for Qwen2-MoE) */
    bool tied_embeddings, qkv_bias;
} model_shape;

/* "bf16", "q8", "q4", "fp8". */
const char *size_quant_name(enum size_quant q);

/* Reads the shapes from a Hugging Face config.json (text_config when it has one).  Fails with a sentence naming
 * `where` (the file or URL the config came from) and the missing field. */
int model_shape_from_config(const json_t *config, const char *where, model_shape *out, char *err, size_t errlen);

/* The shapes of a model already described (a GGUF file or an HF directory model.c opened). */
struct model_desc;
void model_shape_from_desc(const struct model_desc *m, model_shape *out);

/* Weights: every matrix and vector the family has (embeddings, attention with GQA, MLP or experts and router,
 * norms, biases). */
uint64_t model_param_count(const model_shape *s);

/* Bytes of the weights stored in quant q: matrices at q's bytes per weight, vectors as spill stores them (bf16,
 * or f32 in the GGUF quants). */
uint64_t model_size_estimate(const model_shape *s, enum size_quant q);

/* "1.2 GB", "512 MB", "3.4 kB" (decimal units) into out. */
void size_human(uint64_t bytes, char *out, size_t cap);

#endif
