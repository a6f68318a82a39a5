/*
 * test_gguf.c — the GGUF reader against the reference reader and the malformed corpus.
 *
 * 1. tests/data/gguf/expected.json (tools/make_bad_models.py, from gguf-py's GGUFReader) lists, for
 *    the two real models, a file from gguf-py's writer, the hand-laid good_min.gguf and a
 *    tensor-less good_vocab_only.gguf: counts, alignment, data offset, every KV (scalars exactly,
 *    strings and arrays by length + sha256 of their elements) and every tensor (name, type, ne,
 *    absolute offset, size).  All must match exactly: these are integers, hashes and floats
 *    decoded from the same bytes.
 * 2. The ggml type table must equal gguf-py's GGML_QUANT_SIZES wherever ggml_type_info knows a type.
 * 3. good_min.gguf cut at every byte must fail with the sentence in truncations.tsv, parsed from a
 *    heap copy of exactly the cut length so ASan catches any read past it.
 * 4. Every gguf_* file of tests/data/bad/expected.tsv must fail with its golden sentence, both through
 *    gguf_open and gguf_parse on an exact-size copy.
 * Allocations above 64 MiB fail in this binary (__asan_default_options below), so a parser that
 * sized a buffer from a claimed count would report out-of-memory and miss its golden sentence.
 */
#include "model/gguf.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>

const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1:max_allocation_size_mb=64";
}

#define ERRLEN 1024

static bool one_sentence(const char *e)
{
    size_t n = strlen(e);
    return n > 2 && e[n - 1] == '.' && !strchr(e, '\n');
}

/* A heap buffer of exactly len bytes holding data (ASan-guarded on both sides). */
static uint8_t *exact_copy(const void *data, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    if (p && len)
        memcpy(p, data, len);
    return p;
}

static void sha_strings(const gguf_file *f, const gguf_kv *kv, char hex[65])
{
    size_t total = 0, len;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        gguf_arr_str(f, kv, i, &len);
        total += 8 + len;
    }
    uint8_t *buf = malloc(total ? total : 1), *p = buf;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        const char *s = gguf_arr_str(f, kv, i, &len);
        uint64_t l = len;
        memcpy(p, &l, 8); /* LE host, as the fixture */
        memcpy(p + 8, s, len);
        p += 8 + len;
    }
    util_sha256_hex(buf, total, hex);
    free(buf);
}

static void sha_numbers(const gguf_kv *kv, char hex[65])
{
    double *v = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *v);
    for (uint64_t i = 0; i < kv->arr_n; i++)
        v[i] = gguf_arr_num(kv, i);
    util_sha256_hex(v, kv->arr_n * sizeof *v, hex);
    free(v);
}

static void check_kv(const gguf_file *f, json_t *e, const char *path)
{
    const char *key = json_string_value(json_object_get(e, "key"));
    uint32_t type = (uint32_t)json_integer_value(json_object_get(e, "type"));
    const gguf_kv *kv = gguf_get(f, key);
    CHECK(kv != NULL, "%s: key %s missing", path, key);
    if (!kv)
        return;
    CHECK(kv->type == type, "%s: %s type %u, want %u", path, key, kv->type, type);
    json_t *val = json_object_get(e, "value");
    char hex[65];
    if (type == GGUF_V_STRING) {
        const char *s;
        size_t len;
        CHECK(gguf_get_str(f, key, &s, &len), "%s: %s not a string", path, key);
        CHECK(len == (size_t)json_integer_value(json_object_get(e, "len")), "%s: %s length %zu", path, key, len);
        util_sha256_hex(s, len, hex);
        CHECK(!strcmp(hex, json_string_value(json_object_get(e, "sha256"))), "%s: %s sha256 differs", path, key);
        json_t *str = json_object_get(e, "str");
        if (str)
            CHECK(len == json_string_length(str) && !memcmp(s, json_string_value(str), len), "%s: %s = '%.*s'", path,
                  key, (int)len, s);
    } else if (type == GGUF_V_ARRAY) {
        CHECK(kv->arr_type == (uint32_t)json_integer_value(json_object_get(e, "arr_type")), "%s: %s arr_type %u", path,
              key, kv->arr_type);
        CHECK(kv->arr_n == (uint64_t)json_integer_value(json_object_get(e, "arr_n")), "%s: %s arr_n %llu", path, key,
              (unsigned long long)kv->arr_n);
        if (kv->arr_type == GGUF_V_STRING)
            sha_strings(f, kv, hex);
        else
            sha_numbers(kv, hex);
        CHECK(!strcmp(hex, json_string_value(json_object_get(e, "sha256"))), "%s: %s elements differ", path, key);
    } else if (type == GGUF_V_BOOL) {
        bool b = false;
        CHECK(gguf_get_bool(f, key, &b) && b == json_is_true(val), "%s: %s bool", path, key);
    } else if (type == GGUF_V_F32 || type == GGUF_V_F64) {
        double d = NAN;
        CHECK(gguf_get_f64(f, key, &d) && d == json_real_value(val), "%s: %s = %.17g, want %.17g", path, key, d,
              json_real_value(val));
    } else if (type == GGUF_V_U64) {
        /* a decimal string in the fixture: jansson integers stop at INT64_MAX */
        uint64_t u = 0;
        CHECK(gguf_get_u64(f, key, &u) && u == strtoull(json_string_value(val), NULL, 10), "%s: %s = %llu", path, key,
              (unsigned long long)u);
    } else {
        int64_t i = 0;
        CHECK(gguf_get_i64(f, key, &i) && i == json_integer_value(val), "%s: %s = %lld, want %lld", path, key,
              (long long)i, (long long)json_integer_value(val));
    }
}

static void check_model(json_t *m)
{
    const char *rel = json_string_value(json_object_get(m, "path"));
    char path[4096];
    if (!strncmp(rel, "$SPILL_HOME/", 12))
        util_pathf(path, sizeof path, "%s/%s", util_spill_home(), rel + 12);
    else
        util_pathf(path, sizeof path, "%s", rel);
    char err[ERRLEN];
    gguf_file *f;
    int rc = gguf_open(path, &f, err, sizeof err);
    CHECK(rc == 0, "%s: %s (install the models with tools/setup.sh)", path, err);
    if (rc)
        return;
    CHECK(f->version == json_integer_value(json_object_get(m, "version")), "%s: version %u", path, f->version);
    CHECK(f->n_kv == (uint64_t)json_integer_value(json_object_get(m, "n_kv")), "%s: n_kv %llu", path,
          (unsigned long long)f->n_kv);
    CHECK(f->n_tensors == (uint64_t)json_integer_value(json_object_get(m, "n_tensors")), "%s: n_tensors %llu", path,
          (unsigned long long)f->n_tensors);
    CHECK(f->alignment == (uint64_t)json_integer_value(json_object_get(m, "alignment")), "%s: alignment", path);
    CHECK(f->data_offset == (uint64_t)json_integer_value(json_object_get(m, "data_offset")), "%s: data_offset %llu",
          path, (unsigned long long)f->data_offset);
    json_t *kvs = json_object_get(m, "kvs"), *e;
    size_t i;
    CHECK(json_array_size(kvs) == f->n_kv, "%s: fixture lists %zu keys", path, json_array_size(kvs));
    json_array_foreach(kvs, i, e)
    {
        check_kv(f, e, path);
        CHECK(i < f->n_kv && !strcmp(f->kv[i].key, json_string_value(json_object_get(e, "key"))),
              "%s: key %zu out of order", path, i);
    }
    json_t *ts = json_object_get(m, "tensors");
    CHECK(json_array_size(ts) == f->n_tensors, "%s: fixture lists %zu tensors", path, json_array_size(ts));
    json_array_foreach(ts, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const gguf_tensor *t = gguf_find_tensor(f, name);
        CHECK(t == &f->tensors[i], "%s: tensor %s not found at index %zu", path, name, i);
        if (!t)
            continue;
        CHECK(t->type == (uint32_t)json_integer_value(json_object_get(e, "type")), "%s: %s type %u", path, name,
              t->type);
        CHECK(ggml_type_info(t->type, NULL, NULL, NULL), "%s: %s type %u unknown", path, name, t->type);
        json_t *ne = json_object_get(e, "ne");
        CHECK(t->n_dims == json_array_size(ne), "%s: %s n_dims %u", path, name, t->n_dims);
        for (uint32_t d = 0; d < 4; d++)
            CHECK(t->ne[d] == (d < t->n_dims ? (uint64_t)json_integer_value(json_array_get(ne, d)) : 1),
                  "%s: %s ne[%u] = %llu", path, name, d, (unsigned long long)t->ne[d]);
        CHECK(gguf_tensor_data(f, t) - f->data == json_integer_value(json_object_get(e, "offset")),
              "%s: %s data offset", path, name);
        CHECK(t->size == (uint64_t)json_integer_value(json_object_get(e, "size")), "%s: %s size %llu", path, name,
              (unsigned long long)t->size);
    }
    /* the facts the rest of spill relies on, spelled out (the fixture carries them too) */
    const char *s;
    size_t len;
    uint64_t u;
    const gguf_kv *tok = gguf_get(f, "tokenizer.ggml.tokens");
    if (strstr(path, "SmolLM2")) {
        CHECK(gguf_get_str(f, "general.architecture", &s, &len) && len == 5 && !memcmp(s, "llama", 5), "smollm arch");
        CHECK(gguf_get_u64(f, "llama.block_count", &u) && u == 30, "smollm block_count");
        CHECK(tok && tok->arr_n == 49152, "smollm vocab");
        CHECK(gguf_find_tensor(f, "blk.0.attn_q.weight") &&
                  gguf_find_tensor(f, "blk.0.attn_q.weight")->type == GGML_Q4_1,
              "smollm attn_q is Q4_1");
    } else if (strstr(path, "gemma")) {
        CHECK(gguf_get_str(f, "general.architecture", &s, &len) && len == 6 && !memcmp(s, "gemma3", 6), "gemma arch");
        CHECK(tok && tok->arr_n == 262144, "gemma vocab");
        int seen_q4k = 0, seen_q6k = 0;
        for (uint64_t k = 0; k < f->n_tensors; k++) {
            seen_q4k |= f->tensors[k].type == GGML_Q4_K;
            seen_q6k |= f->tensors[k].type == GGML_Q6_K;
        }
        CHECK(seen_q4k, "gemma has Q4_K tensors");
        (void)seen_q6k;
    }
    gguf_close(f);
}

static void check_types(json_t *types)
{
    size_t i;
    json_t *e;
    bool listed[GGML_TYPE_COUNT + 8] = {0};
    json_array_foreach(types, i, e)
    {
        uint32_t id = (uint32_t)json_integer_value(json_array_get(e, 0));
        const char *name;
        uint32_t be, bb;
        bool ok = ggml_type_info(id, &name, &be, &bb);
        if (id < GGML_TYPE_COUNT + 8)
            listed[id] = true;
        CHECK(ok, "type %u (%s) unknown to ggml_type_info", id, json_string_value(json_array_get(e, 1)));
        if (!ok)
            continue;
        CHECK(!strcmp(name, json_string_value(json_array_get(e, 1))), "type %u name %s", id, name);
        CHECK(be == json_integer_value(json_array_get(e, 2)) && bb == json_integer_value(json_array_get(e, 3)),
              "type %s block %u/%u", name, be, bb);
    }
    /* everything gguf-py cannot size (removed ids, Q2_0, >= COUNT) must be refused */
    for (uint32_t id = 0; id < GGML_TYPE_COUNT + 8; id++)
        if (!listed[id])
            CHECK(!ggml_type_info(id, NULL, NULL, NULL), "type %u should be unknown", id);
    CHECK(!ggml_type_info(UINT32_MAX, NULL, NULL, NULL), "type UINT32_MAX");
}

/* Reads "<a>\t<b>" lines; calls fn(a, b) for each. */
static void each_tsv(const char *path, void (*fn)(const char *, const char *, void *), void *ctx)
{
    char *text, err[ERRLEN];
    size_t len;
    int rc = util_read_file(path, 16u << 20, &text, &len, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc)
        return;
    for (char *line = text, *next; *line; line = next) {
        next = strchr(line, '\n');
        next = next ? (*next = 0, next + 1) : line + strlen(line);
        char *tab = strchr(line, '\t');
        CHECK(tab != NULL, "%s: bad line '%s'", path, line);
        if (tab) {
            *tab = 0;
            fn(line, tab + 1, ctx);
        }
    }
    free(text);
}

typedef struct blob {
    char *data;
    size_t len;
    const char *name;
    int n;
} blob;

static void check_cut(const char *cut_s, const char *want, void *ctx)
{
    blob *b = ctx;
    size_t cut = strtoull(cut_s, NULL, 10);
    uint8_t *p = exact_copy(b->data, cut);
    char err[ERRLEN] = "";
    gguf_file *f = NULL;
    int rc = gguf_parse(p, cut, b->name, &f, err, sizeof err);
    CHECK(rc < 0 && f == NULL, "cut %zu accepted", cut);
    CHECK(!strcmp(err, want), "cut %zu:\n  got  %s\n  want %s", cut, err, want);
    gguf_close(f);
    free(p);
    b->n++;
}

static void check_bad(const char *fname, const char *want, void *ctx)
{
    if (strncmp(fname, "gguf_", 5))
        return;
    int *n = ctx;
    char path[512], err[ERRLEN] = "", err2[ERRLEN] = "";
    util_pathf(path, sizeof path, "tests/data/bad/%s", fname);
    gguf_file *f = NULL;
    int rc = gguf_open(path, &f, err, sizeof err);
    CHECK(rc < 0 && f == NULL, "%s accepted", fname);
    CHECK(!strcmp(err, want), "%s:\n  got  %s\n  want %s", fname, err, want);
    CHECK(one_sentence(err), "%s: not one sentence: %s", fname, err);
    gguf_close(f);
    char *data;
    size_t len;
    if (util_read_file(path, 1u << 20, &data, &len, err2, sizeof err2) == 0) {
        uint8_t *p = exact_copy(data, len);
        rc = gguf_parse(p, len, path, &f, err2, sizeof err2);
        CHECK(rc < 0 && !strcmp(err2, want), "%s from memory: %s", fname, err2);
        gguf_close(f);
        free(p);
        free(data);
    }
    (*n)++;
}

static void check_api(void)
{
    char err[ERRLEN];
    gguf_file *f;
    gguf_close(NULL);
    CHECK(gguf_open("tests/data/gguf/does-not-exist.gguf", &f, err, sizeof err) < 0 && f == NULL && one_sentence(err),
          "missing file: %s", err);
    CHECK(gguf_open("tests/data/gguf", &f, err, sizeof err) < 0 && one_sentence(err), "directory: %s", err);
    if (gguf_open("tests/data/gguf/good_writer.gguf", &f, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *s;
    size_t len;
    CHECK(gguf_get(f, "no.such.key") == NULL, "absent key");
    CHECK(!gguf_get_u64(f, "test.i8", &u), "u64 of a negative i8");
    CHECK(gguf_get_i64(f, "test.i8", &i) && i == -5, "i64 of i8");
    CHECK(!gguf_get_i64(f, "test.u64", &i), "i64 of u64 > INT64_MAX");
    CHECK(gguf_get_u64(f, "test.u64", &u) && u == (1ull << 63) + 5, "u64 2^63+5");
    CHECK(!gguf_get_u64(f, "test.str", &u) && !gguf_get_f64(f, "test.str", &d) && !gguf_get_bool(f, "test.str", &b),
          "typed getters refuse a string");
    CHECK(!gguf_get_str(f, "test.u8", &s, &len), "string getter refuses u8");
    CHECK(gguf_get_f64(f, "test.f32", &d) && d == (double)0.1f, "f32 0.1");
    const gguf_kv *tok = gguf_get(f, "test.tokens"), *sc = gguf_get(f, "test.scores");
    CHECK(tok && gguf_arr_str(f, tok, 4, &len) && len == 6 && !memcmp(gguf_arr_str(f, tok, 4, &len), "日本", 6),
          "tokens[4]");
    CHECK(tok && gguf_arr_str(f, tok, 1, &len) && len == 0, "empty token");
    CHECK(tok && !gguf_arr_str(f, tok, 5, &len), "tokens[5] out of range");
    CHECK(tok && isnan(gguf_arr_num(tok, 0)), "arr_num of a string array");
    CHECK(sc && gguf_arr_num(sc, 1) == -1.25 && isnan(gguf_arr_num(sc, 3)), "scores");
    CHECK(sc && !gguf_arr_str(f, sc, 0, &len), "arr_str of a float array");
    CHECK(gguf_find_tensor(f, "nope") == NULL, "absent tensor");
    CHECK(gguf_get_u64(f, "test.i64pos", &u) && u == 42, "u64 of a positive i64");
    const gguf_kv *u8a = gguf_get(f, "test.u8arr"), *ba = gguf_get(f, "test.boolarr");
    CHECK(u8a && u8a->arr_type == GGUF_V_U8 && gguf_arr_num(u8a, 2) == 255.0, "u8 array");
    CHECK(ba && ba->arr_type == GGUF_V_BOOL && gguf_arr_num(ba, 0) == 1.0 && gguf_arr_num(ba, 1) == 0.0, "bool array");
    CHECK(gguf_arr_num(NULL, 0) != gguf_arr_num(NULL, 0), "arr_num(NULL) is NaN");
    gguf_close(f);
}

int main(void)
{
    char err[ERRLEN];
    json_error_t je;
    json_t *root = json_load_file("tests/data/gguf/expected.json", 0, &je);
    CHECK(root != NULL, "expected.json: %s (run tools/make_bad_models.py)", je.text);
    if (root) {
        check_types(json_object_get(root, "types"));
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(root, "models"), i, m) check_model(m);
        CHECK(json_array_size(json_object_get(root, "models")) == 5, "fixture covers 5 files");
        json_decref(root);
    }
    check_api();

    blob b = {.name = "tests/data/gguf/good_min.gguf"};
    if (util_read_file(b.name, 1u << 20, &b.data, &b.len, err, sizeof err) == 0) {
        each_tsv("tests/data/gguf/truncations.tsv", check_cut, &b);
        CHECK(b.n == (int)b.len, "truncations.tsv covers %d of %zu cuts", b.n, b.len);
        /* v2 has the v3 layout: the same bytes with version 2 must parse */
        uint8_t *v2 = exact_copy(b.data, b.len);
        v2[4] = 2;
        gguf_file *f = NULL;
        CHECK(gguf_parse(v2, b.len, "v2", &f, err, sizeof err) == 0 && f->version == 2 && f->n_tensors == 2, "v2: %s",
              err);
        gguf_close(f);
        free(v2);
        free(b.data);
    } else
        CHECK(0, "%s", err);
    int nbad = 0;
    each_tsv("tests/data/bad/expected.tsv", check_bad, &nbad);
    CHECK(nbad >= 60, "only %d malformed GGUF files", nbad);
    fprintf(stderr, "gguf: %d truncation cuts, %d malformed files\n", b.n, nbad);
    return test_finish("test_gguf");
}
