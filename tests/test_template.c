/*
 * test_template.c — the chat-template interpreter against jinja2/transformers.
 *
 * Fixtures (tools/gen_template_fixtures.py, real transformers render path, strftime_now pinned
 * to the fixture's `now` in UTC):
 *   tests/data/tmpl/chat.json      real model templates x conversations
 *   tests/data/tmpl/features.json  one small template per Jinja feature
 *   tests/data/tmpl/dos.json       adversarial templates
 *
 * Expectations, fixed before looking at results:
 *   - "expect": rendering succeeds and is byte-identical (no tolerance: a prompt that differs by
 *     one byte tokenizes differently);
 *   - "raise":  TEMPLATE_ERR_RAISED and err equals the template's message exactly;
 *   - "error":  rc == -1 with a non-empty sentence that starts with the template name (messages
 *     are spill's own, jinja2's exception text is not compared);
 *   - DoS cases: every one fails with rc != 0 under the default limits (no timing assertions);
 *   - each template built into the binary is byte-identical to its chat.json "builtin:NAME" row.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/templates.h"
#include "text/template.h"
#include "test.h"
#include "base/util.h"

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    CHECK(j != NULL, "cannot load %s: %s (line %d); run tools/gen_template_fixtures.py", path, je.text, je.line);
    return j;
}

/* Where two buffers first differ, for readable failures. */
static size_t first_diff(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t i = 0;
    while (i < alen && i < blen && a[i] == b[i])
        i++;
    return i;
}

static void check_outcome(const char *what, int rc, const char *out, size_t outlen, const char *err, json_t *want,
                          const char *tname)
{
    json_t *exp = json_object_get(want, "expect"), *raise = json_object_get(want, "raise");
    if (exp) {
        const char *e = json_string_value(exp);
        size_t elen = json_string_length(exp);
        CHECK(rc == 0, "%s: expected output, got rc %d: %s", what, rc, err);
        if (rc == 0) {
            size_t d = first_diff(out, outlen, e, elen);
            CHECK(outlen == elen && d == elen,
                  "%s: output differs at byte %zu (got %zu bytes, want %zu)\n got: %.80s\nwant: %.80s", what, d, outlen,
                  elen, out + (d > 20 ? d - 20 : 0), e + (d > 20 ? d - 20 : 0));
        }
    } else if (raise) {
        CHECK(rc == TEMPLATE_ERR_RAISED && !strcmp(err, json_string_value(raise)),
              "%s: expected raise_exception('%s'), got rc %d err '%s'", what, json_string_value(raise), rc, err);
    } else {
        CHECK(rc == -1 && err[0] && !strncmp(err, tname, strlen(tname)),
              "%s: expected an error (%s), got rc %d err '%s' out '%.60s'", what,
              json_string_value(json_object_get(want, "error")), rc, err, rc == 0 ? out : "");
    }
}

/* Context pieces of one template x conversation case. */
static json_t *case_extra(json_t *t, json_t *c)
{
    json_t *extra = json_object();
    const char *k;
    json_t *v;
    /* deep copies: the fixture is shared by the threads of test_threads, and json_object_set
     * would bump reference counts of shared values */
    json_object_foreach(json_object_get(t, "extra"), k, v) if (!json_is_null(v))
        json_object_set_new(extra, k, json_deep_copy(v));
    json_object_foreach(json_object_get(c, "extra"), k, v) json_object_set_new(extra, k, json_deep_copy(v));
    return extra;
}

static json_t *case_tools(json_t *c)
{
    json_t *tools = json_object_get(c, "tools");
    return json_is_null(tools) ? NULL : tools;
}

static void test_chat(json_t *root)
{
    time_t now = (time_t)json_integer_value(json_object_get(root, "now"));
    json_t *convs = json_object_get(root, "conversations"), *templates = json_object_get(root, "templates");
    size_t ti, ci, ok = 0, total = 0;
    json_t *t, *c;
    json_array_foreach(templates, ti, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *src = json_object_get(t, "template"), *results = json_object_get(t, "results");
        char err[SPILL_ERRLEN] = "";
        tmpl_t *tm = NULL;
        CHECK(json_array_size(results) == json_array_size(convs) && json_array_size(convs) >= 40,
              "%s: %zu results for %zu conversations (want >= 40)", name, json_array_size(results),
              json_array_size(convs));
        CHECK(template_compile(json_string_value(src), json_string_length(src), "chat template", &tm, err,
                               sizeof err) == 0,
              "%s: compile: %s", name, err);
        if (!tm)
            continue;
        json_array_foreach(convs, ci, c)
        {
            json_t *extra = case_extra(t, c);
            char *out = NULL, what[160];
            size_t outlen = 0;
            bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
            /* the one-shot entry point for the first conversation, the compiled one for the rest */
            int rc = ci == 0 ? chat_template_render(json_string_value(src), json_string_length(src),
                                                    json_object_get(c, "messages"), case_tools(c), extra, agp, now,
                                                    &out, &outlen, err, sizeof err)
                             : chat_template_apply(tm, json_object_get(c, "messages"), case_tools(c), extra, agp, now,
                                                   &out, &outlen, err, sizeof err);
            snprintf(what, sizeof what, "%s / %s", name, json_string_value(json_object_get(c, "id")));
            int before = test_failures;
            check_outcome(what, rc, out, outlen, err, json_array_get(results, ci), "chat template");
            ok += test_failures == before;
            total++;
            free(out);
            json_decref(extra);
        }
        template_free(tm);
    }
    fprintf(stderr, "chat: %zu/%zu template x conversation renders match\n", ok, total);
}

/* Several threads render every conversation of every template through shared compiled templates. */
typedef struct {
    json_t *root;
    tmpl_t **tm;
    int mismatches;
} thread_job;

static void *render_all(void *arg)
{
    thread_job *j = arg;
    time_t now = (time_t)json_integer_value(json_object_get(j->root, "now"));
    json_t *convs = json_object_get(j->root, "conversations"), *templates = json_object_get(j->root, "templates");
    size_t ti, ci;
    json_t *t, *c;
    json_array_foreach(templates, ti, t)
    {
        json_array_foreach(convs, ci, c)
        {
            json_t *extra = case_extra(t, c),
                   *want = json_object_get(json_array_get(json_object_get(t, "results"), ci), "expect");
            char *out = NULL, err[SPILL_ERRLEN];
            size_t outlen = 0;
            int rc = chat_template_apply(j->tm[ti], json_object_get(c, "messages"), case_tools(c), extra,
                                         json_is_true(json_object_get(c, "add_generation_prompt")), now, &out, &outlen,
                                         err, sizeof err);
            if (want && (rc != 0 || outlen != json_string_length(want) || memcmp(out, json_string_value(want), outlen)))
                j->mismatches++;
            free(out);
            json_decref(extra);
        }
    }
    return NULL;
}

static void test_threads(json_t *root)
{
    json_t *templates = json_object_get(root, "templates"), *t;
    size_t n = json_array_size(templates), i;
    tmpl_t **tm = calloc(n, sizeof *tm);
    char err[SPILL_ERRLEN];
    json_array_foreach(templates, i, t)
    {
        json_t *src = json_object_get(t, "template");
        CHECK(template_compile(json_string_value(src), json_string_length(src), "chat template", &tm[i], err,
                               sizeof err) == 0,
              "compile: %s", err);
    }
    /* jansson objects are only read here (json_object_get/iteration), which is thread-safe */
    enum { NT = 4 };
    pthread_t th[NT];
    thread_job jobs[NT];
    for (int k = 0; k < NT; k++) {
        jobs[k] = (thread_job){root, tm, 0};
        CHECK(pthread_create(&th[k], NULL, render_all, &jobs[k]) == 0, "pthread_create");
    }
    for (int k = 0; k < NT; k++) {
        pthread_join(th[k], NULL);
        CHECK(jobs[k].mismatches == 0, "thread %d: %d renders differ from the fixture", k, jobs[k].mismatches);
    }
    for (i = 0; i < n; i++)
        template_free(tm[i]);
    free(tm);
}

static void test_features(void)
{
    json_t *root = load("tests/data/tmpl/features.json");
    if (!root)
        return;
    tmpl_limits lim;
    template_limits_default(&lim);
    lim.now = (time_t)json_integer_value(json_object_get(root, "now"));
    json_t *ctx = json_object_get(root, "context"), *cases = json_object_get(root, "cases"), *c;
    size_t i, ok = 0;
    json_array_foreach(cases, i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *src = json_object_get(c, "template");
        tmpl_t *t = NULL;
        char *out = NULL, err[SPILL_ERRLEN] = "", what[160];
        size_t outlen = 0;
        int rc = template_compile(json_string_value(src), json_string_length(src), "feature", &t, err, sizeof err);
        if (rc == 0)
            rc = template_render(t, ctx, &lim, &out, &outlen, err, sizeof err);
        snprintf(what, sizeof what, "feature %s", name);
        int before = test_failures;
        check_outcome(what, rc, out, outlen, err, c, "feature");
        ok += test_failures == before;
        free(out);
        template_free(t);
    }
    fprintf(stderr, "features: %zu/%zu match\n", ok, json_array_size(cases));
    json_decref(root);
}

static void test_dos(void)
{
    json_t *root = load("tests/data/tmpl/dos.json");
    if (!root)
        return;
    json_t *cases = json_object_get(root, "cases"), *c, *ctx = json_object();
    size_t i;
    json_array_foreach(cases, i, c)
    {
        json_t *src = json_object_get(c, "template");
        tmpl_t *t = NULL;
        char *out = NULL, err[SPILL_ERRLEN] = "";
        size_t outlen = 0;
        int rc = template_compile(json_string_value(src), json_string_length(src), "dos", &t, err, sizeof err);
        if (rc == 0)
            rc = template_render(t, ctx, NULL, &out, &outlen, err, sizeof err);
        CHECK(rc != 0 && err[0], "dos %s: expected a clean error, got rc %d (%zu bytes)",
              json_string_value(json_object_get(c, "name")), rc, outlen);
        fprintf(stderr, "  dos %-24s -> %.110s\n", json_string_value(json_object_get(c, "name")), err);
        free(out);
        template_free(t);
    }
    json_decref(ctx);
    json_decref(root);
}

/* Renders src against a context given as JSON text; returns rc, fills out/err. */
static int render_str(const char *src, const char *ctx_json, const tmpl_limits *lim, char **out, char *err,
                      size_t errlen)
{
    tmpl_t *t = NULL;
    size_t outlen;
    json_t *ctx = json_loads(ctx_json, 0, NULL);
    *out = NULL;
    int rc = template_compile(src, strlen(src), "chat template", &t, err, errlen);
    if (rc == 0)
        rc = template_render(t, ctx, lim, out, &outlen, err, errlen);
    template_free(t);
    json_decref(ctx);
    return rc;
}

static void test_api(void)
{
    char err[SPILL_ERRLEN], *out;
    tmpl_limits lim;

    /* errors name the template, line and column, and the construct */
    CHECK(render_str("a\nb {{ x|nofilter }}", "{}", NULL, &out, err, sizeof err) == -1, "unknown filter must fail");
    CHECK(strstr(err, "chat template line 2, column 8") && strstr(err, "'nofilter'"), "error sentence: %s", err);
    CHECK(render_str("{% foo %}", "{}", NULL, &out, err, sizeof err) == -1 && strstr(err, "'foo'"), "tag error: %s",
          err);
    CHECK(render_str("x\n  {{ y.z }}", "{}", NULL, &out, err, sizeof err) == -1 && strstr(err, "line 2, column") &&
              strstr(err, "'y' is undefined"),
          "undefined error: %s", err);

    /* raise_exception carries the template's own message verbatim */
    CHECK(render_str("{{ raise_exception('Roles must alternate!') }}", "{}", NULL, &out, err, sizeof err) ==
                  TEMPLATE_ERR_RAISED &&
              !strcmp(err, "Roles must alternate!"),
          "raise: %s", err);

    /* limits: each has its own clear error */
    template_limits_default(&lim);
    lim.max_output = 10;
    CHECK(render_str("{% for i in range(20) %}x{% endfor %}", "{}", &lim, &out, err, sizeof err) == -1 &&
              strstr(err, "output"),
          "output limit: %s", err);
    template_limits_default(&lim);
    lim.max_steps = 1000;
    CHECK(render_str("{% for i in range(5000) %}{% endfor %}", "{}", &lim, &out, err, sizeof err) == -1 &&
              strstr(err, "steps"),
          "step limit: %s", err);
    template_limits_default(&lim);
    lim.max_range = 10;
    CHECK(render_str("{{ range(11)|length }}", "{}", &lim, &out, err, sizeof err) == -1 && strstr(err, "Range too big"),
          "range limit: %s", err);
    template_limits_default(&lim);
    lim.max_memory = 1 << 16;
    CHECK(render_str("{% set ns = namespace(s='x') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     "{}", &lim, &out, err, sizeof err) != 0,
          "memory limit must stop doubling");
    template_limits_default(&lim);
    lim.max_depth = 8;
    CHECK(render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", &lim, &out, err, sizeof err) ==
                  -1 &&
              strstr(err, "macro"),
          "depth limit: %s", err);

    /* namespaces may contain themselves or chain deeply: printing stays bounded, nothing leaks */
    CHECK(render_str("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}", "{}", NULL, &out, err, sizeof err) ==
                  0 &&
              !strcmp(out, "<Namespace {'me': [<Namespace {...}>]}>"),
          "self-containing namespace prints as jinja2 does: %s", out ? out : err);
    free(out);
    /* expected strings from jinja2 3.1 (ImmutableSandboxedEnvironment) */
    CHECK(render_str("{% set ns = namespace(a=1) %}{% set ns.b = [ns, {'k': ns}] %}{{ ns }}|{{ ns.b }}", "{}", NULL,
                     &out, err, sizeof err) == 0 &&
              !strcmp(out, "<Namespace {'a': 1, 'b': [<Namespace {...}>, {'k': <Namespace {...}>}]}>|"
                           "[<Namespace {'a': 1, 'b': [...]}>, {'k': <Namespace {'a': 1, 'b': [...]}>}]"),
          "cycles through lists and dicts: %s", out ? out : err);
    free(out);
    /* a namespace holding itself twice, or a list of itself doubled 60 times, is 2^60 items to print: the
     * walk stops at the output cap (this hung the fuzzer before the guard) */
    template_limits_default(&lim);
    lim.max_output = 1 << 16;
    CHECK(render_str("{% set ns = namespace() %}{% set ns.a = ns %}{% set ns.b = ns %}{{ ns }}", "{}", &lim, &out, err,
                     sizeof err) == 0 &&
              !strcmp(out, "<Namespace {'a': <Namespace {...}>, 'b': <Namespace {...}>}>"),
          "namespace holding itself twice: %s", out ? out : err);
    free(out);
    CHECK(render_str("{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                     "{{ ns.a == ns.a }}{{ ns.a|string|length }}",
                     "{}", &lim, &out, err, sizeof err) != 0,
          "doubled list hits the output cap");
    free(out);
    out = NULL;
    CHECK(render_str("{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                     "{{ ns.a|tojson|length }}",
                     "{}", &lim, &out, err, sizeof err) != 0,
          "doubled list as JSON hits the output cap");
    free(out);
    out = NULL;
    CHECK(render_str(
              "{% set ns = namespace(x=1) %}{% for i in range(20000) %}{% set ns.x = namespace(y=ns.x) %}{% endfor %}"
              "{{ ns.x|string|length > 0 }}",
              "{}", NULL, &out, err, sizeof err) == 0 &&
              !strcmp(out, "True"),
          "namespace chain: %s", err);
    free(out);

    /* a compiled template renders repeatedly with different contexts */
    tmpl_t *t = NULL;
    const char *src = "{% for m in messages %}{{ m.content }}{% endfor %}";
    CHECK(template_compile(src, strlen(src), "chat template", &t, err, sizeof err) == 0, "compile: %s", err);
    for (int k = 0; k < 3 && t; k++) {
        char ctx[80];
        size_t n;
        snprintf(ctx, sizeof ctx, "{\"messages\": [{\"content\": \"m%d\"}]}", k);
        json_t *j = json_loads(ctx, 0, NULL);
        CHECK(template_render(t, j, NULL, &out, &n, err, sizeof err) == 0 && n == 2 && out[1] == '0' + k, "rerender %d",
              k);
        free(out);
        json_decref(j);
    }
    template_free(t);
    template_free(NULL);

    /* context must be an object; source must be UTF-8 */
    CHECK(render_str("x", "[1]", NULL, &out, err, sizeof err) == -1, "array context must fail");
    CHECK(template_compile("\xff", 1, "chat template", &t, err, sizeof err) == -1 && strstr(err, "UTF-8"), "utf8: %s",
          err);

    /* chat_template_render with now = 0 uses the real clock and still renders */
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    size_t n;
    const char *ts = "{{ strftime_now('%Y')|length }}{{ messages[0].content }}{{ add_generation_prompt }}";
    CHECK(chat_template_render(ts, strlen(ts), msgs, NULL, NULL, true, 0, &out, &n, err, sizeof err) == 0 &&
              !strcmp(out, "4hiTrue"),
          "now=0 render: %s", err);
    free(out);
    json_t *bad = json_loads("{\"messages\": 1}", 0, NULL);
    CHECK(chat_template_render(ts, strlen(ts), msgs, NULL, bad, true, 0, &out, &n, err, sizeof err) == -1,
          "reserved extra key must fail");
    json_decref(bad);
    json_decref(msgs);
}

/* The templates built into the binary (model/templates.c) are the very text chat.json rendered with jinja2
 * ("builtin:NAME" rows), so test_chat's byte-exact renders hold for what spill embeds. */
static void test_builtin(json_t *root)
{
    static const char *const names[] = {"gemma3"};
    json_t *templates = json_object_get(root, "templates"), *t;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const char *mine = templates_builtin(names[k]);
        char want[64];
        snprintf(want, sizeof want, "builtin:%s", names[k]);
        json_t *src = NULL;
        size_t i;
        json_array_foreach(templates, i, t)
        {
            if (!strcmp(json_string_value(json_object_get(t, "name")), want))
                src = json_object_get(t, "template");
        }
        CHECK(mine && src, "%s: built in %s, in chat.json %s", want, mine ? "yes" : "no", src ? "yes" : "no");
        if (mine && src)
            CHECK(strlen(mine) == json_string_length(src) && !memcmp(mine, json_string_value(src), strlen(mine)),
                  "%s: the embedded template differs from the one chat.json was rendered from", want);
    }
    CHECK(templates_builtin("no-such-family") == NULL && templates_builtin(NULL) == NULL,
          "an unknown built-in template name must give NULL");
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    tzset();
    test_api();
    test_features();
    json_t *chat = load("tests/data/tmpl/chat.json");
    if (chat) {
        test_chat(chat);
        test_threads(chat);
        test_builtin(chat);
        json_decref(chat);
    }
    test_dos();
    return test_finish("test_template");
}
