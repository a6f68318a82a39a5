/*
 * draft.c — the draft-model proposer (see draft.h for the design).
 *
 * One call per pass, draft_propose: roll every choice's draft row back to what
 * the target kept, then k batched greedy steps.  Step 0 feeds each proposing
 * choice the sequence tokens its draft row lacks (usually 1 or 2; the prompt on
 * a row's first proposal) and takes the first proposal from its last logits;
 * step j feeds proposal j and takes proposal j + 1.  A choice stops proposing
 * after an end id (the target would stop there) or at its own k.
 */
#include "draft.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/exit.h"
#include "../base/util.h"
#include "../model/arch.h"
#include "../text/prompt.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const special_names[TOK_SPECIAL_COUNT] = {"bos", "eos", "eot", "eom", "unk", "pad"};

/* The first difference between the two vocabularies as one clause into why, or false when they are identical. */
static bool vocab_differs(const model_desc *tm, const tokenizer *tt, const model_desc *dm, const tokenizer *dt,
                          char *why, size_t cap)
{
    size_t tn = tokenizer_vocab_size(tt), dn = tokenizer_vocab_size(dt);
    if (tn != dn || tm->vocab != dm->vocab) {
        snprintf(why, cap, "it has %zu tokens (%d logits) against the target's %zu (%d)", dn, dm->vocab, tn,
                 tm->vocab);
        return true;
    }
    for (size_t i = 0; i < tn; i++) {
        size_t tl = 0, dl = 0;
        const char *a = tokenizer_piece(tt, (int32_t)i, &tl), *b = tokenizer_piece(dt, (int32_t)i, &dl);
        if ((!a) != (!b) || (a && (tl != dl || memcmp(a, b, tl)))) {
            snprintf(why, cap, "token %zu is \"%.40s\" there but \"%.40s\" in the target", i, b ? b : "(none)",
                     a ? a : "(none)");
            return true;
        }
        if (tokenizer_is_special(tt, (int32_t)i) != tokenizer_is_special(dt, (int32_t)i)) {
            snprintf(why, cap, "token %zu (\"%.40s\") is special in one vocabulary only", i, a ? a : "");
            return true;
        }
    }
    for (int w = 0; w < TOK_SPECIAL_COUNT; w++)
        if (tokenizer_special(tt, (tok_special)w) != tokenizer_special(dt, (tok_special)w)) {
            snprintf(why, cap, "its %s id is %d against the target's %d", special_names[w],
                     tokenizer_special(dt, (tok_special)w), tokenizer_special(tt, (tok_special)w));
            return true;
        }
    return false;
}

int draft_open_model(draft *d, const char *spec, const model_desc *m, const tokenizer *tok, int *code, char *err,
                     size_t errlen)
{
    memset(d, 0, sizeof *d);
    char path[4096], why[200];
    *code = SPILL_EX_USAGE;
    if (!spec || !*spec)
        return util_errf(err, errlen, "--speculate draft: names no model; give draft:MODEL (a tag or a path).");
    int rr = model_resolve(spec, path, sizeof path, err, errlen);
    if (rr) {
        *code = model_resolve_exit(rr);
        return -1;
    }
    arch_layout al;
    if (model_open(path, &d->m, err, errlen) || model_arch_resolve(d->m, ARCH_ENGINE_CPU, &al, err, errlen) ||
        prompt_open_tokenizer(d->m, &d->tok, err, errlen)) {
        *code = SPILL_EX_DATAERR;
        return -1;
    }
    if (vocab_differs(m, tok, d->m, d->tok, why, sizeof why)) {
        *code = SPILL_EX_USAGE;
        return util_errf(err, errlen,
                         "--speculate draft:%s: the draft's vocabulary is not the target's (%s); a draft model must "
                         "have the target's tokenizer.",
                         spec, why);
    }
    d->stop_ids = m->stop_ids;
    d->n_stop = m->n_stop;
    return 0;
}

/* The draft's engine for an engine sized like eo: resident, exact, no adapters, its own logits rows. */
static engine_opts draft_opts(const engine_opts *eo)
{
    engine_opts o = *eo;
    o.stream = false;
    o.q8_activations = false;
    o.lora = NULL;
    o.kv_dtype = 0;
    o.max_logit_rows = eo->max_pass_seqs;
    return o;
}

void draft_mem(const draft *d, const engine_opts *eo, int threads, uint64_t *fixed, uint64_t *page_bytes)
{
    engine_opts o = draft_opts(eo);
    uint64_t w, ring, pass;
    engine_mem_estimate(d->m, &o, threads, &w, &ring, &pass);
    uint64_t V = (uint64_t)d->m->vocab, S = (uint64_t)eo->max_pass_seqs;
    *fixed = w + pass + S * V * 4 + (uint64_t)eo->max_pass_tokens * 4 + S * (sizeof(fwd_seq) + 16);
    *page_bytes = kv_page_bytes(d->m->n_layers, d->m->n_kv_heads, d->m->head_dim, eo->page_tokens);
}

int draft_open_engine(draft *d, const engine_opts *eo, int32_t kv_pages, char *err, size_t errlen)
{
    engine_opts o = draft_opts(eo);
    o.kv_pages = kv_pages;
    if (engine_backend_cpu(d->m, &o, &d->be, err, errlen))
        return -1;
    d->kv = d->be.kv(d->be.impl);
    d->max_seqs = o.max_pass_seqs;
    d->max_tokens = o.max_pass_tokens;
    d->seqs = calloc((size_t)d->max_seqs, sizeof *d->seqs);
    d->sc = calloc((size_t)d->max_seqs, sizeof *d->sc);
    d->sw = calloc((size_t)d->max_seqs, sizeof *d->sw);
    d->sk = calloc((size_t)d->max_seqs, sizeof *d->sk);
    d->tbuf = malloc((size_t)d->max_tokens * sizeof *d->tbuf);
    d->logits = malloc((size_t)d->max_seqs * (size_t)d->m->vocab * sizeof *d->logits);
    d->find = malloc(((size_t)d->kv->n_pages + 1) * sizeof *d->find);
    if (kv_prefix_enable(d->kv, err, errlen))
        return -1;
    if (!d->seqs || !d->sc || !d->sw || !d->sk || !d->tbuf || !d->logits || !d->find)
        return util_errf(err, errlen, "out of memory for the draft model's pass buffers (%d rows).", d->max_seqs);
    return 0;
}

/* The greedy pick of one logits row: the first largest logit (-1 when none is a number). */
static int32_t argmax(const float *lg, int32_t V)
{
    int32_t best = -1;
    for (int32_t i = 0; i < V; i++)
        if (lg[i] == lg[i] && (best < 0 || lg[i] > lg[best]))
            best = i;
    return best;
}

static bool is_stop(const draft *d, int32_t t)
{
    for (size_t i = 0; i < d->n_stop; i++)
        if (d->stop_ids[i] == t)
            return true;
    return false;
}

/* Token i of choice ch's sequence: the row's prompt, then what the choice generated. */
static inline int32_t seq_at(const row *w, const choice *ch, int32_t i)
{
    return i < w->n_prompt ? w->prompt[i] : ch->gen[i - w->n_prompt];
}

/* A choice's empty draft row maps the full pages of its prompt that the draft's prefix index holds (all but the
 * last prompt token, whose logits it needs, may be mapped).  0, or -2 (page table). */
static int map_prefix(draft *d, const row *w, choice *ch)
{
    int32_t P = d->kv->page_tokens, idle = 0;
    ch->dchain = kv_chain_start(0);
    ch->dfed = 0;
    int32_t m = kv_prefix_find(d->kv, &ch->dchain, w->prompt, (w->n_prompt - 1) / P, d->find, &idle);
    if (m > 0 && kv_prefix_map(d->kv, &ch->dkv, d->find, m))
        return -2;
    ch->dfed = m * P;
    return 0;
}

int draft_propose(draft *d, sched *s, char *err, size_t errlen)
{
    double t0 = now_s();
    int n = 0, kmax = 0, budget = d->max_tokens, used = 0;
    /* roll back, then list the proposing choices: short catch-ups first (round 0), then long ones (the prompt of
     * a row's first proposal) with what the pass's token cap leaves */
    for (int round = 0; round < 2; round++)
        for (size_t ai = 0; ai < s->n_active; ai++) {
            row *w = &s->rows[s->active[ai]];
            for (int c = 0; w->ch && c < w->n_choices; c++) {
                choice *ch = &w->ch[c];
                if (round == 0) {
                    ch->n_draft = 0;
                    if (ch->dfed > ch->fed) { /* positions past what the target kept: rejected proposals */
                        if (kv_row_truncate(d->kv, &ch->dkv, ch->fed))
                            return util_errf(err, errlen, "internal error: row %s's draft KV page is shared.",
                                             w->custom_id);
                        ch->dfed = ch->fed;
                    }
                }
                if (ch->done || ch->fed < w->n_prompt || ch->next < 0 || ch->n_gen < 1 || !sched_spec_row(w))
                    continue;
                if (round == 0 && ch->dkv.n_pages == 0 && map_prefix(d, w, ch))
                    return util_errf(err, errlen, "out of memory growing a draft KV page table.");
                int32_t len = w->n_prompt + ch->n_gen, lack = len - ch->dfed;
                if ((round == 0) != (lack <= 1 + SPEC_K_MAX) || n == d->max_seqs || budget - used < 1)
                    continue;
                int64_t left = w->max_new - ch->n_gen - 1;
                int k = sched_spec_k(ch, s->cfg.spec_k);
                k = left < k ? (int)(left > 0 ? left : 0) : k;
                if (k <= 0)
                    continue;
                int32_t feed = lack < budget - used ? lack : budget - used;
                bool whole = feed == lack; /* else this row only catches up this pass */
                int rr = kv_row_reserve(d->kv, &ch->dkv, ch->dfed + feed + (whole ? k - 1 : 0));
                if (rr == -2)
                    return util_errf(err, errlen, "out of memory growing a draft KV page table.");
                if (rr == -1)
                    continue; /* no draft pages now: this choice proposes nothing this pass */
                for (int32_t i = 0; i < feed; i++)
                    d->tbuf[used + i] = seq_at(w, ch, ch->dfed + i);
                d->seqs[n] = (fwd_seq){&ch->dkv, ch->dfed, feed, d->tbuf + used, whole, false, 0, 0};
                d->sc[n] = ch;
                d->sw[n] = w;
                d->sk[n] = whole ? k : 0;
                kmax = whole && k > kmax ? k : kmax;
                used += feed;
                n++;
            }
        }
    /* step j feeds every proposing choice's proposal j (step 0: its catch-up) and takes proposal j + 1 */
    for (int j = 0; n > 0 && j < (kmax > 0 ? kmax : 1); j++) {
        int ns = 0;
        if (j > 0)
            for (int i = 0; i < n; i++) {
                choice *ch = d->sc[i];
                if (d->sk[i] <= j || ch->n_draft < j || is_stop(d, ch->draft[j - 1]))
                    continue;
                d->seqs[ns] = (fwd_seq){&ch->dkv, ch->dfed, 1, &ch->draft[j - 1], true, false, 0, 0};
                d->sc[ns] = ch;
                d->sw[ns] = d->sw[i];
                d->sk[ns++] = d->sk[i];
            }
        else
            ns = n;
        if (ns == 0)
            break;
        if (d->be.forward(d->be.impl, d->seqs, ns, d->logits, err, errlen))
            return -1;
        d->forwards++;
        int li = 0;
        for (int i = 0; i < ns; i++) {
            choice *ch = d->sc[i];
            ch->dfed += d->seqs[i].n;
            const row *w = d->sw[i];
            if (j == 0 && d->seqs[i].pos0 < w->n_prompt) /* its full prompt pages go into the index */
                kv_prefix_insert(d->kv, &ch->dchain, &ch->dkv, w->prompt,
                                 ch->dfed < w->n_prompt ? ch->dfed : w->n_prompt);
            if (!d->seqs[i].want_logits)
                continue;
            int32_t t = argmax(d->logits + (size_t)li++ * (size_t)d->m->vocab, d->m->vocab);
            if (t < 0)
                continue;
            ch->draft[ch->n_draft++] = t;
            d->proposed++;
        }
        n = ns;
    }
    d->secs += now_s() - t0;
    return 0;
}

void draft_close(draft *d)
{
    if (d->be.impl)
        d->be.close(d->be.impl);
    free(d->seqs);
    free(d->sc);
    free(d->sw);
    free(d->sk);
    free(d->tbuf);
    free(d->logits);
    free(d->find);
    tokenizer_free(d->tok);
    model_close(d->m);
    memset(d, 0, sizeof *d);
}
