/*
 * stop.h — the stop-string matcher of one row/choice: it takes the text the
 * detokenizer emits, piece by piece, and says which bytes are safe to show
 * now and whether a stop string has appeared (OpenAI `stop`: the returned
 * text excludes the stop string and everything after it).
 *
 * Use:  stop_init(&m, stops, lens, n)            once, at admission
 *       stop_push(&m, piece, n, out, …)          per detokenized piece
 *       stop_finish(&m, out, …)                  at EOS / length: flush held bytes
 *       stop_free(&m)
 * The bytes written to `out` by successive calls, concatenated, are the
 * row's final text, whatever way the text was cut into pieces.
 */
#ifndef SPILL_STOP_H
#define SPILL_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STOP_MAX 4          /* OpenAI: stop is a string or up to 4 strings */
#define STOP_MAX_BYTES 4096 /* longest stop string accepted, in bytes */

/* One row's matcher.  Fields are private to stop.c; embed it, never copy a live one. */
typedef struct stop_matcher {
    int n;                     /* stop strings, 0..STOP_MAX */
    void *mem;                 /* the one allocation behind str, fail and held */
    const char *str[STOP_MAX]; /* (len[i]) owned copies */
    size_t len[STOP_MAX];
    uint32_t *fail[STOP_MAX]; /* (len[i]) KMP failure function of str[i] */
    size_t q[STOP_MAX];       /* bytes of str[i] matched by the end of the text so far (< len[i]) */
    char *held;               /* (max_held) text not yet emitted: it may be the start of a stop string */
    size_t n_held, max_held;
    int matched; /* index of the stop string that ended the text, or -1 */
    bool done;   /* matched or finished: later pushes emit nothing */
} stop_matcher;

/*
 * Prepares a matcher for n (0..STOP_MAX) stop strings stops[i] of lens[i]
 * bytes (1..STOP_MAX_BYTES; any bytes, UTF-8 expected; copied).  n = 0 gives
 * a pass-through matcher.  Returns 0, or -1 with a sentence naming the stop
 * string; *m is then safe to pass to stop_free.
 */
int stop_init(stop_matcher *m, const char *const *stops, const size_t *lens, int n, char *err, size_t errlen);

/* Frees what the matcher owns and zeroes it; safe on a zeroed or failed matcher. */
void stop_free(stop_matcher *m);

/* Capacity `out` needs for a push of n bytes: the bytes held back plus n (SIZE_MAX on overflow). */
size_t stop_out_cap(const stop_matcher *m, size_t n);

/*
 * Feeds the next n bytes of generated text.  Writes to out (capacity
 * out_cap >= stop_out_cap(m, n)) the bytes now safe to emit, *out_len of
 * them: everything except the longest suffix of the text that is a proper
 * prefix of some stop string, which is held back.
 * The text ends at the earliest byte where some stop string is complete; if
 * several end there, the longest wins (the text is cut at its start).  That
 * rule does not depend on how the text was split into pieces.
 * Returns 1 when a stop string matched in this push (*out_len then excludes
 * it and everything after; m->matched names it), 0 when generation may go
 * on, -1 with a sentence when out_cap is too small (nothing consumed).
 * After a match or stop_finish every push returns 1 / 0 with *out_len 0.
 * Linear: O(n · number of stop strings) amortised (KMP).
 * With valid UTF-8 text and stop strings, held and cut points fall on
 * character boundaries (a stop string starts with a lead byte).
 */
int stop_push(stop_matcher *m, const char *in, size_t n, char *out, size_t out_cap, size_t *out_len, char *err,
              size_t errlen);

/*
 * Ends the text (EOS or length limit): writes the held-back bytes to out
 * (capacity >= stop_out_cap(m, 0)), *out_len of them, nothing after a match.
 * Returns 0, or -1 with a sentence when out_cap is too small.
 */
int stop_finish(stop_matcher *m, char *out, size_t out_cap, size_t *out_len, char *err, size_t errlen);

#endif
