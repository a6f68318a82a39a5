/*
 * prompt.c — the one path from a request to prompt token ids (prompt.h):
 * the model's tokenizer and template opened the same way for every command,
 * the template's bos_token/eos_token chosen in one place, chat prompts
 * rendered and tokenized, completions prompts tokenized or checked.
 *
 * Key decision: bos_token and eos_token follow transformers (the strings of
 * tokenizer_config.json, read with the tokenizer) and fall back on the ids
 * only where no tokenizer files speak (GGUF vocabularies): before this file,
 * `spill template` took the model's ids alone and `spill run` the
 * tokenizer's, and both rendered an empty bos_token for a Hugging Face model
 * whose config.json names no bos_token_id.
 * Does not own: what a batch row may contain (batch/request.c) or how long a
 * prompt may be (batch/run_rows.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prompt.h"
#include "../base/util.h"

int prompt_open_tokenizer(const model_desc *m, tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    if (m->format == MODEL_GGUF)
        return tokenizer_from_gguf(m->gguf, out, err, errlen);
    if (!m->tokenizer_path)
        return util_errf(err, errlen, "%s: tokenizer.json is missing.", m->source);
    return tokenizer_from_json_file(m->tokenizer_path, out, err, errlen);
}

int prompt_open_template(const model_desc *m, tmpl_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!m->chat_template)
        return 0;
    return template_compile(m->chat_template, strlen(m->chat_template), "chat template", out, err, errlen);
}

/* Sets key to the text of `which`: the tokenizer files' when they decide, else the piece of the model's id
 * (or the tokenizer's own special id when the model names none).  A text that is not valid UTF-8 cannot be a
 * JSON string: the key stays out, as when there is no token. */
static void set_special(const prompt_src *ps, json_t *extra, const char *key, tok_special which, int32_t model_id)
{
    const char *p;
    size_t pl;
    if (!tokenizer_special_text(ps->tok, which, &p, &pl)) {
        int32_t id = model_id >= 0 ? model_id : tokenizer_special(ps->tok, which);
        p = id >= 0 ? tokenizer_piece(ps->tok, id, &pl) : NULL;
    }
    if (p)
        json_object_set_new(extra, key, json_stringn(p, pl));
}

void prompt_special_tokens(const prompt_src *ps, json_t *extra)
{
    set_special(ps, extra, "bos_token", TOK_BOS, ps->m->bos_id);
    set_special(ps, extra, "eos_token", TOK_EOS, ps->m->eos_id);
}

/* A content part's text (its "text", or an assistant refusal's "refusal"); NULL for any other part. */
static json_t *part_text(json_t *part)
{
    json_t *t = json_object_get(part, "text");
    return json_is_string(t) ? t : json_object_get(part, "refusal");
}

json_t *prompt_template_messages(json_t *messages)
{
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
    {
        json_t *c = json_is_object(m) ? json_object_get(m, "content") : NULL;
        json_t *tc = json_is_object(m) ? json_object_get(m, "tool_calls") : NULL;
        bool parts = json_is_array(c), calls = json_is_array(tc), none = json_is_object(m) && (!c || json_is_null(c));
        json_t *copy = parts || calls || none ? json_copy(m) : json_incref(m);
        if (!out || !copy || json_array_append_new(out, copy))
            goto oom;
        if (none && json_object_set_new(copy, "content", json_string("")))
            goto oom;
        if (parts) { /* the text parts as one string, "\n" between them (vLLM's flattening) */
            size_t k, n = 0, at = 0;
            json_t *part;
            json_array_foreach(c, k, part)
                n += json_string_length(part_text(part)) + 1;
            char *joined = malloc(n + 1);
            if (!joined)
                goto oom;
            json_array_foreach(c, k, part)
            {
                json_t *t = part_text(part);
                if (k)
                    joined[at++] = '\n';
                memcpy(joined + at, json_string_value(t) ? json_string_value(t) : "", json_string_length(t));
                at += json_string_length(t);
            }
            int bad = json_object_set_new(copy, "content", json_stringn(joined, at));
            free(joined);
            if (bad)
                goto oom;
        }
        if (calls) { /* arguments as the dict the template expects, parsed from OpenAI's JSON text */
            json_t *ncalls = json_array();
            if (!ncalls || json_object_set_new(copy, "tool_calls", ncalls))
                goto oom;
            size_t k;
            json_t *call;
            json_array_foreach(tc, k, call)
            {
                json_t *fn = json_object_get(call, "function");
                json_t *args = json_object_get(fn, "arguments");
                json_t *parsed = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args),
                                                                     JSON_REJECT_DUPLICATES, NULL)
                                                      : NULL;
                if (!json_is_object(parsed)) {
                    json_decref(parsed);
                    if (json_array_append(ncalls, call))
                        goto oom;
                    continue;
                }
                json_t *ncall = json_copy(call), *nfn = json_copy(fn);
                if (!ncall || !nfn || json_object_set_new(nfn, "arguments", json_incref(parsed))) {
                    json_decref(ncall), json_decref(nfn), json_decref(parsed);
                    goto oom;
                }
                json_decref(parsed);
                /* set_new and append_new take their value even when they fail */
                if (json_object_set_new(ncall, "function", nfn)) {
                    json_decref(ncall);
                    goto oom;
                }
                if (json_array_append_new(ncalls, ncall))
                    goto oom;
            }
        }
    }
    return out;
oom:
    json_decref(out);
    return NULL;
}

int prompt_chat(const prompt_src *ps, json_t *messages, json_t *tools, bool add_generation_prompt, time_t now,
                char **text, size_t *text_len, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    char *out = NULL;
    size_t outlen = 0;
    *ids = NULL;
    *n = 0;
    if (text) {
        *text = NULL;
        *text_len = 0;
    }
    if (!ps->tmpl)
        return util_errf(err, errlen, "%s has no chat template.", ps->m->source);
    json_t *extra = json_object();
    if (!extra)
        return util_errf(err, errlen, "out of memory rendering the chat template.");
    json_t *msgs = prompt_template_messages(messages);
    if (!msgs) {
        json_decref(extra);
        return util_errf(err, errlen, "out of memory rendering the chat template.");
    }
    prompt_special_tokens(ps, extra);
    int rc = 0;
    if (chat_template_apply(ps->tmpl, msgs, tools, extra, add_generation_prompt, now, &out, &outlen, err, errlen))
        rc = PROMPT_ERR_TEMPLATE;
    json_decref(extra);
    json_decref(msgs);
    /* a rendered chat already carries its special tokens: no post-processor */
    if (rc == 0)
        rc = tokenizer_encode(ps->tok, out, outlen, false, ids, n, err, errlen);
    if (rc == 0 && text) {
        *text = out;
        *text_len = outlen;
        out = NULL;
    }
    free(out);
    return rc;
}

int prompt_text(const prompt_src *ps, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                char *err, size_t errlen)
{
    return tokenizer_encode(ps->tok, text, len, add_special, ids, n, err, errlen);
}

int prompt_completion(const prompt_src *ps, json_t *prompt, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    json_t *p = prompt;
    *ids = NULL;
    *n = 0;
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p))
        return prompt_text(ps, json_string_value(p), json_string_length(p), true, ids, n, err, errlen);
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_array(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    size_t k = json_array_size(p);
    int32_t *v = malloc((k ? k : 1) * sizeof *v);
    if (!v)
        return util_errf(err, errlen, "Out of memory reading the prompt.");
    for (size_t i = 0; i < k; i++) {
        json_int_t id = json_integer_value(json_array_get(p, i));
        if (id < 0 || id >= ps->m->vocab) {
            free(v);
            return util_errf(err, errlen, "prompt[%zu] is token id %lld, outside this model's vocabulary of %d.", i,
                             (long long)id, ps->m->vocab);
        }
        v[i] = (int32_t)id;
    }
    *ids = v;
    *n = k;
    return 0;
}
