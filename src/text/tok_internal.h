/*
 * tok_internal.h — the tokenizer's internal types, shared by tokenizer.c
 * (construction, encode, decode), tok_pipeline.c (regexes, normalizers,
 * pre-tokenizers, decoders, added-token trie), tok_gguf.c (GGUF
 * vocabularies) and tok_config.c (the special tokens' text beside a
 * tokenizer.json).  Not a public interface: only those files include it.
 */
#ifndef SPILL_TOK_INTERNAL_H
#define SPILL_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bpe.h"
#include "tokenizer.h"
#include "../base/util.h"

#define MAX_NODE_DEPTH 32
/* Largest id + 1 we accept (4M); real vocabularies stop near 262,144. */
#define MAX_IDS ((int64_t)1 << 22)

/* Growable byte string, kept NUL-terminated after every append. */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static inline int sb_reserve(sbuf *b, size_t extra)
{
    size_t need;
    if (!ck_add_size(b->n, extra + 1, &need))
        return -1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}


static inline int sb_add(sbuf *b, const void *s, size_t len)
{
    if (sb_reserve(b, len) != 0)
        return -1;
    if (len)
        memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
    return 0;
}


static inline int sb_cp(sbuf *b, uint32_t cp)
{
    char tmp[4];
    size_t n = (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)tmp);
    return sb_add(b, tmp, n);
}


/* Decodes one code point of valid UTF-8 at s (len > 0 bytes left); returns its byte length. */
static inline size_t u8dec(const char *s, size_t len, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80 || len < 2) {
        *cp = u[0];
        return 1;
    }
    if ((u[0] >> 5) == 6) {
        *cp = (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
        return 2;
    }
    if ((u[0] >> 4) == 14 && len >= 3) {
        *cp = (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
        return 3;
    }
    if (len >= 4) {
        *cp = (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 |
              (u[3] & 0x3F);
        return 4;
    }
    *cp = u[0];
    return 1;
}


typedef struct {
    pcre2_code *code;
    char *literal; /* a String pattern: matched literally (no regex) */
    size_t literal_len;
} pattern;

/* Per-call regex scratch (one per encode/decode, so a tokenizer is shared
 * read-only between threads): a match context with limits, created on first
 * use, and a large JIT stack only if the default one runs out. */
typedef struct {
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    pcre2_match_data *md;
} rx_ctx;

enum {
    /* normalizers */
    NZ_SEQ = 1, NZ_NFC, NZ_NFD, NZ_NFKC, NZ_NFKD, NZ_LOWER, NZ_STRIP, NZ_PREPEND, NZ_REPLACE,
    /* pre-tokenizers */
    PT_SEQ, PT_BYTELEVEL, PT_SPLIT, PT_DIGITS, PT_METASPACE, PT_WHITESPACE, PT_WSSPLIT, PT_PUNCT,
    /* decoders */
    DC_SEQ, DC_BYTELEVEL, DC_BYTEFALLBACK, DC_FUSE, DC_STRIP, DC_REPLACE, DC_METASPACE, DC_BPE,
};

enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { PS_ALWAYS, PS_FIRST, PS_NEVER };

typedef struct node {
    int kind;
    struct node *kids;
    size_t n_kids;
    pattern pat;     /* Split, Replace, ByteLevel(use_regex), Whitespace… */
    bool has_pat;
    char *str;       /* Prepend text, Replace content, Metaspace replacement, BPE suffix */
    size_t str_len;
    uint32_t cp;     /* Metaspace replacement / Strip content character */
    int behavior, scheme;
    bool invert, flag_a, flag_b; /* ByteLevel: add_prefix_space, use_regex; Digits: individual; Strip: left, right; Metaspace: split */
    size_t start, stop;          /* Strip decoder counts */
} node;

typedef struct {
    char *content;
    size_t len;
    char *norm; /* content after the normalizer (normalized tokens only) */
    size_t norm_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} added_token;

/* Byte trie for leftmost-longest added-token matching; edges in a pairmap
 * keyed (node, byte), terminal[node] = added-token index or -1. */
typedef struct {
    pairmap edges;
    int32_t *terminal;
    size_t n_nodes, cap_nodes;
    uint8_t first[256]; /* 1 = some token starts with this byte */
} trie;

/* A piece of the text between pipeline stages: bytes at text.p + off. */
typedef struct {
    size_t off, len;
    int32_t token; /* >= 0: an added token, already final */
    bool at_start; /* starts at byte 0 of the original input */
} piece;

typedef struct {
    sbuf text;
    piece *v;
    size_t n, cap;
} plist;

#define PSTR(l, i) ((l)->text.p + (l)->v[i].off)

typedef struct {
    sbuf *v; /* (n) token strings */
    size_t n, cap;
} slist;

struct tokenizer {
    char name[128];
    bpe model;
    size_t n_ids;
    char **id_str;        /* (n_ids) what decode sees per id: the vocabulary piece, or the added
                           * token's content (normalized form if normalized); NULL = no token */
    uint32_t *id_len;     /* (n_ids) */
    uint8_t **id_bytes;   /* (n_ids) raw bytes of each token, built at load */
    uint32_t *id_bytes_len;
    uint8_t *id_special;  /* (n_ids) 1 = special added token */
    added_token *added;
    size_t n_added;
    strmap added_map;     /* content -> id */
    trie trie_raw, trie_norm;
    node *normalizer, *pretok, *decoder;
    int32_t *post_pre, *post_post; /* ids around the sequence when add_special */
    size_t n_post_pre, n_post_post;
    int32_t special[TOK_SPECIAL_COUNT];
    /* The special tokens' text from the files beside a tokenizer.json (tok_config.c); known false: nothing
     * read (GGUF, in-memory images).  Only TOK_BOS and TOK_EOS are read; NULL = the files name none. */
    bool special_text_known;
    char *special_text[TOK_SPECIAL_COUNT];
    size_t special_text_len[TOK_SPECIAL_COUNT];
};

/* ---- tok_pipeline.c --------------------------------------------------- */
extern uint32_t tk_byte_to_cp[256];
extern int16_t tk_cp_to_byte[0x144];
void tk_byte_table_init(void);
int tk_sb_add_lossy(sbuf *b, const char *s, size_t len);
bool tk_is_ws(uint32_t c);
bool tk_is_word(uint32_t c);
int tk_pattern_compile(pattern *pt, const char *src, size_t len, bool regex, const char *where, char *err,
                       size_t errlen);
void tk_pattern_free(pattern *pt);
/* Cheap: the PCRE2 match context is created on the first regex match. */
void tk_rx_ctx_init(rx_ctx *c);
void tk_rx_ctx_free(rx_ctx *c);
void tk_node_free(node *n);
int tk_trie_init(trie *t);
int tk_trie_add(trie *t, const char *s, size_t len, int32_t idx);
int32_t tk_trie_longest(const trie *t, const char *s, size_t len, size_t i, size_t *end);
void tk_trie_free(trie *t);
int tk_pl_add(plist *l, const char *s, size_t len, int32_t token, bool at_start);
void tk_pl_free(plist *l);
int tk_sl_push(slist *l, const char *s, size_t len);
void tk_sl_free(slist *l);
/* Normalizes s in place. */
int tk_nz_apply(const node *n, rx_ctx *rc, sbuf *s, char *err, size_t errlen);
/* Pre-tokenizes the pieces of cur in place (tmp: scratch of the same kind). */
int tk_pt_apply(const node *n, rx_ctx *rc, plist *cur, plist *tmp, char *err, size_t errlen);
/* Decodes the token strings of l in place; raw = the bytes a token stands for
 * (no UTF-8 repair, no Strip, no first-token rule). */
int tk_dc_apply(const node *n, rx_ctx *rc, slist *l, bool raw, char *err, size_t errlen);
extern const char TK_GPT2_SPLIT[], TK_LLAMA3_SPLIT[], TK_QWEN2_SPLIT[], TK_TEKKEN_SPLIT[], TK_GPT4O_SPLIT[],
    TK_WHITESPACE_SPLIT[], TK_WS_CLASS[], TK_PUNCT_CLASS[];

/* ---- tok_config.c ----------------------------------------------------- */
/* Reads the bos/eos text from tokenizer_config.json / special_tokens_map.json beside the tokenizer.json at
 * path (files that do not exist name none); 0, or -1 with a sentence for a file that is not a JSON object or a
 * value of the wrong type. */
int tk_config_load(tokenizer *t, const char *tokenizer_json, char *err, size_t errlen);

/* ---- tokenizer.c: construction helpers shared with tok_gguf.c --------- */
char *tk_dupn(const char *s, size_t n);
int tk_alloc(tokenizer **out, const char *name);
int tk_ids_alloc(tokenizer *t, size_t n);
int tk_vocab_set(tokenizer *t, const char *s, size_t len, int32_t id);
void tk_vocab_drop_shadowed(tokenizer *t);
int tk_added_add(tokenizer *t, const char *s, size_t len, int32_t id, bool special, bool lstrip, bool rstrip,
                 bool single_word, bool normalized);
int tk_post_push(int32_t **v, size_t *n, int32_t id);
int tk_node_set_regex(node *n, const char *rx, const char *where, char *err, size_t errlen);
/* Byte tokens, added-token tries, token bytes, default special ids. */
int tk_finish_load(tokenizer *t, char *err, size_t errlen);

#endif
