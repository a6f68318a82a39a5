/*
 * sched.c — the scheduler of one batch job (see sched.h for the calls).
 *
 * Owns: a row's life (pending → active → done, and back to pending when
 * preempted), the queue, admission, KV page reservation and preemption,
 * the list of sequences one pass carries, and the ETA replay of this same
 * policy.  Does not own: the forward pass (the backend), drawing tokens
 * (sample.c) or applying them (run.c: end ids, text, stop strings, output),
 * the memory plan that sized the cache (plan.c), what the user sees.
 *
 * The policy, in one paragraph: rows wait in a queue ordered longest-first
 * (prompt + max new tokens), so the expensive rows start early and the end
 * tail is made of short ones.  Every pass carries one decode token for every
 * active choice, then prompt chunks of admitted rows up to a per-pass token
 * cap (adapted to the passes' times when the layers stream: chunk.h), all
 * through the same matmuls.  A row is admitted when a batch slot is
 * free and the KV arena can hold its prompt while leaving one page of growth
 * per active choice; pages are reserved as positions are written.  If a
 * choice needs a page and none is free, the most recently admitted row is
 * preempted — even when it is the row asking, so the oldest row always
 * advances and no two rows can evict each other forever: its pages are freed
 * and it goes back to the head of the queue to be recomputed from scratch,
 * which yields the same tokens because a row's logits never depend on its
 * batch-mates and its RNG restarts from its seed.  When every admitted row is
 * mid-prompt and none can get a page, the newest is preempted the same way.
 *
 * Key decision: recompute, not swap.  A preempted row loses its pages and
 * starts over; keeping a copy of its KV elsewhere would cost memory the
 * plan gave to the batch, and preemption is rare once the plan sized the
 * cache for the batch's largest rows.  tests/test_sched.c checks that the
 * answers under a tight plan equal those of a roomy one.
 */
#include "sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "plan.h"

/* ---------------------------------------------------------------- rows */

static void choice_free(choice *c, kv_cache *kv, kv_cache *draft_kv)
{
    kv_row_free(kv, &c->kv);
    if (draft_kv)
        kv_row_free(draft_kv, &c->dkv);
    sample_state_free(&c->ss);
    tok_stream_free(c->ts);
    stop_free(&c->sm);
    free(c->text);
    free(c->lp);
    free(c->alts);
    free(c->gs);
    free(c->gen);
    memset(c, 0, sizeof *c);
}

/* Frees a row's choices and their pages (the row keeps its request). */
static void row_release(sched *s, row *w)
{
    if (w->ch)
        for (int c = 0; c < w->n_choices; c++)
            choice_free(&w->ch[c], s->kv, s->cfg.draft_kv);
    free(w->ch);
    w->ch = NULL;
}

void sched_row_free(row *w)
{
    free(w->custom_id);
    free(w->model);
    free(w->requested);
    free(w->prompt);
    for (int i = 0; i < w->n_stop; i++)
        free(w->stop[i]);
    free(w->bias_id);
    free(w->bias);
    free(w->plp);
    free(w->palts);
    free(w->echo);
    free(w->gline);
    toolcall_row_free(&w->tc);
}

int32_t sched_row_pages(const kv_cache *kv, const row *w, bool prefix)
{
    int32_t share = prefix && w->n_choices > 1 ? (w->n_choices - 1) * ((w->n_prompt - 1) / kv->page_tokens) : 0;
    return kv_pages_for(kv, (int32_t)(w->n_prompt + w->max_new)) * w->n_choices - share;
}

int32_t sched_row_expect_pages(const kv_cache *kv, const row *w)
{
    int64_t g = w->expect_new > 0 && w->expect_new < w->max_new ? w->expect_new : w->max_new;
    int64_t t = (int64_t)w->n_prompt + g;
    return kv_pages_for(kv, (int32_t)(t > INT32_MAX / 2 ? INT32_MAX / 2 : t)) * w->n_choices;
}

/* Prompt tokens a row may map instead of computing: all but the last (whose logits draw the first token), and
 * for a scored row none it must score (their logits come from its own prefill). */
static int32_t share_limit(const row *w)
{
    int32_t lim = w->score_from > 0 ? w->score_from - 1 : w->n_prompt - 1;
    return lim < 0 ? 0 : lim;
}

/* Pages the row's choices > 0 map from choice 0's prompt instead of holding their own (the prefix cache). */
static int32_t choice_share_pages(const sched *s, const row *w)
{
    return s->cfg.prefix && w->n_choices > 1 ? (w->n_choices - 1) * ((w->n_prompt - 1) / s->kv->page_tokens) : 0;
}

/* Pages the reserving admission still expects the admitted row w to take: for each choice its expected pages
 * beyond the page-table entries it has now (entries it maps count, since the pages in use are counted once
 * beside this), less, for a choice > 0 not yet started, the pages it will map from choice 0. */
static int32_t row_growth(const sched *s, const row *w)
{
    int32_t e = sched_row_expect_pages(s->kv, w) / w->n_choices, g = 0;
    int32_t share = w->n_choices > 1 ? choice_share_pages(s, w) / (w->n_choices - 1) : 0;
    for (int c = 0; w->ch && c < w->n_choices; c++) {
        int32_t held = w->ch[c].kv.n_pages;
        int32_t want = e - (c > 0 && held == 0 ? share : 0);
        g += want > held ? want - held : 0;
    }
    return g;
}

/* Creates the row's choices (sampling state keyed by its seed, detokenizer, stop matcher, log-prob arrays)
 * and makes it active. */
static int start_row(sched *s, row *w, char *err, size_t errlen)
{
    w->ch = calloc((size_t)w->n_choices, sizeof *w->ch);
    if (!w->ch)
        return util_errf(err, errlen, "out of memory admitting row %s.", w->custom_id);
    for (int c = 0; c < w->n_choices; c++) {
        choice *ch = &w->ch[c];
        ch->next = -1;
        /* Seeded rows key the RNG by (seed, choice); unseeded rows by the job seed and (line, choice). */
        uint64_t seed = w->has_seed ? (uint64_t)w->seed : s->cfg.job_seed;
        uint64_t k = (uint64_t)(w->choice_base + c);
        uint64_t stream = w->has_seed ? k : ((uint64_t)w->line << 8) ^ k;
        const char *sp[REQ_MAX_STOP];
        for (int i = 0; i < w->n_stop; i++)
            sp[i] = w->stop[i];
        if (sample_state_init(&ch->ss, &w->sp, seed, stream, s->cfg.vocab, w->max_new, err, errlen) ||
            tok_stream_init(s->cfg.tok, true, &ch->ts, err, errlen) ||
            stop_init(&ch->sm, sp, w->stop_len, w->n_stop, err, errlen))
            return -1;
        if (w->grammar) {
            if (!(ch->gs = malloc(sizeof *ch->gs)))
                return util_errf(err, errlen, "out of memory admitting row %s.", w->custom_id);
            gstate_init(w->grammar, ch->gs);
        }
        if (w->sp.logprobs) { /* grown by sched_lp_room as tokens arrive: a batch of unbounded rows holds
                                 what they generated, not max_new each */
            ch->lp_cap = (size_t)(w->max_new > 64 ? 64 : w->max_new > 0 ? w->max_new : 1);
            ch->lp = calloc(ch->lp_cap, sizeof *ch->lp);
            ch->alts = calloc(ch->lp_cap * (size_t)(w->sp.n_top_logprobs + 1), sizeof *ch->alts);
            if (!ch->lp || !ch->alts)
                return util_errf(err, errlen, "out of memory for the log-probs of row %s.", w->custom_id);
        }
    }
    w->state = ROW_ACTIVE;
    w->admitted = ++s->admit_serial;
    s->active[s->n_active++] = (size_t)(w - s->rows);
    return 0;
}

int sched_lp_room(choice *c, int top, char *err, size_t errlen)
{
    if ((size_t)c->n_gen < c->lp_cap)
        return 0;
    size_t cap = c->lp_cap ? c->lp_cap * 2 : 64, per = (size_t)top + 1;
    out_token *lp = realloc(c->lp, cap * sizeof *lp);
    if (lp)
        c->lp = lp;
    out_alt *alts = lp ? realloc(c->alts, cap * per * sizeof *alts) : NULL;
    if (!alts)
        return util_errf(err, errlen, "out of memory for the log-probs of %zu tokens.", cap);
    c->alts = alts;
    c->lp_cap = cap;
    for (int32_t i = 0; i < c->n_gen; i++) /* the entries point into alts, which may have moved */
        c->lp[i].top = c->alts + (size_t)i * per;
    return 0;
}

/* Removes active[ai] from the batch (order kept). */
static void drop_active(sched *s, size_t ai)
{
    memmove(s->active + ai, s->active + ai + 1, (s->n_active - ai - 1) * sizeof *s->active);
    s->n_active--;
}

/* Frees the row's pages and state and puts it back at the head of the queue. */
static void preempt(sched *s, size_t ai)
{
    size_t idx = s->active[ai];
    row *w = &s->rows[idx];
    row_release(s, w);
    w->state = ROW_PENDING;
    w->preempted++;
    s->preemptions++;
    drop_active(s, ai);
    s->queue[--s->q_head] = idx;
    s->q_len++;
}

/* The admitted row with the highest admission serial. */
static size_t newest_active(const sched *s)
{
    size_t victim = 0;
    for (size_t i = 1; i < s->n_active; i++)
        if (s->rows[s->active[i]].admitted > s->rows[s->active[victim]].admitted)
            victim = i;
    return victim;
}

void sched_retire_row(sched *s, size_t ai)
{
    row *w = &s->rows[s->active[ai]];
    row_release(s, w);
    w->state = ROW_DONE;
    free(w->prompt);
    w->prompt = NULL;
    free(w->plp);
    free(w->palts);
    w->plp = NULL;
    w->palts = NULL;
    drop_active(s, ai);
}

/* ---------------------------------------------------------------- the queue */

/* A queue entry with its sort keys computed once: cost (prompt + max new tokens), and with the prefix cache its
 * group (the key of its first full prompt page) and the group's largest cost. */
typedef struct queue_key {
    int64_t cost, gcost;
    uint64_t g;
    size_t line, idx;
} queue_key;

static int cmp_longest(const void *a, const void *b)
{
    const queue_key *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static int cmp_group(const void *a, const void *b)
{
    const queue_key *x = a, *y = b;
    return x->g < y->g ? -1 : x->g > y->g;
}

/* Groups longest first, a group's rows in token order (a prompt before the longer ones it begins), then as
 * cmp_longest.  Rows of one group have the same adapter: it seeds the group key. */
static int cmp_grouped(const void *a, const void *b, void *ctx)
{
    const queue_key *x = a, *y = b;
    const row *rows = ctx;
    if (x->gcost != y->gcost)
        return x->gcost > y->gcost ? -1 : 1;
    if (x->g != y->g)
        return x->g < y->g ? -1 : 1;
    const row *u = &rows[x->idx], *v = &rows[y->idx];
    int32_t n = u->n_prompt < v->n_prompt ? u->n_prompt : v->n_prompt;
    for (int32_t i = 0; i < n; i++)
        if (u->prompt[i] != v->prompt[i])
            return u->prompt[i] < v->prompt[i] ? -1 : 1;
    if (u->n_prompt != v->n_prompt)
        return u->n_prompt < v->n_prompt ? -1 : 1;
    return cmp_longest(a, b);
}

int sched_order(row *rows, size_t n_rows, int32_t P, bool prefix, size_t *out, size_t *n_out)
{
    queue_key *keys = malloc((n_rows + 1) * sizeof *keys);
    if (!keys)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < n_rows; i++)
        if (rows[i].state == ROW_PENDING) {
            row *w = &rows[i];
            int64_t cost = (int64_t)w->n_prompt + w->max_new;
            /* a row with no full page to share is a group of its own (its key cannot be a page's, bar 2^-64) */
            uint64_t g = prefix && share_limit(w) >= P ? kv_chain_key(kv_chain_start(w->adapter).key, w->prompt, P)
                                                       : ~(uint64_t)i;
            keys[n++] = (queue_key){cost, cost, g, w->line, i};
            w->share_hint = 0;
        }
    if (!prefix)
        /* lines are unique, so the order is total: the same queue whatever qsort does with ties */
        qsort(keys, n, sizeof *keys, cmp_longest);
    else {
        qsort(keys, n, sizeof *keys, cmp_group);
        for (size_t a = 0, b; a < n; a = b) {
            int64_t mx = 0;
            for (b = a; b < n && keys[b].g == keys[a].g; b++)
                mx = keys[b].cost > mx ? keys[b].cost : mx;
            for (size_t k = a; k < b; k++)
                keys[k].gcost = mx;
        }
        qsort_r(keys, n, sizeof *keys, cmp_grouped, rows);
        /* in token order a row shares most with its predecessor: the pages it can map once that one ran */
        for (size_t k = 1; k < n; k++) {
            row *w = &rows[keys[k].idx];
            const row *v = &rows[keys[k - 1].idx];
            if (keys[k].g != keys[k - 1].g)
                continue;
            int32_t lim = share_limit(w) < v->n_prompt ? share_limit(w) : v->n_prompt, l = 0;
            while (l < lim && w->prompt[l] == v->prompt[l])
                l++;
            w->share_hint = l / P * P;
        }
    }
    for (size_t i = 0; i < n; i++)
        out[i] = keys[i].idx;
    *n_out = n;
    free(keys);
    return 0;
}

int sched_init(sched *s, const sched_cfg *cfg, row *rows, size_t n_rows, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->kv = cfg->be->kv(cfg->be->impl);
    s->rows = rows;
    s->n_rows = n_rows;
    s->queue = malloc((n_rows + 1) * sizeof *s->queue);
    s->active = malloc((n_rows + 1) * sizeof *s->active);
    s->seqs = malloc((size_t)cfg->max_seqs * sizeof *s->seqs);
    s->seq_row = malloc((size_t)cfg->max_seqs * sizeof *s->seq_row);
    s->seq_choice = malloc((size_t)cfg->max_seqs * sizeof *s->seq_choice);
    s->seq_spec = calloc((size_t)cfg->max_seqs, sizeof *s->seq_spec);
    int32_t longest = 0;
    for (size_t i = 0; i < n_rows; i++)
        longest = rows[i].n_prompt > longest ? rows[i].n_prompt : longest;
    s->find_cap = longest / s->kv->page_tokens + 1;
    s->find = malloc((size_t)s->find_cap * sizeof *s->find);
    if (!s->queue || !s->active || !s->seqs || !s->seq_row || !s->seq_choice || !s->seq_spec || !s->find)
        return util_errf(err, errlen, "out of memory for %zu rows.", n_rows);
    if (cfg->prefix && kv_prefix_enable(s->kv, err, errlen))
        return -1;
    int floor = s->kv->page_tokens > CHUNK_FLOOR ? s->kv->page_tokens : CHUNK_FLOOR;
    chunk_init(&s->chunk, cfg->chunk_adapt, cfg->prefill_chunk, floor, CHUNK_RATIO);
    size_t n;
    /* the queue ends at n_rows + 1, leaving room at the head for preempted rows to return to */
    if (sched_order(rows, n_rows, s->kv->page_tokens, cfg->prefix, s->queue + 1, &n))
        return util_errf(err, errlen, "out of memory for %zu rows.", n_rows);
    s->q_head = n_rows + 1 - n;
    memmove(s->queue + s->q_head, s->queue + 1, n * sizeof *s->queue);
    s->q_len = n;
    return 0;
}

size_t sched_take_queue(sched *s, size_t *out)
{
    size_t n = s->q_len;
    memcpy(out, s->queue + s->q_head, n * sizeof *out);
    s->q_head += n;
    s->q_len = 0;
    return n;
}

void sched_enqueue(sched *s, const size_t *idx, size_t n)
{
    /* the queue always ends at n_rows + 1 (admission takes from the head, preemption returns to it): shift
     * it down by n; the rows queued, active and added are distinct rows, so the head stays >= 0 */
    memmove(s->queue + s->q_head - n, s->queue + s->q_head, s->q_len * sizeof *s->queue);
    s->q_head -= n;
    memcpy(s->queue + s->q_head + s->q_len, idx, n * sizeof *idx);
    s->q_len += n;
}

void sched_free(sched *s)
{
    for (size_t i = 0; s->kv && i < s->n_rows; i++)
        row_release(s, &s->rows[i]);
    free(s->queue);
    free(s->active);
    free(s->seqs);
    free(s->seq_row);
    free(s->seq_choice);
    free(s->seq_spec);
    free(s->find);
    memset(s, 0, sizeof *s);
}

bool sched_pending(const sched *s) { return s->q_len || s->n_active; }

/* ---------------------------------------------------------------- admission and pages */

static int32_t active_choices(const sched *s)
{
    int32_t n = 0;
    for (size_t i = 0; i < s->n_active; i++)
        n += s->rows[s->active[i]].n_choices;
    return n;
}

/* The prefix cache for the queue head w: the pages it can map now (into s->find; *idle of them idle, *ch the
 * walk after them), and whether it should wait a pass because a running row is computing more of what w
 * shares with it (admitted now, w would compute those pages a second time). */
static int32_t head_prefix(sched *s, const row *w, kv_chain *ch, int32_t *idle, bool *wait)
{
    *ch = kv_chain_start(w->adapter);
    *idle = 0;
    *wait = false;
    if (!s->cfg.prefix)
        return 0;
    int32_t P = s->kv->page_tokens, lim = share_limit(w) / P;
    int32_t m = kv_prefix_find(s->kv, ch, w->prompt, lim, s->find, idle);
    for (size_t i = 0; i < s->n_active && !*wait && m < lim; i++) {
        const row *a = &s->rows[s->active[i]];
        if (a->adapter != w->adapter || !a->ch || a->ch[0].fed >= a->n_prompt)
            continue;
        int32_t bound = lim * P < a->n_prompt ? lim * P : a->n_prompt, l = 0;
        if (a->ch[0].fed >= bound / P * P)
            continue; /* it has written (and indexed) every page the two could share */
        while (l < bound && a->prompt[l] == w->prompt[l])
            l++;
        *wait = l / P > m && a->ch[0].fed < l / P * P;
    }
    return m;
}

int sched_admit(sched *s, char *err, size_t errlen)
{
    /* the live guard: the plan is the primary control; near the budget, no newcomers this pass */
    if (s->q_len && s->n_active > 0 && s->cfg.guard && plan_rss_now() > s->cfg.guard) {
        s->guard_pauses++;
        return 0;
    }
    /* cfg.reserve: the pages in use (a shared one once) and what the admitted rows are still expected to take */
    int64_t committed = s->kv->n_pages - s->kv->n_free;
    for (size_t i = 0; s->cfg.reserve && i < s->n_active; i++)
        committed += row_growth(s, &s->rows[s->active[i]]);
    int32_t P = s->kv->page_tokens;
    while (s->q_len && (int)s->n_active < s->cfg.batch) {
        row *w = &s->rows[s->queue[s->q_head]];
        kv_chain ch;
        int32_t idle;
        bool wait;
        int32_t m = head_prefix(s, w, &ch, &idle, &wait);
        if (wait) {
            s->prefix_waits++;
            break;
        }
        /* mapped pages others hold cost nothing; idle ones leave the free count when mapped */
        int32_t live = m - idle, share = choice_share_pages(s, w);
        /* the prompt of every choice, plus one page of growth for every choice already running */
        int32_t need = kv_pages_for(s->kv, w->n_prompt + 1) * w->n_choices - share - live + active_choices(s);
        int32_t expect = s->cfg.reserve ? sched_row_expect_pages(s->kv, w) - share - live : 0;
        if ((need > s->kv->n_free || active_choices(s) + w->n_choices > s->cfg.max_seqs ||
             committed + expect > s->kv->n_pages) &&
            s->n_active > 0)
            break;
        committed += expect;
        s->q_head++;
        s->q_len--;
        if (start_row(s, w, err, errlen))
            return -1;
        choice *c0 = &w->ch[0];
        c0->chain = ch;
        if (m > 0 && kv_prefix_map(s->kv, &c0->kv, s->find, m))
            return util_errf(err, errlen, "out of memory growing a KV page table.");
        c0->fed = m * P;
        c0->mapped = m;
        w->cached = m * P;
        s->prefix_tokens += (uint64_t)(m * P);
    }
    return 0;
}

/* Reserves pages for `need` positions of choice c, preempting the newest other rows if needed.
 * Returns 0, 1 when the choice's own row was preempted (caller skips it), -1 on error. */
static int reserve(sched *s, size_t row_idx, choice *c, int32_t need)
{
    for (;;) {
        int rc = kv_row_reserve(s->kv, &c->kv, need);
        if (rc == 0)
            return 0;
        if (rc == -2)
            return -1;
        /* the newest admitted row goes, even when that is the one asking: the oldest row always
         * advances, so two rows can never take turns preempting each other forever */
        size_t victim = newest_active(s);
        bool own = s->active[victim] == row_idx;
        preempt(s, victim);
        if (own)
            return 1;
    }
}

/* ---------------------------------------------------------------- building a pass */

/* True for a row whose tokens speculation can verify exactly: greedy or sampled, penalties and log-probs
 * included (each position is drawn as if the proposals before it were generated: sample_next_ahead; a token's
 * log-probs are those of its own position's logits), but not a grammar (its mask at a position would need the
 * grammar walked over the proposals), kept logits or scoring (the runner records those outside apply_spec). */
bool sched_spec_row(const row *w)
{
    return !w->grammar && !w->full_logits && w->score_from == 0 && w->max_new > 0;
}

/*
 * Per-row k.  A verify token is worth feeding when it is likely to be kept: on a streamed or GPU pass it costs
 * little next to the weights' trip, on the CPU as much as a decode token, so the threshold is a middle one:
 * the i-th proposal is fed while its chance p^i of being kept is >= 0.3.  p is an average over the choice's
 * speculating steps of each step's kept / decided proposals (decided: the kept ones and the first rejected),
 * decayed by 0.7 a step, with a prior worth one step at 0.75, which gives a newcomer k = 4 (the --spec-k
 * default).  A decode step that proposes nothing (k 0, or no match) fades the history by 0.9, so a row whose k
 * fell to 0 proposes again after ~8 such steps: a row that starts copying is noticed, one that never does pays
 * about one verify token in 8 decode steps.  Per step, not per token: a row that copied 16 tokens a step and then stops copying must not go
 * on proposing 16 for the dozen steps a token-weighted average would take to notice (a per-step average of a
 * geometric acceptance reads a little low, which only errs towards fewer verify tokens).  Left out: pricing
 * each verify token with the calibrated pass-cost fit (the pass's token budget caps them, sched_build_pass).
 */
#define SCHED_SPEC_GAIN 0.3
#define SCHED_SPEC_DECAY 0.7f
#define SCHED_SPEC_PRIOR_P 0.75
#define SCHED_SPEC_FADE 0.9f

int sched_spec_k(const choice *c, int cap)
{
    double p = (c->spec_kept + SCHED_SPEC_PRIOR_P) / (c->spec_steps + 1.0);
    int k = 0;
    for (double g = p; k < cap && g >= SCHED_SPEC_GAIN; g *= p)
        k++;
    return k;
}

void sched_spec_learn(choice *c, int proposed, int kept, bool ended)
{
    int decided = kept + (kept < proposed && !ended);
    if (proposed == 0) { /* a step that proposed nothing: the history fades towards the prior */
        c->spec_kept *= SCHED_SPEC_FADE;
        c->spec_steps *= SCHED_SPEC_FADE;
        return;
    }
    if (decided == 0)
        return;
    c->spec_kept = SCHED_SPEC_DECAY * c->spec_kept + (float)kept / (float)decided;
    c->spec_steps = SCHED_SPEC_DECAY * c->spec_steps + 1.0f;
}

/* Decode step q (one token so far) of an eligible choice proposes up to min(its k, room) more tokens, capped so
 * the choice never emits past max_tokens and so its KV stays within the pages it holds or, from the free pages,
 * within the pages its row is planned at (its expected length; never a preemption).  Returns the tokens added. */
static int speculate(sched *s, int q, int room)
{
    row *w = &s->rows[s->seq_row[q]];
    choice *ch = &w->ch[s->seq_choice[q]];
    if (s->seq_spec[q] != 0 || !sched_spec_row(w))
        return 0;
    int64_t left = w->max_new - ch->n_gen - 1; /* the step emits 1 + accepted tokens */
    int k = sched_spec_k(ch, s->cfg.spec_k);
    if (k == 0)
        sched_spec_learn(ch, 0, 0, false);
    k = k < room ? k : room;
    k = left < k ? (int)(left > 0 ? left : 0) : k;
    if (k <= 0)
        return 0;
    if (s->cfg.draft_kv) { /* the draft model's proposal, made before the pass was built (draft_propose) */
        k = k < ch->n_draft ? k : ch->n_draft;
        memcpy(ch->spec + 1, ch->draft, (size_t)(k > 0 ? k : 0) * sizeof *ch->draft);
    } else
        k = spec_propose(w->prompt, w->n_prompt, ch->gen, ch->n_gen, k, ch->spec + 1);
    if (k <= 0) {
        sched_spec_learn(ch, 0, 0, false);
        return 0;
    }
    int32_t P = s->kv->page_tokens, plan = sched_row_expect_pages(s->kv, w) / w->n_choices;
    int32_t need = kv_pages_for(s->kv, ch->fed + 1 + k);
    if (need > ch->kv.n_pages && (need > plan || kv_row_reserve(s->kv, &ch->kv, ch->fed + 1 + k)))
        k = ch->kv.n_pages * P - ch->fed - 1; /* what the pages it holds take */
    if (k <= 0)
        return 0;
    ch->spec[0] = ch->next;
    fwd_seq *sq = &s->seqs[q];
    sq->n = 1 + k;
    sq->tokens = ch->spec;
    sq->all_logits = true;
    sq->logits_skip = 0;
    s->seq_spec[q] = k;
    s->spec_proposed += (uint64_t)k;
    return k;
}

static void add_seq(sched *s, fwd_seq q, size_t row_idx, int c)
{
    s->seqs[s->n_seqs] = q;
    s->seq_row[s->n_seqs] = (int)row_idx;
    s->seq_choice[s->n_seqs] = c;
    s->seq_spec[s->n_seqs] = q.tokens == &s->rows[row_idx].ch[c].next ? 0 : -1;
    s->n_seqs++;
}

int sched_build_pass(sched *s, char *err, size_t errlen)
{
    int budget = s->cfg.max_seqs + s->cfg.prefill_chunk;
    s->n_seqs = 0;
    /* decode steps first: one token per running choice */
    for (size_t ai = 0; ai < s->n_active; ai++) {
        size_t idx = s->active[ai];
        row *w = &s->rows[idx];
        for (int c = 0; c < w->n_choices && w->state == ROW_ACTIVE; c++) {
            choice *ch = &w->ch[c];
            if (ch->done || ch->fed < w->n_prompt)
                continue;
            int rr = reserve(s, idx, ch, ch->fed + 1);
            if (rr < 0)
                return util_errf(err, errlen, "out of memory growing a KV page table.");
            if (rr == 1) {
                s->n_seqs = 0; /* the pass being built referenced freed rows: rebuild it */
                ai = (size_t)-1;
                budget = s->cfg.max_seqs + s->cfg.prefill_chunk;
                break;
            }
            add_seq(s, (fwd_seq){&ch->kv, ch->fed, 1, &ch->next, true, false, 0, w->adapter}, idx, c);
            budget--;
        }
    }
    /* a preemption may have freed rows whose seqs were already listed: drop stale ones */
    int keep = 0;
    for (int q = 0; q < s->n_seqs; q++)
        if (s->rows[s->seq_row[q]].state == ROW_ACTIVE) {
            s->seqs[keep] = s->seqs[q];
            s->seq_row[keep] = s->seq_row[q];
            s->seq_choice[keep] = s->seq_choice[q];
            s->seq_spec[keep++] = s->seq_spec[q];
        }
    s->n_seqs = keep;
    /* logits rows scored chunks and speculating steps take beyond the one every sequence may return; verify
     * tokens come out of the pass's token budget, at most the prompt-chunk share of it (prefill_chunk), so a
     * pass never carries more tokens than the engine was sized for, nor more verify tokens than a prompt chunk */
    int extra = 0, extra_cap = s->cfg.max_logit_rows - s->cfg.max_seqs;
    /* The adaptive prompt budget (chunk.h) bounds a pass when rows decoding are at least half of those the batch
     * could hold now (min(batch, rows admitted or queued)): it protects decoding rows from prompt work; with few
     * of them there is little to protect, and smaller chunks would only add passes (each a whole copy) to a
     * prefill-bound stretch (device run 29: a job of 256 rows all prefilling at once ran 0.86-0.95x as fast when
     * every pass was bounded).  Verify tokens cost what prompt tokens cost (a pass's GEMM rows), so a bounded
     * pass prices them out of the same budget: the learned seconds per token keep the pass within its ratio of
     * the clean pass, speculation first (its tokens are decoding rows' own), prompt chunks from what is left. */
    s->pass_clamped = false;
    s->pass_verify = 0;
    if (s->chunk.adaptive) {
        size_t decoding = 0, want = s->n_active + s->q_len;
        for (size_t ai = 0; ai < s->n_active; ai++) {
            const row *w = &s->rows[s->active[ai]];
            decoding += w->state == ROW_ACTIVE && w->ch[0].fed >= w->n_prompt;
        }
        if (want > (size_t)s->cfg.batch)
            want = (size_t)s->cfg.batch;
        s->pass_clamped = 2 * decoding >= want;
    }
    int verify = budget < s->cfg.prefill_chunk ? budget : s->cfg.prefill_chunk;
    if (s->pass_clamped && verify > chunk_budget(&s->chunk))
        verify = chunk_budget(&s->chunk);
    for (int q = 0; s->cfg.spec_k > 0 && q < s->n_seqs && verify > 0 && extra < extra_cap; q++) {
        int k = speculate(s, q, verify < extra_cap - extra ? verify : extra_cap - extra);
        budget -= k;
        verify -= k;
        extra += k;
        s->pass_verify += k;
    }
    /* then prompt chunks, in admission order, up to the token cap and what the verify tokens left of the
     * adaptive budget (above) */
    s->pass_prompt = 0;
    if (s->pass_clamped) {
        int left = chunk_budget(&s->chunk) - s->pass_verify;
        left = left > 0 ? left : 0;
        budget = budget < left ? budget : left;
    }
    for (size_t ai = 0; ai < s->n_active && budget > 0; ai++) {
        size_t idx = s->active[ai];
        row *w = &s->rows[idx];
        for (int c = 0; c < w->n_choices && budget > 0 && w->state == ROW_ACTIVE; c++) {
            choice *ch = &w->ch[c];
            /* choices > 0 wait for choice 0's prefill and copy its KV (they prefill themselves only if
             * the copy found no free pages) */
            if (ch->fed >= w->n_prompt || (c > 0 && w->ch[0].fed < w->n_prompt))
                continue;
            int32_t n = w->n_prompt - ch->fed;
            if (n > budget)
                n = budget;
            /* a scored prompt (choice 0) returns the logits of every position from score_from - 1 on, within
             * the pass's logits rows; the chunk stops where they run out */
            int32_t skip = 0;
            bool all = false;
            if (c == 0 && w->score_from > 0 && ch->fed + n > w->score_from - 1) {
                int32_t p0 = w->score_from - 1 > ch->fed ? w->score_from - 1 : ch->fed;
                int room = extra_cap - extra + 1 > 1 ? extra_cap - extra + 1 : 1; /* its own row always fits */
                skip = p0 - ch->fed;
                if (n - skip > room)
                    n = skip + (room > 0 ? room : 0);
                all = n > skip;
                if (n == 0)
                    continue;
                if (!all)
                    skip = 0;
            }
            int rr = kv_row_reserve(s->kv, &ch->kv, ch->fed + n);
            if (rr == -2)
                return util_errf(err, errlen, "out of memory growing a KV page table.");
            if (rr == -1)
                break; /* no pages now: this prompt waits for pages freed by finishing rows */
            bool last = ch->fed + n == w->n_prompt;
            add_seq(s, (fwd_seq){&ch->kv, ch->fed, n, w->prompt + ch->fed, last || all, all, skip, w->adapter}, idx,
                    c);
            if (all)
                extra += n - skip - 1;
            budget -= n;
            s->pass_prompt += n;
        }
    }
    if (s->n_seqs > 0)
        return s->n_seqs;
    if (s->n_active == 0 && s->q_len)
        return util_errf(err, errlen, "row %s needs more KV memory than the whole cache holds; raise --kv-mem.",
                         s->rows[s->queue[s->q_head]].custom_id);
    /* Every admitted row is mid-prompt and none can get a page for its next chunk: their partial prompts hold
     * the cache between them.  Preempt the newest so the oldest can go on (without this the job would spin
     * forever; test_sched found it). */
    if (s->n_active < 2)
        return util_errf(err, errlen, "row %s cannot get KV pages for its prompt although it runs alone; "
                                      "raise --mem-budget.",
                         s->rows[s->active[0]].custom_id);
    preempt(s, newest_active(s));
    s->stall_preemptions++;
    return 0;
}

void sched_pass_work(const sched *s, double *tokens, double *att)
{
    *tokens = 0;
    *att = 0;
    for (int q = 0; q < s->n_seqs; q++) {
        double p0 = s->seqs[q].pos0, n = s->seqs[q].n;
        *tokens += n;
        *att += n * p0 + n * (n + 1) / 2; /* each token attends to every cached position up to itself */
    }
}

void sched_observe_pass(sched *s, double secs)
{
    /* a pass the budget did not bound says nothing about the budget: its prompt tokens were the cap's */
    if (s->pass_prompt + s->pass_verify > 0 && !s->pass_clamped)
        return;
    chunk_observe(&s->chunk, s->pass_prompt + s->pass_verify, secs);
}

void sched_finish_pass(sched *s)
{
    for (int q = 0; q < s->n_seqs; q++) {
        row *w = &s->rows[s->seq_row[q]];
        choice *ch = &w->ch[s->seq_choice[q]];
        ch->fed += s->seq_spec[q] > 0 ? 1 : s->seqs[q].n;
        s->decode_steps += s->seq_spec[q] >= 0;
        /* choice 0's full prompt pages are complete: the index can hand them to the rows that start alike */
        if (s->cfg.prefix && s->seq_choice[q] == 0 && s->seqs[q].pos0 < w->n_prompt)
            kv_prefix_insert(s->kv, &ch->chain, &ch->kv, w->prompt, ch->fed < w->n_prompt ? ch->fed : w->n_prompt);
    }
    if (!s->cfg.prefix)
        return;
    int32_t entries = 0;
    for (size_t i = 0; i < s->n_active; i++) {
        const row *w = &s->rows[s->active[i]];
        for (int c = 0; w->ch && c < w->n_choices; c++)
            entries += w->ch[c].kv.n_pages;
    }
    int32_t saved = entries - (s->kv->n_pages - s->kv->n_free);
    if (saved > s->pages_saved_peak)
        s->pages_saved_peak = saved;
}

void sched_spec_keep(sched *s, int q, int32_t j)
{
    choice *ch = &s->rows[s->seq_row[q]].ch[s->seq_choice[q]];
    ch->fed = s->seqs[q].pos0 + 1 + j;
}

int sched_spec_settle(sched *s, int q, char *err, size_t errlen)
{
    choice *ch = &s->rows[s->seq_row[q]].ch[s->seq_choice[q]];
    sched_spec_learn(ch, s->seq_spec[q], ch->fed - s->seqs[q].pos0 - 1, ch->done);
    s->spec_kept += (uint64_t)(ch->fed - s->seqs[q].pos0 - 1);
    if (kv_row_truncate(s->kv, &ch->kv, ch->fed))
        return util_errf(err, errlen, "internal error: row %s's speculative positions sit on a shared KV page.",
                         s->rows[s->seq_row[q]].custom_id);
    return 0;
}

int sched_gen_room(choice *c, char *err, size_t errlen)
{
    if (c->n_gen < c->gen_cap)
        return 0;
    int32_t cap = c->gen_cap ? c->gen_cap * 2 : 64;
    int32_t *g = realloc(c->gen, (size_t)cap * sizeof *g);
    if (!g)
        return util_errf(err, errlen, "out of memory for the tokens of %d generated.", cap);
    c->gen = g;
    c->gen_cap = cap;
    return 0;
}

int sched_share_prompt(sched *s, row *w, int c, char *err, size_t errlen)
{
    const spill_backend *be = s->cfg.be;
    choice *o = &w->ch[c];
    if (s->cfg.prefix) {
        /* the full prompt pages are mapped; with a page copy the partial last one is copied (the choice then
         * draws from choice 0's logits), without one (the GPU) the choice computes its last tokens itself */
        int32_t P = s->kv->page_tokens, full = be->kv_copy ? w->n_prompt / P : (w->n_prompt - 1) / P;
        if (kv_row_map(s->kv, &o->kv, &w->ch[0].kv, full))
            return util_errf(err, errlen, "out of memory growing a KV page table.");
        o->mapped = full;
        o->fed = full * P;
        if (!be->kv_copy)
            return 0;
    }
    int rr = be->kv_copy ? be->kv_copy(be->impl, &o->kv, &w->ch[0].kv, w->n_prompt) : -1;
    if (rr == -2)
        return util_errf(err, errlen, "out of memory growing a KV page table.");
    if (rr == -1)
        return 0;
    o->fed = w->n_prompt;
    return 1;
}

int sched_check(const sched *s, char *err, size_t errlen)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_active; i++)
        n += (size_t)s->rows[s->active[i]].n_choices;
    const kv_row **rs = malloc((n + 1) * sizeof *rs);
    if (!rs)
        return util_errf(err, errlen, "out of memory for the KV check.");
    n = 0;
    for (size_t i = 0; i < s->n_active; i++) {
        const row *w = &s->rows[s->active[i]];
        for (int c = 0; w->ch && c < w->n_choices; c++)
            rs[n++] = &w->ch[c].kv;
    }
    int rc = kv_check(s->kv, rs, n, err, errlen);
    free(rs);
    return rc;
}

double sched_seq_tokens(const sched *s)
{
    double n = 0;
    for (size_t i = 0; i < s->n_active; i++) {
        const row *w = &s->rows[s->active[i]];
        for (int c = 0; w->ch && c < w->n_choices; c++)
            n += w->ch[c].fed;
    }
    return n;
}

/* ---------------------------------------------------------------- the ETA replay */

/* One row's remaining work in the estimate's simulation. */
typedef struct sim_row {
    double prompt_left, fed, gen_left, gen, pages;
    int choices;
} sim_row;

/* Replays the policy above on expected lengths: admission in queue order up
 * to the batch and the KV pages (each row priced at prompt + completion
 * fraction × max_tokens), a token cap per pass, decode steps first, then
 * prompt chunks in admission order, the first token drawn in the pass that
 * ends the prompt.  Counting passes this way prices the end tail (the batch
 * draining) and prefill-carrying passes, which a tokens / batch formula
 * misses (the prototype's live ETA was 1.5x optimistic for exactly those).
 * Speculation: a decode step feeds 1 + the job's proposals per step so far
 * and advances 1 + its kept tokens per step (the pre-run ETA, before any
 * step, prices none); the adaptive budget bounds the passes it bounds in
 * sched_build_pass, verify tokens out of it.
 * Not modelled: recompute after preemption. */
double sched_estimate(const sched *s, const calib *c)
{
    if (!c->valid)
        return -1;
    /* running choices, by how far into max_tokens they are: censored observations for the estimate */
    double running[CALIB_BINS] = {0};
    for (size_t i = 0; i < s->n_active; i++) {
        const row *w = &s->rows[s->active[i]];
        for (int k = 0; w->ch && k < w->n_choices; k++)
            if (!w->ch[k].done)
                running[calib_bin(w->ch[k].n_gen, (double)w->max_new)] += 1;
    }
    /* rows not started: the limit-weighted mean completion (generated / max_tokens summed over finished
     * choices predicts token totals better than a mean of fractions); rows under way: Kaplan-Meier below */
    double f = calib_completion(c);
    size_t n = 0;
    sim_row *q = malloc((s->n_active + s->q_len + 1) * sizeof *q);
    if (!q)
        return -1;
    const kv_cache *kv = s->kv;
    double P = kv ? kv->page_tokens : 16, cap_pages = kv ? kv->n_pages : 1e18;
    /* active rows first (admission order), then the queue from its head */
    for (size_t i = 0; i < s->n_active + s->q_len; i++) {
        const row *w = &s->rows[i < s->n_active ? s->active[i] : s->queue[s->q_head + (i - s->n_active)]];
        double G = f * (double)w->max_new, fed = 0, gen = 0;
        if (G < 1)
            G = 1;
        if (w->state == ROW_ACTIVE && w->ch) {
            fed = w->ch[0].fed < w->n_prompt ? w->ch[0].fed : w->n_prompt;
            for (int k = 0; k < w->n_choices; k++)
                gen += w->ch[k].n_gen;
            gen /= w->n_choices;
            if (gen > 0 && w->max_new > 0) /* a row that has run this far is expected to run further */
                G = calib_expect_frac(c, running, gen / (double)w->max_new) * (double)w->max_new;
        }
        /* a queued row is expected to map its shared prefix: not computed, its pages counted once */
        double hint = w->state == ROW_PENDING && s->cfg.prefix ? w->share_hint : 0;
        if (hint > 0)
            fed = hint;
        q[n++] = (sim_row){w->n_prompt - fed, fed, G - gen > 1 ? G - gen : 1, gen,
                           ceil((w->n_prompt + G) / P) * w->n_choices - floor(hint / P), w->n_choices};
    }
    /* speculation: each decode step feeds 1 + the proposals per step seen so far and advances 1 + the kept per
     * step (both 0 before any step, or without speculation) */
    double steps = s->decode_steps ? (double)s->decode_steps : 1;
    double fed_step = 1 + (double)s->spec_proposed / steps, adv_step = 1 + (double)s->spec_kept / steps;
    double passes = 0, tokens = 0, att = 0, pages = 0;
    size_t head = 0, n_act = 0;
    size_t *act = malloc((n + 1) * sizeof *act);
    if (!act) {
        free(q);
        return -1;
    }
    /* rows already active hold their pages */
    for (; head < s->n_active && head < n; head++) {
        act[n_act++] = head;
        pages += q[head].pages;
    }
    while (head < n || n_act) {
        while (head < n && (int)n_act < s->cfg.batch && (n_act == 0 || pages + q[head].pages <= cap_pages)) {
            pages += q[head].pages;
            act[n_act++] = head++;
        }
        double budget = s->cfg.max_seqs + s->cfg.prefill_chunk;
        size_t decoding = 0, want = n_act + (n - head);
        for (size_t i = 0; i < n_act; i++) {
            sim_row *r = &q[act[i]];
            if (r->prompt_left > 0)
                continue;
            decoding++;
            tokens += r->choices * fed_step;
            att += r->choices * fed_step * (r->fed + (fed_step + 1) / 2);
            r->fed += adv_step;
            r->gen_left -= adv_step;
            budget -= r->choices * fed_step;
        }
        want = want < (size_t)s->cfg.batch ? want : (size_t)s->cfg.batch;
        /* the budget as it stands now, on the passes sched_build_pass bounds (verify tokens already counted) */
        double bound = s->chunk.budget - (double)decoding * (fed_step - 1);
        if (s->chunk.adaptive && 2 * decoding >= want && budget > bound)
            budget = bound > 0 ? bound : 0;
        for (size_t i = 0; i < n_act && budget > 0; i++) {
            sim_row *r = &q[act[i]];
            if (r->prompt_left <= 0)
                continue;
            double k = r->prompt_left < budget ? r->prompt_left : budget;
            tokens += k;
            att += k * r->fed + k * (k + 1) / 2;
            r->fed += k;
            r->prompt_left -= k;
            budget -= k;
            if (r->prompt_left <= 0)
                r->gen_left -= 1; /* the pass that ends the prompt draws the first token */
        }
        passes++;
        size_t keep = 0;
        for (size_t i = 0; i < n_act; i++)
            if (q[act[i]].gen_left > 0 || q[act[i]].prompt_left > 0)
                act[keep++] = act[i];
            else
                pages -= q[act[i]].pages;
        n_act = keep;
    }
    free(act);
    free(q);
    return calib_predict(c, passes, tokens, att);
}
