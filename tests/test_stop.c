/*
 * test_stop.c — the stop-string matcher against a naive reference that sees
 * the whole text at once.
 *
 * Reference rule (stop.h): the text ends at the earliest byte completing any
 * stop string, the longest of those completing there wins, the result is the
 * text before its start.  While no stop has matched, after P bytes the
 * matcher must have emitted exactly P − h bytes, h = the longest suffix of
 * those P bytes that is a proper prefix of some stop string (emit everything
 * that cannot still become a match, hold the rest).  Both properties are
 * checked for every split of each hand-written case into 1, 2 and 3 pieces
 * and byte by byte, and for random texts over a 3-letter alphabet (where
 * overlaps are frequent) cut at random points.
 */
#include <stdint.h>
#include <string.h>

#include "batch/stop.h"
#include "test.h"

#define MAXT 256

/* Reference: cut position (or -1) and winning stop index for the whole text. */
static long ref_cut(const char *t, size_t n, const char *const *s, const size_t *l, int ns, int *which)
{
    for (size_t e = 1; e <= n; e++) {
        int best = -1;
        for (int i = 0; i < ns; i++)
            if (l[i] <= e && memcmp(t + e - l[i], s[i], l[i]) == 0 && (best < 0 || l[i] > l[best]))
                best = i;
        if (best >= 0) {
            *which = best;
            return (long)(e - l[best]);
        }
    }
    *which = -1;
    return -1;
}

/* Reference hold after the first p bytes (no match among them). */
static size_t ref_hold(const char *t, size_t p, const char *const *s, const size_t *l, int ns)
{
    size_t h = 0;
    for (int i = 0; i < ns; i++)
        for (size_t k = l[i] - 1; k > h; k--)
            if (k <= p && memcmp(t + p - k, s[i], k) == 0) {
                h = k;
                break;
            }
    return h;
}

/*
 * Feeds t cut at cuts[0..nc) (ascending, inside (0, n)) and checks the result
 * and every intermediate emission against the reference.  Returns 0 if all held.
 */
static int run_split(const char *t, size_t n, const size_t *cuts, int nc, const char *const *s, const size_t *l, int ns,
                     const char *label)
{
    char err[256], out[MAXT + STOP_MAX_BYTES], got[MAXT + 8];
    size_t ngot = 0;
    int which;
    long cut = ref_cut(t, n, s, l, ns, &which);
    size_t want_len = cut >= 0 ? (size_t)cut : n;
    stop_matcher m;
    int bad = 0;
    if (stop_init(&m, s, l, ns, err, sizeof err) < 0) {
        CHECK(0, "%s: init failed: %s", label, err);
        return 1;
    }
    size_t pos = 0;
    int matched_at = -1; /* piece index where push returned 1 */
    for (int k = 0; k <= nc; k++) {
        size_t end = k < nc ? cuts[k] : n, len;
        int rc = stop_push(&m, t + pos, end - pos, out, sizeof out, &len, err, sizeof err);
        if (rc < 0) {
            CHECK(0, "%s: push failed: %s", label, err);
            bad = 1;
            break;
        }
        memcpy(got + ngot, out, len);
        ngot += len;
        if (rc == 1 && matched_at < 0)
            matched_at = k;
        if (rc == 0 && matched_at < 0 && (cut < 0 || (size_t)cut + l[which] > end)) {
            size_t want_emit = end - ref_hold(t, end, s, l, ns);
            if (ngot != want_emit) {
                CHECK(0, "%s: after %zu bytes emitted %zu, want %zu (hold the longest stop prefix only)", label, end,
                      ngot, want_emit);
                bad = 1;
            }
        }
        pos = end;
    }
    size_t len;
    if (stop_finish(&m, out, sizeof out, &len, err, sizeof err) < 0) {
        CHECK(0, "%s: finish failed: %s", label, err);
        bad = 1;
    }
    memcpy(got + ngot, out, len);
    ngot += len;
    if (ngot != want_len || memcmp(got, t, want_len) != 0) {
        CHECK(0, "%s: final text '%.*s' (%zu bytes), want '%.*s'", label, (int)ngot, got, ngot, (int)want_len, t);
        bad = 1;
    }
    if ((cut >= 0) != (matched_at >= 0) || (cut >= 0 && m.matched != which)) {
        CHECK(0, "%s: matched=%d (stop %d), reference cut %ld (stop %d)", label, matched_at, m.matched, cut, which);
        bad = 1;
    }
    if (cut >= 0 && matched_at >= 0) {
        /* the push that reported the match must be the one holding the stop's last byte */
        size_t end_byte = (size_t)cut + l[which], lo = matched_at > 0 ? cuts[matched_at - 1] : 0,
               hi = matched_at < nc ? cuts[matched_at] : n;
        if (!(end_byte > lo && end_byte <= hi)) {
            CHECK(0, "%s: match reported in piece %d [%zu,%zu) but the stop ends at byte %zu", label, matched_at, lo,
                  hi, end_byte);
            bad = 1;
        }
    }
    stop_free(&m);
    return bad;
}

/* Every split into 1, 2, 3 pieces, and byte by byte. */
static int n_splits;

static void all_splits(const char *t, const char *const *s, int ns, const char *label)
{
    size_t n = strlen(t), l[STOP_MAX], cuts[MAXT] = {0};
    for (int i = 0; i < ns; i++)
        l[i] = strlen(s[i]);
    int bad = run_split(t, n, cuts, 0, s, l, ns, label), runs = 1;
    for (size_t a = 1; a < n && !bad; a++) {
        cuts[0] = a;
        bad |= run_split(t, n, cuts, 1, s, l, ns, label);
        runs++;
        for (size_t b = a + 1; b < n && !bad; b++) {
            cuts[1] = b;
            bad |= run_split(t, n, cuts, 2, s, l, ns, label);
            runs++;
        }
    }
    for (size_t a = 1; a < n; a++)
        cuts[a - 1] = a;
    if (n > 1 && !bad) {
        bad |= run_split(t, n, cuts, (int)n - 1, s, l, ns, label);
        runs++;
    }
    n_splits += runs;
    CHECK(!bad, "%s on '%s': a split failed (details above)", label, t);
}

/* Final text of t fed whole, for spot checks of the expected answer itself. */
static void expect_text(const char *t, const char *const *s, int ns, const char *want, int want_stop)
{
    char err[256], out[MAXT + STOP_MAX_BYTES], got[MAXT + STOP_MAX_BYTES];
    size_t l[STOP_MAX], n = 0, len;
    for (int i = 0; i < ns; i++)
        l[i] = strlen(s[i]);
    stop_matcher m;
    CHECK(stop_init(&m, s, l, ns, err, sizeof err) == 0, "init: %s", err);
    int rc = stop_push(&m, t, strlen(t), out, sizeof out, &len, err, sizeof err);
    memcpy(got, out, len);
    n = len;
    CHECK(stop_finish(&m, out, sizeof out, &len, err, sizeof err) == 0, "finish: %s", err);
    memcpy(got + n, out, len);
    n += len;
    CHECK(n == strlen(want) && memcmp(got, want, n) == 0, "'%s': got '%.*s', want '%s'", t, (int)n, got, want);
    CHECK(rc == (want_stop >= 0) && m.matched == want_stop, "'%s': rc %d stop %d, want stop %d", t, rc, m.matched,
          want_stop);
    stop_free(&m);
}

static void test_cases(void)
{
    const char *ab_abc[] = {"ab", "abc"}, *abc_ab[] = {"abc", "ab"}, *aab[] = {"aab"}, *b_abc[] = {"abc", "b"};
    const char *four[] = {"\n\n", "User:", "###", "</s>"};
    const char *utf[] = {"。", "😀", "é"}; /* 3-, 4- and 2-byte characters */
    const char *aaaa[] = {"aaaa"}, *abab[] = {"abab", "bab"};

    /* hand-computed answers first */
    expect_text("xxabcx", ab_abc, 2, "xx", 0);
    expect_text("xxabcx", abc_ab, 2, "xx", 1);
    expect_text("aaab", aab, 1, "a", 0);
    expect_text("zabc", b_abc, 2, "za", 1); /* "b" completes before "abc" does */
    expect_text("hello", ab_abc, 2, "hello", -1);
    expect_text("hella", ab_abc, 2, "hella", -1); /* held "a" is flushed by finish */
    expect_text("ab", ab_abc, 2, "", 0);
    expect_text("Answer: 4\n\nUser: next", four, 4, "Answer: 4", 0);
    expect_text("a ### b User: c", four, 4, "a ", 2);
    expect_text("日本語。続き", utf, 3, "日本語", 0);
    expect_text("smile 😀 then", utf, 3, "smile ", 1);
    expect_text("café au lait", utf, 3, "caf", 2);
    expect_text("aaaaaaa", aaaa, 1, "", 0);
    expect_text("ababab", abab, 2, "", 0); /* "abab" (0..4) and "bab" (1..4) end together: the longer wins */

    /* then every split of each */
    const char *texts_ab[] = {"xxabcx", "aab", "abab", "ababc", "zabzab", "hella", "a", "abcabc", ""};
    for (size_t i = 0; i < sizeof texts_ab / sizeof *texts_ab; i++) {
        all_splits(texts_ab[i], ab_abc, 2, "ab|abc");
        all_splits(texts_ab[i], abc_ab, 2, "abc|ab");
        all_splits(texts_ab[i], b_abc, 2, "abc|b");
    }
    all_splits("aaab", aab, 1, "aab");
    all_splits("aaaab", aab, 1, "aab");
    all_splits("aabaab", aab, 1, "aab");
    all_splits("Answer: 4\n\nUser: next", four, 4, "four");
    all_splits("a ### b User: c", four, 4, "four");
    all_splits("x </ </s", four, 4, "four-partial");
    all_splits("日本語。続き", utf, 3, "utf8");
    all_splits("smile 😀 then", utf, 3, "utf8");
    all_splits("café", utf, 3, "utf8");
    all_splits("\xF0\x9F\x98 broken then 😀", utf, 3, "utf8-partial-emoji");
    all_splits("aaaaaaa", aaaa, 1, "aaaa");
    all_splits("abababab", abab, 2, "abab|bab");
}

static uint64_t rng = 0x5EEDull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void test_random(void)
{
    int fails = 0, matched = 0, iters = 20000;
    for (int iter = 0; iter < iters && fails < 5; iter++) {
        char t[64], sb[STOP_MAX][8];
        const char *s[STOP_MAX];
        size_t l[STOP_MAX], n = next_u32() % 40, cuts[64];
        int ns = 1 + (int)(next_u32() % STOP_MAX);
        for (size_t i = 0; i < n; i++)
            t[i] = (char)('a' + next_u32() % 3);
        for (int i = 0; i < ns; i++) {
            l[i] = 1 + next_u32() % 5;
            for (size_t j = 0; j < l[i]; j++)
                sb[i][j] = (char)('a' + next_u32() % 3);
            s[i] = sb[i];
        }
        int nc = 0;
        for (size_t i = 1; i < n; i++)
            if (next_u32() % 3 == 0)
                cuts[nc++] = i;
        fails += run_split(t, n, cuts, nc, s, l, ns, "random");
        int which;
        matched += ref_cut(t, n, s, l, ns, &which) >= 0;
    }
    CHECK(fails == 0, "%d random cases failed", fails);
    /* the alphabet is small so that most cases match and overlap; a generator drifting away from that would test little
     */
    CHECK(matched > iters / 3 && matched < iters, "only %d of %d random texts contain a stop string", matched, iters);
}

static void test_errors(void)
{
    char err[256], out[16], big[STOP_MAX_BYTES + 1];
    stop_matcher m;
    const char *five[] = {"a", "b", "c", "d", "e"};
    size_t l5[] = {1, 1, 1, 1, 1}, l0[] = {0}, lbig[] = {sizeof big};
    const char *pb[] = {big};
    memset(big, 'x', sizeof big);
    CHECK(stop_init(&m, five, l5, 5, err, sizeof err) < 0 && strstr(err, "at most 4"), "5 stops: %s", err);
    stop_free(&m);
    CHECK(stop_init(&m, five, l0, 1, err, sizeof err) < 0 && strstr(err, "1 to"), "empty stop: %s", err);
    stop_free(&m);
    CHECK(stop_init(&m, pb, lbig, 1, err, sizeof err) < 0, "oversized stop accepted");
    stop_free(&m);
    lbig[0] = STOP_MAX_BYTES;
    CHECK(stop_init(&m, pb, lbig, 1, err, sizeof err) == 0, "stop of STOP_MAX_BYTES refused: %s", err);
    stop_free(&m);

    /* out_cap too small: error, nothing consumed, then the same push succeeds */
    const char *ab[] = {"abc"};
    size_t lab[] = {3}, len;
    CHECK(stop_init(&m, ab, lab, 1, err, sizeof err) == 0, "init: %s", err);
    CHECK(stop_push(&m, "xab", 3, out, sizeof out, &len, err, sizeof err) == 0 && len == 1, "push xab: len %zu", len);
    CHECK(stop_out_cap(&m, 14) == 16, "out cap %zu, want 2 held + 14", stop_out_cap(&m, 14));
    CHECK(stop_push(&m, "yyyyyyyyyyyyyyy", 15, out, sizeof out, &len, err, sizeof err) < 0 &&
              strstr(err, "stop_out_cap"),
          "small out accepted: %s", err);
    CHECK(stop_push(&m, "c!", 2, out, sizeof out, &len, err, sizeof err) == 1 && len == 0, "match after error: len %zu",
          len);
    CHECK(stop_push(&m, "more", 4, out, sizeof out, &len, err, sizeof err) == 1 && len == 0,
          "push after match emitted %zu", len);
    stop_free(&m);

    /* no stop strings: pass-through */
    CHECK(stop_init(&m, NULL, NULL, 0, err, sizeof err) == 0, "init 0: %s", err);
    CHECK(stop_push(&m, "abc", 3, out, sizeof out, &len, err, sizeof err) == 0 && len == 3 && !memcmp(out, "abc", 3),
          "pass-through");
    CHECK(stop_finish(&m, out, sizeof out, &len, err, sizeof err) == 0 && len == 0, "finish pass-through");
    stop_free(&m);
}

int main(void)
{
    test_cases();
    test_random();
    test_errors();
    fprintf(stderr, "test_stop: %d splits of the hand-written cases checked\n", n_splits);
    return test_finish("test_stop");
}
