/*
 * lora.cu — LoRA adapters applied unmerged on the CUDA engine, per token: one
 * pass serves sequences of any number of adapters and of the bare base.
 *
 * Owns: the adapters' device layout (uploaded once at open as bf16, resident
 * in HBM whatever the layers' tier: they are small), and their application
 * after the base GEMMs of forward_layer.  Does not own: reading adapters
 * (model/lora.c normalises PEFT and mlx-lm files to split slots, A (r, in)
 * and B (out, r) fp32, so a fused base projection never meets a fused
 * adapter here), the pass and its metadata (cuda_engine.cu).
 *
 * Layout, per layer and per group of slots that read one GEMM input
 * (dlora_group in cuda_internal.h: q, k, v | o | gate, up | down):
 *   A (C, in) bf16          the A rows of every adapter of each slot, slot after
 *                           slot, adapters in set order; each slot's segment
 *                           padded with zero rows to a multiple of 8 columns
 *   own (C) int32           the adapter (1..n) each column belongs to, -1 on padding
 *   B_s (out_s, R_s) bf16   per slot: scale_a · B_a of each adapter side by side,
 *                           in A's column order
 * A pass that has a sequence with an adapter runs, for each adapted group:
 *   tmp(T, C)         = xb(T, in) · Aᵀ                  one GEMM: every adapter, every slot of the group
 *   tmpb(T, C)        = bf16(tmp) where own[j] == ad[t], else 0      (k_lora_mask)
 *   y_s(T, out_s)    += tmpb[:, c0_s .. c0_s + R_s) · B_sᵀ          one GEMM per slot, beta = 1
 * so token t gets exactly scale · (x·Aᵀ)·Bᵀ of its own adapter: the other
 * adapters' columns are zeros, which add exactly 0.0, and a bare-base token
 * keeps the base GEMM's bits.  Fused base tensors (Phi-3's QKV, gate/up) are
 * bound as row ranges that write separate outputs (q, k, v; g, u), so each
 * split slot adds onto its own buffer.  A pass without any adapted sequence
 * skips all of it.
 *
 * Cost: every token runs through every adapter's rank space (C·in + out·R
 * FLOPs per token and slot group, against in·out for the base), plus a
 * read-modify-write of the fp32 outputs; 8 adapters of rank 16 on every slot
 * of an 8B layer are ~5% of its parameters.  Left out: gathering each
 * adapter's tokens into their own GEMMs (the segmented/grouped GEMMs of
 * S-LoRA and Punica), which saves the other adapters' FLOPs at the price of a
 * grouped-GEMM kernel of our own or a launch per adapter and slot; it pays
 * only at many adapters of large rank.  Merging B·A into the weights serves
 * one adapter per pass.
 *
 * Precision: the base GEMMs' (bf16 operands, fp32 accumulation), with one
 * more bf16 rounding, of x·Aᵀ, between the two products.
 */
#include "cuda_internal.h"
#include "cuda_test.h"

static_assert(M_Q == (int)LORA_Q && M_K == (int)LORA_K && M_V == (int)LORA_V && M_O == (int)LORA_O &&
                  M_GATE == (int)LORA_GATE && M_UP == (int)LORA_UP && M_DOWN == (int)LORA_DOWN,
              "a lora_slot is the index of its pack matrix");

static const int LG_FIRST[LG_COUNT] = {LORA_Q, LORA_O, LORA_GATE, LORA_DOWN};
static const int LG_SLOTS[LG_COUNT] = {3, 1, 2, 1};
static const char *const SLOT_NAME[LORA_N_SLOTS] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

#define LORA_ALIGN 256

static size_t align_up(size_t n)
{
    return (n + LORA_ALIGN - 1) / LORA_ALIGN * LORA_ALIGN;
}

/* Lays group g of layer l out over the set's adapters (from their shapes; cuda_lora_upload has checked them
 * against the base), at arena offset *off, which it advances.  C stays 0 when no adapter adapts the group. */
static void group_layout(const lora_set *ls, int l, int g, size_t *off, dlora_group *G)
{
    memset(G, 0, sizeof *G);
    G->first = LG_FIRST[g];
    G->n_slots = LG_SLOTS[g];
    for (int i = 0; i < G->n_slots; i++) {
        int32_t r = 0;
        for (int a = 0; a < ls->n; a++) {
            const lora_mat *mt = &ls->ad[a]->m[(size_t)l * LORA_N_SLOTS + G->first + i];
            if (mt->r <= 0)
                continue;
            G->in = mt->in;
            G->out[i] = mt->out;
            r += mt->r;
        }
        G->c0[i] = G->C;
        G->R[i] = (r + 7) / 8 * 8;
        G->C += G->R[i];
    }
    if (!G->C)
        return;
    G->a_off = *off;
    *off += align_up((size_t)G->C * (size_t)G->in * sizeof(bf16));
    G->own_off = *off;
    *off += align_up((size_t)G->C * sizeof(int32_t));
    for (int i = 0; i < G->n_slots; i++)
        if (G->R[i]) {
            G->b_off[i] = *off;
            *off += align_up((size_t)G->out[i] * (size_t)G->R[i] * sizeof(bf16));
        }
}

/* Writes group G of layer l into img, the host image of the arena, zeroed beforehand (so padding rows of A and
 * padding columns of B are 0). */
static void group_fill(const lora_set *ls, int l, const dlora_group *G, uint8_t *img)
{
    uint16_t *A = (uint16_t *)(img + G->a_off);
    int32_t *own = (int32_t *)(img + G->own_off);
    for (int32_t j = 0; j < G->C; j++)
        own[j] = -1;
    for (int i = 0; i < G->n_slots; i++) {
        uint16_t *B = (uint16_t *)(img + G->b_off[i]);
        int32_t col = G->c0[i];
        for (int a = 0; a < ls->n; a++) {
            const lora_adapter *ad = ls->ad[a];
            const lora_mat *mt = &ad->m[(size_t)l * LORA_N_SLOTS + G->first + i];
            if (mt->r <= 0)
                continue;
            for (int32_t k = 0; k < mt->r; k++) {
                own[col + k] = a + 1;
                for (int64_t x = 0; x < G->in; x++)
                    A[(size_t)(col + k) * (size_t)G->in + (size_t)x] = quant_fp32_to_bf16(mt->A[(size_t)k * G->in + x]);
            }
            for (int64_t o = 0; o < G->out[i]; o++)
                for (int32_t k = 0; k < mt->r; k++)
                    B[(size_t)o * (size_t)G->R[i] + (size_t)(col - G->c0[i] + k)] =
                        quant_fp32_to_bf16(ad->scale * mt->B[(size_t)o * mt->r + k]);
            col += mt->r;
        }
    }
}

/* Lays out every group of the set over L layers (into groups, or nowhere when NULL): the arena's bytes and the
 * widest group's columns.  False when an adapter was not read for L layers (open refuses it). */
static bool set_layout(const lora_set *ls, int L, dlora_group *groups, size_t *bytes, int32_t *cmax)
{
    *bytes = 0;
    *cmax = 0;
    for (int a = 0; a < ls->n; a++)
        if (!ls->ad[a] || !ls->ad[a]->m || ls->ad[a]->n_layers != L)
            return false;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < LG_COUNT; g++) {
            dlora_group G;
            group_layout(ls, l, g, bytes, &G);
            *cmax = G.C > *cmax ? G.C : *cmax;
            if (groups)
                groups[(size_t)l * LG_COUNT + g] = G;
        }
    return true;
}

size_t cuda_lora_bytes(const model_desc *m, const lora_set *ls, size_t T)
{
    size_t bytes;
    int32_t cmax;
    if (!ls || ls->n <= 0 || !set_layout(ls, m->n_layers, NULL, &bytes, &cmax))
        return 0;
    return bytes + T * (size_t)cmax * (sizeof(float) + sizeof(bf16));
}

/* Checks adapter number idx (1-based) against the bound layers: read for this layer count, and every adapted
 * slot a matrix of the base's shape (a sparse layer's FFN has experts instead, which take no LoRA). */
static int check_adapter(const cuda_engine *e, const lora_adapter *ad, int idx, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    if (!ad || !ad->m)
        return util_errf(err, errlen, "LoRA adapter %d of the set holds no matrices.", idx);
    if (ad->n_layers != m->n_layers)
        return util_errf(err, errlen,
                         "LoRA adapter %s was read for %d layers, but %s has %d; load it against this model.", ad->name,
                         ad->n_layers, m->source, m->n_layers);
    for (int l = 0; l < m->n_layers; l++)
        for (int s = 0; s < LORA_N_SLOTS; s++) {
            const lora_mat *mt = &ad->m[(size_t)l * LORA_N_SLOTS + s];
            if (mt->r <= 0)
                continue;
            const dmat *d = &e->layers[l].m[s];
            if (!d->t)
                return util_errf(err, errlen,
                                 "LoRA adapter %s adapts %s of layer %d, which %s does not have there (the experts "
                                 "of an MoE layer take no LoRA); remove that target from the adapter.",
                                 ad->name, SLOT_NAME[s], l, m->source);
            if (!mt->A || !mt->B || mt->in != d->k || mt->out != d->n)
                return util_errf(err, errlen,
                                 "LoRA adapter %s: %s of layer %d maps %lld to %lld values, but the base's maps %lld "
                                 "to %lld; the adapter was trained for another model.",
                                 ad->name, SLOT_NAME[s], l, (long long)mt->in, (long long)mt->out, (long long)d->k,
                                 (long long)d->n);
        }
    return 0;
}

/* Points group G's device views into the arena at base. */
static void group_bind(dlora_group *G, uint8_t *base)
{
    G->A = (const bf16 *)(base + G->a_off);
    G->own = (const int32_t *)(base + G->own_off);
    for (int i = 0; i < G->n_slots; i++)
        G->B[i] = G->R[i] ? (const bf16 *)(base + G->b_off[i]) : NULL;
}

int cuda_lora_upload(cuda_engine *e, char *err, size_t errlen)
{
    const lora_set *ls = e->o.lora;
    const model_desc *m = e->m;
    if (!ls || ls->n <= 0)
        return 0;
    for (int a = 0; a < ls->n; a++)
        if (check_adapter(e, ls->ad[a], a + 1, err, errlen))
            return -1;
    size_t ng = (size_t)m->n_layers * LG_COUNT, bytes;
    int32_t cmax;
    e->lo.g = (dlora_group *)calloc(ng, sizeof *e->lo.g);
    if (!e->lo.g)
        return util_errf(err, errlen, "out of host memory laying out the LoRA adapters.");
    set_layout(ls, m->n_layers, e->lo.g, &bytes, &cmax);
    uint8_t *img = (uint8_t *)calloc(bytes ? bytes : 1, 1);
    if (!img)
        return util_errf(err, errlen, "out of host memory staging %.1f MiB of LoRA adapters.",
                         (double)bytes / (1 << 20));
    for (size_t i = 0; i < ng; i++)
        if (e->lo.g[i].C)
            group_fill(ls, (int)(i / LG_COUNT), &e->lo.g[i], img);
    int rc = dalloc(e, (void **)&e->lo.arena, bytes, "the LoRA adapters", err, errlen);
    if (rc == 0) {
        cudaError_t c = cudaMemcpy(e->lo.arena, img, bytes, cudaMemcpyHostToDevice);
        if (c != cudaSuccess)
            rc = cu_fail(c, "cudaMemcpy (LoRA adapters)", __LINE__, err, errlen);
    }
    free(img);
    size_t T = (size_t)e->max_T;
    if (rc ||
        (rc = dalloc(e, (void **)&e->lo.tmp, T * (size_t)cmax * sizeof(float), "LoRA pass buffers", err, errlen)) ||
        (rc = dalloc(e, (void **)&e->lo.tmpb, T * (size_t)cmax * sizeof(bf16), "LoRA pass buffers", err, errlen)))
        return rc;
    for (size_t i = 0; i < ng; i++)
        if (e->lo.g[i].C)
            group_bind(&e->lo.g[i], e->lo.arena);
    e->lo.n = ls->n;
    e->st.lora_adapters = ls->n;
    e->st.lora_bytes = bytes + T * (size_t)cmax * (sizeof(float) + sizeof(bf16));
    return 0;
}

/* The header's three steps for group G over T tokens on handle h (whose stream is s): x (T, in) bf16, ad (T)
 * each token's adapter, tmp and tmpb (T, C) scratch, y[i] slot i's output (T, out_i) fp32, added onto. */
static int group_run(cublasHandle_t h, cudaStream_t s, const dlora_group *G, const bf16 *x, const int32_t *ad,
                     int64_t T, float *tmp, bf16 *tmpb, float *const *y, char *err, size_t errlen)
{
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, G->C, (int)T, (int)G->in, &one, G->A, CUDA_R_16BF, (int)G->in, x,
                    CUDA_R_16BF, (int)G->in, &zero, tmp, CUDA_R_32F, G->C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CU(k_lora_mask(tmp, G->own, ad, T, G->C, tmpb, s));
    for (int i = 0; i < G->n_slots; i++)
        if (G->R[i])
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)G->out[i], (int)T, G->R[i], &one, G->B[i], CUDA_R_16BF,
                            G->R[i], tmpb + G->c0[i], CUDA_R_16BF, G->C, &one, y[i], CUDA_R_32F, (int)G->out[i],
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

int cuda_lora_apply(cuda_engine *e, int l, int g, const int32_t *ad, int64_t T, char *err, size_t errlen)
{
    if (!e->lo.pass)
        return 0;
    const dlora_group *G = &e->lo.g[(size_t)l * LG_COUNT + g];
    if (!G->C)
        return 0;
    float *y[LORA_GROUP_MAX] = {NULL, NULL, NULL};
    switch (g) {
    case LG_QKV:
        y[0] = e->q, y[1] = e->k, y[2] = e->v;
        break;
    case LG_GU:
        y[0] = e->g, y[1] = e->u;
        break;
    default: /* o and down write the layer's branch output */
        y[0] = e->h;
        break;
    }
    return group_run(e->blas, e->cs, G, e->xb, ad, T, e->lo.tmp, e->lo.tmpb, y, err, errlen);
}

/* ---------------------------------------------------------------- op entry (tests) */

int cuda_op_lora(const lora_set *ls, int layer, int group, const float *x, int64_t T, const int32_t *ad,
                 float *const *y, char *err, size_t errlen)
{
    if (group < 0 || group >= LG_COUNT || !ls || ls->n <= 0)
        return util_errf(err, errlen, "cuda_op_lora: group %d of a set of %d adapters.", group, ls ? ls->n : 0);
    dlora_group G;
    size_t bytes = 0;
    group_layout(ls, layer, group, &bytes, &G);
    if (!G.C)
        return 0;
    uint8_t *img = (uint8_t *)calloc(bytes, 1), *arena = NULL;
    float *dx = NULL, *tmp = NULL, *dy[LORA_GROUP_MAX] = {NULL, NULL, NULL};
    bf16 *xb = NULL, *tmpb = NULL;
    int32_t *dad = NULL;
    cublasHandle_t h = NULL;
    cudaError_t c = cudaSuccess;
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    int rc = 0;
    size_t xn = (size_t)T * (size_t)G.in, tn = (size_t)T * (size_t)G.C;
    if (!img)
        return util_errf(err, errlen, "out of host memory.");
    group_fill(ls, layer, &G, img);
    if ((c = cudaMalloc((void **)&arena, bytes)) || (c = cudaMalloc((void **)&dx, xn * 4)) ||
        (c = cudaMalloc((void **)&xb, xn * 2)) || (c = cudaMalloc((void **)&dad, (size_t)T * 4)) ||
        (c = cudaMalloc((void **)&tmp, tn * 4)) || (c = cudaMalloc((void **)&tmpb, tn * 2)))
        goto out;
    for (int i = 0; i < G.n_slots; i++)
        if (G.R[i] && ((c = cudaMalloc((void **)&dy[i], (size_t)T * (size_t)G.out[i] * 4)) ||
                       (c = cudaMemcpy(dy[i], y[i], (size_t)T * (size_t)G.out[i] * 4, cudaMemcpyHostToDevice))))
            goto out;
    if ((c = cudaMemcpy(arena, img, bytes, cudaMemcpyHostToDevice)) ||
        (c = cudaMemcpy(dx, x, xn * 4, cudaMemcpyHostToDevice)) ||
        (c = cudaMemcpy(dad, ad, (size_t)T * 4, cudaMemcpyHostToDevice)) || (c = k_to_bf16(dx, xb, (int64_t)xn, 0)))
        goto out;
    group_bind(&G, arena);
    if ((bs = cublasCreate(&h)) != CUBLAS_STATUS_SUCCESS) {
        h = NULL;
        goto out;
    }
    if ((rc = group_run(h, 0, &G, xb, dad, T, tmp, tmpb, dy, err, errlen)))
        goto out;
    if ((c = cudaDeviceSynchronize()))
        goto out;
    for (int i = 0; i < G.n_slots; i++)
        if (G.R[i] && (c = cudaMemcpy(y[i], dy[i], (size_t)T * (size_t)G.out[i] * 4, cudaMemcpyDeviceToHost)))
            goto out;
out:
    if (rc == 0 && c != cudaSuccess)
        rc = cu_fail(c, "cuda_op_lora", __LINE__, err, errlen);
    else if (rc == 0 && bs != CUBLAS_STATUS_SUCCESS)
        rc = blas_fail(bs, "cublasCreate", __LINE__, err, errlen);
    if (h)
        cublasDestroy(h);
    cudaFree(arena), cudaFree(dx), cudaFree(xb), cudaFree(dad), cudaFree(tmp), cudaFree(tmpb);
    for (int i = 0; i < LORA_GROUP_MAX; i++)
        cudaFree(dy[i]);
    free(img);
    return rc;
}
