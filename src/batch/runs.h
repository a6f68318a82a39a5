/*
 * runs.h — the run store: every job (run, distill, eval's model runs, resume) is a directory whose name is its
 * run id.  Jobs made without -o live in $SPILL_HOME/jobs/<id>/; a job given a directory elsewhere is found by
 * its id through the link $SPILL_HOME/runs/<id> -> that directory.  `spill runs` lists both.
 */
#ifndef SPILL_RUNS_H
#define SPILL_RUNS_H

#include <stddef.h>

/* Links $SPILL_HOME/runs/<id> to dir (absolute) unless dir is $SPILL_HOME/jobs/<id>; an id already linked to
 * another existing directory keeps its link (then 1: the caller says that this run resumes by its directory
 * only).  0, 1, or -1 with a sentence. */
int runs_register(const char *dir, const char *id, char *err, size_t errlen);

/* The directory of run `id_or_dir`: an existing directory as given, else $SPILL_HOME/jobs/<id>, else the link
 * $SPILL_HOME/runs/<id>.  0 with dir filled, or -1 with a sentence naming where it looked. */
int runs_resolve(const char *id_or_dir, char *dir, size_t cap, char *err, size_t errlen);

/* `spill runs [show ID | rm ID... | clean --older-than DAYS [--dry-run]]`; the process exit code. */
int runs_main(int argc, char **argv);

#endif
