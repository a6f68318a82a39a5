#!/usr/bin/env bash
# Runs each named libFuzzer target for SECONDS seconds on its seed corpus
# (fuzz/seeds/<target>/, copied to a scratch dir so the repo stays clean).
set -u
cd "$(dirname "$0")/.."
secs=$1; shift
fail=0
for f in "$@"; do
    work=fuzz/corpus-run/$f
    mkdir -p "$work"
    [ -d fuzz/seeds/$f ] && cp -n fuzz/seeds/$f/* "$work"/ 2>/dev/null
    opts=""
    [ -f fuzz/$f.options ] && opts=$(cat fuzz/$f.options)
    echo "fuzz $f for ${secs}s"
    if ! ./build/fuzz/$f -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 $opts "$work" >fuzz/corpus-run/$f.log 2>&1; then
        echo "FUZZ FAILURE in $f:"; tail -n 40 fuzz/corpus-run/$f.log; fail=1
    else
        tail -n 1 fuzz/corpus-run/$f.log
    fi
done
exit $fail
