/*
 * settings.c — reads the environment switches of settings.h, once.  A
 * switch is on when its variable is set to anything but "" or "0"; the two
 * with named values refuse any other value with a sentence.
 */
#include "settings.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* *out = (value == yes); unset or empty leaves the default (false). */
static int choice(const char *name, const char *yes, const char *no, bool *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    *out = false;
    if (!v || !*v || !strcmp(v, no))
        return 0;
    if (!strcmp(v, yes)) {
        *out = true;
        return 0;
    }
    return util_errf(err, errlen, "%s=%.40s is not a setting spill knows; use %s or %s, or unset it.", name, v, yes,
                     no);
}

int settings_from_env(spill_settings *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->no_simd = on("SPILL_NO_SIMD");
    s->no_vnni = on("SPILL_NO_VNNI");
    s->cuda_prof = on("SPILL_CUDA_PROF");
    s->kv_check = on("SPILL_KV_CHECK");
    if (choice("SPILL_CUDA_ATT", "fp32", "tf32", &s->cuda_att_fp32, err, errlen))
        return -1;
    const char *pin = getenv("SPILL_CUDA_PIN");
    if (pin && *pin) {
        s->cuda_pin_alloc = !strcmp(pin, "alloc");
        s->cuda_pin_private = !strcmp(pin, "register");
        s->cuda_pin_shared = !strcmp(pin, "shared");
        if (!s->cuda_pin_alloc && !s->cuda_pin_private && !s->cuda_pin_shared)
            return util_errf(err, errlen,
                             "SPILL_CUDA_PIN=%.40s is not a setting spill knows; use shared, register or alloc, or "
                             "unset it.",
                             pin);
    }
    const char *dir = getenv("SPILL_SHM_DIR");
    if (dir && *dir) {
        if (*dir != '/' || strlen(dir) >= sizeof s->shm_dir)
            return util_errf(err, errlen, "SPILL_SHM_DIR=%.60s must be an absolute directory path (under %zu bytes).",
                             dir, sizeof s->shm_dir);
        snprintf(s->shm_dir, sizeof s->shm_dir, "%s", dir);
    }
    return 0;
}
