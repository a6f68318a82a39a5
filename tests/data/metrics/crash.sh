#!/bin/sh
# Reads the row, then dies of SIGSEGV: metric_score must report the signal.
cat >/dev/null
kill -SEGV $$
