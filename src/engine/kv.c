/*
 * kv.c — paged KV cache (see kv.h for the layout).  Owns page allocation
 * only; what goes into a page is the forward pass's business.
 */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

size_t kv_page_bytes_as(int n_layers, int n_kv_heads, int head_dim, int page_tokens, int dtype)
{
    size_t vec = dtype == KV_I8 ? (size_t)head_dim + sizeof(float) : (size_t)head_dim * (dtype == KV_BF16 ? 2 : 4);
    return (size_t)n_layers * 2 * (size_t)n_kv_heads * (size_t)page_tokens * vec;
}

size_t kv_page_bytes(int n_layers, int n_kv_heads, int head_dim, int page_tokens)
{
    return kv_page_bytes_as(n_layers, n_kv_heads, head_dim, page_tokens, KV_F32);
}

const char *kv_dtype_name(int dtype)
{
    return dtype == KV_I8 ? "int8" : dtype == KV_BF16 ? "bf16" : "fp32";
}

int kv_create(kv_cache *c, int n_layers, int n_kv_heads, int head_dim, int page_tokens, int32_t n_pages, char *err,
              size_t errlen)
{
    memset(c, 0, sizeof *c);
    size_t page = kv_page_bytes(n_layers, n_kv_heads, head_dim, page_tokens), total;
    if (n_pages <= 0 || page_tokens <= 0 || !ck_mul_size(page, (size_t)n_pages, &total))
        return util_errf(err, errlen, "KV cache of %d pages of %d tokens cannot be sized.", n_pages, page_tokens);
    c->arena = aligned_alloc(64, (total + 63) / 64 * 64);
    c->free_list = malloc((size_t)n_pages * sizeof *c->free_list);
    if (!c->arena || !c->free_list) {
        kv_destroy(c);
        return util_errf(err, errlen, "out of memory allocating a %zu-byte KV cache; lower the batch or --mem-budget.",
                         total);
    }
    c->n_layers = n_layers;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    c->page_tokens = page_tokens;
    c->n_pages = n_pages;
    c->dtype = KV_F32;
    /* Stack with page 0 on top so allocation order is deterministic. */
    for (int32_t i = 0; i < n_pages; i++)
        c->free_list[i] = n_pages - 1 - i;
    c->n_free = n_pages;
    return 0;
}

void kv_destroy(kv_cache *c)
{
    free(c->arena);
    free(c->free_list);
    memset(c, 0, sizeof *c);
}

int kv_row_reserve(kv_cache *c, kv_row *r, int32_t n_tokens)
{
    int32_t need = kv_pages_for(c, n_tokens) - r->n_pages;
    if (need <= 0)
        return 0;
    if (need > c->n_free)
        return -1;
    if (r->n_pages + need > r->cap) {
        int32_t cap = r->cap ? r->cap : 8;
        while (cap < r->n_pages + need)
            cap *= 2;
        int32_t *p = realloc(r->pages, (size_t)cap * sizeof *p);
        if (!p)
            return -2;
        r->pages = p;
        r->cap = cap;
    }
    for (int32_t i = 0; i < need; i++)
        r->pages[r->n_pages++] = c->free_list[--c->n_free];
    return 0;
}

void kv_row_release(kv_cache *c, kv_row *r)
{
    /* Push back in reverse so a release followed by a reserve reuses the same pages. */
    for (int32_t i = r->n_pages - 1; i >= 0; i--)
        c->free_list[c->n_free++] = r->pages[i];
    r->n_pages = 0;
    r->len = 0;
}

void kv_row_free(kv_cache *c, kv_row *r)
{
    kv_row_release(c, r);
    free(r->pages);
    memset(r, 0, sizeof *r);
}

int kv_row_copy(kv_cache *c, kv_row *dst, const kv_row *src, int32_t n_tokens)
{
    int rc = kv_row_reserve(c, dst, n_tokens);
    if (rc)
        return rc;
    size_t blk = 2 * (size_t)c->n_kv_heads * (size_t)c->page_tokens * (size_t)c->head_dim;
    int32_t pages = kv_pages_for(c, n_tokens);
    for (int l = 0; l < c->n_layers; l++)
        for (int32_t i = 0; i < pages; i++)
            memcpy(c->arena + ((size_t)l * (size_t)c->n_pages + (size_t)dst->pages[i]) * blk,
                   c->arena + ((size_t)l * (size_t)c->n_pages + (size_t)src->pages[i]) * blk, blk * sizeof(float));
    dst->len = n_tokens;
    return 0;
}
