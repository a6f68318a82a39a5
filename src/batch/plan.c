/*
 * plan.c — the memory plan (see plan.h).
 */
#include "plan.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/util.h"

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
