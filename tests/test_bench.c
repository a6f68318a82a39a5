/*
 * test_bench.c — `spill bench` and the SVG writer under it.
 *
 *  - svg.c alone: '<', '&' and quotes in a title, label or series name come
 *    out as entities; log2 ticks are the powers of two (every 2nd one when
 *    more than 10 would show), log10 ticks 1-2-5 steps, linear ones a 1-2-5
 *    step from 0; a chart is well-formed XML with one <polyline> per series
 *    and a dashed limit <path> per series that has one.
 *  - the real binary (build/asan/spill, or $SPILL_BIN) on
 *    tests/data/tiny/tiny-smollm2.gguf with --batches 1,4 --gen 4 --prompt 8
 *    and a SPILL_HOME without a probe: exit 0; bench.csv has the documented
 *    columns, one row per (tier, batch) with positive numbers and limits, and
 *    says the rates were measured now; bench.svg is well-formed, rooted at
 *    <svg, one polyline per tier, the limit lines drawn; bench.md has its
 *    table.  With a stored probe.json the streamed tier's limit is the
 *    formula of its header over the probe's rates.
 *  - GPU tiers, in process: bench_main with spill_gpu_open pointed at the
 *    CPU engine (a stand-in with forward_pick) sweeps gpu-resident and
 *    gpu-disk, limits from the planner's rates and the probe's disk rate.
 *  - bad arguments (--batches, unknown tier, --gen 0, no MODEL) exit 2 with
 *    one sentence; --help lists the options.
 * No timing assertions: only that figures are positive and consistent.
 */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "batch/bench.h"
#include "batch/sample.h"
#include "batch/svg.h"
#include "engine/engine.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"

static const char *bin(void)
{
    const char *b = getenv("SPILL_BIN");
    return b && *b ? b : "build/asan/spill";
}

/* Runs the binary with argv (argv[0] filled here), stdout and stderr to files; the exit status or -1. */
static int spawn(const char **argv, const char *out_path, const char *err_path)
{
    argv[0] = bin();
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644),
            e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n)
        n = 0;
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* ---------------------------------------------------------------- a minimal XML check */

/* Well-formedness as far as this writer can break it: every tag closed in order under one root named `root`,
 * attribute values quoted, text and attributes free of a bare '<' or an '&' that starts no entity.  Returns
 * NULL when fine, else what is wrong. */
static const char *xml_check(const char *s, const char *root)
{
    static char why[160];
    char stack[64][32];
    int depth = 0, roots = 0;
    const char *p = s;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p)
            return "unterminated XML declaration";
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"};
            bool ok = false;
            for (size_t i = 0; i < sizeof ents / sizeof ents[0]; i++)
                ok |= !strncmp(p, ents[i], strlen(ents[i]));
            if (!ok)
                return "a bare '&' in text";
            p++;
            continue;
        }
        if (*p != '<') {
            if (!depth && !(*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
                return "text outside the root element";
            p++;
            continue;
        }
        bool close = p[1] == '/';
        const char *n = p + (close ? 2 : 1), *e = n;
        while (*e && *e != ' ' && *e != '>' && *e != '/' && *e != '\n')
            e++;
        size_t len = (size_t)(e - n);
        if (!len || len >= sizeof stack[0])
            return "a tag without a name";
        const char *q = e; /* to the tag's end, through quoted attribute values */
        for (; *q && *q != '>'; q++)
            if (*q == '"') {
                const char *v = q + 1;
                q = strchr(v, '"');
                if (!q)
                    return "an unterminated attribute value";
                for (; v < q; v++)
                    if (*v == '<' || (*v == '&' && strncmp(v, "&amp;", 5) && strncmp(v, "&lt;", 4) &&
                                      strncmp(v, "&quot;", 6) && strncmp(v, "&gt;", 4)))
                        return "a bare '<' or '&' in an attribute";
            } else if (*q == '<')
                return "'<' inside a tag";
        if (!*q)
            return "an unterminated tag";
        bool self = q[-1] == '/';
        if (close) {
            if (!depth || strlen(stack[depth - 1]) != len || strncmp(stack[depth - 1], n, len)) {
                snprintf(why, sizeof why, "</%.*s> closes %s", (int)len, n, depth ? stack[depth - 1] : "nothing");
                return why;
            }
            depth--;
        } else {
            if (!depth && (roots++ || len != strlen(root) || strncmp(n, root, len)))
                return "not one root element of the expected name";
            if (!self) {
                if (depth == 64)
                    return "nested too deep";
                memcpy(stack[depth], n, len);
                stack[depth++][len] = 0;
            }
        }
        p = q + 1;
    }
    if (depth) {
        snprintf(why, sizeof why, "<%s> is never closed", stack[depth - 1]);
        return why;
    }
    return roots == 1 ? NULL : "no root element";
}

/* ---------------------------------------------------------------- svg.c */

static void test_svg(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    svg_escape(f, "a<b&c\"d'e>f\x01g");
    fclose(f);
    CHECK(buf && !strcmp(buf, "a&lt;b&amp;c&quot;d&apos;e&gt;f g"), "svg_escape gave '%s'", buf ? buf : "(null)");
    free(buf);

    double t[32];
    int n = svg_ticks(SVG_LOG2, 1, 64, t, 32);
    CHECK(n == 7, "log2 ticks over [1, 64]: %d", n);
    for (int i = 0; i < n && n == 7; i++)
        CHECK(t[i] == (double)(1 << i), "log2 tick %d is %g", i, t[i]);
    n = svg_ticks(SVG_LOG2, 1, 4096, t, 32);
    CHECK(n == 7 && t[0] == 1 && t[1] == 4 && t[6] == 4096, "log2 ticks over [1, 4096]: %d (%g, %g, ...)", n, t[0],
          t[1]);
    double lo, hi;
    svg_axis_range(SVG_LOG2, 3, 50, &lo, &hi);
    CHECK(lo == 2 && hi == 64, "log2 range of [3, 50]: [%g, %g]", lo, hi);
    svg_axis_range(SVG_LOG2, 8, 8, &lo, &hi);
    CHECK(lo == 4 && hi == 16, "log2 range of one value 8: [%g, %g]", lo, hi);
    n = svg_ticks(SVG_LOG10, 10, 500, t, 32);
    static const double l10[6] = {10, 20, 50, 100, 200, 500};
    CHECK(n == 6, "log10 ticks over [10, 500]: %d", n);
    for (int i = 0; i < n && n == 6; i++)
        CHECK(fabs(t[i] - l10[i]) < 1e-9 * l10[i], "log10 tick %d is %g", i, t[i]);
    n = svg_ticks(SVG_LOG10, 1, 1e8, t, 32);
    CHECK(n == 9 && fabs(t[8] - 1e8) < 1, "log10 ticks over 8 decades: %d (powers only)", n);
    svg_axis_range(SVG_LOG10, 13, 420, &lo, &hi);
    CHECK(fabs(lo - 10) < 1e-9 && fabs(hi - 500) < 1e-9, "log10 range of [13, 420]: [%g, %g]", lo, hi);
    svg_axis_range(SVG_LINEAR, 3, 173, &lo, &hi);
    CHECK(lo == 0 && hi == 200, "linear range of [3, 173]: [%g, %g]", lo, hi);
    n = svg_ticks(SVG_LINEAR, 0, 200, t, 32);
    CHECK(n == 5 && t[0] == 0 && t[1] == 50 && t[4] == 200, "linear ticks over [0, 200]: %d", n);

    /* a whole chart: names with markup, a series with a limit, one without, a value a log axis cannot draw */
    double x[3] = {1, 4, 16}, y1[3] = {10, 35, 90}, l1[3] = {40, 160, 400}, y2[3] = {5, 0, 60};
    svg_series se[2] = {{"cpu <resident> & co", 3, x, y1, l1}, {"stream", 3, x, y2, NULL}};
    const char *cap[2] = {"limit: tok/s <= B / max(bytes/rate, B x flops/GEMM) & \"more\"", ""};
    svg_chart c = {"bench <of> A&B", "batch", "tok/s", SVG_LOG2, SVG_LOG10, se, 2, cap, 2};
    buf = NULL;
    f = open_memstream(&buf, &len);
    CHECK(svg_chart_write(f, &c) == 0, "svg_chart_write failed");
    fclose(f);
    const char *why = xml_check(buf, "svg");
    CHECK(!why, "chart is not well-formed: %s", why);
    CHECK(strstr(buf, "bench &lt;of&gt; A&amp;B") && strstr(buf, "cpu &lt;resident&gt; &amp; co") &&
              !strstr(buf, "<resident>") && strstr(buf, "&amp; &quot;more&quot;"),
          "labels not escaped");
    CHECK(count(buf, "<polyline") == 2, "%d polylines for 2 series", count(buf, "<polyline"));
    CHECK(count(buf, "class=\"limit\"") == 1 && strstr(buf, "stroke-dasharray"), "limit paths: %d",
          count(buf, "class=\"limit\""));
    CHECK(count(buf, "<circle") == 2 + 3 + 2, "markers: %d (3 + 2 drawable points, 2 legend)", count(buf, "<circle"));
    CHECK(strstr(buf, ">16</text>") && strstr(buf, ">500</text>"), "tick labels 16 and 500 missing");
    free(buf);
}

/* ---------------------------------------------------------------- the command */

typedef struct csv_row {
    char tier[32], basis[320];
    int batch, prompt, steps;
    double seconds, tok_s, pass_ms, limit;
} csv_row;

/* Parses bench.csv: '#' comment lines, the header, rows.  Returns the row count, -1 on a malformed file; header
 * numbers flops_per_token and streamed_bytes_per_pass into *flops and *sbytes. */
static int parse_csv(const char *s, csv_row *rows, int cap, double *flops, double *sbytes)
{
    int n = 0;
    bool header = false;
    for (const char *line = s; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char l[1024];
        if (len >= sizeof l)
            return -1;
        memcpy(l, line, len);
        l[len] = 0;
        line = end ? end + 1 : NULL;
        if (l[0] == '#') {
            sscanf(l, "# flops_per_token %lf, streamed_bytes_per_pass %lf", flops, sbytes);
            continue;
        }
        if (!header) {
            if (strcmp(l, "tier,batch,prompt_tokens,gen_steps,seconds,tok_s,pass_ms,limit_tok_s,limit_basis"))
                return -1;
            header = true;
            continue;
        }
        if (n == cap || count(l, ",") != 8)
            return -1;
        csv_row *r = &rows[n];
        int used = 0;
        if (sscanf(l, "%31[^,],%d,%d,%d,%lf,%lf,%lf,%lf,%n", r->tier, &r->batch, &r->prompt, &r->steps, &r->seconds,
                   &r->tok_s, &r->pass_ms, &r->limit, &used) != 8 ||
            !used)
            return -1;
        snprintf(r->basis, sizeof r->basis, "%s", l + used);
        n++;
    }
    return header ? n : -1;
}

static char tmp[] = "/tmp/spill_test_bench_XXXXXX";

static void check_outputs(const char *dir, const char *const *tiers, int n_tiers, const int *batches, int n_batches,
                          const char *basis_has, csv_row *rows, int *n_rows, double *flops, double *sbytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bench.csv", dir);
    char *csv = slurp(path);
    CHECK(csv != NULL, "%s missing", path);
    int n = csv ? parse_csv(csv, rows, 32, flops, sbytes) : -1;
    *n_rows = n;
    CHECK(n == n_tiers * n_batches, "%s: %d rows, want %d", path, n, n_tiers * n_batches);
    CHECK(*flops > 0 && *sbytes > 0, "%s: header figures %g FLOPs, %g bytes", path, *flops, *sbytes);
    for (int i = 0; i < n && n == n_tiers * n_batches; i++) {
        const csv_row *r = &rows[i];
        CHECK(!strcmp(r->tier, tiers[i / n_batches]) && r->batch == batches[i % n_batches], "row %d: %s %d", i, r->tier,
              r->batch);
        CHECK(r->prompt == 8 && r->steps == 4, "row %d: prompt %d, steps %d", i, r->prompt, r->steps);
        CHECK(r->seconds > 0 && isfinite(r->tok_s) && r->tok_s > 0 && r->pass_ms > 0 && r->limit > 0 &&
                  isfinite(r->limit),
              "row %d: seconds %g tok/s %g pass %g limit %g", i, r->seconds, r->tok_s, r->pass_ms, r->limit);
        CHECK(fabs(r->tok_s - r->batch * r->steps / r->seconds) <= 0.01 * r->tok_s + 0.01, "row %d: tok/s %g vs %g", i,
              r->tok_s, r->batch * r->steps / r->seconds);
        CHECK(r->basis[0] && strstr(r->basis, basis_has), "row %d: basis '%s' lacks '%s'", i, r->basis, basis_has);
    }
    CHECK(csv && strstr(csv, "# limit: tok/s <= B / max("), "%s: the formula is not in the header", path);
    free(csv);

    snprintf(path, sizeof path, "%s/bench.svg", dir);
    char *svg = slurp(path);
    CHECK(svg != NULL, "%s missing", path);
    const char *why = svg ? xml_check(svg, "svg") : "missing";
    CHECK(!why, "%s: %s", path, why);
    CHECK(svg && count(svg, "<polyline") == n_tiers, "%s: %d polylines for %d tiers", path, count(svg, "<polyline"),
          n_tiers);
    CHECK(svg && count(svg, "class=\"limit\"") == n_tiers && strstr(svg, "stroke-dasharray"), "%s: %d limit lines",
          path, count(svg, "class=\"limit\""));
    CHECK(svg && strstr(svg, " limit</text>") && strstr(svg, "tok/s &lt;= B / max("), "%s: limit legend or caption",
          path);
    free(svg);

    snprintf(path, sizeof path, "%s/bench.md", dir);
    char *md = slurp(path);
    CHECK(md && strstr(md, "| tier | batch |") && count(md, "\n| ") == 1 + n_tiers * n_batches, "%s: table", path);
    free(md);
}

/* One sentence on stderr: one line, ending with '.'. */
static void check_sentence(const char *err_path, const char *what)
{
    char *e = slurp(err_path);
    size_t n = e ? strlen(e) : 0;
    CHECK(n > 10 && e[n - 1] == '\n' && e[n - 2] == '.' && count(e, "\n") == 1 && !strncmp(e, "spill bench: ", 13),
          "%s: stderr is not one sentence: '%s'", what, e ? e : "(none)");
    free(e);
}

static void test_binary(void)
{
    char dir[600], out[600], errp[600], home[600];
    snprintf(home, sizeof home, "%s/home", tmp);
    snprintf(dir, sizeof dir, "%s/out", tmp);
    snprintf(out, sizeof out, "%s/stdout", tmp);
    snprintf(errp, sizeof errp, "%s/stderr", tmp);
    setenv("SPILL_HOME", home, 1);

    const char *a1[] = {NULL, "bench", MODEL, "--batches", "1,4", "--gen", "4", "--prompt", "8", "-o", dir, NULL};
    int rc = spawn(a1, out, errp);
    CHECK(rc == 0, "spill bench: exit %d", rc);
    char *so = slurp(out), *se = slurp(errp);
    CHECK(so && strstr(so, "resident") && strstr(so, "limit tok/s"), "stdout has no table: %s", so ? so : "");
    CHECK(se && strstr(se, "skipping gpu-resident, gpu-pinned, gpu-disk"),
          "stderr does not say the GPU tiers were "
          "skipped: %s",
          se ? se : "");
    free(so), free(se);
    static const char *const cpu_tiers[2] = {"resident", "stream"};
    static const int b14[2] = {1, 4};
    csv_row rows[32];
    int n;
    double flops = 0, sbytes = 0;
    check_outputs(dir, cpu_tiers, 2, b14, 2, "measured now", rows, &n, &flops, &sbytes);

    /* a stored probe: the streamed tier's limit is B / max(bytes / disk, B x flops / GEMM) over its rates */
    char cal[700], pj[800];
    snprintf(cal, sizeof cal, "%s/calibration", home);
    mkdir(home, 0755);
    mkdir(cal, 0755);
    snprintf(pj, sizeof pj, "%s/probe.json", cal);
    FILE *f = fopen(pj, "w");
    fprintf(f, "{\"version\":1,\"time\":\"2025-01-01T00:00:00Z\",\"ram\":{\"total_bytes\":1,\"available_bytes\":1},"
               "\"disk\":{\"dir\":\"/x\",\"o_direct\":true,\"read_gbs\":0.000002,\"reads\":[");
    for (int i = 0; i < 6; i++)
        fprintf(f, "%s{\"request_mib\":1,\"readers\":1,\"gbs\":0.000002}", i ? "," : "");
    fprintf(f, "]},\"cpu\":{\"threads\":1,\"matmul\":{\"dtype\":\"F16\",\"n\":1,\"k\":1,\"t\":1,\"gflops\":0.5}}}\n");
    fclose(f);
    static const char *const st[1] = {"stream"};
    static const int b28[2] = {2, 8};
    const char *a2[] = {NULL,    "bench", MODEL,      "--tiers", "stream", "--batches", "8,2",
                        "--gen", "4",     "--prompt", "8",       "-o",     dir,         NULL};
    rc = spawn(a2, out, errp);
    CHECK(rc == 0, "spill bench with a stored probe: exit %d", rc);
    check_outputs(dir, st, 1, b28, 2, "stored probe of 2025-01-01T00:00:00Z", rows, &n, &flops, &sbytes);
    for (int i = 0; i < n && n == 2; i++) {
        double B = rows[i].batch, pass = fmax(sbytes / 2e3, B * flops / 0.5e9), want = B / pass;
        CHECK(fabs(rows[i].limit - want) <= 1e-3 * want, "batch %d: limit %g, the formula gives %g", rows[i].batch,
              rows[i].limit, want);
    }

    /* --verify 3: every decode pass feeds each row 4 tokens with every position's logits (a speculative verify
     * pass); the run completes under ASan (buffers sized for 4 logits rows a row), the CSV says so, and the limit
     * counts the tokens fed: B / max(bytes / disk, 4 B x flops / GEMM) */
    const char *a3[] = {NULL, "bench", MODEL, "--tiers", "stream", "--batches", "8,2", "--gen", "4", "--prompt", "8",
                        "--verify", "3", "-o", dir, NULL};
    rc = spawn(a3, out, errp);
    CHECK(rc == 0, "spill bench --verify 3: exit %d", rc);
    check_outputs(dir, st, 1, b28, 2, "stored probe of 2025-01-01T00:00:00Z", rows, &n, &flops, &sbytes);
    for (int i = 0; i < n && n == 2; i++) {
        double B = rows[i].batch, pass = fmax(sbytes / 2e3, 4 * B * flops / 0.5e9), want = B / pass;
        CHECK(fabs(rows[i].limit - want) <= 1e-3 * want, "--verify 3, batch %d: limit %g, the formula gives %g",
              rows[i].batch, rows[i].limit, want);
    }
    char vcsv[700];
    snprintf(vcsv, sizeof vcsv, "%s/bench.csv", dir);
    char *vc = slurp(vcsv);
    CHECK(vc && strstr(vc, "# --verify 3: each decode pass feeds every row 4 tokens"),
          "bench.csv does not say the passes were verify passes: %.300s", vc ? vc : "");
    free(vc);

    /* bad arguments: exit 2, one sentence */
    const char *bad[][8] = {
        {NULL, "bench", MODEL, "--batches", "1,x", NULL},
        {NULL, "bench", MODEL, "--batches", "4,,8", NULL},
        {NULL, "bench", MODEL, "--batches", "0", NULL},
        {NULL, "bench", MODEL, "--tiers", "resident,warp", NULL},
        {NULL, "bench", MODEL, "--gen", "0", NULL},
        {NULL, "bench", MODEL, "--verify", "17", NULL},
        {NULL, "bench", MODEL, "--seconds", "-1", NULL},
        {NULL, "bench", MODEL, "--bogus", NULL},
        {NULL, "bench", "--gen", "4", NULL},
        {NULL, "bench", MODEL, "--tiers", "gpu-disk", NULL}, /* a CPU build: nothing left to run */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = spawn(bad[i], out, errp);
        CHECK(rc == 2, "bad arguments %zu (%s %s): exit %d, want 2", i, bad[i][3], bad[i][4] ? bad[i][4] : "", rc);
        if (i < 8)
            check_sentence(errp, bad[i][3]);
    }
    const char *help[] = {NULL, "bench", "--help", NULL};
    rc = spawn(help, out, errp);
    so = slurp(out);
    CHECK(rc == 0 && so && strstr(so, "--batches") && strstr(so, "--tiers") && strstr(so, "--seconds") &&
              strstr(so, "gpu-pinned"),
          "spill bench --help: exit %d, %s", rc, so ? so : "");
    free(so);
    const char *none[] = {NULL, "bench", "tests/data/tiny/no-such.gguf", NULL};
    CHECK(spawn(none, out, errp) == 66, "a missing model: want 66");
    char below_file[700];
    snprintf(below_file, sizeof below_file, "%s/x", out); /* a directory under a regular file */
    const char *cant[] = {NULL, "bench", MODEL, "--batches", "1", "--gen", "1", "-o", below_file, NULL};
    rc = spawn(cant, out, errp);
    CHECK(rc == 73, "-o under a regular file: exit %d, want 73", rc);
}

/* ---------------------------------------------------------------- GPU tiers, on a stand-in */

static int fake_pick(void *impl, fwd_seq *seqs, int n, const int32_t *want, const int32_t *target,
                     struct sample_result *picks, float *logits, char *err, size_t errlen)
{
    if (engine_forward(impl, seqs, n, logits, err, errlen))
        return -1;
    int V = engine_model(impl)->vocab;
    for (int s = 0, k = 0; s < n; s++) {
        if (!seqs[s].want_logits)
            continue;
        CHECK(want[k] == -1 && !target, "forward_pick asked for %d", want[k]);
        const float *l = logits + (size_t)k * (size_t)V;
        int best = 0;
        for (int v = 1; v < V; v++)
            best = l[v] > l[best] ? v : best;
        picks[k++].token = best;
    }
    return 0;
}

static int gpu_opens, gpu_streamed, gpu_disk;
static int fake_gpu_open(model_desc *m, const engine_opts *o, int resident_layers, spill_backend *out, char *err,
                         size_t errlen)
{
    gpu_opens++;
    gpu_streamed += o->stream && resident_layers == 0;
    gpu_disk += o->from_disk;
    engine_opts c = *o;
    c.stream = false; /* the stand-in keeps everything in RAM */
    if (engine_backend_cpu(m, &c, out, err, errlen))
        return -1;
    snprintf(out->name, sizeof out->name, "stand-in GPU");
    out->forward_pick = fake_pick;
    return 0;
}

static void test_gpu_tiers(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/gpu", tmp);
    char *argv[] = {MODEL, "--tiers", "gpu-resident,gpu-disk", "--batches", "1,2", "--gen", "4", "--prompt", "8", "-o",
                    dir,   NULL};
    spill_gpu_open = fake_gpu_open;
    int rc = bench_main(11, argv);
    spill_gpu_open = NULL;
    CHECK(rc == 0, "bench_main with GPU tiers: %d", rc);
    CHECK(gpu_opens == 2 && gpu_streamed == 1 && gpu_disk == 1, "GPU opens %d, streamed %d, from disk %d", gpu_opens,
          gpu_streamed, gpu_disk);
    static const char *const gt[2] = {"gpu-resident", "gpu-disk"};
    static const int b12[2] = {1, 2};
    csv_row rows[32];
    int n;
    double flops = 0, sbytes = 0;
    check_outputs(dir, gt, 2, b12, 2, "", rows, &n, &flops, &sbytes);
    for (int i = 0; i < n && n == 4; i++)
        CHECK(strstr(rows[i].basis, i < 2 ? "the GPU planner's rate" : "stored probe"), "row %d: basis '%s'", i,
              rows[i].basis);
}

int main(void)
{
    test_svg();
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_binary();
    test_gpu_tiers();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup of %s", tmp);
    fflush(stdout); /* bench_main's table before the summary line */
    return test_finish("test_bench");
}
