/*
 * chunk.h — how many prompt tokens the next pass may carry.
 *
 * When the layers stream, a pass costs at least the copy of its weights (the
 * clean pass: what a pass with no prompt tokens costs), and the compute of
 * the tokens it carries hides behind that copy until it outgrows it; past
 * that knee every prompt token adds to the pass.  A constant chunk is wrong
 * both ways: too big for a compute-heavy format (q4 on the H200: 8,192 prompt
 * tokens made a pass 3.4x a clean one), too small for one whose copy is long.
 * So, unless the user fixed --prefill-chunk, the budget is learned from the
 * passes themselves:
 *
 *   clean   the seconds of the latest pass that carried no prompt tokens, or
 *           of a probe (a pass held to the floor, run when no clean pass has
 *           been seen for CHUNK_PROBE_EVERY carrying passes, and once at the
 *           start, or when passes over the target went on taking as long
 *           although their prompt tokens shrank by a fifth: their prompt work
 *           was hidden, so the clean pass itself grew); lowered by any faster
 *           pass;
 *   a       seconds a prompt token adds, at most: pass seconds / prompt tokens
 *           of the last carrying pass (the decode part counted as free, which
 *           errs toward smaller chunks);
 *   next    ratio · clean / a prompt tokens, i.e. last · ratio · clean / secs:
 *           on a hinge t = max(clean, D + a·p) this converges geometrically
 *           (factor D / (ratio · clean) < 1) to the p whose pass costs ratio ·
 *           clean; a pass within the target never shrinks the budget (it may
 *           have carried fewer tokens than allowed), growth is at most 2x a
 *           pass, and the budget stays within [floor, cap].
 *
 * The cap is what memory allows: the engine's pass buffers (sized for
 * --prefill-chunk's default); the KV pages a chunk needs are reserved by the
 * scheduler, which stops a chunk where pages run out.  Chunking never changes a
 * row's tokens (a row's logits depend only on its own positions), so the
 * timing-driven budget leaves the outputs as a constant one would.
 * The trade-off: the target bounds what prompt work costs the rows decoding in
 * the same pass, not the job's time.  A prefill-heavy job (long prompts, few
 * new tokens) refills its batch only as fast as prompt tokens flow, and past
 * the knee every prompt token costs the same whether chunks are big or small,
 * so smaller chunks there add passes (copies) without hiding anything.  So the
 * scheduler applies the budget only to passes in which rows decoding are at
 * least half of the rows the batch could hold (sched_build_pass); the others
 * take the constant cap and are not observed (their prompt tokens say nothing
 * of the budget).  Measured before that rule (device run 29, 256 rows of
 * 1,000-token prompts all prefilling at once, 64 new tokens): carrying passes
 * 1.14x the clean one, but the whole job 0.95x (q8) / 0.86x (q4) the constant
 * 8,192's; on test_sched's refilling fake (120 rows, 40 at once) the rule
 * gives 0.95-1.05x the constant's wall with the bounded passes at 1.25x.
 * Deliberately not done: a fitted hinge model (two unknowns from noisy passes;
 * Newton steps on it oscillate when the decode part is small), and adapting
 * when the weights are resident (a pass costs its compute, nothing hides it:
 * the constant chunk stays).
 */
#ifndef SPILL_CHUNK_H
#define SPILL_CHUNK_H

#include <stdbool.h>
#include <stdint.h>

#define CHUNK_RATIO 1.25      /* a pass carrying prompt tokens may cost this many clean passes */
#define CHUNK_FLOOR 64        /* prompt tokens a pass may always take (or a page, when larger): progress */
#define CHUNK_PROBE_EVERY 32  /* carrying passes without a clean one before a probe re-measures it */

typedef struct chunk_ctl {
    bool adaptive;       /* false: the budget is cap, always (--prefill-chunk, or resident weights) */
    int cap, floor;      /* prompt tokens per pass at most (memory) and at least (progress) */
    double ratio;        /* target seconds of a carrying pass / clean pass seconds */
    int budget;          /* prompt tokens the next pass may carry (before any probe) */
    bool probe;          /* the next pass is held to the floor to measure the clean pass */
    double clean_s;      /* clean pass seconds; 0 before one was measured */
    int since_clean;     /* carrying passes since clean_s was measured */
    uint64_t passes;     /* passes observed */
    uint64_t carrying, probes; /* passes that carried prompt tokens (probes excluded), probes run */
    uint64_t measured;   /* carrying passes with a clean pass to compare with */
    double ratio_sum, ratio_max; /* over those: seconds / clean seconds */
    int last;            /* prompt tokens the last carrying pass took */
    int over_p;          /* the first of the latest run of carrying passes over the target: its prompt tokens */
    double over_s;       /* and its seconds (0: the last carrying pass was within the target) */
} chunk_ctl;

/* Starts a controller: adaptive, or the constant cap.  floor is clamped to [1, cap]; the first budget is cap
 * (today's constant, the guess before any measurement). */
void chunk_init(chunk_ctl *c, bool adaptive, int cap, int floor, double ratio);

/* Prompt tokens the next pass may carry: cap when not adaptive, the floor for a probe, else the budget. */
int chunk_budget(const chunk_ctl *c);

/* One pass ran: it carried `prompt` prompt tokens (at most chunk_budget's) in `secs` seconds.  Updates the
 * clean pass time, the statistics and (adaptive) the next budget.  The first pass is a warm-up (the first
 * reads, lazy set-up) and only counted. */
void chunk_observe(chunk_ctl *c, int prompt, double secs);

#endif
