# Entry points for people and CI. `make demo` and `make test` install what they need first.
BUILD ?= build
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
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
	@cmake --build build-fuzz --target fuzz_block fuzz_frame fuzz_kvmsg fuzz_safetensors \
		fuzz_settings fuzz_tokenizer -j$(JOBS)
	@mkdir -p build-fuzz/corpus/block build-fuzz/corpus/frame build-fuzz/corpus/kvmsg \
		build-fuzz/corpus/safetensors build-fuzz/corpus/settings build-fuzz/corpus/tokenizer
	@cp tests/fuzz/corpus/block/* build-fuzz/corpus/block/
	@cp tests/fuzz/corpus/frame/* build-fuzz/corpus/frame/
	@cp tests/fuzz/corpus/kvmsg/* build-fuzz/corpus/kvmsg/
	@cp tests/fuzz/corpus/safetensors/* build-fuzz/corpus/safetensors/
	@cp tests/fuzz/corpus/settings/* build-fuzz/corpus/settings/
	@cp tests/fuzz/corpus/tokenizer/* build-fuzz/corpus/tokenizer/
	build-fuzz/tests/fuzz/fuzz_block build-fuzz/corpus/block -max_total_time=$(FUZZ_SECONDS) \
		-rss_limit_mb=4096 -print_final_stats=1
	build-fuzz/tests/fuzz/fuzz_frame build-fuzz/corpus/frame -max_total_time=$(FUZZ_SECONDS) \
		-rss_limit_mb=4096 -print_final_stats=1
	build-fuzz/tests/fuzz/fuzz_kvmsg build-fuzz/corpus/kvmsg -max_total_time=$(FUZZ_SECONDS) \
		-rss_limit_mb=4096 -print_final_stats=1
	build-fuzz/tests/fuzz/fuzz_safetensors build-fuzz/corpus/safetensors \
		-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -print_final_stats=1
	build-fuzz/tests/fuzz/fuzz_settings build-fuzz/corpus/settings \
		-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -print_final_stats=1
	build-fuzz/tests/fuzz/fuzz_tokenizer build-fuzz/corpus/tokenizer \
		-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -print_final_stats=1

bench: build
	@scripts/bench.sh $(BUILD)

format:
	@git ls-files '*.c' '*.h' '*.cu' | xargs clang-format -i

format-check:
	@git ls-files '*.c' '*.h' '*.cu' | xargs clang-format --dry-run --Werror

clean:
	rm -rf build build-asan build-fuzz
