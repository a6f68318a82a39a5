/*
 * main.c — the `spill` command line: the command table and usage, the
 * commands that are a few lines of glue (models; tokenize and template, both
 * through the prompt path `spill run` uses, text/prompt.h), and dispatch to
 * every other command's X_main (run, resume, check, probe, pack, synth),
 * which parses its own arguments and returns its own exit code for main() to
 * return (bad arguments are 2 for every command).  Library code
 * never exits; only main() returns a status.
 *
 * Exit codes: base/exit.h (the README lists them).
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batch/bench.h"
#include "batch/check.h"
#include "model/arch.h"
#include "model/lora.h"
#include "model/hub.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/size.h"
#include "model/pack.h"
#include "model/quant.h"
#include "engine/cpu.h"
#include "engine/probe.h"
#include "model/synth.h"
#include "batch/eval.h"
#include "batch/run.h"
#include "batch/runs.h"
#include "serve/serve.h"
#include "text/prompt.h"
#include "base/exit.h"
#include "base/settings.h"
#include "base/util.h"


static const struct command {
    const char *name, *usage, *what;
    bool built;
} commands[] = {
    {"run", "spill run MODEL INPUT.jsonl [-o DIR] [OPTIONS]", "answer every row; OpenAI-format output + error files (--help: every option)", true},
    {"resume", "spill resume JOB [OPTIONS]", "continue an interrupted job exactly where it stopped", true},
    {"distill", "spill distill MODEL INPUT [OPTIONS]", "top-K log-probs (--logprobs K, --full-logits), or --score: teacher-forced log-probs of given answers", true},
    {"eval", "spill eval INPUT MODEL [MODEL...] --metric M [--metric M2...] [--judge MODEL] [--rerun] [-o DIR]",
     "run (or reuse) each model on an eval file, score every row, one comparison table", true},
    {"check", "spill check INPUT.jsonl [--all] [--endpoint URL]", "validate a batch / chat / fine-tuning / eval file",
     true},
    {"runs", "spill runs [show ID | rm ID... | clean --older-than DAYS [--dry-run]]",
     "list, inspect and clean the run store (every run, distill and eval job)", true},
    {"models", "spill models [show MODEL]", "curated tags, local models, architecture support", true},
    {"adapters", "spill adapters", "list the LoRA adapters under $SPILL_HOME/adapters (run one: MODEL+ADAPTER)", true},
    {"probe", "spill probe [--dir PATH] [--bytes N]", "measure RAM, disk read rate (page cache bypassed), GEMM rate",
     true},
    {"serve", "spill serve --model MODEL [--host H] [--port N] [--keys FILE] [--tls-cert F --tls-key F] [--max-upload SIZE]",
     "OpenAI Files + Batches HTTP API over the job store, with a status page at /", true},
    {"bench", "spill bench MODEL [OPTIONS]", "decode tok/s vs batch and tier beside each tier's limit; CSV, table, SVG", true},
    {"pack", "spill pack MODEL --quant q8|q4|none -o OUT.gguf|DIR", "repack into the streaming layout", true},
    {"synth", "spill synth --like NAME [--layers N] [--quant f16|bf16|q8|q4] [--seed N] [--sparse] -o PATH|DIR",
     "write a random-weight model of a real shape", true},
    {"tokenize", "spill tokenize MODEL TEXT|- [--json] [--special]", "token ids and pieces of a text", true},
    {"template", "spill template MODEL MESSAGES.json [--json]", "render the chat template and tokenize it", true},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage_all(FILE *f)
{
    fprintf(f, "usage: spill COMMAND [ARGS]   (spill COMMAND --help for one command)\n\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-52s %s%s\n", commands[i].usage, commands[i].what, commands[i].built ? "" : " [not built yet]");
    fprintf(f, "\nMODEL: a curated tag (spill models), a .gguf file, a Hugging Face directory, or org/name; BASE+ADAPTER adds a LoRA adapter.\n"
               "Data lives in $SPILL_HOME (default ~/.streamweights): models, jobs, runs, calibration.\n");
}

/* The options of the commands whose own parsers are a few lines (run, resume, distill, bench and eval print
 * theirs from their parsers' tables): `spill CMD --help` lists them one a line, and an argument that looks
 * like an option but is none of them is named before the command runs. */
typedef struct cmd_opt {
    const char *cmd, *name, *arg, *help;
} cmd_opt;
static const cmd_opt cmd_opts[] = {
    {"check", "--all", NULL, "report every bad line, not only the first"},
    {"check", "--endpoint", "URL", "every line's url must be URL, as in an OpenAI batch (default: any mix, as run takes)"},
    {"runs", "--older-than", "DAYS", "clean: remove the runs that ended more than DAYS ago"},
    {"runs", "--dry-run", NULL, "clean: list what would be removed, remove nothing"},
    {"probe", "--dir", "PATH", "measure the disk this directory is on (default $SPILL_HOME)"},
    {"probe", "--bytes", "N", "bytes written and read back for the disk rate (K, M or G suffix)"},
    {"synth", "--like", "NAME", "the real model whose shapes to copy (llama3-8b, llama3-70b, qwen2.5-7b, smollm2-135m, tiny)"},
    {"synth", "--layers", "N", "keep the first N layers"},
    {"synth", "--quant", "f16|bf16|q8|q4", "the weights' type"},
    {"synth", "--seed", "N", "the random weights' seed"},
    {"synth", "--sparse", NULL, "leave the layers' matrices as file holes (zeros that take no disk)"},
    {"synth", "-o", "PATH|DIR", "where the model goes"},
    {"pack", "--quant", "q8|q4|none", "requantize the weights (none: keep their types)"},
    {"pack", "-o", "OUT.gguf|DIR", "where the packed model goes"},
    {"tokenize", "--json", NULL, "print the ids and pieces as JSON"},
    {"tokenize", "--special", NULL, "apply the tokenizer's post-processor (BOS and the like), as a completions prompt is"},
    {"template", "--json", NULL, "print the rendered text and its ids as JSON"},
    {"serve", "--model", "MODEL", "a model batches run on (repeatable; a batch's body.model picks one, else the first)"},
    {"serve", "--host", "ADDR", "the IPv4 address to listen on (default 127.0.0.1; another needs --keys)"},
    {"serve", "--port", "N", "the TCP port (default 8000)"},
    {"serve", "--keys", "FILE", "bearer keys, one a line (the file must not be world-readable)"},
    {"serve", "--tls-cert", "FILE", "PEM certificate: serve HTTPS (with --tls-key)"},
    {"serve", "--tls-key", "FILE", "PEM private key of --tls-cert"},
    {"serve", "--max-upload", "SIZE", "largest upload, K/M/G suffixes (default 200M); above it 413"},
};
#define N_CMD_OPTS (sizeof cmd_opts / sizeof cmd_opts[0])

static const cmd_opt *cmd_opt_find(const char *cmd, const char *name)
{
    for (size_t i = 0; i < N_CMD_OPTS; i++)
        if (!strcmp(cmd_opts[i].cmd, cmd) && !strcmp(cmd_opts[i].name, name))
            return &cmd_opts[i];
    return NULL;
}

static int usage_one(const char *name, int code)
{
    FILE *f = code ? stderr : stdout;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name)) {
            fprintf(f, "usage: %s\n", commands[i].usage);
            if (code)
                return code;
            fprintf(f, "  %s\n\noptions:\n", commands[i].what);
            for (size_t k = 0; k < N_CMD_OPTS; k++) {
                const cmd_opt *o = &cmd_opts[k];
                char spell[64];
                if (strcmp(o->cmd, name))
                    continue;
                snprintf(spell, sizeof spell, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
                fprintf(f, "  %-26s %s\n", spell, o->help);
            }
            fprintf(f, "  %-26s %s\n", "--help, -h", "this list");
            return code;
        }
    return code;
}

/* An argument of cmd that looks like an option ("--x", or "-" and one letter) but is not one of its options
 * (the value after an option that takes one is skipped); NULL when there is none. */
static const char *unknown_option(const char *cmd, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool looks = !strncmp(a, "--", 2) || (a[0] == '-' && ((a[1] >= 'a' && a[1] <= 'z') || (a[1] >= 'A' && a[1] <= 'Z')) && !a[2]);
        if (!looks)
            continue;
        const cmd_opt *o = cmd_opt_find(cmd, a);
        if (!o)
            return a;
        if (o->arg)
            i++;
    }
    return NULL;
}

static bool wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return true;
    return false;
}

/* Resolves and opens a model, printing the one-sentence error on failure. */
static model_desc *open_model(const char *spec, int *code)
{
    char path[4096], err[SPILL_ERRLEN];
    model_desc *m;
    int rc = model_resolve(spec, path, sizeof path, err, sizeof err);
    if (rc != 0 || model_open(path, &m, err, sizeof err) != 0) {
        fprintf(stderr, "spill: %s\n", err);
        if (code)
            *code = rc ? model_resolve_exit(rc) : SPILL_EX_DATAERR;
        return NULL;
    }
    return m;
}

/* spill adapters: one line per adapter directory under $SPILL_HOME/adapters/ (model/lora.c). */
static int cmd_adapters(int argc, char **argv)
{
    (void)argv;
    if (argc != 0)
        return usage_one("adapters", SPILL_EX_USAGE);
    char err[SPILL_ERRLEN];
    if (lora_list(stdout, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        return SPILL_EX_IOERR;
    }
    return SPILL_EX_OK;
}

/* "bf16 1.2 GB  q8 640 MB  q4 380 MB" — the sizes per quant from the shapes (model/size.h). */
static void print_sizes(const model_shape *s, FILE *f, bool columns)
{
    for (int q = 0; q < SIZE_N_QUANTS; q++) {
        if (q == SIZE_FP8 && columns)
            break;
        char b[32];
        size_human(model_size_estimate(s, (enum size_quant)q), b, sizeof b);
        if (columns)
            fprintf(f, " %9s", b);
        else
            fprintf(f, "%s%s %s", q ? ", " : "", size_quant_name((enum size_quant)q), b);
    }
}

static const char *state_word(enum arch_state st)
{
    return st == ARCH_SUPPORTED ? "supported" : st == ARCH_EXPECTED ? "expected" : "unsupported";
}

/* Bytes of the regular files directly in dir. */
static uint64_t dir_bytes(const char *dir)
{
    uint64_t n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4096];
    struct stat st;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && util_pathf(p, sizeof p, "%s/%s", dir, e->d_name) == 0 && stat(p, &st) == 0 &&
            S_ISREG(st.st_mode))
            n += (uint64_t)st.st_size;
    if (d)
        closedir(d);
    return n;
}

/* The models under $SPILL_HOME/models/hf/ (downloaded or copied): one line each, GGUF files one line each. */
static void list_local(void)
{
    char root[4096];
    if (util_pathf(root, sizeof root, "%s/models/hf", util_spill_home()) != 0)
        return;
    DIR *d = opendir(root);
    struct dirent *e;
    bool any = false;
    while (d && (e = readdir(d))) {
        char dir[4096], p[4096], name[512];
        const char *sep = strstr(e->d_name, "--");
        if (e->d_name[0] == '.' || !sep || util_pathf(dir, sizeof dir, "%s/%s", root, e->d_name) || !util_is_dir(dir))
            continue;
        snprintf(name, sizeof name, "%.*s/%s", (int)(sep - e->d_name), e->d_name, sep + 2);
        if (!any)
            printf("\nlocal models (in %s; sizes per quant from config.json):\n", root);
        any = true;
        bool pending = util_pathf(p, sizeof p, "%s/.spill-download", dir) == 0 && util_is_file(p);
        char disk[32];
        size_human(dir_bytes(dir), disk, sizeof disk);
        json_t *cfg = util_pathf(p, sizeof p, "%s/config.json", dir) == 0 ? json_load_file(p, 0, NULL) : NULL;
        model_shape s;
        if (cfg && model_shape_from_config(cfg, p, &s, NULL, 0) == 0) {
            printf("  %-44s %-10s %-11s", name, s.arch, state_word(model_arch_state(s.arch, NULL)));
            print_sizes(&s, stdout, true);
            printf("  %s on disk%s\n", disk, pending ? ", download unfinished (run it again to resume)" : "");
        }
        json_decref(cfg);
        DIR *g = opendir(dir);
        struct dirent *ge;
        while (g && (ge = readdir(g))) {
            size_t l = strlen(ge->d_name);
            struct stat st;
            if (l > 5 && !strcmp(ge->d_name + l - 5, ".gguf") && util_pathf(p, sizeof p, "%s/%s", dir, ge->d_name) == 0 &&
                stat(p, &st) == 0) {
                size_human((uint64_t)st.st_size, disk, sizeof disk);
                printf("  %-44s gguf file   %s\n", ge->d_name, disk);
            }
        }
        if (g)
            closedir(g);
    }
    if (d)
        closedir(d);
}

/* spill models show MODEL for a model that is not here: its architecture's state and sizes per quant, from the
 * curated tag's shapes or the hub's config.json (nothing else is downloaded). */
static int show_remote(const char *spec)
{
    const registry_entry *e = registry_find(spec);
    json_t *cfg = NULL;
    char err[SPILL_ERRLEN], where[512];
    hub_ref r;
    if (e && e->config) {
        cfg = json_loads(e->config, 0, NULL);
        snprintf(where, sizeof where, "%s (curated tag: %s%s%s)", spec, e->hf_repo, e->file ? ", " : "",
                 e->file ? e->file : "");
    } else if (hub_parse(spec, &r) && !r.quant[0]) {
        if (hub_offline()) {
            fprintf(stderr, "spill: %s is not downloaded and HF_HUB_OFFLINE is set; unset it to read its config.json "
                            "from the hub, or copy the repository to %s.\n", spec, r.dir);
            return SPILL_EX_NOINPUT;
        }
        int rc = hub_fetch_config(&r, &cfg, err, sizeof err);
        if (rc) {
            fprintf(stderr, "spill: %s\n", err);
            return model_resolve_exit(rc);
        }
        snprintf(where, sizeof where, "%s (the hub's config.json, rev %s)", r.repo, r.rev);
    } else {
        char path[4096];
        int rc = model_resolve(spec, path, sizeof path, err, sizeof err); /* says why it names nothing */
        fprintf(stderr, "spill: %s\n", rc ? err : "the model could not be described.");
        return rc ? model_resolve_exit(rc) : SPILL_EX_DATAERR;
    }
    model_shape s;
    if (!cfg || model_shape_from_config(cfg, where, &s, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", cfg ? err : "the curated tag's shapes do not parse (a bug).");
        json_decref(cfg);
        return SPILL_EX_DATAERR;
    }
    json_decref(cfg);
    const char *note;
    enum arch_state st = model_arch_state(s.arch, &note);
    printf("model        %s\n", where);
    printf("state        not downloaded%s\n", e && e->gated ? " (gated: set HF_TOKEN)" : "");
    printf("architecture %s (%s: %s)\n", s.arch, state_word(st), note);
    printf("dims         L=%d D=%d H=%d K=%d S=%d F=%d V=%d", s.n_layers, s.d_model, s.n_heads, s.n_kv_heads,
           s.head_dim, s.ffn_dim, s.vocab);
    if (s.n_experts)
        printf(" E=%d FE=%d (%d sparse layers)", s.n_experts, s.expert_ffn_dim, s.n_sparse_layers);
    printf("\nweights      %.3gB: ", (double)model_param_count(&s) / 1e9);
    print_sizes(&s, stdout, false);
    printf(" (estimated from the shapes)\n");
    return SPILL_EX_OK;
}

static int cmd_models(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[0], "show")) {
        if (argc != 2)
            return usage_one("models", SPILL_EX_USAGE);
        char path[4096], err[SPILL_ERRLEN];
        if (model_find_local(argv[1], path, sizeof path) != 0)
            return show_remote(argv[1]);
        model_desc *m;
        if (model_open(path, &m, err, sizeof err) != 0) {
            fprintf(stderr, "spill: %s\n", err);
            return SPILL_EX_DATAERR;
        }
        model_print(m, stdout);
        if (m->n_layers > 0) {
            model_shape s;
            model_shape_from_desc(m, &s);
            printf("per quant    ");
            print_sizes(&s, stdout, false);
            printf(" (estimated from the shapes)\n");
        }
        model_close(m);
        return 0;
    }
    if (argc != 0)
        return usage_one("models", SPILL_EX_USAGE);
    printf("curated models (in %s/models; sizes per quant estimated from each config's shapes):\n",
           util_spill_home());
    printf("  %-16s %-10s %-6s %9s %9s %9s  %-38s %s\n", "TAG", "ARCH", "PARAMS", "BF16", "Q8", "Q4", "REPO", "STATE");
    const registry_entry *e;
    for (size_t i = 0; registry_at(i, &e); i++) {
        char path[4096];
        bool here = model_find_local(e->tag, path, sizeof path) == 0;
        printf("  %-16s %-10s %-6s", e->tag, e->arch, e->params);
        json_t *cfg = e->config ? json_loads(e->config, 0, NULL) : NULL;
        model_shape s;
        if (cfg && model_shape_from_config(cfg, e->tag, &s, NULL, 0) == 0)
            print_sizes(&s, stdout, true);
        else
            printf(" %9s %9s %9s", "?", "?", "?");
        json_decref(cfg);
        printf("  %-38s %s\n", e->hf_repo,
               here ? (e->package ? "installed" : "downloaded")
               : e->package ? "not installed (tools/setup.sh)"
               : e->gated   ? "on the hub, gated (HF_TOKEN)"
                            : "on the hub");
    }
    list_local();
    printf("\narchitectures:\n");
    const char *name, *note;
    enum arch_state st;
    for (size_t i = 0; model_arch_at(i, &name, &st, &note); i++)
        printf("  %-12s %-11s %s\n", name, state_word(st), note);
    return 0;
}

/* Loads the tokenizer that belongs to a model (the shared prompt path's: GGUF vocabulary or tokenizer.json). */
static tokenizer *open_tokenizer(const model_desc *m)
{
    char err[SPILL_ERRLEN];
    tokenizer *t = NULL;
    if (prompt_open_tokenizer(m, &t, err, sizeof err) != 0) {
        fprintf(stderr, "spill: %s\n", err);
        return NULL;
    }
    return t;
}

static char *read_stdin_all(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (n < cap)
            break;
        if (cap > (256u << 20)) {
            free(buf);
            return NULL;
        }
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf)
        buf[n] = 0;
    *len = n;
    return buf;
}

static void print_ids(const tokenizer *t, const int32_t *ids, size_t n, bool json)
{
    if (json) {
        json_t *arr = json_array(), *pieces = json_array();
        for (size_t i = 0; i < n; i++) {
            size_t pl;
            const char *p = tokenizer_piece(t, ids[i], &pl);
            json_array_append_new(arr, json_integer(ids[i]));
            json_array_append_new(pieces, json_stringn_nocheck(p ? p : "", p ? pl : 0));
        }
        json_t *o = json_pack("{s:o,s:o,s:I}", "ids", arr, "pieces", pieces, "count", (json_int_t)n);
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(s);
        free(s);
        json_decref(o);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = tokenizer_piece(t, ids[i], &pl);
        printf("%d\t", ids[i]);
        for (size_t k = 0; p && k < pl; k++) {
            unsigned char c = (unsigned char)p[k];
            if (c == '\n')
                fputs("\\n", stdout);
            else if (c == '\t')
                fputs("\\t", stdout);
            else if (c < 0x20 || c == 0x7f)
                printf("\\x%02x", c);
            else
                putchar(c);
        }
        putchar('\n');
    }
    printf("%zu tokens\n", n);
}

static int cmd_tokenize(int argc, char **argv)
{
    bool json = false, special = false;
    const char *pos[2];
    int np = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--special"))
            special = true;
        else if (np < 2 && (argv[i][0] != '-' || !strcmp(argv[i], "-")))
            pos[np++] = argv[i];
        else
            return usage_one("tokenize", SPILL_EX_USAGE);
    }
    if (np != 2)
        return usage_one("tokenize", SPILL_EX_USAGE);
    int code = SPILL_EX_DATAERR;
    model_desc *m = open_model(pos[0], &code);
    if (!m)
        return code;
    tokenizer *t = open_tokenizer(m);
    int rc = SPILL_EX_DATAERR;
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[SPILL_ERRLEN];
    if (!t)
        goto out;
    if (!strcmp(pos[1], "-")) {
        text = read_stdin_all(&len);
        if (!text) {
            fprintf(stderr, "spill: standard input could not be read (or is over 256 MiB).\n");
            rc = SPILL_EX_NOINPUT;
            goto out;
        }
    } else {
        text = strdup(pos[1]);
        len = strlen(pos[1]);
    }
    prompt_src ps = {m, t, NULL}; /* --special: what `spill run` feeds for a /v1/completions string prompt */
    if (prompt_text(&ps, text, len, special, &ids, &n, err, sizeof err) != 0) {
        fprintf(stderr, "spill: %s\n", err);
        goto out;
    }
    print_ids(t, ids, n, json);
    rc = 0;
out:
    free(ids);
    free(text);
    tokenizer_free(t);
    model_close(m);
    return rc;
}

static int cmd_template(int argc, char **argv)
{
    bool json = false;
    const char *pos[2];
    int np = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (np < 2 && argv[i][0] != '-')
            pos[np++] = argv[i];
        else
            return usage_one("template", SPILL_EX_USAGE);
    }
    if (np != 2)
        return usage_one("template", SPILL_EX_USAGE);
    json_error_t je;
    json_t *doc = json_load_file(pos[1], JSON_REJECT_DUPLICATES, &je);
    if (!doc) {
        fprintf(stderr, "spill: %s: line %d, column %d: %s.\n", pos[1], je.line, je.column, je.text);
        return SPILL_EX_DATAERR;
    }
    /* Accept a bare messages array or an object with "messages" (a chat request body or fine-tuning line). */
    json_t *messages = json_is_array(doc) ? doc : json_object_get(doc, "messages");
    json_t *tools = json_is_object(doc) ? json_object_get(doc, "tools") : NULL;
    if (!json_is_array(messages)) {
        fprintf(stderr, "spill: %s: expected a JSON array of messages or an object with a \"messages\" array.\n",
                pos[1]);
        json_decref(doc);
        return SPILL_EX_DATAERR;
    }
    int rc = SPILL_EX_DATAERR;
    char *out = NULL;
    size_t outlen = 0, n = 0;
    int32_t *ids = NULL;
    char err[SPILL_ERRLEN];
    tokenizer *t = NULL;
    tmpl_t *tm = NULL;
    model_desc *m = open_model(pos[0], &rc);
    if (!m)
        goto done;
    if (!m->chat_template) {
        fprintf(stderr, "spill: %s has no chat template; give raw prompts through /v1/completions instead.\n",
                m->source);
        goto done;
    }
    if (!(t = open_tokenizer(m)))
        goto done;
    if (prompt_open_template(m, &tm, err, sizeof err) != 0) {
        fprintf(stderr, "spill: %s\n", err);
        goto done;
    }
    /* the path `spill run` takes for a chat row: its special tokens, add_generation_prompt, no added BOS */
    prompt_src ps = {m, t, tm};
    if (prompt_chat(&ps, messages, tools, true, 0, &out, &outlen, &ids, &n, err, sizeof err) != 0) {
        fprintf(stderr, "spill: %s\n", err);
        goto done;
    }
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, json_integer(ids[i]));
        json_t *o = json_pack("{s:s%,s:o}", "prompt", out, outlen, "ids", arr);
        char *s = json_dumps(o, JSON_COMPACT);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        fwrite(out, 1, outlen, stdout);
        printf("\n--- %zu tokens:", n);
        for (size_t i = 0; i < n; i++)
            printf(" %d", ids[i]);
        putchar('\n');
    }
    rc = 0;
done:
    free(ids);
    free(out);
    template_free(tm);
    tokenizer_free(t);
    model_close(m);
    json_decref(doc);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_all(stderr);
        return SPILL_EX_USAGE;
    }
    /* the environment's diagnostic switches, read once here (base/settings.h) */
    spill_settings st;
    char err[SPILL_ERRLEN];
    if (settings_from_env(&st, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        return SPILL_EX_USAGE;
    }
    if (st.no_simd)
        quant_simd_force(false);
    if (st.no_vnni)
        cpu_q8_vnni_force(0);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage_all(stdout);
        return 0;
    }
    if (!strcmp(cmd, "worker")) /* hidden: spill serve's resident runner (run_worker.c) */
        return worker_main(argc - 2, argv + 2);
    const struct command *c = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, cmd))
            c = &commands[i];
    if (!c) {
        fprintf(stderr, "spill: unknown command '%s'.\n", cmd);
        usage_all(stderr);
        return SPILL_EX_USAGE;
    }
    if (wants_help(argc - 2, argv + 2)) {
        if (!strcmp(cmd, "run") || !strcmp(cmd, "resume") || !strcmp(cmd, "distill")) {
            /* every option, from the parser's own table */
            run_opts_help(stdout, !strcmp(cmd, "resume"), !strcmp(cmd, "distill"));
            return 0;
        }
        if (!strcmp(cmd, "bench")) {
            bench_help(stdout);
            return 0;
        }
        if (!strcmp(cmd, "eval")) { /* its usage lists the metrics and the options passed to each run */
            char *h[] = {(char *)"--help", NULL};
            return eval_main(1, h);
        }
        return usage_one(cmd, 0);
    }
    static const char *const own_parsers[] = {"run", "resume", "distill", "bench", "eval", "serve"};
    bool own = false;
    for (size_t i = 0; i < sizeof own_parsers / sizeof own_parsers[0]; i++)
        own |= !strcmp(cmd, own_parsers[i]);
    const char *bad = own ? NULL : unknown_option(cmd, argc - 2, argv + 2);
    if (bad) {
        fprintf(stderr, "spill: %s is not an option of spill %s; spill %s --help lists them.\n", bad, cmd, cmd);
        return usage_one(cmd, SPILL_EX_USAGE);
    }
    if (!c->built) {
        fprintf(stderr, "spill: '%s' is not built yet in this version; see `spill --help` for what works now.\n", cmd);
        return SPILL_EX_UNAVAILABLE;
    }
    if (!strcmp(cmd, "models"))
        return cmd_models(argc - 2, argv + 2);
    if (!strcmp(cmd, "adapters"))
        return cmd_adapters(argc - 2, argv + 2);
    if (!strcmp(cmd, "runs"))
        return runs_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "eval"))
        return eval_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize"))
        return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "template"))
        return cmd_template(argc - 2, argv + 2);
    if (!strcmp(cmd, "run"))
        return run_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "resume"))
        return resume_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "distill"))
        return distill_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "probe"))
        return probe_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "pack"))
        return pack_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "synth"))
        return synth_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "check"))
        return check_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench"))
        return bench_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve"))
        return serve_main(argc - 2, argv + 2);
    return usage_one(cmd, SPILL_EX_USAGE);
}
