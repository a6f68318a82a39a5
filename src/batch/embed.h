/*
 * embed.h — what an embedding is made of, apart from the forward pass: which pooling and normalisation a model
 * asks for (read from its files), and the pooling maths.  embed.c says where each choice comes from and why;
 * run_embed.c runs the rows.
 */
#ifndef SPILL_EMBED_H
#define SPILL_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"

typedef enum embed_pool {
    EMBED_POOL_LAST, /* the last input token's hidden state (decoder-only embedding models) */
    EMBED_POOL_MEAN, /* the mean over every input token */
    EMBED_POOL_CLS,  /* the first input token's */
} embed_pool;

typedef struct embed_cfg {
    embed_pool pool;
    bool normalize;   /* L2 normalisation of the pooled vector */
    bool matryoshka;  /* body.dimensions may truncate (then the vector is renormalised) */
    char source[200]; /* where the choice came from, one phrase ("the model's 1_Pooling/config.json", …) */
    char refuse[320]; /* non-empty: the model asks for what spill does not do; every embedding row fails with it */
    bool refuse_mode; /* the refusal is of the pooling mode (--pooling lifts it), not of a module */
} embed_cfg;

/*
 * The model's pooling (path: the model as resolved, a Hugging Face directory or a GGUF file — m may be a
 * requantized copy of it): a sentence-transformers layout beside a safetensors model (modules.json, the Pooling
 * module's config.json, a Normalize module), else a GGUF's <arch>.pooling_type, else last-token + normalise.
 * pooling ("last", "mean", "cls"; NULL = the model's) overrides the mode; matryoshka allows dimensions.
 * 0, or -1 with a sentence (a file of the layout that cannot be read or parsed).
 */
int embed_cfg_from_model(const model_desc *m, const char *path, const char *pooling, bool matryoshka,
                         embed_cfg *out, char *err, size_t errlen);

/* "last", "mean", "cls". */
const char *embed_pool_name(embed_pool p);

/* Divides v (n) by its L2 norm (summed in double); a zero vector stays zero. */
void embed_normalize(float *v, int64_t n);

#endif
