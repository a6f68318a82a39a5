/*
 * hbm_plan.c — the GPU memory split that maximises modelled rows per second
 * (see hbm_plan.h for the model).
 */
#include "hbm_plan.h"

#include <string.h>

#include "kv.h"

void hbm_need_for(const model_desc *m, const engine_opts *o, uint64_t hbm, uint64_t margin, int resident_layers,
                  hbm_need *out)
{
    memset(out, 0, sizeof *out);
    int L = m->n_layers > 0 ? m->n_layers : 1, slots = o->stream_slots >= 2 ? o->stream_slots : 3;
    uint64_t layers_total = 0, layer_max = 0, cur = 0;
    int cur_l = -2;
    for (size_t i = 0; i < m->n_ranges; i++) { /* ranges come in layer order, a layer's ranges together */
        const layer_range *r = &m->ranges[i];
        if (r->layer < 0)
            continue;
        if (r->layer != cur_l)
            cur = 0, cur_l = r->layer;
        cur += r->bytes;
        layers_total += r->bytes;
        layer_max = cur > layer_max ? cur : layer_max;
    }
    /* FLOPs a token costs: 2 × the parameters of every matrix it multiplies (the embedding is a gather) */
    double params = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        if (t->n_dims == 2 && strcmp(t->name, "token_embd.weight"))
            params += (double)t->ne[0] * (double)t->ne[1];
    }
    int kvt = o->kv_dtype == KV_I8 ? KV_I8 : KV_BF16;
    out->hbm = hbm;
    out->margin = margin;
    out->globals = m->total_bytes > layers_total ? m->total_bytes - layers_total : 0;
    out->layer_bytes = layers_total / (uint64_t)L;
    out->ring_slots = slots < L ? slots : L;
    out->ring = layer_max * (uint64_t)out->ring_slots;
    out->n_layers = L;
    out->page_bytes = kv_page_bytes_as(m->n_layers, m->n_kv_heads, m->head_dim, o->page_tokens, kvt);
    out->want_pages = o->kv_pages > 0 ? o->kv_pages : 256;
    out->rows = o->max_pass_seqs > 0 ? o->max_pass_seqs : 1;
    out->h2d_bps = 55e9;
    out->hbm_bps = 4.0e12;
    out->flops = 650e12;
    out->flops_per_token = 2 * params;
    out->force_stream = o->stream;
    out->fixed_resident = -1;
    hbm_plan fit;
    bool fits = hbm_plan_eval(out, L, &fit) && fit.pages >= out->want_pages;
    if (resident_layers >= 0 && (o->stream || !fits))
        out->fixed_resident = resident_layers;
}

bool hbm_plan_eval(const hbm_need *n, int r, hbm_plan *out)
{
    int L = n->n_layers > 0 ? n->n_layers : 1;
    memset(out, 0, sizeof *out);
    if (r < 0 || r > L || n->page_bytes == 0)
        return false;
    bool streamed = r < L;
    uint64_t model = n->globals + (uint64_t)L * n->layer_bytes;
    uint64_t fixed = n->margin + n->globals + (streamed ? n->ring : 0) + (uint64_t)r * n->layer_bytes;
    if (fixed + 2 * n->page_bytes > n->hbm)
        return false;
    uint64_t room = (n->hbm - fixed) / n->page_bytes;
    int64_t want = n->want_pages > 2 ? n->want_pages : 2;
    int64_t pages = (int64_t)room < want ? (int64_t)room : want;
    if (pages > INT32_MAX)
        pages = INT32_MAX;
    double rows = (double)(n->rows > 0 ? n->rows : 1) * (double)pages / (double)want;
    double stream = streamed && n->h2d_bps > 0 ? (double)(L - r) * (double)n->layer_bytes / n->h2d_bps : 0.0;
    double compute = n->flops > 0 ? rows * n->flops_per_token / n->flops : 0.0;
    double memory = n->hbm_bps > 0 ? ((double)model + (double)pages * (double)n->page_bytes) / n->hbm_bps : 0.0;
    double device = compute > memory ? compute : memory;
    double pass = stream > device ? stream : device;
    out->streamed = streamed;
    out->resident = r;
    out->pages = (int32_t)pages;
    out->rows = rows;
    out->pass_s = pass;
    out->rows_per_s = pass > 0 ? rows / pass : 0.0;
    return true;
}

int hbm_plan_choose(const hbm_need *n, hbm_plan *out)
{
    int L = n->n_layers > 0 ? n->n_layers : 1;
    if (n->fixed_resident >= 0) { /* the user's prefix: the rest of HBM to KV */
        int r = n->fixed_resident < L - 1 ? n->fixed_resident : L - 1;
        for (; r >= 0; r--) /* a prefix that leaves no room for two pages shrinks */
            if (hbm_plan_eval(n, r, out))
                return 0;
        return -1;
    }
    hbm_plan cur;
    if (!n->force_stream && hbm_plan_eval(n, L, &cur) && cur.pages >= n->want_pages) {
        *out = cur; /* the model and the batch's KV fit: nothing streams */
        return 0;
    }
    /* the best modelled rate among streamed splits; within 0.1% of it, the most rows (memory on batch beats
     * memory on weights where the model cannot tell them apart), then the most resident layers */
    double top = -1.0;
    for (int r = 0; r < L; r++)
        if (hbm_plan_eval(n, r, &cur) && cur.rows_per_s > top)
            top = cur.rows_per_s;
    if (top < 0)
        return -1;
    bool found = false;
    for (int r = 0; r < L; r++) {
        if (!hbm_plan_eval(n, r, &cur) || cur.rows_per_s < top * 0.999)
            continue;
        if (!found || cur.rows > out->rows * (1 + 1e-12)) {
            *out = cur;
            found = true;
        } else if (cur.rows >= out->rows * (1 - 1e-12))
            *out = cur; /* as many rows, more layers resident */
    }
    return found ? 0 : -1;
}
