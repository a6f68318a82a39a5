/*
 * kv.c — paged KV cache (see kv.h for the layout).  Owns page allocation,
 * reference counts and the prefix index; what goes into a page is the
 * forward pass's business.
 *
 * A page is in exactly one of three states: mapped (ref > 0: one or more
 * rows hold it in their page tables), free (on the free list), or idle
 * (ref 0 but indexed: its prompt KV may be mapped again by the next row with
 * that prefix).  Free and idle pages both count in n_free, because either can
 * be handed out; a reservation takes the free list first and then the idle
 * page released longest ago, which leaves the index first.
 *
 * The prefix index is a hash table (chained through per-page links) over
 * indexed pages.  Page i's key is chain(key of page i-1, its P tokens), the
 * chain seeded by the adapter id.  A lookup of page i accepts an entry only
 * when its key, its tokens and its parent (the page matched for i-1, with
 * that page's generation) all agree, so the whole prefix is equal by
 * induction and a 64-bit collision can never map a wrong page.  A page that
 * leaves the index bumps its generation, which orphans its children: they are
 * never found again and leave as idle pages do.
 *
 * Left out on purpose: indexing generated tokens (multi-turn reuse) and
 * partial pages — a row writes its own pages from its first unshared
 * position, so no page ever needs copy-on-write.
 */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

struct kv_index {
    int32_t P;
    uint64_t *key;        /* (n_pages) chain key of an indexed page */
    int32_t *parent;      /* (n_pages) the indexed page before it in its prefix, -1 for a first page */
    uint32_t *parent_gen; /* (n_pages) that parent's generation when this page was indexed */
    uint32_t *gen;        /* (n_pages) bumped each time a page leaves the index */
    uint8_t *indexed;     /* (n_pages) */
    int32_t *tokens;      /* (n_pages, P) the tokens an indexed page holds */
    int32_t *hnext;       /* (n_pages) next page in the same bucket, -1 at the end */
    int32_t *bucket;      /* (mask + 1) first page of each bucket, -1 when empty */
    uint64_t mask;
    int32_t *lru_prev, *lru_next; /* (n_pages) the idle pages, released longest ago first */
    int32_t lru_head, lru_tail;
    int32_t n_indexed, n_idle;
    uint64_t evicted;
};

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

int kv_book_init(kv_cache *c, int32_t n_pages, char *err, size_t errlen)
{
    c->n_pages = n_pages;
    c->free_list = malloc((size_t)n_pages * sizeof *c->free_list);
    c->ref = calloc((size_t)n_pages, sizeof *c->ref);
    c->ix = NULL;
    if (!c->free_list || !c->ref) {
        kv_book_free(c);
        return util_errf(err, errlen, "out of memory for the bookkeeping of %d KV pages.", n_pages);
    }
    /* Stack with page 0 on top so allocation order is deterministic. */
    for (int32_t i = 0; i < n_pages; i++)
        c->free_list[i] = n_pages - 1 - i;
    c->n_free = n_pages;
    return 0;
}

static void index_free(struct kv_index *x)
{
    if (!x)
        return;
    free(x->key);
    free(x->parent);
    free(x->parent_gen);
    free(x->gen);
    free(x->indexed);
    free(x->tokens);
    free(x->hnext);
    free(x->bucket);
    free(x->lru_prev);
    free(x->lru_next);
    free(x);
}

void kv_book_free(kv_cache *c)
{
    free(c->free_list);
    free(c->ref);
    index_free(c->ix);
    c->free_list = NULL;
    c->ref = NULL;
    c->ix = NULL;
}

int kv_create(kv_cache *c, int n_layers, int n_kv_heads, int head_dim, int page_tokens, int32_t n_pages, char *err,
              size_t errlen)
{
    memset(c, 0, sizeof *c);
    size_t page = kv_page_bytes(n_layers, n_kv_heads, head_dim, page_tokens), total;
    if (n_pages <= 0 || page_tokens <= 0 || !ck_mul_size(page, (size_t)n_pages, &total))
        return util_errf(err, errlen, "KV cache of %d pages of %d tokens cannot be sized.", n_pages, page_tokens);
    c->arena = aligned_alloc(64, (total + 63) / 64 * 64);
    if (!c->arena)
        return util_errf(err, errlen, "out of memory allocating a %zu-byte KV cache; lower the batch or --mem-budget.",
                         total);
    if (kv_book_init(c, n_pages, err, errlen)) {
        kv_destroy(c);
        return -1;
    }
    c->n_layers = n_layers;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    c->page_tokens = page_tokens;
    c->dtype = KV_F32;
    return 0;
}

void kv_destroy(kv_cache *c)
{
    free(c->arena);
    kv_book_free(c);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- idle pages and the index's table */

static void lru_remove(struct kv_index *x, int32_t p)
{
    int32_t a = x->lru_prev[p], b = x->lru_next[p];
    if (a >= 0)
        x->lru_next[a] = b;
    else
        x->lru_head = b;
    if (b >= 0)
        x->lru_prev[b] = a;
    else
        x->lru_tail = a;
    x->n_idle--;
}

static void lru_append(struct kv_index *x, int32_t p)
{
    x->lru_prev[p] = x->lru_tail;
    x->lru_next[p] = -1;
    if (x->lru_tail >= 0)
        x->lru_next[x->lru_tail] = p;
    else
        x->lru_head = p;
    x->lru_tail = p;
    x->n_idle++;
}

/* Takes page p out of the index (it must be indexed); its children are orphaned by the new generation. */
static void unindex(struct kv_index *x, int32_t p)
{
    int32_t *link = &x->bucket[x->key[p] & x->mask];
    while (*link != p)
        link = &x->hnext[*link];
    *link = x->hnext[p];
    x->indexed[p] = 0;
    x->gen[p]++;
    x->n_indexed--;
}

static int32_t list_len(const kv_cache *c) { return c->n_free - (c->ix ? c->ix->n_idle : 0); }

/* One page for a reservation (n_free > 0): the free list's top, else the idle page released longest ago. */
static int32_t take_page(kv_cache *c)
{
    int32_t n = list_len(c), p;
    if (n > 0)
        p = c->free_list[n - 1];
    else {
        struct kv_index *x = c->ix;
        p = x->lru_head;
        lru_remove(x, p);
        unindex(x, p);
        x->evicted++;
    }
    c->n_free--;
    c->ref[p] = 1;
    return p;
}

/* Drops one mapping of page p; the last one makes it idle (indexed) or free. */
static void put_page(kv_cache *c, int32_t p)
{
    if (--c->ref[p] > 0)
        return;
    if (c->ix && c->ix->indexed[p])
        lru_append(c->ix, p);
    else
        c->free_list[list_len(c)] = p;
    c->n_free++;
}

/* ---------------------------------------------------------------- rows */

/* Room for `want` page ids in r's table.  0, or -2 on allocation failure. */
static int table_room(kv_row *r, int32_t want)
{
    if (want <= r->cap)
        return 0;
    int32_t cap = r->cap ? r->cap : 8;
    while (cap < want)
        cap *= 2;
    int32_t *p = realloc(r->pages, (size_t)cap * sizeof *p);
    if (!p)
        return -2;
    r->pages = p;
    r->cap = cap;
    return 0;
}

int kv_row_reserve(kv_cache *c, kv_row *r, int32_t n_tokens)
{
    int32_t need = kv_pages_for(c, n_tokens) - r->n_pages;
    if (need <= 0)
        return 0;
    if (need > c->n_free)
        return -1;
    if (table_room(r, r->n_pages + need))
        return -2;
    for (int32_t i = 0; i < need; i++)
        r->pages[r->n_pages++] = take_page(c);
    return 0;
}

void kv_row_release(kv_cache *c, kv_row *r)
{
    /* Back in reverse so a release followed by a reserve reuses the same pages, and so a prefix's last pages go
     * idle before its first ones (they leave the index first: a prefix shrinks from its end). */
    for (int32_t i = r->n_pages - 1; i >= 0; i--)
        put_page(c, r->pages[i]);
    r->n_pages = 0;
    r->len = 0;
}

int kv_row_truncate(kv_cache *c, kv_row *r, int32_t n_tokens)
{
    int32_t keep = kv_pages_for(c, n_tokens < 0 ? 0 : n_tokens);
    if (keep >= r->n_pages) {
        if (r->len > n_tokens)
            r->len = n_tokens;
        return 0;
    }
    if (n_tokens % c->page_tokens) { /* the row writes on into its kept last page: never a shared one */
        int32_t p = r->pages[keep - 1];
        if (c->ref[p] > 1 || (c->ix && c->ix->indexed[p]))
            return -1;
    }
    for (int32_t i = r->n_pages - 1; i >= keep; i--) /* from the end, as kv_row_release */
        put_page(c, r->pages[i]);
    r->n_pages = keep;
    if (r->len > n_tokens)
        r->len = n_tokens;
    return 0;
}

void kv_row_free(kv_cache *c, kv_row *r)
{
    kv_row_release(c, r);
    free(r->pages);
    memset(r, 0, sizeof *r);
}

int kv_row_copy(kv_cache *c, kv_row *dst, const kv_row *src, int32_t n_tokens)
{
    int32_t have = dst->n_pages; /* mapped from src already: the same pages, nothing to copy */
    int rc = kv_row_reserve(c, dst, n_tokens);
    if (rc)
        return rc;
    size_t blk = 2 * (size_t)c->n_kv_heads * (size_t)c->page_tokens * (size_t)c->head_dim;
    int32_t pages = kv_pages_for(c, n_tokens);
    for (int l = 0; l < c->n_layers; l++)
        for (int32_t i = have; i < pages; i++)
            memcpy(c->arena + ((size_t)l * (size_t)c->n_pages + (size_t)dst->pages[i]) * blk,
                   c->arena + ((size_t)l * (size_t)c->n_pages + (size_t)src->pages[i]) * blk, blk * sizeof(float));
    dst->len = n_tokens;
    return 0;
}

int kv_row_map(kv_cache *c, kv_row *dst, const kv_row *src, int32_t n_pages)
{
    if (table_room(dst, n_pages))
        return -2;
    for (int32_t i = 0; i < n_pages; i++) {
        dst->pages[i] = src->pages[i];
        c->ref[src->pages[i]]++; /* src maps it: never idle */
    }
    dst->n_pages = n_pages;
    dst->len = n_pages * c->page_tokens;
    return 0;
}

/* ---------------------------------------------------------------- the prefix index */

int kv_prefix_enable(kv_cache *c, char *err, size_t errlen)
{
    if (c->ix)
        return 0;
    struct kv_index *x = calloc(1, sizeof *x);
    size_t n = (size_t)c->n_pages, nb = 16;
    while (nb < 2 * n)
        nb *= 2;
    if (x) {
        x->P = c->page_tokens;
        x->key = malloc(n * sizeof *x->key);
        x->parent = malloc(n * sizeof *x->parent);
        x->parent_gen = malloc(n * sizeof *x->parent_gen);
        x->gen = calloc(n, sizeof *x->gen);
        x->indexed = calloc(n, sizeof *x->indexed);
        x->tokens = malloc(n * (size_t)c->page_tokens * sizeof *x->tokens);
        x->hnext = malloc(n * sizeof *x->hnext);
        x->bucket = malloc(nb * sizeof *x->bucket);
        x->lru_prev = malloc(n * sizeof *x->lru_prev);
        x->lru_next = malloc(n * sizeof *x->lru_next);
    }
    if (!x || !x->key || !x->parent || !x->parent_gen || !x->gen || !x->indexed || !x->tokens || !x->hnext ||
        !x->bucket || !x->lru_prev || !x->lru_next) {
        index_free(x);
        return util_errf(err, errlen, "out of memory for the prefix index of %d KV pages; run with --prefix-cache off.",
                         c->n_pages);
    }
    for (size_t b = 0; b < nb; b++)
        x->bucket[b] = -1;
    x->mask = nb - 1;
    x->lru_head = x->lru_tail = -1;
    c->ix = x;
    return 0;
}

kv_chain kv_chain_start(int32_t adapter)
{
    /* a different adapter computes different KV for the same tokens: its own chains */
    return (kv_chain){0, 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uint32_t)adapter * 0xbf58476d1ce4e5b9ull), -1, 0};
}

/* The key of a page of tokens t[0..P) after the page whose key is prev (FNV-1a over the ids, then a
 * splitmix finish so consecutive ids spread over the buckets). */
uint64_t kv_chain_key(uint64_t prev, const int32_t *t, int32_t P)
{
    uint64_t h = prev ^ 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < P; i++)
        h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* The indexed page equal to tokens t (P of them) whose parent is ch's last page, or -1. */
static int32_t lookup(const struct kv_index *x, const kv_chain *ch, uint64_t k, const int32_t *t)
{
    for (int32_t p = x->bucket[k & x->mask]; p >= 0; p = x->hnext[p])
        if (x->key[p] == k && x->parent[p] == ch->parent && (ch->parent < 0 || x->parent_gen[p] == ch->parent_gen) &&
            !memcmp(x->tokens + (size_t)p * (size_t)x->P, t, (size_t)x->P * sizeof *t))
            return p;
    return -1;
}

static void advance(kv_chain *ch, const struct kv_index *x, uint64_t k, int32_t p)
{
    ch->pages++;
    ch->key = k;
    ch->parent = p;
    ch->parent_gen = x->gen[p];
}

int32_t kv_prefix_find(const kv_cache *c, kv_chain *ch, const int32_t *tokens, int32_t max_pages, int32_t *pages,
                       int32_t *idle)
{
    const struct kv_index *x = c->ix;
    int32_t n = 0;
    *idle = 0;
    if (!x)
        return 0;
    while (ch->pages < max_pages) {
        const int32_t *t = tokens + (size_t)ch->pages * (size_t)x->P;
        uint64_t k = kv_chain_key(ch->key, t, x->P);
        int32_t p = lookup(x, ch, k, t);
        if (p < 0)
            break;
        pages[n++] = p;
        *idle += c->ref[p] == 0;
        advance(ch, x, k, p);
    }
    return n;
}

int kv_prefix_map(kv_cache *c, kv_row *r, const int32_t *pages, int32_t n)
{
    if (table_room(r, n))
        return -2;
    for (int32_t i = 0; i < n; i++) {
        int32_t p = pages[i];
        if (c->ref[p] == 0) { /* idle: mapped again, no longer free */
            lru_remove(c->ix, p);
            c->n_free--;
        }
        c->ref[p]++;
        r->pages[i] = p;
    }
    r->n_pages = n;
    r->len = n * c->page_tokens;
    return 0;
}

void kv_prefix_insert(kv_cache *c, kv_chain *ch, const kv_row *r, const int32_t *tokens, int32_t written)
{
    struct kv_index *x = c->ix;
    if (!x)
        return;
    int32_t full = written / x->P;
    while (ch->pages < full && ch->pages < r->n_pages) {
        const int32_t *t = tokens + (size_t)ch->pages * (size_t)x->P;
        uint64_t k = kv_chain_key(ch->key, t, x->P);
        int32_t q = lookup(x, ch, k, t);
        if (q < 0) {
            q = r->pages[ch->pages];
            if (x->indexed[q]) /* indexed under another prefix: cannot happen for a row's own page; stop */
                return;
            x->key[q] = k;
            x->parent[q] = ch->parent;
            x->parent_gen[q] = ch->parent_gen;
            memcpy(x->tokens + (size_t)q * (size_t)x->P, t, (size_t)x->P * sizeof *t);
            x->indexed[q] = 1;
            x->hnext[q] = x->bucket[k & x->mask];
            x->bucket[k & x->mask] = q;
            x->n_indexed++;
        }
        advance(ch, x, k, q);
    }
}

void kv_prefix_stats(const kv_cache *c, int32_t *indexed, int32_t *idle, uint64_t *evicted)
{
    *indexed = c->ix ? c->ix->n_indexed : 0;
    *idle = c->ix ? c->ix->n_idle : 0;
    *evicted = c->ix ? c->ix->evicted : 0;
}

int kv_check(const kv_cache *c, const kv_row *const *rows, size_t n, char *err, size_t errlen)
{
    int32_t *cnt = calloc((size_t)c->n_pages, sizeof *cnt);
    int rc = 0;
    if (!cnt)
        return util_errf(err, errlen, "out of memory for the KV check.");
    for (size_t i = 0; i < n; i++)
        for (int32_t k = 0; k < rows[i]->n_pages; k++)
            cnt[rows[i]->pages[k]]++;
    int32_t lists = list_len(c);
    for (int32_t i = 0; i < lists; i++)
        cnt[c->free_list[i]] += 1 << 20; /* marks: on the free list */
    int32_t idle = 0;
    for (int32_t p = c->ix ? c->ix->lru_head : -1; p >= 0; p = c->ix->lru_next[p], idle++)
        cnt[p] += 1 << 24; /* marks: idle */
    for (int32_t p = 0; p < c->n_pages && !rc; p++) {
        int32_t mapped = cnt[p] & ((1 << 20) - 1), free_ = (cnt[p] >> 20) & 15, idl = cnt[p] >> 24;
        bool ix = c->ix && c->ix->indexed[p];
        if (mapped != c->ref[p])
            rc = util_errf(err, errlen, "KV page %d: count %d but %d rows map it.", p, c->ref[p], mapped);
        else if (free_ + idl + (mapped > 0) != 1)
            rc = util_errf(err, errlen, "KV page %d is in %d of the states mapped/free/idle.", p,
                           free_ + idl + (mapped > 0));
        else if ((idl && !ix) || (free_ && ix))
            rc = util_errf(err, errlen, "KV page %d is %s but %sindexed.", p, idl ? "idle" : "free", ix ? "" : "not ");
    }
    if (!rc && (idle != (c->ix ? c->ix->n_idle : 0) || lists < 0))
        rc = util_errf(err, errlen, "KV idle list holds %d pages, counted %d.", idle, c->ix ? c->ix->n_idle : 0);
    free(cnt);
    return rc;
}
