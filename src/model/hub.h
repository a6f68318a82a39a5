/*
 * hub.h — Hugging Face Hub downloads: a repo id `org/name[@rev]` (the safetensors set a run needs) or
 * `org/name[@rev]:QUANT` (one GGUF file) becomes a local directory or file under $SPILL_HOME/models/hf/.
 * model_resolve (registry.c) calls it when a model is not local; see hub.c for the layout and the rules.
 */
#ifndef SPILL_HUB_H
#define SPILL_HUB_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct hub_ref {
    char spec[320];  /* what the user named it: org/name@rev:QUANT or a curated tag, for sentences */
    char repo[200];  /* org/name */
    char rev[128];   /* branch, tag or commit; "main" when none was given */
    char quant[32];  /* org/name:QUANT: the quant token a GGUF file name carries (Q4_K_M), else "" */
    char file[256];  /* one named GGUF file (a curated tag's), else "" */
    char dir[3072];  /* where it lives: $SPILL_HOME/models/hf/org--name[@rev] (or a curated tag's own path) */
} hub_ref;

/* Parses org/name[@rev][:QUANT] (Hub name rules: letters, digits, '-', '_', '.'; no "--" or ".." in names) and
 * sets dir.  False (and nothing said) when spec is not a repo id. */
bool hub_parse(const char *spec, hub_ref *r);

/* The local path of a complete download of r (the directory, or the GGUF file) into path; false when it is not
 * (wholly) here.  Never touches the network. */
bool hub_local(const hub_ref *r, char *path, size_t cap);

/* HF_HUB_OFFLINE set to 1/true/yes/on (huggingface_hub's rule). */
bool hub_offline(void);

/* Downloads what a run needs of r (config.json first: an unsupported architecture or a download larger than the
 * free disk is refused before any weight moves) and puts the local path in path.  Returns 0 or one of model.h's
 * MODEL_ERR_* with a sentence in err. */
int hub_fetch(const hub_ref *r, char *path, size_t cap, char *err, size_t errlen);

/* config.json of r read from the hub (no file written): *config is the caller's. */
int hub_fetch_config(const hub_ref *r, json_t **config, char *err, size_t errlen);

#endif
