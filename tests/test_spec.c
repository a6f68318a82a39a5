/*
 * test_spec.c — speculative passes (issue 20), the parts that stand alone:
 *   - the prompt-lookup proposer (spec.h): longest n-gram first, its most
 *     recent earlier occurrence, the continuation capped by k and by the
 *     sequence's end, across the prompt/output boundary, nothing without a match;
 *   - kv_row_truncate (kv.h): pages past the kept length go back through the
 *     reference counts (free, idle when indexed, one count less when another
 *     row maps them), a shared or indexed page the row would write again is
 *     refused, and kv_check agrees with every page's count after each step.
 * Exact integer results: no tolerance is involved.
 */
#include "batch/spec.h"
#include "engine/kv.h"
#include "test.h"

static void test_propose(void)
{
    int32_t out[SPEC_K_MAX];
    /* prompt 1 2 3 4 5 9 1 2, output 3: the trigram 1 2 3 recurs, propose 4 5 9 (k 3) */
    int32_t p[] = {1, 2, 3, 4, 5, 9, 1, 2};
    int32_t g[] = {3};
    int n = spec_propose(p, 8, g, 1, 3, out);
    CHECK(n == 3 && out[0] == 4 && out[1] == 5 && out[2] == 9, "trigram: %d tokens (%d %d %d)", n, out[0], out[1],
          out[2]);
    /* k larger than what follows: stops at the sequence's end (the continuation runs into the match itself) */
    n = spec_propose(p, 8, g, 1, 16, out);
    CHECK(n == 6 && out[0] == 4 && out[5] == 3, "k 16: %d tokens", n);
    /* the most recent occurrence wins: 7 8 -> 1 earlier, 7 8 -> 2 later; sequence ends in 7 8 */
    int32_t q[] = {7, 8, 1, 5, 7, 8, 2, 6, 7, 8};
    n = spec_propose(q, 10, NULL, 0, 2, out);
    CHECK(n == 2 && out[0] == 2 && out[1] == 6, "most recent: %d tokens (%d %d)", n, out[0], out[1]);
    /* the longest n-gram wins over a more recent shorter one: 4 5 6 -> 10 (trigram) vs 6 -> 11 (unigram) */
    int32_t r[] = {4, 5, 6, 10, 6, 11, 4, 5, 6};
    n = spec_propose(r, 9, NULL, 0, 1, out);
    CHECK(n == 1 && out[0] == 10, "longest first: %d tokens (%d)", n, out[0]);
    /* a unigram when nothing longer matches, the match in the prompt and the end in the output */
    int32_t s[] = {3, 9, 9};
    int32_t sg[] = {5, 3};
    n = spec_propose(s, 3, sg, 2, 4, out);
    CHECK(n == 4 && out[0] == 9 && out[1] == 9 && out[2] == 5 && out[3] == 3, "unigram across the boundary: %d", n);
    /* no earlier occurrence, k 0, a one-token sequence: nothing */
    int32_t u[] = {1, 2, 3, 4};
    CHECK(spec_propose(u, 4, NULL, 0, 4, out) == 0, "no match proposed something");
    CHECK(spec_propose(p, 8, g, 1, 0, out) == 0, "k 0 proposed something");
    CHECK(spec_propose(u, 1, NULL, 0, 4, out) == 0, "one token proposed something");
}

static void check_pages(const kv_cache *c, const kv_row *const *rows, size_t n, const char *what)
{
    char err[256];
    CHECK(kv_check(c, rows, n, err, sizeof err) == 0, "%s: %s", what, err);
}

static void test_truncate(void)
{
    char err[256];
    kv_cache c;
    const int P = 4;
    CHECK(kv_create(&c, 1, 1, 1, P, 16, err, sizeof err) == 0, "kv_create: %s", err);
    CHECK(kv_prefix_enable(&c, err, sizeof err) == 0, "prefix index: %s", err);
    /* row a: a 10-token prompt; its 2 full pages indexed (the prefix cache's state after its prefill) */
    int32_t prompt[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kv_row a = {0}, b = {0};
    CHECK(kv_row_reserve(&c, &a, 10) == 0, "reserve a");
    a.len = 10;
    kv_chain ch = kv_chain_start(0);
    kv_prefix_insert(&c, &ch, &a, prompt, 10);
    int32_t ix, idle;
    uint64_t ev;
    kv_prefix_stats(&c, &ix, &idle, &ev);
    CHECK(ix == 2, "%d pages indexed, want 2", ix);
    /* row b maps a's first two pages, then decodes 1 + k = 6 speculative positions: 8 + 6 = 14 (4 pages) */
    CHECK(kv_row_map(&c, &b, &a, 2) == 0 && kv_row_reserve(&c, &b, 14) == 0, "map + reserve b");
    b.len = 14;
    const kv_row *both[] = {&a, &b};
    check_pages(&c, both, 2, "after the speculative reserve");
    CHECK(c.n_free == 16 - 3 - 2, "free %d, want 11", c.n_free);
    int32_t shared0 = b.pages[0], shared1 = b.pages[1], own3 = b.pages[3];
    /* one token accepted: keep 9 positions (3 pages); the 4th page goes back to the free list */
    CHECK(kv_row_truncate(&c, &b, 9) == 0, "truncate to 9");
    CHECK(b.n_pages == 3 && b.len == 9, "b holds %d pages, len %d; want 3, 9", b.n_pages, b.len);
    CHECK(c.ref[own3] == 0 && c.n_free == 12, "page %d count %d, free %d; want 0, 12", own3, c.ref[own3], c.n_free);
    CHECK(c.ref[shared0] == 2 && c.ref[shared1] == 2, "shared pages' counts %d %d, want 2 2", c.ref[shared0],
          c.ref[shared1]);
    check_pages(&c, both, 2, "after truncating to 9");
    /* a length inside a mapped (shared, indexed) page is refused, nothing changed */
    CHECK(kv_row_truncate(&c, &b, 6) == -1, "truncating into a shared page was not refused");
    CHECK(b.n_pages == 3 && b.len == 9 && c.ref[shared1] == 2, "a refused truncate changed the row");
    /* on a page boundary: the shared pages are kept untouched, b's own page goes */
    CHECK(kv_row_truncate(&c, &b, 8) == 0 && b.n_pages == 2 && b.len == 8, "truncate to 8");
    CHECK(c.ref[shared0] == 2 && c.ref[shared1] == 2 && c.n_free == 13, "after 8: counts %d %d, free %d",
          c.ref[shared0], c.ref[shared1], c.n_free);
    check_pages(&c, both, 2, "after truncating to 8");
    /* below the shared pages, on a boundary: one mapping of page 1 dropped, a still holds it */
    CHECK(kv_row_truncate(&c, &b, 4) == 0 && b.n_pages == 1 && c.ref[shared1] == 1, "truncate to 4");
    check_pages(&c, both, 2, "after truncating to 4");
    /* a longer length than held: nothing released, len unchanged */
    CHECK(kv_row_truncate(&c, &b, 40) == 0 && b.n_pages == 1 && b.len == 4, "truncate past the end");
    /* a's own tail: its partial 3rd page (not indexed, count 1) may be kept and written on */
    CHECK(kv_row_truncate(&c, &a, 9) == 0 && a.n_pages == 3, "truncate a to 9");
    /* a releases its indexed pages: page 1 (mapped by a alone now) goes idle, page 0 keeps b's mapping */
    kv_row_free(&c, &a);
    const kv_row *only_b[] = {&b};
    check_pages(&c, only_b, 1, "after a is freed");
    kv_prefix_stats(&c, &ix, &idle, &ev);
    CHECK(idle == 1 && c.ref[shared0] == 1, "idle %d, page 0 count %d; want 1, 1", idle, c.ref[shared0]);
    kv_row_free(&c, &b);
    check_pages(&c, NULL, 0, "after both are freed");
    CHECK(c.n_free == 16, "free %d, want every page", c.n_free);
    kv_destroy(&c);
}

int main(void)
{
    test_propose();
    test_truncate();
    return test_finish("test_spec");
}
