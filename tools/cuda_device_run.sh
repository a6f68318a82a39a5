#!/usr/bin/env bash
# cuda_device_run.sh — the one script the GPU machine runs: build (or take the
# carried binaries), run the GPU tests, run the pass benchmarks, and leave logs
# and CSVs in $OUT (default bench/results/cuda-local).
#
#   tools/cuda_device_run.sh [tests|bench8b|bench8b_extra|bench70b40 ...]   (default: tests bench8b)
#
# Binaries: prefers .carry/bin (built on the dev machine with nvcc -arch=sm_90,
# jansson and libcrypto linked statically, cuBLAS and the C library dynamic);
# when those cannot load here, builds with `make cuda` using the headers and
# static archives carried in .carry/include and .carry/lib.
# Each step runs under `timeout` so the whole call ends inside the lease.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/cuda-local}
mkdir -p "$OUT"
steps=${*:-tests bench8b}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }

for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in os.listdir(p)))' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
export LD_LIBRARY_PATH

{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv; uname -a; nproc; free -g; } > "$OUT/machine.txt" 2>&1

BIN=.carry/bin
if [ ! -x "$BIN/test_cuda_ops" ] || ldd "$BIN/test_cuda_ops" | grep -q "not found"; then
    log "carried binaries unusable here ($(ldd "$BIN/test_cuda_ops" 2>&1 | grep 'not found' | tr '\n' ' ')); building"
    if make cuda CUDA_CFLAGS="-I.carry/include" \
        CUDA_LIBS=".carry/lib/libjansson.a .carry/lib/libpcre2-8.a .carry/lib/libcrypto.a -ldl -lpthread" >> "$OUT/run.log" 2>&1; then
        BIN=build/cuda
    else
        log "build failed"; exit 1
    fi
fi
log "binaries: $BIN"

rc_all=0
for s in $steps; do
    case $s in
    tests)
        log "test_cuda_ops"
        timeout 60 "$BIN/test_cuda_ops" > "$OUT/tests.log" 2>&1; rc=$?
        log "test_cuda_ops rc=$rc"; [ $rc -ne 0 ] && rc_all=1
        log "test_cuda_engine"
        timeout 90 "$BIN/test_cuda_engine" >> "$OUT/tests.log" 2>&1; rc=$?
        log "test_cuda_engine rc=$rc"; [ $rc -ne 0 ] && rc_all=1
        log "test_cuda_engine with CUDA-core prompt attention (SPILL_CUDA_ATT=fp32)"
        SPILL_CUDA_ATT=fp32 timeout 90 "$BIN/test_cuda_engine" >> "$OUT/tests.log" 2>&1; rc=$?
        log "test_cuda_engine (fp32 attention) rc=$rc"; [ $rc -ne 0 ] && rc_all=1
        log "test_cuda_engine with int8 KV pages (SPILL_TEST_KV=int8)"
        SPILL_TEST_KV=int8 timeout 90 "$BIN/test_cuda_engine" >> "$OUT/tests.log" 2>&1; rc=$?
        log "test_cuda_engine (int8 KV) rc=$rc"; [ $rc -ne 0 ] && rc_all=1
        tail -n 40 "$OUT/tests.log"
        ;;
    bench8b)
        log "bench 8B-shaped bf16, 32 layers streamed from pinned RAM"
        timeout 120 "$BIN/bench_pass" --label 8b --csv "$OUT/bench_pass.csv" --resident-too \
            > "$OUT/bench.log" 2>&1; rc=$?
        log "bench8b rc=$rc"; cat "$OUT/bench.log"
        ;;
    bench8b_extra)
        log "bench 8B: logits copied to a caller buffer; a resident prefix of 8 layers"
        timeout 60 "$BIN/bench_pass" --label 8b --csv "$OUT/bench_pass.csv" --copy-logits --batches 1024 \
            --prefill-rows 0 >> "$OUT/bench.log" 2>&1; rc=$?
        timeout 60 "$BIN/bench_pass" --label 8b --csv "$OUT/bench_pass.csv" --resident-layers 8 --batches 64,1024 \
            --prefill-rows 64 >> "$OUT/bench.log" 2>&1; rc2=$?
        log "bench8b_extra rc=$rc/$rc2"; tail -n 12 "$OUT/bench.log"
        ;;
    bench70b40)
        log "bench 70B-shaped bf16, 40 of 80 layers streamed from pinned RAM"
        timeout 190 "$BIN/bench_pass" --label 70b40 --layers 40 --d 8192 --heads 64 --kv-heads 8 --ffn 28672 \
            --batches 1,64,256,1024 --reps 3 --csv "$OUT/bench_pass.csv" >> "$OUT/bench.log" 2>&1; rc=$?
        log "bench70b40 rc=$rc"; tail -n 12 "$OUT/bench.log"
        ;;
    *) log "unknown step $s" ;;
    esac
done
exit $rc_all
