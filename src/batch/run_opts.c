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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_internal.h"
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

int run_parse_opts(int argc, char **argv, run_opts *o, bool resume)
{
    o->resident_layers = -1;
    const char *pos[2];
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-o") && has && !resume)
            o->out_dir = argv[++i];
        else if (!strcmp(a, "--threads") && has) {
            if (parse_int(a, argv[++i], &o->threads))
                return -1;
        }
        else if (!strcmp(a, "--batch") && has) {
            if (parse_int(a, argv[++i], &o->batch))
                return -1;
        }
        else if (!strcmp(a, "--prefill-chunk") && has) {
            if (parse_int(a, argv[++i], &o->prefill_chunk))
                return -1;
        }
        else if (!strcmp(a, "--page-tokens") && has) {
            if (parse_int(a, argv[++i], &o->page_tokens))
                return -1;
        }
        else if (!strcmp(a, "--kv-mem") && has) {
            if (parse_bytes(argv[++i], &o->kv_bytes))
                return -1;
        } else if (!strcmp(a, "--mem-budget") && has) {
            if (parse_bytes(argv[++i], &o->mem_budget))
                return -1;
        } else if (!strcmp(a, "--stream"))
            o->mode = 1;
        else if (!strcmp(a, "--resident"))
            o->mode = 2;
        else if (!strcmp(a, "--stream-slots") && has) {
            if (parse_int(a, argv[++i], &o->stream_slots))
                return -1;
        }
        else if (!strcmp(a, "--cpu"))
            o->device = 1;
        else if (!strcmp(a, "--gpu"))
            o->device = 2;
        else if (!strcmp(a, "--gpu-mem") && has) {
            if (parse_bytes(argv[++i], &o->gpu_mem))
                return -1;
        } else if (!strcmp(a, "--from-disk"))
            o->from_disk = true;
        else if (!strcmp(a, "--kv-dtype") && has) {
            const char *v = argv[++i];
            if (strcmp(v, "bf16") && strcmp(v, "int8")) {
                fprintf(stderr, "spill: --kv-dtype takes bf16 (the GPU's default) or int8 (twice the rows per GB of "
                                "KV), not \"%s\".\n", v);
                return -1;
            }
            o->kv_dtype = !strcmp(v, "int8") ? KV_I8 : KV_BF16;
        }
        else if (!strcmp(a, "--resident-layers") && has) {
            if (parse_int(a, argv[++i], &o->resident_layers))
                return -1;
        }
        else if (!strcmp(a, "--exact"))
            o->exact = true;
        else if (!strcmp(a, "--q8-activations"))
            o->q8 = true;
        else if (!strcmp(a, "--pass-log") && has)
            o->pass_log = argv[++i];
        else if (!strcmp(a, "--quiet") || !strcmp(a, "-q"))
            o->quiet = true;
        else if (a[0] != '-' && np < 2)
            pos[np++] = a;
        else {
            if (a[0] == '-')
                fprintf(stderr, "spill: %s is not an option of spill %s%s.\n", a, resume ? "resume" : "run",
                        i + 1 == argc ? " (or it needs a value)" : "");
            return -1;
        }
    }
    if (np != (resume ? 1 : 2) || o->batch < 0 || o->prefill_chunk < 0 || o->page_tokens < 0 || o->threads < 0)
        return -1;
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
    return json_pack("{s:i,s:i,s:i,s:i,s:I,s:I,s:I,s:i,s:i,s:b,s:b,s:b,s:b,s:i,s:s}", "threads", o->threads, "batch",
                     o->batch, "prefill_chunk", o->prefill_chunk, "page_tokens", o->page_tokens, "kv_bytes",
                     (json_int_t)o->kv_bytes, "mem_budget", (json_int_t)o->mem_budget, "gpu_mem",
                     (json_int_t)o->gpu_mem, "mode", o->mode, "stream_slots", o->stream_slots, "quiet", o->quiet,
                     "exact", o->exact, "q8_activations", o->q8, "from_disk", o->from_disk, "kv_dtype", o->kv_dtype,
                     "model", o->model_spec);
}

int run_resume_opts(run_opts *o, char *dir, size_t dircap, job_stored *st, char *err, size_t errlen)
{
    /* A bare id names $SPILL_HOME/jobs/<id>. */
    if (!strchr(o->out_dir, '/') && !util_is_dir(o->out_dir))
        snprintf(dir, dircap, "%s/jobs/%s", util_spill_home(), o->out_dir);
    else
        snprintf(dir, dircap, "%s", o->out_dir);
    o->out_dir = dir;
    int rc = job_read_stored(dir, st, err, errlen);
    if (rc)
        return rc;
    o->model_spec = st->model_id;
    o->input = st->input_path;
    const json_t *opt = st->options;
    if (!o->batch)
        o->batch = (int)json_integer_value(json_object_get(opt, "batch"));
    if (!o->prefill_chunk)
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
    return 0;
}

void run_defaults(run_opts *o)
{
    if (!o->batch)
        o->batch = 32;
    if (!o->prefill_chunk)
        /* prompt tokens per pass: a CPU pass costs its FLOPs, so chunks stay small; a GPU pass costs the
         * weights' trip over PCIe whatever it carries, so it takes big ones (device_plan.sh: 256-token
         * chunks spent 100 of 125 passes prefilling 52k prompt tokens) */
        o->prefill_chunk = o->device != 1 && spill_gpu_open ? 8192 : 256;
    if (!o->page_tokens)
        o->page_tokens = 16;
    if (!o->mem_budget) /* three quarters of physical RAM: the prototype's knee was 75-85% */
        o->mem_budget = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 4 * 3;
    if (!o->stream_slots)
        o->stream_slots = 3;
}
