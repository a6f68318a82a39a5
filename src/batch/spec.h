/*
 * spec.h — speculative passes: the prompt-lookup proposer (issue 20).
 *
 * A row's next tokens are guessed from its own text: the longest n-gram
 * (n = SPEC_NGRAM_MAX down to 1) that ends the row's tokens so far (prompt,
 * then what it generated) and also occurs earlier in them; the tokens that
 * followed its most recent earlier occurrence are the proposal.  No model,
 * no memory beyond the row's tokens; strong where answers copy their prompt
 * (extraction, summaries, code edits) or repeat themselves.
 */
#ifndef SPILL_SPEC_H
#define SPILL_SPEC_H

#include <stdint.h>

#define SPEC_NGRAM_MAX 3 /* longest n-gram matched */
#define SPEC_K_MAX 16    /* most tokens proposed for one row in one pass (--spec-k's ceiling) */

/* Up to k (<= SPEC_K_MAX) tokens proposed to follow the sequence prompt[0, n_prompt) then gen[0, n_gen), into
 * out; returns how many (0 when no n-gram of the sequence's end occurs earlier in it). */
int spec_propose(const int32_t *prompt, int32_t n_prompt, const int32_t *gen, int32_t n_gen, int k, int32_t *out);

#endif
