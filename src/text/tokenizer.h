/*
 * tokenizer.h — text <-> token ids, identical to Hugging Face `tokenizers`.
 *
 * One opaque `tokenizer` is built either from a tokenizer.json (HF format) or
 * from the vocabulary embedded in a GGUF file (rebuilt the way transformers'
 * GGUF converter rebuilds it, see tokenizer.c).  After construction it is
 * immutable, so encode/decode may run from several threads at once; a
 * `tok_stream` is the one mutable per-sequence object (incremental decode).
 *
 * Text handed to tokenizer_encode is bytes; invalid UTF-8 is replaced, one
 * U+FFFD per maximal invalid subpart (what Python's bytes.decode('utf-8',
 * 'replace') and Rust's from_utf8_lossy both do), before anything else.
 *
 * decode() equals `Tokenizer.decode(ids, skip_special_tokens)` of the backend
 * tokenizer; transformers' clean_up_tokenization_spaces post-pass is NOT
 * applied (both reference models ship it false, and an incremental decoder
 * cannot apply it consistently).
 */
#ifndef SPILL_TOKENIZER_H
#define SPILL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../model/gguf.h"

typedef struct tokenizer tokenizer;

/* Largest tokenizer.json accepted (Gemma 3's is 33 MB). */
#define TOKENIZER_JSON_MAX ((size_t)256 << 20)

/* Loads a tokenizer.json file, and the bos/eos text of the tokenizer_config.json (or special_tokens_map.json)
 * beside it, as transformers' AutoTokenizer does (tokenizer_special_text).  On failure *out is NULL and err
 * holds one sentence. */
int tokenizer_from_json_file(const char *path, tokenizer **out, char *err, size_t errlen);

/* Parses a tokenizer.json image of len bytes (need not be NUL-terminated);
 * `name` is used in error messages. */
int tokenizer_from_json(const char *buf, size_t len, const char *name, tokenizer **out, char *err, size_t errlen);

/* Builds the tokenizer described by a GGUF file's tokenizer.ggml.* keys:
 * model `gpt2` (byte-level BPE, `pre` selects the split regex) or `llama`
 * (SentencePiece vocabulary turned into BPE with byte fallback, merges derived
 * from the scores, or from token order for Gemma).  The gguf_file may be
 * closed afterwards: everything needed is copied. */
int tokenizer_from_gguf(const gguf_file *f, tokenizer **out, char *err, size_t errlen);

/* Safe on NULL. */
void tokenizer_free(tokenizer *tok);

/* Encodes len bytes of text.  add_special applies the post-processor (e.g. a
 * BOS in front); chat prompts rendered from a template want false.  On success
 * *ids is a malloc'd array of *n ids (caller frees; non-NULL even when *n == 0). */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                     char *err, size_t errlen);

/* Decodes n ids to a malloc'd NUL-terminated UTF-8 string (*out, *out_len bytes).
 * Ids outside the vocabulary are skipped, as the reference does. */
int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, char **out,
                     size_t *out_len, char *err, size_t errlen);

/* Number of ids (largest id + 1). */
size_t tokenizer_vocab_size(const tokenizer *tok);

/* The token's string as stored in the vocabulary ("Ġthe", "▁the", "<0x0A>"),
 * NUL-terminated, owned by tok; NULL for an unknown id. */
const char *tokenizer_piece(const tokenizer *tok, int32_t id, size_t *len);

/* The raw bytes a token stands for (" the", "\n"), owned by tok; NULL for an
 * unknown id.  May be an incomplete UTF-8 sequence (byte tokens). */
const uint8_t *tokenizer_token_bytes(const tokenizer *tok, int32_t id, size_t *len);

/* Exact lookup of a token's string (added tokens first, then the model
 * vocabulary); -1 when absent.  Used to resolve "<|im_end|>" for the stop set. */
int32_t tokenizer_token_id(const tokenizer *tok, const char *s, size_t len);

/* True for added tokens marked special (what skip_special drops). */
bool tokenizer_is_special(const tokenizer *tok, int32_t id);

typedef enum { TOK_BOS, TOK_EOS, TOK_EOT, TOK_EOM, TOK_UNK, TOK_PAD, TOK_SPECIAL_COUNT } tok_special;

/* Special ids, -1 when unknown.  GGUF files state them; for tokenizer.json
 * the caller sets them from tokenizer_config.json with tokenizer_set_special
 * (defaults: bos = the first special token of the post-processor, unk = the
 * BPE unk_token, eot = the first present of <|eot_id|>, <|im_end|>,
 * <end_of_turn>, <|end|>, eom = <|eom_id|>). */
int32_t tokenizer_special(const tokenizer *tok, tok_special which);
void tokenizer_set_special(tokenizer *tok, tok_special which, int32_t id);

/* The text a chat template sees as bos_token (TOK_BOS) or eos_token (TOK_EOS): tokenizer_config.json's
 * (special_tokens_map.json's when the config has no added_tokens_decoder) beside a tokenizer.json file, the
 * strings transformers renders.  Returns true when those files decide, with *text NULL when they name none
 * (transformers then leaves the template's bos_token undefined); false when nothing was read (GGUF
 * vocabularies, tokenizer_from_json images, other `which`): the caller falls back on the special id's piece.
 * *text is NUL-terminated, *len bytes, owned by tok. */
bool tokenizer_special_text(const tokenizer *tok, tok_special which, const char **text, size_t *len);

/* Incremental detokenization: push ids one at a time and get back only text
 * that can no longer change (never a split UTF-8 sequence or a trailing
 * U+FFFD that the next byte token could complete).  The concatenation of all
 * pushes plus the flush equals tokenizer_decode of all ids. */
typedef struct tok_stream tok_stream;

int tok_stream_init(const tokenizer *tok, bool skip_special, tok_stream **out, char *err, size_t errlen);
/* Appends id; *text (malloc'd, NUL-terminated, caller frees) gets the new
 * text, possibly empty (*text_len == 0). */
int tok_stream_push(tok_stream *s, int32_t id, char **text, size_t *text_len, char *err, size_t errlen);
/* Emits whatever is held back (incomplete bytes become U+FFFD). */
int tok_stream_flush(tok_stream *s, char **text, size_t *text_len, char *err, size_t errlen);
void tok_stream_free(tok_stream *s);

#endif
