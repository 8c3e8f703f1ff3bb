# Entry points for people and CI. `make demo` and `make test` install what they need first.
BUILD ?= build
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
# One per decoder of untrusted bytes (tests/fuzz/fuzz_NAME.c, corpus tests/fuzz/corpus/NAME).
FUZZ_TARGETS = block frame kvmsg etcd safetensors decoder_config settings tokenizer monitor layermap adapter quality llamacpp_state tcbody basis
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all setup build install demo test asan fuzz bench format format-check clean

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# bin/kvedge, libkvedge.so, <kvedge/*.h> and kvedge.pc under PREFIX; DESTDIR (command line or
# environment) stages them under another root, for packaging.
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

demo: build
	@scripts/demo.sh $(BUILD)/clients/kvedge

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build of the library and every test.
asan: setup
	@cmake -S . -B build-asan -DKVEDGE_SANITIZE=ON -DKVEDGE_CUDA=OFF -DKVEDGE_BENCH=OFF >/dev/null
	@cmake --build build-asan -j$(JOBS)
	ctest --test-dir build-asan --output-on-failure -j$(JOBS)

# libFuzzer on every decoder of untrusted bytes, starting from the committed corpus.
fuzz: setup
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -DKVEDGE_FUZZ=ON -DKVEDGE_CUDA=OFF \
		-DKVEDGE_BENCH=OFF >/dev/null
	@cmake --build build-fuzz --target $(addprefix fuzz_,$(FUZZ_TARGETS)) -j$(JOBS)
	@set -e; for t in $(FUZZ_TARGETS); do \
		mkdir -p build-fuzz/corpus/$$t; cp tests/fuzz/corpus/$$t/* build-fuzz/corpus/$$t/; \
		echo "== fuzz_$$t"; \
		build-fuzz/tests/fuzz/fuzz_$$t build-fuzz/corpus/$$t -max_total_time=$(FUZZ_SECONDS) \
			-rss_limit_mb=4096 -print_final_stats=1; \
	done

bench: build
	@scripts/bench.sh $(BUILD)

format:
	@git ls-files '*.c' '*.h' '*.cu' | xargs clang-format -i

format-check:
	@git ls-files '*.c' '*.h' '*.cu' | xargs clang-format --dry-run --Werror

clean:
	rm -rf build build-asan build-fuzz
