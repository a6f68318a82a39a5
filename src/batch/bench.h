/*
 * bench.h — `spill bench MODEL`: decode throughput against batch size and
 * weight tier on this machine, each point beside its tier's limit, written
 * as bench.csv, bench.md and bench.svg.
 */
#ifndef SPILL_BENCH_H
#define SPILL_BENCH_H

#include <stdio.h>

/* Prints the options (spill bench --help). */
void bench_help(FILE *f);

/* `spill bench MODEL [--batches 1,8,32] [--tiers resident,stream,...] [--prompt N] [--gen N] [--seconds S]
 * [--threads N] [--q8-activations] [-o DIR]` (argv after the command word).  Prints a table as it goes and
 * rewrites DIR/bench.{csv,md,svg} after every point.  Returns the exit code (base/exit.h): 0; 2 on bad
 * arguments (one sentence on stderr) or when no tier can run; 66 / 65 when the model is missing / unreadable;
 * 73 / 74 when the files cannot be created / written; 70 when a tier failed (what was measured is written);
 * 75 on a GPU fault. */
int bench_main(int argc, char **argv);

#endif
