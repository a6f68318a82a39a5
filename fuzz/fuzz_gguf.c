/*
 * fuzz_gguf.c — libFuzzer target: any byte string through gguf_parse.  On success every
 * accessor is exercised over every key, array element and tensor, so a parse that
 * accepted inconsistent offsets shows up as an out-of-bounds read under ASan.
 */
#include "model/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    gguf_file *f;
    if (gguf_parse(data, size, "fuzz.gguf", &f, err, sizeof err)) {
        if (!memchr(err, 0, sizeof err) || err[0] == 0)
            abort(); /* every failure must leave one NUL-terminated sentence */
        return 0;
    }
    volatile uint64_t sink = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (gguf_get(f, kv->key) != kv)
            abort();
        if (kv->type == GGUF_V_STRING && kv->v.s.len)
            sink += (uint8_t)kv->v.s.p[kv->v.s.len - 1];
        if (kv->type != GGUF_V_ARRAY)
            continue;
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            size_t len;
            const char *s = gguf_arr_str(f, kv, j, &len);
            if (s && len)
                sink += (uint8_t)s[0] + (uint8_t)s[len - 1];
            else if (!s)
                sink += (uint64_t)gguf_arr_num(kv, j);
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (gguf_find_tensor(f, t->name) != t)
            abort();
        const uint8_t *p = gguf_tensor_data(f, t);
        sink += p[0] + p[t->size - 1];
    }
    (void)sink;
    gguf_close(f);
    return 0;
}
