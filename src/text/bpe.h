/*
 * bpe.h — the BPE model of the tokenizer (bpe.c) and the two hash maps it
 * needs, which the tokenizer's other files use too (vocabulary and added-token
 * maps).  Not a public interface: bpe.c and tok_internal.h include it, so the
 * tokenizer's files (tokenizer.c, tok_pipeline.c, tok_gguf.c, tok_config.c)
 * see it; nothing outside src/text/ does.
 */
#ifndef SPILL_BPE_H
#define SPILL_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Open-addressing map from a byte string to an int32.  Keys are not copied:
 * they must outlive the map (they live in the tokenizer's string arena). */
typedef struct {
    const char *s;
    uint32_t len;
    uint32_t hash;
    int32_t val;
} strmap_slot;

typedef struct {
    strmap_slot *slots; /* (cap) — s == NULL marks an empty slot */
    size_t cap, n;
} strmap;

int tk_strmap_init(strmap *m, size_t expected);
int32_t tk_strmap_get(const strmap *m, const char *s, size_t len); /* -1 when absent */
int tk_strmap_put(strmap *m, const char *s, size_t len, int32_t val); /* overwrites; -1 on OOM */
void tk_strmap_free(strmap *m);

/* Merge table: (left id, right id) -> (rank, merged id). */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX marks an empty slot */
    uint32_t rank;
    int32_t new_id;
} pairmap_slot;

typedef struct {
    pairmap_slot *slots;
    size_t cap, n;
} pairmap;

int tk_pairmap_init(pairmap *m, size_t expected);
const pairmap_slot *tk_pairmap_get(const pairmap *m, int32_t a, int32_t b);
int tk_pairmap_put(pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id); /* overwrites */
void tk_pairmap_free(pairmap *m);

/* Growable id vector. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

int tk_ivec_push(ivec *a, int32_t x);

typedef struct bpe {
    strmap vocab;          /* model vocabulary: piece -> id */
    pairmap merges;
    int32_t unk_id;        /* -1 when the model has no unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix;          /* continuing_subword_prefix or NULL */
    char *suffix;          /* end_of_word_suffix or NULL */
    int32_t byte_id[256];  /* id of "<0xXX>" or -1 */
} bpe;

/* Appends the ids of one pre-token (UTF-8, len bytes) to out.  O(n log n) in
 * the number of characters: a heap of candidate merges over a linked list of
 * symbols, the algorithm of tokenizers' Word::merge_all.  -1 on OOM only. */
int bpe_encode(const bpe *m, const char *s, size_t len, ivec *out);

void bpe_free(bpe *m);

#endif
