/*
 * run_worker.c — `spill worker MODEL` (hidden): the resident runner `spill serve` starts per model (issue 17).
 *
 * Protocol: one command a line on stdin, fields separated by tabs (the store's paths hold no tab or newline:
 * serve makes them from checked ids):
 *     run <TAB> DATA <TAB> JOBDIR <TAB> CSV <TAB> LOG      = spill run MODEL DATA -o JOBDIR --quiet --pass-log CSV
 *     resume <TAB> JOBDIR <TAB> CSV <TAB> LOG              = spill resume JOBDIR --quiet --pass-log CSV
 * Each job runs in this process (run_main / resume_main) with stdout and stderr appended to LOG, and its exit
 * code — the one the child `spill run` would have had — is answered as one line "N\n" on fd 3.  EOF on stdin
 * ends the worker (exit 0).
 *
 * `spill worker MODEL OPTION...`: the options after MODEL are given to every run job (e.g. --gpu --stream); a
 * resume takes its job's own.
 *
 * Decisions: the worker serves the one MODEL it was started for and keeps its opened weights, tokenizer and
 * template between jobs (run_keep_enable, run.c); the backend is opened per job, but the GPU engine's pinned
 * copy of the streamed layers is kept (engine/host_share.h keep mode), so the next job maps it.  SIGINT during a job ends
 * that job checkpointed with 75 (run.c's handler, installed by the first job and left in place; run_job clears
 * the flag when the next job starts); a SIGINT while idle is absorbed (the read retries).  The worker never
 * runs under MPI (serve starts it without a launcher).  Each job's log gets a line naming the worker's pid and
 * the job, so a test can tell which worker ran which batch; a model open prints "model opened" (run.c).
 */
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/exit.h"

/* Splits line (modified) at tabs into at most cap fields; returns how many. */
static int split_tabs(char *line, char **f, int cap)
{
    int n = 0;
    char *p = line;
    while (n < cap) {
        f[n++] = p;
        char *t = strchr(p, '\t');
        if (!t)
            break;
        *t = '\0';
        p = t + 1;
    }
    return n;
}

/* Points stdout and stderr at log (appended); 0, or -1 when it cannot be opened (they stay as they were). */
static int to_log(const char *log)
{
    fflush(stdout);
    fflush(stderr);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    return 0;
}

int worker_main(int argc, char **argv)
{
    if (argc < 1 || argc > 24) {
        fprintf(stderr, "usage: spill worker MODEL [RUN OPTION...]   (started by spill serve; commands on stdin, "
                        "answers on fd 3)\n");
        return SPILL_EX_USAGE;
    }
    char *model = argv[0];
    FILE *ans = fdopen(3, "w");
    if (!ans) {
        fprintf(stderr, "spill worker: fd 3 (the answer pipe) is not open: %s.\n", strerror(errno));
        return SPILL_EX_USAGE;
    }
    run_keep_enable();
    char *line = NULL;
    size_t cap = 0;
    int jobs = 0;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            if (ferror(stdin) && errno == EINTR) { /* a SIGINT that came after its job ended */
                clearerr(stdin);
                continue;
            }
            break;
        }
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = '\0';
        char *f[6];
        int nf = split_tabs(line, f, 6);
        int code;
        if (nf == 5 && !strcmp(f[0], "run")) {
            to_log(f[4]);
            fprintf(stderr, "spill worker %d: job %d: run %s\n", (int)getpid(), ++jobs, f[2]);
            char *av[32] = {model, f[1], (char *)"-o", f[2], (char *)"--quiet", (char *)"--pass-log", f[3]};
            int ac = 7;
            for (int i = 1; i < argc; i++) /* the worker's own run options, after its model: every run job's */
                av[ac++] = argv[i];
            av[ac] = NULL;
            code = run_main(ac, av);
        } else if (nf == 4 && !strcmp(f[0], "resume")) {
            to_log(f[3]);
            fprintf(stderr, "spill worker %d: job %d: resume %s\n", (int)getpid(), ++jobs, f[1]);
            char *av[] = {f[1], (char *)"--quiet", (char *)"--pass-log", f[2], NULL};
            code = resume_main(4, av);
        } else {
            fprintf(stderr, "spill worker: not a command: %s\n", line);
            code = SPILL_EX_USAGE;
        }
        fflush(stdout);
        fflush(stderr);
        fprintf(ans, "%d\n", code);
        fflush(ans);
    }
    free(line);
    run_keep_free();
    return SPILL_EX_OK;
}
