/*
 * synth.c — `spill synth`: random-weight GGUF models of real shapes.
 *
 * Owns: the shape presets, the tensor list and order of a llama-family GGUF
 * (what model.c's open_gguf and forward.c bind), a minimal byte-level
 * vocabulary, and generating the weight bytes at disk speed.
 * Does not own: GGUF serialization or the output file (gguf_write.c).
 *
 * Key decisions:
 *  - Bytes are produced directly in the target type from a xoshiro256++
 *    stream, never as fp32 first: F16/BF16 elements come from a 65,536-entry
 *    table of the uniform distribution's quantiles on [-a, a] indexed by 16
 *    random bits; a Q8_0 block is d = a/127 with 32 random codes in
 *    [-127, 127]; a Q4_0 block is d = ±a/8 (random sign, so the mean is 0)
 *    with 32 random nibbles; an fp8 row (GGML_F8_E4M3_ROW) is the scale a/448
 *    and E4M3 codes from a 65,536-entry table of the same quantiles (the
 *    embedding table and head are BF16 then, as spill pack writes fp8).
 *    Every block is valid and decodes to values on
 *    the type's grid with the intended distribution, and generation runs at
 *    1-1.5 GB/s per core (quantizing fp32 first would cost ~10x that CPU for
 *    no benefit in random data).
 *  - a = 0.02·√3: matrices have std 0.02 (the usual init), norm weights are
 *    1 ± 0.05, biases std 0.02, so activations keep sane magnitudes through
 *    any number of layers and logits have std ≈ 0.02·√D.
 *  - A matrix is generated in pieces of 65,536 elements, each with its own
 *    stream seeded from (seed, tensor name, piece index), spread over every
 *    core (one core makes 1-1.5 GB/s, less than a fast disk takes); the bytes
 *    depend on neither the thread count nor the write buffer, and a layer of
 *    an N-layer file equals the same layer of a longer one.
 *  - Vocabulary: tokenizer.ggml.model gpt2 with the 256 byte-level symbols as
 *    ids 0..255, eight merges (" t", " a", "he", "in", "re", "on", " the",
 *    "er") so the BPE path is exercised, filler tokens <|synth_N|>, and
 *    <|begin_of_text|> / <|end_of_text|> as the last two ids (control).  Any
 *    text tokenizes (mostly byte by byte); there is no chat template, so
 *    synthetic models take raw prompts or token ids.
 */
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/pool.h"
#include "gguf.h"
#include "gguf_write.h"
#include "quant.h"
#include "../base/util.h"
#include "../base/exit.h"

#define ALIGNMENT 4096
#define PIECE_ELEMS 65536 /* elements per independently seeded piece of a matrix (a whole number of blocks) */
#define CHUNK_PIECES 32   /* pieces generated in parallel per step, in place in the write buffer */

static const synth_shape presets[] = {
    /* name, arch, D, H, K, F, V, L, rope theta, norm eps, context, qkv bias, tied */
    {"llama3-8b", "llama", 4096, 32, 8, 14336, 128256, 32, 500000.0, 1e-5f, 8192, false, false, 0, 0, 0, false},
    {"llama3-70b", "llama", 8192, 64, 8, 28672, 128256, 80, 500000.0, 1e-5f, 8192, false, false, 0, 0, 0, false},
    {"qwen2.5-7b", "qwen2", 3584, 28, 4, 18944, 152064, 28, 1000000.0, 1e-6f, 32768, true, false, 0, 0, 0, false},
    {"smollm2-135m", "llama", 576, 9, 3, 1536, 49152, 30, 100000.0, 1e-5f, 8192, false, true, 0, 0, 0, false},
    {"tiny", "llama", 256, 4, 2, 512, 1024, 4, 10000.0, 1e-5f, 2048, false, false, 0, 0, 0, false},
    /* MoE, as llama.cpp's converters write them: Mixtral is general.architecture llama with experts; the
     * experts of a layer are stacked 3-D tensors (ffn_{gate,up,down}_exps) after the router ffn_gate_inp */
    {"mixtral-8x7b", "llama", 4096, 32, 8, 14336, 32000, 32, 1000000.0, 1e-5f, 32768, false, false, 128, 8, 2, false},
    {"qwen3-30b-a3b", "qwen3moe", 2048, 32, 4, 768, 151936, 48, 1000000.0, 1e-6f, 40960, false, false, 128, 128, 8,
     true},
    {"tiny-moe", "llama", 256, 4, 2, 128, 1024, 4, 10000.0, 1e-5f, 2048, false, false, 0, 8, 2, false},
};

const synth_shape *synth_find(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name))
            return &presets[i];
    return NULL;
}

/* ---------------------------------------------------------------- random bytes */

typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return h;
}

/* The stream of piece `piece` of a matrix: independent of how pieces are spread over threads. */
static void rng_seed_piece(rng *r, uint64_t seed, uint64_t name_h, uint64_t piece)
{
    uint64_t x = seed ^ name_h ^ (piece * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256++ (Blackman & Vigna) */
static inline uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[0] + s[3], 23) + s[0];
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [-1, 1). */
static inline float rng_sym(rng *r)
{
    return (float)((double)(rng_next(r) >> 11) * 0x1.0p-52 - 1.0);
}

#define AMP 0.034641016f /* 0.02·√3: a uniform on [-AMP, AMP] has std 0.02 */

typedef struct gen {
    uint32_t type;
    uint16_t table[65536]; /* F16/BF16: bits of the uniform quantiles on [-AMP, AMP]; fp8: their E4M3 codes / AMP*448 */
    uint16_t q8_d, q4_d;   /* fp16 scales */
    uint64_t row_k;        /* fp8 rows: K of the matrix being generated */
} gen;

static void gen_init(gen *g, uint32_t type)
{
    g->type = type;
    for (int i = 0; i < 65536; i++) {
        float v = AMP * (float)(((double)i + 0.5) / 32768.0 - 1.0);
        g->table[i] = type == GGML_BF16          ? quant_fp32_to_bf16(v)
                      : type == GGML_F8_E4M3_ROW ? quant_fp32_to_e4m3(v / AMP * 448.0f)
                                                 : quant_fp32_to_fp16(v);
    }
    g->q8_d = quant_fp32_to_fp16(AMP / 127);
    g->q4_d = quant_fp32_to_fp16(AMP / 8);
}

/* Fills n bytes (a whole number of elements or blocks of g->type) of a matrix. */
static void gen_matrix(const gen *g, rng *r, uint8_t *p, size_t n)
{
    if (g->type == GGML_F8_E4M3_ROW) { /* whole rows: header, then codes */
        const float s = AMP / 448.0f;
        size_t rb = (size_t)g->row_k + 16;
        for (size_t o = 0; o + rb <= n; o += rb) {
            memcpy(p + o, &s, 4);
            memset(p + o + 4, 0, 12);
            for (size_t k = 0; k < g->row_k; k += 4) {
                uint64_t x = rng_next(r);
                for (int j = 0; j < 4; j++)
                    p[o + 16 + k + (size_t)j] = (uint8_t)g->table[(x >> (16 * j)) & 0xffff];
            }
        }
        return;
    }
    if (g->type == GGML_F16 || g->type == GGML_BF16) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t x = rng_next(r);
            uint16_t v[4] = {g->table[x & 0xffff], g->table[(x >> 16) & 0xffff], g->table[(x >> 32) & 0xffff],
                             g->table[x >> 48]};
            memcpy(p + i, v, 8);
        }
        for (; i < n; i += 2) {
            uint16_t v = g->table[rng_next(r) & 0xffff];
            memcpy(p + i, &v, 2);
        }
        return;
    }
    size_t bb = g->type == GGML_Q8_0 ? 34 : 18;
    for (size_t b = 0; b + bb <= n; b += bb) {
        uint8_t *blk = p + b;
        uint64_t x[4] = {rng_next(r), rng_next(r), rng_next(r), rng_next(r)};
        if (g->type == GGML_Q8_0) {
            memcpy(blk, &g->q8_d, 2);
            memcpy(blk + 2, x, 32);
            for (int j = 2; j < 34; j++)
                blk[j] += blk[j] == 0x80; /* -128 → -127: the reference quantizer never writes -128 */
        } else {
            uint16_t d = g->q4_d | (uint16_t)((x[2] & 1) << 15);
            memcpy(blk, &d, 2);
            memcpy(blk + 2, x, 16);
        }
    }
}

/* A step of a matrix: pieces first_piece.. of piece_bytes each fill p (n bytes; the last piece may be short). */
typedef struct gen_job {
    const gen *g;
    uint64_t seed, name_h, first_piece;
    uint8_t *p;
    size_t n, piece_bytes;
} gen_job;

static void gen_task(void *vctx, int64_t k, int tid)
{
    const gen_job *j = vctx;
    size_t off = (size_t)k * j->piece_bytes, len = j->n - off < j->piece_bytes ? j->n - off : j->piece_bytes;
    rng r;
    rng_seed_piece(&r, j->seed, j->name_h, j->first_piece + (uint64_t)k);
    gen_matrix(j->g, &r, j->p + off, len);
}

/* ---------------------------------------------------------------- tensors */

enum tkind { T_MATRIX, T_NORM, T_BIAS, T_ROUTER /* F32 and never a hole: routing stays varied with --sparse */ };

typedef struct tdesc {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    enum tkind kind;
} tdesc;

/* The tensor list in file order; returns the count (≤ cap). */
static size_t tensor_list(const synth_shape *s, int L, tdesc *t, size_t cap)
{
    uint64_t D = (uint64_t)s->D, S = (uint64_t)(s->S ? s->S : s->D / s->H), HS = (uint64_t)s->H * S;
    uint64_t KS = (uint64_t)s->K * S, F = (uint64_t)s->F, V = (uint64_t)s->V, E = (uint64_t)s->E;
    size_t n = 0;
#define ADD(kind_, nd, a, b, ...)                                                                                      \
    do {                                                                                                               \
        if (n < cap) {                                                                                                 \
            snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                                                        \
            t[n].kind = kind_, t[n].n_dims = nd, t[n].ne[0] = a, t[n].ne[1] = b, t[n].ne[2] = E;                       \
        }                                                                                                              \
        n++;                                                                                                           \
    } while (0)
    ADD(T_MATRIX, 2, D, V, "token_embd.weight");
    ADD(T_NORM, 1, D, 1, "output_norm.weight");
    if (!s->tied)
        ADD(T_MATRIX, 2, D, V, "output.weight");
    for (int l = 0; l < L; l++) {
        ADD(T_NORM, 1, D, 1, "blk.%d.attn_norm.weight", l);
        ADD(T_MATRIX, 2, D, HS, "blk.%d.attn_q.weight", l);
        if (s->qkv_bias)
            ADD(T_BIAS, 1, HS, 1, "blk.%d.attn_q.bias", l);
        ADD(T_MATRIX, 2, D, KS, "blk.%d.attn_k.weight", l);
        if (s->qkv_bias)
            ADD(T_BIAS, 1, KS, 1, "blk.%d.attn_k.bias", l);
        ADD(T_MATRIX, 2, D, KS, "blk.%d.attn_v.weight", l);
        if (s->qkv_bias)
            ADD(T_BIAS, 1, KS, 1, "blk.%d.attn_v.bias", l);
        if (s->qk_norm) {
            ADD(T_NORM, 1, S, 1, "blk.%d.attn_q_norm.weight", l);
            ADD(T_NORM, 1, S, 1, "blk.%d.attn_k_norm.weight", l);
        }
        ADD(T_MATRIX, 2, HS, D, "blk.%d.attn_output.weight", l);
        ADD(T_NORM, 1, D, 1, "blk.%d.ffn_norm.weight", l);
        if (E) {
            ADD(T_ROUTER, 2, D, E, "blk.%d.ffn_gate_inp.weight", l);
            ADD(T_MATRIX, 3, D, F, "blk.%d.ffn_gate_exps.weight", l);
            ADD(T_MATRIX, 3, D, F, "blk.%d.ffn_up_exps.weight", l);
            ADD(T_MATRIX, 3, F, D, "blk.%d.ffn_down_exps.weight", l);
            continue;
        }
        ADD(T_MATRIX, 2, D, F, "blk.%d.ffn_gate.weight", l);
        ADD(T_MATRIX, 2, D, F, "blk.%d.ffn_up.weight", l);
        ADD(T_MATRIX, 2, F, D, "blk.%d.ffn_down.weight", l);
    }
#undef ADD
    return n;
}

/* ---------------------------------------------------------------- vocabulary */

/* GPT-2 bytes_to_unicode: byte b is spelled by code point cp[b]. */
static void byte_alphabet(uint32_t cp[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = self ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static size_t utf8_put(char *o, uint32_t c)
{
    if (c < 0x80)
        return o[0] = (char)c, 1;
    o[0] = (char)(0xC0 | (c >> 6));
    o[1] = (char)(0x80 | (c & 0x3F));
    return 2; /* the alphabet stays below U+0800 */
}

static int write_vocab(gguf_w *w, int V, char *err, size_t errlen)
{
    static const char *const merges[] = {"Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r"};
    static const char *const merged[] = {"Ġt", "Ġa", "he", "in", "re", "on", "Ġthe", "er"};
    const size_t n_merge = sizeof merges / sizeof merges[0];
    int rc = -1;
    char **tok = calloc((size_t)V, sizeof *tok);
    int32_t *type = calloc((size_t)V, sizeof *type);
    if (!tok || !type) {
        util_errf(err, errlen, "synth: out of memory for a vocabulary of %d tokens.", V);
        goto out;
    }
    uint32_t cp[256];
    byte_alphabet(cp);
    for (int i = 0; i < V; i++) {
        char b[32];
        if (i < 256)
            b[utf8_put(b, cp[i])] = 0;
        else if (i < 256 + (int)n_merge)
            snprintf(b, sizeof b, "%s", merged[i - 256]);
        else if (i == V - 2)
            snprintf(b, sizeof b, "<|begin_of_text|>");
        else if (i == V - 1)
            snprintf(b, sizeof b, "<|end_of_text|>");
        else
            snprintf(b, sizeof b, "<|synth_%d|>", i);
        type[i] = i >= V - 2 ? 3 : 1; /* 3 = control, 1 = normal */
        if (!(tok[i] = strdup(b))) {
            util_errf(err, errlen, "synth: out of memory for a vocabulary of %d tokens.", V);
            goto out;
        }
    }
    if (gguf_w_str(w, "tokenizer.ggml.model", "gpt2", 4, err, errlen) ||
        gguf_w_str(w, "tokenizer.ggml.pre", "gpt-2", 5, err, errlen) ||
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, NULL, (uint64_t)V, err, errlen) ||
        gguf_w_arr_num(w, "tokenizer.ggml.token_type", GGUF_V_I32, type, (uint64_t)V, err, errlen) ||
        gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, NULL, n_merge, err, errlen) ||
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(V - 2), err, errlen) ||
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(V - 1), err, errlen) ||
        gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false, err, errlen))
        goto out;
    rc = 0;
out:
    for (int i = 0; tok && i < V; i++)
        free(tok[i]);
    free(tok);
    free(type);
    return rc;
}

/* ---------------------------------------------------------------- the file */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int write_keys(gguf_w *w, const synth_shape *s, int L, const synth_opts *o, char *err, size_t errlen)
{
    char k[128];
    const char *a = s->arch;
    uint32_t S = (uint32_t)(s->S ? s->S : s->D / s->H);
    char name[96];
    snprintf(name, sizeof name, "synthetic %s (random weights)", s->name);
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
    if (gguf_w_str(w, "general.architecture", a, strlen(a), err, errlen) ||
        gguf_w_str(w, "general.name", name, strlen(name), err, errlen) ||
        (o->wtype != GGML_F16 && o->wtype != GGML_BF16 &&
         gguf_w_u32(w, "general.quantization_version", 2, err, errlen)) ||
        gguf_w_u32(w, KEY("context_length"), (uint32_t)s->ctx_len, err, errlen) ||
        gguf_w_u32(w, KEY("embedding_length"), (uint32_t)s->D, err, errlen) ||
        gguf_w_u32(w, KEY("block_count"), (uint32_t)L, err, errlen) ||
        gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)s->F, err, errlen) ||
        gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)s->H, err, errlen) ||
        gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->K, err, errlen) ||
        gguf_w_u32(w, KEY("attention.key_length"), S, err, errlen) ||
        gguf_w_u32(w, KEY("attention.value_length"), S, err, errlen) ||
        gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->norm_eps, err, errlen) ||
        gguf_w_u32(w, KEY("rope.dimension_count"), S, err, errlen) ||
        gguf_w_f32(w, KEY("rope.freq_base"), (float)s->rope_theta, err, errlen) ||
        gguf_w_u32(w, KEY("vocab_size"), (uint32_t)s->V, err, errlen) ||
        (s->E && (gguf_w_u32(w, KEY("expert_count"), (uint32_t)s->E, err, errlen) ||
                  gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)s->E_used, err, errlen) ||
                  gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)s->F, err, errlen))) ||
        gguf_w_str(w, "spill.synth.like", s->name, strlen(s->name), err, errlen) ||
        gguf_w_u64(w, "spill.synth.seed", o->seed, err, errlen))
        return -1;
#undef KEY
    return write_vocab(w, s->V, err, errlen);
}

int synth_write(const synth_opts *o, synth_stats *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    const synth_shape *s = synth_find(o->like);
    if (!s)
        return util_errf(err, errlen,
                         "synth: unknown shape '%s'; use llama3-8b, llama3-70b, qwen2.5-7b, smollm2-135m, tiny, "
                         "mixtral-8x7b, qwen3-30b-a3b or tiny-moe.",
                         o->like);
    int L = o->layers > 0 ? o->layers : s->L;
    if (L > s->L)
        return util_errf(err, errlen, "synth: --layers %d is more than the %d layers of %s.", L, s->L, s->name);
    if (o->wtype != GGML_F16 && o->wtype != GGML_BF16 && o->wtype != GGML_Q8_0 && o->wtype != GGML_Q4_0 &&
        o->wtype != GGML_F8_E4M3_ROW)
        return util_errf(err, errlen, "synth: weight type %s cannot be generated; use f16, bf16, q8, q4 or fp8.",
                         quant_type_name(o->wtype));
    bool fp8 = o->wtype == GGML_F8_E4M3_ROW;
    int rc = -1;
    gguf_w *w = NULL;
    gguf_out out = {.fd = -1};
    spill_pool *pool = NULL;
    gen *g = malloc(sizeof *g), *gh = fp8 ? malloc(sizeof *gh) : NULL; /* gh: fp8's BF16 embedding table and head */
    size_t nt_cap = (size_t)L * 16 + 8;
    tdesc *t = calloc(nt_cap, sizeof *t);
    if (!g || !t || (fp8 && !gh)) {
        util_errf(err, errlen, "synth: out of memory.");
        goto out;
    }
    gen_init(g, o->wtype);
    if (fp8)
        gen_init(gh, GGML_BF16);
    if (pool_create(o->threads, 64, &pool, err, errlen))
        goto out;
    size_t nt = tensor_list(s, L, t, nt_cap);
    double t0 = now();
    if (gguf_w_new(ALIGNMENT, &w, err, errlen) || write_keys(w, s, L, o, err, errlen))
        goto out;
    for (size_t i = 0; i < nt; i++)
        if (gguf_w_tensor(w, t[i].name, t[i].n_dims, t[i].ne,
                          t[i].kind != T_MATRIX         ? GGML_F32
                          : fp8 && !strncmp(t[i].name, "blk.", 4) ? o->wtype
                          : fp8                          ? GGML_BF16
                                                         : o->wtype,
                          err, errlen) < 0)
            goto out;
    if (gguf_out_open(&out, o->path, gguf_w_data_start(w), 64u << 20, err, errlen))
        goto out;
    st->direct = out.direct;
    uint64_t total = gguf_w_file_size(w);
    double last_draw = 0;
    size_t piece = o->wtype == GGML_Q8_0   ? PIECE_ELEMS / 32 * 34
                   : o->wtype == GGML_Q4_0 ? PIECE_ELEMS / 32 * 18
                                           : PIECE_ELEMS * 2;
    for (size_t i = 0; i < nt; i++) {
        rng r;
        uint64_t name_h = name_hash(t[i].name), next_piece = 0;
        rng_seed_piece(&r, o->seed, name_h, UINT64_MAX);
        uint64_t left = gguf_w_tensor_bytes(w, (int)i);
        if (t[i].kind != T_MATRIX) { /* F32: norms 1 ± 0.05, biases and routers std 0.02 */
            uint64_t count = t[i].ne[0] * (t[i].n_dims >= 2 ? t[i].ne[1] : 1);
            for (uint64_t e = 0; e < count; e++) {
                float v = t[i].kind == T_NORM ? 1.0f + 0.05f * rng_sym(&r) : AMP * rng_sym(&r);
                if (gguf_out_write(&out, &v, 4, err, errlen))
                    goto out;
            }
        }
        if (o->sparse && t[i].kind == T_MATRIX && !strncmp(t[i].name, "blk.", 4)) {
            /* a layer matrix left as a hole: zeros that take no disk */
            if (gguf_out_skip(&out, left, err, errlen))
                goto out;
            left = 0;
        }
        const gen *gi = fp8 && strncmp(t[i].name, "blk.", 4) ? gh : g;
        size_t pc = gi == gh ? PIECE_ELEMS * 2 : piece;
        if (gi->type == GGML_F8_E4M3_ROW) { /* pieces of whole rows */
            g->row_k = t[i].ne[0];
            pc = (size_t)(PIECE_ELEMS / t[i].ne[0] > 1 ? PIECE_ELEMS / t[i].ne[0] : 1) * (size_t)(t[i].ne[0] + 16);
        }
        while (t[i].kind == T_MATRIX && left) {
            size_t n = left < pc * CHUNK_PIECES ? (size_t)left : pc * CHUNK_PIECES;
            gen_job j = {gi, o->seed, name_h, next_piece, NULL, n, pc};
            if (gguf_out_reserve(&out, n, &j.p, err, errlen))
                goto out;
            pool_run(pool, gen_task, &j, (int64_t)((n + pc - 1) / pc));
            next_piece += (n + pc - 1) / pc;
            gguf_out_commit(&out, n);
            left -= n;
            if (o->progress && now() - last_draw > 0.5) {
                last_draw = now();
                double done = (double)gguf_out_pos(&out) / (double)total;
                fprintf(stderr, "\rsynth %s: %5.1f%% of %.2f GB, %.2f GB/s ", s->name, 100 * done, total / 1e9,
                        (double)gguf_out_pos(&out) / 1e9 / (last_draw - t0 + 1e-9));
            }
        }
        if (gguf_out_pad(&out, ALIGNMENT, err, errlen))
            goto out;
    }
    if (gguf_out_finish(&out, w, err, errlen))
        goto out;
    if (o->progress)
        fprintf(stderr, "\r%60s\r", "");
    st->bytes = total;
    st->seconds = now() - t0;
    rc = 0;
out:
    gguf_out_abort(&out);
    gguf_w_free(w);
    pool_free(pool);
    free(t);
    free(g);
    free(gh);
    return rc;
}

/* ---------------------------------------------------------------- command */

static int usage(void)
{
    fprintf(stderr, "usage: spill synth --like llama3-8b|llama3-70b|qwen2.5-7b|smollm2-135m|tiny [--layers N] "
                    "[--quant f16|bf16|q8|q4|fp8] [--seed N] [--sparse] -o PATH\n");
    return SPILL_EX_USAGE;
}

int synth_main(int argc, char **argv)
{
    synth_opts o = {.wtype = GGML_BF16, .seed = 0x5eed};
    const char *path = NULL, *q = "bf16";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "--like") && v)
            o.like = v, i++;
        else if (!strcmp(a, "--layers") && v) {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 100000) {
                fprintf(stderr, "spill synth: --layers '%s' must be a positive integer.\n", v);
                return SPILL_EX_USAGE;
            }
            o.layers = (int)n, i++;
        } else if (!strcmp(a, "--quant") && v)
            q = v, i++;
        else if (!strcmp(a, "--seed") && v) {
            o.seed = strtoull(v, &end, 0);
            if (*end) {
                fprintf(stderr, "spill synth: --seed '%s' must be an integer.\n", v);
                return SPILL_EX_USAGE;
            }
            i++;
        } else if (!strcmp(a, "-o") && v)
            path = v, i++;
        else if (!strcmp(a, "--sparse"))
            o.sparse = true;
        else
            return usage();
    }
    if (!o.like || !path)
        return usage();
    const synth_shape *sh = synth_find(o.like);
    if (!sh || o.layers > sh->L) {
        fprintf(stderr, "spill synth: %s\n",
                sh ? "--layers is more than the model has"
                   : "--like must be llama3-8b, llama3-70b, qwen2.5-7b, smollm2-135m, tiny, mixtral-8x7b, qwen3-30b-a3b or tiny-moe.");
        return SPILL_EX_USAGE;
    }
    if (!strcmp(q, "f16"))
        o.wtype = GGML_F16;
    else if (!strcmp(q, "bf16"))
        o.wtype = GGML_BF16;
    else if (!strcmp(q, "q8"))
        o.wtype = GGML_Q8_0;
    else if (!strcmp(q, "q4"))
        o.wtype = GGML_Q4_0;
    else if (!strcmp(q, "fp8"))
        o.wtype = GGML_F8_E4M3_ROW;
    else {
        fprintf(stderr, "spill synth: --quant '%s' must be f16, bf16, q8, q4 or fp8.\n", q);
        return SPILL_EX_USAGE;
    }
    char full[4096];
    if (util_is_dir(path)) { /* -o DIR: a name of its own inside */
        char layers[32] = "";
        if (o.layers)
            snprintf(layers, sizeof layers, "-L%d", o.layers);
        if (util_pathf(full, sizeof full, "%s/%s%s-%s.gguf", path, o.like, layers, q) != 0) {
            fprintf(stderr, "spill synth: output path under %s is too long.\n", path);
            return SPILL_EX_USAGE;
        }
        path = full;
    }
    o.path = path;
    o.progress = isatty(2);
    char err[SPILL_ERRLEN];
    synth_stats st;
    if (synth_write(&o, &st, err, sizeof err) != 0) {
        fprintf(stderr, "spill synth: %s\n", err);
        return SPILL_EX_CANTCREAT;
    }
    printf("wrote %s: %.3f GB in %.1f s (%.2f GB/s%s)%s\n", path, st.bytes / 1e9, st.seconds,
           st.bytes / 1e9 / (st.seconds > 0 ? st.seconds : 1e-9), st.direct ? ", O_DIRECT" : ", buffered",
           o.sparse ? "; layer matrices are holes (zeros): for throughput runs only" : "");
    return 0;
}
