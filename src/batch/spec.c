/*
 * spec.c — the prompt-lookup proposer (see spec.h).
 *
 * The sequence is the row's prompt followed by its generated tokens, read in
 * place (never copied).  For n from SPEC_NGRAM_MAX down to 1 the last n
 * tokens are searched for backwards, so the first hit is the most recent
 * earlier occurrence of the longest matching n-gram; what follows it, up to
 * k tokens and never past the sequence's end, is the proposal.  A longer
 * n-gram is tried first because its continuation is the likelier one; the
 * most recent occurrence because a row that repeats itself repeats its
 * latest text.  Cost: O(length x n) comparisons per row per pass, nothing
 * next to a forward pass.  Left out: a suffix index (it pays only for prompts
 * of many thousand tokens) and proposals of a draft model.
 */
#include "spec.h"

#include <stdbool.h>

/* Token i of the sequence prompt then gen. */
static inline int32_t at(const int32_t *prompt, int32_t n_prompt, const int32_t *gen, int32_t i)
{
    return i < n_prompt ? prompt[i] : gen[i - n_prompt];
}

int spec_propose(const int32_t *prompt, int32_t n_prompt, const int32_t *gen, int32_t n_gen, int k, int32_t *out)
{
    int32_t len = n_prompt + n_gen;
    k = k > SPEC_K_MAX ? SPEC_K_MAX : k;
    if (k <= 0)
        return 0;
    for (int n = SPEC_NGRAM_MAX; n >= 1; n--) {
        if (len < n + 1)
            continue;
        /* an earlier occurrence starting at i < len - n, so at least one token follows it */
        for (int32_t i = len - n - 1; i >= 0; i--) {
            bool eq = true;
            for (int j = 0; j < n && eq; j++)
                eq = at(prompt, n_prompt, gen, i + j) == at(prompt, n_prompt, gen, len - n + j);
            if (!eq)
                continue;
            int m = 0;
            for (int32_t p = i + n; p < len && m < k; p++)
                out[m++] = at(prompt, n_prompt, gen, p);
            return m;
        }
    }
    return 0;
}
