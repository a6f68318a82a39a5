/*
 * kv.h — the paged KV cache.
 *
 * Memory is one arena of fixed-size pages, each holding `page_tokens`
 * positions of keys and values for every layer and kv head; a row owns a page
 * table (page ids in position order), so rows of any length share the arena
 * without padding to a common length, and a finished row's pages go back to
 * the free list at once.  Page p of layer l is one block:
 *     K (K_heads, P, S) then V (K_heads, P, S), fp32
 * at arena + ((l * n_pages + p) * 2 * K_heads * P * S).  Keeping a layer's
 * pages together lets the streamed engine touch one layer's KV per step.
 * The CUDA engine keeps the same layout in HBM with bf16 values (KV_BF16,
 * its default: twice the rows per GB, half the bytes attention reads) or
 * int8 codes (KV_I8, --kv-dtype int8): a page block is then K codes
 * (K_heads, P, S) int8, V codes likewise, then one fp32 scale per key vector
 * (K_heads, P) and per value vector; value = code * scale, scale = amax/127
 * of the vector (symmetric, round to nearest even).  It owns that arena;
 * only the page bookkeeping here is shared.
 *
 * Shared prefixes (kv.c says how): pages are reference-counted, so rows
 * whose prompts start alike map the same full pages (a page is only shared
 * once every position in it is written, and nobody writes it again; a row
 * writes its own pages from its first unshared position on).  The prefix
 * index keys a full prompt page by a hash chain of its tokens (page i's key
 * covers pages 0..i, seeded by the LoRA adapter, whose weights change the
 * KV); a hit is confirmed token by token and by its parent page, so a
 * mapped prefix is equal, never merely hash-equal.  A page nobody maps but
 * the index still knows is "idle": it counts as free (n_free) and is taken
 * back, least recently released first, when the free list runs dry.
 */
#ifndef SPILL_KV_H
#define SPILL_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_index; /* kv.c: the prefix index over full prompt pages */

typedef struct kv_cache {
    int n_layers, n_kv_heads, head_dim, page_tokens; /* L, K, S, P */
    int32_t n_pages;
    int32_t n_free;     /* pages a reservation may take: the free list plus the idle indexed pages */
    int32_t *free_list; /* (n_pages) stack of free page ids (n_free - idle of them) */
    int32_t *ref;       /* (n_pages) rows mapping each page; 0 = free or idle */
    struct kv_index *ix;/* the prefix index, NULL when off (kv_prefix_enable) */
    float *arena;       /* (L, n_pages, 2, K, P, S); NULL when a device owns the pages */
    int dtype;          /* kv_dtype of the values: KV_F32 here (the zero value), KV_BF16 / KV_I8 in HBM */
} kv_cache;

typedef enum kv_dtype { KV_F32 = 0, KV_BF16 = 1, KV_I8 = 2 } kv_dtype;

typedef struct kv_row {
    int32_t *pages; /* (cap) page ids, position order */
    int32_t n_pages, cap;
    int32_t len;    /* positions written */
} kv_row;

/* Bytes one page takes (all layers), fp32 values. */
size_t kv_page_bytes(int n_layers, int n_kv_heads, int head_dim, int page_tokens);
/* The same for values of kv_dtype dtype (int8 pages include their scales). */
size_t kv_page_bytes_as(int n_layers, int n_kv_heads, int head_dim, int page_tokens, int dtype);
/* "fp32", "bf16", "int8". */
const char *kv_dtype_name(int dtype);

int kv_create(kv_cache *c, int n_layers, int n_kv_heads, int head_dim, int page_tokens, int32_t n_pages, char *err,
              size_t errlen);
void kv_destroy(kv_cache *c);

/* The page bookkeeping alone (free list, reference counts) for n_pages pages, for a backend that owns its arena
 * (the GPU's in HBM); kv_create calls it.  0, or -1 with a sentence.  kv_book_free undoes it (and the index). */
int kv_book_init(kv_cache *c, int32_t n_pages, char *err, size_t errlen);
void kv_book_free(kv_cache *c);

/* Makes row hold pages for `n_tokens` positions in total.  All or nothing:
 * returns -1 (nothing taken) when the free list is short, -2 on allocation
 * failure of the page table. */
int kv_row_reserve(kv_cache *c, kv_row *r, int32_t n_tokens);
/* Returns every page of the row to the free list and empties it (keeps the table allocation). */
void kv_row_release(kv_cache *c, kv_row *r);
void kv_row_free(kv_cache *c, kv_row *r);
/* Shrinks row r to its first n_tokens positions (a speculative pass's rejected positions rolled back): the pages
 * past kv_pages_for(n_tokens) are dropped through the same count kv_row_release uses (a page another row still
 * maps keeps its count less one; an indexed one goes idle; only a page nobody maps or indexes is freed) and
 * r->len becomes at most n_tokens.  The page that holds position n_tokens, when kept, is written again by the
 * row, so it must be the row's own: 0, or -1 (nothing changed) when it is shared (count > 1) or indexed. */
int kv_row_truncate(kv_cache *c, kv_row *r, int32_t n_tokens);
/* Makes dst a copy of the first n_tokens positions of src: the pages dst already holds (mapped from src by
 * kv_row_map) are kept, the rest are fresh pages whose contents are copied (the prompt KV shared by a row's n
 * choices: the full pages mapped, the partial last one copied).  Same returns as kv_row_reserve. */
int kv_row_copy(kv_cache *c, kv_row *dst, const kv_row *src, int32_t n_tokens);

/* Makes the empty dst map src's first n_pages pages (each page's count goes up; n_pages * P positions become
 * dst's, dst->len = n_pages * P).  Pages must be full: nobody writes a mapped page again.  0, -2 (page table). */
int kv_row_map(kv_cache *c, kv_row *dst, const kv_row *src, int32_t n_pages);

/* ---------------------------------------------------------------- the prefix index */

/* A row's walk along the index: how many of its pages are known to it (mapped from or inserted into the index),
 * and the chain key and indexed page of the last one (the parent of the next). */
typedef struct kv_chain {
    int32_t pages;      /* pages 0..pages-1 of the row are indexed (its own or an equal page it could map) */
    uint64_t key;       /* chain key of page pages-1 (the adapter's seed key when pages == 0) */
    int32_t parent;     /* the indexed page equal to page pages-1, -1 when pages == 0 */
    uint32_t parent_gen;
} kv_chain;

/* Turns the index on (once, on a cache with no row yet).  0, or -1 with a sentence (out of memory). */
int kv_prefix_enable(kv_cache *c, char *err, size_t errlen);
/* A fresh walk for a row of adapter `adapter` (0 = the bare base). */
kv_chain kv_chain_start(int32_t adapter);
/* The chain key of a page of tokens t[0, P) after the page whose key is prev (kv_chain_start's key first). */
uint64_t kv_chain_key(uint64_t prev, const int32_t *t, int32_t P);
/* The longest prefix of tokens[0, max_pages * P) in the index, as pages: fills pages[0..) with the indexed
 * pages in order and returns how many (0 when the index is off); *ch is left at the last one, ready for
 * kv_prefix_insert to go on.  Idle pages among them are counted in *idle (they stop being free once mapped). */
int32_t kv_prefix_find(const kv_cache *c, kv_chain *ch, const int32_t *tokens, int32_t max_pages, int32_t *pages,
                       int32_t *idle);
/* Maps pages[0..n) (from kv_prefix_find, the same cache state) as the empty row r's first pages: r->len = n * P. */
int kv_prefix_map(kv_cache *c, kv_row *r, const int32_t *pages, int32_t n);
/* Row r has written its pages up to position `written` of its prompt `tokens` (n_tokens long): every full page
 * past ch->pages goes into the index (a page equal to one already indexed stays the row's own and the chain goes
 * on through the indexed one).  Nothing when the index is off. */
void kv_prefix_insert(kv_cache *c, kv_chain *ch, const kv_row *r, const int32_t *tokens, int32_t written);

/* Counters of the index: pages indexed now, idle pages, and pages evicted (idle pages taken back). */
void kv_prefix_stats(const kv_cache *c, int32_t *indexed, int32_t *idle, uint64_t *evicted);

/* Debug check: rows[0..n) are every row holding pages; each page's count must equal the rows mapping it, free
 * and idle pages none, and the free count must add up.  0, or -1 with a sentence naming the first wrong page. */
int kv_check(const kv_cache *c, const kv_row *const *rows, size_t n, char *err, size_t errlen);

/* Pages needed for n_tokens positions. */
static inline int32_t kv_pages_for(const kv_cache *c, int32_t n_tokens)
{
    return (n_tokens + c->page_tokens - 1) / c->page_tokens;
}

/* Key / value vector of (layer, kv head, position) in row r (position < pages*P). */
static inline float *kv_key(const kv_cache *c, const kv_row *r, int layer, int head, int32_t pos)
{
    size_t P = (size_t)c->page_tokens, S = (size_t)c->head_dim, K = (size_t)c->n_kv_heads;
    size_t page = (size_t)r->pages[pos / c->page_tokens];
    size_t blk = ((size_t)layer * (size_t)c->n_pages + page) * 2 * K * P * S;
    return c->arena + blk + ((size_t)head * P + (size_t)(pos % c->page_tokens)) * S;
}
static inline float *kv_value(const kv_cache *c, const kv_row *r, int layer, int head, int32_t pos)
{
    size_t P = (size_t)c->page_tokens, S = (size_t)c->head_dim, K = (size_t)c->n_kv_heads;
    return kv_key(c, r, layer, head, pos) + K * P * S;
}

#endif
