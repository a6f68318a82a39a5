/*
 * arch.h — one description of each architecture family, read by model.c
 * while it describes a file and by both engines (CPU and CUDA) when they bind
 * a model.  See arch.c for the table and the design.
 *
 * Two levels:
 *   arch_family  one row of the table: what a family is (its tensors per
 *                layer, activation, norm and RoPE conventions, window rule,
 *                expert layout) and on which engines its pass is wired.
 *   arch_layout  one model resolved against its family: every tensor's need
 *                and shape in this model's dimensions, the flags of the pass,
 *                the RoPE parameters of global and sliding layers.  An engine
 *                builds one at open and reads nothing else about the family.
 *
 * Dimension letters: D model dim, H heads, K kv heads, S head size, F FFN dim
 * (dense layers), FE one routed expert's FFN dim, FS shared-expert FFN dim,
 * E experts, V vocab.
 */
#ifndef SPILL_ARCH_H
#define SPILL_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* ---------------------------------------------------------------- tensors */

/* Every tensor any family binds, globals first, then one layer's in the order the pass uses them (which is
 * also the order the engines bind and report them in). */
enum arch_slot {
    ARCH_TOKEN_EMBD,     /* token_embd.weight         (V rows of D) */
    ARCH_OUTPUT_NORM,    /* output_norm.weight        (D) */
    ARCH_OUTPUT,         /* output.weight             (V rows of D); absent = tied to the embedding */
    ARCH_ATTN_NORM,      /* blk.N.attn_norm.weight    (D) */
    ARCH_Q,              /* blk.N.attn_q.weight       (H*S rows of D) */
    ARCH_K,              /* blk.N.attn_k.weight       (K*S rows of D) */
    ARCH_V,              /* blk.N.attn_v.weight       (K*S rows of D) */
    ARCH_QKV,            /* blk.N.attn_qkv.weight     (H*S + 2*K*S rows of D): q, k, v fused (Phi-3) */
    ARCH_O,              /* blk.N.attn_output.weight  (D rows of H*S) */
    ARCH_Q_BIAS,         /* blk.N.attn_q.bias         (H*S) */
    ARCH_K_BIAS,         /* blk.N.attn_k.bias         (K*S) */
    ARCH_V_BIAS,         /* blk.N.attn_v.bias         (K*S) */
    ARCH_Q_NORM,         /* blk.N.attn_q_norm.weight  (S): RMSNorm of each query head */
    ARCH_K_NORM,         /* blk.N.attn_k_norm.weight  (S) */
    ARCH_POST_ATTN_NORM, /* blk.N.post_attention_norm.weight (D): norms the attention output (Gemma) */
    ARCH_FFN_NORM,       /* blk.N.ffn_norm.weight     (D) */
    ARCH_POST_FFW_NORM,  /* blk.N.post_ffw_norm.weight (D): norms the FFN output (Gemma) */
    /* the dense FFN: every layer of a dense family, the dense layers of an MoE one */
    ARCH_GATE,    /* blk.N.ffn_gate.weight     (F rows of D) */
    ARCH_UP,      /* blk.N.ffn_up.weight       (F rows of D) */
    ARCH_GATE_UP, /* blk.N.ffn_gate_up.weight  (2F rows of D): gate and up fused (Phi-3, HF) */
    ARCH_DOWN,    /* blk.N.ffn_down.weight     (D rows of F) */
    /* the sparse layers of an MoE family (arch_layer_sparse); experts are found by model_arch_experts */
    ARCH_ROUTER,         /* blk.N.ffn_gate_inp.weight (E rows of D): expert scores */
    ARCH_GATE_EXPS,      /* blk.N.ffn_gate_exps.weight (E, FE rows of D): every expert's gate, stacked; HF:
                          * one blk.N.ffn_gate.E.weight per expert */
    ARCH_UP_EXPS,        /* blk.N.ffn_up_exps.weight  (E, FE rows of D); HF: blk.N.ffn_up.E.weight */
    ARCH_GATE_UP_EXPS,   /* blk.N.ffn_gate_up_exps.weight (E, 2FE rows of D): each expert's gate rows then its up
                          * rows (transformers 5's in-memory gate_up_proj), in place of the two above */
    ARCH_DOWN_EXPS,      /* blk.N.ffn_down_exps.weight (E, D rows of FE); HF: blk.N.ffn_down.E.weight */
    ARCH_SHEXP_GATE_INP, /* blk.N.ffn_gate_inp_shexp.weight (D): the shared expert's sigmoid gate */
    ARCH_SHEXP_GATE,     /* blk.N.ffn_gate_shexp.weight (FS rows of D) */
    ARCH_SHEXP_UP,       /* blk.N.ffn_up_shexp.weight (FS rows of D) */
    ARCH_SHEXP_DOWN,     /* blk.N.ffn_down_shexp.weight (D rows of FS) */
    ARCH_SLOT_COUNT
};
#define ARCH_LAYER_FIRST ARCH_ATTN_NORM /* slots from here on are per layer (blk.N.) */

enum arch_need {
    ARCH_ABSENT = 0, /* the family has no such tensor: not looked up */
    ARCH_REQUIRED,   /* missing is an error */
    ARCH_OPTIONAL,   /* bound when present: biases the config switches on (HF attention_bias), an untied head */
};

enum arch_kind {
    ARCH_VECTOR, /* 1-D, n elements, stored F32/F16/BF16 (norms, biases) */
    ARCH_MATRIX, /* n rows of k elements: GGUF ne = [k, n] */
    ARCH_EXPERTS /* E matrices of n rows of k, stacked: ne = [k, n, E] */
};

enum arch_act {
    ARCH_ACT_SILU,      /* SwiGLU: down(silu(gate x) * up x) */
    ARCH_ACT_GELU_TANH, /* GeGLU: down(gelu_tanh(gate x) * up x) (Gemma) */
};

enum arch_engine { ARCH_ENGINE_CPU, ARCH_ENGINE_CUDA };

/* ---------------------------------------------------------------- the table */

typedef struct arch_family {
    const char *name;  /* normalised family name: GGUF general.architecture, HF model_type */
    const char *alias; /* another spelling of the same family (HF gemma3_text), or NULL */
    enum arch_state state;
    const char *note; /* one sentence on the state, for `spill models` */
    bool cpu, cuda;   /* the forward pass is wired on the CPU / CUDA engine */

    unsigned char tensors[ARCH_SLOT_COUNT]; /* enum arch_need of each slot */
    enum arch_act act;
    bool embed_scale;           /* embedding rows are multiplied by sqrt(D) (Gemma) */
    bool hf_norm_plus_one;      /* HF checkpoints store norm weights as w - 1, applied as (1 + w); GGUF
                                 * converters add the 1 */
    bool query_pre_attn_scalar; /* queries scale by 1/sqrt(query_pre_attn_scalar) (HF config; GGUF: 1/sqrt(S)) */
    bool hf_softcap;            /* HF attn_logit_softcapping / final_logit_softcapping apply (GGUF: the keys) */

    enum rope_style gguf_rope; /* pairing in this family's GGUF files; HF checkpoints are always rotate-half */
    double gguf_rope_local;    /* GGUF: RoPE base of the sliding layers, which the file does not store; 0 = same */
    int gguf_window_every;     /* GGUF: every Nth layer is global, the others slide (not stored in the file);
                                * 0 = every layer slides when the file sets a window */
    int hf_window_every;       /* HF: as gguf_window_every, overriding config sliding_window_pattern; 0 = config */

    bool shared_expert;        /* MoE: one always-on expert beside the routed ones (Qwen2-MoE) */
    bool moe_norm_always;      /* MoE: the top-k weights are always renormalised (Mixtral; no config key) */
    bool gguf_moe_norm;        /* MoE GGUF without expert_weights_norm: renormalised (llama.cpp's per-family rule:
                                * qwen3moe yes, qwen2moe no) */
    bool hf_pack;              /* spill pack can write this family's HF checkpoints as GGUF */
    const char *gguf_name;     /* general.architecture of the GGUF files llama.cpp (and spill pack) write, when
                                * not the family's name: qwen2moe, and llama for Mixtral */
    const char *gguf_turn_end; /* end-of-turn token of GGUF files without a chat template, or NULL */
} arch_family;

/* The family called `arch` (a normalised name or an alias), or NULL when spill does not know it. */
const arch_family *model_arch_find(const char *arch);

/* The family name that `arch` (GGUF general.architecture, HF model_type) stands for: the family's own name
 * for an alias, `arch` itself otherwise. */
const char *model_arch_normalise(const char *arch);

/* State of a family name and its sentence (unknown names are unsupported, with a sentence saying so). */
enum arch_state model_arch_state(const char *arch, const char **note);

/* Iterates the table for `spill models`: returns false past the end. */
bool model_arch_at(size_t i, const char **name, enum arch_state *state, const char **note);

/* The canonical name of the Hugging Face tensor `hf` (model.layers.N.self_attn.q_proj.weight ->
 * blk.N.attn_q.weight) for family fam (NULL: unknown), and its layer (-1 for globals).  Returns false for
 * tensors spill does not bind (rotary buffers, vision towers, ...).  A routed expert's own tensor is
 * blk.N.ffn_gate.E.weight (up, down likewise: llama.cpp's per-expert names) whichever HF scheme it comes from
 * (mlp.experts.E.gate_proj, Mixtral's block_sparse_moe.experts.E.w1 / w3 / w2 for gate / up / down). */
bool model_arch_hf_canonical(const arch_family *fam, const char *hf, char *out, size_t cap, int32_t *layer);

/* The canonical name of slot s: the whole name of a global, the part after blk.N. of a per-layer slot. */
const char *model_arch_slot_name(enum arch_slot s);

/* ---------------------------------------------------------------- one model, resolved */

/* RoPE parameters of one kind of layer; names follow transformers' rope_parameters.  The CPU backend turns
 * them into frequency tables (cpu_rope_init), which the CUDA engine uploads. */
typedef struct rope_cfg {
    enum rope_style style;
    int n_rot;                 /* rotated dims per head = int(S * partial_rotary_factor); even, <= S */
    double freq_base;          /* rope_theta */
    enum rope_scaling scaling; /* never ROPE_SCALE_DYNAMIC (model_arch_resolve refuses it) */
    double factor;             /* linear, llama3, yarn */
    double low_freq_factor;    /* llama3 */
    double high_freq_factor;   /* llama3 */
    double orig_max_pos;       /* llama3, yarn: original_max_position_embeddings */
    double beta_fast;          /* yarn; 0 means the default 32 */
    double beta_slow;          /* yarn; 0 means the default 1 */
    double attn_factor;        /* yarn attention_factor; 0 means derive it from factor (and mscale) */
    double mscale;             /* yarn, optional (0 = absent) */
    double mscale_all_dim;     /* yarn, optional (0 = absent) */
    bool yarn_no_truncate;     /* yarn `truncate: false` */
    const float *ext_factors;  /* longrope: (n_rot/2) per-frequency factors, the short or the long list */
} rope_cfg;

typedef struct arch_tensor {
    enum arch_need need;
    enum arch_kind kind;
    int64_t n, k; /* vector: n elements; matrix: n rows of k; experts: E of those */
} arch_tensor;

typedef struct arch_layout {
    const arch_family *family;
    arch_tensor t[ARCH_SLOT_COUNT]; /* in this model's dimensions */

    enum arch_act act;
    float embed_scale;    /* embedding rows are multiplied by it (sqrt(D) or 1) */
    bool norm_plus_one;   /* every RMSNorm applies (1 + w) */
    float attn_scale;     /* scores = q.k * attn_scale (query_scale, or 1/sqrt(S)) */
    double attn_softcap;  /* scores -> c * tanh(scores / c); 0 = off */
    double final_softcap; /* the same on the logits */

    int sliding_window;        /* positions a sliding layer attends to (0 = none) */
    const bool *layer_sliding; /* (L) the model's per-layer pattern, or NULL: no layer slides */
    rope_cfg rope;             /* global layers */
    rope_cfg rope_local;       /* sliding layers, when rope_local_on */
    bool rope_local_on;        /* sliding layers rotate with their own base (Gemma 3: 10000, unscaled) */
    rope_cfg rope_long;        /* longrope (Phi-3): global layers once the row is longer than rope_long_after */
    bool rope_long_on;
    int rope_long_after; /* original_max_position_embeddings: a pass whose row reaches past it (its
                          * first position + its tokens > this) rotates that pass's tokens with
                          * rope_long, as transformers picks the factors per forward from the length */

    int n_experts, n_experts_used; /* MoE: experts per sparse layer and per token; 0 for dense families */
    bool expert_norm;              /* the k routing weights are divided by their sum */
    bool shared_expert;
    const bool *layer_sparse; /* (L) the model's sparse layers, or NULL: every layer is dense */
} arch_layout;

/*
 * Resolves model m for `engine`: checks that its family is supported and wired on that engine, and fills
 * *out (which borrows m's per-layer window pattern: m outlives it).  Returns 0, or -1 with one sentence
 * (unsupported, not wired on this engine, a RoPE variant spill does not implement).
 */
int model_arch_resolve(const model_desc *m, enum arch_engine engine, arch_layout *out, char *err, size_t errlen);

/* Whether layer l's FFN is the routed experts (else the dense FFN). */
static inline bool arch_layer_sparse(const arch_layout *a, int l)
{
    return a->layer_sparse && a->layer_sparse[l];
}

/* The need of slot s in layer l: the family's, except that dense-FFN slots are absent in sparse layers and
 * the sparse layers' slots (router, experts, shared expert) absent in dense ones. */
enum arch_need arch_slot_need(const arch_layout *a, enum arch_slot s, int l);

/* Whether slot s belongs to a sparse layer's FFN (router, experts, shared expert): bound through
 * model_arch_experts and the engines' MoE code rather than as one tensor per slot. */
bool arch_slot_sparse(enum arch_slot s);

/*
 * Finds slot s of layer `layer` (ignored for global slots) in m and checks it against the layout: *out is
 * the tensor, or NULL when the layer has none (arch_slot_need) or it is optional and missing.  Returns 0, or
 * -1 with one sentence: required and missing, another shape than the config implies (a router scoring
 * another number of experts), or a 1-D tensor not stored as F32, F16 or BF16.
 */
int model_arch_tensor(const model_desc *m, const arch_layout *a, enum arch_slot s, int layer, const model_tensor **out,
                      char *err, size_t errlen);

/* Where one expert's matrix lies: rows [row0, row0 + n) of tensor t, n rows of k as the slot's shape says. */
typedef struct arch_expert {
    const model_tensor *t;
    int64_t row0;
} arch_expert;

/*
 * Finds the E matrices of expert slot s (ARCH_GATE_EXPS, ARCH_UP_EXPS or ARCH_DOWN_EXPS) of sparse layer
 * `layer` and fills out[0..E), whichever way the file stores them:
 *   stacked (GGUF blk.N.ffn_up_exps.weight [E, FE, D]): expert e is rows [e*FE, (e+1)*FE);
 *   gate and up stacked together (blk.N.ffn_gate_up_exps.weight [E, 2FE, D], transformers 5): expert e's
 *     gate is rows [2e*FE, 2e*FE + FE), its up the FE rows after;
 *   one tensor per expert (HF save_pretrained: blk.N.ffn_up.E.weight [FE, D]): row 0 of each.
 * A stacked tensor wins over per-expert ones.  Returns 0, or -1 with one sentence: an expert missing, a
 * per-expert tensor with an index >= E, a tensor of another shape than the config implies.
 */
int model_arch_experts(const model_desc *m, const arch_layout *a, enum arch_slot s, int layer, arch_expert *out,
                       char *err, size_t errlen);

/* The split slots fused slot s holds, in row order, and each one's rows in this model (QKV: Q, K, V; GATE_UP:
 * GATE, UP): an engine binds each part as a row range of the one tensor.  Returns the number of parts, 0 for a
 * slot that is not fused. */
#define ARCH_MAX_PARTS 3
int arch_fused_parts(const arch_layout *a, enum arch_slot s, enum arch_slot parts[ARCH_MAX_PARTS],
                     int64_t rows[ARCH_MAX_PARTS]);

/* Whether layer l attends through the sliding window (and rotates with rope_local when rope_local_on). */
static inline bool arch_layer_sliding(const arch_layout *a, int l)
{
    return a->layer_sliding && a->layer_sliding[l];
}

#endif
