/*
 * calib.c — pass-cost calibration (see calib.h for the model).  The fit is
 * ordinary least squares on three regressors through the normal equations,
 * solved by Gaussian elimination with partial pivoting; negative
 * coefficients (noise on a short run) are clamped to zero and the intercept
 * refitted, so predictions never go below the observed per-pass floor.
 */
#include "calib.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/util.h"

void calib_observe(calib *c, double tokens, double att, double secs)
{
    double x[3] = {1, tokens, att};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++)
            c->sxx[i][j] += x[i] * x[j];
        c->sxy[i] += x[i] * secs;
    }
    c->passes++;
}

int calib_bin(double generated, double limit)
{
    if (limit <= 0 || generated >= limit)
        return CALIB_BINS - 1;
    int b = (int)(generated / limit * (CALIB_BINS - 1));
    return b < 0 ? 0 : b > CALIB_BINS - 2 ? CALIB_BINS - 2 : b;
}

void calib_finish(calib *c, double generated, double limit)
{
    c->gen_tokens += generated;
    c->gen_limit += limit;
    int b = calib_bin(generated, limit);
    c->frac[b] += 1;
    c->frac_sum[b] += limit > 0 && generated < limit ? generated / limit : 1.0;
}

double calib_expect_frac(const calib *c, const double running[CALIB_BINS], double g)
{
    double events = 0;
    for (int k = 0; k < CALIB_BINS; k++)
        events += c->frac[k];
    if (events <= 0) {
        double f = calib_completion(c);
        return f > g ? f : g;
    }
    /* survival S[k] = P(X reaches bin k); a running choice in bin k is at risk up to and including bin k */
    double S[CALIB_BINS + 1], at_risk = 0;
    for (int k = 0; k < CALIB_BINS; k++)
        at_risk += c->frac[k] + (running ? running[k] : 0);
    S[0] = 1;
    for (int k = 0; k < CALIB_BINS; k++) {
        double d = c->frac[k];
        S[k + 1] = at_risk > 0 ? S[k] * (1 - d / at_risk) : S[k];
        at_risk -= c->frac[k] + (running ? running[k] : 0);
    }
    /* E[X | X in bin >= kg]: bin k's mass S[k] - S[k+1] at its middle; the last bin at 1 */
    int kg = g > 0 ? (int)(g * (CALIB_BINS - 1)) : 0;
    if (kg > CALIB_BINS - 1)
        kg = CALIB_BINS - 1;
    double mass = 0, sum = 0;
    for (int k = kg; k < CALIB_BINS; k++) {
        double p = k == CALIB_BINS - 1 ? S[k] : S[k] - S[k + 1];
        double mid = c->frac[k] > 0 ? c->frac_sum[k] / c->frac[k] : k == CALIB_BINS - 1 ? 1.0 : (k + 0.5) / (CALIB_BINS - 1);
        mass += p;
        sum += p * mid;
    }
    double e = mass > 1e-12 ? sum / mass : 1.0;
    return e > g ? e : g;
}

double calib_completion(const calib *c) { return c->gen_limit > 0 ? c->gen_tokens / c->gen_limit : 1.0; }

/* Solves the normal equations restricted to the regressors in `use`. */
static bool solve(const calib *c, const bool use[3], double out[3])
{
    int idx[3], n = 0;
    for (int i = 0; i < 3; i++)
        if (use[i])
            idx[n++] = i;
    double a[3][4];
    for (int r = 0; r < n; r++) {
        for (int k = 0; k < n; k++)
            a[r][k] = c->sxx[idx[r]][idx[k]];
        a[r][n] = c->sxy[idx[r]];
    }
    for (int col = 0; col < n; col++) {
        int piv = col;
        for (int r = col + 1; r < n; r++)
            if (fabs(a[r][col]) > fabs(a[piv][col]))
                piv = r;
        if (fabs(a[piv][col]) < 1e-12 * (fabs(a[0][0]) + 1))
            return false;
        for (int k = 0; k <= n; k++) {
            double t = a[col][k];
            a[col][k] = a[piv][k];
            a[piv][k] = t;
        }
        for (int r = 0; r < n; r++)
            if (r != col) {
                double f = a[r][col] / a[col][col];
                for (int k = col; k <= n; k++)
                    a[r][k] -= f * a[col][k];
            }
    }
    out[0] = out[1] = out[2] = 0;
    for (int r = 0; r < n; r++)
        out[idx[r]] = a[r][n] / a[r][r];
    return true;
}

bool calib_solve(calib *c)
{
    c->valid = false;
    if (c->passes < 8)
        return false;
    bool use[3] = {true, true, true};
    double x[3];
    for (int round = 0; round < 3; round++) {
        if (!solve(c, use, x)) {
            /* degenerate (e.g. every pass the same size): drop the attention term, then the token term */
            if (use[2])
                use[2] = false;
            else if (use[1])
                use[1] = false;
            else
                return false;
            continue;
        }
        bool neg = false;
        for (int i = 1; i < 3; i++)
            if (use[i] && x[i] < 0)
                use[i] = false, neg = true;
        if (!neg)
            break;
    }
    if (x[0] < 0)
        x[0] = 0;
    memcpy(c->c, x, sizeof x);
    c->valid = true;
    return true;
}

double calib_predict(const calib *c, double passes, double tokens, double att)
{
    return c->c[0] * passes + c->c[1] * tokens + c->c[2] * att;
}

int calib_path(const char *key, char *out, size_t cap)
{
    return util_pathf(out, cap, "%s/calibration/%s.json", util_spill_home(), key);
}

int calib_load(const char *path, calib *c)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return -1;
    memset(c, 0, sizeof *c);
    json_t *sxx = json_object_get(j, "sxx"), *sxy = json_object_get(j, "sxy");
    for (int i = 0; i < 3; i++) {
        c->sxy[i] = json_number_value(json_array_get(sxy, (size_t)i));
        for (int k = 0; k < 3; k++)
            c->sxx[i][k] = json_number_value(json_array_get(sxx, (size_t)(i * 3 + k)));
    }
    c->passes = (uint64_t)json_integer_value(json_object_get(j, "passes"));
    c->gen_tokens = json_number_value(json_object_get(j, "gen_tokens"));
    c->gen_limit = json_number_value(json_object_get(j, "gen_limit"));
    json_t *fr = json_object_get(j, "completion_hist"), *fs = json_object_get(j, "completion_hist_sum");
    for (int k = 0; k < CALIB_BINS; k++) {
        c->frac[k] = json_number_value(json_array_get(fr, (size_t)k));
        c->frac_sum[k] = json_number_value(json_array_get(fs, (size_t)k));
    }
    json_decref(j);
    calib_solve(c);
    return 0;
}

void calib_merge(calib *into, const calib *from)
{
    for (int i = 0; i < 3; i++) {
        into->sxy[i] += from->sxy[i];
        for (int k = 0; k < 3; k++)
            into->sxx[i][k] += from->sxx[i][k];
    }
    into->passes += from->passes;
    into->gen_tokens += from->gen_tokens;
    into->gen_limit += from->gen_limit;
    for (int k = 0; k < CALIB_BINS; k++) {
        into->frac[k] += from->frac[k];
        into->frac_sum[k] += from->frac_sum[k];
    }
    calib_solve(into);
}

int calib_save(const char *path, const calib *c, char *err, size_t errlen)
{
    json_t *sxx = json_array(), *sxy = json_array();
    for (int i = 0; i < 3; i++) {
        json_array_append_new(sxy, json_real(c->sxy[i]));
        for (int k = 0; k < 3; k++)
            json_array_append_new(sxx, json_real(c->sxx[i][k]));
    }
    json_t *j = json_pack("{s:o,s:o,s:I,s:f,s:f,s:[f,f,f],s:b}", "sxx", sxx, "sxy", sxy, "passes",
                          (json_int_t)c->passes, "gen_tokens", c->gen_tokens, "gen_limit", c->gen_limit, "fit",
                          c->c[0], c->c[1], c->c[2], "valid", c->valid);
    json_t *fr = json_array(), *fs = json_array();
    for (int k = 0; k < CALIB_BINS; k++) {
        json_array_append_new(fr, json_real(c->frac[k]));
        json_array_append_new(fs, json_real(c->frac_sum[k]));
    }
    if (j) {
        json_object_set_new(j, "completion_hist", fr);
        json_object_set_new(j, "completion_hist_sum", fs);
    } else {
        json_decref(fr);
        json_decref(fs);
    }
    char *text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
    json_decref(j);
    if (!text)
        return util_errf(err, errlen, "%s: out of memory.", path);
    int rc = util_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}
