/*
 * model.h — one description of a model, whatever file format it came from.
 *
 * A model_desc is what every later stage needs to know before touching a
 * weight: architecture and its support state, dimensions, RoPE and norm
 * parameters, per-tensor dtype and file location, per-layer byte ranges (what
 * the streamer reads each pass), the chat template source and the stop set.
 * It is built from a GGUF file or a Hugging Face directory (config.json +
 * safetensors + tokenizer files); the parsers own validation of the bytes,
 * this file owns the meaning.  What a family is (its tensors, conventions and
 * on which engine it runs) is arch.h's table; engines read a model through
 * arch.h's resolved layout.
 */
#ifndef SPILL_MODEL_H
#define SPILL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum model_format { MODEL_GGUF, MODEL_HF };
enum arch_state { ARCH_SUPPORTED, ARCH_EXPECTED, ARCH_UNSUPPORTED };
enum rope_style { ROPE_NEOX /* rotate-half: pairs (i, i+S/2) */, ROPE_NORM /* consecutive pairs (2i, 2i+1) */ };
/* ROPE_SCALE_LONGROPE is Phi-3's: short or long per-frequency factors, chosen by the row's length */
enum rope_scaling {
    ROPE_SCALE_NONE,
    ROPE_SCALE_LINEAR,
    ROPE_SCALE_LLAMA3,
    ROPE_SCALE_YARN,
    ROPE_SCALE_DYNAMIC,
    ROPE_SCALE_LONGROPE
};

/* Weight dtypes use ggml type ids (gguf.h); safetensors-only types get ids from 100 up. */
enum { SPILL_DT_F8_E4M3 = 100, SPILL_DT_F8_E5M2 = 101, SPILL_DT_OTHER = 199 };

#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_EXPERTS 4096
#define MODEL_MAX_STOP 16

typedef struct model_tensor {
    char name[96];      /* canonical (GGUF-style) name: blk.N.attn_q.weight, token_embd.weight, ... */
    char src_name[160]; /* name in the source file (HF name for safetensors) */
    uint32_t dtype;     /* ggml type id or SPILL_DT_* */
    uint32_t n_dims;
    uint64_t ne[4];     /* ne[0] fastest-varying (GGUF order; HF [out,in] becomes ne=[in,out]) */
    int32_t layer;      /* block index, -1 for global tensors */
    uint32_t file;      /* index into model_desc.files */
    uint64_t offset;    /* absolute byte offset in that file */
    uint64_t size;      /* bytes */
    /* An F8_E4M3 safetensors weight (dtype SPILL_DT_F8_E4M3, raw codes [ne1 rows, ne0]): its scale tensor
     * (safetensors.h st_model_fp8_scale), value = e4m3 * scale.  scale_kind 0 for every other tensor. */
    uint32_t scale_kind;   /* MODEL_SCALE_* */
    uint32_t scale_dtype;  /* GGML_F32, GGML_BF16 or GGML_F16 */
    uint32_t scale_file;
    uint64_t scale_offset; /* absolute, in files[scale_file] */
    uint64_t scale_n;      /* values: 1, ne1, or ceil(ne1/128) * ceil(ne0/128) (row-major [row block][col block]) */
} model_tensor;

enum { MODEL_SCALE_NONE, MODEL_SCALE_TENSOR, MODEL_SCALE_ROW, MODEL_SCALE_BLOCK128 };

typedef struct model_file {
    char *path;
    uint64_t size;
} model_file;

typedef struct layer_range {
    int32_t layer;       /* block index, -1 for the global tensors */
    uint32_t file;
    uint64_t begin, end; /* [begin, end) covering every tensor of that layer in that file */
    uint64_t bytes;      /* sum of the tensor sizes inside (end-begin minus gaps) */
} layer_range;

typedef struct model_desc {
    char *source;             /* path the user gave, resolved */
    enum model_format format;
    char arch[32];            /* normalised family name: llama, qwen2, gemma3, ... */
    enum arch_state state;
    const char *state_note;   /* one sentence on the state */

    int n_layers;             /* L */
    int d_model;              /* D */
    int n_heads;              /* H */
    int n_kv_heads;           /* K */
    int head_dim;             /* S */
    int ffn_dim;              /* F: dense layers' FFN dim (HF intermediate_size, GGUF feed_forward_length) */
    int vocab;                /* V */
    int ctx_len;
    float norm_eps;
    bool norm_plus_one;       /* Gemma: weight stored as w-1, applied as (1+w) */
    bool tied_embeddings;
    bool qkv_bias, qk_norm;

    enum rope_style rope_style;
    int rope_dim;             /* rotary dims (≤ S) */
    double rope_theta;
    double rope_theta_local;  /* Gemma 3 sliding layers (0 = same) */
    enum rope_scaling rope_scaling;
    double rope_factor, rope_low_freq, rope_high_freq, rope_beta_fast, rope_beta_slow, rope_attn_factor;
    int rope_orig_ctx;
    float *rope_short, *rope_long; /* longrope: (rope_dim/2) factors each, owned */

    int sliding_window;       /* 0 = none */
    int sliding_pattern;      /* every Nth layer is global (Gemma 3: 6); 0 = all layers sliding if window set */
    bool *layer_sliding;      /* (L) per-layer: uses the sliding window (HF layer_types, else the pattern) */
    double attn_softcap, final_softcap, query_scale; /* 0 = unused; query_scale = 1/sqrt(query_pre_attn_scalar) */

    int n_experts, n_experts_used; /* MoE: E experts per sparse layer, k of them per token; 0 = dense */
    int expert_ffn_dim;       /* FE: each routed expert's FFN dim (HF moe_intermediate_size); 0 = dense */
    int shared_ffn_dim;       /* FS: the shared expert's FFN dim (Qwen2-MoE), 0 = none */
    bool expert_norm;         /* the k routing weights are divided by their sum (HF norm_topk_prob) */
    bool *layer_sparse;       /* (L) per-layer: the FFN is the routed experts (else a dense FFN of F) */

    size_t n_files;
    model_file *files;
    size_t n_tensors;
    model_tensor *tensors;
    uint64_t total_bytes;
    size_t n_ranges;
    layer_range *ranges;      /* one per (layer, file) pair, sorted by layer then file; globals first */
    char quant_summary[128];  /* "Q4_1 ×210, F32 ×61" */

    int32_t bos_id, eos_id;   /* -1 when absent */
    size_t n_stop;
    int32_t stop_ids[MODEL_MAX_STOP]; /* union of every declared end id */
    char *chat_template;      /* NUL-terminated source or NULL */
    const char *template_builtin; /* the built-in template's name when chat_template is one (a curated tag's file
                                   * that has none, registry_entry.chat_builtin), else NULL */
    char *tokenizer_path;     /* HF: tokenizer.json path; GGUF: NULL (vocab in the GGUF) */
    void *gguf;               /* gguf_file* kept open for GGUF models (vocab + weights) */
} model_desc;

/* Resolves MODEL (curated tag, .gguf path, HF dir, org/name[@rev][:QUANT]) to a local path, downloading a tag or
 * repo from the Hugging Face Hub when it is not here (model/hub.c; HF_HUB_OFFLINE=1 never does).  Returns 0, or
 * one of these with a sentence saying how to get the model (registry.c): */
enum model_resolve_err {
    MODEL_ERR_MISSING = -1, /* not here and not downloadable: no such file, repo, revision or file; gated */
    MODEL_ERR_DATA = -2,    /* the model is one spill does not run (architecture), or its files are unusable */
    MODEL_ERR_NET = -3,     /* the hub cannot be reached (network down, server errors) */
    MODEL_ERR_DISK = -4,    /* the download does not fit the free disk, or cannot be written */
    MODEL_ERR_IO = -5,      /* a downloaded file failed its checksum twice */
};
int model_resolve(const char *spec, char *path, size_t cap, char *err, size_t errlen);

/* The exit code (base/exit.h) for a model_resolve failure. */
int model_resolve_exit(int rc);

/* Like model_resolve, but only what is already here: 0 with the path, -1 when it is not local. */
int model_find_local(const char *spec, char *path, size_t cap);

/* Opens and describes a model from a resolved path.  A file without a chat template that is a curated tag's
 * own installed file (the same file, not a copy) gets the tag's built-in template (template_builtin names it). */
int model_open(const char *path, model_desc **out, char *err, size_t errlen);
void model_close(model_desc *m);

/* The tensor called name, or NULL. */
const model_tensor *model_tensor_find(const model_desc *m, const char *name);

/* SHA-256 hex of the model's identity (arch, dims, tensor names/types/shapes/sizes, file sizes). */
void model_fingerprint(const model_desc *m, char out[65]);

/* Prints the description (spill models show). */
void model_print(const model_desc *m, FILE *f);

#endif
