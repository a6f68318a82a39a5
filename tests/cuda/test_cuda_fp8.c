/*
 * test_cuda_fp8.c — the GPU's fp8 GEMM (src/cuda/fp8.cu) against the CPU (the oracle), op by op and end to end.
 *
 * Tolerances, fixed before the first GPU run:
 *  - activation quantizer: bf16(x) per token to E4M3 codes and a scale amax/448, bit-identical to the host's
 *    quant_fp32_to_bf16 then quantize_row(GGML_F8_E4M3_ROW) (IEEE division, round to nearest even, saturation
 *    on both sides), zero and outlier rows included.
 *  - GEMM against an emulation on the host with the same operands (the weights' fp8 rows decoded, the
 *    activations' codes decoded with their scales, products summed in double): E4M3 x E4M3 products are exact
 *    in fp32, so only the accumulation differs: the tensor cores' partial sums keep about 14 bits before
 *    cuBLASLt promotes them to fp32 (DeepSeek-V3 report, §3.3.2, measured on H800), i.e. ~2^-13 of the sum
 *    of |terms| per promoted chunk, and the two scalings add 2^-23.  Bound per output:
 *    |dy| <= 2^-9 * sum_k |xq_k wq_k| (16x that).  A wrong scale, row, transpose or stride moves outputs
 *    by O(|y|) and fails it.  With CUBLASLT_MATMUL_DESC_FAST_ACCUM (no promotion) only the oracle bound
 *    below is asserted.
 *  - GEMM against the CPU fp8 matmul (cpu_matmul on the fp8 rows with exact fp32 activations): the GPU's
 *    activations carry bf16 rounding (2^-9 relative) and E4M3 rounding (half a step: 2^-4 relative, or
 *    2^-10 xs below the normal range), so |dy| <= (2^-4 + 2^-8) sum_k |x_k w_k| + 2^-10 xs sum_k |w_k| +
 *    2^-9 sum_k |xq_k wq_k| per output (worst case), and, since the roundings are independent with random
 *    signs, ||dy|| / ||y|| <= 0.05 over the whole output (E4M3's rms relative rounding is ~2.4% for values
 *    spread over binades; twice that).
 *  - Every mode: auto, outer-vector scales in cuBLASLt, unit scales then the scaling kernel.  If this cuBLASLt
 *    refuses outer-vector scales, that mode is reported (not failed) and auto must have fallen back.
 *  - End to end: the fp32 reference model tests/data/ref/llama_gqa_s64 packed --quant fp8 on the CUDA engine
 *    against the CPU engine on the same file: the GPU's only extra rounding is the activations' (above, ~2.5%
 *    per GEMM input, bf16 and E4M3), through 2 layers, which on this model amplify a relative error ~5x
 *    (measured on the CPU for q8, bf16, q4 and fp8 weights: test_fp8.c's history), so relative L2 of the last
 *    logits <= 0.15 and max |d log-softmax| <= 0.8 rms(logits) (test_fp8.c's argument); streamed and resident
 *    GPU passes bit-identical.
 */
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "cuda/cuda_test.h"
#include "engine/cpu.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/pack.h"
#include "model/quant.h"
#include "model/quantize.h"
#include "test.h"
#include "base/util.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static float frand(float lo, float hi)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) & 0xffffff) / (float)0x1000000;
}

/* x (T, K): mostly uniform, a few outliers per row (activations have them), one zero row when T > 2. */
static void fill_x(float *x, int64_t T, int64_t K)
{
    for (int64_t i = 0; i < T * K; i++)
        x[i] = frand(-1, 1) * (i % 97 == 0 ? 40.0f : 1.0f) * (i % 13 == 0 ? 1e-3f : 1.0f);
    if (T > 2)
        memset(x + K, 0, (size_t)K * 4);
}

static float bf16r(float v) { return quant_bf16_to_fp32(quant_fp32_to_bf16(v)); }

static void test_quant(void)
{
    enum { T = 19, K = 4096 };
    float *x = malloc((size_t)T * K * 4), *xb = malloc((size_t)K * 4), xs[T];
    uint8_t *q = malloc((size_t)T * K), *want = malloc(16 + (size_t)K);
    char err[SPILL_ERRLEN];
    fill_x(x, T, K);
    x[3 * K + 7] = 1e30f; /* far beyond the range: the row's scale takes it, others go subnormal or zero */
    int rc = cuda_op_fp8_quant(x, T, K, q, xs, err, sizeof err);
    CHECK(rc == 0, "cuda_op_fp8_quant: %s", err);
    int bad_s = 0, bad_q = 0;
    for (int t = 0; rc == 0 && t < T; t++) {
        for (int k = 0; k < K; k++)
            xb[k] = bf16r(x[(size_t)t * K + k]);
        quantize_row(GGML_F8_E4M3_ROW, xb, want, K);
        float s;
        memcpy(&s, want, 4);
        bad_s += memcmp(&s, &xs[t], 4) != 0;
        bad_q += memcmp(want + 16, q + (size_t)t * K, K) != 0;
    }
    CHECK(bad_s == 0 && bad_q == 0, "activation quantizer: %d scales and %d rows differ from the host's", bad_s, bad_q);
    free(x), free(xb), free(q), free(want);
}

static void test_gemm(int64_t N, int64_t K, int64_t T, cpu_pool *pool)
{
    char err[SPILL_ERRLEN];
    size_t rb = (size_t)K + 16;
    float *w = malloc((size_t)N * K * 4), *x = malloc((size_t)T * K * 4), *xb = malloc((size_t)K * 4);
    float *wd = malloc((size_t)N * K * 4), *xd = malloc((size_t)T * K * 4), *xs = malloc((size_t)T * 4);
    float *ycpu = malloc((size_t)T * N * 4), *y = malloc((size_t)T * N * 4);
    uint8_t *W = malloc(rb * (size_t)N), *xq = malloc(16 + (size_t)K);
    for (int64_t i = 0; i < N * K; i++)
        w[i] = frand(-0.05f, 0.05f) * (i % 31 == 0 ? 8.0f : 1.0f);
    fill_x(x, T, K);
    for (int64_t n = 0; n < N; n++) {
        quantize_row(GGML_F8_E4M3_ROW, w + n * K, W + (size_t)n * rb, K);
        quant_dequant_row(GGML_F8_E4M3_ROW, W + (size_t)n * rb, wd + n * K, K);
    }
    for (int64_t t = 0; t < T; t++) { /* the GPU's operands, on the host */
        for (int64_t k = 0; k < K; k++)
            xb[k] = bf16r(x[t * K + k]);
        quantize_row(GGML_F8_E4M3_ROW, xb, xq, K);
        memcpy(&xs[t], xq, 4);
        quant_dequant_row(GGML_F8_E4M3_ROW, xq, xd + t * K, K);
    }
    int rc = cpu_matmul(pool, W, GGML_F8_E4M3_ROW, N, K, x, T, ycpu, err, sizeof err);
    CHECK(rc == 0, "cpu_matmul fp8: %s", err);
    /* per output: the emulation, sum |xq wq|, sum |x wq|, sum |wq| */
    double *ref = malloc((size_t)T * N * 4 * sizeof(double));
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double emu = 0, aq = 0, ax = 0, aw = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = (double)xd[t * K + k] * wd[n * K + k];
                emu += a, aq += fabs(a);
                ax += fabs((double)x[t * K + k] * wd[n * K + k]), aw += fabs(wd[n * K + k]);
            }
            double *r = ref + 4 * (t * N + n);
            r[0] = emu, r[1] = aq, r[2] = ax, r[3] = aw;
        }
    static const char *const mname[] = {"auto", "outer-vector", "post-scale"};
    for (int mode = 0; mode < 3; mode++)
        for (int fast = 0; fast < 2; fast++) {
            if (fast && mode != 0)
                continue;
            for (int64_t i = 0; i < T * N; i++)
                y[i] = NAN;
            int used = -1;
            rc = cuda_op_fp8_matmul(W, N, K, x, T, y, mode, fast, &used, err, sizeof err);
            if (rc != 0 && mode == 1) {
                fprintf(stderr, "fp8 GEMM N=%lld K=%lld T=%lld: this cuBLASLt refuses outer-vector scales: %s\n",
                        (long long)N, (long long)K, (long long)T, err);
                continue;
            }
            CHECK(rc == 0, "fp8 GEMM %s N=%lld K=%lld T=%lld: %s", mname[mode], (long long)N, (long long)K,
                  (long long)T, err);
            if (rc)
                continue;
            int bad_emu = 0, bad_or = 0;
            double d2 = 0, r2 = 0, worst = 0;
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = 0; n < N; n++) {
                    const double *r = ref + 4 * (t * N + n);
                    double emu = r[0], aq = r[1], ax = r[2], aw = r[3];
                    double g = y[t * N + n], c = ycpu[t * N + n];
                    double lim_or = (0x1p-4 + 0x1p-8) * ax + 0x1p-10 * xs[t] * aw + 0x1p-9 * aq;
                    bad_emu += !(fabs(g - emu) <= 0x1p-9 * aq);
                    bad_or += !(fabs(g - c) <= lim_or);
                    d2 += (g - c) * (g - c), r2 += c * c;
                    worst = fmax(worst, aq > 0 ? fabs(g - emu) / aq : 0);
                }
            double rel = sqrt(d2 / (r2 > 0 ? r2 : 1));
            fprintf(stderr,
                    "fp8 GEMM %-12s%s N=%-5lld K=%-5lld T=%-4lld (ran %s): vs emulation worst %.2e of sum|terms|; "
                    "vs CPU fp8 matmul rel L2 %.4f\n",
                    mname[mode], fast ? "+fast" : "     ", (long long)N, (long long)K, (long long)T,
                    used == 1 ? "outer-vector" : "post-scale", worst, rel);
            if (!fast)
                CHECK(bad_emu == 0, "fp8 GEMM %s N=%lld K=%lld T=%lld: %d outputs off the emulation by > 2^-9 sum|terms|",
                      mname[mode], (long long)N, (long long)K, (long long)T, bad_emu);
            CHECK(bad_or == 0 && rel <= 0.05, "fp8 GEMM %s%s N=%lld K=%lld T=%lld: %d outputs off the CPU bound, rel L2 %.4f",
                  mname[mode], fast ? "+fast" : "", (long long)N, (long long)K, (long long)T, bad_or, rel);
            if (mode == 0 && !fast)
                CHECK(used == 1 || used == 2, "auto ran mode %d", used);
        }
    free(w), free(x), free(xb), free(wd), free(xd), free(xs), free(ycpu), free(y), free(W), free(xq), free(ref);
}

/* ---------------------------------------------------------------- end to end */

static float *cpu_logits(model_desc *m, const int32_t *toks, int n)
{
    char err[SPILL_ERRLEN];
    engine_opts eo = {.threads = 4, .max_pass_tokens = 32, .max_pass_seqs = 1, .page_tokens = 16, .kv_pages = 8};
    spill_engine *e;
    if (engine_open(m, &eo, &e, err, sizeof err)) {
        CHECK(0, "engine_open: %s", err);
        return NULL;
    }
    float *lg = malloc((size_t)m->vocab * 4);
    kv_row kr = {0};
    fwd_seq sq = {.kv = &kr, .pos0 = 0, .n = n, .tokens = toks, .want_logits = true};
    if (kv_row_reserve(engine_kv(e), &kr, n) || engine_forward(e, &sq, 1, lg, err, sizeof err)) {
        CHECK(0, "cpu forward: %s", err);
        free(lg);
        lg = NULL;
    }
    kv_row_free(engine_kv(e), &kr);
    engine_close(e);
    return lg;
}

static float *gpu_logits(model_desc *m, const int32_t *toks, int n, bool streamed)
{
    char err[SPILL_ERRLEN];
    cuda_engine_opts o = {.max_pass_tokens = 32, .max_pass_seqs = 1, .page_tokens = 16, .kv_pages = 8,
                          .streamed = streamed, .ring_slots = 2};
    cuda_engine *e;
    if (cuda_engine_open(m, &o, &e, err, sizeof err)) {
        CHECK(0, "cuda_engine_open%s: %s", streamed ? " (streamed)" : "", err);
        return NULL;
    }
    float *lg = malloc((size_t)m->vocab * 4);
    kv_cache *kv = cuda_engine_kv(e);
    kv_row kr = {0};
    fwd_seq sq = {.kv = &kr, .pos0 = 0, .n = n, .tokens = toks, .want_logits = true};
    if (kv_row_reserve(kv, &kr, n) || cuda_engine_forward(e, &sq, 1, lg, err, sizeof err)) {
        CHECK(0, "gpu forward: %s", err);
        free(lg);
        lg = NULL;
    }
    kv_row_free(kv, &kr);
    cuda_engine_close(e);
    return lg;
}

static void test_engine(void)
{
    char dir[] = "/tmp/spill_cuda_fp8_XXXXXX", path[600], err[SPILL_ERRLEN];
    if (!mkdtemp(dir))
        return;
    snprintf(path, sizeof path, "%s/ref-fp8.gguf", dir);
    pack_opts po = {.model = "tests/data/ref/llama_gqa_s64", .out = path, .quant = PACK_FP8, .threads = 2};
    pack_report rep;
    int rc = pack_model(&po, &rep, err, sizeof err);
    CHECK(rc == 0, "pack --quant fp8: %s", err);
    model_desc *m = NULL;
    if (rc == 0) {
        pack_report_free(&rep);
        rc = model_open(path, &m, err, sizeof err);
        CHECK(rc == 0, "%s", err);
    }
    static const int32_t toks[12] = {1, 17, 42, 99, 3, 250, 7, 64, 128, 5, 33, 200};
    float *c = rc ? NULL : cpu_logits(m, toks, 12), *g = rc ? NULL : gpu_logits(m, toks, 12, false);
    float *gs = rc ? NULL : gpu_logits(m, toks, 12, true);
    if (c && g) {
        int V = m->vocab;
        double d2 = 0, r2 = 0, mc = -INFINITY, mg = -INFINITY, sc = 0, sg = 0, w = 0;
        for (int i = 0; i < V; i++)
            d2 += ((double)g[i] - c[i]) * ((double)g[i] - c[i]), r2 += (double)c[i] * c[i], mc = fmax(mc, c[i]),
                mg = fmax(mg, g[i]);
        for (int i = 0; i < V; i++)
            sc += exp(c[i] - mc), sg += exp(g[i] - mg);
        for (int i = 0; i < V; i++)
            w = fmax(w, fabs((c[i] - mc - log(sc)) - (g[i] - mg - log(sg))));
        double rel = sqrt(d2 / r2), rms = sqrt(r2 / V);
        fprintf(stderr, "engine fp8: GPU vs CPU rel L2 %.4f, max |d log-softmax| %.4f = %.3f rms(logits)\n", rel, w,
                w / rms);
        CHECK(rel <= 0.15 && w <= 0.8 * rms, "GPU fp8 logits off the CPU's: rel L2 %.4f, max |d lsm| %.4f", rel, w);
    }
    CHECK(g && gs && !memcmp(g, gs, (size_t)(m ? m->vocab : 0) * 4), "streamed and resident GPU fp8 passes differ");
    free(c), free(g), free(gs);
    model_close(m);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path)) {
    }
}

int main(void)
{
    char err[SPILL_ERRLEN];
    cpu_pool *pool;
    if (cpu_pool_create(4, cpu_matmul_scratch_bytes(8192), &pool, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    test_quant();
    static const int64_t shapes[][3] = {{256, 512, 1}, {384, 1024, 17}, {1024, 4096, 64}, {4096, 1024, 130},
                                        {8192, 8192, 16}, {1024, 28672, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_gemm(shapes[i][0], shapes[i][1], shapes[i][2], pool);
    test_engine();
    cpu_pool_free(pool);
    return test_finish("test_cuda_fp8");
}
