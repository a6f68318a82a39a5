/*
 * exit.h — spill's exit codes, the one place they are defined.
 *
 * Library code never exits: command entry points (run_main, check_main,
 * probe_main, ...) return one of these to main(), which exits with it.  The
 * numbers follow BSD sysexits.h where one fits, except bad arguments: 2, as
 * for every GNU tool (sysexits' 64 is what `spill check` used to return).
 *
 *   0  SPILL_EX_OK           success
 *   2  SPILL_EX_USAGE        bad arguments or options, for every command; also set-up refusals a user
 *                            fixes on the command line (an option this build or engine cannot honour, a
 *                            memory budget too small for the longest row)
 *   65 SPILL_EX_DATAERR      invalid input data or model files (a malformed line, a model whose
 *                            architecture is not wired into the engine)
 *   66 SPILL_EX_NOINPUT      an input, model or job that does not exist or cannot be read (also on the model
 *                            hub: no such repo, revision or file, or a gated repo without a token)
 *   69 SPILL_EX_UNAVAILABLE  the command is not built yet, or a service it needs is unavailable (the model hub
 *                            cannot be reached: network down, server errors; HF_HUB_OFFLINE=1 works offline)
 *   70 SPILL_EX_SOFTWARE     an internal error (a bug, or out of memory)
 *   73 SPILL_EX_CANTCREAT    the output cannot be created (a model download larger than the free disk too)
 *   74 SPILL_EX_IOERR        an I/O error while reading or writing (a downloaded file that fails its checksum
 *                            twice too)
 *   75 SPILL_EX_TEMPFAIL     interrupted (SIGINT/SIGTERM after a checkpoint) or a GPU fault: the job is
 *                            resumable with `spill resume`.  Nothing else exits 75, so a script may
 *                            retry exactly on 75.
 */
#ifndef SPILL_EXIT_H
#define SPILL_EXIT_H

enum spill_exit {
    SPILL_EX_OK = 0,
    SPILL_EX_USAGE = 2,
    SPILL_EX_DATAERR = 65,
    SPILL_EX_NOINPUT = 66,
    SPILL_EX_UNAVAILABLE = 69,
    SPILL_EX_SOFTWARE = 70,
    SPILL_EX_CANTCREAT = 73,
    SPILL_EX_IOERR = 74,
    SPILL_EX_TEMPFAIL = 75,
};

#endif
