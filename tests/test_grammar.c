/*
 * test_grammar.c — structured output (src/batch/grammar.c, token_mask.c, and the job through the binary).
 *
 *  1. schema compile errors: each unsupported keyword or bad shape fails with a sentence naming it and its
 *     path;
 *  2. byte strings the automaton must accept (compact JSON, one space after ':' and ',', keys in schema
 *     order, formats, bounds, UTF-8 split anywhere) and must refuse (other white space, keys out of order or
 *     extra, out-of-range integers, invalid UTF-8, surrogate or NUL escapes, bad dates, …);
 *  3. random walks: 300 walks per schema pick random accepted bytes until the value closes; every text must
 *     parse (jansson) and validate (tests/schema_check.h, an independent validator);
 *  4. masks over the real SmolLM2 vocabulary: token_mask_compute (the sorted walk) equals a brute-force
 *     feed of every token at every state along sample texts; special tokens never allowed; end tokens
 *     exactly when the value can end; timing lines (informational, no assertion);
 *  5. end to end: `spill run` on the default model with json_object and json_schema rows, greedy and
 *     temperature 1 — every row finishing `stop` parses and validates, most finish `stop` within a few dozen
 *     tokens, a row with an unsupported keyword fails alone with a 400.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "batch/grammar.h"
#include "batch/token_mask.h"
#include "cli.h"
#include "model/model.h"
#include "schema_check.h"
#include "test.h"
#include "text/prompt.h"

static const char *PERSON =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"email\":{\"type\":[\"string\",\"null\"]},"
    "\"born\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"minItems\":1,\"maxItems\":3},"
    "\"status\":{\"enum\":[\"active\",\"inactive\",\"banned\"]},"
    "\"score\":{\"type\":\"number\"},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}"
    "},\"required\":[\"name\",\"age\",\"status\"],\"additionalProperties\":false}";

static const char *TREE = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                          "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
                          "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";

static const char *MISC = "{\"type\":\"object\",\"properties\":{"
                          "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
                          "\"at\":{\"type\":\"string\",\"format\":\"date-time\"},"
                          "\"kind\":{\"const\":\"event\"},"
                          "\"level\":{\"enum\":[1,2,12,null,\"x\"]},"
                          "\"when\":{\"anyOf\":[{\"type\":\"string\",\"format\":\"time\"},{\"type\":\"null\"}]},"
                          "\"neg\":{\"type\":\"integer\",\"exclusiveMaximum\":-5,\"minimum\":-300},"
                          "\"extra\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}},"
                          "\"open\":{}"
                          "},\"required\":[\"id\",\"kind\",\"level\",\"neg\"]}";

static grammar *compile_text(const char *schema_text, json_t **doc)
{
    char err[512], where[200];
    json_error_t je;
    *doc = schema_text ? json_loads(schema_text, 0, &je) : NULL;
    if (schema_text && !*doc) {
        CHECK(0, "test schema does not parse: %s", je.text);
        return NULL;
    }
    grammar *g = NULL;
    int rc = grammar_compile(*doc, "schema", &g, where, sizeof where, err, sizeof err);
    CHECK(rc == 0, "compile: %s", err);
    return g;
}

/* 1 when the whole text is accepted and complete, 0 when accepted but incomplete, -1 when refused. */
static int run_text(const grammar *g, const char *t)
{
    gstate s;
    gstate_init(g, &s);
    if (gstate_feed_bytes(g, &s, (const uint8_t *)t, strlen(t)))
        return -1;
    return gstate_can_end(g, &s) ? 1 : 0;
}

static void expect_compile_error(const char *schema_text, const char *want_where, const char *want_in_msg)
{
    json_error_t je;
    json_t *doc = json_loads(schema_text, 0, &je);
    char err[512], where[200];
    grammar *g = NULL;
    int rc = grammar_compile(doc, "body.response_format.json_schema.schema", &g, where, sizeof where, err, sizeof err);
    CHECK(rc == -1 && !g, "%s compiled", schema_text);
    if (rc == -1) {
        CHECK(strstr(where, want_where) != NULL, "where '%s' lacks '%s' (%s)", where, want_where, err);
        CHECK(strstr(err, want_in_msg) != NULL, "sentence '%s' lacks '%s'", err, want_in_msg);
        CHECK(strncmp(err, "body.response_format.json_schema.schema", 39) == 0, "sentence '%s' has no path", err);
    }
    grammar_free(g);
    json_decref(doc);
}

static void test_compile_errors(void)
{
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "schema.pattern", "backreferences");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "schema.pattern", "lookarounds");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"\\\\bx\"}", "schema.pattern", "word boundaries");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"a^b\"}", "schema.pattern", "^");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"[é]\"}", "schema.pattern", "ASCII");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", "schema.pattern", "without escapes");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"^a{5}$\",\"maxLength\":3}", "schema.pattern",
                         "maxLength");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"a\",\"minLength\":3}", "schema.pattern", "minLength");
    expect_compile_error("{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"uuid\"}", "schema.pattern", "format");
    expect_compile_error("{\"type\":\"number\",\"multipleOf\":0.5}", "schema.multipleOf", "integer");
    expect_compile_error("{\"type\":\"integer\",\"multipleOf\":10,\"minimum\":1,\"maximum\":9}", "schema.multipleOf",
                         "no integer");
    expect_compile_error("{\"allOf\":[{\"type\":\"string\"}]}", "schema.allOf[0].type", "object schemas");
    expect_compile_error("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"string\"}}},{\"properties\":{\"a\":{\"type\":"
                         "\"integer\"}}}]}",
                         "schema.allOf[1].properties.a", "different schema");
    expect_compile_error("{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":false},{\"properties\":{\"b\":"
                         "{}},\"required\":[\"b\"]}]}",
                         "schema.allOf", "no object fits");
    expect_compile_error("{\"type\":\"array\",\"uniqueItems\":true}", "schema.uniqueItems", "enum or const");
    expect_compile_error("{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"uniqueItems\":true,\"minItems\":3}",
                         "schema.uniqueItems", "distinct");
    expect_compile_error("{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "schema.items", "prefixItems");
    expect_compile_error("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "schema.items",
                         "fewer items");
    expect_compile_error("{\"type\":\"number\",\"minimum\":1,\"exclusiveMaximum\":1}", "schema", "leave no value");
    expect_compile_error("{\"type\":\"string\",\"format\":\"uri\"}", "schema.format", "uri");
    expect_compile_error("{\"not\":{}}", "schema.not", "\"not\"");
    expect_compile_error("{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":"
                         "\"string\",\"maxLength\":2}]}}}",
                         "schema.properties.a.anyOf", "same character");
    expect_compile_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "schema.required[0]",
                         "\"b\"");
    expect_compile_error("{\"$ref\":\"#/$defs/missing\"}", "schema.$ref", "#/$defs/missing");
    expect_compile_error("{\"type\":\"strnig\"}", "schema.type", "one of null");
    expect_compile_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "schema.maxItems", "fewer items than minItems");
    expect_compile_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "schema", "leave no value");
    expect_compile_error("{\"type\":\"integer\",\"enum\":[\"a\"]}", "schema.enum", "no value");
}

static void test_accept(void)
{
    json_t *d0, *d1, *d2, *d3;
    grammar *obj = compile_text(NULL, &d0), *person = compile_text(PERSON, &d1), *tree = compile_text(TREE, &d2),
            *misc = compile_text(MISC, &d3);
    if (!obj || !person || !tree || !misc)
        goto out;
    static const struct {
        int which; /* 0 obj, 1 person, 2 tree, 3 misc */
        const char *text;
        int want; /* 1 complete, 0 prefix, -1 refused */
    } C[] = {
        {0, "{}", 1},
        {0, "{\"a\": 1, \"b\": [true, null, \"x\", {\"c\": -2.5e+10}]}", 1},
        {0, "{\"a\":1,\"b\":[]}", 1},
        {0, "{\"\xc3\xa9t\xc3\xa9\": \"\\u00e9\\n\\\"\"}", 1},
        {0, "{ }", -1},
        {0, "{\"a\":  1}", -1},
        {0, "{\"a\":1}\n", -1},
        {0, "{\"a\" :1}", -1},
        {0, "[1]", -1},
        {0, " {}", -1},
        {0, "{\"a\":01}", -1},
        {0, "{\"a\":-0}", -1},
        {0, "{\"a\":1.}", -1},
        {0, "{\"a\":1.5", 0},
        {0, "{\"a\":1234567890123456789}", -1}, /* 19 digits: beyond int64 */
        {0, "{\"a\":\"\\u0000\"}", -1},
        {0, "{\"a\":\"\\ud800\"}", -1},
        {0, "{\"a\":\"\xc0\x80\"}", -1},
        {0, "{\"a\":\"\xed\xa0\x80\"}", -1},
        {0, "{\"a\":\"x\ny\"}", -1},
        {0, "{\"a\\n\":1}", -1}, /* no escapes in free keys */
        {0, "{\"a\":tru", 0},
        {0, "{\"a\":truth}", -1},
        {1, "{\"name\": \"Ann\", \"age\": 30, \"status\": \"active\"}", 1},
        {1, "{\"name\":\"Ann\",\"age\":120,\"email\":null,\"born\":\"2024-02-29\",\"tags\":[\"a\",\"b\"],"
            "\"status\":\"banned\",\"score\":-1.25,\"address\":{\"city\":\"Oslo\"}}",
         1},
        {1, "{\"age\": 30, \"name\": \"Ann\", \"status\": \"active\"}", -1}, /* out of schema order */
        {1, "{\"name\": \"Ann\", \"status\": \"active\"}", -1},              /* age is required before status */
        {1, "{\"name\": \"Ann\", \"age\": 30}", -1},                         /* cannot close without status */
        {1, "{\"name\": \"Ann\", \"age\": 30, \"status\": \"active\", \"x\": 1}", -1},
        {1, "{\"name\": \"\", \"age\": 30", -1}, /* minLength 1 */
        {1, "{\"name\": \"A\", \"age\": 121", -1},
        {1, "{\"name\": \"A\", \"age\": 12", 0},
        {1, "{\"name\": \"A\", \"age\": -1", -1},
        {1, "{\"name\": \"A\", \"age\": 1000", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"born\": \"2023-02-29\"", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"born\": \"2023-13-01\"", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"born\": \"0000-01-01\"", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"born\": \"2023-04-31\"", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"born\": \"2023-04-30\"", 0},
        {1, "{\"name\": \"A\", \"age\": 0, \"tags\": []", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"tags\": [\"a\", \"b\", \"c\", \"d\"]", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"tags\": [\"a\", \"b\", \"c\"]", 0},
        {1, "{\"name\": \"A\", \"age\": 0, \"status\": \"activ\"}", -1},
        {1, "{\"name\": \"A\", \"age\": 0, \"status\": \"active\", \"address\": {}}", -1},
        {1, "{\"name\": \"\xe6\x97\xa5\xe6\x9c\xac\", \"age\": 0, \"status\": \"active\"}", 1},
        {1, "{\"name\": \"0123456789012345678901234567890123456789\", \"age\": 0, \"status\": \"active\"}", 1},
        {1, "{\"name\": \"0123456789012345678901234567890123456789x", -1}, /* maxLength 40 */
        {2, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4}]}]}", 1},
        {2, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3},{\"v\":4}]}", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":12,\"neg\":-6}", 1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-01-31T23:59:59Z\",\"kind\":\"event\","
            "\"level\":null,\"when\":\"10:00:00Z\",\"neg\":-300,\"extra\":{\"p\":true,\"q\":false},\"open\":[1,{}]}",
         1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-42661417400g\"", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"evnt\"", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":3", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":1,\"neg\":-5}", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":1,\"neg\":-301", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":1,\"when\":\"24:00", -1},
        {3, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":1,\"neg\":-6,"
            "\"extra\":{\"p\":1}}",
         -1},
    };
    grammar *gs[4] = {obj, person, tree, misc};
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        int got = run_text(gs[C[i].which], C[i].text);
        CHECK(got == C[i].want, "case %zu %s: got %d, want %d", i, C[i].text, got, C[i].want);
    }
    /* a multibyte character split at every byte is the same as whole (tokens split UTF-8 anywhere) */
    gstate s;
    gstate_init(obj, &s);
    const char *t = "{\"k\":\"\xf0\x9f\x98\x80\"}";
    for (size_t i = 0; t[i]; i++)
        CHECK(gstate_feed(obj, &s, (uint8_t)t[i]) == 0, "byte %zu of the emoji text", i);
    CHECK(gstate_done(&s), "the emoji text closes");
    gstate_init(obj, &s);
    CHECK(gstate_feed_bytes(obj, &s, (const uint8_t *)"{\"k\":\"\xf0\x9f", 8) == 0 &&
              gstate_feed(obj, &s, '"') == -1,
          "a quote inside a split character is refused");
out:
    grammar_free(obj), grammar_free(person), grammar_free(tree), grammar_free(misc);
    json_decref(d0), json_decref(d1), json_decref(d2), json_decref(d3);
}

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* One random walk: random accepted bytes (structural ones favoured so values close) until the value is
 * done or can end and we choose to stop.  Returns the length, or 0 when it ran past cap. */
static size_t random_walk(const grammar *g, char *out, size_t cap)
{
    gstate s, t;
    gstate_init(g, &s);
    size_t n = 0;
    while (n + 1 < cap) {
        if (gstate_done(&s) || (gstate_can_end(g, &s) && rnd() % 4 == 0))
            break;
        uint8_t ok[256], fav[256];
        int nok = 0, nfav = 0;
        for (int b = 0; b < 256; b++) {
            gstate_copy(&t, &s);
            if (gstate_feed(g, &t, (uint8_t)b) == 0) {
                ok[nok++] = (uint8_t)b;
                if (strchr("\"{}[],:0123456789tfn-.eE", b) && b)
                    fav[nfav++] = (uint8_t)b;
            }
        }
        if (!nok)
            return 0;
        uint8_t b = nfav && rnd() % 2 ? fav[rnd() % (uint32_t)nfav] : ok[rnd() % (uint32_t)nok];
        CHECK(gstate_feed(g, &s, b) == 0, "an accepted byte feeds");
        out[n++] = (char)b;
    }
    out[n] = 0;
    return gstate_can_end(g, &s) ? n : 0;
}

static void test_random_walks(void)
{
    const char *schemas[] = {NULL, PERSON, TREE, MISC};
    char *buf = malloc(1 << 16);
    for (int k = 0; k < 4; k++) {
        json_t *doc;
        grammar *g = compile_text(schemas[k], &doc);
        int parsed = 0, valid = 0, walks = 0;
        for (int w = 0; g && w < 300; w++) {
            size_t n = random_walk(g, buf, 1 << 16);
            if (!n)
                continue;
            walks++;
            json_error_t je;
            json_t *v = json_loadb(buf, n, 0, &je);
            CHECK(v != NULL, "schema %d walk %d does not parse (%s): %.300s", k, w, je.text, buf);
            if (!v)
                continue;
            parsed++;
            const char *why = NULL;
            bool ok = doc ? schema_valid(doc, v, &why) : json_is_object(v);
            CHECK(ok, "schema %d walk %d does not validate (%s): %.300s", k, w, why ? why : "not an object", buf);
            valid += ok;
            json_decref(v);
        }
        CHECK(walks >= 200, "schema %d: only %d of 300 walks closed", k, walks);
        fprintf(stderr, "random walks, schema %d: %d closed, %d parse, %d validate\n", k, walks, parsed, valid);
        grammar_free(g);
        json_decref(doc);
    }
    free(buf);
}

/* The keywords past the basic set (issue 16): each schema with texts the automaton must take whole, and
 * texts it must refuse at one byte (prefix accepted, the next byte refused). */
static const struct kw_case {
    const char *schema;
    const char *good[5];
    const char *bad[5][2]; /* prefix, the rest (its first byte refused) */
} KW[] = {
    {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":3.75},"
     "\"q\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":0.001},\"r\":{\"type\":\"number\",\"minimum\":0.1,"
     "\"maximum\":0.1},\"m\":{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":-30,\"maximum\":30},\"f\":{\"type\":"
     "\"number\"}},\"required\":[\"p\",\"q\",\"r\",\"m\"],\"additionalProperties\":false}",
     {"{\"p\":-2.5,\"q\":0.001,\"r\":0.1,\"m\":-28}", "{\"p\":3.74999,\"q\":0.0000001,\"r\":0.10,\"m\":0,\"f\":-0.5}",
      "{\"p\":0, \"q\":0.0005, \"r\":0.1000, \"m\":28}"},
     {{"{\"p\":3.7", "5"}, {"{\"p\":-2.", "6"}, {"{\"p\":1,\"q\":0", ","}, {"{\"p\":1,\"q\":0.001", "1"},
      {"{\"p\":1,\"q\":0.001,\"r\":0.1,\"m\":", "5"}}},
    {"{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3,5}$\"},"
     "\"tag\":{\"type\":\"string\",\"pattern\":\"[0-9]|^x(y|z)+$\"},\"u\":{\"type\":\"string\",\"pattern\":\"^.é[^a-z]$\","
     "\"maxLength\":3},\"s\":{\"type\":\"string\",\"pattern\":\"^a+$\",\"maxLength\":3}},\"required\":[\"code\",\"tag\","
     "\"u\"],\"additionalProperties\":false}",
     {"{\"code\":\"AB-123\",\"tag\":\"ab1yy\",\"u\":\"ZéZ\"}", "{\"code\":\"QQ-12345\",\"tag\":\"xyzzy\",\"u\":\"€é€\","
      "\"s\":\"aaa\"}"},
     {{"{\"code\":\"A", "1"}, {"{\"code\":\"AB-12", "\""}, {"{\"code\":\"AB-12345", "6"},
      {"{\"code\":\"AB-123\",\"tag\":\"xyq", "\""}, {"{\"code\":\"AB-123\",\"tag\":\"7\",\"u\":\"aéZ\",\"s\":\"aaa", "a"}}},
    {"{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"ab\",1]},\"uniqueItems\":true,\"minItems\":2}",
     {"[\"a\",\"ab\"]", "[1, \"b\", \"a\", \"ab\"]"},
     {{"[\"a\",\"a", "\""}, {"[\"ab\",\"a\",\"b\",1", ","}, {"[1,", "1"}, {"[\"a\"", "]"}}},
    {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":"
     "{\"b\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"b\"]},{\"$ref\":\"#/$defs/c\"}],\"$defs\":{\"c\":{"
     "\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3},\"c\":"
     "{\"type\":\"boolean\"}},\"additionalProperties\":false}}}",
     {"{\"a\":1,\"b\":\"x\"}", "{\"a\":-1, \"b\":\"\", \"c\":true}"},
     {{"{\"a\":1", "}"}, {"{\"a\":1,\"b\":\"x\",\"", "d"}}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\",\"format\":\"ipv4\"},{\"type\":"
     "\"boolean\"}],\"items\":false,\"minItems\":2}",
     {"[1,\"10.0.0.255\"]", "[-3, \"192.168.1.1\", false]"},
     {{"[", "\""}, {"[1", "]"}, {"[1,\"25", "6"}, {"[1,\"1.2.3.4\",true", ","}, {"[1,\"0", "1"}}},
    {"{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"format\":\"email\"},\"h\":{\"type\":\"string\","
     "\"format\":\"hostname\"},\"v6\":{\"type\":\"string\",\"format\":\"ipv6\"}},\"required\":[\"e\",\"h\",\"v6\"],"
     "\"additionalProperties\":false}",
     {"{\"e\":\"a.b+c@example.com\",\"h\":\"x-1.example\",\"v6\":\"2001:db8:0:0:0:0:0:1\"}"},
     {{"{\"e\":\"a", "\""}, {"{\"e\":\"a@", "-"}, {"{\"e\":\"a@b.c\",\"h\":\"x", "_"}, {"{\"e\":\"a@b.c\",\"h\":\"", "-"},
      {"{\"e\":\"a@b.c\",\"h\":\"x\",\"v6\":\"1:2:3:4:5:6:7:8", ":"}}},
    {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{\"type\":\"number\","
     "\"minimum\":0}},\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{"
     "\"kind\":{\"enum\":[\"square\",\"rect\"]},\"side\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"side\"],"
     "\"additionalProperties\":false}]}",
     {"{\"kind\":\"circle\",\"r\":0.5}", "{\"kind\": \"rect\", \"side\": 3}"},
     {{"{\"kind\":\"circle\",\"", "s"}, {"{\"kind\":\"square\",\"side\":0", "."}, {"{\"", "r"}}},
};

/* Every good text is taken whole, every bad one refused exactly at its byte; 300 random walks per schema;
 * all of them (good texts, walks, and the bad texts completed by hand as invalid documents) checked by
 * Python's jsonschema (tools/structured_check.py --docs). */
static void test_keywords(void)
{
    char path[] = "/tmp/spill_kw_XXXXXX";
    int fd = mkstemp(path);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(out != NULL, "cannot write %s", path);
    char *buf = malloc(1 << 16);
    size_t n_docs = 0;
    for (size_t k = 0; out && k < sizeof KW / sizeof KW[0]; k++) {
        json_t *doc;
        grammar *g = compile_text(KW[k].schema, &doc);
        if (!g)
            continue;
        char *sch = json_dumps(doc, JSON_COMPACT);
        for (int i = 0; i < 5 && KW[k].good[i]; i++) {
            gstate st;
            gstate_init(g, &st);
            int rc = gstate_feed_bytes(g, &st, (const uint8_t *)KW[k].good[i], strlen(KW[k].good[i]));
            CHECK(rc == 0 && gstate_can_end(g, &st), "keyword schema %zu: %s is not taken whole", k, KW[k].good[i]);
            json_t *line = json_pack("{s:s, s:s, s:b}", "doc", KW[k].good[i], "schema", "", "valid", 1);
            json_object_set_new(line, "schema", json_loads(sch, 0, NULL));
            char *l = json_dumps(line, JSON_COMPACT);
            fprintf(out, "%s\n", l);
            free(l), json_decref(line), n_docs++;
        }
        for (int i = 0; i < 5 && KW[k].bad[i][0]; i++) {
            gstate st;
            gstate_init(g, &st);
            const char *pre = KW[k].bad[i][0], *rest = KW[k].bad[i][1];
            int rc = gstate_feed_bytes(g, &st, (const uint8_t *)pre, strlen(pre));
            CHECK(rc == 0, "keyword schema %zu: the prefix %s is refused", k, pre);
            if (rc == 0 && rest[0])
                CHECK(gstate_feed(g, &st, (uint8_t)rest[0]) != 0, "keyword schema %zu: %s then '%c' is accepted", k,
                      pre, rest[0]);
            else if (rc == 0)
                CHECK(!gstate_can_end(g, &st), "keyword schema %zu: %s can end", k, pre);
        }
        int walks = 0;
        for (int w = 0; w < 300; w++) {
            size_t n = random_walk(g, buf, 1 << 16);
            if (!n)
                continue;
            walks++;
            json_t *line = json_pack("{s:s%, s:b}", "doc", buf, n, "valid", 1);
            json_object_set_new(line, "schema", json_loads(sch, 0, NULL));
            char *l = json_dumps(line, JSON_COMPACT);
            fprintf(out, "%s\n", l);
            free(l), json_decref(line), n_docs++;
        }
        CHECK(walks >= 200, "keyword schema %zu: only %d of 300 walks closed", k, walks);
        free(sch);
        grammar_free(g);
        json_decref(doc);
    }
    /* and what the bad prefixes meant: the validator refuses them too, completed as the grammar would not */
    static const struct {
        int k;
        const char *doc;
    } INVALID[] = {{0, "{\"p\":3.75,\"q\":0.001,\"r\":0.1,\"m\":0}"}, {0, "{\"p\":1,\"q\":0,\"r\":0.1,\"m\":0}"},
                   {0, "{\"p\":1,\"q\":0.0011,\"r\":0.1,\"m\":0}"}, {0, "{\"p\":1,\"q\":0.001,\"r\":0.1,\"m\":5}"},
                   {1, "{\"code\":\"AB-123456\",\"tag\":\"a1\",\"u\":\"aéZ\"}"}, {1, "{\"code\":\"AB-123\",\"tag\":\"xyq\",\"u\":\"aéZ\"}"}, {2, "[\"a\",\"a\"]"},
                   {4, "[1,\"256.1.1.1\"]"}, {4, "[1,\"1.2.3.4\",true,1]"}, {5, "{\"e\":\"a\",\"h\":\"x\",\"v6\":\"::1\"}"},
                   {5, "{\"e\":\"a@b.c\",\"h\":\"x_y\",\"v6\":\"::1\"}"}, {6, "{\"kind\":\"circle\",\"side\":1}"}};
    for (size_t i = 0; out && i < sizeof INVALID / sizeof INVALID[0]; i++) {
        json_t *line = json_pack("{s:s, s:b}", "doc", INVALID[i].doc, "valid", 0);
        json_object_set_new(line, "schema", json_loads(KW[INVALID[i].k].schema, 0, NULL));
        char *l = json_dumps(line, JSON_COMPACT);
        fprintf(out, "%s\n", l);
        free(l), json_decref(line);
    }
    if (out)
        fclose(out);
    free(buf);
    CHECK(sh("python3 tools/structured_check.py --docs %s >%s.log 2>&1", path, path) == 0,
          "jsonschema disagrees with the grammar on the keyword documents (%s.log)", path);
    fprintf(stderr, "keywords: %zu accepted documents checked by jsonschema\n", n_docs);
    sh("rm -f %s %s.log", path, path);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Brute force: every token's bytes fed from s. */
static void brute_mask(const tokenizer *tok, const model_desc *m, const grammar *g, const gstate *s, uint64_t *allow,
                       size_t words)
{
    memset(allow, 0, words * sizeof *allow);
    size_t nv = tokenizer_vocab_size(tok);
    gstate t;
    for (size_t i = 0; i < nv && i < (size_t)m->vocab; i++) {
        size_t len;
        const uint8_t *b = tokenizer_token_bytes(tok, (int32_t)i, &len);
        bool stop = false;
        for (size_t k = 0; k < m->n_stop; k++)
            stop |= m->stop_ids[k] == (int32_t)i;
        if (stop || !b || !len || tokenizer_is_special(tok, (int32_t)i))
            continue;
        gstate_copy(&t, s);
        if (gstate_feed_bytes(g, &t, b, len) == 0)
            allow[i >> 6] |= 1ull << (i & 63);
    }
    if (gstate_can_end(g, s))
        for (size_t k = 0; k < m->n_stop; k++)
            allow[m->stop_ids[k] >> 6] |= 1ull << (m->stop_ids[k] & 63);
}

static void test_masks(void)
{
    char err[SPILL_ERRLEN], path[4096];
    model_desc *m = NULL;
    tokenizer *tok = NULL;
    int rc = model_resolve("smollm2:135m", path, sizeof path, err, sizeof err);
    if (rc == 0)
        rc = model_open(path, &m, err, sizeof err);
    if (rc == 0)
        rc = prompt_open_tokenizer(m, &tok, err, sizeof err);
    CHECK(rc == 0, "the default model must be installed (tools/setup.sh): %s", err);
    if (rc) {
        model_close(m);
        return;
    }
    token_mask *tm = NULL;
    CHECK(token_mask_open(tok, m->vocab, m->stop_ids, m->n_stop, 1, 8u << 20, &tm, err, sizeof err) == 0, "open: %s",
          err);
    size_t words = token_mask_words(tm);
    /* the plan's figure bounds what the masks hold, and the cap bounds the cache */
    CHECK(token_mask_bytes(tm) <= token_mask_plan_bytes(m->vocab, 1, 8u << 20) &&
              token_mask_plan_bytes(m->vocab, 1, 8u << 20) < (8u << 20) + (4u << 20),
          "mask bytes %zu, planned %zu (cap 8 MB)", token_mask_bytes(tm), token_mask_plan_bytes(m->vocab, 1, 8u << 20));
    uint64_t *a = malloc(words * 8), *b = malloc(words * 8);
    const char *schemas[] = {NULL, PERSON, MISC};
    const char *texts[] = {
        "{\"answer\": \"caf\xc3\xa9 \\\"x\\\"\", \"n\": [1, -2.5e3, true, null], \"o\": {}}",
        "{\"name\": \"Ann Lee\", \"age\": 42, \"email\": null, \"born\": \"1999-12-31\", \"tags\": [\"x\"], "
        "\"status\": \"inactive\", \"score\": 0.5, \"address\": {\"city\": \"Rome\"}}",
        "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"kind\":\"event\",\"level\":12,\"neg\":-6}",
    };
    int states = 0, equal = 0;
    double t_walk = 0;
    for (int k = 0; k < 3; k++) {
        json_t *doc;
        grammar *g = compile_text(schemas[k], &doc);
        gstate s;
        gstate_init(g, &s);
        for (size_t i = 0; g && i <= strlen(texts[k]); i++) {
            double t0 = now_s();
            int32_t n = token_mask_compute(tm, 0, g, &s, a);
            t_walk += now_s() - t0;
            brute_mask(tok, m, g, &s, b, words);
            bool same = memcmp(a, b, words * 8) == 0;
            CHECK(same, "schema %d, after %zu bytes of %s: the sorted walk differs from brute force", k, i, texts[k]);
            CHECK(n > 0, "schema %d, after %zu bytes: nothing allowed", k, i);
            states++, equal += same;
            if (i == 0) { /* only tokens starting the value; " {" and the end tokens are not among them */
                int32_t brace = tokenizer_token_id(tok, "{", 1);
                CHECK(brace >= 0 && a[brace >> 6] >> (brace & 63) & 1, "'{' is allowed first");
                for (size_t q = 0; q < m->n_stop; q++)
                    CHECK(!(a[m->stop_ids[q] >> 6] >> (m->stop_ids[q] & 63) & 1), "no end token first");
            }
            if (texts[k][i])
                CHECK(gstate_feed(g, &s, (uint8_t)texts[k][i]) == 0, "sample text %d byte %zu", k, i);
        }
        if (g) { /* closed: only the end tokens */
            token_mask_compute(tm, 0, g, &s, a);
            int32_t n = 0;
            for (size_t w = 0; w < words; w++)
                n += __builtin_popcountll(a[w]);
            CHECK(n == (int32_t)m->n_stop, "after the value closes only the %zu end tokens are allowed (got %d)",
                  m->n_stop, n);
        }
        grammar_free(g);
        json_decref(doc);
    }
    fprintf(stderr, "masks: %d states, %d equal to brute force; sorted walk %.2f ms per state (ASan build)\n", states,
            equal, 1e3 * t_walk / (states ? states : 1));
    free(a), free(b);
    token_mask_close(tm);
    tokenizer_free(tok);
    model_close(m);
}

/* End to end through the binary on the default model. */
static void test_run(void)
{
    char tmp[] = "/tmp/spill_grammar_XXXXXX", in[256], out[256], res[300], errs[300];
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    FILE *f = fopen(in, "w");
    if (!f)
        return;
    const char *qs[] = {"Describe a fictional person as JSON.", "Give me a JSON record for a customer named Ana.",
                        "Return JSON about a teacher from Paris."};
    json_error_t je;
    json_t *person = json_loads(PERSON, 0, &je), *misc = json_loads(MISC, 0, &je);
    int n_rows = 0;
    for (int q = 0; q < 3; q++)
        for (int t = 0; t < 2; t++)
            for (int kind = 0; kind < 3; kind++) {
                json_t *rf = kind == 0 ? json_pack("{s:s}", "type", "json_object")
                                       : json_pack("{s:s,s:{s:s,s:O,s:b}}", "type", "json_schema", "json_schema",
                                                   "name", "s", "schema", kind == 1 ? person : misc, "strict", 1);
                char id[48];
                snprintf(id, sizeof id, "k%d-q%d-t%d", kind, q, t);
                json_t *row = json_pack("{s:s,s:s,s:s,s:{s:s,s:[{s:s,s:s}],s:i,s:i,s:i,s:o}}", "custom_id", id,
                                        "method", "POST", "url", "/v1/chat/completions", "body", "model",
                                        "smollm2:135m", "messages", "role", "user", "content", qs[q], "max_tokens", 96,
                                        "temperature", t, "seed", 11 + q, "response_format", rf);
                char *line = json_dumps(row, JSON_COMPACT);
                fprintf(f, "%s\n", line);
                free(line);
                json_decref(row);
                n_rows++;
            }
    /* vLLM's guided_json on the completions endpoint */
    json_t *cr = json_pack("{s:s,s:s,s:s,s:{s:s,s:s,s:i,s:i,s:O}}", "custom_id", "k1-completions", "method", "POST",
                           "url", "/v1/completions", "body", "model", "smollm2:135m", "prompt",
                           "A customer record as JSON:", "max_tokens", 96, "temperature", 0, "guided_json", person);
    char *cl = json_dumps(cr, JSON_COMPACT);
    fprintf(f, "%s\n", cl);
    free(cl);
    json_decref(cr);
    n_rows++;
    /* one row with an unsupported keyword fails alone */
    fprintf(f, "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
               "\"smollm2:135m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":"
               "\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"string\",\"not\":{}}}}}}\n");
    fclose(f);
    int code = sh("%s run smollm2:135m %s -o %s --quiet >%s/log 2>&1", bin(), in, out, tmp);
    CHECK(code == 0, "spill run exited %d (see %s/log)", code, tmp);
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    snprintf(errs, sizeof errs, "%s/errors.jsonl", out);
    json_t *lines = read_lines(res), *elines = read_lines(errs);
    CHECK((int)json_array_size(lines) == n_rows, "%zu results for %d rows", json_array_size(lines), n_rows);
    CHECK(json_array_size(elines) == 1, "%zu error lines, want 1", json_array_size(elines));
    json_t *e0 = json_array_get(elines, 0);
    const char *emsg = json_string_value(json_object_get(
        json_object_get(json_object_get(json_object_get(e0, "response"), "body"), "error"), "message"));
    CHECK(emsg && strstr(emsg, "\"not\""), "the bad row's error names the keyword: %s", emsg ? emsg : "(none)");
    int stop = 0, parsed = 0, valid = 0, person_rows = 0, person_stop = 0;
    long tokens_stop = 0;
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o)
    {
        const char *id = json_string_value(json_object_get(o, "custom_id"));
        json_t *body = json_object_get(json_object_get(o, "response"), "body");
        json_t *ch = json_array_get(json_object_get(body, "choices"), 0);
        const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
        const char *text = chat_answer(o) ? chat_answer(o) : json_string_value(json_object_get(ch, "text"));
        int ntok = (int)json_integer_value(json_object_get(json_object_get(body, "usage"), "completion_tokens"));
        person_rows += id[1] == '1';
        person_stop += id[1] == '1' && fin && !strcmp(fin, "stop");
        if (!fin || strcmp(fin, "stop")) {
            CHECK(fin && !strcmp(fin, "length") && ntok == 96, "%s: finish %s after %d tokens", id, fin, ntok);
            continue;
        }
        stop++;
        tokens_stop += ntok;
        json_t *v = text ? json_loads(text, 0, &je) : NULL;
        CHECK(v != NULL, "%s: the answer does not parse: %s", id, text ? text : "(null)");
        if (!v)
            continue;
        parsed++;
        const char *why = NULL;
        bool ok = id[1] == '0' ? json_is_object(v) : schema_valid(id[1] == '1' ? person : misc, v, &why);
        CHECK(ok, "%s: the answer does not validate (%s): %s", id, why ? why : "not an object", text);
        valid += ok;
        json_decref(v);
    }
    /* rows of a fixed-shape schema are short: most end with their value, in a few dozen tokens (free-form
     * objects — json_object, maps like MISC's "extra" — may ramble to max_tokens on a 135M model) */
    CHECK(person_stop * 3 >= person_rows * 2, "only %d of %d PERSON rows finished stop", person_stop, person_rows);
    fprintf(stderr, "end to end: %d rows, %d stop (%.1f tokens on average), %d parse, %d validate\n", n_rows, stop,
            stop ? (double)tokens_stop / stop : 0.0, parsed, valid);
    json_decref(lines), json_decref(elines), json_decref(person), json_decref(misc);
    sh("rm -rf %s", tmp);
}

int main(void)
{
    test_compile_errors();
    test_accept();
    test_random_walks();
    test_keywords();
    test_masks();
    test_run();
    return test_finish("test_grammar");
}
