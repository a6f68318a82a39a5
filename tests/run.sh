#!/usr/bin/env bash
# Runs each named test binary from build/asan/tests with the repo root as cwd;
# prints one line per test and exits non-zero if any failed.
set -u
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fail=0
for t in "$@"; do
    if ./build/asan/tests/"$t" >build/asan/tests/"$t".log 2>&1; then
        echo "PASS $t ($(tail -n 1 build/asan/tests/"$t".log))"
    else
        echo "FAIL $t — last lines of build/asan/tests/$t.log:"
        tail -n 30 build/asan/tests/"$t".log | sed 's/^/    /'
        fail=1
    fi
done
exit $fail
