/*
 * fuzz_safetensors.c — libFuzzer target: any byte string as a whole safetensors file image
 * through st_parse_file_image.  On success the first and last byte of every tensor is
 * read, so an accepted range outside the image shows up under ASan.
 */
#include "model/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    st_file *f;
    if (st_parse_file_image(data, size, "fuzz.safetensors", &f, err, sizeof err)) {
        if (!memchr(err, 0, sizeof err) || err[0] == 0)
            abort();
        return 0;
    }
    volatile uint64_t sink = 0;
    uint64_t end = 8 + f->header_len;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (t->offset != end || st_dtype_bits(t->dtype) == 0)
            abort(); /* sorted, contiguous, known dtype */
        if (t->size)
            sink += data[t->offset] + data[t->offset + t->size - 1];
        end += t->size;
    }
    if (end != size)
        abort();
    for (size_t i = 0; i < f->n_meta; i++)
        sink += (uint8_t)f->meta_keys[i][0] + (uint8_t)f->meta_vals[i][0];
    (void)sink;
    st_close(f);
    return 0;
}
