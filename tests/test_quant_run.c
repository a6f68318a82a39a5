/*
 * test_quant_run.c — `spill run --quant`: the requantized copy is written once under $SPILL_HOME/cache/quant,
 * reused, and answers exactly as `spill pack` of the same quant run directly (same bytes, same greedy tokens); a
 * quant the file already has runs the file; auto resolves by its rule and the job stores what it resolved (a
 * resume reopens the same copy); the quant is in the pre-run line, the progress line and every row's stamp;
 * fp8 makes its copy like the others and answers as spill pack's fp8 file; unknown names are refused up front
 * (exit 2, no job).
 *
 * The tiny model's matrices are Q8_0: q8 is "the file has it", q4 and bf16 make copies, and auto (never wider
 * than the file, which fits any budget) picks q8.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"

static char tmp[] = "/tmp/spill_test_quant_XXXXXX";

static void write_input(const char *path)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 12; i++)
        fprintf(f,
                "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
                "\"messages\":[{\"role\":\"user\",\"content\":\"Question %d: name %d colours.\"}],\"max_tokens\":24,"
                "\"temperature\":0}}\n",
                i, i, i + 2);
    fclose(f);
}

/* The answers of a job, custom_id -> content, and every line's spill.quant checked against want. */
static json_t *answers(const char *dir, const char *want, int *n)
{
    char p[700];
    snprintf(p, sizeof p, "%s/results.jsonl", dir);
    json_t *lines = read_lines(p), *out = json_object();
    size_t i;
    json_t *l;
    *n = 0;
    json_array_foreach(lines, i, l)
    {
        const char *q = json_string_value(json_object_get(json_object_get(l, "spill"), "quant"));
        CHECK(q && !strcmp(q, want), "%s: a row's stamp says quant %s, want %s", dir, q ? q : "(none)", want);
        const char *a = chat_answer(l);
        json_object_set_new(out, json_string_value(json_object_get(l, "custom_id")), json_string(a ? a : ""));
        (*n)++;
    }
    json_decref(lines);
    return out;
}

static void read_all(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[got] = 0;
    if (f)
        fclose(f);
}

/* The job's stored options.quant, or "" */
static void stored_quant(const char *dir, char *out, size_t cap)
{
    char p[700];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    json_t *m = json_load_file(p, 0, NULL);
    const char *q = json_string_value(json_object_get(json_object_get(m, "options"), "quant"));
    snprintf(out, cap, "%s", q ? q : "");
    json_decref(m);
}

/* Runs --quant q into tmp/<name>; its stdout+stderr in tmp/<name>.log.  Exit code. */
static int run_q(const char *name, const char *q, const char *extra)
{
    return sh("SPILL_HOME=%s/home %s run %s %s/in.jsonl -o %s/%s --quant %s %s > %s/%s.log 2>&1", tmp, bin(), MODEL,
              tmp, tmp, name, q, extra, tmp, name);
}

int main(void)
{
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char in[600], p[900], log[8192];
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    write_input(in);
    int n;

    /* q4: a copy, and the same answers as spill pack's q4 file run as it is */
    CHECK(sh("%s pack %s --quant q4 -o %s/ref-q4.gguf > %s/pack.log 2>&1", bin(), MODEL, tmp, tmp) == 0, "spill pack");
    CHECK(sh("SPILL_HOME=%s/home %s run %s/ref-q4.gguf %s -o %s/ref4 --quiet > %s/quiet.log 2>&1", tmp, bin(), tmp, in,
             tmp, tmp) == 0, "run of the packed q4 file");
    json_t *ref4 = NULL;
    {
        snprintf(p, sizeof p, "%s/ref4", tmp);
        /* the packed file's own label is its main type (Q4_0 or Q4_1): read it from the first line */
        char rp[1000];
        snprintf(rp, sizeof rp, "%s/results.jsonl", p);
        json_t *ls = read_lines(rp);
        const char *q = json_string_value(json_object_get(json_object_get(json_array_get(ls, 0), "spill"), "quant"));
        CHECK(q && !strncmp(q, "Q4_", 3), "the packed q4 file runs as %s, want Q4_0 or Q4_1", q ? q : "(none)");
        ref4 = answers(p, q ? q : "Q4_0", &n);
        json_decref(ls);
    }
    CHECK(run_q("q4", "q4", "") == 0, "--quant q4 run failed");
    snprintf(p, sizeof p, "%s/q4.log", tmp);
    read_all(p, log, sizeof log);
    CHECK(strstr(log, "writing the model as q4, once, into ") != NULL, "the first q4 run did not say it writes the "
          "copy: %.400s", log);
    snprintf(p, sizeof p, "%s/q4", tmp);
    json_t *a4 = answers(p, "q4", &n);
    CHECK(n == 12 && json_equal(a4, ref4), "--quant q4 answered %d rows, %s spill pack's q4 file", n,
          json_equal(a4, ref4) ? "as" : "NOT as");
    char sq[32];
    stored_quant(p, sq, sizeof sq);
    CHECK(!strcmp(sq, "q4"), "the q4 job stored quant '%s'", sq);
    /* the copy is in the cache and byte-identical to spill pack's */
    CHECK(sh("ls %s/home/cache/quant/*-q4.gguf > %s/quiet.log 2>&1", tmp, tmp) == 0, "no q4 copy under $SPILL_HOME/cache/quant");
    CHECK(sh("cmp -s %s/home/cache/quant/*-q4.gguf %s/ref-q4.gguf", tmp, tmp) == 0,
          "the cached q4 copy differs from spill pack's");

    /* a second q4 run reuses it: no "writing", progress line and pre-run line name q4 */
    CHECK(run_q("q4b", "q4", "") == 0, "second --quant q4 run failed");
    snprintf(p, sizeof p, "%s/q4b.log", tmp);
    read_all(p, log, sizeof log);
    CHECK(strstr(log, "writing the model") == NULL, "the second q4 run wrote the copy again: %.300s", log);
    CHECK(strstr(log, "(llama, q4: ") != NULL, "the pre-run line does not name q4: %.300s", log);
    CHECK(strstr(log, " · q4 · batch ") != NULL, "the progress line does not name q4: %.600s", log);
    snprintf(p, sizeof p, "%s/q4b", tmp);
    json_t *a4b = answers(p, "q4", &n);
    CHECK(json_equal(a4b, ref4), "the second q4 run answered differently");

    /* q8: the file has it — no copy */
    CHECK(run_q("q8", "q8", "--quiet") == 0, "--quant q8 run failed");
    CHECK(sh("ls %s/home/cache/quant/*-q8.gguf > %s/quiet.log 2>&1", tmp, tmp) != 0, "q8 of a Q8_0 file made a copy");
    CHECK(sh("SPILL_HOME=%s/home %s run %s %s -o %s/plain --quiet > %s/quiet.log 2>&1", tmp, bin(), MODEL, in, tmp, tmp) == 0,
          "plain run failed");
    snprintf(p, sizeof p, "%s/plain", tmp);
    json_t *ap = answers(p, "Q8_0", &n);
    snprintf(p, sizeof p, "%s/q8", tmp);
    json_t *a8 = answers(p, "q8", &n);
    CHECK(json_equal(a8, ap), "--quant q8 on a Q8_0 file answered differently from the file as it is");

    /* bf16: a copy (bf16 rounds Q8_0's scaled values, so the answers may differ from the file's: only equality with
     * spill pack's bf16 file run as it is, which holds the same bytes, is asserted) */
    CHECK(sh("%s pack %s --quant bf16 -o %s/ref-bf16.gguf > %s/pack.log 2>&1", bin(), MODEL, tmp, tmp) == 0,
          "spill pack --quant bf16");
    CHECK(sh("SPILL_HOME=%s/home %s run %s/ref-bf16.gguf %s -o %s/refb --quiet > %s/quiet.log 2>&1", tmp, bin(), tmp,
             in, tmp, tmp) == 0, "run of the packed bf16 file");
    snprintf(p, sizeof p, "%s/refb", tmp);
    json_t *refb = answers(p, "BF16", &n);
    CHECK(run_q("bf", "bf16", "--quiet") == 0, "--quant bf16 run failed");
    snprintf(p, sizeof p, "%s/bf", tmp);
    json_t *ab = answers(p, "bf16", &n);
    CHECK(n == 12 && json_equal(ab, refb), "--quant bf16 answered differently from spill pack's bf16 file");

    /* auto: never wider than the file; q8 fits, and the file has it; the job stores "q8" */
    CHECK(run_q("auto", "auto", "") == 0, "--quant auto run failed");
    snprintf(p, sizeof p, "%s/auto.log", tmp);
    read_all(p, log, sizeof log);
    CHECK(strstr(log, "--quant auto: q8: its weights (") != NULL, "auto did not say it picked q8 and why: %.400s", log);
    snprintf(p, sizeof p, "%s/auto", tmp);
    stored_quant(p, sq, sizeof sq);
    CHECK(!strcmp(sq, "q8"), "the auto job stored quant '%s', want the resolved q8", sq);
    json_t *aa = answers(p, "q8", &n);
    CHECK(json_equal(aa, ap), "--quant auto (q8) answered differently from the file as it is");

    /* resume of an interrupted q4 job reopens the same copy (else its fingerprint check refuses it) */
    snprintf(p, sizeof p, "%s/int", tmp);
    int rc = sh("SPILL_HOME=%s/home timeout -s INT 1 %s run %s %s -o %s --quant q4 --batch 1 --quiet > %s/quiet.log 2>&1",
                tmp, bin(), MODEL, in, p, tmp);
    CHECK(rc == 0 || rc == 75 || rc == 124, "interrupted q4 run: exit %d", rc);
    CHECK(sh("SPILL_HOME=%s/home %s resume %s --quiet > %s/resume.log 2>&1", tmp, bin(), p, tmp) == 0,
          "resume of the q4 job failed (exit code above; see %s/resume.log)", tmp);
    json_t *ai = answers(p, "q4", &n);
    CHECK(n == 12 && json_equal(ai, ref4), "the interrupted and resumed q4 job answered %d rows differently", n);

    /* fp8: a copy (fp8 rows, head BF16) that answers as spill pack's fp8 file run as it is */
    CHECK(sh("%s pack %s --quant fp8 -o %s/ref-fp8.gguf > %s/pack.log 2>&1", bin(), MODEL, tmp, tmp) == 0,
          "spill pack --quant fp8");
    CHECK(sh("SPILL_HOME=%s/home %s run %s/ref-fp8.gguf %s -o %s/ref8f --quiet > %s/quiet.log 2>&1", tmp, bin(), tmp,
             in, tmp, tmp) == 0, "run of the packed fp8 file");
    snprintf(p, sizeof p, "%s/ref8f", tmp);
    json_t *ref8f = answers(p, "F8_E4M3", &n);
    CHECK(run_q("fp8", "fp8", "--quiet") == 0, "--quant fp8 run failed");
    snprintf(p, sizeof p, "%s/fp8", tmp);
    json_t *af = answers(p, "fp8", &n);
    CHECK(n == 12 && json_equal(af, ref8f), "--quant fp8 answered differently from spill pack's fp8 file");
    CHECK(sh("cmp -s %s/home/cache/quant/*-fp8.gguf %s/ref-fp8.gguf", tmp, tmp) == 0,
          "the cached fp8 copy differs from spill pack's");

    /* refused up front: exit 2 and no job directory */
    snprintf(p, sizeof p, "%s/bad", tmp);
    CHECK(run_q("bad", "q3", "") == 2 && access(p, F_OK) != 0, "--quant q3 was not refused up front");

    json_decref(ref4), json_decref(a4), json_decref(a4b), json_decref(ap), json_decref(a8), json_decref(refb);
    json_decref(ab), json_decref(aa), json_decref(ai), json_decref(ref8f), json_decref(af);
    sh("rm -rf %s", tmp);
    return test_finish("test_quant_run");
}
