# fuselet front door where pixi is absent: every target runs one script of scripts/ (pixi
# tasks of the same name run the same scripts). The first target bootstraps .venv from PyPI.
.PHONY: help venv build demo test stable-abi-test core-test sanitize cuda-build gpu-test bench lint docs matrix seed packages clean

help:            ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv:            ## create .venv with the frameworks and tools of requirements/dev.txt
	scripts/bootstrap.sh

build:           ## build fuselet against .venv's torch and jax and install it there
	scripts/build.sh

demo:            ## build, then run a short demo in PyTorch and JAX
	scripts/demo.sh

test:            ## build, then run every test (core C++, CUDA compile check, pytest)
	scripts/test.sh

stable-abi-test: ## one stable-ABI build of the torch layer; the torch tests under torch 2.13 and 2.14 (make test runs it)
	scripts/stable-abi-test.sh

core-test:       ## the framework-free core alone: C++ tests + find_package consumer
	scripts/core-test.sh

sanitize:        ## the core's C++ tests under ASan + UBSan, then TSan; the layers' tests under ASan + UBSan; 100000 reproducible libFuzzer inputs over the C ABI (CI runs it)
	scripts/sanitize.sh

cuda-build:      ## compile all CUDA sources with nvcc (no GPU needed)
	scripts/cuda-build.sh

gpu-test:        ## on a GPU machine: core CUDA tests + compute-sanitizer, all tests with CUDA, GPU benchmark
	scripts/gpu-test.sh

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
