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
 */
#ifndef SPILL_KV_H
#define SPILL_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_cache {
    int n_layers, n_kv_heads, head_dim, page_tokens; /* L, K, S, P */
    int32_t n_pages;
    int32_t n_free;
    int32_t *free_list; /* (n_pages) stack of free page ids */
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

/* Makes row hold pages for `n_tokens` positions in total.  All or nothing:
 * returns -1 (nothing taken) when the free list is short, -2 on allocation
 * failure of the page table. */
int kv_row_reserve(kv_cache *c, kv_row *r, int32_t n_tokens);
/* Returns every page of the row to the free list and empties it (keeps the table allocation). */
void kv_row_release(kv_cache *c, kv_row *r);
void kv_row_free(kv_cache *c, kv_row *r);
/* Makes dst (empty) a copy of the first n_tokens positions of src, in fresh pages
 * (the prompt KV shared by a row's n choices).  Same returns as kv_row_reserve. */
int kv_row_copy(kv_cache *c, kv_row *dst, const kv_row *src, int32_t n_tokens);

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
