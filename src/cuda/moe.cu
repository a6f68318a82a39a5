/*
 * moe.cu — the routed feed-forward block of sparse (mixture-of-experts)
 * layers on the CUDA engine: routing, rows grouped by expert, one GEMM pair
 * per hit expert over its rows, the weighted combine, the shared expert.
 * Written by hand (no library routes tokens); the GEMMs are cuBLAS's through
 * the engine's cuda_gemm.
 *
 * Owns: the MoE pass buffers; the router in fp32 (so tokens pick the experts
 * the CPU oracle picks, up to fp32 summation order: a bf16 router would flip
 * near-tied choices, and a flipped choice moves a token's output by a whole
 * expert); top-k with ties to the lower index and the optional renormalising
 * of the k weights (engine/moe.c's rules); the grouping of the pass's
 * (token, choice) slots by expert, in token order within an expert; the
 * combine y[t] = sum over the token's k choices, in choice order, of
 * weight * expert output, then + sigmoid(x . w_sg) * shared(x).
 * Does not own: binding the experts' matrices into the layer pack
 * (cuda_load.cu), the GEMM (cuda_engine.cu), the norms around the block.
 *
 * Key decisions:
 *  - Grouping runs on the host: the chosen ids (T*k ints) come back after the
 *    router, the host counts rows per expert and uploads the sorted slots.
 *    That is one small copy each way and a wait per sparse layer; it gives the
 *    host the hit experts, which is what GEMM launches need (cuBLAS takes M
 *    from the host) and what reading only the hit experts of a streamed layer
 *    will need.  Experts no row chose get no GEMM.
 *  - Every output element is a fixed sum (choice order, no atomics), so a
 *    token's result does not depend on which other tokens share the pass
 *    beyond the GEMM's own M-independence, and streamed = resident bit for bit.
 */
#include "cuda_internal.h"

/* ---------------------------------------------------------------- kernels */

/* One thread per token: softmax over E scores (fp32, max-subtracted as torch does), the k largest (ties to the
 * lower index), optionally divided by their sum. */
__global__ void moe_route_kernel(const float *logits, int64_t T, int E, int k, bool norm, int32_t *ids, float *w)
{
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T; t += (int64_t)gridDim.x * blockDim.x) {
        const float *l = logits + t * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++)
            mx = fmaxf(mx, l[e]);
        float sum = 0;
        for (int e = 0; e < E; e++)
            sum += expf(l[e] - mx);
        int32_t *id = ids + t * k;
        float *wt = w + t * k;
        float kept = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken |= id[i] == e;
                if (!taken && (best < 0 || l[e] > l[best]))
                    best = e;
            }
            id[j] = best;
            wt[j] = expf(l[best] - mx) / sum;
            kept += wt[j];
        }
        if (norm)
            for (int j = 0; j < k; j++)
                wt[j] /= kept;
    }
}

/* out(n, D) = x(perm[i], D): the rows of the grouped slots. */
__global__ void moe_gather_kernel(const bf16 *x, const int32_t *perm, int64_t n, int64_t D, bf16 *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * D; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = x[(int64_t)perm[i / D] * D + i % D];
}

/* y(T, D) = sum_j w[t,j] * yg[row[t,j]] (j in order) + (sh ? sigmoid(shg[t]) * sh[t] : 0). */
__global__ void moe_combine_kernel(const float *yg, const int32_t *row, const float *w, int64_t T, int k, int64_t D,
                                   const float *sh, const float *shg, float *y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * D; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / D, d = i % D;
        float acc = 0;
        for (int j = 0; j < k; j++)
            acc = fmaf(w[t * k + j], yg[(int64_t)row[t * k + j] * D + d], acc);
        if (sh) {
            float g = shg ? 1.0f / (1.0f + expf(-shg[t])) : 1.0f;
            acc = fmaf(g, sh[i], acc);
        }
        y[i] = acc;
    }
}

/* out[t] = x[t] . w over D (one block per token, fp32 in double partials as the norms do). */
__global__ void moe_dot_kernel(const float *x, const float *w, int64_t D, float *out)
{
    __shared__ double part[32];
    const float *xr = x + (int64_t)blockIdx.x * D;
    double s = 0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        s += (double)xr[i] * (double)w[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double v = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++)
            v += part[i];
        out[blockIdx.x] = (float)v;
    }
}

static unsigned blocks_for(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---------------------------------------------------------------- the layer's matrices */

int layer_n_mats(const dlayer *w)
{
    if (!w->moe)
        return M_COUNT;
    return M_COUNT + 3 * w->moe->E + 3;
}

/* Order: the attention's matrices, the shared expert, then the routed experts, so a layer's head (what a
 * pass needs before routing, and whatever routing picks for the shared expert) is one leading byte range. */
dmat *layer_mat_at(dlayer *w, int i)
{
    if (i < M_COUNT)
        return &w->m[i];
    dmoe *mo = w->moe;
    i -= M_COUNT;
    if (i < 3)
        return i == 0 ? &mo->sh_gate : i == 1 ? &mo->sh_up : &mo->sh_down;
    i -= 3;
    return i < mo->E ? &mo->gate[i] : i < 2 * mo->E ? &mo->up[i - mo->E] : &mo->down[i - 2 * mo->E];
}

void cuda_moe_place(dlayer *w)
{
    w->head_bytes = 0;
    if (!w->moe)
        return;
    size_t head = w->pack_bytes;
    for (int i = M_COUNT + 3; i < layer_n_mats(w); i++) {
        const dmat *d = layer_mat_at(w, i);
        if (d->t && d->off < head)
            head = d->off;
    }
    w->head_bytes = head;
}

bool cuda_moe_lazy(const cuda_engine *e, const dlayer *w, int64_t T)
{
    return w->moe && w->head_bytes > 0 && !e->disk && T * e->m->n_experts_used * 2 <= w->moe->E;
}

/* Copies expert x's three matrices of a head-first layer from the pinned pack into the slot (compute stream:
 * the GEMMs that follow wait for them); returns the bytes copied. */
static int fetch_expert(cuda_engine *e, const dlayer *w, const uint8_t *base, int x, size_t *bytes, char *err,
                        size_t errlen)
{
    const dmoe *mo = w->moe;
    const dmat *parts[3] = {&mo->gate[x], &mo->up[x], &mo->down[x]};
    for (int p = 0; p < 3; p++) {
        size_t n = (size_t)parts[p]->n * parts[p]->row_bytes;
        CU(cudaMemcpyAsync((uint8_t *)base + parts[p]->off, w->host + parts[p]->off, n, cudaMemcpyHostToDevice,
                           e->cs));
        *bytes += n;
    }
    return 0;
}

/* ---------------------------------------------------------------- buffers */

typedef struct moe_sizes {
    size_t TK, E, FE, FS, D, G; /* G: rows x cols of the gate/up buffers, the larger of TK x FE and T x FS */
} moe_sizes;

static moe_sizes sizes_for(const model_desc *m, size_t T)
{
    moe_sizes z = {};
    if (m->n_experts <= 0)
        return z;
    z.TK = T * (size_t)m->n_experts_used;
    z.E = (size_t)m->n_experts;
    z.FE = (size_t)m->expert_ffn_dim;
    z.FS = (size_t)m->shared_ffn_dim;
    z.D = (size_t)m->d_model;
    z.G = z.TK * z.FE > T * z.FS ? z.TK * z.FE : T * z.FS;
    return z;
}

size_t cuda_moe_pass_bytes(const model_desc *m, size_t T)
{
    moe_sizes z = sizes_for(m, T);
    if (!z.TK)
        return 0;
    return T * z.D * 4 + T * z.E * 4 + z.TK * 4 + 2 * z.G * 4 + z.TK * z.D * 4 + T * z.D * 4 + T * 4 + z.TK * z.D * 2 +
           z.G * 2 + 3 * z.TK * 4;
}

int cuda_moe_alloc(cuda_engine *e, char *err, size_t errlen)
{
    const model_desc *m = e->m;
    size_t T = (size_t)e->max_T;
    moe_sizes z = sizes_for(m, T);
    if (!z.TK)
        return 0;
    if (dalloc(e, (void **)&e->mo.xn, T * z.D * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.logits, T * z.E * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.wts, z.TK * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.g, z.G * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.u, z.G * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.yg, z.TK * z.D * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.sh, T * z.D * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.shg, T * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.xg, z.TK * z.D * 2, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.gb, z.G * 2, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.ids, z.TK * 4, "MoE buffers", err, errlen) ||
        dalloc(e, (void **)&e->mo.perm, 2 * z.TK * 4, "MoE buffers", err, errlen))
        return -1;
    CU(cudaHostAlloc((void **)&e->mo.h_ids, z.TK * 4, cudaHostAllocDefault));
    CU(cudaHostAlloc((void **)&e->mo.h_perm, 2 * z.TK * 4, cudaHostAllocDefault));
    e->mo.h_count = (int32_t *)calloc(z.E + 1, sizeof(int32_t));
    if (!e->mo.h_count)
        return util_errf(err, errlen, "out of host memory for the MoE buffers.");
    return 0;
}

/* ---------------------------------------------------------------- the block */

/* y(T, n) = act(gate x) * up x, then down: the SwiGLU/GeGLU MLP of one expert over rows x(T, D). */
static int mlp(cuda_engine *e, const dmat *gate, const dmat *up, const dmat *down, const uint8_t *base, const bf16 *x,
               int64_t T, float *g, float *u, bf16 *gb, float *y, char *err, size_t errlen)
{
    int rc;
    if ((rc = cuda_gemm(e, gate, base, x, T, g, err, errlen)) || (rc = cuda_gemm(e, up, base, x, T, u, err, errlen)))
        return rc;
    CU(k_act_mul(g, u, T * gate->n, e->a.act == ARCH_ACT_GELU_TANH, gb, NULL, e->cs));
    return cuda_gemm(e, down, base, gb, T, y, err, errlen);
}

int cuda_moe_ffn(cuda_engine *e, const dlayer *w, const uint8_t *base, int64_t T, bool lazy, char *err,
                 size_t errlen)
{
    const model_desc *m = e->m;
    const dmoe *mo = w->moe;
    cudaStream_t s = e->cs;
    int64_t D = m->d_model, E = mo->E, k = m->n_experts_used, TK = T * k, FE = m->expert_ffn_dim;
    int rc;
    /* routing: scores in fp32 from the fp32 normed rows */
    CU(k_rmsnorm(e->x, w->ffn_norm, T, D, m->norm_eps, e->a.norm_plus_one, e->mo.xn, NULL, s));
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)E, (int)T, (int)D, &one, mo->router, CUDA_R_32F, (int)D,
                    e->mo.xn, CUDA_R_32F, (int)D, &zero, e->mo.logits, CUDA_R_32F, (int)E, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
    moe_route_kernel<<<blocks_for(T), 256, 0, s>>>(e->mo.logits, T, (int)E, (int)k, e->a.expert_norm, e->mo.ids,
                                                   e->mo.wts);
    CU(cudaGetLastError());
    CU(cudaMemcpyAsync(e->mo.h_ids, e->mo.ids, (size_t)TK * 4, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    /* group the slots by expert, token order within one: perm[i] = the token of sorted slot i, row[t*k+j] = the
     * sorted position of slot (t, j) */
    int32_t *cnt = e->mo.h_count, *perm = e->mo.h_perm, *row = perm + TK;
    memset(cnt, 0, (size_t)(E + 1) * sizeof *cnt);
    for (int64_t i = 0; i < TK; i++) {
        int32_t id = e->mo.h_ids[i];
        if (id < 0 || id >= E)
            return util_errf(err, errlen, "MoE routing chose expert %d of %lld (a non-finite score?).", id,
                             (long long)E);
        cnt[id + 1]++;
    }
    for (int64_t x = 0; x < E; x++)
        cnt[x + 1] += cnt[x]; /* cnt[x] = first sorted slot of expert x */
    for (int64_t i = 0; i < TK; i++) {
        int32_t at = cnt[e->mo.h_ids[i]]++;
        perm[at] = (int32_t)(i / k);
        row[i] = at;
    }
    /* cnt[x] is now one past expert x's last slot */
    CU(cudaMemcpyAsync(e->mo.perm, perm, (size_t)TK * 2 * 4, cudaMemcpyHostToDevice, s));
    moe_gather_kernel<<<blocks_for(TK * D), 256, 0, s>>>(e->xb, e->mo.perm, TK, D, e->mo.xg);
    CU(cudaGetLastError());
    if (lazy) { /* the slot holds the layer's head only: bring in the experts the rows chose */
        size_t got = 0, all = 0;
        for (int64_t x = 0; x < E; x++) {
            size_t one = 0;
            for (const dmat *d : {&mo->gate[x], &mo->up[x], &mo->down[x]})
                one += (size_t)d->n * d->row_bytes;
            all += one;
            if (cnt[x] - (x ? cnt[x - 1] : 0) > 0 && (rc = fetch_expert(e, w, base, (int)x, &got, err, errlen)))
                return rc;
        }
        e->mo.lazy_layers++;
        e->mo.lazy_bytes += got;
        e->mo.lazy_skipped += all - got;
    }
    for (int64_t x = 0; x < E; x++) {
        int32_t lo = x ? cnt[x - 1] : 0, n = cnt[x] - lo;
        if (n == 0) {
            e->mo.experts_skipped++;
            continue;
        }
        e->mo.experts_run++;
        if ((rc = mlp(e, &mo->gate[x], &mo->up[x], &mo->down[x], base, e->mo.xg + (size_t)lo * D, n,
                      e->mo.g + (size_t)lo * FE, e->mo.u + (size_t)lo * FE, e->mo.gb + (size_t)lo * FE,
                      e->mo.yg + (size_t)lo * D, err, errlen)))
            return rc;
    }
    const float *sh = NULL, *shg = NULL;
    if (mo->sh_gate.t) {
        if ((rc = mlp(e, &mo->sh_gate, &mo->sh_up, &mo->sh_down, base, e->xb, T, e->mo.g, e->mo.u, e->mo.gb, e->mo.sh,
                      err, errlen)))
            return rc;
        sh = e->mo.sh;
        if (mo->sh_gate_inp) {
            moe_dot_kernel<<<(unsigned)T, 128, 0, s>>>(e->mo.xn, mo->sh_gate_inp, D, e->mo.shg);
            CU(cudaGetLastError());
            shg = e->mo.shg;
        }
    }
    moe_combine_kernel<<<blocks_for(T * D), 256, 0, s>>>(e->mo.yg, e->mo.perm + TK, e->mo.wts, T, (int)k, D, sh, shg,
                                                         e->h);
    CU(cudaGetLastError());
    return 0;
}
