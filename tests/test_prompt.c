/*
 * test_prompt.c — the one prompt path (text/prompt.h): `spill template`,
 * `spill tokenize` and `spill run` feed the same ids, and bos_token/eos_token
 * are what transformers renders.
 *
 * 1. Every chat-template fixture (tests/data/tmpl/chat.json: real templates x
 *    conversations with transformers' renders; tools/gen_template_fixtures.py)
 *    through both front doors, on SmolLM2's tokenizer.json with a
 *    tokenizer_config.json beside it naming the template's bos/eos: the
 *    messages as `spill template` reads a MESSAGES.json file, and the same
 *    conversation as a batch line through request_parse_line and the call
 *    run_rows.c's build_prompt makes.  Both must give the ids of transformers'
 *    text tokenized (no added specials), or the same template error.  Cases
 *    spill run cannot be asked for (caller kwargs, no generation prompt) are
 *    counted and skipped; lines the request rules refuse must still render on
 *    the template side.
 * 2. tests/data/prompt/hf-nobos (tools/gen_prompt_fixtures.py): an HF model
 *    dir whose config.json has no bos_token_id.  The rendered text and ids
 *    equal transformers' apply_chat_template, bos_token "<s>" included (before
 *    the shared path both commands rendered it empty there), completions
 *    prompts equal tokenizer(text).input_ids, and where transformers takes
 *    bos/eos from tokenizer_config.json vs special_tokens_map.json matches.
 * 3. The binaries (build/asan/spill, or $SPILL_BIN) on the tiny GGUF and the
 *    HF fixture: `spill template --json` ids, `spill tokenize` of its text,
 *    and `spill run` of each conversation as a chat row and as a completions
 *    row of the template's ids: same prompt_tokens and the same greedy answer.
 *
 * Expectations fixed before looking at results: ids and text equal exactly
 * (one byte off is another prompt); error cases fail on both sides with the
 * same sentence.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "batch/request.h"
#include "model/model.h"
#include "test.h"
#include "text/prompt.h"
#include "base/util.h"

#define HF_DIR "tests/data/prompt/hf-nobos"
#define TINY_GGUF "tests/data/tiny/tiny-smollm2.gguf"

/* True when a message's content is a list of parts. */
static bool has_parts(json_t *messages)
{
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
    {
        if (json_is_array(json_object_get(m, "content")))
            return true;
    }
    return false;
}

static char g_tmp[256];

static const char *bin(void)
{
    const char *b = getenv("SPILL_BIN");
    return b && *b ? b : "build/asan/spill";
}

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    CHECK(j != NULL, "cannot load %s: %s (line %d)", path, je.text, je.line);
    return j;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* ids of a JSON array of integers (caller frees). */
static int32_t *json_ids(json_t *arr, size_t *n)
{
    *n = json_array_size(arr);
    int32_t *v = malloc((*n ? *n : 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(s, f);
        fclose(f);
    }
}

/* A tokenizer.json (a link to `src`) with a tokenizer_config.json of `cfg` (and special_tokens_map.json of
 * `smap` unless NULL) in a fresh directory under g_tmp; loads it. */
static tokenizer *tokenizer_with_config(const char *name, const char *src, json_t *cfg, json_t *smap)
{
    char dir[512], p[600], abs_src[4096], err[SPILL_ERRLEN];
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    mkdir(dir, 0755);
    CHECK(realpath(src, abs_src) != NULL, "realpath %s", src);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    CHECK(symlink(abs_src, p) == 0, "symlink %s", p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    CHECK(json_dump_file(cfg, p, 0) == 0, "write %s", p);
    snprintf(p, sizeof p, "%s/special_tokens_map.json", dir);
    unlink(p);
    if (smap)
        CHECK(json_dump_file(smap, p, 0) == 0, "write %s", p);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    tokenizer *t = NULL;
    CHECK(tokenizer_from_json_file(p, &t, err, sizeof err) == 0, "%s: %s", p, err);
    return t;
}

/* ---------------------------------------------------------------- 1. every chat-template fixture */

/* The conversation as a /v1/chat/completions batch line. */
static char *batch_line(json_t *c)
{
    json_t *body = json_pack("{s:s,s:O}", "model", "fixture", "messages", json_object_get(c, "messages"));
    json_t *tools = json_object_get(c, "tools");
    if (tools && !json_is_null(tools))
        json_object_set(body, "tools", tools);
    json_t *line =
        json_pack("{s:s,s:s,s:s,s:o}", "custom_id", "c", "method", "POST", "url", "/v1/chat/completions", "body", body);
    char *s = json_dumps(line, JSON_COMPACT);
    json_decref(line);
    return s;
}

static void test_chat_fixtures(void)
{
    json_t *root = load("tests/data/tmpl/chat.json");
    if (!root)
        return;
    time_t now = (time_t)json_integer_value(json_object_get(root, "now"));
    json_t *convs = json_object_get(root, "conversations"), *templates = json_object_get(root, "templates");
    size_t ti, ci, same = 0, errors_same = 0, refused = 0, skipped = 0;
    json_t *t, *c;
    json_array_foreach(templates, ti, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *src = json_object_get(t, "template"), *results = json_object_get(t, "results");
        json_t *extra = json_object_get(t, "extra");
        json_t *cfg = json_pack("{s:O,s:O}", "bos_token", json_object_get(extra, "bos_token"), "eos_token",
                                json_object_get(extra, "eos_token"));
        char dname[64], err[SPILL_ERRLEN], err2[SPILL_ERRLEN];
        snprintf(dname, sizeof dname, "chat%zu", ti);
        tokenizer *tok = tokenizer_with_config(dname, "tests/data/tok/smollm2.tokenizer.json", cfg, NULL);
        json_decref(cfg);
        tmpl_t *tm = NULL;
        CHECK(template_compile(json_string_value(src), json_string_length(src), "chat template", &tm, err,
                               sizeof err) == 0,
              "%s: compile: %s", name, err);
        model_desc m = {0};
        m.source = (char *)name;
        m.bos_id = m.eos_id = -1; /* the tokenizer files decide: no id fallback */
        m.vocab = tok ? (int)tokenizer_vocab_size(tok) : 0;
        prompt_src ps = {&m, tok, tm};
        json_array_foreach(convs, ci, c)
        {
            const char *cid = json_string_value(json_object_get(c, "id"));
            json_t *want = json_array_get(results, ci), *exp = json_object_get(want, "expect");
            if (!tok || !tm)
                break;
            if (json_object_size(json_object_get(c, "extra")) ||
                !json_is_true(json_object_get(c, "add_generation_prompt"))) {
                skipped++; /* caller kwargs or no generation prompt: not a request spill run takes */
                continue;
            }
            if (has_parts(json_object_get(c, "messages"))) {
                skipped++; /* content parts are flattened before templating (prompt_template_messages), while
                            * chat.json renders them as lists: test_toolcall checks the flattened renders */
                continue;
            }
            /* `spill template`: a MESSAGES.json document {"messages", "tools"} */
            json_t *doc = json_pack("{s:O}", "messages", json_object_get(c, "messages"));
            if (!json_is_null(json_object_get(c, "tools")))
                json_object_set(doc, "tools", json_object_get(c, "tools"));
            char *text = NULL;
            size_t tl = 0, nt = 0, nr = 0, nref = 0;
            int32_t *ids_t = NULL, *ids_r = NULL, *ids_ref = NULL;
            int rc_t = prompt_chat(&ps, json_object_get(doc, "messages"), json_object_get(doc, "tools"), true, now,
                                   &text, &tl, &ids_t, &nt, err, sizeof err);
            /* `spill run`: the batch line through the request rules, then build_prompt's call */
            char *line = batch_line(c), msg[SPILL_ERRLEN];
            request q = {0};
            int parsed = request_parse_line(line, strlen(line), 1, "fixture.jsonl", &q, msg, sizeof msg);
            if (parsed != 0) {
                refused++;
                CHECK(rc_t == 0 || rc_t == PROMPT_ERR_TEMPLATE,
                      "%s / %s: template side failed outside the template: %s", name, cid, err);
            } else {
                int rc_r = prompt_chat(&ps, q.messages, q.tools, true, now, NULL, NULL, &ids_r, &nr, err2, sizeof err2);
                CHECK(rc_t == rc_r, "%s / %s: template rc %d, run rc %d (%s | %s)", name, cid, rc_t, rc_r, err, err2);
                if (rc_t == 0 && rc_r == 0) {
                    bool ok = same_ids(ids_t, nt, ids_r, nr);
                    CHECK(ok, "%s / %s: template gives %zu ids, run %zu", name, cid, nt, nr);
                    if (exp) {
                        CHECK(tl == json_string_length(exp) && !memcmp(text, json_string_value(exp), tl),
                              "%s / %s: rendered text differs from transformers'", name, cid);
                        CHECK(tokenizer_encode(tok, json_string_value(exp), json_string_length(exp), false, &ids_ref,
                                               &nref, err, sizeof err) == 0,
                              "encode: %s", err);
                        ok = ok && same_ids(ids_t, nt, ids_ref, nref);
                        CHECK(same_ids(ids_t, nt, ids_ref, nref),
                              "%s / %s: %zu ids, transformers' text tokenizes to %zu", name, cid, nt, nref);
                    } else {
                        CHECK(0, "%s / %s: rendered, but transformers failed", name, cid);
                    }
                    same += ok;
                } else if (rc_t == PROMPT_ERR_TEMPLATE && rc_r == PROMPT_ERR_TEMPLATE) {
                    CHECK(!exp && !strcmp(err, err2),
                          "%s / %s: both failed, but differently or against transformers: "
                          "'%s' | '%s'",
                          name, cid, err, err2);
                    errors_same += !exp && !strcmp(err, err2);
                }
            }
            request_free(&q);
            free(line);
            free(text);
            free(ids_t);
            free(ids_r);
            free(ids_ref);
            json_decref(doc);
        }
        template_free(tm);
        tokenizer_free(tok);
    }
    fprintf(stderr,
            "chat fixtures: %zu conversations give the same ids on both paths and transformers', %zu fail alike, %zu "
            "refused by the request rules, %zu skipped (kwargs / no generation prompt)\n",
            same, errors_same, refused, skipped);
    size_t total = json_array_size(templates) * json_array_size(convs);
    CHECK(same > 0 && same + errors_same + refused + skipped == total,
          "%zu + %zu + %zu + %zu of %zu conversations accounted for", same, errors_same, refused, skipped, total);
    json_decref(root);
}

/* ---------------------------------------------------------------- 2. the HF dir without bos_token_id */

static void test_hf_nobos(void)
{
    json_t *exp = load(HF_DIR "/expected.json");
    char err[SPILL_ERRLEN];
    model_desc *m = NULL;
    tokenizer *tok = NULL;
    tmpl_t *tm = NULL;
    if (!exp)
        return;
    CHECK(json_integer_value(json_object_get(exp, "version")) == 1, "expected.json version");
    if (model_open(HF_DIR, &m, err, sizeof err) || prompt_open_tokenizer(m, &tok, err, sizeof err) ||
        prompt_open_template(m, &tm, err, sizeof err)) {
        CHECK(0, "%s: %s", HF_DIR, err);
        goto out;
    }
    /* the bug's ground: no bos id anywhere, so an id-based bos_token renders empty */
    CHECK(m->bos_id < 0 && tokenizer_special(tok, TOK_BOS) < 0, "fixture: bos id %d / %d", m->bos_id,
          tokenizer_special(tok, TOK_BOS));
    const char *s;
    size_t sl;
    CHECK(tokenizer_special_text(tok, TOK_BOS, &s, &sl) && s &&
              !strcmp(s, json_string_value(json_object_get(exp, "bos_token"))),
          "bos text %s", s ? s : "(none)");
    CHECK(tokenizer_special_text(tok, TOK_EOS, &s, &sl) && s &&
              !strcmp(s, json_string_value(json_object_get(exp, "eos_token"))),
          "eos text %s", s ? s : "(none)");
    prompt_src ps = {m, tok, tm};
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(exp, "chats"), i, c)
    {
        const char *cid = json_string_value(json_object_get(c, "id"));
        json_t *want = json_object_get(c, "text");
        char *text = NULL;
        size_t tl = 0, n = 0, nw = 0;
        int32_t *ids = NULL, *wids = json_ids(json_object_get(c, "ids"), &nw);
        int rc = prompt_chat(&ps, json_object_get(c, "messages"), NULL, true, 0, &text, &tl, &ids, &n, err, sizeof err);
        CHECK(rc == 0, "%s: %s", cid, err);
        if (rc == 0) {
            CHECK(tl == json_string_length(want) && !memcmp(text, json_string_value(want), tl),
                  "%s: text\n got: %s\nwant: %s", cid, text, json_string_value(want));
            CHECK(same_ids(ids, n, wids, nw), "%s: %zu ids, transformers %zu", cid, n, nw);
        }
        free(text);
        free(ids);
        free(wids);
    }
    json_array_foreach(json_object_get(exp, "completions"), i, c)
    {
        size_t n = 0, nw = 0;
        int32_t *ids = NULL, *wids = json_ids(json_object_get(c, "ids"), &nw);
        CHECK(prompt_completion(&ps, json_object_get(c, "text"), &ids, &n, err, sizeof err) == 0, "completion: %s",
              err);
        CHECK(same_ids(ids, n, wids, nw), "completion '%s': %zu ids, transformers %zu",
              json_string_value(json_object_get(c, "text")), n, nw);
        free(ids);
        free(wids);
    }
    /* a completions prompt of ids is taken as it is, and checked against the vocabulary */
    json_t *p = json_loads("[[3, 1, 4]]", 0, NULL), *bad = json_pack("[i,i]", 1, m->vocab);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(prompt_completion(&ps, p, &ids, &n, err, sizeof err) == 0 && n == 3 && ids[0] == 3 && ids[2] == 4,
          "ids prompt: %s", err);
    free(ids);
    ids = NULL;
    CHECK(prompt_completion(&ps, bad, &ids, &n, err, sizeof err) == -1 && strstr(err, "prompt[1]") && !ids,
          "out-of-vocabulary id: %s", err);
    json_decref(p);
    json_decref(bad);
    /* where the text comes from when special_tokens_map.json is there too (transformers' answer per case) */
    json_array_foreach(json_object_get(exp, "special_cases"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *smap = json_object_get(c, "special_tokens_map");
        tokenizer *t = tokenizer_with_config(name, HF_DIR "/tokenizer.json", json_object_get(c, "tokenizer_config"),
                                             json_is_null(smap) ? NULL : smap);
        static const char *const keys[] = {"bos_token", "eos_token"};
        for (int k = 0; t && k < 2; k++) {
            const char *want = json_string_value(json_object_get(c, keys[k]));
            bool known = tokenizer_special_text(t, k ? TOK_EOS : TOK_BOS, &s, &sl);
            CHECK(known && (want ? s && !strcmp(s, want) : !s), "%s: %s is %s, transformers %s", name, keys[k],
                  s ? s : "(none)", want ? want : "(none)");
        }
        tokenizer_free(t);
    }
    /* a tokenizer.json image has no files beside it: the ids decide (GGUF-like) */
    tokenizer *img = NULL;
    char *buf = NULL;
    size_t len;
    if (util_read_file(HF_DIR "/tokenizer.json", 1 << 24, &buf, &len, err, sizeof err) == 0 &&
        tokenizer_from_json(buf, len, "image", &img, err, sizeof err) == 0)
        CHECK(!tokenizer_special_text(img, TOK_BOS, &s, &sl), "an in-memory tokenizer.json decides no text");
    tokenizer_free(img);
    free(buf);
out:
    template_free(tm);
    tokenizer_free(tok);
    model_close(m);
    json_decref(exp);
}

/* ---------------------------------------------------------------- 3. the binaries */

/* Runs cmd through the shell; returns its exit status, stdout in *out (caller frees) when out is not NULL. */
static int sh(const char *cmd, char **out)
{
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap)
            b = realloc(b, cap *= 2);
    }
    if (b)
        b[n] = 0;
    int st = pclose(f);
    if (out)
        *out = b;
    else
        free(b);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_t *results_by_id(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/results.jsonl", dir);
    json_t *map = json_object();
    FILE *f = fopen(p, "r");
    CHECK(f != NULL, "no %s", p);
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        const char *id = json_string_value(json_object_get(o, "custom_id"));
        if (id)
            json_object_set(map, id, o);
        json_decref(o);
    }
    free(line);
    if (f)
        fclose(f);
    return map;
}

/* One batch line: a chat row of msgs or a completions row of ids, greedy, 6 tokens. */
static void put_row(FILE *f, const char *cid, json_t *msgs, json_t *ids)
{
    json_t *body = json_pack("{s:s,s:i,s:i}", "model", "m", "max_tokens", 6, "temperature", 0);
    json_object_set(body, msgs ? "messages" : "prompt", msgs ? msgs : ids);
    json_t *row = json_pack("{s:s,s:s,s:s,s:o}", "custom_id", cid, "method", "POST", "url",
                            msgs ? "/v1/chat/completions" : "/v1/completions", "body", body);
    char *line = json_dumps(row, JSON_COMPACT);
    fprintf(f, "%s\n", line);
    free(line);
    json_decref(row);
}

/* Runs `spill run model input` into dir; the response bodies by custom_id. */
static json_t *run_job(const char *model, const char *input, const char *dir)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf %s && %s run %s %s -o %s --quiet >/dev/null 2>&1", dir, bin(), model, input, dir);
    CHECK(sh(cmd, NULL) == 0, "%s failed", cmd);
    return results_by_id(dir);
}

static void test_binaries(const char *model, json_t *chats, json_t *hf_expected)
{
    char path[600], chat_in[600], comp_in[600], cmd[2048];
    snprintf(chat_in, sizeof chat_in, "%s/chat.jsonl", g_tmp);
    snprintf(comp_in, sizeof comp_in, "%s/completions.jsonl", g_tmp);
    FILE *fc = fopen(chat_in, "w"), *fp = fopen(comp_in, "w"); /* one endpoint per file */
    json_t *tmpl_ids = json_array(), *c;
    size_t i;
    json_array_foreach(chats, i, c)
    {
        json_t *msgs = json_object_get(c, "messages");
        snprintf(path, sizeof path, "%s/messages-%zu.json", g_tmp, i);
        json_t *doc = json_pack("{s:O}", "messages", msgs);
        json_dump_file(doc, path, 0);
        json_decref(doc);
        char *out = NULL;
        snprintf(cmd, sizeof cmd, "%s template %s %s --json", bin(), model, path);
        CHECK(sh(cmd, &out) == 0, "%s failed", cmd);
        json_t *o = out ? json_loads(out, 0, NULL) : NULL, *ids = json_object_get(o, "ids");
        free(out);
        CHECK(json_array_size(ids) > 0, "%s: no ids", cmd);
        if (!ids) { /* keep going with an empty prompt: the checks below then fail */
            if (!o)
                o = json_object();
            json_object_set_new(o, "ids", json_array());
            ids = json_object_get(o, "ids");
        }
        json_array_append(tmpl_ids, ids);
        if (hf_expected) /* the HF fixture: transformers' own ids */
            CHECK(json_equal(ids, json_object_get(json_array_get(json_object_get(hf_expected, "chats"), i), "ids")),
                  "%s: ids differ from transformers'", cmd);
        /* `spill tokenize` of the rendered text (no --special) gives the same ids */
        snprintf(path, sizeof path, "%s/prompt-%zu.txt", g_tmp, i);
        write_text(path, json_string_value(json_object_get(o, "prompt")) ?: "");
        snprintf(cmd, sizeof cmd, "%s tokenize %s - --json < %s", bin(), model, path);
        CHECK(sh(cmd, &out) == 0, "%s failed", cmd);
        json_t *tk = out ? json_loads(out, 0, NULL) : NULL;
        free(out);
        CHECK(json_equal(json_object_get(tk, "ids"), ids), "%s: tokenize ids differ from template's", cmd);
        json_decref(tk);
        char cid[32];
        snprintf(cid, sizeof cid, "c%zu", i);
        put_row(fc, cid, msgs, NULL);
        put_row(fp, cid, NULL, ids);
        json_decref(o);
    }
    fclose(fc);
    fclose(fp);
    char d1[600], d2[600];
    snprintf(d1, sizeof d1, "%s/out-chat", g_tmp);
    snprintf(d2, sizeof d2, "%s/out-completions", g_tmp);
    json_t *rc = run_job(model, chat_in, d1), *rp = run_job(model, comp_in, d2);
    for (i = 0; i < json_array_size(tmpl_ids); i++) {
        char cid[32];
        snprintf(cid, sizeof cid, "c%zu", i);
        json_t *ba = json_object_get(json_object_get(json_object_get(rc, cid), "response"), "body");
        json_t *bb = json_object_get(json_object_get(json_object_get(rp, cid), "response"), "body");
        json_t *ua = json_object_get(ba, "usage"), *ub = json_object_get(bb, "usage");
        json_int_t pa = json_integer_value(json_object_get(ua, "prompt_tokens"));
        size_t nt = json_array_size(json_array_get(tmpl_ids, i));
        CHECK(ba && bb, "%s %s: a row is missing from the results", model, cid);
        CHECK(pa == (json_int_t)nt &&
                  json_equal(json_object_get(ua, "prompt_tokens"), json_object_get(ub, "prompt_tokens")),
              "%s %s: run's chat prompt is %lld tokens, the template's %zu", model, cid, (long long)pa, nt);
        json_t *ca = json_array_get(json_object_get(ba, "choices"), 0);
        json_t *cb = json_array_get(json_object_get(bb, "choices"), 0);
        const char *ta = json_string_value(json_object_get(json_object_get(ca, "message"), "content"));
        const char *tb = json_string_value(json_object_get(cb, "text"));
        CHECK(ta && tb && !strcmp(ta, tb) &&
                  json_equal(json_object_get(ua, "completion_tokens"), json_object_get(ub, "completion_tokens")),
              "%s %s: the chat row answers '%s', the template's ids as a completions prompt '%s'", model, cid,
              ta ? ta : "?", tb ? tb : "?");
    }
    fprintf(stderr, "binaries on %s: %zu conversations, template = tokenize = run (chat row = its ids)\n", model,
            json_array_size(tmpl_ids));
    json_decref(rc);
    json_decref(rp);
    json_decref(tmpl_ids);
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    tzset();
    mkdir("tests/tmp", 0755);
    snprintf(g_tmp, sizeof g_tmp, "tests/tmp/prompt-%d", (int)getpid());
    CHECK(mkdir(g_tmp, 0755) == 0, "mkdir %s", g_tmp);
    char home[300];
    snprintf(home, sizeof home, "%s/home", g_tmp); /* the jobs' calibration stays out of the real $SPILL_HOME */
    setenv("SPILL_HOME", home, 1);
    test_chat_fixtures();
    test_hf_nobos();
    json_t *exp = load(HF_DIR "/expected.json");
    if (exp) {
        test_binaries(HF_DIR, json_object_get(exp, "chats"), exp);
        test_binaries(TINY_GGUF, json_object_get(exp, "chats"), NULL);
    }
    json_decref(exp);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (!test_failures)
        CHECK(sh(cmd, NULL) == 0, "%s", cmd);
    return test_finish("test_prompt");
}
