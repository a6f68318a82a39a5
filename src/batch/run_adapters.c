/*
 * run_adapters.c — which LoRA adapter each row of a job runs with (model/lora.h), and the set the engine
 * applies in one pass.
 *
 * The rule (issue 13): the command line's MODEL is every row's model — a bare base, or BASE+ADAPTER.  A row's
 * body.model picks another adapter of that base (or the bare base) only when it names one: BASE+ADAPTER with
 * the job's BASE, the bare BASE itself, or a name under $SPILL_HOME/adapters/.  Any other value (gpt-4o-mini,
 * a label) is ignored and the row runs the command line's model.  A row naming an adapter of another base, or
 * an adapter spill refuses (DoRA, a full fine-tune, shapes of another base), fails alone with the loader's
 * sentence; the command line's own adapter is checked before the job exists.
 *
 * Every adapter is loaded once (keyed by its directory) into the job's lora_set; index 0 is the bare base.
 * Each row's output stamp carries its adapter's full hash; DIR/adapters.json lists the job's adapters (name,
 * path, hash, rank, targets) for the run store.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_internal.h"
#include "../base/util.h"

/* The index of the adapter in directory dir, loading it the first time; 0 and *index, or -1 with the
 * loader's sentence. */
static int adapter_index(runner *r, const char *dir, int *index, char *err, size_t errlen)
{
    char real[4096];
    if (!realpath(dir, real))
        snprintf(real, sizeof real, "%s", dir);
    for (int i = 0; i < r->lora.n; i++)
        if (!strcmp(r->lora.ad[i]->path, real)) {
            *index = i + 1;
            return 0;
        }
    lora_adapter *ad;
    if (lora_load(r->m, &r->al, real, &ad, err, errlen))
        return -1;
    lora_adapter **na = realloc(r->lora.ad, (size_t)(r->lora.n + 1) * sizeof *na);
    if (!na) {
        lora_free(ad);
        return util_errf(err, errlen, "out of memory for adapter %s.", dir);
    }
    r->lora.ad = na;
    r->lora.ad[r->lora.n++] = ad;
    *index = r->lora.n;
    return 0;
}

int run_adapters_open(runner *r, char *base, size_t cap, char *err, size_t errlen)
{
    char ad[4096];
    int rc = lora_split_spec(r->o.model_spec, base, cap, ad, sizeof ad, err, errlen);
    if (rc < 0)
        return -1;
    snprintf(r->base_spec, sizeof r->base_spec, "%s", base);
    r->default_adapter = 0;
    if (rc == 0)
        return 0;
    snprintf(r->adapter_spec, sizeof r->adapter_spec, "%s", ad);
    return 0;
}

int run_adapters_default(runner *r, char *err, size_t errlen)
{
    if (!r->adapter_spec[0])
        return 0;
    char dir[4096];
    if (lora_resolve(r->adapter_spec, dir, sizeof dir, err, errlen))
        return -1;
    return adapter_index(r, dir, &r->default_adapter, err, errlen);
}

int run_adapter_for_row(runner *r, const char *model, int *index, char *msg, size_t msglen)
{
    *index = r->default_adapter;
    if (!model || !*model)
        return 0;
    if (!strcmp(model, r->base_spec) || !strcmp(model, r->o.model_spec)) {
        *index = !strcmp(model, r->base_spec) ? 0 : r->default_adapter;
        return 0;
    }
    char base[4096], ad[4096], dir[4096], err[SPILL_ERRLEN];
    int split = lora_split_spec(model, base, sizeof base, ad, sizeof ad, err, sizeof err);
    if (split < 0) {
        /* "BASE+X" with an X that resolves to nothing: a label with a '+' is still just a label unless its base
         * is this job's */
        if (strchr(model, '+') && !strncmp(model, r->base_spec, strlen(r->base_spec)) &&
            model[strlen(r->base_spec)] == '+') {
            snprintf(msg, msglen, "body.model %s names an adapter of this job's base, but %s", model, err);
            return 1;
        }
        return 0;
    }
    if (split == 1) {
        if (strcmp(base, r->base_spec)) {
            snprintf(msg, msglen,
                     "body.model %s names an adapter of %s, but this job runs %s; put the row in a job of that "
                     "base, or name an adapter of %s.",
                     model, base, r->base_spec, r->base_spec);
            return 1;
        }
        if (lora_resolve(ad, dir, sizeof dir, err, sizeof err)) {
            snprintf(msg, msglen, "body.model %s: %s", model, err);
            return 1;
        }
    } else {
        /* a bare name: an adapter only when $SPILL_HOME/adapters/<name> is one */
        if (strchr(model, '/') || util_pathf(dir, sizeof dir, "%s/adapters/%s", util_spill_home(), model) ||
            !util_is_dir(dir))
            return 0;
    }
    if (adapter_index(r, dir, index, err, sizeof err)) {
        snprintf(msg, msglen, "body.model %s: %s", model, err);
        return 1;
    }
    return 0;
}

int run_adapters_write(runner *r, char *err, size_t errlen)
{
    if (r->lora.n == 0)
        return 0;
    json_t *a = json_array();
    for (int i = 0; a && i < r->lora.n; i++) {
        const lora_adapter *ad = r->lora.ad[i];
        json_t *t = json_array();
        static const char *const names[LORA_N_SLOTS] = {"q", "k", "v", "o", "gate", "up", "down"};
        for (int s = 0; t && s < LORA_N_SLOTS; s++)
            if (ad->targets & (1u << s))
                json_array_append_new(t, json_string(names[s]));
        json_array_append_new(a, json_pack("{s:i,s:s,s:s,s:s,s:s,s:i,s:f,s:b,s:o,s:I}", "index", i + 1, "name",
                                           ad->name, "path", ad->path, "hash", ad->hash, "layout", ad->layout, "rank",
                                           ad->rank, "scale", (double)ad->scale, "rslora", ad->rslora, "targets",
                                           t ? t : json_null(), "bytes", (json_int_t)ad->bytes));
    }
    json_t *o = a ? json_pack("{s:s,s:o}", "base", r->base_spec, "adapters", a) : NULL;
    char *d = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
    json_decref(o);
    char path[4200];
    int rc = d && !util_pathf(path, sizeof path, "%s/adapters.json", job_dir(r->j))
                 ? util_write_atomic(path, d, strlen(d), err, errlen)
                 : util_errf(err, errlen, "out of memory listing the job's adapters.");
    free(d);
    return rc;
}

const char *run_adapter_hash(const runner *r, int index)
{
    return index > 0 && index <= r->lora.n ? r->lora.ad[index - 1]->hash : NULL;
}

void run_adapters_free(runner *r)
{
    for (int i = 0; i < r->lora.n; i++)
        lora_free(r->lora.ad[i]);
    free(r->lora.ad);
    r->lora.ad = NULL;
    r->lora.n = 0;
}
