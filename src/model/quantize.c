/*
 * quantize.c — fp32 → Q8_0 / Q4_0 / Q4_1 blocks, fp8 rows and F32 / F16 / BF16 rows.
 *
 * Block layouts (ggml-common.h; fp16 = IEEE half, little-endian):
 *   Q8_0  half d; i8 qs[32]            34 bytes   x[j] ≈ qs[j]*d
 *   Q4_0  half d; u8 qs[16]            18 bytes   x[j] ≈ (lo nibble - 8)*d, x[j+16] ≈ (hi nibble - 8)*d
 *   Q4_1  half d, m; u8 qs[16]         20 bytes   x[j] ≈ lo*d + m,          x[j+16] ≈ hi*d + m
 *
 * Key decision: the arithmetic is ggml's reference (quantize_row_*_ref), not
 * a search for the least-error scale (ggml's importance-matrix quantizers):
 * the result is reproducible against gguf-py byte for byte, and the error is
 * what every other tool that writes these types gives.  The scale rules:
 *   Q8_0: d = amax/127, q = roundf(x/d)                (round half away from zero)
 *   Q4_0: d = max/-8 where max is the signed value of largest magnitude
 *         (first one on ties), q = min(15, trunc(x/d + 8.5))
 *   Q4_1: d = (max-min)/15, m = min, q = min(15, trunc((x-m)/d + 0.5))
 * "x/d" is x * (1/d) computed as in the reference (1/d rounded once).
 *
 * fp8 rows (spill's GGML_F8_E4M3_ROW, gguf.h): one fp32 scale per row of K,
 * s = amax/448 (448 = E4M3FN's largest finite value, so the row's largest
 * element lands on it), code = e4m3(x / s) with the division IEEE-rounded
 * and the conversion round-to-nearest-even (quant_fp32_to_e4m3); a row of
 * zeros gets s = 0 and zero codes.  Per row, not per 128x128 block, because
 * that is what the GPU's FP8 GEMM applies after the product (cuBLASLt's
 * outer-vector scales: one per weight row, one per token), so no weight is
 * ever dequantized on the GPU.  The same arithmetic quantizes activations
 * per token on the GPU (src/cuda/fp8.cu).
 */
#include "quantize.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

#define QK 32

static void put_half(uint8_t *p, float f)
{
    uint16_t h = quant_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

static void q8_0_block(const float *x, uint8_t *y)
{
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    for (int j = 0; j < QK; j++) {
        const float x0 = x[j] * id;
        y[2 + j] = (uint8_t)(int8_t)roundf(x0);
    }
}

static void q4_0_block(const float *x, uint8_t *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    for (int j = 0; j < QK / 2; j++) {
        const float x0 = x[j] * id;
        const float x1 = x[QK / 2 + j] * id;
        const int8_t i0 = (int8_t)(x0 + 8.5f), i1 = (int8_t)(x1 + 8.5f);
        const uint8_t xi0 = (uint8_t)(i0 < 15 ? i0 : 15), xi1 = (uint8_t)(i1 < 15 ? i1 : 15);
        y[2 + j] = (uint8_t)(xi0 | (xi1 << 4));
    }
}

static void q4_1_block(const float *x, uint8_t *y)
{
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < min)
            min = x[j];
        if (x[j] > max)
            max = x[j];
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    put_half(y, d);
    put_half(y + 2, min);
    for (int j = 0; j < QK / 2; j++) {
        const float x0 = (x[j] - min) * id;
        const float x1 = (x[QK / 2 + j] - min) * id;
        const int8_t i0 = (int8_t)(x0 + 0.5f), i1 = (int8_t)(x1 + 0.5f);
        const uint8_t xi0 = (uint8_t)(i0 < 15 ? i0 : 15), xi1 = (uint8_t)(i1 < 15 ? i1 : 15);
        y[4 + j] = (uint8_t)(xi0 | (xi1 << 4));
    }
}

bool quantize_type_supported(uint32_t type)
{
    return type == GGML_F32 || type == GGML_F16 || type == GGML_BF16 || type == GGML_Q8_0 || type == GGML_Q4_0 ||
           type == GGML_Q4_1 || type == GGML_F8_E4M3_ROW;
}

static void f8_row(const float *x, uint8_t *y, int64_t n)
{
    float amax = 0.0f;
    for (int64_t j = 0; j < n; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float s = amax / 448.0f;
    memcpy(y, &s, 4);
    memset(y + 4, 0, 12);
    for (int64_t j = 0; j < n; j++)
        y[16 + j] = s != 0 ? quant_fp32_to_e4m3(x[j] / s) : 0;
}

int quantize_row(uint32_t type, const float *x, void *dst, int64_t n)
{
    uint8_t *y = dst;
    if (n < 0)
        return -1;
    switch (type) {
    case GGML_F32:
        memcpy(y, x, (size_t)n * sizeof *x);
        return 0;
    case GGML_F16:
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = type == GGML_F16 ? quant_fp32_to_fp16(x[i]) : quant_fp32_to_bf16(x[i]);
            memcpy(y + 2 * i, &h, 2);
        }
        return 0;
    case GGML_F8_E4M3_ROW:
        if (n % 16)
            return -1;
        f8_row(x, y, n);
        return 0;
    case GGML_Q8_0:
    case GGML_Q4_0:
    case GGML_Q4_1:
        break;
    default:
        return -1;
    }
    if (n % QK)
        return -1;
    size_t bb = type == GGML_Q8_0 ? 34 : type == GGML_Q4_0 ? 18 : 20;
    for (int64_t b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        uint8_t *yb = y + (size_t)b * bb;
        if (type == GGML_Q8_0)
            q8_0_block(xb, yb);
        else if (type == GGML_Q4_0)
            q4_0_block(xb, yb);
        else
            q4_1_block(xb, yb);
    }
    return 0;
}
