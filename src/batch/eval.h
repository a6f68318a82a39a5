/*
 * eval.h — `spill eval INPUT MODEL [MODEL...] --metric M [--metric M2...] [--judge MODEL] [--rerun] [-o DIR]`
 * (see eval.c).  Returns the process exit code; never exits.
 */
#ifndef SPILL_EVAL_H
#define SPILL_EVAL_H

int eval_main(int argc, char **argv);

#endif
