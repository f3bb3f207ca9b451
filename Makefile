# fuselet front door where pixi is absent: every target runs one script of scripts/ (pixi
# tasks of the same name run the same scripts). The first target bootstraps .venv from PyPI.
.PHONY: help venv lock build demo zoo check test test-latest stable-abi-test core-test emu-test sanitize cuda-build gpu-test bench lint docs matrix seed packages clean

help:            ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv:            ## create .venv from requirements/dev.lock (the frameworks and tools of requirements/dev.txt)
	scripts/bootstrap.sh

lock:            ## compile requirements/*.txt into the locks requirements/*.lock (ARGS=--upgrade moves every pin)
	scripts/lock.sh $(ARGS)

build:           ## build fuselet against .venv's torch and jax and install it there
	scripts/build.sh

demo:            ## fuselet's main job: a small transformers model fused and trained beside the stock one
	scripts/demo.sh

zoo:             ## fuse() over every causal-LM type of transformers, checked against the stock models (benchmarks/results/zoo.md)
	scripts/zoo.sh $(ARGS)

check:           ## the quick tier: lint, core C++ tests, the CUDA kernels under the emulator, the library tests of both layers over both cores
	scripts/check.sh

test:            ## the README's test command: check + conda packages, multi-process and pip-build tests, stable ABI
	scripts/test.sh

test-latest:     ## the library tests and the stable-ABI smoke against the newest releases of torch, jax, transformers (no lock)
	scripts/test-latest.sh

stable-abi-test: ## one stable-ABI build of the torch layer; its smoke under torch 2.13 and 2.14 (make test runs it)
	scripts/stable-abi-test.sh

core-test:       ## the framework-free core alone: C++ tests + find_package consumer
	scripts/core-test.sh

emu-test:        ## the core's CUDA kernels on this CPU under fuselet's CUDA emulator, two thread orders, bit-identical (ARGS=--coverage: line coverage)
	scripts/emu-test.sh $(ARGS)

sanitize:        ## the core's C++ tests under ASan + UBSan, then TSan; C ABI, bad input and the layer smoke under ASan + UBSan; 100000 libFuzzer inputs (CI runs it)
	scripts/sanitize.sh

cuda-build:      ## compile all CUDA sources with nvcc (no GPU needed)
	scripts/cuda-build.sh

gpu-test:        ## on a GPU machine, in 8 min: build, core CUDA tests, CUDA tests of both layers, compute-sanitizer, benchmarks (--plan: here)
	scripts/gpu-test.sh $(ARGS)

bench:           ## benchmarks: tables + ratios against the frameworks' own ops
	scripts/bench.sh

lint:            ## ruff, ruff format, clang-format, bash -n, whitespace (scripts/lint.sh; also as pre-commit hooks)
	scripts/lint.sh

docs:            ## the documentation site (mkdocs.yml, docs/) built with --strict into build/site
	scripts/docs.sh

matrix:          ## the conda packages of variants/offline.yaml (pass ARGS="--variants variants/conda-forge.yaml")
	scripts/matrix.sh $(ARGS)

seed:            ## make or bring up to date the offline conda channel (build/offline-channel)
	scripts/seed.sh $(ARGS)

packages:        ## seed the offline channel, build + verify the conda packages of variants/offline.yaml
	scripts/packages.sh $(ARGS)

clean:           ## remove build outputs (keeps .venv)
	rm -rf build output
