# spill — the front door.  `make` builds ./spill; `make test` builds everything
# with ASan+UBSan and runs every tests/test_*.c; `make fuzz` runs each
# fuzz/fuzz_*.c target for FUZZ_SECONDS; `make format` applies .clang-format.
# CUDA is detected (nvcc on PATH) and never required.

CC      ?= gcc
CFLAGS  ?= -O2 -g
# the build's identity in every run's manifest (stale until the file that uses it is rebuilt: fine for provenance)
GIT_DESC := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
WARN    := -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -DSPILL_GIT=\"$(GIT_DESC)\"
LIBS    := -lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lcrypto -lcurl -lpthread -lm
SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# MPI (OpenMPI's mpicc and headers, tools/setup.sh installs them): when present, ./spill runs as the ranks of
# mpirun/srun (src/batch/mpi_run.c, -DSPILL_MPI); without it the same binary minus that, unchanged.
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_OK  := $(shell echo 'int main(void){return 0;}' | $(CC) -x c -include mpi.h $(MPI_CFLAGS) -fsyntax-only - 2>/dev/null && echo yes)
ifeq ($(MPI_OK),yes)
MPI_LIBS := $(shell mpicc --showme:link)
WARN    += -DSPILL_MPI $(MPI_CFLAGS)
LIBS    += $(MPI_LIBS)
endif

# src/ in folders by stage (src/README.md): base <- model <- text, engine <- batch <- main.c.
SRC_DIRS := base model text engine batch serve
LIB_SRC := $(foreach d,$(SRC_DIRS),$(wildcard src/$(d)/*.c))
# the built-in chat templates src/model/templates.c embeds (.incbin) rebuild like headers
HDRS    := $(wildcard src/*/*.h) $(wildcard src/model/templates/*.jinja)
TESTS   := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
FUZZERS := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_SECONDS ?= 60

.PHONY: all test test-build fuzz fuzz-build format clean bench
all: spill

build/rel/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) -c $< -o $@

spill: build/rel/main.o $(patsubst src/%.c,build/rel/%.o,$(LIB_SRC))
	$(CC) $(CFLAGS) -o $@ $^ $(LIBS)

# Test build: sanitizers on, every object rebuilt in build/asan.
build/asan/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O1 -g $(SAN) -c $< -o $@

build/asan/spill: build/asan/main.o $(patsubst src/%.c,build/asan/%.o,$(LIB_SRC))
	$(CC) $(SAN) -o $@ $^ $(LIBS)

build/asan/tests/%: tests/%.c tests/test.h $(patsubst src/%.c,build/asan/%.o,$(LIB_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O1 -g $(SAN) -Isrc -o $@ $< $(patsubst src/%.c,build/asan/%.o,$(LIB_SRC)) $(LIBS)

# test_sched drives the scheduler through src/batch/sched.h on a fake engine: the generic rule above builds it.

test-build: spill build/asan/spill $(addprefix build/asan/tests/,$(TESTS))

test: test-build
	@bash tests/run.sh $(TESTS)

# libFuzzer targets (clang): each fuzz/fuzz_X.c defines LLVMFuzzerTestOneInput.  The library is compiled
# once with coverage instrumentation and linked into every target.
FUZZ_OBJ := $(patsubst src/%.c,build/fuzz/obj/%.o,$(LIB_SRC))
.SECONDARY: $(FUZZ_OBJ)
build/fuzz/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	clang $(WARN) -O1 -g -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@

build/fuzz/%: fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	clang $(WARN) -O1 -g -fsanitize=fuzzer,address,undefined -Isrc -o $@ $< $(FUZZ_OBJ) $(LIBS)

fuzz-build: $(addprefix build/fuzz/,$(FUZZERS))

fuzz: fuzz-build
	@bash fuzz/run.sh $(FUZZ_SECONDS) $(FUZZERS)

# Benchmarks (not part of make test: tests check correctness, benchmarks measure speed).
MATMUL_SRC := src/engine/cpu.c src/base/pool.c src/model/quant.c src/model/gguf.c src/base/util.c
build/bench/bench_matmul: bench/bench_matmul.c $(MATMUL_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -g -Isrc -o $@ bench/bench_matmul.c $(MATMUL_SRC) -lcrypto -lcurl -lpthread -lm

build/bench/bench_decode: bench/bench_decode.c $(LIB_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -g -Isrc -o $@ bench/bench_decode.c $(LIB_SRC) $(LIBS)

build/bench/bench_grammar: bench/bench_grammar.c $(LIB_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -g -Isrc -o $@ bench/bench_grammar.c $(LIB_SRC) $(LIBS)

bench: build/bench/bench_matmul build/bench/bench_decode build/bench/bench_grammar

# CUDA backend: built when nvcc is on PATH (cuda.mk owns the rules: make cuda, make test-cuda).
NVCC := $(shell command -v nvcc 2>/dev/null)
ifneq ($(NVCC),)
-include cuda.mk
endif

format:
	clang-format -i src/*.c src/*/*.c src/*/*.h tests/*.c tests/*.h fuzz/*.c

clean:
	rm -rf build spill
