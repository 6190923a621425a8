# xflow — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# onnxruntime-gpu + cupy only where a GPU really answers; the two onnxruntime builds never together.
EXTRA  := $(shell if nvidia-smi -L >/dev/null 2>&1; then echo gpu; else echo cpu; fi)
STAMP  := $(VENV)/.installed-$(EXTRA)
DEMO   := build/demo
MODEL  ?= nasrnn

.PHONY: install demo test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRA),dev]"
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: install
	@mkdir -p $(DEMO)
	$(BIN)/xflow zoo $(MODEL) $(DEMO)/$(MODEL).onnx
	$(BIN)/xflow optimize $(DEMO)/$(MODEL).onnx $(DEMO)/$(MODEL).opt.onnx --report $(DEMO)/$(MODEL).report.json

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# The zoo on the CPU provider, with onnxsim and ORT's transformer optimizer alongside (BENCH_ARGS to change).
BENCH_ARGS ?=
bench: install
	$(BIN)/python -m pip install -q -e ".[$(EXTRA),bench]"
	@mkdir -p build
	$(BIN)/xflow bench $(BENCH_ARGS) --out build/bench.md --json build/bench.json --chart build/bench.png

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
