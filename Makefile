# The two commands of README.md: `make quickstart` and `make test`. Both install what they
# need (Debian packages), build, and run. Everything else is a helper target.
BUILD ?= build
FUZZ_BUILD ?= build-fuzz
ASAN_BUILD ?= build-asan
CLANGXX ?= clang++-16
FUZZ_SECONDS ?= 600
JOBS ?= 2
CMAKE_FLAGS ?=
export OMP_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: deps build fuzz-build quickstart quickstart-text quickstart-video quickstart-lora test fuzz-long test-asan bench clean

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

quickstart: build
	bash examples/qwen2vl/quickstart.sh $(BUILD)/mm

quickstart-text: build
	bash examples/qwen2/quickstart.sh $(BUILD)/mm

quickstart-video: build
	bash examples/wan2.1/quickstart.sh $(BUILD)/mm

quickstart-lora: build
	bash examples/qwen2vl/lora.sh $(BUILD)/mm

# The libFuzzer harnesses of tests/fuzz (clang, AddressSanitizer + UBSan, the parsers' sources only).
$(FUZZ_BUILD)/build.ninja:
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=$(CLANGXX) -DMM_FUZZ=ON -DMM_MAIN_BUILD=$(abspath $(BUILD))

fuzz-build: build $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

# The whole suite, then every fuzz harness for 30 seconds (regressions and seeds first).
test: build fuzz-build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Each harness for FUZZ_SECONDS (600), growing its corpus in $(FUZZ_BUILD)/corpus.
fuzz-long: fuzz-build
	cd $(FUZZ_BUILD) && MM_FUZZ_SECONDS_OVERRIDE=$(FUZZ_SECONDS) ctest --output-on-failure -j $(JOBS) --timeout $$(( $(FUZZ_SECONDS) + 300 ))

# Everything built with AddressSanitizer + UndefinedBehaviorSanitizer (gcc), the whole suite run
# under them; LeakSanitizer on for the mm commands the tests run.
$(ASAN_BUILD)/build.ninja:
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DMM_SANITIZE=ON

test-asan: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 2700

bench: build
	bash bench/run_train_step.sh $(BUILD)
	bash bench/run_loader.sh $(BUILD)
	bash bench/run_vl_step.sh $(BUILD)
	bash bench/run_vae_decode.sh $(BUILD)
	bash bench/run_dit_step.sh $(BUILD)

clean:
	rm -rf $(BUILD)
