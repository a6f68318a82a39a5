/*
 * tok_config.c — the special tokens' text that sits beside a tokenizer.json:
 * tokenizer_config.json's `bos_token` / `eos_token`, what transformers'
 * AutoTokenizer keeps as tokenizer.bos_token / eos_token and hands a chat
 * template in apply_chat_template (its special_tokens_map).
 *
 * Files read (JSON objects, both optional, next to the tokenizer.json):
 *   tokenizer_config.json   "bos_token" / "eos_token": a string, an AddedToken
 *                           object {"content": …}, or null / absent (none);
 *   special_tokens_map.json the same keys, read only when tokenizer_config.json
 *                           has no "added_tokens_decoder", and then winning
 *                           (transformers 5's legacy path in _from_pretrained).
 *
 * Key decision: a tokenizer loaded from a tokenizer.json file always has its
 * text decided here, even when neither file exists (transformers then has no
 * bos_token either, and a template sees it undefined); only GGUF vocabularies
 * and in-memory tokenizer.json images leave it undecided, and callers fall
 * back on the special id's piece (prompt.c).  Tokenizer classes' own defaults
 * (LlamaTokenizerFast's "<s>" when the file names none) are not reproduced.
 * Does not own: the special ids (tokenizer.c, tok_gguf.c), chat templates.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* Loads the JSON object at path into *out (NULL when there is no such file). */
static int load_object(const char *path, json_t **out, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    *out = NULL;
    if (!util_is_file(path))
        return 0;
    if (util_read_file(path, TOKENIZER_JSON_MAX, &buf, &len, err, errlen))
        return -1;
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    free(buf);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return util_errf(err, errlen, "%s: line %d, column %d: %s.", path, je.line, je.column,
                         j ? "the file must hold a JSON object" : je.text);
    }
    *out = j;
    return 0;
}

/* Sets the text of `which` from obj[key] when obj has the key: a string, {"content": string}, or null. */
static int take(tokenizer *t, json_t *obj, const char *key, tok_special which, const char *file, char *err,
                size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_null(v) && !json_is_string(v))
        return util_errf(err, errlen, "%s: %s is neither a string, an object with a string \"content\", nor null.",
                         file, key);
    free(t->special_text[which]);
    t->special_text[which] = NULL;
    t->special_text_len[which] = 0;
    if (json_is_null(v))
        return 0;
    if (!(t->special_text[which] = tk_dupn(json_string_value(v), json_string_length(v))))
        return util_errf(err, errlen, "%s: out of memory.", file);
    t->special_text_len[which] = json_string_length(v);
    return 0;
}

int tk_config_load(tokenizer *t, const char *tokenizer_json, char *err, size_t errlen)
{
    char cfg_path[4096], map_path[4096];
    const char *slash = strrchr(tokenizer_json, '/');
    int dl = slash ? (int)(slash - tokenizer_json) : 1; /* "/tokenizer.json" -> "" + "/tokenizer_config.json" */
    const char *dir = slash ? tokenizer_json : ".";
    if (util_pathf(cfg_path, sizeof cfg_path, "%.*s/tokenizer_config.json", dl, dir) ||
        util_pathf(map_path, sizeof map_path, "%.*s/special_tokens_map.json", dl, dir))
        return util_errf(err, errlen, "%s: path too long.", tokenizer_json);
    json_t *cfg = NULL, *map = NULL;
    int rc = load_object(cfg_path, &cfg, err, errlen);
    if (rc == 0 && !json_object_get(cfg, "added_tokens_decoder"))
        rc = load_object(map_path, &map, err, errlen);
    t->special_text_known = true;
    static const struct {
        const char *key;
        tok_special which;
    } keys[] = {{"bos_token", TOK_BOS}, {"eos_token", TOK_EOS}};
    for (size_t i = 0; rc == 0 && i < sizeof keys / sizeof keys[0]; i++) {
        rc = take(t, cfg, keys[i].key, keys[i].which, cfg_path, err, errlen);
        if (rc == 0)
            rc = take(t, map, keys[i].key, keys[i].which, map_path, err, errlen);
    }
    json_decref(cfg);
    json_decref(map);
    return rc;
}

bool tokenizer_special_text(const tokenizer *t, tok_special which, const char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (!t->special_text_known || (which != TOK_BOS && which != TOK_EOS))
        return false;
    *text = t->special_text[which];
    *len = t->special_text_len[which];
    return true;
}
