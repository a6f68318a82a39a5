#!/usr/bin/env bash
# device_build.sh — builds, on this (dev) machine, the GPU binaries the H200 machine runs: `make cuda` with
# jansson, PCRE2, utf8proc and libcrypto linked statically (the GPU machine has no -dev packages and none of
# utf8proc), cuBLAS and the C library dynamic (glibc here is older than there, so the binaries run there).
# Copies them to .carry/bin and packs them, stripped of debug info, with .carry/base (the same binaries built from
# an older commit, for A/B runs, when present) into .carry/pack.tar.xz (~9 MB: the tree that travels is capped at
# 64 MiB).  .carry/ is ignored through .git/info/exclude.
#   tools/device_build.sh   then: run(command="tar -xJf .carry/pack.tar.xz && tools/device_house.sh",
#                                      carry=[".carry/pack.tar.xz"])
set -euo pipefail
cd "$(dirname "$0")/.."
A=/usr/lib/x86_64-linux-gnu
SLIBS="$A/libmicrohttpd.a -lgnutls $A/libjansson.a $A/libpcre2-8.a $A/libutf8proc.a $A/libcrypto.a -lcurl -ldl -lpthread"
# spill-cuda-mpi: the CLI with the ranks (src/batch/mpi_run.c), libmpi.so.40 linked dynamically: the GPU machine has
# Ubuntu's OpenMPI 4.1.6 (mpirun, libmpi.so.40), the ABI of Debian's 4.1.4 here
rm -f build/cuda/spill-cuda
make -j2 build/cuda/spill-cuda CUDA_LIBS="$A/libjansson.a $A/libpcre2-8.a $A/libcrypto.a -lcurl -ldl -lpthread" \
    CUDA_SPILL_LIBS="$SLIBS"
mkdir -p .carry/bin
cp build/cuda/spill-cuda .carry/bin/spill-cuda-mpi
rm -f build/cuda/spill-cuda
# MPI_OK=no: spill-cuda itself is built without the ranks (one process; no libmpi needed)
make -j2 cuda MPI_OK=no CUDA_LIBS="$A/libjansson.a $A/libpcre2-8.a $A/libcrypto.a -lcurl -ldl -lpthread" \
    CUDA_SPILL_LIBS="$A/libmicrohttpd.a -lgnutls $A/libjansson.a $A/libpcre2-8.a $A/libutf8proc.a $A/libcrypto.a -lcurl -ldl -lpthread"
mkdir -p .carry/bin
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.carry/' >> .git/info/exclude; }
cp build/cuda/test_* build/cuda/bench_pass build/cuda/bench_dequant build/cuda/bench_fp8 build/cuda/spill-cuda .carry/bin/
rm -f .carry/bin/*.o
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in .carry/bin/* .carry/base/*; do
    [ -f "$f" ] || continue
    mkdir -p "$tmp/$(dirname "$f")"
    strip --strip-debug -o "$tmp/$f" "$f"
done
tar -C "$tmp" -cJf .carry/pack.tar.xz .carry
ls -la .carry/bin .carry/pack.tar.xz
