/*
 * chunk.c — the prompt budget per pass (chunk.h has the model and why).  Pure
 * arithmetic on the passes observed: no clock, no engine, so tests drive it
 * with a fake cost model.
 */
#include "chunk.h"

void chunk_init(chunk_ctl *c, bool adaptive, int cap, int floor, double ratio)
{
    *c = (chunk_ctl){0};
    c->adaptive = adaptive;
    c->cap = cap > 1 ? cap : 1;
    c->floor = floor < 1 ? 1 : floor > c->cap ? c->cap : floor;
    c->ratio = ratio > 1 ? ratio : CHUNK_RATIO;
    c->budget = c->cap;
}

int chunk_budget(const chunk_ctl *c)
{
    if (!c->adaptive)
        return c->cap;
    return c->probe ? c->floor : c->budget;
}

void chunk_observe(chunk_ctl *c, int prompt, double secs)
{
    bool probe = c->probe;
    if (c->passes++ == 0 || secs <= 0) {
        c->probe = c->adaptive && c->clean_s <= 0; /* the warm-up said nothing: measure the clean pass next */
        return;
    }
    if (prompt == 0 || probe) {
        c->probes += probe;
        c->clean_s = secs;
        c->since_clean = 0;
        c->probe = false;
        return;
    }
    c->carrying++;
    c->last = prompt;
    c->since_clean++;
    if (c->clean_s <= 0) {
        c->probe = c->adaptive;
        return;
    }
    if (secs < c->clean_s) /* a pass with prompt tokens costs at least a clean one: the clean one is no slower */
        c->clean_s = secs;
    double r = secs / c->clean_s;
    c->measured++;
    c->ratio_sum += r;
    c->ratio_max = r > c->ratio_max ? r : c->ratio_max;
    if (!c->adaptive)
        return;
    double target = c->ratio * c->clean_s, next = (double)prompt * target / secs;
    if (secs <= target)
        c->over_s = 0;
    else if (c->over_s == 0)
        c->over_p = prompt, c->over_s = secs;
    if (secs <= target && next < c->budget) /* within the target: it may have carried fewer tokens than allowed */
        next = c->budget;
    if (next > 2.0 * c->budget) /* hidden under the copy says only that the knee is further on */
        next = 2.0 * c->budget;
    c->budget = next < c->floor ? c->floor : next > c->cap ? c->cap : (int)next;
    /* re-measure the clean pass when it is old, or when passes over the target say the clean pass grew (more
     * decode rows, a slower link): one overshoots at the floor, or a fifth fewer prompt tokens than the run's
     * first did not make them shorter (2%: noise) */
    if (c->since_clean >= CHUNK_PROBE_EVERY ||
        (secs > target && (prompt <= c->floor || (prompt <= 0.8 * c->over_p && secs >= 0.98 * c->over_s)))) {
        c->probe = true;
        c->over_s = 0;
    }
}
