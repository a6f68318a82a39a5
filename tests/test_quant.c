/*
 * test_quant.c — weight dequantization and fp16/bf16 conversion against the
 * reference (gguf-py's numpy port of ggml-quants.c), fixtures written by
 * tools/gen_quant_fixtures.py into tests/data/quant/dequant.bin.
 *
 * Tolerance, decided before looking: none.  Both sides perform the same IEEE
 * fp32 operations in the same order on the same inputs (e.g. Q4_K:
 * (d*sc)*q - dmin*m with two roundings; gguf-py computes it with numpy fp32
 * arrays, ggml in C without FMA), and fp16/bf16 -> fp32 is exact, so every
 * value must match bit for bit.  A last-ulp difference would mean a different
 * operation order (e.g. an FMA contraction) and is treated as a failure.  The
 * same holds for the SIMD path against the scalar path.
 */
#include "model/gguf.h"
#include "model/quant.h"
#include "base/settings.h"
#include "base/util.h"
#include "test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE "tests/data/quant/dequant.bin"

static uint32_t rd_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Number of elements whose bits differ; reports the first. */
static int64_t bit_diff(const char *what, uint32_t type, const float *got, const float *exp, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &exp[i], 4) != 0) {
            if (!bad)
                fprintf(stderr, "  %s %s: element %lld got %.9g expected %.9g\n", what, quant_type_name(type),
                        (long long)i, got[i], exp[i]);
            bad++;
        }
    }
    return bad;
}

static void test_fixture(void)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    FILE *f = fopen(FIXTURE, "rb");
    CHECK(f != NULL, "cannot open %s (run tools/gen_quant_fixtures.py)", FIXTURE);
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(len);
    CHECK(buf && fread(buf, 1, len, f) == len, "read %s", FIXTURE);
    fclose(f);
    if (!buf)
        return;
    CHECK(len >= 12 && memcmp(buf, "SPQD", 4) == 0 && rd_u32(buf + 4) == 1, "fixture magic/version");
    uint32_t n_cases = rd_u32(buf + 8);
    size_t off = 12;
    int types_seen[64] = {0};
    int64_t total_elems = 0;
    for (uint32_t c = 0; c < n_cases; c++) {
        if (off + 12 > len) {
            CHECK(0, "fixture truncated at case %u", c);
            break;
        }
        uint32_t type = rd_u32(buf + off), n = rd_u32(buf + off + 4), nb = rd_u32(buf + off + 8);
        off += 12;
        if (off + nb + (size_t)n * 4 > len) {
            CHECK(0, "fixture truncated in case %u", c);
            break;
        }
        const uint8_t *raw = buf + off;
        float *exp = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        memcpy(exp, buf + off + nb, (size_t)n * 4);
        off += nb + (size_t)n * 4;

        size_t rb = 0;
        CHECK(quant_row_bytes(type, n, &rb) == 0 && rb == nb, "%s: row bytes %zu vs fixture %u", quant_type_name(type),
              rb, nb);

        memset(got, 0xff, (size_t)n * 4);
        CHECK(quant_dequant_row_scalar(type, raw, got, n) == 0, "scalar dequant %s", quant_type_name(type));
        CHECK(bit_diff("scalar", type, got, exp, n) == 0, "scalar %s n=%u matches gguf-py bit for bit",
              quant_type_name(type), n);

        if (quant_simd_available()) {
            quant_simd_force(true);
            memset(got, 0xff, (size_t)n * 4);
            CHECK(quant_dequant_row(type, raw, got, n) == 0, "simd dequant %s", quant_type_name(type));
            CHECK(bit_diff("simd", type, got, exp, n) == 0, "simd %s n=%u matches gguf-py bit for bit",
                  quant_type_name(type), n);
        }
        quant_simd_force(false);
        memset(got, 0xff, (size_t)n * 4);
        CHECK(quant_dequant_row(type, raw, got, n) == 0 && bit_diff("forced-scalar", type, got, exp, n) == 0,
              "dispatch with SIMD off %s", quant_type_name(type));
        quant_simd_force(true);

        if (type < 64)
            types_seen[type] = 1;
        total_elems += n;
        free(exp);
        free(got);
    }
    uint32_t want[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                       GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q8_K};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(types_seen[want[i]], "fixture covers %s", quant_type_name(want[i]));
    fprintf(stderr, "  dequant: %u cases, %lld elements compared (scalar%s)\n", n_cases, (long long)total_elems,
            quant_simd_available() ? " + AVX2" : " only");

    /* conversion section */
    if (off + 4 <= len) {
        uint32_t n = rd_u32(buf + off);
        off += 4;
        CHECK(off + (size_t)n * 8 == len, "conversion section size");
        if (off + (size_t)n * 8 == len) {
            int bad16 = 0, badb = 0;
            for (uint32_t i = 0; i < n; i++) {
                float x;
                uint16_t e16, eb;
                memcpy(&x, buf + off + 4 * i, 4);
                memcpy(&e16, buf + off + 4 * n + 2 * i, 2);
                memcpy(&eb, buf + off + 6 * n + 2 * i, 2);
                if (quant_fp32_to_fp16(x) != e16 && bad16++ < 3)
                    fprintf(stderr, "  fp16(%.9g) = %04x, numpy %04x\n", x, quant_fp32_to_fp16(x), e16);
                if (quant_fp32_to_bf16(x) != eb && badb++ < 3)
                    fprintf(stderr, "  bf16(%.9g) = %04x, gguf-py %04x\n", x, quant_fp32_to_bf16(x), eb);
            }
            CHECK(bad16 == 0, "fp32->fp16 matches numpy on %u values (%d differ)", n, bad16);
            CHECK(badb == 0, "fp32->bf16 matches gguf-py on %u values (%d differ)", n, badb);
        }
    } else {
        CHECK(0, "fixture has no conversion section");
    }
    free(buf);
}

/* Every fp16 bit pattern: exact round trip, and agreement with F16C. */
static void test_fp16_exhaustive(void)
{
    int bad_rt = 0, bad_nan = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_fp16_to_fp32((uint16_t)h);
        bool is_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
        if (is_nan) {
            bad_nan += !(f != f) || quant_fp32_to_fp16(f) == 0;
            continue;
        }
        bad_rt += quant_fp32_to_fp16(f) != h;
    }
    CHECK(bad_rt == 0, "fp16 -> fp32 -> fp16 is the identity on all non-NaN patterns (%d differ)", bad_rt);
    CHECK(bad_nan == 0, "fp16 NaNs stay NaN (%d not)", bad_nan);
    /* bf16 round trip on a sweep */
    int bad_b = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        if (((b >> 7) & 0xff) == 0xff && (b & 0x7f))
            continue;
        bad_b += quant_fp32_to_bf16(quant_bf16_to_fp32((uint16_t)b)) != b;
    }
    CHECK(bad_b == 0, "bf16 round trip (%d differ)", bad_b);
    /* F16 row through the SIMD path equals the scalar conversion for every pattern */
    if (quant_simd_available()) {
        static uint16_t all[65536];
        static float a[65536], b[65536];
        for (uint32_t h = 0; h < 65536; h++)
            all[h] = (uint16_t)h;
        quant_simd_force(true);
        quant_dequant_row(GGML_F16, all, a, 65536);
        quant_dequant_row_scalar(GGML_F16, all, b, 65536);
        int bad = 0;
        for (int i = 0; i < 65536; i++) {
            bool nan = a[i] != a[i];
            bad += nan ? !(b[i] != b[i]) : memcmp(&a[i], &b[i], 4) != 0;
        }
        CHECK(bad == 0, "F16C conversion equals the scalar conversion on all 65536 patterns (%d differ)", bad);
    }
}

static void test_sizes_and_errors(void)
{
    size_t b = 0;
    CHECK(quant_row_bytes(GGML_Q4_K, 2048, &b) == 0 && b == 8 * 144, "Q4_K row bytes");
    CHECK(quant_row_bytes(GGML_Q4_1, 576, &b) == 0 && b == 18 * 20, "Q4_1 row bytes");
    CHECK(quant_row_bytes(GGML_F16, 7, &b) == 0 && b == 14, "F16 row bytes");
    CHECK(quant_row_bytes(GGML_Q6_K, 100, &b) == -1, "Q6_K rejects a partial block");
    CHECK(quant_row_bytes(GGML_Q8_0, -32, &b) == -1, "negative count rejected");
    CHECK(quant_row_bytes(GGML_Q2_K, 256, &b) == -1, "unsupported type rejected");
    CHECK(quant_row_bytes(GGML_F32, INT64_MAX, &b) == -1, "overflow rejected");
    CHECK(!quant_type_supported(GGML_Q3_K) && !quant_type_supported(99), "unsupported types");
    float y[64];
    uint8_t blk[64] = {0};
    CHECK(quant_dequant_row(GGML_Q4_0, blk, y, 31) == -1, "dequant rejects partial block");
    CHECK(quant_dequant_row(GGML_Q2_K, blk, y, 256) == -1, "dequant rejects unsupported type");
    CHECK(strcmp(quant_type_name(GGML_Q5_K), "Q5_K") == 0, "type name");
    CHECK(quant_block_elems(GGML_Q8_K) == 256 && quant_block_bytes(GGML_Q8_K) == 292, "Q8_K block");
}

int main(void)
{
    /* SPILL_NO_SIMD=1 reaches the library as main()'s quant_simd_force(false) (base/settings.h) */
    setenv("SPILL_NO_SIMD", "1", 1);
    spill_settings st;
    char err[SPILL_ERRLEN];
    CHECK(settings_from_env(&st, err, sizeof err) == 0 && st.no_simd, "SPILL_NO_SIMD=1 is read as no_simd");
    CHECK(quant_simd_active() == quant_simd_available(), "the library does not read the environment itself");
    CHECK(!quant_simd_force(false) && !quant_simd_active(), "force off selects the scalar path");
    CHECK(quant_simd_force(true) == quant_simd_available(), "force on where the CPU allows");
    setenv("SPILL_CUDA_ATT", "fp16", 1);
    CHECK(settings_from_env(&st, err, sizeof err) != 0 && strstr(err, "SPILL_CUDA_ATT=fp16"),
          "an unknown value is refused with a sentence: %s", err);
    unsetenv("SPILL_CUDA_ATT");
    test_sizes_and_errors();
    test_fp16_exhaustive();
    test_fixture();
    return test_finish("test_quant");
}
