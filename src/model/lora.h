/*
 * lora.h — LoRA adapters of a base model: reading them (PEFT and mlx-lm
 * layouts), checking them against the base, and the adapter set a job hands
 * to an engine, which applies every adapter unmerged, per row, in one pass:
 *
 *     y = x·Wᵀ + scale · (x·Aᵀ)·Bᵀ       for the tokens of rows that name this adapter
 *
 * Layouts (docs/formats.md §LoRA):
 *   PEFT     DIR/adapter_config.json (r, lora_alpha, use_rslora, target_modules, fan_in_fan_out,
 *            modules_to_save, use_dora, base_model_name_or_path) + DIR/adapter_model.safetensors
 *            (base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight [r, in], lora_B [out, r]).
 *   mlx-lm   DIR/adapter_config.json (lora_parameters: rank, scale, keys; num_layers) +
 *            DIR/adapters.safetensors (model.layers.N.self_attn.q_proj.lora_a [in, r], lora_b [r, out]:
 *            transposed against PEFT; the scale is used as given).
 * scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (PEFT); mlx-lm: its `scale`.
 *
 * Whatever the file stores, a loaded adapter is normalised to the base's split slots: one (A, B) pair per
 * layer for each of Q, K, V, O, GATE, UP, DOWN, A as (r, in) and B as (out, r) row-major fp32.  A target on a
 * fused projection (Phi-3 qkv_proj / gate_up_proj) has one A and its B split by the rows of each part
 * (arch_fused_parts); a target on the base's split q/k/v when the base file stores them fused is the same.
 * Engines therefore never see a fused LoRA.
 */
#ifndef SPILL_LORA_H
#define SPILL_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "arch.h"
#include "model.h"

/* The split slots an adapter may target, in this order (index = lora_slot). */
enum lora_slot { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_SLOTS };

/* The arch slot of a lora slot (LORA_Q -> ARCH_Q, ...). */
enum arch_slot lora_arch_slot(enum lora_slot s);

/* One adapted projection of one layer: in = the projection's input width, out = its output rows. */
typedef struct lora_mat {
    int32_t r;       /* rank; 0 = this slot of this layer is not adapted (A and B NULL) */
    int64_t in, out;
    float *A;        /* (r, in) row-major, owned */
    float *B;        /* (out, r) row-major, owned */
} lora_mat;

typedef struct lora_adapter {
    char name[256];     /* the name rows use: the directory's base name, or the name under $SPILL_HOME/adapters/ */
    char path[4096];    /* the directory */
    char hash[65];      /* sha256 hex over the adapter's config and weight files, in that order */
    char layout[8];     /* "peft" or "mlx" */
    int32_t rank;       /* the largest rank of any adapted slot */
    float alpha;        /* lora_alpha (PEFT) or scale * rank (mlx) */
    bool rslora;
    float scale;        /* what B·A is multiplied by, in every slot: a PEFT rank_pattern / alpha_pattern entry's
                           own scale is folded into that slot's B at load (B *= its scale / this one) */
    uint32_t targets;   /* bit (1 << lora_slot) for each slot adapted in at least one layer */
    int n_layers;       /* the base's */
    lora_mat *m;        /* (n_layers * LORA_N_SLOTS): m[l * LORA_N_SLOTS + s] */
    uint64_t bytes;     /* fp32 bytes of every A and B held */
    char base_name[256];/* base_model_name_or_path as the config writes it ("" when absent) */
} lora_adapter;

/*
 * Reads the adapter in directory `dir` for the base model m (its layout resolved as a for the engine that
 * will run it) and checks it against the base before any row runs.  Refused, one sentence each (the file, the
 * field or tensor, what to do): a directory without adapter_config.json or weights; DoRA (use_dora); a full
 * fine-tune (no lora_A/lora_B tensors, or full weight tensors); modules_to_save other than the LM head or the
 * embeddings when those are not supported (spill refuses both today: it names them); a target module spill
 * does not know or the base does not have (MoE experts included); a tensor whose shape disagrees with the base
 * (another base); a rank in the file different from the config's r (or rank_pattern's entry); a layer index
 * outside the base; bias other than "none"; a non-finite value.  Returns 0 with *out (lora_free it), or -1
 * with the sentence.
 */
int lora_load(const model_desc *m, const arch_layout *a, const char *dir, lora_adapter **out, char *err,
              size_t errlen);
void lora_free(lora_adapter *ad);

/*
 * Where an adapter name points: a path to a directory (absolute, or relative with a '/' or '.'), else
 * $SPILL_HOME/adapters/<name>.  Fills dir; 0, or -1 with a sentence when it is neither.
 */
int lora_resolve(const char *name, char *dir, size_t cap, char *err, size_t errlen);

/*
 * Splits a model spec "BASE+ADAPTER" at its last '+' that is followed by a resolvable adapter (model tags and
 * file names may hold '+' themselves): base gets the part before, adapter the part after ("" for a bare
 * base).  Returns 1 when the spec names an adapter, 0 when it is a bare base, -1 with a sentence when the part
 * after '+' looks like an adapter name but resolves to nothing.
 */
int lora_split_spec(const char *spec, char *base, size_t base_cap, char *adapter, size_t ad_cap, char *err,
                    size_t errlen);

/*
 * The adapters one job's engine applies: index 0 is the bare base (no adapter), 1..n the loaded adapters.
 * A pass's sequences name their index in fwd_seq.adapter.  Borrowed by the engine for its life.
 */
typedef struct lora_set {
    int n;                  /* adapters (not counting the bare base) */
    lora_adapter **ad;      /* (n) ad[i] is index i + 1 */
} lora_set;

/* `spill adapters`: one line per directory under $SPILL_HOME/adapters/ (name, layout, base, rank, targets,
 * size, hash) written to f; base-independent (shapes are not checked).  0, or -1 with a sentence. */
int lora_list(FILE *f, char *err, size_t errlen);

#endif
