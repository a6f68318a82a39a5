#!/usr/bin/env bash
# device_build.sh — builds, on this (dev) machine, the GPU binaries the H200 machine runs: `make cuda` with
# jansson, PCRE2, utf8proc and libcrypto linked statically (the GPU machine has no -dev packages and none of
# utf8proc), cuBLAS and the C library dynamic (glibc here is older than there, so the binaries run there).
# Copies them to .carry/bin, which `run` carries (.carry/ is ignored through .git/info/exclude).
#   tools/device_build.sh        then: run(command="tools/cuda_device_run.sh tests ...", carry=[".carry/bin"])
set -euo pipefail
cd "$(dirname "$0")/.."
A=/usr/lib/x86_64-linux-gnu
make -j2 cuda CUDA_LIBS="$A/libjansson.a $A/libcrypto.a -ldl -lpthread" \
    CUDA_SPILL_LIBS="$A/libjansson.a $A/libpcre2-8.a $A/libutf8proc.a $A/libcrypto.a -ldl -lpthread"
mkdir -p .carry/bin
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.carry/' >> .git/info/exclude; }
cp build/cuda/test_* build/cuda/bench_pass build/cuda/spill-cuda .carry/bin/
rm -f .carry/bin/*.o
ls -la .carry/bin
