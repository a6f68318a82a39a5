/*
 * mpi_run.h — `spill run` / `spill resume` as several MPI ranks (mpirun, srun): one job, its rows handed out
 * by rank 0, one merged output.  mpi_run.c says how; run.c calls these at its seams (each call site is under
 * #ifdef SPILL_MPI, which the Makefile defines when it finds an MPI compiler and headers), except
 * mpi_run_init, which every binary has: one built without MPI refuses to run as one of several ranks.
 */
#ifndef SPILL_MPI_RUN_H
#define SPILL_MPI_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "run_internal.h"

/*
 * Called first by every `spill run` / `spill resume`.  Not launched by mpirun or srun (no launcher variables in
 * the environment): returns 0 and leaves r->mpi NULL, r->n_ranks 0 — the one-process job, unchanged.  Launched:
 * initialises MPI (MPI_THREAD_SERIALIZED: rank 0's dispatcher thread makes its MPI calls while the main thread
 * makes none) and sets r->mpi, r->rank, r->n_ranks from MPI.  -1 with a sentence when this binary has no MPI, or
 * when the launcher started several tasks but MPI sees one (srun without --mpi=pmix).
 */
int mpi_run_init(runner *r, char *err, size_t errlen);

#ifdef SPILL_MPI
/* Runs run_open_weights(r, path) on one rank at a time, rank 0 first (the --quant copy is written once on a
 * shared $SPILL_HOME and found by the others).  0, or -1 with this rank's sentence. */
int mpi_run_in_turn(runner *r, const char *path, char *err, size_t errlen);

/*
 * The job for this rank, in place of run_open_job.  Rank 0 opens DIR's job (creates it, or reopens it and
 * folds into it every row an earlier attempt's ranks committed in DIR/ranks/, removing those directories);
 * r->j is that job until mpi_run_start.  Then every rank learns rank 0's outcome, run id, model fingerprint,
 * input hash and job seed (the RNG key of unseeded rows, so a row draws the same on any rank); the other
 * ranks check the model and input they opened against them and create DIR/ranks/<rank> as their r->j.  0, or
 * -1 with a sentence (the same outcome on every rank when rank 0 failed).
 */
int mpi_run_open(runner *r, const job_stored *stored, char *err, size_t errlen);

/*
 * After the set-up (rows read, plan made, backend open, scheduler built), before the first pass.  Every rank
 * empties its queue (rows now wait for rank 0); rank 0 keeps the queue's order (longest first) as the job's
 * hand-out order, records this attempt (ranks, hosts) in DIR's manifest, creates DIR/ranks/0 as its r->j and
 * starts the dispatcher thread that answers the other ranks.  0, or -1 with a sentence.
 */
int mpi_run_start(runner *r, char *err, size_t errlen);

/*
 * Between passes.  When this rank's queue is empty and it has free batch slots, asks rank 0 for rows (rank 0
 * takes them itself, under the dispatcher's lock) and queues the ones that fit its cache (the others get
 * their error line here); reports its progress to rank 0 about once a second.  0 to go on (no pending row
 * left then means the job's rows are all handed out), 1 when rank 0 asks every rank to checkpoint and stop,
 * -1 with a sentence.
 */
int mpi_run_refill(runner *r, char *err, size_t errlen);

/* Rank 0's progress line for the whole job: rows finished (before this attempt and by every rank since),
 * tokens generated, rows in flight, and the ETA from this attempt's rows/s (< 0 before a row finished). */
void mpi_run_totals(runner *r, double elapsed, uint64_t *finished, uint64_t *generated, size_t *in_flight,
                    double *eta);

/*
 * After this rank's passes (interrupted: SIGINT/SIGTERM, or rank 0's stop).  Closes this rank's job (its rows
 * committed) and tells rank 0.  Rank 0 then waits for every rank (calling tick about once a second), folds
 * every DIR/ranks/<k> into DIR's results.jsonl / errors.jsonl (each custom_id once), removes them, and closes
 * DIR's job done — or interrupted when rows are missing.  Sets r->rows_done, rows_failed and tokens_generated
 * to the job's totals on rank 0.  r->j is closed and must be set NULL.  0 when the job is done, 1 when it is
 * resumable (interrupted), -1 with a sentence.
 */
int mpi_run_finish(runner *r, bool interrupted, void (*tick)(runner *r), char *err, size_t errlen);

/*
 * Last, with the exit code.  Stops rank 0's dispatcher and closes DIR's job if still open; a rank that failed
 * before the ranks agreed to start tells the others so (everyone then exits with a sentence); then
 * MPI_Finalize when the ranks end together (done, interrupted, or failed before the start), or MPI_Abort when
 * this rank failed alone mid-job (the others are killed; every committed row is safe and `spill resume`
 * finishes).  Frees r->mpi.
 */
void mpi_run_end(runner *r, int code);
#endif

#endif
