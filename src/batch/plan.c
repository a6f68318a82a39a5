/*
 * plan.c — the memory plan (see plan.h for the model and its terms).
 *
 * Owns: the split of the budget (plan_solve), the measured-excess fit
 * (mem_fit), and one job's plan made from its model, engine options and
 * rows (plan_job), observed per pass and stored at the end.  Does not own:
 * the budget's value (run_opts.c reads --mem-budget and its default once),
 * the GPU's HBM plan (engine/hbm_plan.c clamps what plan_job asks for), the
 * KV arena itself (engine/kv.c), or admission (sched.c reads plan.guard).
 *
 * Key decision: the computed model is primary and the measurement only
 * corrects it.  A plan made from RSS alone could not be made before the
 * engine exists; a plan from the computed model alone misses allocator and
 * library overhead, so the stored fit's excess is added back (capped at a
 * quarter of the budget so one bad run cannot starve the KV cache).
 */
#include "plan.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"
#include "../engine/kv.h"
#include "calib.h"
#include "token_mask.h"

uint64_t plan_slack(uint64_t budget)
{
    return budget / 50 + (4u << 20);
}

static void fmt_mb(uint64_t b, char *out, size_t cap)
{
    snprintf(out, cap, "%.1f MB", (double)b / 1e6);
}

int plan_solve(const mem_need *n, mem_plan *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    uint64_t slack = plan_slack(n->budget);
    uint64_t common = n->base + n->pass + n->extra + slack;
    uint64_t fixed_res = common + n->weights, fixed_str = common + n->ring;
    uint64_t want = (uint64_t)n->want_pages * n->page_bytes, min = (uint64_t)n->min_pages * n->page_bytes;
    if (n->kv_cap && want > n->kv_cap)
        want = n->kv_cap;
    bool stream;
    if (n->mode == 1)
        stream = true;
    else if (n->mode == 2)
        stream = false;
    else /* resident when the batch's KV still fits beside the weights, or when streaming would not buy more KV */
        stream = fixed_res + want > n->budget && fixed_str < fixed_res;
    uint64_t fixed = stream ? fixed_str : fixed_res;
    char b[32], f[32], m[32];
    fmt_mb(n->budget, b, sizeof b);
    fmt_mb(fixed, f, sizeof f);
    fmt_mb(min, m, sizeof m);
    if (fixed + min > n->budget) {
        if (!stream && n->mode == 0 && fixed_str + min <= n->budget) {
            stream = true;
            fixed = fixed_str;
        } else
        {
            char pr[32], wt[32], pa[32], sl[32];
            fmt_mb(n->base, pr, sizeof pr);
            fmt_mb(stream ? n->ring : n->weights, wt, sizeof wt);
            fmt_mb(n->pass + n->extra, pa, sizeof pa);
            fmt_mb(slack, sl, sizeof sl);
            return util_errf(err, errlen,
                             "the memory budget of %s cannot hold the job: %s of fixed costs (process %s, %s %s, "
                             "pass buffers %s, slack %s) plus %s of KV cache for its longest row; raise "
                             "--mem-budget%s.",
                             b, f, pr, stream ? "streamed weights' ring and global tensors" : "resident weights", wt,
                             pa, sl, m, stream || n->mode ? "" : " or stream the weights (--stream)");
        }
    }
    uint64_t room = n->budget - fixed;
    if (n->kv_cap && room > n->kv_cap)
        room = n->kv_cap;
    uint64_t pages = room / n->page_bytes;
    if (pages > (uint64_t)n->want_pages)
        pages = (uint64_t)n->want_pages; /* never more than the batch can use */
    if (pages < (uint64_t)n->min_pages)
        pages = (uint64_t)n->min_pages;
    if (pages > INT32_MAX / 2)
        pages = INT32_MAX / 2;
    p->stream = stream;
    p->kv_pages = (int32_t)pages;
    p->want_pages = n->want_pages;
    p->fixed = fixed;
    p->total = fixed + pages * n->page_bytes;
    p->guard = n->budget - slack / 2;
    return 0;
}

/* /proc/self/status field in kB, as bytes. */
static uint64_t status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    size_t fl = strlen(field);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl) && line[fl] == ':') {
            v = strtoull(line + fl + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

uint64_t plan_rss_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    unsigned long long size = 0, res = 0;
    int got = fscanf(f, "%llu %llu", &size, &res);
    fclose(f);
    return got == 2 ? (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

uint64_t plan_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    bool got = false;
    while (!got && fgets(line, sizeof line, f))
        got = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    return got ? (uint64_t)kb * 1024 : 0;
}

uint64_t plan_rss_peak(void)
{
    return status_kb("VmHWM");
}

void mem_fit_observe(mem_fit *f, double x, double y)
{
    f->n += 1;
    f->sx += x;
    f->sy += y;
    f->sxx += x * x;
    f->sxy += x * y;
}

bool mem_fit_solve(mem_fit *f)
{
    f->valid = false;
    if (f->n < 2)
        return false;
    double det = f->n * f->sxx - f->sx * f->sx;
    if (fabs(det) < 1e-9 * (f->n * f->sxx + 1)) { /* one x value: the mean is the base, no slope */
        f->base = f->sy / f->n;
        f->slope = 0;
    } else {
        f->slope = (f->n * f->sxy - f->sx * f->sy) / det;
        f->base = (f->sy - f->slope * f->sx) / f->n;
    }
    f->valid = isfinite(f->base) && isfinite(f->slope);
    return f->valid;
}

int mem_fit_load(const char *path, mem_fit *f)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return -1;
    memset(f, 0, sizeof *f);
    f->n = json_number_value(json_object_get(j, "n"));
    f->sx = json_number_value(json_object_get(j, "sx"));
    f->sy = json_number_value(json_object_get(j, "sy"));
    f->sxx = json_number_value(json_object_get(j, "sxx"));
    f->sxy = json_number_value(json_object_get(j, "sxy"));
    json_decref(j);
    mem_fit_solve(f);
    return 0;
}

int mem_fit_save(const char *path, const mem_fit *f, char *err, size_t errlen)
{
    json_t *j = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:b}", "n", f->n, "sx", f->sx, "sy", f->sy, "sxx", f->sxx,
                          "sxy", f->sxy, "base_bytes", f->base, "bytes_per_seq_token", f->slope, "valid", f->valid);
    char *text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
    json_decref(j);
    if (!text)
        return util_errf(err, errlen, "%s: out of memory.", path);
    int rc = util_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

static int cmp_desc_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void plan_kv_want(int32_t *need, size_t n, int batch, int32_t *want, int32_t *min)
{
    int32_t largest = 1;
    for (size_t i = 0; i < n; i++)
        if (need[i] > largest)
            largest = need[i];
    qsort(need, n, sizeof *need, cmp_desc_i32);
    int64_t sum = 0;
    for (size_t i = 0; i < n && i < (size_t)batch; i++)
        sum += need[i];
    if (sum < largest)
        sum = largest;
    if (sum > INT32_MAX / 4)
        sum = INT32_MAX / 4;
    *want = (int32_t)sum;
    *min = largest;
}

/* $SPILL_HOME/calibration/<fingerprint>-<host>-mem.json: the excess is a property of model and machine. */
static int fit_path(const char *fingerprint, char *out, size_t cap)
{
    char host[128] = "host", key[300];
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "%.16s-%s-mem", fingerprint, host);
    for (char *k = key; *k; k++)
        if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '-'))
            *k = '_';
    return calib_path(key, out, cap);
}

int plan_job(mem_job *mj, const mem_job_in *in, bool gpu, char *err, size_t errlen)
{
    int threads = in->threads > 0 ? in->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    const model_desc *m = in->m;
    int32_t want = in->want_pages, min_pages = in->min_pages;
    if (gpu) {
        /* On the GPU the KV cache and the pass buffers live in HBM, and streamed layers sit pinned in host
         * RAM: ask for the pages the batch can use, and let the GPU backend's HBM plan clamp them and
         * choose what streams (--stream still forces it).  No host guard. */
        memset(&mj->plan, 0, sizeof mj->plan);
        mj->plan.gpu = true;
        mj->plan.stream = in->mode == 1;
        uint64_t gpage = kv_page_bytes_as(m->n_layers, m->n_kv_heads, m->head_dim, in->page_tokens,
                                          in->kv_dtype == KV_I8 ? KV_I8 : KV_BF16);
        uint64_t cap = in->kv_cap ? in->kv_cap / gpage : (uint64_t)want;
        mj->plan.kv_pages = (int32_t)(cap < (uint64_t)want ? cap : (uint64_t)want);
        if (mj->plan.kv_pages < min_pages)
            mj->plan.kv_pages = min_pages;
        mj->plan.want_pages = want;
        mj->path[0] = 0;
        return 0;
    }
    engine_opts eo = *in->eo;
    uint64_t w_res, ring_res, pass_res, w_str, ring_str, pass_str;
    eo.stream = false;
    engine_mem_estimate(m, &eo, threads, &w_res, &ring_res, &pass_res);
    eo.stream = true;
    engine_mem_estimate(m, &eo, threads, &w_str, &ring_str, &pass_str);
    /* the runner's share of a pass: logits of every sequence, sampling scratch per thread */
    uint64_t V = (uint64_t)m->vocab, runner_pass = (uint64_t)in->max_seqs * V * 4 + (uint64_t)(threads + 1) * V * 16;
    /* structured output: the token masks' cache (capped, emptied whole when full) and walks, on the host */
    if (in->masks)
        runner_pass += token_mask_plan_bytes(m->vocab, threads, TOKEN_MASK_CACHE_BYTES);
    mem_need n = {in->budget, plan_rss_now(), w_res, w_str + ring_str, pass_res + runner_pass + in->draft_fixed, 0,
                  mj->page_bytes, want, min_pages, in->mode, in->kv_cap};
    if (fit_path(in->fingerprint, mj->path, sizeof mj->path) != 0 || mem_fit_load(mj->path, &mj->stored) != 0)
        memset(&mj->stored, 0, sizeof mj->stored);
    if (mj->stored.valid) {
        double x = mj->stored.base + mj->stored.slope * (double)want * in->page_tokens;
        if (x > 0)
            n.extra = x < (double)n.budget / 4 ? (uint64_t)x : n.budget / 4;
    }
    if (plan_solve(&n, &mj->plan, err, errlen))
        return -1;
    mj->ring = ring_str;
    mj->fixed_model = n.base + n.pass + (mj->plan.stream ? n.ring : n.weights);
    return 0;
}

void plan_observe(mem_job *mj, int32_t kv_used, double seq_tokens)
{
    if (kv_used > mj->kv_peak_used)
        mj->kv_peak_used = kv_used;
    uint64_t rss = plan_rss_now();
    if (!rss)
        return;
    double modelled = (double)mj->fixed_model + (double)mj->kv_peak_used * (double)mj->page_bytes;
    mem_fit_observe(&mj->run, seq_tokens, (double)rss - modelled);
}

int plan_save_fit(const mem_job *mj, char *err, size_t errlen)
{
    if (!mj->path[0] || mj->run.n < 2)
        return 0;
    mem_fit f = mj->stored;
    f.n += mj->run.n;
    f.sx += mj->run.sx;
    f.sy += mj->run.sy;
    f.sxx += mj->run.sxx;
    f.sxy += mj->run.sxy;
    mem_fit_solve(&f);
    return mem_fit_save(mj->path, &f, err, errlen);
}

uint64_t plan_host_mem(uint64_t budget)
{
    uint64_t used = plan_rss_now() + (1ull << 30);
    return budget > used ? budget - used : 1;
}
