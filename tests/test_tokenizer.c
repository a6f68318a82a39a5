/*
 * test_tokenizer.c — the tokenizer against ids produced by Hugging Face
 * `tokenizers` (tools/gen_tokenizer_fixtures.py writes tests/data/tok/).
 *
 * Expectation, decided before looking at results: ids identical on 100% of
 * the corpus for every tokenizer, with add_special both false and true;
 * decode (skip_special false and true) byte-identical to the reference; the
 * incremental decoder's output concatenated equal to decode() and every chunk
 * valid UTF-8.  The agreement counts are printed per tokenizer.
 * DoS inputs only have to complete (no timing assertions) and round-trip.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "test.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define DATA "tests/data/tok/"

typedef struct {
    uint8_t *p;
    size_t n;
} bytes;

static bytes unhex(const char *h)
{
    size_t n = strlen(h) / 2;
    bytes b = {malloc(n + 1), n};
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        b.p[i] = (uint8_t)v;
    }
    b.p[n] = 0;
    return b;
}

static bytes memdup(const char *s, size_t n)
{
    bytes b = {malloc(n + 1), n};
    memcpy(b.p, s, n);
    b.p[n] = 0;
    return b;
}

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    CHECK(j != NULL, "%s: %s (line %d)", path, je.text, je.line);
    return j;
}

static bytes *corpus;
static size_t n_corpus;

static void load_corpus(void)
{
    json_t *c = load_json(DATA "corpus.json");
    if (!c)
        exit(test_finish("test_tokenizer"));
    CHECK(!strcmp(json_string_value(json_object_get(c, "magic")), "spill-tok-corpus"), "corpus magic");
    json_t *cases = json_object_get(c, "cases");
    n_corpus = json_array_size(cases);
    corpus = calloc(n_corpus, sizeof *corpus);
    for (size_t i = 0; i < n_corpus; i++)
        corpus[i] = unhex(json_string_value(json_array_get(cases, i)));
    json_decref(c);
    CHECK(n_corpus >= 2000, "corpus has %zu strings, want >= 2000", n_corpus);
}

/* Python's bytes.decode('utf-8', 'replace'), which the reference was fed: our
 * decode output is compared against it when the reference round-trips. */
static char *sanitize(const bytes *b, size_t *len)
{
    size_t cap = b->n * 3 + 1, n = 0;
    char *o = malloc(cap);
    for (size_t i = 0; i < b->n;) {
        size_t k;
        for (k = 1; k <= 4 && i + k <= b->n; k++)
            if (util_utf8_valid((const char *)b->p + i, k))
                break;
        if (k <= 4 && i + k <= b->n) {
            memcpy(o + n, b->p + i, k);
            n += k;
            i += k;
            continue;
        }
        /* maximal invalid subpart: the longest prefix of a valid sequence */
        uint8_t c = b->p[i];
        size_t want = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        size_t j = 1;
        while (j < want && i + j < b->n) {
            uint8_t d = b->p[i + j];
            uint8_t lo = 0x80, hi = 0xBF;
            if (j == 1 && c == 0xE0)
                lo = 0xA0;
            if (j == 1 && c == 0xED)
                hi = 0x9F;
            if (j == 1 && c == 0xF0)
                lo = 0x90;
            if (j == 1 && c == 0xF4)
                hi = 0x8F;
            if (d < lo || d > hi)
                break;
            j++;
        }
        memcpy(o + n, "\xEF\xBF\xBD", 3);
        n += 3;
        i += j;
    }
    o[n] = 0;
    *len = n;
    return o;
}

static bool valid_utf8_chunks = true;

/* Runs corpus cases 0, stride, 2*stride… through tok and compares with the
 * reference's expectations e (ids, dec, dec_skip, prefix, suffix). */
static void check_cases(tokenizer *tok, json_t *e, const char *label, size_t stride)
{
    const char *path = label;
    size_t n_cases = (n_corpus + stride - 1) / stride;
    json_t *ids = json_object_get(e, "ids"), *dec = json_object_get(e, "dec"), *dec_skip = json_object_get(e, "dec_skip");
    json_t *prefix = json_object_get(e, "prefix"), *suffix = json_object_get(e, "suffix");
    CHECK(json_array_size(ids) == n_cases, "%s: %zu expectations for %zu strings", path, json_array_size(ids), n_cases);
    size_t agree = 0, agree_sp = 0, agree_dec = 0, agree_skip = 0, agree_stream = 0, shown = 0;
    char err[SPILL_ERRLEN];
    for (size_t ci = 0; ci < n_cases && ci < json_array_size(ids); ci++) {
        size_t i = ci * stride;
        json_t *want = json_array_get(ids, ci);
        int32_t *got = NULL, *got_sp = NULL;
        size_t n = 0, n_sp = 0;
        int rc = tokenizer_encode(tok, (const char *)corpus[i].p, corpus[i].n, false, &got, &n, err, sizeof err);
        CHECK(rc == 0, "%s case %zu: %s", label, i, err);
        bool same = rc == 0 && n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = got[k] == json_integer_value(json_array_get(want, k));
        agree += same;
        if (!same && shown++ < 5) {
            fprintf(stderr, "%s case %zu differs: input hex ", label, i);
            for (size_t k = 0; k < corpus[i].n && k < 80; k++)
                fprintf(stderr, "%02x", corpus[i].p[k]);
            fprintf(stderr, "\n  want");
            for (size_t k = 0; k < json_array_size(want) && k < 40; k++)
                fprintf(stderr, " %lld", json_integer_value(json_array_get(want, k)));
            fprintf(stderr, "\n  got ");
            for (size_t k = 0; k < n && k < 40; k++)
                fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n");
        }
        rc = tokenizer_encode(tok, (const char *)corpus[i].p, corpus[i].n, true, &got_sp, &n_sp, err, sizeof err);
        size_t np = json_array_size(prefix), ns = json_array_size(suffix);
        bool same_sp = rc == 0 && n_sp == json_array_size(want) + np + ns;
        for (size_t k = 0; same_sp && k < n_sp; k++) {
            json_t *w = k < np ? json_array_get(prefix, k)
                        : k < np + json_array_size(want) ? json_array_get(want, k - np)
                                                         : json_array_get(suffix, k - np - json_array_size(want));
            same_sp = got_sp[k] == json_integer_value(w);
        }
        agree_sp += same_sp;

        /* decode the reference ids (so decode is checked even where encode differs) */
        size_t nw = json_array_size(want);
        int32_t *wid = malloc((nw + 1) * sizeof *wid);
        for (size_t k = 0; k < nw; k++)
            wid[k] = (int32_t)json_integer_value(json_array_get(want, k));
        size_t slen;
        char *s = sanitize(&corpus[i], &slen);
        const char *dh = json_string_value(json_array_get(dec, ci));
        bytes d = dh ? unhex(dh) : memdup(s, slen);
        const char *sh = json_string_value(json_array_get(dec_skip, ci));
        bytes ds = sh ? unhex(sh) : memdup((const char *)d.p, d.n);
        char *out = NULL;
        size_t olen = 0;
        rc = tokenizer_decode(tok, wid, nw, false, &out, &olen, err, sizeof err);
        bool dec_ok = rc == 0 && olen == d.n && memcmp(out, d.p, d.n) == 0;
        agree_dec += dec_ok;
        if (!dec_ok && shown++ < 5)
            fprintf(stderr, "%s case %zu: decode differs: got \"%.*s\" want \"%.*s\"\n", label, i, (int)olen,
                    out ? out : "", (int)d.n, d.p);
        free(out);
        rc = tokenizer_decode(tok, wid, nw, true, &out, &olen, err, sizeof err);
        agree_skip += rc == 0 && olen == ds.n && memcmp(out, ds.p, ds.n) == 0;
        free(out);

        /* incremental decode: concatenation == decode, chunks valid UTF-8 */
        tok_stream *st = NULL;
        char *acc = malloc(d.n * 2 + 64);
        size_t an = 0, acap = d.n * 2 + 64;
        bool ok = tok_stream_init(tok, false, &st, err, sizeof err) == 0;
        for (size_t k = 0; ok && k <= nw; k++) {
            char *chunk = NULL;
            size_t cl = 0;
            ok = (k < nw ? tok_stream_push(st, wid[k], &chunk, &cl, err, sizeof err)
                         : tok_stream_flush(st, &chunk, &cl, err, sizeof err)) == 0;
            if (ok && !util_utf8_valid(chunk, cl))
                valid_utf8_chunks = false;
            if (ok && an + cl + 1 > acap) {
                acap = (an + cl) * 2 + 1;
                acc = realloc(acc, acap);
            }
            if (ok) {
                memcpy(acc + an, chunk, cl);
                an += cl;
            }
            free(chunk);
        }
        agree_stream += ok && an == d.n && memcmp(acc, d.p, d.n) == 0;
        tok_stream_free(st);
        free(acc);
        free(wid);
        free(s);
        free(d.p);
        free(ds.p);
        free(got);
        free(got_sp);
    }
    fprintf(stderr,
            "%-28s ids %zu/%zu  ids+special %zu/%zu  decode %zu/%zu  decode(skip) %zu/%zu  stream %zu/%zu\n", label,
            agree, n_cases, agree_sp, n_cases, agree_dec, n_cases, agree_skip, n_cases, agree_stream, n_cases);
    CHECK(agree == n_cases, "%s: ids agree on %zu of %zu strings", label, agree, n_cases);
    CHECK(agree_sp == n_cases, "%s: ids with special tokens agree on %zu of %zu", label, agree_sp, n_cases);
    CHECK(agree_dec == n_cases, "%s: decode agrees on %zu of %zu", label, agree_dec, n_cases);
    CHECK(agree_skip == n_cases, "%s: decode(skip_special) agrees on %zu of %zu", label, agree_skip, n_cases);
    CHECK(agree_stream == n_cases, "%s: incremental decode agrees on %zu of %zu", label, agree_stream, n_cases);
}

/* The whole corpus against <dir>/expect_<name>.json. */
static void check_against_in(tokenizer *tok, const char *dir, const char *name, const char *label)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/expect_%s.json", dir, name);
    json_t *e = load_json(path);
    if (!e)
        return;
    CHECK(json_integer_value(json_object_get(e, "version")) == 1, "%s: version", path);
    check_cases(tok, e, label, 1);
    json_decref(e);
}

static void check_against(tokenizer *tok, const char *name, const char *label)
{
    check_against_in(tok, "tests/data/tok", name, label);
}

/* Vocabularies too big to commit: the real Qwen2.5 vocabulary that tools/setup.sh
 * builds into $SPILL_HOME/tok/qwen2 (or the dir SPILL_TOK_EXTRA names). */
static void check_extra(void)
{
    char def[512];
    const char *dir = getenv("SPILL_TOK_EXTRA");
    static const char *names[] = {"qwen25"};
    if (!dir || !*dir) {
        snprintf(def, sizeof def, "%s/tok/qwen2", util_spill_home());
        dir = def;
    }
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[1024], err[SPILL_ERRLEN];
        snprintf(path, sizeof path, "%s/%s.tokenizer.json", dir, names[i]);
        tokenizer *t = NULL;
        int rc = tokenizer_from_json_file(path, &t, err, sizeof err);
        CHECK(rc == 0, "SPILL_TOK_EXTRA: %s", err);
        if (rc == 0)
            check_against_in(t, dir, names[i], names[i]);
        tokenizer_free(t);
    }
}

/* Small tokenizers (mini.json) that exercise Split behaviours, Metaspace,
 * normalizers, added-token flags, unk/fuse_unk, prefixes and decoders. */
static void check_minis(void)
{
    json_t *m = load_json(DATA "mini.json");
    if (!m)
        return;
    size_t stride = (size_t)json_integer_value(json_object_get(m, "stride"));
    json_t *bases = json_object_get(m, "bases"), *minis = json_object_get(m, "minis"), *mini;
    const char *name;
    CHECK(json_object_size(minis) >= 20, "mini.json has %zu tokenizers", json_object_size(minis));
    json_object_foreach(minis, name, mini) {
        json_t *doc = json_deep_copy(json_object_get(bases, json_string_value(json_object_get(mini, "base"))));
        json_t *patch = json_object_get(mini, "patch"), *v;
        const char *k;
        json_object_foreach(patch, k, v) {
            if (!strcmp(k, "model"))
                json_object_update(json_object_get(doc, "model"), v);
            else
                json_object_set(doc, k, v);
        }
        char *s = json_dumps(doc, JSON_COMPACT);
        tokenizer *t = NULL;
        char err[SPILL_ERRLEN];
        int rc = tokenizer_from_json(s, strlen(s), name, &t, err, sizeof err);
        CHECK(rc == 0, "%s: %s", name, err);
        if (rc == 0)
            check_cases(t, mini, name, stride);
        tokenizer_free(t);
        free(s);
        json_decref(doc);
    }
    json_decref(m);
}

static char *smol_json;
static size_t smol_json_len;

/* The SmolLM2 tokenizer.json with a variant's patch applied. */
static tokenizer *load_variant(const char *name)
{
    json_t *base = json_loadb(smol_json, smol_json_len, JSON_ALLOW_NUL, NULL);
    json_t *vars = load_json(DATA "variants.json");
    json_t *patch = json_object_get(json_object_get(vars, "variants"), name);
    CHECK(base && patch, "variant %s missing", name);
    const char *k;
    json_t *v;
    json_object_foreach(patch, k, v) {
        if (!strcmp(k, "ignore_merges"))
            json_object_set(json_object_get(base, "model"), "ignore_merges", v);
        else
            json_object_set(base, k, v);
    }
    char *s = json_dumps(base, JSON_COMPACT);
    tokenizer *t = NULL;
    char err[SPILL_ERRLEN];
    int rc = tokenizer_from_json(s, strlen(s), name, &t, err, sizeof err);
    CHECK(rc == 0, "variant %s: %s", name, err);
    free(s);
    json_decref(base);
    json_decref(vars);
    return t;
}

/* Synthetic GGUF vocabularies (gguf_minis.json): generic SentencePiece
 * `llama`, arch phi3, and byte-level `gpt2` with pre qwen2. */
static void check_gguf_minis(void)
{
    json_t *m = load_json(DATA "gguf_minis.json");
    if (!m)
        return;
    size_t stride = (size_t)json_integer_value(json_object_get(m, "stride"));
    json_t *gg = json_object_get(m, "ggufs"), *e;
    const char *name;
    CHECK(json_object_size(gg) >= 3, "gguf_minis.json has %zu vocabularies", json_object_size(gg));
    json_object_foreach(gg, name, e) {
        char path[512], err[SPILL_ERRLEN];
        snprintf(path, sizeof path, DATA "%s", json_string_value(json_object_get(e, "file")));
        gguf_file *g = NULL;
        int rc = gguf_open(path, &g, err, sizeof err);
        CHECK(rc == 0, "%s", err);
        if (rc != 0)
            continue;
        tokenizer *t = NULL;
        rc = tokenizer_from_gguf(g, &t, err, sizeof err);
        gguf_close(g);
        CHECK(rc == 0, "%s: %s", name, err);
        if (rc == 0)
            check_cases(t, e, name, stride);
        tokenizer_free(t);
    }
    json_decref(m);
}

static void check_gguf(const char *rel, const char *expect, const char *label, tokenizer **keep)
{
    char path[1024], err[SPILL_ERRLEN];
    util_pathf(path, sizeof path, "%s/models/%s", util_spill_home(), rel);
    gguf_file *g = NULL;
    int rc = gguf_open(path, &g, err, sizeof err);
    CHECK(rc == 0, "%s: %s (tools/setup.sh installs the test models)", path, err);
    if (rc != 0)
        return;
    tokenizer *t = NULL;
    rc = tokenizer_from_gguf(g, &t, err, sizeof err);
    gguf_close(g);
    CHECK(rc == 0, "%s: %s", label, err);
    if (rc == 0)
        check_against(t, expect, label);
    *keep = t;
}

static void check_dos(tokenizer *smol, tokenizer *gemma)
{
    char err[SPILL_ERRLEN];
    size_t big = 1 << 20;
    char *buf = malloc(big);
    const char fills[] = {'_', 'a', ' ', '7', '\n'};
    for (size_t f = 0; f < sizeof fills; f++) {
        size_t len = fills[f] == '_' ? 50000 : big;
        memset(buf, fills[f], len);
        tokenizer *toks[2] = {smol, gemma};
        for (int k = 0; k < 2; k++) {
            if (!toks[k])
                continue;
            int32_t *ids = NULL;
            size_t n = 0;
            int rc = tokenizer_encode(toks[k], buf, len, false, &ids, &n, err, sizeof err);
            CHECK(rc == 0 && n > 0, "DoS run of %zu x '%c': %s", len, fills[f], err);
            char *out = NULL;
            size_t olen = 0;
            rc = tokenizer_decode(toks[k], ids, n, false, &out, &olen, err, sizeof err);
            CHECK(rc == 0 && olen == len && memcmp(out, buf, len) == 0, "DoS run of '%c' does not round-trip",
                  fills[f]);
            free(out);
            free(ids);
        }
    }
    /* 1 MB of one CJK character (3 bytes each) */
    for (size_t i = 0; i + 3 <= big; i += 3)
        memcpy(buf + i, "\xE4\xB8\x80", 3);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(tokenizer_encode(smol, buf, big / 3 * 3, false, &ids, &n, err, sizeof err) == 0, "CJK run: %s", err);
    free(ids);
    free(buf);
}

static void check_rejects(void)
{
    static const char *bad[] = {
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"(a+)+\"},\"behavior\":\"Isolated\",\"invert\":false}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":\"Replace\","
        "\"pattern\":{\"Regex\":\"(?:x|xx)*y\"},\"content\":\"\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}",
        "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}",
        "[1,2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tokenizer *t = NULL;
        char err[SPILL_ERRLEN] = "";
        int rc = tokenizer_from_json(bad[i], strlen(bad[i]), "bad.json", &t, err, sizeof err);
        CHECK(rc != 0 && t == NULL, "bad tokenizer.json %zu was accepted", i);
        CHECK(strncmp(err, "bad.json", 8) == 0 && err[strlen(err) - 1] == '.' && !strchr(err, '\n'),
              "error %zu is not one sentence naming the file: %s", i, err);
        if (i == 0)
            CHECK(strstr(err, "exponential") != NULL, "(a+)+ rejected for the wrong reason: %s", err);
    }
}

/* Costly regexes the load-time check lets through are bounded at run time:
 * they either finish or fail with one sentence, never hang. */
static void check_runtime_limits(void)
{
    static const char *js[] = {
        /* polynomial backtracking (no nested repeat): per-match PCRE2 limit */
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":"
        "\"Split\",\"pattern\":{\"Regex\":\"a*a*a*a*a*a*a*[^a]\"},\"behavior\":\"Isolated\",\"invert\":false}}",
        /* a Replace matching everywhere with a long content: growth bound */
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":"
        "\"Replace\",\"pattern\":{\"Regex\":\"\"},\"content\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}",
    };
    size_t len = 200000;
    char *text = malloc(len);
    memset(text, 'a', len);
    for (size_t i = 0; i < sizeof js / sizeof *js; i++) {
        tokenizer *t = NULL;
        char err[SPILL_ERRLEN] = "";
        int rc = tokenizer_from_json(js[i], strlen(js[i]), "slow.json", &t, err, sizeof err);
        CHECK(rc == 0, "slow.json %zu should load: %s", i, err);
        if (rc != 0)
            continue;
        int32_t *ids = NULL;
        size_t n = 0;
        err[0] = 0;
        rc = tokenizer_encode(t, text, len, false, &ids, &n, err, sizeof err);
        CHECK(rc != 0 && strlen(err) > 10 && err[strlen(err) - 1] == '.', "slow.json %zu: want a refusal, got rc %d \"%s\"",
              i, rc, err);
        free(ids);
        tokenizer_free(t);
    }
    free(text);
}

static void check_api(tokenizer *smol, tokenizer *gemma)
{
    size_t len;
    CHECK(tokenizer_token_id(smol, "<|im_end|>", 10) == 2, "smol <|im_end|>");
    CHECK(tokenizer_vocab_size(smol) == 49152, "smol vocab %zu", tokenizer_vocab_size(smol));
    const char *p = tokenizer_piece(smol, tokenizer_token_id(smol, "\xC4\xA0the", 5), &len);
    CHECK(p && len == 5, "smol piece");
    const uint8_t *b = tokenizer_token_bytes(smol, tokenizer_token_id(smol, "\xC4\xA0the", 5), &len);
    CHECK(b && len == 4 && !memcmp(b, " the", 4), "smol bytes of Ġthe");
    CHECK(tokenizer_is_special(smol, 2) && !tokenizer_is_special(smol, 100), "smol specials");
    CHECK(tokenizer_special(smol, TOK_EOT) == 2, "smol eot %d", tokenizer_special(smol, TOK_EOT));
    if (!gemma)
        return;
    CHECK(tokenizer_special(gemma, TOK_BOS) == 2 && tokenizer_special(gemma, TOK_EOS) == 1, "gemma bos/eos");
    CHECK(tokenizer_special(gemma, TOK_EOT) == 106, "gemma eot %d", tokenizer_special(gemma, TOK_EOT));
    CHECK(tokenizer_token_id(gemma, "<end_of_turn>", 13) == 106, "gemma <end_of_turn>");
    int32_t nl = tokenizer_token_id(gemma, "<0x0A>", 6);
    b = tokenizer_token_bytes(gemma, nl, &len);
    CHECK(b && len == 1 && b[0] == '\n', "gemma bytes of <0x0A>");
    b = tokenizer_token_bytes(gemma, tokenizer_token_id(gemma, "\xE2\x96\x81the", 6), &len);
    CHECK(b && len == 4 && !memcmp(b, " the", 4), "gemma bytes of ▁the");
    /* a split UTF-8 sequence is held back until complete */
    int32_t e4 = tokenizer_token_id(gemma, "<0xE4>", 6), b8 = tokenizer_token_id(gemma, "<0xB8>", 6),
            x80 = tokenizer_token_id(gemma, "<0x80>", 6);
    tok_stream *s;
    char err[SPILL_ERRLEN], *chunk;
    size_t cl;
    CHECK(tok_stream_init(gemma, false, &s, err, sizeof err) == 0, "stream init");
    CHECK(tok_stream_push(s, e4, &chunk, &cl, err, sizeof err) == 0 && cl == 0, "held byte 1");
    free(chunk);
    CHECK(tok_stream_push(s, b8, &chunk, &cl, err, sizeof err) == 0 && cl == 0, "held byte 2");
    free(chunk);
    CHECK(tok_stream_push(s, x80, &chunk, &cl, err, sizeof err) == 0 && cl == 3 && !memcmp(chunk, "\xE4\xB8\x80", 3),
          "completed character emitted");
    free(chunk);
    CHECK(tok_stream_push(s, e4, &chunk, &cl, err, sizeof err) == 0 && cl == 0, "held byte");
    free(chunk);
    CHECK(tok_stream_flush(s, &chunk, &cl, err, sizeof err) == 0 && cl == 3 && !memcmp(chunk, "\xEF\xBF\xBD", 3),
          "flush emits U+FFFD for an incomplete sequence");
    free(chunk);
    tok_stream_free(s);
}

int main(void)
{
    char err[SPILL_ERRLEN];
    load_corpus();
    CHECK(util_read_file(DATA "smollm2.tokenizer.json", TOKENIZER_JSON_MAX, &smol_json, &smol_json_len, err,
                         sizeof err) == 0,
          "%s", err);
    tokenizer *smol = NULL;
    CHECK(tokenizer_from_json_file(DATA "smollm2.tokenizer.json", &smol, err, sizeof err) == 0, "%s", err);
    if (smol)
        check_against(smol, "smollm2", "smollm2.json");
    static const char *variants[] = {"gpt2", "llama3", "qwen2"};
    for (size_t i = 0; i < 3; i++) {
        tokenizer *t = load_variant(variants[i]);
        if (t)
            check_against(t, variants[i], variants[i]);
        tokenizer_free(t);
    }
    check_minis();
    check_gguf_minis();
    check_extra();
    tokenizer *smol_gguf = NULL, *gemma = NULL;
    check_gguf("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2", "smollm2.gguf", &smol_gguf);
    check_gguf("gemma3-270m/gemma-3-270m-q4_k_m.gguf", "gemma3", "gemma3.gguf", &gemma);
    CHECK(valid_utf8_chunks, "an incremental-decode chunk was not valid UTF-8");
    if (smol) {
        check_api(smol, gemma);
        check_dos(smol, gemma);
    }
    check_rejects();
    check_runtime_limits();
    tokenizer_free(smol);
    tokenizer_free(smol_gguf);
    tokenizer_free(gemma);
    for (size_t i = 0; i < n_corpus; i++)
        free(corpus[i].p);
    free(corpus);
    free(smol_json);
    return test_finish("test_tokenizer");
}
