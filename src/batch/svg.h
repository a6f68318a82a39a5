/*
 * svg.h — a small line chart written as SVG 1.1 text, for `spill bench`'s
 * bench.svg: no plotting dependency, a file any browser renders.
 *
 * One chart: a title, two axes with ticks, tick labels and axis labels
 * (x linear or log2, y linear or log10), one polyline with a marker per
 * point for each series, and per series an optional dashed line through
 * its limit at the same x values (a bound the measured line may approach,
 * drawn as a <path>, so a chart holds exactly one <polyline> per series),
 * a legend, and caption lines under the plot.  Every text is escaped.
 */
#ifndef SPILL_SVG_H
#define SPILL_SVG_H

#include <stdbool.h>
#include <stdio.h>

enum svg_scale { SVG_LINEAR, SVG_LOG2, SVG_LOG10 };

typedef struct svg_series {
    const char *name;      /* legend label */
    int n;                 /* points */
    const double *x, *y;   /* (n) measured; a log axis skips values <= 0 */
    const double *limit_y; /* (n) the limit at the same x, NULL = none; values <= 0 leave a gap */
} svg_series;

typedef struct svg_chart {
    const char *title, *x_label, *y_label;
    enum svg_scale x_scale, y_scale;
    const svg_series *series;
    int n_series;
    const char *const *caption; /* (n_caption) lines under the plot */
    int n_caption;
} svg_chart;

/* Writes the whole document to f.  Returns 0, or -1 when f reports a write error. */
int svg_chart_write(FILE *f, const svg_chart *c);

/* Writes s with &, <, >, " and ' as entities, control characters other than tab and newline as
 * spaces, and, when s is not valid UTF-8, every byte above 0x7f as '?' (XML must be well-formed). */
void svg_escape(FILE *f, const char *s);

/* The axis range [*lo, *hi] a scale draws for data in [dmin, dmax]: linear from 0 (or dmin when it is
 * negative) to a 1-2-5 step above dmax; log2 between the powers of two around the data; log10 between the
 * 1-2-5 values around it.  A single value is widened (a factor of 2 each way on log scales). */
void svg_axis_range(enum svg_scale s, double dmin, double dmax, double *lo, double *hi);

/* Tick values within [lo, hi], ascending, at most cap of them; returns the count.  Linear: multiples of a
 * 1-2-5 step, 4 to 10 ticks.  Log2: powers of two, every 2nd, 4th, ... power when more than 10 would show.
 * Log10: 1, 2 and 5 times the powers of ten, only the powers when that would be more than 12. */
int svg_ticks(enum svg_scale s, double lo, double hi, double *out, int cap);

#endif
