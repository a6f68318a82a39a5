/*
 * run_opts.c — every setting of `spill run` / `spill resume`, read once:
 * the command line into run_opts, the subset a job's manifest keeps, that
 * subset read back on resume (the job store reads the manifest, job.c), and
 * the defaults.  Nothing else in the runner parses an option or reads a
 * stored one; --mem-budget, for one, is read here and handed to the plan.
 *
 * Resume rule: what the resume command line sets wins (--threads, --quiet,
 * …); everything else comes back as the job started, so a resumed job plans
 * the same memory and runs the same batch.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_internal.h"
#include "runs.h"
#include "spec.h"
#include "../base/util.h"

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0)
        return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024;
    else if (*end)
        return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

/* A whole number for option `name` into *out; -1 with a sentence on stderr when it is not one. */
static int parse_int(const char *name, const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < INT32_MIN || v > INT32_MAX) {
        fprintf(stderr, "spill: %s takes a whole number, not \"%.40s\".\n", name, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Every option of spill run (and resume, but -o): the parser reads this table and --help prints it, so the
 * two cannot drift apart. */
/* OPT_CHOICE: one of the words its arg lists ("on|off"), stored as the word's place from 1 (0 stays "unset") */
/* OPT_SPECULATE: lookup, off (OPT_CHOICE's places 1, 2) or draft:MODEL (3, the model into draft_spec) */
enum opt_kind { OPT_INT, OPT_BYTES, OPT_STR, OPT_TRUE, OPT_SET, OPT_KV_DTYPE, OPT_CHOICE, OPT_SPECULATE };
typedef struct run_opt {
    const char *name, *alt; /* spelling, and another one or NULL */
    const char *arg;        /* the value's name in --help, NULL for a flag */
    enum opt_kind kind;
    size_t off; /* the run_opts field it sets */
    int val;    /* OPT_SET: the value stored */
    bool run_only;
    const char *help;
    bool distill_only; /* spill distill's own (its --help lists them first) */
} run_opt;
#define OFF(f) offsetof(run_opts, f)
static const run_opt opts[] = {
    {"--logprobs", NULL, "K", OPT_INT, OFF(distill_k), 0, true,
     "top log-probs per answer token, K <= 64 (OpenAI's shape up to 20; the rest in more_top_logprobs)", true},
    {"--full-logits", NULL, NULL, OPT_TRUE, OFF(full_logits), 0, true,
     "every answer token's logits as float16 DIR/logits/<custom_id>.npy (tokens x vocab)", true},
    {"--max-logits-bytes", NULL, "BYTES", OPT_BYTES, OFF(max_logits_bytes), 0, true,
     "refuse --full-logits jobs whose files would exceed this (default: the free disk)", true},
    {"--score", NULL, NULL, OPT_TRUE, OFF(score), 0, true,
     "teacher-forced log-probs of each row's final assistant message (+ end of turn); no generation", true},
    {"-o", NULL, "DIR", OPT_STR, OFF(out_dir), 0, true, "the job's directory (default: a new job under $SPILL_HOME/jobs)", false},
    {"--quant", NULL, "bf16|q8|q4|fp8|auto", OPT_STR, OFF(quant), 0, true,
     "weights as this format (default: the file's own; a requantized copy is cached under $SPILL_HOME/cache)", false},
    {"--batch", NULL, "N", OPT_INT, OFF(batch), 0, false, "rows decoded together per pass (default: what memory allows)", false},
    {"--threads", NULL, "N", OPT_INT, OFF(threads), 0, false, "CPU threads (default: every core)", false},
    {"--prefill-chunk", NULL, "N", OPT_INT, OFF(prefill_chunk), 0, false,
     "prompt tokens a pass takes, a constant (default: adapted to the layer copy when streaming)", false},
    {"--page-tokens", NULL, "N", OPT_INT, OFF(page_tokens), 0, false, "positions per KV page (default 16)", false},
    {"--kv-mem", NULL, "BYTES", OPT_BYTES, OFF(kv_bytes), 0, false, "memory for KV pages (K, M or G suffix)", false},
    {"--mem-budget", NULL, "BYTES", OPT_BYTES, OFF(mem_budget), 0, false,
     "the whole job's host memory (default: 90% of what is available)", false},
    {"--stream", NULL, NULL, OPT_SET, OFF(mode), 1, false, "stream the layers from storage every pass", false},
    {"--resident", NULL, NULL, OPT_SET, OFF(mode), 2, false, "hold every layer in RAM (refused when it does not fit)", false},
    {"--stream-slots", NULL, "N", OPT_INT, OFF(stream_slots), 0, false, "layers read ahead while streaming (default 3)", false},
    {"--q8-activations", NULL, NULL, OPT_TRUE, OFF(q8), 0, false,
     "CPU: quantized weights multiply 8-bit activations (faster for small batches, not exact)", false},
    {"--exact", NULL, NULL, OPT_TRUE, OFF(exact), 0, false, "CPU: fp32 activations (the default)", false},
    {"--cpu", NULL, NULL, OPT_SET, OFF(device), 1, false, "run on the CPU engine", false},
    {"--gpu", NULL, NULL, OPT_SET, OFF(device), 2, false, "run on the GPU (a CUDA build)", false},
    {"--gpu-mem", NULL, "BYTES", OPT_BYTES, OFF(gpu_mem), 0, false, "GPU: HBM to plan with (default: all free)", false},
    {"--resident-layers", NULL, "N", OPT_INT, OFF(resident_layers), 0, false,
     "GPU: layers kept in HBM when streaming (default: the planner's choice)", false},
    {"--from-disk", NULL, NULL, OPT_TRUE, OFF(from_disk), 0, false,
     "GPU: read streamed layers from storage every pass (no pinned RAM copy)", false},
    {"--kv-dtype", NULL, "bf16|int8", OPT_KV_DTYPE, OFF(kv_dtype), 0, false,
     "GPU: KV pages in bf16 (default) or int8 (twice the rows per GB)", false},
    {"--prefix-cache", NULL, "on|off", OPT_CHOICE, OFF(prefix_cache), 0, false,
     "rows whose prompts start alike share the KV pages of that prefix, computed once (default on)", false},
    {"--speculate", NULL, "lookup|off|draft:MODEL", OPT_SPECULATE, OFF(speculate), 0, false,
     "speculative passes: rows also verify tokens proposed from their own text (lookup) or by a small model with "
     "the same vocabulary (draft:MODEL) (default off)", false},
    {"--spec-k", NULL, "N", OPT_INT, OFF(spec_k), 0, false, "most tokens proposed per row per pass (default 4)", false},
    {"--pooling", NULL, "last|mean|cls", OPT_STR, OFF(pooling), 0, true,
     "/v1/embeddings rows: pool this way, whatever the model's files say (default: theirs, else last)", false},
    {"--matryoshka", NULL, NULL, OPT_TRUE, OFF(matryoshka), 0, true,
     "/v1/embeddings rows may ask for fewer dimensions (the model was trained for truncated embeddings)", false},
    {"--pass-log", NULL, "FILE", OPT_STR, OFF(pass_log), 0, false, "a CSV line per pass (rows, tokens, seconds)", false},
    {"--status-port", NULL, "N", OPT_INT, OFF(status_port), 0, false,
     "a status page for this job on 127.0.0.1:N (its URL, with a key, is printed at the start)", false},
    {"--quiet", "-q", NULL, OPT_TRUE, OFF(quiet), 0, false, "no progress line", false},
};
#undef OFF

void run_opts_help(FILE *f, bool resume, int cmd)
{
    fprintf(f, resume ? "usage: spill resume JOB_DIR|JOB_ID [OPTIONS]\n  continue an interrupted job exactly where it "
                        "stopped (the job's own options, unless given again)\n\noptions:\n"
               : cmd == 1 ? "usage: spill distill MODEL INPUT.jsonl [OPTIONS]\n  answers with top-K log-probs per token "
                            "(and full logits), or --score: log-probs of given assistant turns\n\noptions:\n"
                          : "usage: spill run MODEL INPUT.jsonl [OPTIONS]\n  answer every row; OpenAI-format output and error "
                            "files in the job's directory\n\noptions:\n");
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        const run_opt *d = &opts[i];
        if ((resume && d->run_only) || (d->distill_only && cmd != 1))
            continue;
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", d->name, d->alt ? ", " : "", d->alt ? d->alt : "", d->arg ? " " : "",
                 d->arg ? d->arg : "");
        fprintf(f, "  %-26s %s\n", left, d->help);
    }
    fprintf(f, "  %-26s %s\n", "--help, -h", "this list");
}

/* Applies option d to o from argv[*i] (and its value, argv[*i + 1]); -1 with a sentence on stderr. */
static int apply_opt(const run_opt *d, int argc, char **argv, int *i, run_opts *o)
{
    char *field = (char *)o + d->off;
    if (d->arg && *i + 1 >= argc) {
        fprintf(stderr, "spill: %s needs a value (%s).\n", argv[*i], d->arg);
        return -1;
    }
    const char *v = d->arg ? argv[++*i] : NULL;
    switch (d->kind) {
    case OPT_INT:
        return parse_int(d->name, v, (int *)field);
    case OPT_BYTES:
        if (parse_bytes(v, (uint64_t *)field)) {
            fprintf(stderr, "spill: %s takes a size in bytes (a number, optionally with K, M or G), not \"%.40s\".\n",
                    d->name, v);
            return -1;
        }
        return 0;
    case OPT_STR:
        *(const char **)field = v;
        return 0;
    case OPT_TRUE:
        *(bool *)field = true;
        return 0;
    case OPT_SET:
        *(int *)field = d->val;
        return 0;
    case OPT_KV_DTYPE:
        if (strcmp(v, "bf16") && strcmp(v, "int8")) {
            fprintf(stderr, "spill: --kv-dtype takes bf16 (the GPU's default) or int8 (twice the rows per GB of "
                            "KV), not \"%s\".\n", v);
            return -1;
        }
        *(int *)field = !strcmp(v, "int8") ? KV_I8 : KV_BF16;
        return 0;
    case OPT_SPECULATE:
        if (!strncmp(v, "draft:", 6)) {
            if (!v[6]) {
                fprintf(stderr, "spill: --speculate draft: needs the draft model after the colon (draft:MODEL).\n");
                return -1;
            }
            *(int *)field = 3;
            o->draft_spec = v + 6;
            return 0;
        }
        /* lookup or off, by their places */
        __attribute__((fallthrough));
    case OPT_CHOICE: {
        size_t vl = strlen(v);
        int place = 1;
        for (const char *w = d->arg; *w; place++) {
            size_t wl = strcspn(w, "|");
            if (wl == vl && !strncmp(w, v, vl)) {
                *(int *)field = place;
                return 0;
            }
            w += wl + (w[wl] == '|');
        }
        char words[96] = "";
        for (const char *w = d->arg; *w && strlen(words) < sizeof words - 12; w++)
            *w == '|' ? strcat(words, " or ") : strncat(words, w, 1);
        fprintf(stderr, "spill: %s takes %s, not \"%.40s\".\n", d->name, words, v);
        return -1;
    }
    }
    return -1;
}

int run_parse_opts(int argc, char **argv, run_opts *o, bool resume)
{
    o->resident_layers = -1;
    const char *pos[2];
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const run_opt *d = NULL;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !d; k++)
            if ((!strcmp(a, opts[k].name) || (opts[k].alt && !strcmp(a, opts[k].alt))) &&
                !(resume && opts[k].run_only) && !(opts[k].distill_only && o->cmd != 1))
                d = &opts[k];
        if (d) {
            if (apply_opt(d, argc, argv, &i, o))
                return -1;
        }
        else if (a[0] != '-' && np < 2)
            pos[np++] = a;
        else {
            if (a[0] == '-')
            {
                const char *cn = resume ? "resume" : o->cmd == 1 ? "distill" : "run";
                fprintf(stderr, "spill: %s is not an option of spill %s; spill %s --help lists them.\n", a, cn, cn);
            }
            return -1;
        }
    }
    if (np != (resume ? 1 : 2) || o->batch < 0 || o->prefill_chunk < 0 || o->page_tokens < 0 || o->threads < 0)
        return -1;
    if (o->spec_k < 0 || o->spec_k > SPEC_K_MAX) {
        fprintf(stderr, "spill: --spec-k takes 1 to %d proposed tokens per row per pass, not %d.\n", SPEC_K_MAX,
                o->spec_k);
        return -1;
    }
    if (o->pooling && strcmp(o->pooling, "last") && strcmp(o->pooling, "mean") && strcmp(o->pooling, "cls")) {
        fprintf(stderr, "spill: --pooling takes last, mean or cls, not \"%.40s\".\n", o->pooling);
        return -1;
    }
    if (o->quant && !run_quant_valid(o->quant)) {
        fprintf(stderr, "spill: --quant %s: give bf16, q8, q4, fp8 or auto.\n", o->quant);
        return -1;
    }
    if (o->cmd == 1 && (o->distill_k < -1 || o->distill_k > SAMPLE_MAX_TOP)) {
        fprintf(stderr, "spill: --logprobs takes 0 to %d alternatives per token, not %d.\n", SAMPLE_MAX_TOP,
                o->distill_k);
        return -1;
    }
    /* the environment's diagnostic switches, read once into the options (base/settings.h) */
    char err[SPILL_ERRLEN];
    if (settings_from_env(&o->settings, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        return -1;
    }
    if (resume)
        o->out_dir = pos[0];
    else
        o->model_spec = pos[0], o->input = pos[1];
    return 0;
}

json_t *run_opts_json(const run_opts *o)
{
    json_t *j = json_pack("{s:i,s:i,s:i,s:i,s:I,s:I,s:I,s:i,s:i,s:b,s:b,s:b,s:b,s:i,s:s}", "threads", o->threads,
                          "batch", o->batch, "prefill_chunk", o->prefill_chunk, "page_tokens", o->page_tokens,
                          "kv_bytes", (json_int_t)o->kv_bytes, "mem_budget", (json_int_t)o->mem_budget, "gpu_mem",
                          (json_int_t)o->gpu_mem, "mode", o->mode, "stream_slots", o->stream_slots, "quiet", o->quiet,
                          "exact", o->exact, "q8_activations", o->q8, "from_disk", o->from_disk, "kv_dtype",
                          o->kv_dtype, "model", o->model_spec);
    if (j && (json_object_set_new(j, "prefix_cache", json_boolean(o->prefix_cache != 2)) ||
              json_object_set_new(j, "speculate", o->speculate == 3 ? json_sprintf("draft:%s", o->draft_spec)
                                                  : json_string(o->speculate == 1 ? "lookup" : "off")) ||
              json_object_set_new(j, "spec_k", json_integer(o->spec_k)) ||
              json_object_set_new(j, "prefill_auto", json_boolean(o->prefill_auto)))) {
        json_decref(j);
        return NULL;
    }
    if (j && (json_object_set_new(j, "matryoshka", json_boolean(o->matryoshka)) ||
              (o->pooling && json_object_set_new(j, "pooling", json_string(o->pooling))))) {
        json_decref(j);
        return NULL;
    }
    if (j && o->quant && json_object_set_new(j, "quant", json_string(o->quant))) {
        json_decref(j);
        return NULL;
    }
    if (j && o->cmd == 1 &&
        json_object_set_new(j, "distill",
                            json_pack("{s:i,s:b,s:b,s:I}", "logprobs", o->distill_k, "full_logits", o->full_logits,
                                      "score", o->score, "max_logits_bytes", (json_int_t)o->max_logits_bytes))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

int run_resume_opts(run_opts *o, char *dir, size_t dircap, job_stored *st, char *err, size_t errlen)
{
    /* the directory, or a run id: $SPILL_HOME/jobs/<id>, or the run linked from $SPILL_HOME/runs/<id> */
    if (runs_resolve(o->out_dir, dir, dircap, err, errlen))
        return -1;
    o->out_dir = dir;
    int rc = job_read_stored(dir, st, err, errlen);
    if (rc)
        return rc;
    o->model_spec = st->model_id;
    o->input = st->input_path;
    const json_t *opt = st->options;
    if (json_is_string(json_object_get(opt, "quant"))) /* the quant the job resolved: its fingerprint is that copy's */
        o->quant = json_string_value(json_object_get(opt, "quant"));
    if (!o->batch)
        o->batch = (int)json_integer_value(json_object_get(opt, "batch"));
    /* a job that chose its prompt tokens per pass chooses them again (the default cap, adaptive when streaming) */
    if (!o->prefill_chunk && !json_is_true(json_object_get(opt, "prefill_auto")))
        o->prefill_chunk = (int)json_integer_value(json_object_get(opt, "prefill_chunk"));
    if (!o->page_tokens)
        o->page_tokens = (int)json_integer_value(json_object_get(opt, "page_tokens"));
    if (!o->kv_bytes)
        o->kv_bytes = (uint64_t)json_integer_value(json_object_get(opt, "kv_bytes"));
    if (!o->mem_budget)
        o->mem_budget = (uint64_t)json_integer_value(json_object_get(opt, "mem_budget"));
    if (!o->gpu_mem)
        o->gpu_mem = (uint64_t)json_integer_value(json_object_get(opt, "gpu_mem"));
    if (!o->mode)
        o->mode = (int)json_integer_value(json_object_get(opt, "mode"));
    if (!o->stream_slots)
        o->stream_slots = (int)json_integer_value(json_object_get(opt, "stream_slots"));
    o->exact |= json_is_true(json_object_get(opt, "exact"));
    o->q8 |= json_is_true(json_object_get(opt, "q8_activations"));
    o->from_disk |= json_is_true(json_object_get(opt, "from_disk"));
    if (!o->kv_dtype)
        o->kv_dtype = (int)json_integer_value(json_object_get(opt, "kv_dtype"));
    if (!o->prefix_cache && json_is_false(json_object_get(opt, "prefix_cache")))
        o->prefix_cache = 2;
    const char *spv = json_string_value(json_object_get(opt, "speculate"));
    if (!o->speculate && spv) { /* draft:MODEL keeps the model as the job's first command line named it */
        o->speculate = !strcmp(spv, "lookup") ? 1 : !strncmp(spv, "draft:", 6) && spv[6] ? 3 : 2;
        o->draft_spec = o->speculate == 3 ? spv + 6 : NULL;
    }
    if (!o->spec_k)
        o->spec_k = (int)json_integer_value(json_object_get(opt, "spec_k"));
    /* the embedding settings a job started with (run-only options: the resume keeps them) */
    o->matryoshka = json_is_true(json_object_get(opt, "matryoshka"));
    if (json_is_string(json_object_get(opt, "pooling")))
        o->pooling = json_string_value(json_object_get(opt, "pooling"));
    const json_t *d = json_object_get(opt, "distill");
    if (json_is_object(d)) { /* a distill job resumes as one, with its own settings */
        o->cmd = 1;
        o->distill_k = (int)json_integer_value(json_object_get(d, "logprobs"));
        o->full_logits = json_is_true(json_object_get(d, "full_logits"));
        o->score = json_is_true(json_object_get(d, "score"));
        o->max_logits_bytes = (uint64_t)json_integer_value(json_object_get(d, "max_logits_bytes"));
    }
    return 0;
}

void run_defaults(run_opts *o)
{
    if (!o->prefill_chunk) {
        /* prompt tokens per pass at most (the pass buffers' size): a CPU pass costs its FLOPs, so chunks stay
         * small; a GPU pass costs the weights' trip over PCIe whatever it carries, so it takes big ones
         * (device_plan.sh: 256-token chunks spent 100 of 125 passes prefilling 52k prompt tokens).  When the
         * layers stream, the runner adapts the tokens within this cap to the passes' times (chunk.h). */
        o->prefill_chunk = o->device != 1 && spill_gpu_open ? 8192 : 256;
        o->prefill_auto = true;
    }
    if (!o->page_tokens)
        o->page_tokens = 16;
    if (!o->mem_budget) /* three quarters of physical RAM: the prototype's knee was 75-85% */
        o->mem_budget = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 4 * 3;
    if (!o->stream_slots)
        o->stream_slots = 3;
    if (!o->spec_k)
        o->spec_k = 4;
}
