/*
 * test_safetensors.c — the safetensors reader against the reference writer/reader and the malformed corpus.
 *
 * 1. tests/data/safetensors/good/{single,sharded,dtypes} were written by the reference writer
 *    (safetensors.numpy.save_file / serialize_file); expected.json holds what the reference reader
 *    (safetensors.deserialize) returns for every tensor: dtype, shape, byte count and the sha256 of its
 *    bytes.  st_model_open must find every tensor, and the bytes at its absolute offset must hash the
 *    same: exact equality, there is nothing approximate here.
 * 2. good/single/model.safetensors cut at every byte must fail with the sentence in truncations.tsv
 *    (parsed from an exact-size heap copy, so ASan sees any read past the cut).
 * 3. Every st_* entry of tests/data/bad/expected.tsv must fail with its golden sentence: files through
 *    st_open and st_parse_file_image, directories through st_model_open.
 * Allocations above 64 MiB fail in this binary (see test_gguf.c for why).
 */
#include "model/safetensors.h"
#include "test.h"
#include "base/util.h"

#include <fcntl.h>
#include <jansson.h>
#include <unistd.h>

const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1:max_allocation_size_mb=64";
}

#define ERRLEN 1024
#define GOOD "tests/data/safetensors/good"

static bool one_sentence(const char *e)
{
    size_t n = strlen(e);
    return n > 2 && e[n - 1] == '.' && !strchr(e, '\n');
}

static uint8_t *exact_copy(const void *data, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    if (p && len)
        memcpy(p, data, len);
    return p;
}

/* sha256 of the tensor's bytes read from its shard at its absolute offset. */
static void tensor_sha(const st_model *m, const st_tensor *t, char hex[65])
{
    const st_file *f = m->shards[t->shard];
    uint8_t *buf = malloc(t->size ? t->size : 1);
    int fd = open(f->path, O_RDONLY);
    ssize_t got = fd >= 0 ? pread(fd, buf, t->size, (off_t)t->offset) : -1;
    CHECK(got == (ssize_t)t->size, "%s: read %zd of %llu bytes", t->name, got, (unsigned long long)t->size);
    if (fd >= 0)
        close(fd);
    util_sha256_hex(buf, t->size, hex);
    free(buf);
}

static void check_model(const char *dir, json_t *want)
{
    char path[512], err[ERRLEN];
    util_pathf(path, sizeof path, "%s/%s", GOOD, dir);
    st_model *m;
    int rc = st_model_open(path, &m, err, sizeof err);
    CHECK(rc == 0, "%s: %s", path, err);
    if (rc)
        return;
    CHECK(m->n_tensors == json_object_size(want), "%s: %zu tensors, want %zu", dir, m->n_tensors,
          json_object_size(want));
    const char *name;
    json_t *e;
    json_object_foreach(want, name, e)
    {
        const st_tensor *t = st_model_find(m, name);
        CHECK(t != NULL, "%s: tensor %s missing", dir, name);
        if (!t)
            continue;
        CHECK(!strcmp(st_dtype_name(t->dtype), json_string_value(json_object_get(e, "dtype"))), "%s: %s dtype %s", dir,
              name, st_dtype_name(t->dtype));
        json_t *shape = json_object_get(e, "shape");
        CHECK(t->n_dims == json_array_size(shape), "%s: %s n_dims %u", dir, name, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && d < json_array_size(shape); d++)
            CHECK(t->shape[d] == (uint64_t)json_integer_value(json_array_get(shape, d)), "%s: %s shape[%u]", dir, name,
                  d);
        CHECK(t->size == (uint64_t)json_integer_value(json_object_get(e, "size")), "%s: %s size %llu", dir, name,
              (unsigned long long)t->size);
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *sp = m->shards[t->shard]->path, *base = strrchr(sp, '/');
        CHECK(!strcmp(base ? base + 1 : sp, file), "%s: %s in %s, want %s", dir, name, sp, file);
        char hex[65];
        tensor_sha(m, t, hex);
        CHECK(!strcmp(hex, json_string_value(json_object_get(e, "sha256"))), "%s: %s bytes differ", dir, name);
    }
    /* each file's tensors come sorted by offset and tile its data buffer */
    for (size_t s = 0; s < m->n_shards; s++) {
        const st_file *f = m->shards[s];
        uint64_t pos = 8 + f->header_len;
        for (size_t i = 0; i < f->n_tensors; i++) {
            CHECK(f->tensors[i].offset == pos, "%s: tensor %zu offset", f->path, i);
            pos += f->tensors[i].size;
        }
        CHECK(pos == f->file_size, "%s: tensors end at %llu", f->path, (unsigned long long)pos);
    }
    CHECK(st_model_find(m, "no.such.tensor") == NULL, "absent tensor");
    st_model_close(m);
}

static void check_single_meta(void)
{
    char err[ERRLEN];
    st_file *f;
    if (st_open(GOOD "/single/model.safetensors", &f, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    int seen = 0;
    for (size_t i = 0; i < f->n_meta; i++) {
        seen += !strcmp(f->meta_keys[i], "format") && !strcmp(f->meta_vals[i], "np");
        seen += !strcmp(f->meta_keys[i], "note") && !strcmp(f->meta_vals[i], "spill test");
    }
    CHECK(f->n_meta == 2 && seen == 2, "__metadata__ has %zu entries", f->n_meta);
    st_close(f);
    st_close(NULL);
    st_model_close(NULL);
}

static void check_dtypes(void)
{
    static const struct {
        const char *name;
        uint32_t bits;
    } want[] = {{"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
                {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
                {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
                {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64}};
    CHECK(sizeof want / sizeof want[0] == ST_DTYPE_COUNT, "dtype table size");
    for (uint32_t d = 0; d < ST_DTYPE_COUNT; d++)
        CHECK(!strcmp(st_dtype_name(d), want[d].name) && st_dtype_bits(d) == want[d].bits, "dtype %u: %s/%u", d,
              st_dtype_name(d), st_dtype_bits(d));
    CHECK(st_dtype_bits(ST_DTYPE_COUNT) == 0, "out-of-range dtype");
}

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
    st_file *f = NULL;
    int rc = st_parse_file_image(p, cut, b->name, &f, err, sizeof err);
    CHECK(rc < 0 && f == NULL, "cut %zu accepted", cut);
    CHECK(!strcmp(err, want), "cut %zu:\n  got  %s\n  want %s", cut, err, want);
    st_close(f);
    free(p);
    b->n++;
}

static void check_bad(const char *fname, const char *want, void *ctx)
{
    if (strncmp(fname, "st_", 3))
        return;
    int *n = ctx;
    char path[512], err[ERRLEN] = "";
    util_pathf(path, sizeof path, "tests/data/bad/%s", fname);
    int rc;
    if (util_is_dir(path)) {
        st_model *m = NULL;
        rc = st_model_open(path, &m, err, sizeof err);
        CHECK(rc < 0 && m == NULL, "%s accepted", fname);
    } else {
        st_file *f = NULL;
        rc = st_open(path, &f, err, sizeof err);
        CHECK(rc < 0 && f == NULL, "%s accepted", fname);
        char *data, err2[ERRLEN] = "";
        size_t len;
        if (util_read_file(path, 1u << 20, &data, &len, err2, sizeof err2) == 0) {
            uint8_t *p = exact_copy(data, len);
            rc = st_parse_file_image(p, len, path, &f, err2, sizeof err2);
            CHECK(rc < 0 && !strcmp(err2, want), "%s from memory: %s", fname, err2);
            free(p);
            free(data);
        }
    }
    CHECK(!strcmp(err, want), "%s:\n  got  %s\n  want %s", fname, err, want);
    CHECK(one_sentence(err), "%s: not one sentence: %s", fname, err);
    (*n)++;
}

int main(void)
{
    char err[ERRLEN];
    json_error_t je;
    json_t *root = json_load_file("tests/data/safetensors/expected.json", 0, &je);
    CHECK(root != NULL, "expected.json: %s (run tools/make_bad_models.py)", je.text);
    if (root) {
        const char *dir;
        json_t *want;
        json_object_foreach(json_object_get(root, "models"), dir, want) check_model(dir, want);
        CHECK(json_object_size(json_object_get(root, "models")) == 4, "fixture covers 4 models");
        json_decref(root);
    }
    /* a model given as a file path, and st_open directly */
    st_model *m;
    CHECK(st_model_open(GOOD "/dtypes/model.safetensors", &m, err, sizeof err) == 0 && m->n_tensors == 6,
          "file path: %s", err);
    st_model_close(m);
    CHECK(st_model_open("tests/data/safetensors/none", &m, err, sizeof err) < 0 && one_sentence(err), "%s", err);
    st_file *f;
    CHECK(st_open(GOOD, &f, err, sizeof err) < 0 && f == NULL && one_sentence(err), "directory: %s", err);
    CHECK(st_open(GOOD "/missing.safetensors", &f, err, sizeof err) < 0 && one_sentence(err), "missing: %s", err);
    /* the header-only entry point checks N against the file size itself */
    CHECK(st_parse_header("{}", 2, 9, "hdr", &f, err, sizeof err) < 0 && f == NULL &&
              !strcmp(err, "hdr: byte 0: header length 2 does not fit in the 9-byte file; the file is truncated or "
                           "corrupt."),
          "st_parse_header: %s", err);
    CHECK(st_parse_header("{}", 2, 10, "hdr", &f, err, sizeof err) == 0 && f->n_tensors == 0, "empty model: %s", err);
    st_close(f);
    char longdir[4200];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = 0;
    CHECK(st_model_open(longdir, &m, err, sizeof err) < 0 && m == NULL && strlen(err) == sizeof err - 1,
          "long path: %.80s", err); /* the sentence names the 4 KB path, so it is cut at the buffer */
    check_single_meta();
    check_dtypes();

    blob b = {.name = GOOD "/single/model.safetensors"};
    if (util_read_file(b.name, 1u << 20, &b.data, &b.len, err, sizeof err) == 0) {
        each_tsv("tests/data/safetensors/truncations.tsv", check_cut, &b);
        CHECK(b.n == (int)b.len, "truncations.tsv covers %d of %zu cuts", b.n, b.len);
        free(b.data);
    } else
        CHECK(0, "%s", err);
    int nbad = 0;
    each_tsv("tests/data/bad/expected.tsv", check_bad, &nbad);
    CHECK(nbad >= 50, "only %d malformed safetensors cases", nbad);
    fprintf(stderr, "safetensors: %d truncation cuts, %d malformed cases\n", b.n, nbad);
    return test_finish("test_safetensors");
}
