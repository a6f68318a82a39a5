/*
 * embed.c — which pooling and normalisation a model's embeddings use, read from the model's own files, and the
 * normalisation maths.  The rows themselves (prefill, pooling, output) are run_embed.c's.
 *
 * Where the choice comes from, first match wins:
 *   1. --pooling last|mean|cls on the command line (the mode only; normalisation stays the model's).
 *   2. A sentence-transformers layout in a Hugging Face model directory: modules.json lists the modules in order
 *      ({"idx", "name", "path", "type"}); the Pooling module's <path>/config.json sets one pooling_mode_* key
 *      true (pooling_mode_lasttoken → last, pooling_mode_mean_tokens → mean, pooling_mode_cls_token → cls); a
 *      Normalize module means L2 normalisation, its absence none.  Modes spill does not compute (max,
 *      mean_sqrt_len, weightedmean, several at once, include_prompt false) and modules it does not apply (Dense,
 *      anything but Transformer, Pooling and Normalize) make every embedding row fail with a sentence naming
 *      them, rather than answer a vector the model would not give.
 *   3. A GGUF's <general.architecture>.pooling_type (llama.cpp's enum: 1 mean, 2 cls, 3 last; 0 none and -1
 *      unspecified fall through to 4; 4 rank, a reranker's head, fails the rows).  llama.cpp normalises GGUF
 *      embeddings by default, so these are normalised too.
 *   4. Nothing says: last token, normalised.  A generative model with no embedding metadata still embeds —
 *      decided so because the decoder-only embedding models (Qwen3-Embedding, e5-mistral, gte-Qwen2) are
 *      themselves generative checkpoints that pool the last token, often shipped as a plain GGUF without the
 *      key, and refusing them would refuse the very models this endpoint is for; the vector is what such a
 *      model's last position sees of the whole input (causal attention), and the stamp of the run keeps the
 *      model's fingerprint, so nobody mistakes it for another model's.
 *
 * Matryoshka (body.dimensions): only --matryoshka allows it — no file format says whether a model was trained
 * so its leading components stand alone (Qwen3-Embedding was, e5-mistral was not), and a truncated vector of a
 * model that was not is quietly worse, so the user who knows says so.
 */
#include "embed.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../model/gguf.h"

const char *embed_pool_name(embed_pool p)
{
    return p == EMBED_POOL_MEAN ? "mean" : p == EMBED_POOL_CLS ? "cls" : "last";
}

void embed_normalize(float *v, int64_t n)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)v[i] * v[i];
    if (ss <= 0)
        return;
    double inv = 1.0 / sqrt(ss);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(v[i] * inv);
}

/* A JSON file of the layout; NULL with a sentence when it cannot be read or parsed. */
static json_t *read_json(const char *path, char *err, size_t errlen)
{
    char *text;
    size_t len;
    if (util_read_file(path, 1u << 20, &text, &len, err, errlen))
        return NULL;
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    free(text);
    if (!j)
        util_errf(err, errlen, "%s is not valid JSON (%s, line %d); fix or remove the sentence-transformers files.",
                  path, je.text, je.line);
    return j;
}

/* The layout of a model directory with modules.json (rule 2); 0, or -1 with a sentence. */
static int from_sentence_transformers(const char *dir, const char *modules, embed_cfg *c, char *err, size_t errlen)
{
    json_t *mods = read_json(modules, err, errlen);
    if (!mods)
        return -1;
    int rc = 0;
    bool pooled = false;
    c->normalize = false;
    size_t i;
    json_t *mo;
    if (!json_is_array(mods))
        rc = util_errf(err, errlen, "%s is not a list of modules; fix or remove it.", modules);
    json_array_foreach(mods, i, mo)
    {
        if (rc)
            break;
        const char *type = json_string_value(json_object_get(mo, "type"));
        const char *sub = json_string_value(json_object_get(mo, "path"));
        const char *base = type ? strrchr(type, '.') : NULL;
        base = base ? base + 1 : type;
        if (base && !strcmp(base, "Normalize")) {
            c->normalize = true;
        } else if (base && !strcmp(base, "Pooling")) {
            char cp[4096];
            if (util_pathf(cp, sizeof cp, "%s/%s/config.json", dir, sub ? sub : "")) {
                rc = util_errf(err, errlen, "%s: the Pooling module's path is too long.", modules);
                break;
            }
            json_t *pc = read_json(cp, err, errlen);
            if (!pc) {
                rc = -1;
                break;
            }
            static const char *const modes[] = {"pooling_mode_lasttoken", "pooling_mode_mean_tokens",
                                                "pooling_mode_cls_token"};
            static const char *const other[] = {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                                "pooling_mode_weightedmean_tokens"};
            int on = 0;
            for (int k = 0; k < 3; k++)
                if (json_is_true(json_object_get(pc, modes[k])))
                    on++, c->pool = (embed_pool)k;
            for (int k = 0; k < 3 && !c->refuse[0]; k++)
                if (json_is_true(json_object_get(pc, other[k])))
                    snprintf(c->refuse, sizeof c->refuse,
                             "The model's %s/config.json asks for %s, a pooling spill does not compute (it pools the "
                             "last token, the mean or the first token); run it with --pooling to choose one.",
                             sub ? sub : "Pooling", other[k]);
            if (!c->refuse[0] && on != 1)
                snprintf(c->refuse, sizeof c->refuse,
                         "The model's %s/config.json sets %d pooling modes, but an embedding takes one; run it with "
                         "--pooling last, mean or cls.", sub ? sub : "Pooling", on);
            if (!c->refuse[0] && json_is_false(json_object_get(pc, "include_prompt")))
                snprintf(c->refuse, sizeof c->refuse,
                         "The model's %s/config.json pools without the instruction prompt (include_prompt false), "
                         "which spill does not do; run it with --pooling to pool every input token.",
                         sub ? sub : "Pooling");
            c->refuse_mode = c->refuse[0] != 0;
            json_decref(pc);
            pooled = true;
            snprintf(c->source, sizeof c->source, "the model's modules.json and %s/config.json",
                     sub ? sub : "Pooling");
        } else if (!base || strcmp(base, "Transformer")) {
            if (!c->refuse[0])
                snprintf(c->refuse, sizeof c->refuse,
                         "The model's modules.json has a %.80s module, which spill does not apply to embeddings "
                         "(it applies Transformer, Pooling and Normalize only).", base ? base : "typeless");
        }
    }
    json_decref(mods);
    if (rc == 0 && !pooled)
        snprintf(c->source, sizeof c->source, "the model's modules.json (no Pooling module: last token)");
    return rc;
}

int embed_cfg_from_model(const model_desc *m, const char *path, const char *pooling, bool matryoshka,
                         embed_cfg *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->pool = EMBED_POOL_LAST;
    out->normalize = true;
    out->matryoshka = matryoshka;
    snprintf(out->source, sizeof out->source, "no embedding metadata in the model, so the default");
    char modules[4096];
    bool st = path && util_is_dir(path) && util_pathf(modules, sizeof modules, "%s/modules.json", path) == 0 &&
              util_is_file(modules);
    if (st) {
        if (from_sentence_transformers(path, modules, out, err, errlen))
            return -1;
    } else if (m->gguf) {
        const char *arch;
        size_t al;
        char key[96];
        int64_t pt = -1;
        if (gguf_get_str(m->gguf, "general.architecture", &arch, &al) &&
            snprintf(key, sizeof key, "%.*s.pooling_type", (int)(al < 64 ? al : 64), arch) > 0 &&
            gguf_get_i64(m->gguf, key, &pt)) {
            if (pt >= 1 && pt <= 3) {
                out->pool = pt == 1 ? EMBED_POOL_MEAN : pt == 2 ? EMBED_POOL_CLS : EMBED_POOL_LAST;
                snprintf(out->source, sizeof out->source, "the GGUF's %s = %lld", key, (long long)pt);
            } else if (pt == 4) {
                snprintf(out->refuse, sizeof out->refuse,
                         "The model's %s is 4 (rank): it is a reranker, whose scores are not embeddings.", key);
            }
        }
    }
    if (pooling) {
        out->pool = !strcmp(pooling, "mean") ? EMBED_POOL_MEAN : !strcmp(pooling, "cls") ? EMBED_POOL_CLS
                                                                                          : EMBED_POOL_LAST;
        if (out->refuse_mode) /* the user chose the mode the model's files could not give */
            out->refuse[0] = 0;
        char was[sizeof out->source];
        snprintf(was, sizeof was, "%s", out->source);
        snprintf(out->source, sizeof out->source, "--pooling %s (normalisation from %.150s)", pooling, was);
    }
    return 0;
}
