/*
 * run.h — `spill run` and `spill resume` (see run.c).  Each returns the
 * process exit code and never exits itself.
 */
#ifndef SPILL_RUN_H
#define SPILL_RUN_H

int run_main(int argc, char **argv);
int resume_main(int argc, char **argv);

#endif
