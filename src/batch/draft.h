/*
 * draft.h — the draft-model proposer of speculative passes (--speculate draft:MODEL, issue 20).
 *
 * A small model with the target's very vocabulary is kept resident beside the
 * target and proposes each decoding choice's next k tokens: before every
 * pass, one batched forward of the draft per proposed position, greedy.  The
 * target's pass verifies them as it verifies prompt lookup's proposals
 * (run.c apply_spec: the longest agreeing prefix plus one corrected token), so
 * the answers do not depend on the draft at all — only how many tokens a pass
 * keeps does.
 *
 * Owns: the draft model and its backend (the CPU engine, opened through the
 * spill_backend interface, so a GPU one can take its place later), the draft's
 * KV cache and its pass buffers.  Each choice keeps its own pages in that cache
 * (choice.dkv, freed by the scheduler with the choice) and how many positions
 * of its sequence they hold (choice.dfed).  Does not own: k per choice
 * (sched_spec_k, the same policy as lookup), the verification, the rollback of
 * the target's KV.
 *
 * Key decision: the draft's cache is caught up lazily.  Whatever the last pass
 * kept, the draft's positions below the target's (choice.fed) hold the
 * sequence's tokens, so a proposal first truncates the draft's row to at most
 * the target's length (the rollback of rejected proposals: kv_row_truncate),
 * then feeds the sequence's tokens it lacks — the whole prompt on a row's first
 * proposal, the corrected token (+ the kept proposals it never fed) after —
 * as the first of the k batched steps, within the pass's token cap (short
 * catch-ups first; a row still catching up proposes next pass).  So the
 * draft never runs a separate prefill phase, a preempted row simply starts
 * over, and rows whose k is 0 cost nothing until they propose again.
 * Alternatives left out: sampling the draft (a greedy draft proposes a point
 * mass, which the exact rule for sampled rows already handles), and tree /
 * multi-candidate proposals.
 *
 * Prompts that start alike share the draft's full prompt pages as they share
 * the target's (the same prefix index, kv.h: a choice's empty draft row maps
 * what the index holds of its prompt, and indexes the full pages it computes),
 * so the draft's cache holds what the target's holds.
 *
 * Memory: one draft KV page per target page (the plan prices the pair as one
 * page: plan.h), the draft's weights resident and its pass buffers counted in
 * the plan's fixed share (draft_mem).  A choice that cannot get draft pages
 * proposes nothing that pass; nothing is preempted for the draft.
 */
#ifndef SPILL_DRAFT_H
#define SPILL_DRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "../model/model.h"
#include "../text/tokenizer.h"
#include "sched.h"

typedef struct draft {
    model_desc *m;           /* the draft model (owned) */
    tokenizer *tok;          /* its tokenizer, compared with the target's once (owned) */
    spill_backend be;        /* be.impl NULL until draft_open_engine */
    kv_cache *kv;            /* be's cache */
    int max_seqs, max_tokens; /* sequences and tokens per draft forward (the target's pass sizes) */
    fwd_seq *seqs;           /* (max_seqs) one draft step */
    choice **sc;             /* (max_seqs) the choice of each sequence */
    const row **sw;          /* (max_seqs) and its row */
    int *sk;                 /* (max_seqs) the tokens that choice proposes this pass */
    int32_t *tbuf;           /* (max_tokens) the first step's tokens, each sequence's catch-up in a row */
    int32_t *find;           /* (kv pages) the prompt pages a prefix lookup found */
    float *logits;           /* (max_seqs, V) */
    const int32_t *stop_ids; /* the target's end ids: a proposal ends after one */
    size_t n_stop;
    uint64_t forwards;       /* draft forwards over the job */
    uint64_t proposed;       /* tokens the draft proposed (the scheduler may feed fewer) */
    double secs;             /* seconds in draft_propose */
} draft;

/* Opens the draft model named by spec (a tag or a path, as MODEL is) and its tokenizer, and checks that its
 * vocabulary is the target's (m, tok): the same token count, every token's string and special flag, and the
 * same special ids.  0, or -1 with one sentence (the draft is then safe for draft_close); *code is the exit code
 * (model_resolve's for a model that cannot be found). */
int draft_open_model(draft *d, const char *spec, const model_desc *m, const tokenizer *tok, int *code, char *err,
                     size_t errlen);

/* What the draft adds to the plan for an engine sized like eo (its page_tokens, threads resolved): *fixed the
 * draft's resident weights, pass buffers and logits for eo->max_pass_seqs rows; *page_bytes one draft KV page. */
void draft_mem(const draft *d, const engine_opts *eo, int threads, uint64_t *fixed, uint64_t *page_bytes);

/* Opens the draft's engine: resident, with kv_pages pages of eo->page_tokens positions and pass buffers for
 * eo->max_pass_seqs sequences, eo->max_pass_tokens tokens.  0, or -1 with a sentence. */
int draft_open_engine(draft *d, const engine_opts *eo, int32_t kv_pages, char *err, size_t errlen);

/* Before sched_build_pass: every decoding choice of s that may speculate (sched_spec_row, its k > 0, tokens
 * left) gets ch->n_draft greedy proposals of the draft in ch->draft; every other choice 0.  The draft's rows are
 * first rolled back to what the target kept.  0, or -1 with a sentence. */
int draft_propose(draft *d, sched *s, char *err, size_t errlen);

/* Frees everything; safe on a zeroed or half-built draft.  Call after sched_free (the choices' draft pages). */
void draft_close(draft *d);

#endif
