/*
 * run_quant.c — `--quant bf16|q8|q4|fp8|auto` on run and distill (and eval, which passes it on): which weight
 * format a job runs, and the requantized copy it runs from.
 *
 * Owns: the choice (a named quant, or auto's rule below), the bytes each quant would take (from the tensors'
 * shapes and each type's bytes per weight, not measured), and the cached copy: $SPILL_HOME/cache/quant/
 * <fingerprint 16>-<quant>.gguf, written once by pack.c (spill's streaming layout, atomically) and reused by
 * every later job of that model and quant.  Does not own: the conversion itself (pack.c), the memory plan
 * (plan.c).
 *
 * Key decisions:
 *  - Without --quant a model runs as its file is (GGUF: its own types; a safetensors checkpoint: its dtype,
 *    bf16 for nearly every published one).  A quant the file already has (every matrix Q8_0 for q8, Q4_0/Q4_1
 *    for q4, BF16 for bf16) runs the file itself: no copy.
 *  - auto: the widest of bf16, q8, q4 — never wider than the file's own matrices, which widening cannot make
 *    more exact — whose weights fit the resident tier (free HBM on the GPU, --mem-budget on the CPU) with a
 *    quarter of it left for the KV pages and pass buffers; when none does, the layers stream and a pass costs
 *    its bytes over the link, so auto takes the narrowest, q4.  The sentence printed says which and why.
 *  - fp8: spill's fp8 rows (E4M3, one scale per row; the embedding table and head BF16, pack.c), which the GPU
 *    multiplies on its FP8 tensor cores and the CPU dequantizes in its matmul.  An fp8 safetensors checkpoint
 *    (F8_E4M3 weights with their scales) runs as fp8 without --quant too: its own format, in the form the
 *    engines read (the copy of a per-tensor or per-row scaled checkpoint is exact, code for code).  auto never
 *    picks fp8 (it orders bf16, q8, q4 by size; fp8 is a choice of arithmetic as much as of bytes).
 *  - The resumed job uses the quant the job resolved (auto included), stored with its options, so its
 *    fingerprint check holds.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../base/util.h"
#include "../model/pack.h"
#include "../model/quant.h"
#include "run_internal.h"

static void fmt_gb(uint64_t b, char *out, size_t cap) { snprintf(out, cap, "%.2f GB", (double)b / 1e9); }

/* mkdir -p (0755). */
static int mkdirs(const char *path, char *err, size_t errlen)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return util_errf(err, errlen, "%s: path too long.", path);
    for (char *p = buf + 1;; p++)
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return util_errf(err, errlen, "cannot create %s: %s.", buf, strerror(errno));
            if (!(*p = c))
                return 0;
        }
}

static bool is_matrix(const model_tensor *t)
{
    return !(t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1) && t->ne[0] % 32 == 0 && strstr(t->name, ".weight");
}

/* The embedding table and the head, which fp8 keeps BF16 (pack.c). */
static bool is_head(const model_tensor *t)
{
    return !strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight");
}

static bool has_type(enum pack_quant q, const model_tensor *t)
{
    uint32_t ty = t->dtype;
    if (q == PACK_FP8)
        return is_head(t) || t->ne[0] % 16 ? ty == GGML_BF16 : ty == GGML_F8_E4M3_ROW;
    return q == PACK_Q8 ? ty == GGML_Q8_0 : q == PACK_Q4 ? ty == GGML_Q4_0 || ty == GGML_Q4_1 : ty == GGML_BF16;
}

/* True when m has fp8 safetensors weights (F8_E4M3 codes with their scales beside them). */
static bool has_raw_f8(const model_desc *m)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].dtype == SPILL_DT_F8_E4M3)
            return true;
    return false;
}

static uint64_t elems(const model_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

/* Weight bytes of m with its matrices as q (pack's rule: 1-D tensors become F32, other tensors stay). */
static uint64_t run_quant_bytes(const model_desc *m, enum pack_quant q)
{
    double b = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (q == PACK_FP8 && is_matrix(t) && !has_type(q, t))
            b += is_head(t) ? 2.0 * (double)elems(t) : (double)elems(t) + 16.0 * (double)(elems(t) / t->ne[0]);
        else if (is_matrix(t) && !has_type(q, t))
            b += (double)elems(t) * (q == PACK_Q8 ? 34.0 / 32 : q == PACK_Q4 ? 20.0 / 32 : 2.0);
        else if (t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1)
            b += (double)elems(t) * 4;
        else
            b += (double)t->size;
    }
    return (uint64_t)b;
}

/* Bytes per weight of the file's own matrices (their mean). */
static double file_bpw(const model_desc *m)
{
    double bytes = 0, n = 0;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (is_matrix(&m->tensors[i]))
            bytes += (double)m->tensors[i].size, n += (double)elems(&m->tensors[i]);
    return n > 0 ? bytes / n : 2;
}

/* True when every matrix of m already has q's type. */
static bool file_is(const model_desc *m, enum pack_quant q)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (is_matrix(&m->tensors[i]) && !has_type(q, &m->tensors[i]))
            return false;
    return true;
}

/* A short name for the file's own weights: the type most layer matrix bytes have ("Q4_1", "BF16"; the embedding
 * table and head, which fp8 keeps BF16, count only in a file without layers). */
static void file_label(const model_desc *m, char *out, size_t cap)
{
    uint64_t by[256] = {0};
    bool layers = false;
    for (size_t i = 0; i < m->n_tensors; i++)
        layers |= m->tensors[i].layer >= 0 && is_matrix(&m->tensors[i]);
    for (size_t i = 0; i < m->n_tensors; i++)
        if (is_matrix(&m->tensors[i]) && m->tensors[i].dtype < 256 && (!layers || m->tensors[i].layer >= 0))
            by[m->tensors[i].dtype] += m->tensors[i].size;
    int best = -1;
    for (int t = 0; t < 256; t++)
        if (by[t] && (best < 0 || by[t] > by[best]))
            best = t;
    snprintf(out, cap, "%s",
             best < 0 ? "F32" : best == SPILL_DT_F8_E4M3 ? "F8_E4M3" : quant_type_name((uint32_t)best));
}

/* auto's tier: free HBM when the job runs on the GPU, else the memory budget. */
static uint64_t tier_bytes(const runner *r, bool *gpu)
{
    *gpu = r->o.device != 1 && spill_gpu_open && spill_gpu_free;
    if (*gpu) {
        uint64_t f = r->o.gpu_mem ? r->o.gpu_mem : spill_gpu_free();
        if (f)
            return f;
        *gpu = false;
    }
    return r->o.mem_budget;
}

static int pick_auto(runner *r, enum pack_quant *q, char *why, size_t cap)
{
    static const enum pack_quant order[3] = {PACK_BF16, PACK_Q8, PACK_Q4};
    static const double bpw[3] = {2.0, 34.0 / 32, 20.0 / 32};
    bool gpu;
    uint64_t tier = tier_bytes(r, &gpu), room = tier / 4 * 3;
    double own = file_bpw(r->m);
    char tb[32], wb[32];
    fmt_gb(tier, tb, sizeof tb);
    for (int k = 0; k < 3; k++) {
        if (bpw[k] > own * 1.01 && k < 2) /* wider than the file: nothing to gain */
            continue;
        uint64_t b = run_quant_bytes(r->m, order[k]);
        fmt_gb(b, wb, sizeof wb);
        if (b <= room) {
            *q = order[k];
            snprintf(why, cap, "%s: its weights (%s) fit the %s of %s with a quarter left for the KV", pack_quant_name(*q),
                     wb, tb, gpu ? "free HBM" : "memory budget");
            return 0;
        }
    }
    *q = PACK_Q4;
    fmt_gb(run_quant_bytes(r->m, PACK_Q4), wb, sizeof wb);
    snprintf(why, cap, "q4: no quant fits the %s of %s whole (q4 takes %s), so the layers stream and a pass costs its "
                       "bytes: the narrowest streams fastest",
             tb, gpu ? "free HBM" : "memory budget", wb);
    return 0;
}

bool run_quant_valid(const char *name)
{
    enum pack_quant q;
    return !strcmp(name, "auto") || (pack_quant_parse(name, &q) == 0 && q != PACK_NONE);
}

int run_quant_apply(runner *r, const char *path, char *err, size_t errlen)
{
    file_label(r->m, r->quant_name, sizeof r->quant_name);
    const char *qs = r->o.quant;
    if ((!qs || !*qs) && has_raw_f8(r->m))
        qs = "fp8"; /* an fp8 checkpoint runs as fp8: the engines read its codes as fp8 rows */
    if (!qs || !*qs)
        return 0;
    enum pack_quant q;
    char why[400] = "";
    if (!strcmp(qs, "auto")) {
        run_defaults(&r->o); /* the memory budget (idempotent: it fills only what is unset) */
        if (pick_auto(r, &q, why, sizeof why))
            return -1;
    } else if (pack_quant_parse(qs, &q) || q == PACK_NONE)
        return util_errf(err, errlen, "--quant %s: give bf16, q8, q4, fp8 or auto.", qs);
    r->o.quant = pack_quant_name(q); /* what the job stores and a resume uses */
    if (file_is(r->m, q)) {
        snprintf(r->quant_name, sizeof r->quant_name, "%s", pack_quant_name(q));
        if (why[0] && !r->o.quiet)
            fprintf(stderr, "spill: --quant auto: %s; the file has it already.\n", why);
        return 0;
    }
    char fp[65], dir[4096], out[4200];
    model_fingerprint(r->m, fp);
    if (util_pathf(dir, sizeof dir, "%s/cache/quant", util_spill_home()) ||
        util_pathf(out, sizeof out, "%s/%.16s-%s.gguf", dir, fp, pack_quant_name(q)))
        return util_errf(err, errlen, "$SPILL_HOME is too long for the quant cache's path.");
    if (!util_is_file(out)) {
        if (mkdirs(dir, err, errlen))
            return -1;
        uint64_t need = run_quant_bytes(r->m, q);
        struct statvfs vs;
        if (statvfs(dir, &vs) == 0 && (uint64_t)vs.f_bavail * vs.f_frsize < need + (64u << 20)) {
            char nb[32], fb[32];
            fmt_gb(need, nb, sizeof nb);
            fmt_gb((uint64_t)vs.f_bavail * vs.f_frsize, fb, sizeof fb);
            return util_errf(err, errlen, "the %s copy of %s needs %s in %s but %s is free; free some space or run "
                                          "without --quant.", pack_quant_name(q), r->o.model_spec, nb, dir, fb);
        }
        if (!r->o.quiet)
            fprintf(stderr, "spill: %s%s%s as %s, once, into %s\n", why[0] ? "--quant auto: " : "", why,
                    why[0] ? "; writing the model" : "writing the model", pack_quant_name(q), out);
        pack_opts po = {path, out, q, r->o.threads, isatty(STDERR_FILENO) && !r->o.quiet};
        pack_report rep;
        if (pack_model(&po, &rep, err, errlen))
            return -1;
        pack_report_free(&rep);
    } else if (why[0] && !r->o.quiet)
        fprintf(stderr, "spill: --quant auto: %s (cached at %s).\n", why, out);
    model_desc *m2;
    if (model_open(out, &m2, err, errlen))
        return -1;
    model_close(r->m);
    r->m = m2;
    snprintf(r->quant_name, sizeof r->quant_name, "%s", pack_quant_name(q));
    return 0;
}
