# cuda.mk — the CUDA backend's build rules; the Makefile includes this only when
# nvcc is on PATH.  `make cuda` builds build/cuda/libspillcuda.a, the GPU tests
# and the pass benchmark; `make test-cuda` runs the GPU tests (needs a GPU).
#
# The CPU sources the GPU binaries need (the oracle ops, loaders, KV pages) are
# compiled here without sanitizers: ASan and the CUDA runtime do not mix.
# On a machine without jansson/openssl headers, point CUDA_CFLAGS at copies
# (-I.carry/include) and CUDA_LIBS at static archives (tools/cuda_device_run.sh).

CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS  ?= -O2 -g -arch=sm_90 -std=c++17 -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
CUDA_CFLAGS ?=
CUDA_LIBS  ?= -ljansson -lpcre2-8 -lcrypto -lcurl
CUDA_LINK  := -L$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart_static -ldl -lrt -lpthread -lm -lstdc++

CUDA_OBJ   := $(patsubst src/cuda/%.cu,build/cuda/%.o,$(wildcard src/cuda/*.cu))
# model/lora (the adapter loader) lands with the CPU engine's LoRA branch: listed once its file exists (the GPU
# code itself needs only model/lora.h's structs), so the line is ready before and after that merge.
CUDA_CSRC  := engine/cpu base/pool base/settings model/quant model/quantize model/pack model/gguf_write engine/kv model/arch model/model model/registry model/hub model/size model/gguf model/safetensors base/util engine/stream engine/forward engine/moe model/templates batch/sample model/lora engine/lora_cpu engine/host_share
CUDA_COBJ  := $(patsubst %,build/cuda/c/%.o,$(CUDA_CSRC))
CUDA_TESTS := $(patsubst tests/cuda/%.c,build/cuda/%,$(wildcard tests/cuda/test_*.c))

.PHONY: cuda test-cuda

build/cuda/%.o: src/cuda/%.cu $(wildcard src/cuda/*.cuh) $(wildcard src/cuda/*.h) $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/cuda/c/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -g $(CUDA_CFLAGS) -c $< -o $@

build/cuda/libspillcuda.a: $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^

build/cuda/test_%: tests/cuda/test_%.c tests/test.h build/cuda/libspillcuda.a $(CUDA_COBJ)
	$(CC) $(WARN) -O1 -g -Isrc -Itests $(CUDA_CFLAGS) -o $@ $< build/cuda/libspillcuda.a $(CUDA_COBJ) $(CUDA_LINK) $(CUDA_LIBS)

build/cuda/bench_pass: bench/cuda/bench_pass.c build/cuda/libspillcuda.a $(CUDA_COBJ)
	$(CC) $(WARN) -O2 -g -Isrc -Itests $(CUDA_CFLAGS) -o $@ $< build/cuda/libspillcuda.a $(CUDA_COBJ) $(CUDA_LINK) $(CUDA_LIBS)

build/cuda/bench_dequant: bench/cuda/bench_dequant.cu build/cuda/libspillcuda.a
	$(NVCC) $(NVCCFLAGS) -Isrc -o $@ $< build/cuda/libspillcuda.a -L$(CUDA_HOME)/lib64 -lcublas

build/cuda/bench_fp8: bench/cuda/bench_fp8.cu build/cuda/libspillcuda.a
	$(NVCC) $(NVCCFLAGS) -Isrc -o $@ $< build/cuda/libspillcuda.a -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas

# spill-cuda: the whole CLI with the GPU engine registered as the runner's backend.
SPILL_ALL_C := $(LIB_SRC)
build/cuda/spill-cuda: src/main.c src/cuda/cuda_glue.c $(SPILL_ALL_C) build/cuda/libspillcuda.a $(HDRS)
	$(CC) $(WARN) -O2 -g $(CUDA_CFLAGS) -o $@ src/main.c src/cuda/cuda_glue.c $(SPILL_ALL_C) \
		build/cuda/libspillcuda.a $(CUDA_LINK) $(CUDA_SPILL_LIBS) $(MPI_LIBS)

CUDA_SPILL_LIBS ?= -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lcrypto -lcurl

cuda: build/cuda/libspillcuda.a $(CUDA_TESTS) build/cuda/bench_pass build/cuda/bench_dequant build/cuda/bench_fp8 build/cuda/spill-cuda

test-cuda: cuda
	@set -e; for t in $(CUDA_TESTS); do echo "== $$t"; $$t; done
	@echo "== build/cuda/test_cuda_engine, CUDA-core prompt attention"; SPILL_CUDA_ATT=fp32 build/cuda/test_cuda_engine
	@echo "== build/cuda/test_cuda_engine, int8 KV pages"; SPILL_TEST_KV=int8 build/cuda/test_cuda_engine
