/*
 * prompt.h — the one path from a request to the prompt's token ids, shared by
 * `spill template`, `spill tokenize` and `spill run`, so what the debugging
 * commands show is what the model is fed.
 *
 * A chat request (messages, tools) is rendered through the model's chat
 * template with add_generation_prompt and the template's special tokens
 * (bos_token / eos_token as transformers passes them, prompt_special_tokens),
 * then tokenized WITHOUT the post-processor's specials: a rendered chat
 * already carries them.  A completions prompt (a string, or token ids) is
 * tokenized WITH them, as transformers' tokenizer(text) does.
 *
 * Does not own: loading the model (model/model.h), the Jinja interpreter
 * (template.h), the tokenizer (tokenizer.h), request validation and the
 * context-length rule (batch/).  Nothing here keeps state: a prompt_src is
 * three borrowed pointers, and every call may run from several threads.
 */
#ifndef SPILL_PROMPT_H
#define SPILL_PROMPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "../model/model.h"
#include "template.h"
#include "tokenizer.h"

/* What a prompt is built from, all borrowed: the model (its bos/eos ids and vocabulary size), its tokenizer,
 * and its chat template compiled once (NULL when the model has none). */
typedef struct prompt_src {
    const model_desc *m;
    const tokenizer *tok;
    const tmpl_t *tmpl;
} prompt_src;

/* Returned when the chat template failed (or called raise_exception): err holds its sentence
 * ("chat template line L, column C: …", or the template's own message). */
#define PROMPT_ERR_TEMPLATE (-2)

/* The tokenizer that belongs to m: the GGUF's vocabulary, or m's tokenizer.json with the tokenizer_config.json
 * beside it.  *out owned by the caller (tokenizer_free); 0, or -1 with a sentence. */
int prompt_open_tokenizer(const model_desc *m, tokenizer **out, char *err, size_t errlen);

/* m's chat template compiled (errors named "chat template line L, column C"); *out NULL when m has none.
 * 0, or -1 with a sentence. */
int prompt_open_template(const model_desc *m, tmpl_t **out, char *err, size_t errlen);

/* Sets the template's special-token globals into `extra` (a JSON object): bos_token and eos_token are the
 * tokenizer files' text where they decide (tokenizer_special_text: tokenizer_config.json, whatever
 * config.json says), else the piece of the model's bos/eos id (the tokenizer's when the model names none);
 * a key is left out when there is no such token. */
void prompt_special_tokens(const prompt_src *ps, json_t *extra);

/* The messages as the template is given them (a new array; NULL when out of memory), as vLLM hands an OpenAI
 * request to transformers: a content list of text parts becomes one string (the parts' text joined with
 * "\n"; refusal parts count as text), and a tool call's "arguments" JSON text becomes the object it holds
 * (templates print arguments with tojson or iterate them; text that is not a JSON object stays as it is), and
 * a null or missing content (an assistant turn of calls) becomes "" (vLLM's parser makes it an empty list of
 * parts).
 * Anything else is shared with `messages`, unchanged. */
json_t *prompt_template_messages(json_t *messages);

/* A chat prompt: renders messages (a JSON array) and tools (NULL: none) through ps->tmpl — messages as
 * prompt_template_messages gives them — with
 * prompt_special_tokens, add_generation_prompt and strftime_now's clock `now` (0: the current time), then
 * tokenizes without added specials.  *ids (malloc'd, *n ids) and, when text is not NULL, *text (malloc'd,
 * NUL-terminated, *text_len bytes) are the caller's.  0; PROMPT_ERR_TEMPLATE; or -1 with a sentence (no
 * template, the tokenizer failed, out of memory). */
int prompt_chat(const prompt_src *ps, json_t *messages, json_t *tools, bool add_generation_prompt, time_t now,
                char **text, size_t *text_len, int32_t **ids, size_t *n, char *err, size_t errlen);

/* Raw text to ids; add_special applies the post-processor (a BOS in front, …), as a completions prompt and
 * transformers' tokenizer(text) do.  *ids malloc'd (*n ids, non-NULL even when *n is 0).  0, or -1. */
int prompt_text(const prompt_src *ps, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                char *err, size_t errlen);

/* One /v1/completions prompt: a string, a one-string array (both tokenized with prompt_text, add_special),
 * or token ids as an array or a one-array array (taken as they are, each checked against the model's
 * vocabulary).  0, or -1 with a sentence ("prompt[3] is token id …"). */
int prompt_completion(const prompt_src *ps, json_t *prompt, int32_t **ids, size_t *n, char *err, size_t errlen);

#endif
