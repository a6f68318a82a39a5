/*
 * sched.h — the scheduler of one batch job: rows and their life, the queue,
 * admission, KV page reservation and preemption, building a pass, and the
 * ETA replay of that same policy (sched.c says why the policy is what it is).
 *
 * The job's pass loop (run.c) and tests/test_sched.c (a fake engine and
 * clock) drive it with the same calls:
 *
 *     sched_init(&s, &cfg, rows, n_rows, …)     pending rows queued, longest first
 *     while (sched_pending(&s)) {
 *         sched_admit(&s, …)                    newcomers, while slots and pages last
 *         n = sched_build_pass(&s, …)           s.seqs[0..n): decode steps, then prompt chunks
 *         if (n == 0) continue;                 a stalled prefill gave up a row: admit again
 *         forward s.seqs;  sched_finish_pass(&s)
 *         per logits row: draw a token for (s.seq_row, s.seq_choice) and apply it;
 *             a row whose prompt just ended: sched_share_prompt for its other choices
 *         per active row with every choice done: write it, sched_retire_row(&s, ai)
 *         sched_observe_pass(&s, seconds)        the prompt budget learns the pass's cost
 *     }
 *     sched_free(&s)
 *
 * Ownership: the rows array is the caller's (run_rows.c fills it); the
 * scheduler moves rows between states, creates a row's choices when it is
 * admitted and frees them when it is preempted or retired.  In a choice the
 * scheduler writes kv and fed; the caller writes the generation fields
 * (next, n_gen, text, lp, alts, done, finish) through ss, ts and sm.  The
 * sched struct is visible so the runner can embed it and read its state;
 * only sched.c writes it.
 */
#ifndef SPILL_SCHED_H
#define SPILL_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "../engine/kv.h"
#include "../text/tokenizer.h"
#include "calib.h"
#include "chunk.h"
#include "grammar.h"
#include "output.h"
#include "request.h"
#include "sample.h"
#include "spec.h"
#include "stop.h"
#include "toolcall.h"

enum row_state { ROW_PENDING, ROW_ACTIVE, ROW_DONE };

/* One answer of a row (a row asks for n of them). */
typedef struct choice {
    kv_row kv;           /* the choice's pages (scheduler) */
    int32_t fed;         /* positions in the KV cache: prompt progress, then generated tokens fed back (scheduler) */
    sample_state ss;
    tok_stream *ts;
    stop_matcher sm;
    int32_t next;        /* sampled token waiting to be fed, -1 when none */
    int32_t n_gen;       /* generated tokens kept (stop tokens excluded) */
    char *text;          /* (text_cap) emitted text so far, NUL-terminated; grown geometrically */
    size_t text_len, text_cap;
    out_token *lp;       /* (max_new) when logprobs */
    out_alt *alts;       /* (lp_cap * (top + 1)) */
    size_t lp_cap;       /* entries lp and alts hold: grown geometrically up to max_new */
    bool done;
    out_finish finish;
    gstate *gs;          /* structured output: where the answer is in its row's grammar (owned), or NULL */
    int32_t mapped;      /* pages of kv mapped from another row (the prefix index, or choice 0's prompt) */
    kv_chain chain;      /* choice 0 with the prefix cache: how far its prompt pages are in the index (scheduler) */
    int32_t *gen;        /* (gen_cap) speculative passes: the generated tokens kept, in order (the caller's, grown
                            geometrically by sched_gen_room), what the proposer reads after the prompt */
    int32_t gen_cap;
    int32_t spec[1 + SPEC_K_MAX]; /* a speculating decode step's tokens: next, then the proposal (scheduler) */
    float spec_kept, spec_steps;  /* speculation's history (scheduler): the sum of its steps' kept / decided
                                     proposals, and of its steps, each decayed by 0.7 a step (sched.c) */
    /* --speculate draft (draft.h): the choice's pages in the draft model's cache (freed with the choice), the
     * positions of its sequence (prompt, then gen) the draft has cached, and the draft's proposal for the
     * next pass (n_draft tokens to follow next; draft_propose writes them, speculate reads them) */
    kv_row dkv;
    kv_chain dchain;     /* how far dkv's full prompt pages are in the draft cache's prefix index */
    int32_t dfed;
    int32_t draft[SPEC_K_MAX];
    int n_draft;
} choice;

/* One request line of the job. */
typedef struct row {
    char *custom_id, *model; /* model: the model that ran (the command line's, or the BASE+ADAPTER the row picked) */
    char *requested;     /* the request's body.model when it differs from model (stamped as requested_model), or NULL */
    req_endpoint endpoint;
    size_t line;
    int32_t *prompt;     /* (n_prompt) token ids; freed when the row is retired */
    int32_t n_prompt;
    int64_t max_new;
    int64_t expect_new;  /* new tokens the memory plan expects of each choice: max_tokens when the request set it,
                            else the smaller of the context room and RUN_EXPECT_NEW; 0 = max_new */
    int n_choices;
    int choice_base;     /* completions prompt lists: the row is member k of its line, its choices are the line's
                            choices k*n .. k*n+n-1 (RNG streams and output index); 0 otherwise */
    int group_n;         /* completions prompt lists: members of this line (one row per prompt), 0 or 1 = alone */
    size_t group_first;  /* the line's first member (r->rows index); its group_left counts members not written */
    int group_left;
    bool group_failed;   /* first member: one member's answer failed, so the line went to errors.jsonl */
    char *gline;         /* a finished member's answer line, kept until the line's last member is done */
    size_t glen;
    sample_params sp;
    bool has_seed;
    int64_t seed;
    int n_stop;
    char *stop[REQ_MAX_STOP];
    size_t stop_len[REQ_MAX_STOP];
    int32_t *bias_id;
    float *bias;
    const grammar *grammar; /* structured output: the answer's grammar (the runner's grammar_set), or NULL */
    int adapter;         /* LoRA: fwd_seq.adapter of the row's sequences (0 = the bare base) */
    double t_admit;      /* the runner's: job clock when the row first ran (latency_s), 0 before */
    int passes, last_pass; /* the runner's: passes the row took part in, and the last one's number */
    /* Teacher forcing (echo, --score): the log-probs of prompt tokens [score_from, n_prompt) are recorded from
     * the prefill's logits (choice 0's); 0 = none (position 0 has no log-prob).  plp/palts are allocated when
     * the first one arrives. */
    int32_t score_from;
    int score_top;       /* alternatives per scored token (0..SAMPLE_MAX_TOP) */
    out_token *plp;      /* (n_prompt - score_from) */
    out_alt *palts;      /* (n_prompt - score_from) * score_top */
    bool full_logits;    /* every answer token's logits go to the job's logits/<id>.npy (distill --full-logits) */
    struct npy_rows *lf; /* full_logits: the row's open logits file (the runner's; npy.h), NULL until written */
    char *echo;          /* completions echo: the prompt's text, put before the answer (owned), or NULL */
    tc_row tc;           /* chat rows whose template renders tools: the call convention parsed from the answer */
    size_t echo_len;
    int32_t cached;      /* prompt tokens of choice 0 mapped from the prefix index at its last admission (OpenAI's
                            usage.prompt_tokens_details.cached_tokens) */
    int32_t share_hint;  /* prefix cache: prompt tokens expected to be mapped, from the queue order (sched_order) */
    enum row_state state;
    choice *ch;          /* (n_choices) while active */
    uint64_t admitted;   /* admission serial, for picking preemption victims */
    int preempted;
} row;

typedef struct sched_cfg {
    const spill_backend *be; /* its KV cache holds the pages; its kv_copy (NULL: none) shares a prompt's pages */
    const tokenizer *tok;    /* every admitted choice gets a detokenizer stream */
    int32_t vocab;           /* V, for each choice's sampling state */
    uint64_t job_seed;       /* RNG key of the rows without a seed */
    int batch;               /* rows admitted at once */
    int max_seqs;            /* sequences one pass may carry: batch + the largest n */
    int prefill_chunk;       /* a pass carries at most max_seqs + prefill_chunk tokens (the engine's size) */
    uint64_t guard;          /* RSS in bytes above which admission pauses (the plan's live guard); 0 = none */
    int max_logit_rows;      /* logits rows one pass may return: max_seqs (one per sequence) plus what scored
                                prompt chunks return beyond their one; <= max_seqs = no room to score */
    bool reserve;            /* batch from memory: a newcomer is admitted only while the pages hold every admitted
                                row at its expected length (sched_row_expect_pages) besides the newcomer's */
    bool prefix;             /* the prefix cache: full prompt pages indexed and mapped by rows that start alike, the
                                queue grouped by prefix, a row's n choices mapping its prompt pages */
    bool kv_check;           /* after every pass, check each page's count against the rows mapping it (slow) */
    int spec_k;              /* speculative passes: tokens proposed at most per choice per pass (--spec-k); 0 = off */
    bool chunk_adapt;        /* the prompt tokens a pass carries adapt to the passes' times (chunk.h), within
                                prefill_chunk; false: prefill_chunk is a constant cap */
    kv_cache *draft_kv;      /* --speculate draft: the draft model's cache, whose pages each choice's dkv holds;
                                the proposals are then the choices' draft[] (draft.h), else prompt lookup (spec.h);
                                NULL = prompt lookup */
} sched_cfg;

typedef struct sched {
    sched_cfg cfg;
    kv_cache *kv;            /* cfg.be's */
    row *rows;               /* (n_rows) borrowed: every row of the job, in any state */
    size_t n_rows;
    size_t *queue;           /* (n_rows + 1) pending row indices, longest first, from q_head (room below it for
                                preempted rows, which return to the head) */
    size_t q_head, q_len;
    size_t *active;          /* (n_rows + 1) admitted row indices, in admission order */
    size_t n_active;
    uint64_t admit_serial;
    fwd_seq *seqs;           /* (max_seqs) the pass sched_build_pass built */
    int *seq_row, *seq_choice; /* (max_seqs) row index and choice of each sequence */
    int n_seqs;
    int *seq_spec;           /* (max_seqs) per sequence: tokens proposed after its decode token, 0 none, -1 a prompt
                                chunk */
    uint64_t spec_proposed;  /* tokens proposed over the job */
    uint64_t decode_steps;   /* decode steps over the job (a speculating one counts once) */
    uint64_t spec_kept;      /* proposed tokens kept over the job (sched_spec_settle) */
    uint64_t preemptions;       /* rows sent back to the queue, for any reason */
    uint64_t stall_preemptions; /* of them, to break a prefill deadlock */
    uint64_t guard_pauses;      /* passes that admitted nobody because of the live guard */
    int32_t *find;              /* (find_cap) pages a prefix lookup found */
    int32_t find_cap;
    uint64_t prefix_tokens;     /* prompt tokens mapped instead of computed (every admission and choice) */
    uint64_t prefix_waits;      /* passes the queue head waited for a running row to finish a prefix it shares */
    int32_t pages_saved_peak;   /* most page-table entries at once beyond the distinct pages they map */
    chunk_ctl chunk;            /* the prompt tokens per pass (chunk.h) */
    int pass_prompt;            /* prompt tokens the built pass carries */
    int pass_verify;            /* proposed tokens it feeds to be verified (speculation) */
    bool pass_clamped;          /* the adaptive budget bounded the built pass's prompt tokens (sched_build_pass) */
} sched;

/* The order a job's pending rows run in, as indices into rows (n_out of them): longest first (prompt + max new
 * tokens, ties by line); with prefix (page size P) rows whose first full prompt pages agree form groups, taken
 * by their longest member, each group in token order so the rows that share most are neighbours.  Sets every
 * queued row's share_hint (prompt tokens it can map from its predecessor's pages).  0, or -1 (out of memory). */
int sched_order(row *rows, size_t n_rows, int32_t P, bool prefix, size_t *out, size_t *n_out);

/* Pages row w needs to finish alone in cache kv: prompt and every token it may generate, for each choice (with
 * the prefix cache, choices > 0 map choice 0's full prompt pages). */
int32_t sched_row_pages(const kv_cache *kv, const row *w, bool prefix);

/* Pages row w is expected to hold at its end: prompt + expect_new (max_new when 0), for each choice. */
int32_t sched_row_expect_pages(const kv_cache *kv, const row *w);

/* Makes room in c->lp and c->alts for token c->n_gen (top alternatives each), doubling them.  0, or -1 with a
 * sentence (out of memory). */
int sched_lp_room(choice *c, int top, char *err, size_t errlen);

/* Starts a scheduler over rows (borrowed; must outlive it) and queues the ROW_PENDING ones, longest first
 * (prompt + max_tokens; ties by line).  The caller fails the rows that cannot fit the cache alone
 * (sched_row_pages) before this.  0, or -1 with a sentence; *s is then safe for sched_free. */
int sched_init(sched *s, const sched_cfg *cfg, row *rows, size_t n_rows, char *err, size_t errlen);

/* Several ranks (mpi_run.c): moves the whole queue, in its order (longest first), into out (room for
 * s->q_len entries) and returns how many; the rows stay ROW_PENDING but wait outside the scheduler until
 * sched_enqueue hands them back. */
size_t sched_take_queue(sched *s, size_t *out);

/* Appends rows idx[0..n) (ROW_PENDING, neither queued nor active) to the queue's tail, in that order. */
void sched_enqueue(sched *s, const size_t *idx, size_t n);

/* Frees what the scheduler holds: every admitted row's choices and pages, the queue and the pass.  The rows
 * stay (sched_row_free each).  Safe on a zeroed or half-built sched. */
void sched_free(sched *s);

/* Frees what a row read from the input owns (sched_free or sched_retire_row has released its choices). */
void sched_row_free(row *w);

/* True while a row waits or runs. */
bool sched_pending(const sched *s);

/* Admits rows from the queue head while a batch slot is free and the cache holds the row's prompt besides one
 * page of growth per running choice (the first row always) — and, with cfg.reserve, while every admitted row's
 * expected pages (what it holds, or sched_row_expect_pages when more) and the newcomer's fit the cache;
 * nobody while the RSS is over the guard.  0, or -1 with a sentence (out of memory). */
int sched_admit(sched *s, char *err, size_t errlen);

/* Builds the next pass into s->seqs: one decode token per running choice (reserving its page, preempting the
 * newest rows when none is free), then prompt chunks in admission order up to the token cap.  Returns the
 * number of sequences (> 0); 0 when every admitted row was mid-prompt and none could get a page, so the newest
 * was preempted (admit and build again); -1 with a sentence when a row cannot run at all. */
int sched_build_pass(sched *s, char *err, size_t errlen);

/* The built pass's work as the pass-cost fit prices it (calib.h): tokens fed, and (token, cached position)
 * pairs attended. */
void sched_pass_work(const sched *s, double *tokens, double *att);

/* The built pass took secs seconds (build to output, as the ETA prices it): the prompt budget learns from it
 * (chunk_observe). */
void sched_observe_pass(sched *s, double secs);

/* The built pass ran: every sequence's tokens are in the cache (advances each choice's fed; a speculating
 * decode step's by its first token only: the caller keeps more with sched_spec_keep). */
void sched_finish_pass(sched *s);

/* Speculative passes: sequence q (seq_spec[q] > 0) keeps its first 1 + j tokens' positions (j <= seq_spec[q]):
 * its choice's fed becomes pos0 + 1 + j; call it before applying each token drawn after the j-th proposal. */
void sched_spec_keep(sched *s, int q, int32_t j);
/* Then rolls back the KV of the positions sequence q did not keep (kv_row_truncate) and adds the step to its
 * choice's history (sched_spec_learn).  0, or -1 with a sentence. */
int sched_spec_settle(sched *s, int q, char *err, size_t errlen);
/* True for a row whose tokens speculation can verify exactly (sched.c says which). */
bool sched_spec_row(const row *w);
/* Speculation's k for choice c, from its history: p = the smoothed rate at which its proposals are kept; the
 * i-th proposal of a step is kept only if the i - 1 before it were, so with probability ~p^i, and k is the
 * largest i <= cap with p^i >= 0.3 (0 when even the first is unlikely; sched.c says why these figures). */
int sched_spec_k(const choice *c, int cap);
/* Adds one decode step of choice c to its history: `proposed` tokens fed after its decode token, `kept` of them
 * kept; `ended`: the choice finished inside the step (the proposals after it were not rejected).  A step that
 * proposed nothing fades the history towards the prior (so k comes back from 0). */
void sched_spec_learn(choice *c, int proposed, int kept, bool ended);
/* Makes room in c->gen for token c->n_gen.  0, or -1 with a sentence. */
int sched_gen_room(choice *c, char *err, size_t errlen);

/* Choice c > 0 of w takes a copy of choice 0's prompt pages (n > 1 share one prefill).  1 when copied (the
 * choice then draws its first token from the same logits), 0 when no pages are free (it prefills itself later,
 * like a newcomer), -1 with a sentence. */
int sched_share_prompt(sched *s, row *w, int c, char *err, size_t errlen);

/* The row at s->active[ai] is finished and written: frees its choices, pages and prompt, marks it ROW_DONE. */
void sched_retire_row(sched *s, size_t ai);

/* cfg.kv_check: every page's count equals the admitted choices mapping it.  0, or -1 with a sentence. */
int sched_check(const sched *s, char *err, size_t errlen);

/* Positions cached over every admitted choice (the memory fit's x). */
double sched_seq_tokens(const sched *s);

/* Seconds left for the admitted and queued rows under pass-cost fit c, by replaying this policy on the rows'
 * expected lengths (sched.c).  < 0 when c is not calibrated or memory runs out. */
double sched_estimate(const sched *s, const calib *c);

#endif
