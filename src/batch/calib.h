/*
 * calib.h — measured pass costs and the ETA built from them.
 *
 * A pass's wall time is modelled as
 *     t = c0 + c_tok · tokens + c_att · attention_positions
 * (c0: reading/streaming the weights and per-pass overhead; c_tok: matmul work
 * per token fed; c_att: attention work per (token, cached position) pair),
 * fitted by least squares over the passes of a run and stored per
 * model|backend|machine under $SPILL_HOME/calibration/.  The completion
 * fraction (generated tokens / max_tokens, averaged over finished rows)
 * prices rows that stop before their limit.  Without a stored fit the
 * pre-run ETA says "uncalibrated".
 */
#ifndef SPILL_CALIB_H
#define SPILL_CALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CALIB_BINS 33 /* completion-fraction histogram: 32 bins over [0, 1) and one for "hit max_tokens" */

typedef struct calib {
    /* least-squares sums over observed passes: x = (1, tokens, att), y = seconds */
    double sxx[3][3], sxy[3];
    uint64_t passes;
    double c[3];               /* c0, c_tok, c_att after calib_solve */
    bool valid;
    double gen_tokens, gen_limit; /* sums over finished choices: generated tokens and their max_tokens */
    double frac[CALIB_BINS];      /* finished choices by generated / max_tokens */
    double frac_sum[CALIB_BINS];  /* sum of those fractions per bin (a bin's mean, not its middle) */
} calib;

/* Adds one pass: tokens fed, attention (token, position) pairs, wall seconds. */
void calib_observe(calib *c, double tokens, double att, double secs);
/* Adds one finished choice: tokens generated and its limit. */
void calib_finish(calib *c, double generated, double limit);
/* Fits c[]; false (and valid stays false) with too few or degenerate passes. */
bool calib_solve(calib *c);
/* Mean generated/limit over finished choices (1 when none yet: the upper bound). */
double calib_completion(const calib *c);
/* Bin of a completion fraction (generated / limit). */
int calib_bin(double generated, double limit);
/* Expected final completion fraction of a choice that has reached fraction g (0 for one not started):
 * a Kaplan-Meier estimate over the finished choices in c and the choices still running, whose current
 * fractions are counted per bin in running[] (censored: they will end at or after that point).  Early in
 * a job the finished choices are the short ones; counting the running ones as censored removes that
 * bias.  Falls back to calib_completion() when c has no histogram. */
double calib_expect_frac(const calib *c, const double running[CALIB_BINS], double g);
/* Predicted seconds for a workload. */
double calib_predict(const calib *c, double passes, double tokens, double att);

/* $SPILL_HOME/calibration/<key>.json; load fails quietly (returns -1) when absent. */
int calib_path(const char *key, char *out, size_t cap);
int calib_load(const char *path, calib *c);
/* Atomic write (tmp + fsync + rename + fsync dir). */
int calib_save(const char *path, const calib *c, char *err, size_t errlen);
/* Merges a run's observations into a stored fit (sums add). */
void calib_merge(calib *into, const calib *from);

#endif
