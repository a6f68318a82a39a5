/*
 * svg.c — the line chart of svg.h, written as SVG 1.1 text.
 *
 * Owns the layout (a fixed 800-pixel-wide canvas: plot on the left, legend
 * on the right, caption lines under the plot, wrapped at spaces so they stay
 * inside the canvas), the axis arithmetic (ranges and 1-2-5 or power ticks)
 * and escaping.  Does not own what is plotted or any file: the caller hands
 * in numbers and strings and a FILE*.
 *
 * Decisions: numbers are drawn with one decimal of a pixel (enough for a
 * screen, and the file stays small); a log axis drops values <= 0 rather
 * than inventing a floor; limits are <path> elements with a dash pattern so
 * that a reader (or a test) tells measured lines (<polyline>) from bounds.
 * Left out: clipping, tooltips, fonts other than the viewer's sans-serif.
 */
#include "svg.h"

#include <math.h>
#include <string.h>

#include "../base/util.h"

#define W 800.0  /* canvas width */
#define PL 78.0  /* plot left edge */
#define PT 48.0  /* plot top edge */
#define PW 512.0 /* plot width */
#define PH 330.0 /* plot height */
#define LEGEND_X (PL + PW + 24.0)
#define CAPTION_CHARS 118 /* a caption line's bytes at 11 px sans-serif within the canvas */
#define MAX_TICKS 32

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
#define N_COLORS (sizeof palette / sizeof palette[0])

void svg_escape(FILE *f, const char *s)
{
    if (!s)
        return;
    bool utf8 = util_utf8_valid(s, strlen(s));
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *ent = *p == '&'    ? "&amp;"
                          : *p == '<'  ? "&lt;"
                          : *p == '>'  ? "&gt;"
                          : *p == '"'  ? "&quot;"
                          : *p == '\'' ? "&apos;"
                                       : NULL;
        if (ent)
            fputs(ent, f);
        else if (*p < 0x20 && *p != '\t' && *p != '\n') /* not allowed in XML 1.0 text */
            fputc(' ', f);
        else
            fputc(*p > 0x7f && !utf8 ? '?' : *p, f);
    }
}

/* ---------------------------------------------------------------- axes */

static double tr(enum svg_scale s, double v)
{
    return s == SVG_LOG2 ? log2(v) : s == SVG_LOG10 ? log10(v) : v;
}

/* The smallest of {1, 2, 5} x 10^k that is >= v (v > 0); below instead gives the largest <= v. */
static double step125(double v, bool below)
{
    double mag = pow(10, floor(log10(v)));
    static const double m[4] = {1, 2, 5, 10};
    if (below) {
        for (int i = 3; i >= 0; i--)
            if (m[i] * mag <= v * (1 + 1e-9))
                return m[i] * mag;
        return mag / 2;
    }
    for (int i = 0; i < 4; i++)
        if (m[i] * mag >= v * (1 - 1e-9))
            return m[i] * mag;
    return 10 * mag;
}

void svg_axis_range(enum svg_scale s, double dmin, double dmax, double *lo, double *hi)
{
    if (s == SVG_LINEAR) {
        *lo = dmin < 0 ? dmin : 0;
        if (!(dmax > *lo)) {
            *hi = *lo + 1;
            return;
        }
        double step = step125((dmax - *lo) / 5, false);
        *hi = ceil(dmax / step - 1e-9) * step;
        return;
    }
    if (!(dmin > 0) || !(dmax > 0)) { /* nothing drawable: a default decade */
        *lo = 1, *hi = s == SVG_LOG2 ? 2 : 10;
        return;
    }
    if (s == SVG_LOG2) {
        *lo = exp2(floor(log2(dmin) + 1e-9));
        *hi = exp2(ceil(log2(dmax) - 1e-9));
    } else {
        *lo = step125(dmin, true);
        *hi = step125(dmax, false);
    }
    if (*hi <= *lo * (1 + 1e-9))
        *lo /= 2, *hi *= 2;
}

int svg_ticks(enum svg_scale s, double lo, double hi, double *out, int cap)
{
    int n = 0;
    if (!(hi > lo) || cap <= 0)
        return 0;
    if (s == SVG_LINEAR) {
        double step = step125((hi - lo) / 6, false);
        for (double k = ceil(lo / step - 1e-9); k * step <= hi * (1 + 1e-9) + 1e-12 && n < cap; k++)
            out[n++] = fabs(k) < 0.5 ? 0 : k * step;
        return n;
    }
    if (!(lo > 0))
        return 0;
    if (s == SVG_LOG2) {
        int k0 = (int)ceil(log2(lo) - 1e-9), k1 = (int)floor(log2(hi) + 1e-9), stride = 1;
        while ((k1 - k0) / stride + 1 > 10)
            stride *= 2;
        for (int k = k0; k <= k1 && n < cap; k++)
            if (((k % stride) + stride) % stride == 0)
                out[n++] = exp2(k);
        return n;
    }
    int d0 = (int)floor(log10(lo) + 1e-9), d1 = (int)ceil(log10(hi) - 1e-9);
    static const double m[3] = {1, 2, 5};
    bool powers_only = false;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int d = d0; d <= d1; d++)
            for (int i = 0; i < (powers_only ? 1 : 3); i++) {
                double v = m[i] * pow(10, d);
                if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9) && n < cap)
                    out[n++] = v;
            }
        if (n <= 12)
            break;
        powers_only = true;
    }
    return n;
}

/* A tick label: 0.5, 2, 150, 2.5k, 40k, 1.2M. */
static void fmt_tick(char *buf, size_t cap, double v)
{
    double a = fabs(v);
    if (a >= 1e6)
        snprintf(buf, cap, "%.4gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(buf, cap, "%.4gk", v / 1e3);
    else
        snprintf(buf, cap, "%.4g", v);
}

typedef struct axis {
    enum svg_scale s;
    double lo, hi; /* data range drawn */
    double p0, p1; /* pixels of lo and hi */
} axis;

static double px(const axis *a, double v)
{
    return a->p0 + (tr(a->s, v) - tr(a->s, a->lo)) / (tr(a->s, a->hi) - tr(a->s, a->lo)) * (a->p1 - a->p0);
}

static bool drawable(const axis *a, double v)
{
    return isfinite(v) && (a->s == SVG_LINEAR || v > 0);
}

/* ---------------------------------------------------------------- captions */

/* Bytes of s that go on the next caption line (at most CAPTION_CHARS, broken at a space when one is there);
 * *skip: bytes to step over after it (the space). */
static size_t wrap_next(const char *s, size_t *skip)
{
    size_t n = strlen(s);
    *skip = 0;
    if (n <= CAPTION_CHARS)
        return n;
    size_t cut = CAPTION_CHARS;
    while (cut > CAPTION_CHARS / 2 && s[cut] != ' ')
        cut--;
    if (s[cut] == ' ') {
        *skip = 1;
        return cut;
    }
    cut = CAPTION_CHARS; /* no space: break inside, but never inside a UTF-8 sequence */
    while (cut > 1 && ((unsigned char)s[cut] & 0xc0) == 0x80)
        cut--;
    return cut;
}

static int caption_lines(const svg_chart *c)
{
    int n = 0;
    for (int i = 0; i < c->n_caption; i++)
        for (const char *s = c->caption[i] ? c->caption[i] : "";;) {
            size_t skip, len = wrap_next(s, &skip);
            n++;
            s += len + skip;
            if (!*s)
                break;
        }
    return n;
}

/* ---------------------------------------------------------------- the chart */

static void data_range(const svg_chart *c, bool x, enum svg_scale s, double *mn, double *mx)
{
    *mn = INFINITY, *mx = -INFINITY;
    for (int i = 0; i < c->n_series; i++) {
        const svg_series *se = &c->series[i];
        for (int k = 0; k < se->n; k++) {
            double v[2] = {x ? se->x[k] : se->y[k], !x && se->limit_y ? se->limit_y[k] : NAN};
            for (int j = 0; j < 2; j++) {
                bool ok = isfinite(v[j]) && (s == SVG_LINEAR || v[j] > 0) && (j == 0 || v[j] > 0);
                if (ok) {
                    *mn = v[j] < *mn ? v[j] : *mn;
                    *mx = v[j] > *mx ? v[j] : *mx;
                }
            }
        }
    }
    if (*mn > *mx)
        *mn = *mx = s == SVG_LINEAR ? 0 : 1;
}

static void write_axes(FILE *f, const svg_chart *c, const axis *ax, const axis *ay)
{
    double t[MAX_TICKS];
    char lab[32];
    fprintf(f, "<g font-size=\"11\" fill=\"#333\">\n");
    int n = svg_ticks(ax->s, ax->lo, ax->hi, t, MAX_TICKS);
    for (int i = 0; i < n; i++) {
        double x = px(ax, t[i]);
        fmt_tick(lab, sizeof lab, t[i]);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                x, PT, x, PT + PH, x, PT + PH, x, PT + PH + 5, x, PT + PH + 18, lab);
    }
    n = svg_ticks(ay->s, ay->lo, ay->hi, t, MAX_TICKS);
    for (int i = 0; i < n; i++) {
        double y = px(ay, t[i]);
        fmt_tick(lab, sizeof lab, t[i]);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                PL, y, PL + PW, y, PL - 5, y, PL, y, PL - 8, y + 4, lab);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", PL, PT,
            PW, PH);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">", PL + PW / 2, PT + PH + 36);
    svg_escape(f, c->x_label);
    fprintf(f,
            "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\" "
            "transform=\"rotate(-90 %.1f %.1f)\">",
            PL - 52, PT + PH / 2, PL - 52, PT + PH / 2);
    svg_escape(f, c->y_label);
    fprintf(f, "</text>\n</g>\n");
}

/* The measured line, its markers and the dashed limit of series i. */
static void write_series(FILE *f, const svg_series *se, const char *color, const axis *ax, const axis *ay)
{
    fprintf(f, "<g>\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
    bool first = true;
    for (int k = 0; k < se->n; k++)
        if (drawable(ax, se->x[k]) && drawable(ay, se->y[k])) {
            fprintf(f, "%s%.1f,%.1f", first ? "" : " ", px(ax, se->x[k]), px(ay, se->y[k]));
            first = false;
        }
    fprintf(f, "\"/>\n");
    for (int k = 0; k < se->n; k++)
        if (drawable(ax, se->x[k]) && drawable(ay, se->y[k]))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px(ax, se->x[k]), px(ay, se->y[k]),
                    color);
    if (se->limit_y) {
        int valid = 0;
        for (int k = 0; k < se->n; k++)
            valid += drawable(ax, se->x[k]) && se->limit_y[k] > 0 && drawable(ay, se->limit_y[k]);
        fprintf(f,
                "<path class=\"limit\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\" d=\"",
                color);
        bool pen = false;
        for (int k = 0; k < se->n; k++) {
            bool ok = drawable(ax, se->x[k]) && se->limit_y[k] > 0 && drawable(ay, se->limit_y[k]);
            if (!ok) {
                pen = false;
                continue;
            }
            double x = px(ax, se->x[k]), y = px(ay, se->limit_y[k]);
            if (valid == 1) /* one point: a short level dash, so the bound is still seen */
                fprintf(f, "M%.1f %.1f L%.1f %.1f", x - 14, y, x + 14, y);
            else
                fprintf(f, "%s%.1f %.1f", pen ? " L" : (k ? " M" : "M"), x, y);
            pen = true;
        }
        fprintf(f, "\"/>\n");
    }
    fprintf(f, "</g>\n");
}

static void write_legend(FILE *f, const svg_chart *c)
{
    double y = PT + 8;
    fprintf(f, "<g font-size=\"12\" fill=\"#222\">\n");
    for (int i = 0; i < c->n_series; i++) {
        const svg_series *se = &c->series[i];
        const char *color = palette[(size_t)i % N_COLORS];
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">",
                LEGEND_X, y, LEGEND_X + 26, y, color, LEGEND_X + 13, y, color, LEGEND_X + 34, y + 4);
        svg_escape(f, se->name);
        fprintf(f, "</text>\n");
        y += 18;
        if (se->limit_y) {
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
                    "stroke-dasharray=\"6 4\"/><text x=\"%.1f\" y=\"%.1f\">",
                    LEGEND_X, y, LEGEND_X + 26, y, color, LEGEND_X + 34, y + 4);
            svg_escape(f, se->name);
            fprintf(f, " limit</text>\n");
            y += 18;
        }
        y += 6;
    }
    fprintf(f, "</g>\n");
}

int svg_chart_write(FILE *f, const svg_chart *c)
{
    int n_cap = caption_lines(c);
    double H = PT + PH + 54 + 15.0 * n_cap + 8;
    double xmin, xmax, ymin, ymax;
    data_range(c, true, c->x_scale, &xmin, &xmax);
    data_range(c, false, c->y_scale, &ymin, &ymax);
    axis ax = {c->x_scale, 0, 0, PL, PL + PW}, ay = {c->y_scale, 0, 0, PT + PH, PT};
    svg_axis_range(ax.s, xmin, xmax, &ax.lo, &ax.hi);
    svg_axis_range(ay.s, ymin, ymax, &ay.lo, &ay.hi);

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%.1f\" y=\"26\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">",
            W, H, W, H, W / 2);
    svg_escape(f, c->title);
    fprintf(f, "</text>\n");
    write_axes(f, c, &ax, &ay);
    for (int i = 0; i < c->n_series; i++)
        write_series(f, &c->series[i], palette[(size_t)i % N_COLORS], &ax, &ay);
    write_legend(f, c);
    fprintf(f, "<g font-size=\"11\" fill=\"#444\">\n");
    double y = PT + PH + 58;
    for (int i = 0; i < c->n_caption; i++)
        for (const char *s = c->caption[i] ? c->caption[i] : "";;) {
            size_t skip, len = wrap_next(s, &skip);
            char line[CAPTION_CHARS + 1];
            memcpy(line, s, len);
            line[len] = 0;
            fprintf(f, "<text x=\"12\" y=\"%.1f\">", y);
            svg_escape(f, line);
            fprintf(f, "</text>\n");
            y += 15;
            s += len + skip;
            if (!*s)
                break;
        }
    fprintf(f, "</g>\n</svg>\n");
    return ferror(f) ? -1 : 0;
}
