/*
 * run.h — `spill run` and `spill resume` (see run.c).  Each returns the
 * process exit code and never exits itself.
 */
#ifndef SPILL_RUN_H
#define SPILL_RUN_H

#include <stdbool.h>
#include <stdio.h>

int run_main(int argc, char **argv);
int resume_main(int argc, char **argv);
/* `spill distill`: spill run with log-probs for every row, full logits or teacher-forced scoring. */
int distill_main(int argc, char **argv);
/* Prints spill run's (resume: spill resume's; cmd 1: spill distill's) usage and every option, one line each,
 * from the table the option parser reads. */
void run_opts_help(FILE *f, bool resume, int cmd);
/* From now on this process keeps the last job's opened model, tokenizer and template for the next job of the
 * same model (run.c's opening comment); run_keep_free drops them; run_keep_opens counts the models opened since. */
void run_keep_enable(void);
void run_keep_free(void);
int run_keep_opens(void);
/* `spill worker MODEL` (hidden; run_worker.c): serve's resident runner.  Returns the exit code. */
int worker_main(int argc, char **argv);

#endif
