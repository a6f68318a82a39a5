/*
 * test_toolcall.c — function calling (batch/toolcall.h) against transformers' renders and real templates'
 * own call text.
 *
 * Fixtures (tools/gen_toolcall_fixtures.py → tests/data/toolcall/fixtures.json):
 *   - renders: OpenAI requests with tools / tool_choice / assistant tool_calls (content null, arguments as
 *     JSON text) / tool messages / content parts, rendered by transformers on real templates after vLLM's
 *     request preprocessing; spill's path (request_parse_line → toolcall_rendered_tools +
 *     prompt_template_messages → chat_template_apply) must match byte for byte, raise or fail alike.
 *   - parses: the text each template writes for an assistant turn of calls; the parser must recover the
 *     calls (names, arguments as equal JSON) by the convention it detects from the template.
 * Then hand-written cases of each convention's edges (Mistral v0.3 and v11, Llama's <|python_tag|>, text
 * that is not a call), tool_choice validation, ids, the forced-choice schema, the answer line (checked with
 * the openai types), and one job through the spill binary on the tiny SmolLM2 GGUF (its template has no tool
 * section: tools are accepted and ignored, nothing is parsed; every line validates).
 * Forced choices (required, named): the forced grammar of each convention accepts the templates' own call
 * texts; end to end on tiny models with the Qwen2.5 / Llama 3.2 / Mistral Nemo templates and their marker
 * tokens (tools/gen_tiny_tool_gguf.py, written into the test's directory), greedy and sampled rows all
 * finish tool_calls with arguments valid against the tool's parameters (schema_check.h).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batch/grammar.h"
#include "batch/output.h"
#include "batch/request.h"
#include "batch/toolcall.h"
#include "text/prompt.h"
#include "text/template.h"
#include "cli.h"
#include "schema_check.h"
#include "test.h"

#define FIXTURES "tests/data/toolcall/fixtures.json"

static json_t *fixture_template(json_t *fx, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(fx, "templates"), i, t)
    {
        if (!strcmp(json_string_value(json_object_get(t, "name")), name))
            return t;
    }
    return NULL;
}

/* Every fixture template's convention is the one detected from its text. */
static void test_detect(json_t *fx)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(fx, "templates"), i, t)
    {
        tc_style st = toolcall_style(json_string_value(json_object_get(t, "template")));
        const char *want = json_string_value(json_object_get(t, "style"));
        CHECK(!strcmp(toolcall_style_name(st), want), "%s: detected %s, want %s",
              json_string_value(json_object_get(t, "name")), toolcall_style_name(st), want);
    }
    CHECK(toolcall_style(NULL) == TC_STYLE_NONE, "NULL template");
}

/* A batch line carrying the fixture's request. */
static char *batch_line(json_t *req)
{
    json_t *body = json_pack("{s:s, s:O}", "model", "m", "messages", json_object_get(req, "messages"));
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    if (!json_is_null(tools))
        json_object_set(body, "tools", tools);
    if (!json_is_null(choice))
        json_object_set(body, "tool_choice", choice);
    json_t *line = json_pack("{s:s, s:s, s:s, s:o}", "custom_id", "r", "method", "POST", "url",
                             "/v1/chat/completions", "body", body);
    char *s = json_dumps(line, JSON_COMPACT);
    json_decref(line);
    return s;
}

static void test_renders(json_t *fx)
{
    time_t now = (time_t)json_integer_value(json_object_get(fx, "now"));
    size_t i, ok = 0;
    json_t *c;
    json_array_foreach(json_object_get(fx, "renders"), i, c)
    {
        const char *tname = json_string_value(json_object_get(c, "template"));
        json_t *t = fixture_template(fx, tname);
        char what[200], err[1024] = "";
        snprintf(what, sizeof what, "%s / %s", tname, json_string_value(json_object_get(c, "id")));
        char *line = batch_line(json_object_get(c, "request"));
        request q;
        int prc = request_parse_line(line, strlen(line), 1, "fx", &q, err, sizeof err);
        CHECK(prc == 0, "%s: the request does not parse: %s", what, err);
        tmpl_t *tm = NULL;
        const char *src = json_string_value(json_object_get(t, "template"));
        CHECK(template_compile(src, strlen(src), "chat template", &tm, err, sizeof err) == 0, "%s: %s", what, err);
        if (prc == 0 && tm) {
            bool oom;
            json_t *tools = toolcall_rendered_tools(q.tools, q.tool_choice, q.tool_choice_name, &oom);
            json_t *msgs = prompt_template_messages(q.messages), *extra = json_object();
            const char *k;
            json_t *v;
            json_object_foreach(json_object_get(t, "extra"), k, v)
            {
                if (!json_is_null(v))
                    json_object_set(extra, k, v);
            }
            char *out = NULL;
            size_t outlen = 0;
            int rc = chat_template_apply(tm, msgs, tools, extra, true, now, &out, &outlen, err, sizeof err);
            json_t *exp = json_object_get(c, "expect"), *raise = json_object_get(c, "raise");
            bool good = exp ? rc == 0 && outlen == json_string_length(exp) && !memcmp(out, json_string_value(exp), outlen)
                        : raise ? rc == TEMPLATE_ERR_RAISED && !strcmp(err, json_string_value(raise))
                                : rc != 0;
            CHECK(good, "%s: rc %d err '%s'\n got: %.300s\nwant: %.300s", what, rc, err, rc == 0 ? out : "",
                  exp ? json_string_value(exp) : raise ? json_string_value(raise) : "(an error)");
            ok += good;
            free(out);
            json_decref(tools), json_decref(msgs), json_decref(extra);
        }
        template_free(tm);
        request_free(&q);
        free(line);
    }
    fprintf(stderr, "renders: %zu/%zu match transformers\n", ok, json_array_size(json_object_get(fx, "renders")));
}

/* The tools of the fixtures' "auto" request (get_weather, add). */
static json_t *fixture_tools(json_t *fx)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(fx, "renders"), i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "id")), "auto"))
            return json_object_get(json_object_get(c, "request"), "tools");
    }
    return NULL;
}

static void test_parses(json_t *fx)
{
    json_t *tools = fixture_tools(fx);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(fx, "parses"), i, c)
    {
        const char *tname = json_string_value(json_object_get(c, "template"));
        json_t *t = fixture_template(fx, tname);
        tc_style st = toolcall_style(json_string_value(json_object_get(t, "template")));
        const char *text = json_string_value(json_object_get(c, "text"));
        char what[200];
        snprintf(what, sizeof what, "%s / %s", tname, json_string_value(json_object_get(c, "id")));
        tc_parsed p;
        int rc = toolcall_parse(st, text, strlen(text), tools, true, &p);
        json_t *want = json_object_get(c, "calls");
        CHECK(rc == 1 && p.n == json_array_size(want), "%s: rc %d, %zu calls (want %zu) in %s", what, rc, p.n,
              json_array_size(want), text);
        for (size_t k = 0; rc == 1 && k < p.n && k < json_array_size(want); k++) {
            json_t *w = json_array_get(want, k);
            json_t *args = json_loads(p.calls[k].arguments, 0, NULL);
            CHECK(!strcmp(p.calls[k].name, json_string_value(json_object_get(w, "name"))) &&
                      json_equal(args, json_object_get(w, "arguments")),
                  "%s: call %zu is %s(%s)", what, k, p.calls[k].name, p.calls[k].arguments);
            json_decref(args);
        }
        /* content: what the template kept of the turn's text (Qwen3 also keeps its empty think block) */
        const char *wc = json_string_value(json_object_get(c, "content"));
        if (rc == 1 && wc && strstr(text, wc))
            CHECK(p.content && strstr(p.content, wc), "%s: content '%s', want it to hold '%s'", what,
                  p.content ? p.content : "(null)", wc);
        else if (rc == 1 && st != TC_STYLE_HERMES)
            CHECK(!p.content, "%s: content '%s', want null", what, p.content);
        toolcall_parsed_free(&p);
    }
    fprintf(stderr, "parses: %zu real-template call texts\n", json_array_size(json_object_get(fx, "parses")));
}

/* One hand-written case: want_calls < 0 means "not a call" (rc 0). */
static void parse_case(tc_style st, const char *text, json_t *tools, bool parallel, int want_calls,
                       const char *first_name, const char *first_args, const char *content)
{
    tc_parsed p;
    int rc = toolcall_parse(st, text, strlen(text), tools, parallel, &p);
    if (want_calls < 0) {
        CHECK(rc == 0 && p.n == 0 && !p.content, "%s: '%s' parsed as %zu calls (rc %d)", toolcall_style_name(st),
              text, p.n, rc);
        return;
    }
    CHECK(rc == 1 && (int)p.n == want_calls, "%s: '%s': rc %d, %zu calls, want %d", toolcall_style_name(st), text, rc,
          p.n, want_calls);
    if (rc == 1 && p.n) {
        CHECK(!strcmp(p.calls[0].name, first_name) && !strcmp(p.calls[0].arguments, first_args),
              "%s: '%s': first call %s %s", toolcall_style_name(st), text, p.calls[0].name, p.calls[0].arguments);
        CHECK(content ? p.content && !strcmp(p.content, content) : !p.content, "%s: '%s': content '%s' want '%s'",
              toolcall_style_name(st), text, p.content ? p.content : "(null)", content ? content : "(null)");
    }
    toolcall_parsed_free(&p);
}

static void test_edges(json_t *tools)
{
    const tc_style H = TC_STYLE_HERMES, L = TC_STYLE_LLAMA3, M = TC_STYLE_MISTRAL;
    /* Hermes / Qwen */
    parse_case(H, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", tools, true, 1,
               "add", "{\"a\":1,\"b\":2}", NULL);
    parse_case(H, "Sure.\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>\n<tool_call>"
                  "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Bern\"}}</tool_call> done",
               tools, true, 2, "add", "{\"a\":1}", "Sure.\n\n done");
    parse_case(H, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call><tool_call>{\"name\":\"add\","
                  "\"arguments\":{\"a\":2}}</tool_call>",
               tools, false, 1, "add", "{\"a\":1}", NULL); /* parallel_tool_calls false: the first call */
    parse_case(H, "<tool_call>{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": 3}\"}", tools, true, 1, "add",
               "{\"a\":3}", NULL); /* arguments as JSON text; unclosed at the very end */
    parse_case(H, "<tool_call>{\"name\":\"add\"}</tool_call>", tools, true, 1, "add", "{}", NULL);
    parse_case(H, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}} trailing</tool_call>", tools, true, -1, 0,
               0, 0);
    parse_case(H, "<tool_call>{\"name\":\"rm_rf\",\"arguments\":{}}</tool_call>", tools, true, -1, 0, 0, 0);
    parse_case(H, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1</tool_call>", tools, true, -1, 0, 0, 0);
    parse_case(H, "<tool_call>{\"name\":\"add\",\"arguments\":[1]}</tool_call>", tools, true, -1, 0, 0, 0);
    parse_case(H, "no calls here", tools, true, -1, 0, 0, 0);
    parse_case(H, "<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>", NULL, true, -1, 0, 0, 0);
    parse_case(TC_STYLE_NONE, "<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>", tools, true, -1, 0, 0, 0);
    /* Llama 3.x */
    parse_case(L, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\"}} ", tools, true, 1,
               "get_weather", "{\"city\":\"Zürich\"}", NULL);
    parse_case(L, "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}; {\"name\": \"add\", \"parameters\": "
                  "{\"a\": 2}}",
               tools, true, 2, "add", "{\"a\":1}", NULL);
    parse_case(L, "Checking.<|python_tag|>{\"name\": \"add\", \"arguments\": {\"a\": 1}}", tools, true, 1, "add",
               "{\"a\":1}", "Checking.");
    parse_case(L, "The answer is {\"name\": \"add\", \"parameters\": {}}", tools, true, -1, 0, 0, 0);
    parse_case(L, "{\"name\": \"Bob\", \"age\": 3}", tools, true, -1, 0, 0, 0); /* JSON, not one of the tools */
    parse_case(L, "<|python_tag|>brave_search.call(query=\"x\")", tools, true, -1, 0, 0, 0);
    /* Mistral: v0.3 (a space after the marker), Nemo, v11 */
    parse_case(M, "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]", tools, true, 1, "add",
               "{\"a\":1,\"b\":2}", NULL);
    parse_case(M, "Let me see. [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}, \"id\": \"abcdefghi\"}, "
                  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
               tools, true, 2, "add", "{\"a\":1}", "Let me see.");
    parse_case(M, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}", tools, true, 1, "get_weather",
               "{\"city\":\"Oslo\"}", NULL);
    parse_case(M, "[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]add[CALL_ID]x1y2z3a4b[ARGS]{\"a\": 2}", tools, true, 2,
               "add", "{\"a\":1}", NULL);
    parse_case(M, "[TOOL_CALLS]add[ARGS]{\"a\": 1} and more", tools, true, -1, 0, 0, 0);
    parse_case(M, "[TOOL_CALLS][]", tools, true, -1, 0, 0, 0);
    parse_case(M, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {}}] tail", tools, true, -1, 0, 0, 0);
    parse_case(M, "plain answer", tools, true, -1, 0, 0, 0);
}

/* body.tool_choice and parallel_tool_calls as request.c reads them. */
static void test_request(void)
{
    static const char tools[] = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]";
    struct {
        const char *body, *param; /* param NULL: the line parses */
        tc_choice choice;
    } cases[] = {
        {"%s", NULL, TC_CHOICE_AUTO},
        {"%s,\"tool_choice\":\"auto\"", NULL, TC_CHOICE_AUTO},
        {"%s,\"tool_choice\":\"none\"", NULL, TC_CHOICE_NONE},
        {"%s,\"tool_choice\":\"required\"", NULL, TC_CHOICE_REQUIRED},
        {"%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", NULL, TC_CHOICE_NAMED},
        {"%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"sub\"}}",
         "body.tool_choice.function.name", 0},
        {"%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"add\"},\"x\":1}", "body.tool_choice.x",
         0},
        {"%s,\"tool_choice\":{\"type\":\"function\"}", "body.tool_choice", 0},
        {"%s,\"tool_choice\":\"always\"", "body.tool_choice", 0},
        {"\"n\":1,\"tool_choice\":\"required\"", "body.tool_choice", 0},
        {"\"n\":1,\"tool_choice\":\"none\"", NULL, TC_CHOICE_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512], line[1024], err[512] = "";
        snprintf(body, sizeof body, cases[i].body, tools);
        snprintf(line, sizeof line,
                 "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
                 "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}}",
                 body);
        request q;
        int rc = request_parse_line(line, strlen(line), 1, "in.jsonl", &q, err, sizeof err);
        if (!cases[i].param) {
            CHECK(rc == 0 && q.tool_choice == cases[i].choice && q.parallel_tool_calls,
                  "case %zu: rc %d choice %d: %s", i, rc, (int)q.tool_choice, err);
            if (cases[i].choice == TC_CHOICE_NAMED)
                CHECK(q.tool_choice_name && !strcmp(q.tool_choice_name, "add"), "case %zu: name", i);
        } else
            CHECK(rc == -1 && !strcmp(q.err_param, cases[i].param) && !q.err_file_level && strstr(err, "in.jsonl line 1"),
                  "case %zu: rc %d param '%s' (want '%s'): %s", i, rc, q.err_param, cases[i].param, err);
        request_free(&q);
    }
    const char *pl = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                     "\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"parallel_tool_calls\":false}}";
    request q;
    char err[256];
    CHECK(request_parse_line(pl, strlen(pl), 1, "x", &q, err, sizeof err) == 0 && !q.parallel_tool_calls,
          "parallel_tool_calls false: %s", err);
    request_free(&q);
}

static void test_messages(void)
{
    json_t *m = json_loads(
        "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": 1}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":"
        "{\"name\":\"add\",\"arguments\":\"not json\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"1\"}]",
        0, NULL);
    json_t *t = prompt_template_messages(m);
    json_t *want = json_loads(
        "[{\"role\":\"user\",\"content\":\"a\\nb\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":"
        "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":{\"a\":1}}},{\"id\":\"c2\",\"type\":"
        "\"function\",\"function\":{\"name\":\"add\",\"arguments\":\"not json\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"c1\",\"content\":\"1\"}]",
        0, NULL);
    char *got = json_dumps(t, JSON_COMPACT);
    CHECK(json_equal(t, want), "template messages: %s", got);
    free(got);
    /* the request's own messages are left as they were */
    CHECK(json_is_array(json_object_get(json_array_get(m, 0), "content")) &&
              json_is_string(json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(m, 1),
                                                                                             "tool_calls"),
                                                                             0),
                                                              "function"),
                                              "arguments")),
          "prompt_template_messages changed its input");
    json_decref(m), json_decref(t), json_decref(want);
}

static void test_ids_and_schema(json_t *tools)
{
    char a[TC_ID_LEN], b[TC_ID_LEN], c[TC_ID_LEN];
    toolcall_id("row-1", 0, 0, a);
    toolcall_id("row-1", 0, 0, b);
    toolcall_id("row-1", 0, 1, c);
    bool alnum = strlen(a) == 29 && !strncmp(a, "call_", 5);
    for (int i = 5; alnum && i < 29; i++)
        alnum = (a[i] >= 'a' && a[i] <= 'z') || (a[i] >= 'A' && a[i] <= 'Z') || (a[i] >= '0' && a[i] <= '9');
    CHECK(alnum && !strcmp(a, b) && strcmp(a, c), "ids %s %s %s", a, b, c);

    const char *prefix, *suffix;
    CHECK(!toolcall_forced_schema(TC_STYLE_HERMES, tools, TC_CHOICE_AUTO, true, &prefix, &suffix),
          "auto has no forced schema");
    bool oom;
    json_t *named = toolcall_rendered_tools(tools, TC_CHOICE_NAMED, "add", &oom);
    CHECK(json_array_size(named) == 1, "named: %zu tools rendered", json_array_size(named));
    json_t *s = toolcall_forced_schema(TC_STYLE_HERMES, named, TC_CHOICE_NAMED, true, &prefix, &suffix);
    CHECK(s && !strcmp(prefix, "<tool_call>\n") && !strcmp(suffix, "\n</tool_call>") &&
              !strcmp(json_string_value(json_object_get(
                          json_object_get(json_object_get(s, "properties"), "name"), "const")),
                      "add") &&
              json_object_get(json_object_get(s, "properties"), "arguments"),
          "named schema");
    json_decref(s);
    s = toolcall_forced_schema(TC_STYLE_LLAMA3, tools, TC_CHOICE_REQUIRED, true, &prefix, &suffix);
    CHECK(s && json_array_size(json_object_get(s, "anyOf")) == 2 && !strcmp(prefix, "") && !strcmp(suffix, ""),
          "required schema");
    CHECK(json_object_get(json_object_get(json_array_get(json_object_get(s, "anyOf"), 0), "properties"), "parameters"),
          "llama's schema names parameters");
    json_decref(s);
    s = toolcall_forced_schema(TC_STYLE_MISTRAL, named, TC_CHOICE_NAMED, false, &prefix, &suffix);
    CHECK(s && !strcmp(prefix, "[TOOL_CALLS]") && !strcmp(json_string_value(json_object_get(s, "type")), "array") &&
              json_integer_value(json_object_get(s, "maxItems")) == 1,
          "mistral's schema is a list of calls, one without parallel_tool_calls");
    json_decref(s), json_decref(named);
    CHECK(!toolcall_rendered_tools(tools, TC_CHOICE_NONE, NULL, &oom) && !oom, "none renders no tools");
}

/* The forced grammar (required, and named for the call's own tool) of each convention accepts the real
 * template's text of one call (tests/data/toolcall/fixtures.json's parses; Qwen3's empty thought before it
 * dropped: a forced answer starts with the call; nested_args skipped: its keys are outside the tool's
 * parameters, which the grammar never writes) whole and closed, and refuses a call of another tool, an extra
 * key, a second call where one is allowed. */
static void test_forced_grammar(json_t *fx)
{
    json_t *tools = fixture_tools(fx);
    size_t i, n_ok = 0;
    json_t *c;
    json_array_foreach(json_object_get(fx, "parses"), i, c)
    {
        json_t *t = fixture_template(fx, json_string_value(json_object_get(c, "template")));
        tc_style st = toolcall_style(json_string_value(json_object_get(t, "template")));
        json_t *calls = json_object_get(c, "calls");
        const char *text = json_string_value(json_object_get(c, "text"));
        if (st == TC_STYLE_NONE || json_array_size(calls) != 1 || !json_is_null(json_object_get(c, "content")) ||
            !strcmp(json_string_value(json_object_get(c, "id")), "nested_args")) /* keys outside the tool's schema */
            continue;
        const char *think = strstr(text, "</think>\n\n");
        if (!strncmp(text, "<think>", 7) && think)
            text = think + strlen("</think>\n\n");
        const char *name = json_string_value(json_object_get(json_array_get(calls, 0), "name"));
        for (int named = 0; named < 2; named++) {
            bool oom;
            json_t *shown = toolcall_rendered_tools(tools, named ? TC_CHOICE_NAMED : TC_CHOICE_REQUIRED, name, &oom);
            grammar_wrap gw = {NULL, NULL, toolcall_markers(st)};
            json_t *schema = toolcall_forced_schema(st, shown, named ? TC_CHOICE_NAMED : TC_CHOICE_REQUIRED, false,
                                                    &gw.prefix, &gw.suffix);
            grammar *g = NULL;
            char err[512];
            CHECK(schema && grammar_compile_wrapped(schema, &gw, "forced", &g, NULL, 0, err, sizeof err) == 0,
                  "%s: the forced grammar does not compile: %s", json_string_value(json_object_get(c, "id")), err);
            if (g) {
                gstate s;
                gstate_init(g, &s);
                int rc = gstate_feed_bytes(g, &s, (const uint8_t *)text, strlen(text));
                CHECK(rc == 0 && gstate_done(&s) && gstate_can_end(g, &s), "%s / %s (%s): the call's own text is not "
                      "a whole forced answer: %s", json_string_value(json_object_get(c, "template")),
                      json_string_value(json_object_get(c, "id")), named ? "named" : "required", text);
                n_ok += rc == 0 && gstate_done(&s);
                /* the prefix alone is not an answer; the call of another tool or a second call is refused */
                gstate_init(g, &s);
                CHECK(!gstate_can_end(g, &s), "an empty forced answer can end");
                char other[512];
                const char *at = strstr(text, name);
                if (named && at && (size_t)(at - text) + 40 < sizeof other) {
                    snprintf(other, sizeof other, "%.*sXX%s", (int)(at - text), text, at);
                    gstate_init(g, &s);
                    CHECK(gstate_feed_bytes(g, &s, (const uint8_t *)other, strlen(other)) != 0,
                          "a call of another tool is accepted: %s", other);
                }
                const char *argk = strstr(text, st == TC_STYLE_LLAMA3 ? "\"parameters\"" : "\"arguments\"");
                if (argk && (size_t)(argk - text) + 40 < sizeof other) {
                    snprintf(other, sizeof other, "%.*s\"x\": 1, %s", (int)(argk - text), text, argk);
                    gstate_init(g, &s);
                    CHECK(gstate_feed_bytes(g, &s, (const uint8_t *)other, strlen(other)) != 0,
                          "an extra key is accepted: %s", other);
                }
                if (st == TC_STYLE_MISTRAL) { /* parallel_tool_calls false: one call in the list */
                    snprintf(other, sizeof other, "%.*s, %s", (int)(strlen(text) - 1), text, text + strlen("[TOOL_CALLS]["));
                    gstate_init(g, &s);
                    CHECK(gstate_feed_bytes(g, &s, (const uint8_t *)other, strlen(other)) != 0,
                          "a second call is accepted without parallel_tool_calls: %s", other);
                }
            }
            grammar_free(g);
            json_decref(schema), json_decref(shown);
        }
    }
    CHECK(n_ok >= 12, "only %zu fixture calls checked against the forced grammars", n_ok);
    fprintf(stderr, "forced grammars: %zu fixture calls accepted whole\n", n_ok);
}

/* The answer line of a choice that made calls: content null, tool_calls, finish_reason tool_calls. */
static void test_output(const char *dir)
{
    out_tool_call calls[2] = {{"call_AAAAAAAAAAAAAAAAAAAAAAAA", "get_weather", "{\"city\":\"Zürich\"}"},
                              {"call_BBBBBBBBBBBBBBBBBBBBBBBB", "add", "{\"a\":1}"}};
    out_choice ch[2] = {{.text = "", .len = 0, .finish = OUT_FINISH_TOOL_CALLS, .n_tool_calls = 2, .tool_calls = calls},
                        {.text = "Let me check.", .len = 13, .finish = OUT_FINISH_TOOL_CALLS, .n_tool_calls = 1,
                         .tool_calls = calls + 1}};
    out_result r = {.custom_id = "t1", .model = "m", .created = 1, .n_choices = 2, .choices = ch};
    char *line, err[256];
    size_t len;
    CHECK(output_chat_line(&r, NULL, &line, &len, err, sizeof err) == 0, "%s", err);
    json_t *o = json_loads(line, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(json_object_get(json_object_get(o, "response"), "body"), "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    CHECK(json_is_null(json_object_get(msg, "content")) &&
              !strcmp(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls") &&
              json_array_size(json_object_get(msg, "tool_calls")) == 2,
          "line: %s", line);
    json_t *tc = json_array_get(json_object_get(msg, "tool_calls"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(tc, "type")), "function") &&
              !strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")),
                      "{\"city\":\"Zürich\"}"),
          "tool call: %s", line);
    char path[600];
    snprintf(path, sizeof path, "%s/lines.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%s\n", line);
        fclose(f);
    }
    CHECK(sh(".venv/bin/python tools/check_output_schema.py %s", path) == 0, "tool-call line fails the openai types");
    json_decref(o);
    free(line);
    out_choice bad = {.text = "", .n_tool_calls = 1, .tool_calls = NULL};
    r.choices = &bad, r.n_choices = 1;
    CHECK(output_chat_line(&r, NULL, &line, &len, err, sizeof err) == -1, "a call count without calls");
    CHECK(output_completion_line(&(out_result){.custom_id = "c", .model = "m", .n_choices = 1, .choices = ch}, NULL,
                                 &line, &len, err, sizeof err) == -1,
          "tool calls in a completions answer");
}

/* One job through the binary on the tiny SmolLM2: tools, every tool_choice, a history of calls, content
 * parts, a fine-tuning line ending with its reference answer; bad choices fail alone with their param. */
static void test_binary(const char *dir)
{
    char in[600], out[600];
    snprintf(in, sizeof in, "%s/in.jsonl", dir);
    snprintf(out, sizeof out, "%s/job", dir);
    FILE *f = fopen(in, "w");
    if (!f) {
        CHECK(0, "cannot write %s", in);
        return;
    }
    const char *T = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";
    const char *U = "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]";
    const char *H = "\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":"
                    "null,\"tool_calls\":[{\"id\":\"call12345\",\"type\":\"function\",\"function\":{\"name\":"
                    "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
                    "\"tool_call_id\":\"call12345\",\"content\":\"sunny\"}]";
    const char *P = "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello\"},{\"type\":"
                    "\"text\",\"text\":\"there\"}]}]";
    const char *rows[][2] = {
        {"auto", ""}, {"none", ",\"tool_choice\":\"none\""}, {"required", ",\"tool_choice\":\"required\""},
        {"named", ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}"},
        {"bad_named", ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        fprintf(f,
                "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
                "\"x\",%s,%s%s,\"max_tokens\":4}}\n",
                rows[i][0], U, T, rows[i][1]);
    fprintf(f, "{\"custom_id\":\"history\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
               "\"x\",%s,%s,\"max_tokens\":4}}\n", H, T);
    fprintf(f, "{\"custom_id\":\"parts\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
               "\"x\",%s,\"max_tokens\":4}}\n", P);
    fprintf(f, "{\"custom_id\":\"ft_prompt\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
               "\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4}}\n");
    fprintf(f, "{\"custom_id\":\"ft\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
               "\"content\":\"Hello!\"}]}\n");
    fclose(f);
    CHECK(sh("%s run tests/data/tiny/tiny-smollm2.gguf %s -o %s --quiet --batch 8 >/dev/null 2>&1", bin(), in, out) == 0,
          "the tool-call job failed");
    char res[700], errs[700];
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    snprintf(errs, sizeof errs, "%s/errors.jsonl", out);
    json_t *ok = read_lines(res), *bad = read_lines(errs);
    CHECK(json_array_size(ok) == 8 && json_array_size(bad) == 1, "%zu results, %zu errors (want 8, 1)",
          json_array_size(ok), json_array_size(bad));
    json_t *b = json_object_get(json_object_get(json_object_get(json_array_get(bad, 0), "response"), "body"), "error");
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(bad, 0), "custom_id")) ?: "", "bad_named") &&
              !strcmp(json_string_value(json_object_get(b, "param")) ?: "", "body.tool_choice.function.name"),
          "the bad named choice: %s", json_dumps(b, JSON_COMPACT));
    const char *ids[] = {"auto", "none", "required", "named", "history", "parts", "ft"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        json_t *l = by_id(ok, ids[i]);
        CHECK(l && chat_answer(l), "%s: no text answer", ids[i]);
    }
    /* a fine-tuning line's final assistant turn is its reference: the prompt is the turns before it */
    json_int_t pt[2];
    for (int i = 0; i < 2; i++)
        pt[i] = json_integer_value(json_object_get(
            json_object_get(json_object_get(json_object_get(by_id(ok, i ? "ft" : "ft_prompt"), "response"), "body"),
                            "usage"),
            "prompt_tokens"));
    CHECK(pt[0] > 0 && pt[0] == pt[1], "fine-tuning line: %lld prompt tokens, the user turn alone %lld",
          (long long)pt[1], (long long)pt[0]);
    CHECK(sh(".venv/bin/python tools/check_output_schema.py %s %s", res, errs) == 0,
          "the job's lines fail the openai types");
    json_decref(ok), json_decref(bad);
}

/* The tools of the forced rows: strings bounded, so a random-weight model closes its call well within
 * max_tokens. */
static const char *FORCED_TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":16},\"unit\":{\"enum\":[\"celsius\","
    "\"fahrenheit\"]}},\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"add\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-100,"
    "\"maximum\":100},\"b\":{\"type\":\"number\"}},\"required\":[\"a\",\"b\"]}}},{\"type\":\"function\","
    "\"function\":{\"name\":\"noop\"}}]";

/* Every call of a forced choice: names a shown tool (the named one), arguments valid against its parameters
 * (schema_check.h); *n_calls gets the count. */
static bool forced_calls_ok(json_t *tools, const char *want, json_t *msg, size_t *n_calls, char *why, size_t wl)
{
    json_t *calls = json_object_get(msg, "tool_calls");
    *n_calls = json_array_size(calls);
    if (!*n_calls)
        return snprintf(why, wl, "no tool_calls"), false;
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        const char *name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
        const char *args = json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));
        const json_t *params = NULL;
        size_t k;
        json_t *t;
        json_array_foreach(tools, k, t)
        {
            if (name && !strcmp(name, json_string_value(json_object_get(json_object_get(t, "function"), "name"))))
                params = json_object_get(json_object_get(t, "function"), "parameters");
        }
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        const char *r = "not an object";
        bool ok = name && (!want || !strcmp(name, want)) && json_is_object(a) &&
                  (!params || sc_valid(params, params, a, &r));
        json_decref(a);
        if (!ok)
            return snprintf(why, wl, "call %zu (%s %s): %s", i, name ? name : "?", args ? args : "?", r), false;
    }
    return true;
}

/* tool_choice required / named forced end to end on tiny random-weight models that teach each convention
 * (tools/gen_tiny_tool_gguf.py: the real templates, the markers as tokens — Mistral's [TOOL_CALLS] special,
 * Qwen's <tool_call> / </tool_call> added but not special), greedy and sampled: every choice finishes
 * tool_calls with calls of the shown tools whose arguments validate; the marker is one token (the first
 * log-prob entry; Hermes' closing one the last); parallel_tool_calls false keeps Mistral's list to one call;
 * none never calls and auto is not forced (both answer as text); every line passes the openai types. */
static void test_forced_binary(const char *dir)
{
    static const char *const styles[] = {"hermes", "llama3", "mistral"};
    json_t *tools = json_loads(FORCED_TOOLS, 0, NULL);
    for (size_t si = 0; si < 3; si++) {
        const char *st = styles[si];
        char model[600], in[600], out[600], res[700], errs[700];
        snprintf(model, sizeof model, "%s/tiny-%s.gguf", dir, st);
        snprintf(in, sizeof in, "%s/forced-%s.jsonl", dir, st);
        snprintf(out, sizeof out, "%s/forced-%s", dir, st);
        int grc = sh(".venv/bin/python tools/gen_tiny_tool_gguf.py %s %s >%s/gen.log 2>&1", st, model, dir);
        CHECK(grc == 0, "tools/gen_tiny_tool_gguf.py %s failed (see %s/gen.log)", st, dir);
        FILE *f = grc == 0 ? fopen(in, "w") : NULL;
        if (!f)
            continue;
        const char *named = ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"add\"}}";
        const char *rows[][2] = {
            {"req_greedy", ",\"tool_choice\":\"required\",\"temperature\":0,\"logprobs\":true"},
            {"req_sampled", ",\"tool_choice\":\"required\",\"temperature\":1,\"seed\":5,\"n\":4"},
            {"named_greedy", ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
                             "\"temperature\":0,\"logprobs\":true"},
            {"named_sampled", ",\"temperature\":1.3,\"seed\":9,\"n\":3"},
            {"one_call", ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"temperature\":1,\"seed\":2,"
                         "\"n\":3"},
            {"none", ",\"tool_choice\":\"none\",\"temperature\":1,\"seed\":1,\"n\":2"},
            {"auto", ",\"temperature\":0"},
        };
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            fprintf(f,
                    "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
                    "\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris, or 2+3?\"}],"
                    "\"tools\":%s%s%s,\"max_tokens\":%d}}\n",
                    rows[i][0], FORCED_TOOLS, !strcmp(rows[i][0], "named_sampled") ? named : "", rows[i][1],
                    i < 5 ? 400 : 8);
        fprintf(f, "{\"custom_id\":\"bad_params\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{"
                   "\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[{\"type\":"
                   "\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"g\","
                   "\"parameters\":{\"type\":\"object\",\"not\":{}}}}],\"tool_choice\":\"required\"}}\n");
        fclose(f);
        CHECK(sh("%s run %s %s -o %s --quiet --batch 8 >%s.log 2>&1", bin(), model, in, out, out) == 0,
              "%s: the forced job failed (%s.log)", st, out);
        snprintf(res, sizeof res, "%s/results.jsonl", out);
        snprintf(errs, sizeof errs, "%s/errors.jsonl", out);
        json_t *ok = read_lines(res), *bad = read_lines(errs);
        CHECK(json_array_size(ok) == 7, "%s: %zu results (want 7)", st, json_array_size(ok));
        const char *bm = json_string_value(json_object_get(
            json_object_get(json_object_get(json_object_get(json_array_get(bad, 0), "response"), "body"), "error"),
            "message"));
        CHECK(json_array_size(bad) == 1 && bm && strstr(bm, "body.tools[1].function.parameters.not"),
              "%s: a forced call of a tool whose parameters cannot be enforced: %s", st, bm ? bm : "no error line");
        for (size_t i = 0; i < 5; i++) {
            json_t *ch = json_object_get(json_object_get(json_object_get(by_id(ok, rows[i][0]), "response"), "body"),
                                         "choices");
            size_t k;
            json_t *c;
            CHECK(json_array_size(ch) >= 1, "%s / %s: no choices", st, rows[i][0]);
            json_array_foreach(ch, k, c)
            {
                char why[600] = "";
                size_t n_calls = 0;
                const char *want = !strncmp(rows[i][0], "named_greedy", 12) ? "get_weather"
                                   : !strncmp(rows[i][0], "named", 5)       ? "add"
                                                                            : NULL;
                const char *fin = json_string_value(json_object_get(c, "finish_reason"));
                bool good = fin && !strcmp(fin, "tool_calls") &&
                            forced_calls_ok(tools, want, json_object_get(c, "message"), &n_calls, why, sizeof why);
                CHECK(good, "%s / %s choice %zu: finish %s, %s", st, rows[i][0], k, fin ? fin : "?", why);
                CHECK(!good || n_calls == 1 || (!strcmp(st, "mistral") && strcmp(rows[i][0], "one_call")),
                      "%s / %s choice %zu: %zu calls, want 1", st, rows[i][0], k, n_calls);
            }
            json_t *lp = json_object_get(json_object_get(json_array_get(ch, 0), "logprobs"), "content");
            if (json_array_size(lp) && strcmp(st, "llama3")) {
                const char *first = json_string_value(json_object_get(json_array_get(lp, 0), "token"));
                const char *last = json_string_value(json_object_get(json_array_get(lp, json_array_size(lp) - 1), "token"));
                const char *want = !strcmp(st, "hermes") ? "<tool_call>" : "[TOOL_CALLS]";
                CHECK(first && !strcmp(first, want), "%s / %s: the first token is '%s', want the marker %s", st,
                      rows[i][0], first ? first : "?", want);
                CHECK(strcmp(st, "hermes") || (last && !strcmp(last, "</tool_call>")),
                      "%s / %s: the last token is '%s', want </tool_call>", st, rows[i][0], last ? last : "?");
            }
        }
        for (size_t i = 5; i < 7; i++) {
            json_t *ch = json_object_get(json_object_get(json_object_get(by_id(ok, rows[i][0]), "response"), "body"),
                                         "choices");
            size_t k;
            json_t *c;
            json_array_foreach(ch, k, c)
            {
                const char *fin = json_string_value(json_object_get(c, "finish_reason"));
                CHECK(!json_object_get(json_object_get(c, "message"), "tool_calls") && fin && strcmp(fin, "tool_calls"),
                      "%s / %s choice %zu: a call (finish %s)", st, rows[i][0], k, fin ? fin : "?");
            }
        }
        CHECK(sh(".venv/bin/python tools/check_output_schema.py %s %s >%s.check 2>&1", res, errs, out) == 0,
              "%s: the forced job's lines fail the openai types (%s.check)", st, out);
        json_decref(ok), json_decref(bad);
    }
    json_decref(tools);
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    tzset();
    json_error_t je;
    json_t *fx = json_load_file(FIXTURES, 0, &je);
    CHECK(fx != NULL, "cannot load %s: %s; run tools/gen_toolcall_fixtures.py", FIXTURES, je.text);
    char dir[] = "/tmp/spill_toolcall_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    if (fx) {
        test_detect(fx);
        test_renders(fx);
        test_parses(fx);
        test_edges(fixture_tools(fx));
        test_ids_and_schema(fixture_tools(fx));
        test_forced_grammar(fx);
    }
    test_request();
    test_messages();
    test_output(dir);
    test_binary(dir);
    test_forced_binary(dir);
    json_decref(fx);
    sh("rm -rf %s", dir);
    return test_finish("test_toolcall");
}
