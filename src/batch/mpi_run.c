/*
 * mpi_run.c — one `spill run` / `spill resume` job as several MPI ranks (mpirun -np N, srun), on one host or
 * many that share the job directory's file system.
 *
 * Owns: launching (MPI up or not), the agreement to start, handing rows out, the ranks' own job directories
 * and folding them into the job's one output.  Does not own the passes, the rows or the on-disk protocol: each
 * rank is the ordinary runner (run.c) with its own durable job (job.c) — only where its rows come from and
 * where its lines go differ.
 *
 * Layout (DIR = the job directory, on a shared file system):
 *   DIR/manifest.json, results.jsonl, errors.jsonl   the job as one process would leave it; rank 0 holds it,
 *                                                    and its manifest's "mpi" lists every attempt's ranks
 *   DIR/ranks/<k>/                                   rank k's own job (job.c's three files, fsync before a row
 *                                                    counts, torn-line repair on resume); removed once folded
 *   DIR/logits/<id>.npy                              --full-logits, written by whichever rank ran the row
 *
 * Rows: every rank reads and tokenizes the whole input (so any rank can run any row, and rank 0 hands out
 * line numbers only); the queue that sched.c builds (longest first) stays empty on every rank, and rank 0
 * keeps its order as the job's.  A rank whose queue is empty while it has free batch slots asks rank 0 for
 * rows; rank 0 grants min(asked, ceil(left / 2N)) of the next lines (guided self-scheduling: big chunks first,
 * small ones at the end, so ranks finish together), and a rank that finishes early asks again.  Rank 0
 * computes too: a dispatcher thread answers the others (MPI_Iprobe every millisecond, so it holds no core)
 * while rank 0's passes take rows under the same lock.  Under MPI_THREAD_SERIALIZED only that thread calls
 * MPI while it runs.  Rows land in DIR/ranks/<k>/; at the end rank 0 folds every rank directory into DIR's
 * files through job.c's appends (one line per custom_id: a second line for one is dropped and counted).
 *
 * Failure: the default MPI error handler (and mpirun) end every rank when one dies, so no row is handed out
 * again within an attempt; what makes a rank's death lose nothing of the others' is that every rank's rows
 * are durable in its own directory.  `spill resume DIR` (with any number of ranks) first folds every
 * DIR/ranks/<k> left by earlier attempts into DIR's files (job_open_resume repairs each: torn last line
 * truncated, uncommitted whole lines kept), then removes them, and hands out only the rows DIR's job lacks.
 * A fold interrupted between DIR's commit and the removal is repeated harmlessly (lines DIR already holds are
 * skipped); a rank directory without a manifest never held a row (job_create writes it before any row) and
 * is removed.  Rank 0 asks the others to checkpoint when it is interrupted; a rank that fails alone mid-job
 * calls MPI_Abort (the others die; their rows are safe).
 *
 * Alternatives left out: sending each rank its tokenized rows (tokenizing is a small share of a job, and
 * reading the input everywhere keeps one code path); MPI-IO into one shared output file (a rank's death could
 * tear another's lines, and the job store's fsync rule would have to be rebuilt); re-handing an interrupted
 * rank's rows to the others within the attempt (the resume does it, and mpirun ends the attempt anyway).
 */
#include "mpi_run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

/* The launcher's variables: mpirun (OpenMPI), PMIx or PMI (srun --mpi=pmix / pmi2), and Slurm's task count. */
static bool mpi_env(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

static int env_tasks(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v)
        v = getenv("PMI_SIZE");
    if (!v)
        v = getenv("SLURM_STEP_NUM_TASKS");
    return v ? atoi(v) : 0;
}

#ifndef SPILL_MPI

int mpi_run_init(runner *r, char *err, size_t errlen)
{
    int n = env_tasks();
    if ((mpi_env() || getenv("SLURM_STEP_NUM_TASKS")) && n > 1)
        return util_errf(err, errlen, "this spill was built without MPI but was started as one of %d tasks (mpirun "
                                      "or srun); install libopenmpi-dev and rebuild (make), or run one spill.", n);
    r->mpi = NULL;
    r->n_ranks = 0;
    r->rank = 0;
    return 0;
}

#else

#include <fcntl.h>
#include <jansson.h>
#include <dirent.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Messages.  A rank to rank 0: int64[NEWS_LEN] {want, done, failed, tokens, in_flight, interrupted}.  Rank 0
 * to a rank: a grant int64[1 + n] {flags, line, ...}, or a stop int64[1]. */
enum { TAG_ASK = 1, TAG_NEWS, TAG_BYE, TAG_GRANT, TAG_STOP };
enum { GRANT_LAST = 1, GRANT_STOP = 2 };
#define NEWS_LEN 6

typedef struct rank_news {
    uint64_t done, failed, tokens, in_flight;
    bool bye, interrupted;
} rank_news;

/* What every rank learns from rank 0 once the job is open. */
typedef struct open_news {
    uint64_t job_seed;
    char run_id[JOB_ID_MAX];
    char fingerprint[65];
    char input_sha[65];
} open_news;

struct mpi_run {
    int rank, size;
    bool turned;    /* mpi_run_in_turn's barriers were passed */
    bool voted;     /* the start vote was cast (mpi_run_open, or mpi_run_end for a rank that failed first) */
    bool together;  /* the ranks end together (vote failed, or the finish protocol ran): MPI_Finalize */
    job *main;      /* rank 0 from mpi_run_start: DIR's job */
    size_t *idx;    /* (n_rows + 1) row indices: the queue taken, then the rows to queue */
    int64_t *lines; /* (n_rows + 1) a grant as it arrives (flags, lines) */
    bool last;      /* rank 0 has no row left to hand out */
    double t_news;
    uint64_t base;  /* rank 0: rows DIR's job held when the passes began */
    /* rank 0's hand-out, under mu */
    pthread_mutex_t mu;
    bool mu_on;
    size_t *order;  /* (n_order) the lines to hand out, longest first */
    size_t n_order, next;
    rank_news *news; /* (size) */
    int byes;
    bool stop, quit;
    bool ended;      /* rank 0's finish ran: r's counters are the job's totals */
    int64_t *grant;  /* (n_order + 1) the dispatcher's reply */
    pthread_t thr;
    bool thr_on;
};

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mpi_run_init(runner *r, char *err, size_t errlen)
{
    r->mpi = NULL;
    r->n_ranks = r->rank = 0;
    int tasks = env_tasks();
    if (!mpi_env()) {
        if (getenv("SLURM_STEP_NUM_TASKS") && tasks > 1)
            return util_errf(err, errlen, "srun started %d tasks but gave them no MPI environment (PMIx or PMI); "
                                          "run srun --mpi=pmix (or mpirun).", tasks);
        return 0;
    }
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return util_errf(err, errlen, "MPI_Init_thread failed; check the MPI installation (mpirun --version).");
    struct mpi_run *m = calloc(1, sizeof *m);
    if (!m) {
        MPI_Abort(MPI_COMM_WORLD, 70);
        return util_errf(err, errlen, "out of memory starting MPI.");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m->size);
    MPI_Comm host;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &host);
    MPI_Comm_rank(host, &r->host_rank);
    MPI_Comm_free(&host);
    r->mpi = m;
    r->rank = m->rank;
    r->n_ranks = m->size;
    if (provided < MPI_THREAD_SERIALIZED)
        return util_errf(err, errlen, "this MPI gives thread level %d, but spill's rank 0 answers the other ranks "
                                      "from a thread (MPI_THREAD_SERIALIZED); use OpenMPI 4 or later.", provided);
    if (m->size == 1 && tasks > 1)
        return util_errf(err, errlen, "the launcher started %d tasks but MPI sees one rank (srun needs "
                                      "--mpi=pmix); each would run the whole job.", tasks);
    return 0;
}

int mpi_run_in_turn(runner *r, const char *path, char *err, size_t errlen)
{
    struct mpi_run *m = r->mpi;
    int rc = 0;
    for (int t = 0; t < m->size; t++) { /* every rank passes every barrier, whatever its own outcome */
        if (t == m->rank)
            rc = run_open_weights(r, path, err, errlen);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    m->turned = true;
    return rc;
}

/* The start vote: every rank casts it once; true when every rank is ready. */
static bool vote(struct mpi_run *m, bool ok)
{
    int mine = ok, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    m->voted = true;
    return all == 1;
}

/* ---------------------------------------------------------------- rank directories */

/* DIR/ranks/<k>'s job, created empty (its rows are whatever rank 0 hands this rank). */
static int create_rank_job(runner *r, int k, job **out, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (util_pathf(path, sizeof path, "%s/ranks/%d", r->o.out_dir, k))
        return util_errf(err, errlen, "%s/ranks/%d: the path is too long; choose a shorter job directory.",
                         r->o.out_dir, k);
    json_t *oj = run_opts_json(&r->o);
    if (!oj)
        return util_errf(err, errlen, "out of memory.");
    job_info ji = {r->o.cmd == 1 ? "distill" : "run", r->o.input, oj, r->o.model_spec, r->fingerprint,
                   SPILL_VERSION, 0};
    int rc = job_create(path, &ji, NULL, out, err, errlen);
    json_decref(oj);
    return rc;
}

/* Removes a folded rank directory: its manifest first (a directory without one is known to hold no row
 * that DIR lacks), then its other files, then itself.  Best effort: what stays is folded again, harmlessly. */
static void remove_rank_dir(const char *path)
{
    char p[PATH_MAX];
    if (!util_pathf(p, sizeof p, "%s/manifest.json", path))
        unlink(p);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !util_pathf(p, sizeof p, "%s/%s", path, e->d_name))
            unlink(p);
    if (d)
        closedir(d);
    if (rmdir(path))
        fprintf(stderr, "spill: %s: could not remove the folded rank directory (%s); it is folded again, "
                        "harmlessly, at the next resume.\n", path, strerror(errno));
}

/* Appends every line of a rank's file (results or errors, repaired by job_open_resume) to DIR's job, except
 * the lines whose custom_id DIR already has.  *merged and *dups count the lines taken and the second lines
 * for a custom_id, which are dropped.  0, or -1 with a sentence. */
static int fold_file(job *main, const char *path, bool errors, uint64_t *merged, uint64_t *dups, char *err,
                     size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return util_errf(err, errlen, "%s: cannot open to merge it: %s.", path, strerror(errno));
    char *line = NULL, *scratch = NULL, *idz = NULL;
    size_t cap = 0, scap = 0, zcap = 0;
    ssize_t n;
    int rc = 0;
    uint64_t lineno = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) > 0) {
        lineno++;
        size_t len = (size_t)n - (line[n - 1] == '\n');
        const char *id;
        size_t idlen;
        char why[128];
        if (job_check_line(line, len, &id, &idlen, &scratch, &scap, why, sizeof why)) {
            rc = util_errf(err, errlen, "%s: line %llu %s after its repair; restore the file or start a new job.",
                           path, (unsigned long long)lineno, why);
            break;
        }
        if (idlen + 1 > zcap) {
            char *z = realloc(idz, idlen + 1);
            if (!z) {
                rc = util_errf(err, errlen, "out of memory merging %s.", path);
                break;
            }
            idz = z, zcap = idlen + 1;
        }
        memcpy(idz, id, idlen);
        idz[idlen] = 0;
        if (job_is_done(main, idz)) /* folded by an earlier attempt that stopped before removing this file */
            continue;
        int a = errors ? job_append_error(main, line, len, err, errlen) : job_append_result(main, line, len, err,
                                                                                              errlen);
        if (a == JOB_LINE_REFUSED) {
            if ((*dups)++ == 0)
                fprintf(stderr, "spill: %s line %llu: custom_id \"%.80s\" already has a line in the merged output; "
                                "this one is dropped.\n", path, (unsigned long long)lineno, idz);
        } else if (a)
            rc = -1;
        else
            (*merged)++;
    }
    if (rc == 0 && ferror(f))
        rc = util_errf(err, errlen, "%s: read failed while merging it: %s.", path, strerror(errno));
    free(line), free(scratch), free(idz);
    fclose(f);
    return rc;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/*
 * Folds every DIR/ranks/<k> into DIR's job main: repaired by job_open_resume (torn tail cut, whole uncommitted
 * lines kept), merged, committed in main, then removed.  0, or -1 with a sentence.
 */
static int fold_ranks(const char *dir, job *main, uint64_t *merged, uint64_t *dups, char *err, size_t errlen)
{
    char rd[PATH_MAX], path[PATH_MAX], file[PATH_MAX];
    if (util_pathf(rd, sizeof rd, "%s/ranks", dir))
        return util_errf(err, errlen, "%s/ranks: the path is too long.", dir);
    DIR *d = opendir(rd);
    if (!d)
        return errno == ENOENT ? 0 : util_errf(err, errlen, "%s: cannot read: %s.", rd, strerror(errno));
    int *ks = NULL, nk = 0, capk = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long k = strtol(e->d_name, &end, 10);
        if (!e->d_name[0] || *end || k < 0 || k > INT_MAX)
            continue; /* not a rank's directory */
        if (nk == capk) {
            int *nks = realloc(ks, (size_t)(capk = capk ? capk * 2 : 16) * sizeof *ks);
            if (!nks) {
                rc = util_errf(err, errlen, "out of memory listing %s.", rd);
                break;
            }
            ks = nks;
        }
        ks[nk++] = (int)k;
    }
    closedir(d);
    if (ks)
        qsort(ks, (size_t)nk, sizeof *ks, cmp_int);
    for (int i = 0; rc == 0 && i < nk; i++) {
        if (util_pathf(path, sizeof path, "%s/%d", rd, ks[i]) || util_pathf(file, sizeof file, "%s/manifest.json", path)) {
            rc = util_errf(err, errlen, "%s: the path is too long.", rd);
            break;
        }
        if (!util_is_file(file))
            continue; /* removed below: it never held a row */
        job *rj;
        if (job_open_resume(path, NULL, &rj, err, errlen)) {
            rc = -1;
            break;
        }
        for (int f = 0; rc == 0 && f < 2; f++)
            if (util_pathf(file, sizeof file, "%s/%s", path, f ? "errors.jsonl" : "results.jsonl"))
                rc = util_errf(err, errlen, "%s: the path is too long.", path);
            else
                rc = fold_file(main, file, f == 1, merged, dups, err, errlen);
        job_close(rj, JOB_RUNNING, NULL, 0); /* only frees: its manifest keeps its last commit */
    }
    if (rc == 0)
        rc = job_commit(main, err, errlen);
    for (int i = 0; rc == 0 && i < nk; i++) /* DIR holds their rows durably now */
        if (!util_pathf(path, sizeof path, "%s/%d", rd, ks[i]))
            remove_rank_dir(path);
    free(ks);
    return rc;
}

/* ---------------------------------------------------------------- open and start */

int mpi_run_open(runner *r, const job_stored *stored, char *err, size_t errlen)
{
    struct mpi_run *m = r->mpi;
    open_news on = {0};
    int rc = 0;
    if (m->rank == 0) {
        rc = run_open_job(r, stored, err, errlen);
        uint64_t merged = 0, dups = 0;
        char rd[PATH_MAX];
        if (rc == 0 && stored) /* an earlier attempt's ranks' rows join DIR's job before anything is handed out */
            rc = fold_ranks(r->o.out_dir, r->j, &merged, &dups, err, errlen);
        if (rc == 0 && stored && merged && !r->o.quiet)
            fprintf(stderr, "spill: merged %llu rows that the ranks of an earlier attempt had saved.\n",
                    (unsigned long long)merged);
        if (rc == 0 && (util_pathf(rd, sizeof rd, "%s/ranks", r->o.out_dir) || (mkdir(rd, 0755) && errno != EEXIST)))
            rc = util_errf(err, errlen, "%s/ranks: cannot create: %s.", r->o.out_dir, strerror(errno));
        if (rc == 0) {
            const char *sha = json_string_value(json_object_get(json_object_get(job_manifest(r->j), "input"), "sha256"));
            on.job_seed = r->job_seed;
            snprintf(on.run_id, sizeof on.run_id, "%s", r->run_id);
            snprintf(on.fingerprint, sizeof on.fingerprint, "%s", r->fingerprint);
            snprintf(on.input_sha, sizeof on.input_sha, "%s", sha ? sha : "");
        }
    }
    if (!vote(m, rc == 0)) {
        m->together = true;
        if (m->rank == 0 && rc == 0) { /* ready, but another rank is not: leave the job as it was */
            char rd[PATH_MAX];
            if (!util_pathf(rd, sizeof rd, "%s/ranks", r->o.out_dir))
                rmdir(rd);
            if (stored)
                job_close(r->j, JOB_INTERRUPTED, NULL, 0);
            else
                job_discard(r->j);
            r->j = NULL;
        }
        return rc ? rc : util_errf(err, errlen, "another rank failed before the job started; its message says why.");
    }
    MPI_Bcast(&on, sizeof on, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (m->rank == 0)
        return 0;
    char host[MPI_MAX_PROCESSOR_NAME];
    int hl;
    MPI_Get_processor_name(host, &hl);
    if (strcmp(on.fingerprint, r->fingerprint))
        return util_errf(err, errlen, "the model %s has fingerprint %.16s on %s but %.16s on rank 0; every host must "
                                      "have the same model files.", r->o.model_spec, r->fingerprint, host,
                         on.fingerprint);
    r->job_seed = on.job_seed;
    snprintf(r->run_id, sizeof r->run_id, "%s", on.run_id);
    if (create_rank_job(r, m->rank, &r->j, err, errlen))
        return -1;
    const char *sha = json_string_value(json_object_get(json_object_get(job_manifest(r->j), "input"), "sha256"));
    if (!sha || strcmp(sha, on.input_sha))
        return util_errf(err, errlen, "the input %s on %s is not the file rank 0 read (SHA-256 differs); every "
                                      "host must see the same input.", r->o.input, host);
    return 0;
}

/* Up to want of the lines left (at most ceil(left / 2N), at least one while any is left) into out; under mu. */
static size_t take(struct mpi_run *m, int64_t want, int64_t *out)
{
    size_t left = m->n_order - m->next, share = (left + 2 * (size_t)m->size - 1) / (2 * (size_t)m->size);
    size_t n = want < 1 ? 1 : (size_t)want;
    n = n < share ? n : share;
    n = n < left ? n : left;
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)m->order[m->next + i];
    m->next += n;
    return n;
}

/* Rank 0's dispatcher thread: answers asks, keeps the ranks' news, sends the stop, until every other rank has
 * said bye (or quit). */
static void *dispatch(void *arg)
{
    struct mpi_run *m = arg;
    bool stop_sent = false;
    for (;;) {
        pthread_mutex_lock(&m->mu);
        bool out = m->quit || m->byes == m->size - 1, send_stop = m->stop && !stop_sent;
        pthread_mutex_unlock(&m->mu);
        if (out)
            break;
        if (send_stop) {
            int64_t one = 1;
            for (int k = 1; k < m->size; k++)
                if (!m->news[k].bye)
                    MPI_Send(&one, 1, MPI_INT64_T, k, TAG_STOP, MPI_COMM_WORLD);
            stop_sent = true;
        }
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
        if (!flag) {
            struct timespec ms = {0, 1000000L};
            nanosleep(&ms, NULL);
            continue;
        }
        int64_t msg[NEWS_LEN];
        MPI_Recv(msg, NEWS_LEN, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        size_t n = 0;
        pthread_mutex_lock(&m->mu);
        rank_news *rn = &m->news[st.MPI_SOURCE];
        rn->done = (uint64_t)msg[1], rn->failed = (uint64_t)msg[2], rn->tokens = (uint64_t)msg[3];
        rn->in_flight = (uint64_t)msg[4];
        if (st.MPI_TAG == TAG_BYE) {
            rn->bye = true, rn->interrupted = msg[5] != 0, rn->in_flight = 0;
            m->byes++;
        }
        if (st.MPI_TAG == TAG_ASK) {
            n = m->stop ? 0 : take(m, msg[0], m->grant + 1);
            m->grant[0] = (m->next == m->n_order ? GRANT_LAST : 0) | (m->stop ? GRANT_STOP : 0);
        }
        pthread_mutex_unlock(&m->mu);
        if (st.MPI_TAG == TAG_ASK)
            MPI_Send(m->grant, (int)(n + 1), MPI_INT64_T, st.MPI_SOURCE, TAG_GRANT, MPI_COMM_WORLD);
    }
    return NULL;
}

int mpi_run_start(runner *r, char *err, size_t errlen)
{
    struct mpi_run *m = r->mpi;
    m->idx = malloc((r->n_rows + 1) * sizeof *m->idx);
    m->lines = malloc((r->n_rows + 1) * sizeof *m->lines);
    if (!m->idx || !m->lines)
        return util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows);
    size_t nq = sched_take_queue(&r->s, m->idx); /* the rows wait for rank 0 now */
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int hl;
    MPI_Get_processor_name(host, &hl);
    char *hosts = m->rank == 0 ? calloc((size_t)m->size, MPI_MAX_PROCESSOR_NAME) : NULL;
    if (m->rank == 0 && !hosts)
        return util_errf(err, errlen, "out of memory.");
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (m->rank > 0)
        return 0;

    /* rank 0: the job's hand-out order (a prompt list's line once, where its first member comes) */
    bool *seen = calloc(r->n_rows + 1, sizeof *seen);
    m->order = malloc((nq + 1) * sizeof *m->order);
    m->grant = malloc((nq + 1) * sizeof *m->grant);
    m->news = calloc((size_t)m->size, sizeof *m->news);
    json_t *arr = json_array(), *hl_json = json_array();
    int rc = 0;
    if (!seen || !m->order || !m->grant || !m->news || !arr || !hl_json)
        rc = util_errf(err, errlen, "out of memory for %zu rows.", r->n_rows);
    for (size_t i = 0; rc == 0 && i < nq; i++) {
        const row *w = &r->rows[m->idx[i]];
        size_t g = w->group_n > 1 ? w->group_first : m->idx[i];
        if (!seen[g])
            seen[g] = true, m->order[m->n_order++] = w->line;
    }
    free(seen);
    /* this attempt in DIR's manifest (written with its next commit): ranks and hosts */
    const json_t *prev = rc ? NULL : json_object_get(job_manifest(r->j), "mpi");
    if (json_is_array(prev)) {
        json_decref(arr);
        arr = json_deep_copy(prev);
    }
    for (int k = 0; rc == 0 && k < m->size; k++)
        json_array_append_new(hl_json, json_string(hosts + (size_t)k * MPI_MAX_PROCESSOR_NAME));
    free(hosts);
    if (rc == 0) {
        json_array_append_new(arr, json_pack("{s:i,s:O,s:I}", "ranks", m->size, "hosts", hl_json, "started_at",
                                             (json_int_t)time(NULL)));
        rc = job_set_info(r->j, "mpi", arr, err, errlen) || job_commit_manifest(r->j, err, errlen);
        arr = NULL;
    }
    json_decref(arr);
    json_decref(hl_json);
    if (rc)
        return -1;
    m->base = job_rows_completed(r->j) + job_rows_failed(r->j);
    job *rj;
    if (create_rank_job(r, 0, &rj, err, errlen))
        return -1;
    m->main = r->j;
    r->j = rj;
    if (pthread_mutex_init(&m->mu, NULL))
        return util_errf(err, errlen, "cannot create a mutex.");
    m->mu_on = true;
    m->last = m->n_order == 0;
    if (m->size > 1) {
        if (pthread_create(&m->thr, NULL, dispatch, m))
            return util_errf(err, errlen, "cannot start the thread that hands rows to the other ranks.");
        m->thr_on = true;
    }
    return 0;
}

/* ---------------------------------------------------------------- passes */

/* The index of the first row read from input line `line`, or (size_t)-1. */
static size_t first_row(const runner *r, size_t line)
{
    size_t lo = 0, hi = r->n_rows;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->rows[mid].line < line)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->n_rows && r->rows[lo].line == line ? lo : (size_t)-1;
}

/* Queues the rows of the n granted lines that fit this rank's cache (the others get their error line).
 * Returns the rows queued, or -1 with a sentence. */
static long queue_lines(runner *r, const int64_t *lines, size_t n, char *err, size_t errlen)
{
    struct mpi_run *m = r->mpi;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t f = first_row(r, (size_t)lines[i]);
        if (f == (size_t)-1 || r->rows[f].state != ROW_PENDING)
            return util_errf(err, errlen, "rank %d: rank 0 handed out input line %lld, which this rank does not hold "
                                          "as a pending row; the ranks read different inputs.", m->rank,
                             (long long)lines[i]);
        int members = r->rows[f].group_n > 1 ? r->rows[f].group_n : 1, fit = 0;
        for (int j = 0; fit == 0 && j < members; j++)
            fit = run_fail_unfit(r, f + (size_t)j, err, errlen);
        if (fit < 0)
            return -1;
        for (int j = 0; fit == 0 && j < members; j++)
            m->idx[k++] = f + (size_t)j;
    }
    sched_enqueue(&r->s, m->idx, k);
    return (long)k;
}

static void news_of(const runner *r, int64_t want, bool interrupted, int64_t msg[NEWS_LEN])
{
    msg[0] = want;
    msg[1] = (int64_t)r->rows_done;
    msg[2] = (int64_t)r->rows_failed;
    msg[3] = (int64_t)r->tokens_generated;
    msg[4] = (int64_t)r->s.n_active;
    msg[5] = interrupted;
}

int mpi_run_refill(runner *r, char *err, size_t errlen)
{
    struct mpi_run *m = r->mpi;
    int64_t msg[NEWS_LEN];
    if (m->rank > 0) {
        int flag = 0;
        MPI_Iprobe(0, TAG_STOP, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        if (flag) {
            MPI_Recv(msg, 1, MPI_INT64_T, 0, TAG_STOP, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            return 1;
        }
        double now = wall_s();
        if (now - m->t_news >= 1.0) {
            news_of(r, 0, false, msg);
            MPI_Send(msg, NEWS_LEN, MPI_INT64_T, 0, TAG_NEWS, MPI_COMM_WORLD);
            m->t_news = now;
        }
    }
    /* ask while the queue is empty and batch slots are free (a grant whose rows all failed asks again) */
    while (!m->last && r->s.q_len == 0 && r->s.n_active < (size_t)r->batch) {
        int64_t want = r->batch - (int64_t)r->s.n_active;
        size_t n;
        int64_t flags;
        if (m->rank == 0) {
            pthread_mutex_lock(&m->mu);
            n = m->stop ? 0 : take(m, want, m->lines + 1);
            flags = (m->next == m->n_order ? GRANT_LAST : 0) | (m->stop ? GRANT_STOP : 0);
            pthread_mutex_unlock(&m->mu);
        } else {
            news_of(r, want, false, msg);
            MPI_Send(msg, NEWS_LEN, MPI_INT64_T, 0, TAG_ASK, MPI_COMM_WORLD);
            MPI_Status st;
            int count = 0;
            MPI_Probe(0, TAG_GRANT, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_INT64_T, &count);
            if (count < 1 || (size_t)count > r->n_rows + 1)
                return util_errf(err, errlen, "rank %d: a grant of %d entries from rank 0 does not fit this rank's "
                                              "%zu rows; the ranks read different inputs.", m->rank, count, r->n_rows);
            MPI_Recv(m->lines, count, MPI_INT64_T, 0, TAG_GRANT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            n = (size_t)count - 1;
            flags = m->lines[0];
            m->t_news = wall_s();
        }
        if (flags & GRANT_STOP)
            return 1;
        m->last = (flags & GRANT_LAST) != 0;
        if (queue_lines(r, m->lines + 1, n, err, errlen) < 0)
            return -1;
    }
    return 0;
}

void mpi_run_totals(runner *r, double elapsed, uint64_t *finished, uint64_t *generated, size_t *in_flight,
                    double *eta)
{
    struct mpi_run *m = r->mpi;
    if (m->ended) {
        *finished = r->rows_done + r->rows_failed, *generated = r->tokens_generated, *in_flight = 0, *eta = 0;
        return;
    }
    uint64_t f = m->base + r->rows_done + r->rows_failed, g = r->tokens_generated;
    size_t a = r->s.n_active;
    if (m->mu_on) {
        pthread_mutex_lock(&m->mu);
        for (int k = 1; m->news && k < m->size; k++)
            f += m->news[k].done + m->news[k].failed, g += m->news[k].tokens, a += m->news[k].in_flight;
        pthread_mutex_unlock(&m->mu);
    }
    *finished = f, *generated = g, *in_flight = a;
    uint64_t now = f - m->base; /* rows this attempt finished */
    *eta = now > 0 && elapsed > 0 && r->rows_total >= f ? (double)(r->rows_total - f) * elapsed / (double)now : -1;
}

/* ---------------------------------------------------------------- the end */

int mpi_run_finish(runner *r, bool interrupted, void (*tick)(runner *r), char *err, size_t errlen)
{
    struct mpi_run *m = r->mpi;
    int rc = job_close(r->j, JOB_INTERRUPTED, err, errlen); /* a rank's directory holds a share, never "done" */
    r->j = NULL;
    if (rc)
        return -1;
    if (m->rank > 0) {
        int64_t msg[NEWS_LEN];
        news_of(r, 0, interrupted, msg);
        msg[4] = 0;
        MPI_Send(msg, NEWS_LEN, MPI_INT64_T, 0, TAG_BYE, MPI_COMM_WORLD);
        m->together = true;
        return interrupted ? 1 : 0;
    }
    pthread_mutex_lock(&m->mu);
    if (interrupted)
        m->stop = true; /* the dispatcher tells every rank to checkpoint */
    pthread_mutex_unlock(&m->mu);
    double t_tick = wall_s();
    for (bool all = false; !all;) {
        pthread_mutex_lock(&m->mu);
        all = m->byes == m->size - 1;
        pthread_mutex_unlock(&m->mu);
        if (!all && wall_s() - t_tick >= 1.0) {
            tick(r);
            t_tick = wall_s();
        }
        struct timespec ms = {0, 10000000L};
        if (!all)
            nanosleep(&ms, NULL);
    }
    if (m->thr_on)
        pthread_join(m->thr, NULL);
    m->thr_on = false;
    m->together = true;
    json_t *by_rank = json_array();
    json_array_append_new(by_rank, json_integer((json_int_t)(r->rows_done + r->rows_failed)));
    for (int k = 1; k < m->size; k++) {
        r->tokens_generated += m->news[k].tokens;
        interrupted |= m->news[k].interrupted;
        json_array_append_new(by_rank, json_integer((json_int_t)(m->news[k].done + m->news[k].failed)));
    }
    uint64_t merged = 0, dups = 0;
    if (fold_ranks(r->o.out_dir, m->main, &merged, &dups, err, errlen))
        return -1;
    /* this attempt's outcome, the last entry of "mpi" */
    json_t *arr = json_deep_copy(json_object_get(job_manifest(m->main), "mpi"));
    json_t *last = json_array_get(arr, json_array_size(arr) - 1);
    if (!last || json_object_set_new(last, "rows_by_rank", by_rank) ||
        json_object_set_new(last, "rows_merged", json_integer((json_int_t)merged)) ||
        json_object_set_new(last, "duplicates_dropped", json_integer((json_int_t)dups)) ||
        json_object_set_new(last, "ended_at", json_integer((json_int_t)time(NULL))) ||
        job_set_info(m->main, "mpi", arr, err, errlen)) {
        if (!last)
            json_decref(arr);
        return util_errf(err, errlen, "out of memory recording the ranks in the manifest.");
    }
    double el = wall_s() - (r->t_start > 0 ? r->t_start : wall_s());
    job_set_info(m->main, "throughput",
                 json_pack("{s:f,s:I,s:I,s:f}", "seconds", el, "tokens_generated", (json_int_t)r->tokens_generated,
                           "ranks", (json_int_t)m->size, "tok_s", el > 0 ? (double)r->tokens_generated / el : 0),
                 err, errlen);
    r->rows_done = job_rows_completed(m->main);
    r->rows_failed = job_rows_failed(m->main);
    bool complete = r->rows_done + r->rows_failed == job_rows_total(m->main);
    rc = job_close(m->main, complete ? JOB_DONE : JOB_INTERRUPTED, err, errlen);
    m->main = NULL;
    if (rc)
        return -1;
    char rd[PATH_MAX];
    if (complete && !util_pathf(rd, sizeof rd, "%s/ranks", r->o.out_dir))
        rmdir(rd);
    m->ended = true;
    return complete ? 0 : 1;
}

void mpi_run_end(runner *r, int code)
{
    struct mpi_run *m = r->mpi;
    if (!m)
        return;
    if (m->thr_on) {
        pthread_mutex_lock(&m->mu);
        m->quit = true;
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->thr, NULL);
    }
    if (m->main)
        job_close(m->main, job_is_broken(m->main) ? JOB_RUNNING : JOB_INTERRUPTED, NULL, 0);
    if (!m->voted) { /* this rank failed before the start: the others learn it from the vote */
        for (int t = 0; !m->turned && t < m->size; t++)
            MPI_Barrier(MPI_COMM_WORLD);
        vote(m, false);
        m->together = true;
    }
    if (m->mu_on)
        pthread_mutex_destroy(&m->mu);
    free(m->idx), free(m->lines), free(m->order), free(m->grant), free(m->news);
    bool together = m->together || code == 0;
    free(m);
    r->mpi = NULL;
    if (together)
        MPI_Finalize();
    else
        MPI_Abort(MPI_COMM_WORLD, code); /* alone mid-job: end the others (their committed rows are safe) */
}

#endif
