/*
 * runs.c — the run store's index and `spill runs` (see runs.h).  A run is a job directory with a manifest.json
 * (job.c writes it atomically on every commit); this file only finds, lists, shows and removes them.
 */
#include "runs.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/exit.h"
#include "../base/util.h"

int runs_register(const char *dir, const char *id, char *err, size_t errlen)
{
    char abs[PATH_MAX], jobs[PATH_MAX], link[PATH_MAX], root[PATH_MAX];
    if (!realpath(dir, abs))
        return util_errf(err, errlen, "%s: cannot resolve the job directory: %s.", dir, strerror(errno));
    if (util_pathf(jobs, sizeof jobs, "%s/jobs/%s", util_spill_home(), id) == 0) {
        char jabs[PATH_MAX];
        if (realpath(jobs, jabs) && !strcmp(jabs, abs))
            return 0; /* found by id already */
    }
    if (util_pathf(root, sizeof root, "%s/runs", util_spill_home()) ||
        util_pathf(link, sizeof link, "%s/%s", root, id))
        return util_errf(err, errlen, "SPILL_HOME is too long for the run index; set a shorter one.");
    if (mkdir(util_spill_home(), 0755) && errno != EEXIST)
        return util_errf(err, errlen, "%s: cannot create: %s.", util_spill_home(), strerror(errno));
    if (mkdir(root, 0755) && errno != EEXIST)
        return util_errf(err, errlen, "%s: cannot create: %s.", root, strerror(errno));
    char cur[PATH_MAX];
    ssize_t n = readlink(link, cur, sizeof cur - 1);
    if (n >= 0) {
        cur[n] = 0;
        if (!strcmp(cur, abs))
            return 0;
        if (util_is_dir(cur))
            return 1; /* the id names another live run: keep its link */
        unlink(link);  /* a removed run's stale link */
    }
    if (symlink(abs, link) && errno != EEXIST)
        return util_errf(err, errlen, "%s: cannot link the run: %s.", link, strerror(errno));
    return 0;
}

int runs_resolve(const char *id, char *dir, size_t cap, char *err, size_t errlen)
{
    char p[PATH_MAX];
    if (strchr(id, '/') || util_is_dir(id)) {
        if (!util_is_dir(id))
            return util_errf(err, errlen, "%s: no such job directory; check the path or give a run id (spill runs "
                                          "lists them).", id);
        return util_pathf(dir, cap, "%s", id) ? util_errf(err, errlen, "%s: path too long.", id) : 0;
    }
    if (util_pathf(p, sizeof p, "%s/jobs/%s", util_spill_home(), id) == 0 && util_is_dir(p))
        return util_pathf(dir, cap, "%s", p) ? util_errf(err, errlen, "%s: path too long.", p) : 0;
    if (util_pathf(p, sizeof p, "%s/runs/%s", util_spill_home(), id) == 0 && util_is_dir(p)) {
        char abs[PATH_MAX];
        if (realpath(p, abs))
            return util_pathf(dir, cap, "%s", abs) ? util_errf(err, errlen, "%s: path too long.", abs) : 0;
    }
    return util_errf(err, errlen,
                     "no run %s: neither a directory, nor %s/jobs/%s, nor a run linked from %s/runs/; spill runs "
                     "lists the runs.",
                     id, util_spill_home(), id, util_spill_home());
}

/* ---------------------------------------------------------------- listing */

typedef struct run_ent {
    char id[256], dir[PATH_MAX];
    json_t *man; /* owned */
    long long started;
} run_ent;

static void add_dir(run_ent **v, size_t *n, size_t *cap, const char *id, const char *dir)
{
    char mp[PATH_MAX + 32];
    snprintf(mp, sizeof mp, "%s/manifest.json", dir);
    json_t *man = json_load_file(mp, 0, NULL);
    if (!json_is_object(man)) {
        json_decref(man);
        return;
    }
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*v)[i].dir, dir)) {
            json_decref(man);
            return;
        }
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 32;
        run_ent *nv = realloc(*v, nc * sizeof *nv);
        if (!nv) {
            json_decref(man);
            return;
        }
        *v = nv, *cap = nc;
    }
    run_ent *e = &(*v)[(*n)++];
    snprintf(e->id, sizeof e->id, "%s", id);
    snprintf(e->dir, sizeof e->dir, "%s", dir);
    e->man = man;
    e->started = (long long)json_integer_value(json_object_get(man, "started_at"));
}

static void scan(run_ent **v, size_t *n, size_t *cap, const char *sub)
{
    char root[PATH_MAX];
    if (util_pathf(root, sizeof root, "%s/%s", util_spill_home(), sub))
        return;
    DIR *d = opendir(root);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[PATH_MAX], abs[PATH_MAX];
        if (util_pathf(p, sizeof p, "%s/%s", root, de->d_name) || !realpath(p, abs) || !util_is_dir(abs))
            continue;
        add_dir(v, n, cap, de->d_name, abs);
    }
    if (d)
        closedir(d);
}

static int cmp_started(const void *a, const void *b)
{
    const run_ent *x = a, *y = b;
    return x->started < y->started ? -1 : x->started > y->started ? 1 : strcmp(x->id, y->id);
}

static void fmt_when(long long t, char *out, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (t <= 0 || !gmtime_r(&tt, &tm))
        snprintf(out, cap, "-");
    else
        strftime(out, cap, "%Y-%m-%d %H:%M", &tm);
}

static void free_ents(run_ent *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        json_decref(v[i].man);
    free(v);
}

static size_t load_all(run_ent **v)
{
    size_t n = 0, cap = 0;
    *v = NULL;
    scan(v, &n, &cap, "jobs");
    scan(v, &n, &cap, "runs");
    if (n)
        qsort(*v, n, sizeof **v, cmp_started);
    return n;
}

static int list_runs(void)
{
    run_ent *v;
    size_t n = load_all(&v);
    if (!n) {
        printf("no runs under %s (jobs/ and runs/)\n", util_spill_home());
        free(v);
        return SPILL_EX_OK;
    }
    printf("%-34s %-16s %-8s %-28s %9s %7s %9s %s\n", "id", "started (UTC)", "command", "model", "ok", "failed",
           "tok/s", "state");
    for (size_t i = 0; i < n; i++) {
        json_t *m = v[i].man, *rows = json_object_get(m, "rows"), *tp = json_object_get(m, "throughput");
        char when[32], tps[32];
        fmt_when(v[i].started, when, sizeof when);
        if (json_is_number(json_object_get(tp, "tok_s")))
            snprintf(tps, sizeof tps, "%.1f", json_number_value(json_object_get(tp, "tok_s")));
        else
            snprintf(tps, sizeof tps, "-");
        const char *model = json_string_value(json_object_get(json_object_get(m, "model"), "id"));
        const char *cmd = json_string_value(json_object_get(m, "command"));
        const char *state = json_string_value(json_object_get(m, "state"));
        printf("%-34.34s %-16s %-8.8s %-28.28s %9lld %7lld %9s %s\n", v[i].id, when, cmd ? cmd : "-",
               model ? model : "-", (long long)json_integer_value(json_object_get(rows, "completed")),
               (long long)json_integer_value(json_object_get(rows, "failed")), tps, state ? state : "-");
    }
    free_ents(v, n);
    return SPILL_EX_OK;
}

static int show_run(const char *id)
{
    char dir[PATH_MAX], err[SPILL_ERRLEN], mp[PATH_MAX + 32];
    if (runs_resolve(id, dir, sizeof dir, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        return SPILL_EX_NOINPUT;
    }
    snprintf(mp, sizeof mp, "%s/manifest.json", dir);
    json_error_t je;
    json_t *m = json_load_file(mp, 0, &je);
    if (!m) {
        fprintf(stderr, "spill: %s: cannot read the manifest (%s); is this a run directory?\n", mp, je.text);
        return SPILL_EX_NOINPUT;
    }
    printf("run        %s\ndirectory  %s\n", json_string_value(json_object_get(m, "id")), dir);
    char *d = json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (d)
        printf("%s\n", d);
    free(d);
    json_decref(m);
    return SPILL_EX_OK;
}

/* Removes one run's directory (its own files only: a job's) and its index link. */
static int remove_run(const char *id, bool dry)
{
    char dir[PATH_MAX], err[SPILL_ERRLEN], p[PATH_MAX + 512];
    if (runs_resolve(id, dir, sizeof dir, err, sizeof err)) {
        fprintf(stderr, "spill: %s\n", err);
        return -1;
    }
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    if (!util_is_file(p)) {
        fprintf(stderr, "spill: %s holds no manifest.json; not removing a directory that is not a run.\n", dir);
        return -1;
    }
    printf("%s %s\n", dry ? "would remove" : "removing", dir);
    if (dry)
        return 0;
    /* a job directory holds files and at most one level of directories (logits/) */
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (util_is_dir(p)) {
            DIR *s = opendir(p);
            struct dirent *se;
            while (s && (se = readdir(s))) {
                char q[PATH_MAX * 2 + 512];
                if (se->d_name[0] == '.' && (!se->d_name[1] || (se->d_name[1] == '.' && !se->d_name[2])))
                    continue;
                snprintf(q, sizeof q, "%s/%s", p, se->d_name);
                unlink(q);
            }
            if (s)
                closedir(s);
            rmdir(p);
        } else
            unlink(p);
    }
    if (d)
        closedir(d);
    if (rmdir(dir)) {
        fprintf(stderr, "spill: %s: cannot remove: %s.\n", dir, strerror(errno));
        return -1;
    }
    char link[PATH_MAX];
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    if (util_pathf(link, sizeof link, "%s/runs/%s", util_spill_home(), base) == 0)
        unlink(link);
    return 0;
}

int runs_main(int argc, char **argv)
{
    if (argc == 0)
        return list_runs();
    if (!strcmp(argv[0], "show") && argc == 2)
        return show_run(argv[1]);
    if (!strcmp(argv[0], "rm") && argc >= 2) {
        int bad = 0;
        for (int i = 1; i < argc; i++)
            bad |= remove_run(argv[i], false) != 0;
        return bad ? SPILL_EX_NOINPUT : SPILL_EX_OK;
    }
    if (!strcmp(argv[0], "clean") && argc >= 3 && !strcmp(argv[1], "--older-than")) {
        char *end;
        double days = strtod(argv[2], &end);
        if (end == argv[2] || (*end && strcmp(end, "d")) || days < 0) {
            fprintf(stderr, "spill: --older-than takes a number of days (e.g. 30 or 30d), not \"%s\".\n", argv[2]);
            return SPILL_EX_USAGE;
        }
        bool dry = argc == 4 && !strcmp(argv[3], "--dry-run");
        if (argc > 4 || (argc == 4 && !dry)) {
            fprintf(stderr, "spill: spill runs clean --older-than DAYS [--dry-run]\n");
            return SPILL_EX_USAGE;
        }
        run_ent *v;
        size_t n = load_all(&v);
        long long cut = (long long)time(NULL) - (long long)(days * 86400);
        int removed = 0, bad = 0;
        for (size_t i = 0; i < n; i++) {
            const char *st = json_string_value(json_object_get(v[i].man, "state"));
            long long ended = (long long)json_integer_value(json_object_get(v[i].man, "updated_at"));
            if (st && !strcmp(st, "running") && ended > cut)
                continue; /* never a run that may be going */
            if ((ended ? ended : v[i].started) < cut) {
                bad |= remove_run(v[i].dir, dry) != 0;
                removed++;
            }
        }
        free_ents(v, n);
        printf("%d run(s) %s\n", removed, dry ? "would be removed" : "removed");
        return bad ? SPILL_EX_IOERR : SPILL_EX_OK;
    }
    fprintf(stderr, "usage: spill runs [show ID | rm ID... | clean --older-than DAYS [--dry-run]]\n");
    return SPILL_EX_USAGE;
}
