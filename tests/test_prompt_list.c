/*
 * test_prompt_list.c — /v1/completions rows whose prompt is a list (of strings or of token-id lists) with n
 * choices: one answer line per row, choices indexed k*n + c for prompt k as OpenAI numbers them, each prompt's
 * choices equal to what the same prompt answers alone (greedy; and seeded sampling for the first prompt, whose
 * RNG streams are the single row's), usage summed over the prompts, echo giving each choice its own prompt's
 * text; a prompt of the list that cannot run fails the whole line once in errors.jsonl, naming body.prompt[k];
 * a resume writes nothing twice; the openai types accept every line.
 */
#include <unistd.h>

#include "cli.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"

static char tmp[] = "/tmp/spill_test_plist_XXXXXX";

static const char *const P[] = {"The capital of France is", "One, two, three,", "Colours: red,"};

static void line(FILE *f, const char *id, const char *prompt_json, const char *extra)
{
    fprintf(f,
            "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\","
            "\"prompt\":%s,\"max_tokens\":6%s}}\n",
            id, prompt_json, extra);
}

static void write_input(const char *path)
{
    FILE *f = fopen(path, "w");
    char list[512], one[128];
    snprintf(list, sizeof list, "[\"%s\",\"%s\",\"%s\"]", P[0], P[1], P[2]);
    line(f, "list-greedy", list, ",\"n\":2,\"temperature\":0");
    line(f, "list-seeded", list, ",\"n\":2,\"temperature\":1,\"seed\":7");
    line(f, "list-echo", list, ",\"echo\":true,\"logprobs\":1,\"temperature\":0");
    line(f, "list-ids", "[[504,3575,282],[28,29,30,31]]", ",\"temperature\":0");
    for (int k = 0; k < 3; k++) {
        char id[32];
        snprintf(id, sizeof id, "single-%d", k);
        snprintf(one, sizeof one, "\"%s\"", P[k]);
        line(f, id, one, ",\"n\":2,\"temperature\":0");
        snprintf(id, sizeof id, "seeded-%d", k);
        line(f, id, one, ",\"n\":2,\"temperature\":1,\"seed\":7");
    }
    line(f, "single-ids-0", "[504,3575,282]", ",\"temperature\":0");
    line(f, "single-ids-1", "[28,29,30,31]", ",\"temperature\":0");
    /* the second prompt is longer than the model's context: the line fails whole */
    fprintf(f, "{\"custom_id\":\"list-long\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\","
               "\"prompt\":[\"short\",\"");
    for (int i = 0; i < 6000; i++)
        fputs("word ", f);
    fprintf(f, "\"],\"max_tokens\":4}}\n");
    fclose(f);
}

static json_t *body_of(json_t *lines, const char *id)
{
    json_t *l = by_id(lines, id);
    return json_object_get(json_object_get(l, "response"), "body");
}

static const char *text_at(json_t *body, size_t i)
{
    return json_string_value(json_object_get(json_array_get(json_object_get(body, "choices"), i), "text"));
}

static long long usage(json_t *body, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(body, "usage"), key));
}

/* Prompt k's choices [k*per, k*per+per) of the list row equal choices [0, per) of the single row. */
static void same_choices(json_t *lines, const char *list_id, const char *single_id, int k, int per)
{
    json_t *lb = body_of(lines, list_id), *sb = body_of(lines, single_id);
    CHECK(lb && sb, "%s or %s has no answer line", list_id, single_id);
    if (!lb || !sb)
        return;
    for (int c = 0; c < per; c++) {
        const char *a = text_at(lb, (size_t)(k * per + c)), *b = text_at(sb, (size_t)c);
        CHECK(a && b && !strcmp(a, b), "%s choice %d (prompt %d) is \"%s\", but %s alone answers \"%s\"", list_id,
              k * per + c, k, a ? a : "(none)", single_id, b ? b : "(none)");
    }
}

int main(void)
{
    if (!mkdtemp(tmp))
        return 1;
    char in[600], out[600], p[700];
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    write_input(in);
    CHECK(sh("%s run %s %s -o %s --quiet > %s/run.log 2>&1", bin(), MODEL, in, out, tmp) == 0,
          "spill run on prompt lists failed (see %s/run.log)", tmp);
    snprintf(p, sizeof p, "%s/results.jsonl", out);
    int bad = 0;
    json_t *lines = read_lines_n(p, &bad);
    CHECK(bad == 0, "results.jsonl has %d lines that are not JSON", bad);
    /* one line per row: 4 lists + 8 singles answered, the long list failed */
    CHECK(json_array_size(lines) == 12, "results.jsonl has %zu lines, want 12", json_array_size(lines));
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l)
    {
        json_t *ch = json_object_get(json_object_get(json_object_get(l, "response"), "body"), "choices");
        size_t j;
        json_t *c;
        json_array_foreach(ch, j, c) CHECK(json_integer_value(json_object_get(c, "index")) == (json_int_t)j,
                                           "%s: choice %zu has index %lld", json_string_value(json_object_get(l, "custom_id")),
                                           j, (long long)json_integer_value(json_object_get(c, "index")));
    }
    json_t *g = body_of(lines, "list-greedy");
    CHECK(json_array_size(json_object_get(g, "choices")) == 6, "list-greedy has %zu choices, want 3 prompts x n 2",
          json_array_size(json_object_get(g, "choices")));
    long long pt = 0, ct = 0;
    for (int k = 0; k < 3; k++) {
        char sid[32];
        snprintf(sid, sizeof sid, "single-%d", k);
        same_choices(lines, "list-greedy", sid, k, 2);
        pt += usage(body_of(lines, sid), "prompt_tokens");
        ct += usage(body_of(lines, sid), "completion_tokens");
    }
    CHECK(usage(g, "prompt_tokens") == pt && usage(g, "completion_tokens") == ct &&
              usage(g, "total_tokens") == pt + ct,
          "list-greedy usage %lld+%lld=%lld, want the prompts' sums %lld+%lld", usage(g, "prompt_tokens"),
          usage(g, "completion_tokens"), usage(g, "total_tokens"), pt, ct);
    /* seeded: the first prompt's streams are the single row's (choices 0 and 1); the others draw their own */
    same_choices(lines, "list-seeded", "seeded-0", 0, 2);
    CHECK(json_array_size(json_object_get(body_of(lines, "list-seeded"), "choices")) == 6,
          "list-seeded does not have 6 choices");
    same_choices(lines, "list-ids", "single-ids-0", 0, 1);
    same_choices(lines, "list-ids", "single-ids-1", 1, 1);
    /* echo: each choice starts with its own prompt */
    json_t *e = body_of(lines, "list-echo");
    for (int k = 0; k < 3; k++) {
        const char *t = text_at(e, (size_t)k);
        CHECK(t && !strncmp(t, P[k], strlen(P[k])), "list-echo choice %d is \"%s\", which does not start with \"%s\"",
              k, t ? t : "(none)", P[k]);
        json_t *lp = json_object_get(json_array_get(json_object_get(e, "choices"), (size_t)k), "logprobs");
        CHECK(json_is_object(lp) && json_array_size(json_object_get(lp, "tokens")) > 6,
              "list-echo choice %d has no echoed log-probs", k);
    }
    json_decref(lines);
    /* the long list: one error line naming the prompt, no answer */
    snprintf(p, sizeof p, "%s/errors.jsonl", out);
    json_t *errs = read_lines(p);
    CHECK(json_array_size(errs) == 1, "errors.jsonl has %zu lines, want 1", json_array_size(errs));
    json_t *el = by_id(errs, "list-long");
    const char *msg = json_string_value(
        json_object_get(json_object_get(json_object_get(json_object_get(el, "response"), "body"), "error"), "message"));
    CHECK(msg && strstr(msg, "body.prompt[1]") && strstr(msg, "context"),
          "list-long's error does not name body.prompt[1] and the context: %s", msg ? msg : "(none)");
    json_decref(errs);
    /* (the echo row is left out: OpenAI gives the first echoed token a null log-prob, which its own Python
     * types do not allow) */
    CHECK(sh("grep -v list-echo %s/results.jsonl > %s/typed.jsonl && .venv/bin/python tools/check_output_schema.py "
             "%s/typed.jsonl %s/errors.jsonl", out, tmp, tmp, out) == 0,
          "the openai types reject a prompt-list line");
    /* a resume of the finished job answers nothing twice */
    CHECK(sh("%s resume %s --quiet > %s/resume.log 2>&1", bin(), out, tmp) == 0, "spill resume failed (%s/resume.log)",
          tmp);
    snprintf(p, sizeof p, "%s/results.jsonl", out);
    lines = read_lines(p);
    CHECK(json_array_size(lines) == 12, "after resume results.jsonl has %zu lines, want 12", json_array_size(lines));
    json_decref(lines);
    sh("rm -rf %s", tmp);
    return test_finish("test_prompt_list");
}
