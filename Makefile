# The two commands of README.md: `make quickstart` and `make test`. Both install what they
# need (Debian packages), build, and run. Everything else is a helper target.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
export OMP_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: deps build quickstart quickstart-text quickstart-video quickstart-lora test bench clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

bench: build
	bash bench/run_train_step.sh $(BUILD)
	bash bench/run_loader.sh $(BUILD)
	bash bench/run_vl_step.sh $(BUILD)
	bash bench/run_vae_decode.sh $(BUILD)
	bash bench/run_dit_step.sh $(BUILD)

clean:
	rm -rf $(BUILD)
