/*
 * test_adapters.c — LoRA adapters in a job, end to end through the real binary (build/asan/spill, or
 * $SPILL_BIN), on tests/data/tiny/tiny-smollm2.gguf (real vocabulary and chat template, tiny body: L=2 D=32
 * H=4 K=2 S=8 F=64).  The adapters are random PEFT directories written here (rank 4 and 2, scale 2, B non-zero,
 * different target sets), two under $SPILL_HOME/adapters/ (a temporary SPILL_HOME) and one given by path.
 *
 *   - one job mixing rows of three adapters and the bare base (named BASE+ADAPTER, by adapter name, by path,
 *     the bare base, and a label body.model that is ignored: the command line's adapter) answers every row
 *     exactly as a job with that adapter alone does (greedy, so the text is the model's argmax path; the pass
 *     gives a row the same numbers whatever its batch-mates, so equal is the bound);
 *   - the adapters change answers (rows of an adapter differ from the bare base's somewhere);
 *   - each row's stamp carries its adapter's full hash (null for the bare base) and DIR/adapters.json lists
 *     the job's adapters;
 *   - `spill adapters` lists the two installed ones; a missing adapter on the command line is refused before a
 *     job exists (exit 65 or 66 with a sentence); a row naming an adapter of another base fails alone.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "peft_fixture.h"
#include "test.h"

#define TINY "tests/data/tiny/tiny-smollm2.gguf"
#define ROWS 16

static const char *stamp_adapter(json_t *line)
{
    return json_string_value(json_object_get(json_object_get(line, "spill"), "adapter"));
}

/* Rows whose body.model is model(i); every row the same prompts in every job. */
static void write_input(const char *path, const char *(*model)(int))
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < ROWS; i++)
        fprintf(f, "{\"custom_id\":\"r%d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                   "\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Question %d: tell me about %s\"}],"
                   "\"max_tokens\":%d,\"temperature\":0}}\n",
                i, model(i), i, i % 2 ? "rivers" : "the moon", 6 + i % 5);
    fclose(f);
}

static char g_a3[1024], g_spec_a1[1200], g_spec_a3[2300];
/* the mixed job's rows: a1 by BASE+ADAPTER, a2 by name, a3 by BASE+path, the bare base, a label (-> a1) */
static const char *mixed_model(int i)
{
    switch (i % 5) {
    case 0: return g_spec_a1;
    case 1: return "a2";
    case 2: return g_spec_a3;
    case 3: return TINY;
    default: return "gpt-4o-mini";
    }
}
static const char *label_model(int i)
{
    (void)i;
    return "some label";
}
/* the adapter each mixed row must have run: 1 = a1, 2 = a2, 3 = a3, 0 = base */
static int mixed_adapter(int i)
{
    static const int m[5] = {1, 2, 3, 0, 1};
    return m[i % 5];
}

int main(void)
{
    char tmp[] = "/tmp/spill-test-adapters-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char home[1100], ads[1200], dir[1300];
    snprintf(home, sizeof home, "%s/home", tmp);
    snprintf(ads, sizeof ads, "%s/adapters", home);
    mkdir(home, 0755);
    mkdir(ads, 0755);
    setenv("SPILL_HOME", home, 1);
    static const char *const all7[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    static const char *const qv[] = {"q_proj", "v_proj"};
    static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj", "o_proj"};
    snprintf(dir, sizeof dir, "%s/a1", ads);
    write_peft(dir, 4, all7, 7);
    snprintf(dir, sizeof dir, "%s/a2", ads);
    write_peft(dir, 2, qv, 2);
    snprintf(g_a3, sizeof g_a3, "%s/a3", tmp);
    write_peft(g_a3, 4, mlp, 4);
    snprintf(g_spec_a1, sizeof g_spec_a1, "%s+a1", TINY);
    snprintf(g_spec_a3, sizeof g_spec_a3, "%s+%s", TINY, g_a3);

    /* the mixed job, and one job per adapter (every row a label: the command line's model) */
    char in[1200], job[1300], path[1400];
    snprintf(in, sizeof in, "%s/mixed.jsonl", tmp);
    write_input(in, mixed_model);
    snprintf(job, sizeof job, "%s/mixed", tmp);
    int rc = sh("%s run %s %s -o %s --batch 5 --quiet >/dev/null 2>%s/mixed.err", bin(), g_spec_a1, in, job, tmp);
    CHECK(rc == 0, "the mixed job: exit %d", rc);
    snprintf(path, sizeof path, "%s/results.jsonl", job);
    json_t *mixed = read_lines(path);
    CHECK(json_array_size(mixed) == ROWS, "mixed job: %zu rows answered", json_array_size(mixed));
    snprintf(path, sizeof path, "%s/adapters.json", job);
    json_t *aj = json_load_file(path, 0, NULL);
    CHECK(json_array_size(json_object_get(aj, "adapters")) == 3, "adapters.json lists %zu adapters, want 3",
          json_array_size(json_object_get(aj, "adapters")));

    snprintf(in, sizeof in, "%s/label.jsonl", tmp);
    write_input(in, label_model);
    json_t *alone[4];
    const char *hash[4] = {NULL};
    const char *specs[4] = {TINY, g_spec_a1, NULL, g_spec_a3};
    char spec_a2[1200];
    snprintf(spec_a2, sizeof spec_a2, "%s+a2", TINY);
    specs[2] = spec_a2;
    for (int a = 0; a < 4; a++) {
        snprintf(job, sizeof job, "%s/alone%d", tmp, a);
        rc = sh("%s run %s %s -o %s --batch 3 --quiet >/dev/null 2>&1", bin(), specs[a], in, job);
        CHECK(rc == 0, "job with adapter %d alone: exit %d", a, rc);
        snprintf(path, sizeof path, "%s/results.jsonl", job);
        alone[a] = read_lines(path);
        hash[a] = stamp_adapter(json_array_get(alone[a], 0));
        CHECK(a == 0 ? hash[a] == NULL : hash[a] && strlen(hash[a]) == 64, "adapter %d: stamp hash %s", a,
              hash[a] ? hash[a] : "null");
    }
    int same = 0, differ = 0;
    for (int i = 0; i < ROWS; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        int a = mixed_adapter(i);
        json_t *m = by_id(mixed, id), *s = by_id(alone[a], id), *b = by_id(alone[0], id);
        const char *am = m ? chat_answer(m) : NULL, *as = s ? chat_answer(s) : NULL, *ab = b ? chat_answer(b) : NULL;
        CHECK(am && as && !strcmp(am, as), "row %s (adapter %d): mixed job answered \"%s\", alone \"%s\"", id, a,
              am ? am : "(none)", as ? as : "(none)");
        same += am && as && !strcmp(am, as);
        const char *hm = m ? stamp_adapter(m) : NULL;
        CHECK((hm == NULL) == (hash[a] == NULL) && (!hm || !strcmp(hm, hash[a])), "row %s: stamp adapter %s, want %s",
              id, hm ? hm : "null", hash[a] ? hash[a] : "null");
        if (a && as && ab && strcmp(as, ab))
            differ++;
        /* body.model names the model that ran; the request's name stays in the stamp when it differs */
        const char *bm = m ? json_string_value(json_object_get(json_object_get(json_object_get(m, "response"), "body"),
                                                                "model"))
                           : NULL;
        const char *rq = m ? json_string_value(json_object_get(json_object_get(m, "spill"), "requested_model")) : NULL;
        char want_model[2400];
        const char *asked = mixed_model(i);
        if (a == 1 && strcmp(asked, g_spec_a1))
            snprintf(want_model, sizeof want_model, "%s", g_spec_a1); /* a label: the command line's model */
        else if (a == 2)
            snprintf(want_model, sizeof want_model, "%s+a2", TINY); /* an installed name: BASE+name */
        else
            snprintf(want_model, sizeof want_model, "%s", asked);
        bool want_rq = strcmp(asked, want_model) != 0;
        CHECK(bm && !strcmp(bm, want_model) && (want_rq ? rq && !strcmp(rq, asked) : rq == NULL),
              "row %s: body.model %s (want %s), requested_model %s", id, bm ? bm : "(none)", want_model,
              rq ? rq : "(none)");
    }
    CHECK(differ >= 3, "only %d adapter rows answer differently from the bare base", differ);
    fprintf(stderr, "mixed job (3 adapters + bare base in one pass): %d of %d rows equal to their adapter alone; "
                    "%d adapter rows differ from the base\n",
            same, ROWS, differ);

    /* spill adapters */
    snprintf(path, sizeof path, "%s/list.txt", tmp);
    rc = sh("%s adapters > %s 2>&1", bin(), path);
    char buf[8192] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    CHECK(rc == 0 && strstr(buf, "a1") && strstr(buf, "a2") && strstr(buf, hash[1] ? hash[1] : "?"),
          "spill adapters: exit %d, %.400s", rc, buf);

    /* a missing adapter on the command line: refused before a job exists */
    snprintf(job, sizeof job, "%s/missing", tmp);
    snprintf(path, sizeof path, "%s/missing.err", tmp);
    rc = sh("%s run %s+nosuch %s -o %s --quiet >/dev/null 2>%s", bin(), TINY, in, job, path);
    f = fopen(path, "r");
    buf[0] = 0;
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    CHECK((rc == 65 || rc == 66) && strstr(buf, "nosuch") && access(job, F_OK) != 0,
          "BASE+nosuch: exit %d, %.300s", rc, buf);
    /* a row naming another base's adapter fails alone */
    snprintf(in, sizeof in, "%s/other.jsonl", tmp);
    f = fopen(in, "w");
    fprintf(f, "{\"custom_id\":\"x\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
               "\"smollm2:135m+a1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}}\n"
               "{\"custom_id\":\"y\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
               "\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}}\n");
    fclose(f);
    snprintf(job, sizeof job, "%s/other", tmp);
    rc = sh("%s run %s %s -o %s --quiet >/dev/null 2>&1", bin(), g_spec_a1, in, job);
    snprintf(path, sizeof path, "%s/errors.jsonl", job);
    json_t *errs = read_lines(path);
    json_t *e0 = json_array_get(errs, 0);
    const char *msg = json_string_value(
        json_object_get(json_object_get(json_object_get(json_object_get(e0, "response"), "body"), "error"), "message"));
    CHECK(rc == 0 && json_array_size(errs) == 1 && msg && strstr(msg, "another base") == NULL &&
              strstr(msg, "this job runs"),
          "a row naming another base's adapter: exit %d, %zu errors, %s", rc, json_array_size(errs), msg ? msg : "");
    json_decref(errs);

    json_decref(mixed);
    json_decref(aj);
    for (int a = 0; a < 4; a++)
        json_decref(alone[a]);
    if (!test_failures)
        sh("rm -rf %s", tmp);
    return test_finish("test_adapters");
}
