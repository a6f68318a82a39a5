/*
 * lora.c — LoRA adapters: reading a PEFT or an mlx-lm adapter directory, checking it against the base, and
 * normalising it to the split slots both engines apply (lora.h); resolving adapter names and listing the
 * installed ones.
 *
 * Owns: the two config schemas, the tensor names of both layouts, every refusal (one sentence each), the
 * conversion of F32 / F16 / BF16 factors to fp32 A (r, in) and B (out, r), the split of a fused target's B
 * by the base's rows (arch_fused_parts), the adapter's hash.
 * Does not: apply an adapter (the engines do: engine/lora_cpu.c on the CPU), merge one into the base, or
 * validate safetensors bytes (safetensors.c reads and checks the header; this file preads the tensors it
 * names).
 *
 * Names this file reads (formats.md §7):
 *   PEFT    base_model.model.model.layers.N.<module>.lora_A[.<adapter>].weight  [r, in]
 *           base_model.model.model.layers.N.<module>.lora_B[.<adapter>].weight  [out, r]
 *   mlx-lm  model.layers.N.<module>.lora_a  [in, r]      model.layers.N.<module>.lora_b  [r, out]
 *   <module> = self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, fused self_attn.qkv_proj, mlp.gate_up_proj.
 *
 * Key decisions:
 *  - The tensors decide what is adapted.  The config's target_modules / keys are only checked for names
 *    spill does not know: PEFT matches them by suffix or regex against whatever the base has
 *    (layers_to_transform, exclude_modules), and mlx-lm derives them from the layer when absent.
 *  - A rank_pattern / alpha_pattern entry's scale is folded into its B (B *= its scale / the adapter's), so
 *    every slot is multiplied by lora_adapter.scale and the engines never see patterns.
 *  - fan_in_fan_out (GPT-2 Conv1D bases) describes how the base weight is stored, not the factors: PEFT keeps
 *    lora_A / lora_B as nn.Linear weights either way (tuners/lora/layer.py: Linear.forward applies
 *    lora_B(lora_A(x)) untransposed, get_delta_weight transposes only the merged delta) and resets the flag
 *    for nn.Linear targets, which every family spill runs has.  It is accepted and changes nothing here.
 *  - A fused target's A is copied into each part (r × D floats, a few KB) so every lora_mat owns what it
 *    points to and lora_free has one rule.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "lora.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant.h"
#include "safetensors.h"
#include "../base/util.h"

#define MAX_CONFIG_BYTES (16u << 20)

enum arch_slot lora_arch_slot(enum lora_slot s)
{
    static const enum arch_slot map[LORA_N_SLOTS] = {ARCH_Q, ARCH_K, ARCH_V, ARCH_O, ARCH_GATE, ARCH_UP, ARCH_DOWN};
    return map[s];
}

static const char *const SLOT_NAMES[LORA_N_SLOTS] = {"q", "k", "v", "o", "gate", "up", "down"};

/* ---------------------------------------------------------------- the modules an adapter may target */

/* A module as both layouts name it after model.layers.N.; a fused one's B splits into its parts by rows. */
typedef struct module {
    const char *path;
    enum arch_slot arch;  /* the base's slot of this module */
    enum arch_slot fused; /* the base's fused slot that holds it instead (ARCH_SLOT_COUNT: none) */
    int n_parts;
    enum lora_slot parts[ARCH_MAX_PARTS];
} module;

static const module MODULES[] = {
    {.path = "self_attn.q_proj", .arch = ARCH_Q, .fused = ARCH_QKV, .n_parts = 1, .parts = {LORA_Q}},
    {.path = "self_attn.k_proj", .arch = ARCH_K, .fused = ARCH_QKV, .n_parts = 1, .parts = {LORA_K}},
    {.path = "self_attn.v_proj", .arch = ARCH_V, .fused = ARCH_QKV, .n_parts = 1, .parts = {LORA_V}},
    {.path = "self_attn.o_proj", .arch = ARCH_O, .fused = ARCH_SLOT_COUNT, .n_parts = 1, .parts = {LORA_O}},
    {.path = "mlp.gate_proj", .arch = ARCH_GATE, .fused = ARCH_GATE_UP, .n_parts = 1, .parts = {LORA_GATE}},
    {.path = "mlp.up_proj", .arch = ARCH_UP, .fused = ARCH_GATE_UP, .n_parts = 1, .parts = {LORA_UP}},
    {.path = "mlp.down_proj", .arch = ARCH_DOWN, .fused = ARCH_SLOT_COUNT, .n_parts = 1, .parts = {LORA_DOWN}},
    {.path = "self_attn.qkv_proj",
     .arch = ARCH_QKV,
     .fused = ARCH_SLOT_COUNT,
     .n_parts = 3,
     .parts = {LORA_Q, LORA_K, LORA_V}},
    {.path = "mlp.gate_up_proj", .arch = ARCH_GATE_UP, .fused = ARCH_SLOT_COUNT, .n_parts = 2, .parts = {LORA_GATE, LORA_UP}},
};
#define N_MODULES (sizeof MODULES / sizeof MODULES[0])

static const module *module_find(const char *path)
{
    for (size_t i = 0; i < N_MODULES; i++)
        if (!strcmp(MODULES[i].path, path))
            return &MODULES[i];
    return NULL;
}

/* A sparse layer's router, routed experts or shared expert, in any of the namings transformers and mlx-lm use. */
static bool is_expert_path(const char *p)
{
    static const char *const prefix[] = {"mlp.experts", "block_sparse_moe.", "mlp.shared_expert", "mlp.switch_mlp.",
                                         "mlp.router"};
    if (!strcmp(p, "mlp.gate"))
        return true;
    for (size_t i = 0; i < sizeof prefix / sizeof prefix[0]; i++)
        if (!strncmp(p, prefix[i], strlen(prefix[i])))
            return true;
    return false;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* ---------------------------------------------------------------- the reader */

/* One adapted module of one layer as the file holds it. */
typedef struct target {
    int layer;
    const module *md;
    const st_tensor *a, *b;
    int64_t r, in, out; /* from the shapes */
    double scale;       /* this module's: the adapter's, or its rank_pattern / alpha_pattern entry's */
} target;

typedef struct reader {
    const char *dir;
    char cfg_path[4200], w_path[4200];
    const char *w_name; /* the weights file's name */
    bool mlx;
    json_t *cfg;
    int32_t r;                            /* the config's rank */
    double alpha, scale;                  /* lora_alpha (mlx: scale * rank) and what B·A is multiplied by */
    bool rslora;
    int num_layers;                       /* mlx: the last num_layers blocks are adapted; -1 = all */
    json_t *rank_pattern, *alpha_pattern; /* borrowed from cfg; NULL when absent or empty */
    st_file *st;
    target *t;
    size_t n_t;
    char base_name[256];
} reader;

static void reader_close(reader *rd)
{
    json_decref(rd->cfg);
    st_close(rd->st);
    free(rd->t);
}

/* The JSON value at key, NULL when absent or null. */
static json_t *cfg_get(const reader *rd, const char *key)
{
    json_t *v = json_object_get(rd->cfg, key);
    return json_is_null(v) ? NULL : v;
}

static int cfg_bool(const reader *rd, const char *key, bool *out, char *err, size_t errlen)
{
    json_t *v = cfg_get(rd, key);
    *out = false;
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return util_errf(err, errlen, "%s: \"%s\" must be true or false; the adapter's config is malformed.",
                         rd->cfg_path, key);
    *out = json_is_true(v);
    return 0;
}

/* A JSON list's strings joined with ", " into buf (what a refusal names). */
static void join_strings(json_t *list, char *buf, size_t cap)
{
    size_t i, used = 0;
    json_t *v;
    buf[0] = 0;
    json_array_foreach(list, i, v)
    {
        int n = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", json_is_string(v) ? json_string_value(v) : "?");
        if (n < 0 || (size_t)n >= cap - used)
            break;
        used += (size_t)n;
    }
}

/* Checks one name of PEFT's target_modules list (a module name, matched by suffix) or of mlx-lm's keys (a path
 * after model.layers.N.): spill must know the module.  what names the list in the sentence. */
static int check_target_name(const reader *rd, const char *name, const char *what, char *err, size_t errlen)
{
    const char *last = strrchr(name, '.') ? strrchr(name, '.') + 1 : name;
    for (size_t i = 0; i < N_MODULES; i++) {
        const char *m = strrchr(MODULES[i].path, '.') + 1;
        if (rd->mlx ? !strcmp(MODULES[i].path, name) : !strcmp(m, last))
            return 0;
    }
    if (!strcmp(last, "lm_head"))
        return util_errf(err, errlen,
                         "%s: %s names lm_head, and spill does not adapt the LM head; retrain the adapter without "
                         "that target.",
                         rd->cfg_path, what);
    if (!strcmp(last, "embed_tokens"))
        return util_errf(err, errlen,
                         "%s: %s names embed_tokens, and spill does not adapt the embeddings; retrain the adapter "
                         "without that target.",
                         rd->cfg_path, what);
    static const char *const moe[] = {"gate", "w1", "w2", "w3", "experts", "router", "shared_expert_gate"};
    bool expert = rd->mlx && is_expert_path(name);
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++)
        expert = expert || !strcmp(last, moe[i]);
    if (expert)
        return util_errf(err, errlen,
                         "%s: %s names %s, a mixture-of-experts router or expert, and spill applies LoRA to the "
                         "attention of MoE bases only; retrain the adapter without expert targets.",
                         rd->cfg_path, what, name);
    return util_errf(err, errlen,
                     "%s: %s names %s, a module spill does not know (it adapts self_attn q/k/v/o_proj, qkv_proj and "
                     "mlp gate/up/down_proj, gate_up_proj); retrain the adapter without that target.",
                     rd->cfg_path, what, name);
}

/* Checks a rank_pattern / alpha_pattern object: numbers, each key a regular expression. */
static int check_pattern(const reader *rd, json_t *pat, const char *key, bool integer, char *err, size_t errlen)
{
    const char *k;
    json_t *v;
    if (!json_is_object(pat))
        return util_errf(err, errlen, "%s: \"%s\" must be an object of module pattern to number.", rd->cfg_path, key);
    json_object_foreach(pat, k, v)
    {
        if (integer ? !json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 65536
                    : !json_is_number(v) || !isfinite(json_number_value(v)))
            return util_errf(err, errlen, "%s: %s[\"%s\"] must be %s.", rd->cfg_path, key, k,
                             integer ? "a positive integer rank" : "a finite number");
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)k, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
        if (!re)
            return util_errf(err, errlen, "%s: %s key \"%s\" is not a regular expression spill can match.",
                             rd->cfg_path, key, k);
        pcre2_code_free(re);
    }
    return 0;
}

/* PEFT's get_pattern_key: the first key of pat that matches `(.*\.)?(key)$` from the start of the module's name
 * (model.layers.N.self_attn.q_proj); its value in *out.  False when none matches. */
static bool pattern_value(json_t *pat, const char *module_name, double *out)
{
    const char *k;
    json_t *v;
    json_object_foreach(pat, k, v)
    {
        char re_src[1024];
        if (snprintf(re_src, sizeof re_src, "(.*\\.)?(%s)$", k) >= (int)sizeof re_src)
            continue;
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)re_src, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &ec, &eo, NULL);
        if (!re)
            continue;
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        int rc = md ? pcre2_match(re, (PCRE2_SPTR)module_name, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) : -1;
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        if (rc >= 0) {
            *out = json_number_value(v);
            return true;
        }
    }
    return false;
}

static int read_peft_config(reader *rd, char *err, size_t errlen)
{
    const char *p = rd->cfg_path;
    json_t *v;
    bool b;
    if ((v = cfg_get(rd, "peft_type")) && (!json_is_string(v) || strcmp(json_string_value(v), "LORA")))
        return util_errf(err, errlen, "%s: peft_type is %s, not LORA, and spill applies LoRA adapters only; merge "
                         "the adapter into the base with peft and run the merged model.", p,
                         json_is_string(v) ? json_string_value(v) : "not a string");
    if (cfg_bool(rd, "use_dora", &b, err, errlen))
        return -1;
    if (b)
        return util_errf(err, errlen,
                         "%s: use_dora is true (a DoRA adapter), which spill does not apply; merge it into the base "
                         "(peft merge_and_unload) and run the merged model.",
                         p);
    rd->r = 8; /* LoraConfig's defaults, for a config that omits them */
    rd->alpha = 8;
    if ((v = cfg_get(rd, "r"))) {
        if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 65536)
            return util_errf(err, errlen, "%s: \"r\" must be a positive integer rank.", p);
        rd->r = (int32_t)json_integer_value(v);
    }
    if ((v = cfg_get(rd, "lora_alpha"))) {
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return util_errf(err, errlen, "%s: \"lora_alpha\" must be a number.", p);
        rd->alpha = json_number_value(v);
    }
    if (cfg_bool(rd, "use_rslora", &rd->rslora, err, errlen))
        return -1;
    rd->scale = rd->rslora ? rd->alpha / sqrt((double)rd->r) : rd->alpha / rd->r;
    if ((v = cfg_get(rd, "bias")) && (!json_is_string(v) || strcmp(json_string_value(v), "none")))
        return util_errf(err, errlen,
                         "%s: bias is %s (biases trained beside the LoRA factors), which spill does not apply; retrain "
                         "the adapter with bias \"none\".",
                         p, json_is_string(v) ? json_string_value(v) : "not a string");
    if (cfg_bool(rd, "lora_bias", &b, err, errlen))
        return -1;
    if (b)
        return util_errf(err, errlen,
                         "%s: lora_bias is true (lora_B carries a bias), which spill does not apply; retrain the "
                         "adapter without it.",
                         p);
    if ((v = cfg_get(rd, "modules_to_save")) && (!json_is_array(v) || json_array_size(v) > 0)) {
        char names[512];
        if (json_is_array(v))
            join_strings(v, names, sizeof names);
        else
            snprintf(names, sizeof names, "a value that is not a list");
        return util_errf(err, errlen,
                         "%s: modules_to_save lists %s (whole modules trained beside the LoRA factors, such as the LM "
                         "head or the embeddings), which spill does not apply; retrain without modules_to_save or "
                         "merge the adapter into the base.",
                         p, names);
    }
    static const char *const unsupported[][2] = {
        {"trainable_token_indices", "trained embedding rows"},
        {"layer_replication", "layers replicated in the base"},
        {"target_parameters", "mixture-of-experts parameters"},
        {"alora_invocation_tokens", "an activated LoRA, switched on by invocation tokens"},
        {"monteclora_config", "Monte Carlo sampling over the LoRA factors"},
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if ((v = cfg_get(rd, unsupported[i][0])) && !(json_is_array(v) && json_array_size(v) == 0) &&
            !(json_is_object(v) && json_object_size(v) == 0))
            return util_errf(err, errlen, "%s: %s is set (%s), which spill does not apply; retrain the adapter "
                             "without it.", p, unsupported[i][0], unsupported[i][1]);
    if (cfg_bool(rd, "use_qalora", &b, err, errlen))
        return -1;
    if (b)
        return util_errf(err, errlen, "%s: use_qalora is true, which spill does not apply; retrain the adapter "
                         "without it.", p);
    if ((v = cfg_get(rd, "target_modules")) && json_is_array(v)) {
        size_t i;
        json_t *name;
        json_array_foreach(v, i, name)
        {
            if (!json_is_string(name))
                return util_errf(err, errlen, "%s: target_modules[%zu] is not a string.", p, i);
            if (check_target_name(rd, json_string_value(name), "target_modules", err, errlen))
                return -1;
        }
    } else if (v && !json_is_string(v)) {
        return util_errf(err, errlen, "%s: target_modules must be a list of module names or a regular expression.",
                         p);
    }
    const char *pat_keys[2] = {"rank_pattern", "alpha_pattern"};
    json_t **pats[2] = {&rd->rank_pattern, &rd->alpha_pattern};
    for (int i = 0; i < 2; i++) {
        if (!(v = cfg_get(rd, pat_keys[i])))
            continue;
        if (check_pattern(rd, v, pat_keys[i], i == 0, err, errlen))
            return -1;
        *pats[i] = json_object_size(v) ? v : NULL;
    }
    if ((v = cfg_get(rd, "base_model_name_or_path")) && json_is_string(v))
        snprintf(rd->base_name, sizeof rd->base_name, "%s", json_string_value(v));
    return 0;
}

static int read_mlx_config(reader *rd, char *err, size_t errlen)
{
    const char *p = rd->cfg_path;
    json_t *v;
    bool b;
    const char *ft = "lora";
    if ((v = cfg_get(rd, "fine_tune_type"))) {
        if (!json_is_string(v))
            return util_errf(err, errlen, "%s: fine_tune_type must be \"lora\", \"dora\" or \"full\".", p);
        ft = json_string_value(v);
    }
    if (cfg_bool(rd, "use_dora", &b, err, errlen))
        return -1;
    if (!strcmp(ft, "dora") || b)
        return util_errf(err, errlen,
                         "%s: fine_tune_type is dora (a DoRA adapter), which spill does not apply; fuse it into the "
                         "base (mlx_lm.fuse) and run the fused model.",
                         p);
    if (!strcmp(ft, "full"))
        return util_errf(err, errlen,
                         "%s: fine_tune_type is full (a full fine-tune, not a LoRA adapter); fuse it into the base "
                         "(mlx_lm.fuse) and run the result as a model in its own right.",
                         p);
    if (strcmp(ft, "lora"))
        return util_errf(err, errlen, "%s: fine_tune_type is \"%s\"; spill applies LoRA adapters only.", p, ft);
    json_t *lp = cfg_get(rd, "lora_parameters");
    if (!json_is_object(lp))
        return util_errf(err, errlen,
                         "%s: no lora_parameters object (rank, scale), which an mlx-lm adapter's config must carry; "
                         "re-save the adapter with mlx_lm.lora or add lora_parameters by hand.",
                         p);
    json_t *rank = json_object_get(lp, "rank"), *scale = json_object_get(lp, "scale");
    if (!json_is_integer(rank) || json_integer_value(rank) <= 0 || json_integer_value(rank) > 65536)
        return util_errf(err, errlen, "%s: lora_parameters.rank must be a positive integer.", p);
    if (!json_is_number(scale) || !isfinite(json_number_value(scale)))
        return util_errf(err, errlen, "%s: lora_parameters.scale must be a number (mlx-lm uses it as given).", p);
    rd->r = (int32_t)json_integer_value(rank);
    rd->scale = json_number_value(scale);
    rd->alpha = rd->scale * rd->r;
    json_t *keys = json_object_get(lp, "keys");
    if (keys && !json_is_null(keys)) {
        size_t i;
        json_t *name;
        if (!json_is_array(keys))
            return util_errf(err, errlen, "%s: lora_parameters.keys must be a list of module paths.", p);
        json_array_foreach(keys, i, name)
        {
            if (!json_is_string(name))
                return util_errf(err, errlen, "%s: lora_parameters.keys[%zu] is not a string.", p, i);
            if (check_target_name(rd, json_string_value(name), "lora_parameters.keys", err, errlen))
                return -1;
        }
    }
    rd->num_layers = -1;
    if ((v = cfg_get(rd, "num_layers"))) {
        if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > MODEL_MAX_LAYERS)
            return util_errf(err, errlen, "%s: num_layers must be -1 (all) or a count of layers.", p);
        rd->num_layers = (int)json_integer_value(v);
    }
    if ((v = cfg_get(rd, "model")) && json_is_string(v))
        snprintf(rd->base_name, sizeof rd->base_name, "%s", json_string_value(v));
    return 0;
}

/* Reads dir's config, decides the layout and opens the weights file's header. */
static int reader_open(reader *rd, const char *dir, char *err, size_t errlen)
{
    memset(rd, 0, sizeof *rd);
    rd->dir = dir;
    if (!util_is_dir(dir))
        return util_errf(err, errlen,
                         "%s: not a directory; an adapter is a directory holding adapter_config.json and its weights.",
                         dir);
    char peft_w[4200], mlx_w[4200];
    if (util_pathf(rd->cfg_path, sizeof rd->cfg_path, "%s/adapter_config.json", dir) ||
        util_pathf(peft_w, sizeof peft_w, "%s/adapter_model.safetensors", dir) ||
        util_pathf(mlx_w, sizeof mlx_w, "%s/adapters.safetensors", dir))
        return util_errf(err, errlen, "%s: adapter path too long.", dir);
    if (!util_is_file(rd->cfg_path))
        return util_errf(err, errlen,
                         "%s: no adapter_config.json; an adapter directory holds adapter_config.json with "
                         "adapter_model.safetensors (PEFT) or adapters.safetensors (mlx-lm).",
                         dir);
    char *buf;
    size_t len;
    if (util_read_file(rd->cfg_path, MAX_CONFIG_BYTES, &buf, &len, err, errlen))
        return -1;
    json_error_t je;
    rd->cfg = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!rd->cfg)
        return util_errf(err, errlen, "%s: line %d column %d: not valid JSON (%s); the adapter's config is corrupt.",
                         rd->cfg_path, je.line, je.column, je.text);
    if (!json_is_object(rd->cfg))
        return util_errf(err, errlen, "%s: not a JSON object; the adapter's config is corrupt.", rd->cfg_path);
    bool peft_keys = cfg_get(rd, "peft_type") || cfg_get(rd, "r") || cfg_get(rd, "lora_alpha");
    rd->mlx = cfg_get(rd, "lora_parameters") || cfg_get(rd, "fine_tune_type") ||
              (!peft_keys && util_is_file(mlx_w) && !util_is_file(peft_w));
    rd->w_name = rd->mlx ? "adapters.safetensors" : "adapter_model.safetensors";
    snprintf(rd->w_path, sizeof rd->w_path, "%s", rd->mlx ? mlx_w : peft_w);
    if (rd->mlx ? read_mlx_config(rd, err, errlen) : read_peft_config(rd, err, errlen))
        return -1;
    if (!util_is_file(rd->w_path)) {
        char bin[4200];
        snprintf(bin, sizeof bin, "%s/adapter_model.bin", dir);
        if (!rd->mlx && util_is_file(bin))
            return util_errf(err, errlen,
                             "%s: holds adapter_model.bin (a PyTorch pickle), which spill does not read; re-save the "
                             "adapter as safetensors (save_pretrained with safe_serialization=True).",
                             dir);
        return util_errf(err, errlen, "%s: no %s; the adapter's weights are missing (copy the whole adapter directory).",
                         dir, rd->w_name);
    }
    return st_open(rd->w_path, &rd->st, err, errlen);
}

/* The module path of PEFT tensor `name` (without base_model.model. and the lora suffix) in mod, and whether it is
 * lora_B.  Refuses what is not a LoRA factor. */
static int peft_split_name(const reader *rd, const char *name, char *mod, size_t cap, bool *is_b, char *err,
                           size_t errlen)
{
    const char *n = !strncmp(name, "base_model.model.", 17) ? name + 17 : name;
    if (strstr(n, "lora_magnitude_vector"))
        return util_errf(err, errlen,
                         "%s: tensor %s is a DoRA magnitude vector, and spill does not apply DoRA; merge the adapter "
                         "into the base (peft merge_and_unload) and run the merged model.",
                         rd->w_path, name);
    if (strstr(n, "lora_embedding_"))
        return util_errf(err, errlen,
                         "%s: tensor %s adapts the embeddings, and spill does not adapt them; retrain the adapter "
                         "without embedding targets.",
                         rd->w_path, name);
    const char *mk = NULL;
    for (const char *q = strstr(n, ".lora_"); q; q = strstr(q + 1, ".lora_"))
        if ((q[6] == 'A' || q[6] == 'B') && (q[7] == 0 || q[7] == '.'))
            mk = q;
    if (!mk)
        return util_errf(err, errlen,
                         "%s: tensor %s is a whole weight, not a LoRA factor (lora_A / lora_B), as a full fine-tune or "
                         "a merged model saves; run that checkpoint as a model in its own right.",
                         rd->w_path, name);
    const char *tail = mk + 7; /* "", ".weight", ".<adapter>.weight" */
    if (ends_with(tail, ".bias"))
        return util_errf(err, errlen,
                         "%s: tensor %s is a bias of a LoRA factor (lora_bias), which spill does not apply; retrain "
                         "the adapter without it.",
                         rd->w_path, name);
    const char *dot = *tail ? strchr(tail + 1, '.') : NULL;
    if (*tail && strcmp(tail, ".weight") && !(dot && !strcmp(dot, ".weight") && dot > tail + 1))
        return util_errf(err, errlen, "%s: tensor %s ends in %s after lora_%c, which is not a PEFT factor's name.",
                         rd->w_path, name, tail, mk[6]);
    if ((size_t)(mk - n) >= cap)
        return util_errf(err, errlen, "%s: tensor %s has a module name too long to be a transformer's.", rd->w_path,
                         name);
    memcpy(mod, n, (size_t)(mk - n));
    mod[mk - n] = 0;
    *is_b = mk[6] == 'B';
    return 0;
}

/* As peft_split_name for an mlx-lm tensor (model.layers.N.<module>.lora_a). */
static int mlx_split_name(const reader *rd, const char *name, char *mod, size_t cap, bool *is_b, char *err,
                          size_t errlen)
{
    size_t n = strlen(name);
    if (ends_with(name, ".lora_a") || ends_with(name, ".lora_b")) {
        if (n - 7 >= cap)
            return util_errf(err, errlen, "%s: tensor %s has a module name too long to be a transformer's.",
                             rd->w_path, name);
        memcpy(mod, name, n - 7);
        mod[n - 7] = 0;
        *is_b = name[n - 1] == 'b';
        return 0;
    }
    if (strstr(name, ".lora_a_") || strstr(name, ".lora_b_"))
        return util_errf(err, errlen,
                         "%s: tensor %s is part of a quantized LoRA factor, which spill does not read; re-save the "
                         "adapter with fp16 or fp32 factors.",
                         rd->w_path, name);
    if (ends_with(name, ".m"))
        return util_errf(err, errlen,
                         "%s: tensor %s is a DoRA magnitude, and spill does not apply DoRA; fuse the adapter into the "
                         "base (mlx_lm.fuse) and run the fused model.",
                         rd->w_path, name);
    return util_errf(err, errlen,
                     "%s: tensor %s is a whole weight, not a LoRA factor (lora_a / lora_b), as a full fine-tune saves; "
                     "run that checkpoint as a model in its own right.",
                     rd->w_path, name);
}

/* Maps module path mod (model.layers.N.<module>) of tensor `name` to its layer and module. */
static int classify(const reader *rd, const char *name, const char *mod, int *layer, const module **md, char *err,
                    size_t errlen)
{
    if (!strcmp(mod, "lm_head"))
        return util_errf(err, errlen,
                         "%s: tensor %s adapts the LM head (lm_head), which spill does not adapt; retrain the adapter "
                         "without that target.",
                         rd->w_path, name);
    if (strstr(mod, "embed_tokens"))
        return util_errf(err, errlen,
                         "%s: tensor %s adapts the embeddings, and spill does not adapt them; retrain the adapter "
                         "without embedding targets.",
                         rd->w_path, name);
    const char *p = mod;
    if (strncmp(p, "model.layers.", 13) || p[13] < '0' || p[13] > '9')
        return util_errf(err, errlen,
                         "%s: tensor %s adapts %s, which is not a module of model.layers.N spill knows; retrain the "
                         "adapter without that target.",
                         rd->w_path, name, mod);
    p += 13;
    long l = 0;
    while (*p >= '0' && *p <= '9') {
        l = l * 10 + (*p++ - '0');
        if (l > 1000000)
            break;
    }
    if (*p != '.')
        return util_errf(err, errlen, "%s: tensor %s has no module after its layer index.", rd->w_path, name);
    p++;
    *layer = (int)l;
    *md = module_find(p);
    if (*md)
        return 0;
    if (is_expert_path(p))
        return util_errf(err, errlen,
                         "%s: tensor %s adapts %s of layer %ld, a mixture-of-experts router or expert, and spill "
                         "applies LoRA to the attention of MoE bases only; retrain the adapter without expert "
                         "targets.",
                         rd->w_path, name, p, l);
    return util_errf(err, errlen,
                     "%s: tensor %s adapts %s, a module spill does not know (it adapts self_attn q/k/v/o_proj, "
                     "qkv_proj and mlp gate/up/down_proj, gate_up_proj); retrain the adapter without that target.",
                     rd->w_path, name, p);
}

/* Walks every tensor of the weights file into rd->t (one target per layer and module, with both factors),
 * checking names, pairs, dtypes and ranks: everything that does not need the base. */
static int reader_scan(reader *rd, char *err, size_t errlen)
{
    const st_file *st = rd->st;
    rd->t = calloc(st->n_tensors ? st->n_tensors : 1, sizeof *rd->t);
    if (!rd->t)
        return util_errf(err, errlen, "out of memory reading %s.", rd->w_path);
    for (size_t i = 0; i < st->n_tensors; i++) {
        const st_tensor *t = &st->tensors[i];
        char mod[256];
        bool is_b = false;
        int layer = 0;
        const module *md = NULL;
        if ((rd->mlx ? mlx_split_name : peft_split_name)(rd, t->name, mod, sizeof mod, &is_b, err, errlen) ||
            classify(rd, t->name, mod, &layer, &md, err, errlen))
            return -1;
        target *g = NULL;
        for (size_t j = 0; j < rd->n_t && !g; j++)
            if (rd->t[j].layer == layer && rd->t[j].md == md)
                g = &rd->t[j];
        if (!g) {
            g = &rd->t[rd->n_t++];
            g->layer = layer;
            g->md = md;
        }
        const st_tensor **slot = is_b ? &g->b : &g->a;
        if (*slot)
            return util_errf(err, errlen, "%s: tensors %s and %s are both lora_%c of layer %d %s; keep one.",
                             rd->w_path, (*slot)->name, t->name, is_b ? 'B' : 'A', layer, md->path);
        *slot = t;
    }
    if (rd->n_t == 0)
        return util_errf(err, errlen,
                         "%s: holds no LoRA factors (no lora_A / lora_B tensors); it is not a LoRA adapter's weights.",
                         rd->w_path);
    for (size_t j = 0; j < rd->n_t; j++) {
        target *g = &rd->t[j];
        if (!g->a || !g->b)
            return util_errf(err, errlen,
                             "%s: tensor %s has no matching lora_%c (layer %d %s); the weights file is incomplete "
                             "(copy the whole adapter again).",
                             rd->w_path, (g->a ? g->a : g->b)->name, g->a ? 'B' : 'A', g->layer, g->md->path);
        const st_tensor *f[2] = {g->a, g->b};
        for (int k = 0; k < 2; k++) {
            if (f[k]->dtype != ST_F32 && f[k]->dtype != ST_F16 && f[k]->dtype != ST_BF16)
                return util_errf(err, errlen, "%s: tensor %s is stored as %s, but LoRA factors must be F32, F16 or "
                                 "BF16; re-save the adapter in one of those.",
                                 rd->w_path, f[k]->name, st_dtype_name(f[k]->dtype));
            if (f[k]->n_dims != 2)
                return util_errf(err, errlen, "%s: tensor %s has %u dimensions; a LoRA factor is a matrix.",
                                 rd->w_path, f[k]->name, f[k]->n_dims);
        }
        /* PEFT: A [r, in], B [out, r]; mlx-lm: lora_a [in, r], lora_b [r, out] */
        int64_t ra = (int64_t)(rd->mlx ? g->a->shape[1] : g->a->shape[0]);
        int64_t rb = (int64_t)(rd->mlx ? g->b->shape[0] : g->b->shape[1]);
        g->in = (int64_t)(rd->mlx ? g->a->shape[0] : g->a->shape[1]);
        g->out = (int64_t)(rd->mlx ? g->b->shape[1] : g->b->shape[0]);
        g->r = ra;
        if (ra != rb)
            return util_errf(err, errlen, "%s: %s has rank %lld but %s has rank %lld; the factors disagree.",
                             rd->w_path, g->a->name, (long long)ra, g->b->name, (long long)rb);
        char mname[300];
        snprintf(mname, sizeof mname, "model.layers.%d.%s", g->layer, g->md->path);
        double r = rd->r, alpha = rd->alpha;
        bool r_pat = rd->rank_pattern && pattern_value(rd->rank_pattern, mname, &r);
        if (rd->alpha_pattern)
            pattern_value(rd->alpha_pattern, mname, &alpha);
        if (ra != (int64_t)r)
            return util_errf(err, errlen,
                             "%s: tensor %s has rank %lld but %s says %s %d; the config and the weights disagree "
                             "(re-save the adapter).",
                             rd->w_path, g->a->name, (long long)ra, rd->cfg_path,
                             r_pat ? "rank_pattern gives it rank" : rd->mlx ? "lora_parameters.rank =" : "r =", (int)r);
        g->scale = rd->mlx ? rd->scale : rd->rslora ? alpha / sqrt(r) : alpha / r;
        if (g->in <= 0 || g->out <= 0)
            return util_errf(err, errlen, "%s: tensor %s is empty.", rd->w_path, g->a->name);
    }
    return 0;
}

/* Whether layer l of the base has module md, split or fused. */
static bool base_has(const arch_layout *a, const module *md, int l)
{
    return arch_slot_need(a, md->arch, l) != ARCH_ABSENT ||
           (md->fused != ARCH_SLOT_COUNT && arch_slot_need(a, md->fused, l) != ARCH_ABSENT);
}

/* Checks every target against the base: layer in range (and, for mlx-lm, among the last num_layers), module
 * present, shapes the base's. */
static int check_base(const reader *rd, const model_desc *m, const arch_layout *a, char *err, size_t errlen)
{
    const char *other = "this adapter was made for another base";
    int L = m->n_layers;
    if (rd->mlx && rd->num_layers > L)
        return util_errf(err, errlen, "%s: num_layers is %d but the base %s has %d layers; %s.", rd->cfg_path,
                         rd->num_layers, m->source, L, other);
    for (size_t j = 0; j < rd->n_t; j++) {
        const target *g = &rd->t[j];
        if (g->layer >= L)
            return util_errf(err, errlen, "%s: tensor %s is for layer %d but the base %s has %d layers (0 to %d); %s.",
                             rd->w_path, g->a->name, g->layer, m->source, L, L - 1, other);
        if (rd->mlx && rd->num_layers >= 0 && g->layer < L - rd->num_layers)
            return util_errf(err, errlen,
                             "%s: tensor %s is for layer %d but num_layers %d adapts layers %d to %d only; the config "
                             "and the weights disagree (re-save the adapter).",
                             rd->w_path, g->a->name, g->layer, rd->num_layers, L - rd->num_layers, L - 1);
        if (!base_has(a, g->md, g->layer)) {
            if (g->md->arch >= ARCH_GATE && arch_layer_sparse(a, g->layer))
                return util_errf(err, errlen,
                                 "%s: tensor %s adapts %s of layer %d, whose FFN in the base is routed experts, and "
                                 "spill applies LoRA to the attention of MoE bases only; retrain the adapter without "
                                 "MLP targets.",
                                 rd->w_path, g->a->name, g->md->path, g->layer);
            return util_errf(err, errlen, "%s: tensor %s adapts %s, which the base %s (%s) does not have; %s.",
                             rd->w_path, g->a->name, g->md->path, m->source, m->arch, other);
        }
        int64_t in = a->t[g->md->arch].k, out = a->t[g->md->arch].n;
        if (g->in != in || g->out != out)
            return util_errf(err, errlen,
                             "%s: layer %d %s maps %lld inputs to %lld outputs but that projection of the base %s "
                             "maps %lld to %lld; %s.",
                             rd->w_path, g->layer, g->md->path, (long long)g->in, (long long)g->out, m->source,
                             (long long)in, (long long)out, other);
    }
    return 0;
}

/* Reads factor t (rows × cols as stored) into out as fp32, transposed when asked (mlx-lm's layout); refuses
 * a non-finite value. */
static int read_factor(const reader *rd, int fd, const st_tensor *t, bool transpose, float *out, char *err,
                       size_t errlen)
{
    int64_t rows = (int64_t)t->shape[0], cols = (int64_t)t->shape[1], n = rows * cols;
    uint8_t *raw = malloc(t->size ? (size_t)t->size : 1);
    float *tmp = transpose ? malloc((size_t)n * sizeof *tmp) : out;
    int rc = 0;
    if (!raw || !tmp) {
        rc = util_errf(err, errlen, "out of memory reading %s.", t->name);
        goto out_free;
    }
    for (uint64_t done = 0; done < t->size;) {
        ssize_t got = pread(fd, raw + done, (size_t)(t->size - done), (off_t)(t->offset + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = util_errf(err, errlen, "%s: read failed at byte %llu: %s.", rd->w_path,
                           (unsigned long long)(t->offset + done), got < 0 ? strerror(errno) : "unexpected end of file");
            goto out_free;
        }
        done += (uint64_t)got;
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->dtype) {
        case ST_F32:
            memcpy(&tmp[i], raw + i * 4, 4);
            break;
        case ST_F16:
            memcpy(&h, raw + i * 2, 2);
            tmp[i] = quant_fp16_to_fp32(h);
            break;
        default: /* ST_BF16 (reader_scan admits no other) */
            memcpy(&h, raw + i * 2, 2);
            tmp[i] = quant_bf16_to_fp32(h);
            break;
        }
        if (!isfinite(tmp[i])) {
            rc = util_errf(err, errlen,
                           "%s: tensor %s holds a non-finite value (%s at element %lld), so the adapter is corrupt or "
                           "its training diverged; retrain or copy it again.",
                           rd->w_path, t->name, isnan(tmp[i]) ? "NaN" : "infinity", (long long)i);
            goto out_free;
        }
    }
    if (transpose)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                out[j * rows + i] = tmp[i * cols + j];
out_free:
    free(raw);
    if (tmp != out)
        free(tmp);
    return rc;
}

/* Reads every target's factors into ad->m, splitting fused targets by the base's rows. */
static int bind_targets(const reader *rd, const arch_layout *a, lora_adapter *ad, char *err, size_t errlen)
{
    int fd = open(rd->w_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_errf(err, errlen, "%s: cannot open: %s.", rd->w_path, strerror(errno));
    float *A = NULL, *B = NULL;
    int rc = 0;
    for (size_t j = 0; j < rd->n_t && !rc; j++) {
        const target *g = &rd->t[j];
        int64_t r = g->r;
        A = malloc((size_t)(r * g->in) * sizeof *A);
        B = malloc((size_t)(g->out * r) * sizeof *B);
        if (!A || !B) {
            rc = util_errf(err, errlen, "out of memory reading %s.", rd->w_path);
            break;
        }
        if (read_factor(rd, fd, g->a, rd->mlx, A, err, errlen) || read_factor(rd, fd, g->b, rd->mlx, B, err, errlen)) {
            rc = -1;
            break;
        }
        if (g->scale != ad->scale) { /* a pattern's own scale, folded into B (see the design note) */
            if (ad->scale == 0) {
                rc = util_errf(err, errlen,
                               "%s: lora_alpha is 0 but alpha_pattern gives layer %d %s a scale; spill cannot fold "
                               "that into one adapter scale (set lora_alpha).",
                               rd->cfg_path, g->layer, g->md->path);
                break;
            }
            float f = (float)(g->scale / ad->scale);
            for (int64_t i = 0; i < g->out * r; i++)
                B[i] *= f;
        }
        enum arch_slot parts[ARCH_MAX_PARTS];
        int64_t rows[ARCH_MAX_PARTS] = {g->out};
        int np = g->md->n_parts > 1 ? arch_fused_parts(a, g->md->arch, parts, rows) : 1;
        for (int p = 0, row0 = 0; p < np && !rc; row0 += (int)rows[p], p++) {
            enum lora_slot s = g->md->parts[p];
            lora_mat *mt = &ad->m[(size_t)g->layer * LORA_N_SLOTS + s];
            if (mt->r) {
                rc = util_errf(err, errlen, "%s: layer %d's %s projection is adapted twice (%s among them); keep one "
                               "target for it.", rd->w_path, g->layer, SLOT_NAMES[s], g->a->name);
                break;
            }
            mt->r = (int32_t)r;
            mt->in = g->in;
            mt->out = rows[p];
            if (np == 1) { /* hand the buffers over */
                mt->A = A, mt->B = B;
                A = B = NULL;
            } else {
                mt->A = malloc((size_t)(r * g->in) * sizeof *mt->A);
                mt->B = malloc((size_t)(rows[p] * r) * sizeof *mt->B);
                if (!mt->A || !mt->B) {
                    rc = util_errf(err, errlen, "out of memory reading %s.", rd->w_path);
                    break;
                }
                memcpy(mt->A, A, (size_t)(r * g->in) * sizeof *A);
                memcpy(mt->B, B + (int64_t)row0 * r, (size_t)(rows[p] * r) * sizeof *B);
            }
            ad->bytes += (uint64_t)(r * (mt->in + mt->out)) * sizeof(float);
            ad->targets |= 1u << s;
            ad->rank = (int32_t)r > ad->rank ? (int32_t)r : ad->rank;
        }
        free(A), free(B);
        A = B = NULL;
    }
    free(A), free(B);
    close(fd);
    return rc;
}

/* sha256 hex over the config's bytes, then the weights file's. */
static int hash_files(const reader *rd, char out[65], char *err, size_t errlen)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    uint8_t *buf = malloc(1u << 20);
    int rc = 0;
    if (!c || !buf || !EVP_DigestInit_ex(c, EVP_sha256(), NULL)) {
        rc = util_errf(err, errlen, "out of memory hashing %s.", rd->dir);
        goto out_free;
    }
    const char *files[2] = {rd->cfg_path, rd->w_path};
    for (int i = 0; i < 2 && !rc; i++) {
        int fd = open(files[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rc = util_errf(err, errlen, "%s: cannot open: %s.", files[i], strerror(errno));
            break;
        }
        for (;;) {
            ssize_t n = read(fd, buf, 1u << 20);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                rc = util_errf(err, errlen, "%s: read failed: %s.", files[i], strerror(errno));
            if (n <= 0)
                break;
            EVP_DigestUpdate(c, buf, (size_t)n);
        }
        close(fd);
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (!rc) {
        EVP_DigestFinal_ex(c, md, &mdlen);
        for (unsigned i = 0; i < 32; i++)
            snprintf(out + 2 * i, 3, "%02x", md[i]);
    }
out_free:
    EVP_MD_CTX_free(c);
    free(buf);
    return rc;
}

/* The last path component of dir, trailing slashes ignored. */
static void base_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/')
        s--;
    snprintf(out, cap, "%.*s", (int)(n - s), dir + s);
}

/* Fills the fields of ad that need only the reader. */
static void describe(const reader *rd, lora_adapter *ad)
{
    base_name(rd->dir, ad->name, sizeof ad->name);
    snprintf(ad->path, sizeof ad->path, "%s", rd->dir);
    snprintf(ad->layout, sizeof ad->layout, "%s", rd->mlx ? "mlx" : "peft");
    snprintf(ad->base_name, sizeof ad->base_name, "%s", rd->base_name);
    ad->alpha = (float)rd->alpha;
    ad->rslora = rd->rslora;
    ad->scale = (float)rd->scale;
}

int lora_load(const model_desc *m, const arch_layout *a, const char *dir, lora_adapter **out, char *err,
              size_t errlen)
{
    *out = NULL;
    reader rd;
    lora_adapter *ad = NULL;
    int rc = -1;
    if (reader_open(&rd, dir, err, errlen) || reader_scan(&rd, err, errlen) || check_base(&rd, m, a, err, errlen))
        goto out_close;
    ad = calloc(1, sizeof *ad);
    if (ad)
        ad->m = calloc((size_t)m->n_layers * LORA_N_SLOTS, sizeof *ad->m);
    if (!ad || !ad->m) {
        util_errf(err, errlen, "out of memory loading adapter %s.", dir);
        goto out_close;
    }
    describe(&rd, ad);
    ad->n_layers = m->n_layers;
    if (bind_targets(&rd, a, ad, err, errlen) || hash_files(&rd, ad->hash, err, errlen))
        goto out_close;
    *out = ad;
    ad = NULL;
    rc = 0;
out_close:
    lora_free(ad);
    reader_close(&rd);
    return rc;
}

void lora_free(lora_adapter *ad)
{
    if (!ad)
        return;
    for (size_t i = 0; ad->m && i < (size_t)ad->n_layers * LORA_N_SLOTS; i++) {
        free(ad->m[i].A);
        free(ad->m[i].B);
    }
    free(ad->m);
    free(ad);
}

/* ---------------------------------------------------------------- names */

int lora_resolve(const char *name, char *dir, size_t cap, char *err, size_t errlen)
{
    const char *home = util_spill_home();
    if (!name || !*name)
        return util_errf(err, errlen, "an adapter name is empty; name a directory under %s/adapters/ or pass a path.",
                         home);
    if (strchr(name, '/') || name[0] == '.') {
        if (!util_is_dir(name))
            return util_errf(err, errlen, "%s: no such adapter directory; pass the directory holding "
                             "adapter_config.json.", name);
        if (util_pathf(dir, cap, "%s", name))
            return util_errf(err, errlen, "%s: adapter path too long.", name);
        return 0;
    }
    if (util_pathf(dir, cap, "%s/adapters/%s", home, name))
        return util_errf(err, errlen, "adapter %s: path too long.", name);
    if (!util_is_dir(dir))
        return util_errf(err, errlen,
                         "no adapter called %s (%s is not a directory); put the adapter's directory there or pass "
                         "its path.",
                         name, dir);
    return 0;
}

int lora_split_spec(const char *spec, char *base, size_t base_cap, char *adapter, size_t ad_cap, char *err,
                    size_t errlen)
{
    size_t n = strlen(spec);
    char dir[4096], e2[SPILL_ERRLEN];
    for (size_t i = n; i-- > 1;) {
        if (spec[i] != '+' || i + 1 == n || lora_resolve(spec + i + 1, dir, sizeof dir, e2, sizeof e2))
            continue;
        if (i >= base_cap || n - i - 1 >= ad_cap)
            return util_errf(err, errlen, "model spec %s is too long.", spec);
        memcpy(base, spec, i);
        base[i] = 0;
        memcpy(adapter, spec + i + 1, n - i);
        return 1;
    }
    const char *plus = strrchr(spec, '+');
    if (plus && plus != spec && model_resolve(spec, dir, sizeof dir, e2, sizeof e2) != 0)
        return util_errf(err, errlen,
                         "model spec %s names adapter \"%s\" after its last '+', but that is neither a directory "
                         "nor an adapter under %s/adapters/; install the adapter there or pass its path.",
                         spec, plus + 1, util_spill_home());
    if (n >= base_cap || ad_cap < 1)
        return util_errf(err, errlen, "model spec %s is too long.", spec);
    memcpy(base, spec, n + 1);
    adapter[0] = 0;
    return 0;
}

/* ---------------------------------------------------------------- spill adapters */

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One line of `spill adapters` for the adapter in dir, base-independent. */
static void list_one(FILE *f, const char *name, const char *dir)
{
    reader rd;
    char err[SPILL_ERRLEN], hash[65];
    if (reader_open(&rd, dir, err, sizeof err) || reader_scan(&rd, err, sizeof err) ||
        hash_files(&rd, hash, err, sizeof err)) {
        fprintf(f, "%-24s unreadable: %s\n", name, err);
        reader_close(&rd);
        return;
    }
    uint32_t targets = 0;
    int64_t rank = 0;
    for (size_t j = 0; j < rd.n_t; j++) {
        for (int p = 0; p < rd.t[j].md->n_parts; p++)
            targets |= 1u << rd.t[j].md->parts[p];
        rank = rd.t[j].r > rank ? rd.t[j].r : rank;
    }
    char tg[64] = "";
    for (int s = 0; s < LORA_N_SLOTS; s++)
        if (targets & (1u << s))
            snprintf(tg + strlen(tg), sizeof tg - strlen(tg), "%s%s", *tg ? "," : "", SLOT_NAMES[s]);
    double mb = (double)rd.st->file_size / 1e6;
    fprintf(f, "%-24s %-4s %-32s r=%-4lld %-22s %9.2f MB  %s\n", name, rd.mlx ? "mlx" : "peft",
            *rd.base_name ? rd.base_name : "-", (long long)rank, tg, mb, hash);
    reader_close(&rd);
}

int lora_list(FILE *f, char *err, size_t errlen)
{
    char root[4096], dir[8192];
    if (util_pathf(root, sizeof root, "%s/adapters", util_spill_home()))
        return util_errf(err, errlen, "the adapters directory path is too long.");
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT)
            return 0; /* nothing installed */
        return util_errf(err, errlen, "%s: cannot list: %s.", root, strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (util_pathf(dir, sizeof dir, "%s/%s", root, de->d_name) || !util_is_dir(dir))
            continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            char **nn = realloc(names, nc * sizeof *nn);
            if (!nn) {
                rc = util_errf(err, errlen, "out of memory listing %s.", root);
                break;
            }
            names = nn, cap = nc;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = util_errf(err, errlen, "out of memory listing %s.", root);
            break;
        }
        n++;
    }
    closedir(d);
    if (!rc) {
        qsort(names, n, sizeof *names, cmp_names);
        for (size_t i = 0; i < n; i++) {
            snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
            list_one(f, names[i], dir);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}
