# make demo      the main job (creates .venv, installs torch, builds, runs)
# make test      the whole suite: C++ core (ctest, with and without CUDA) + pytest (docs included)
# make test-fast the edit loop's tier: no process groups, no Ray, nothing slow (a few minutes)
# make docs      the API reference, from the docstrings, into build/docs (open build/docs/index.html)
# make test-gpu  only the tests marked `gpu` (needs a CUDA device)
# make bench     the benchmarks recorded in BENCHMARKS.md
# Rebuilds are incremental: ninja keeps its objects in build/.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= 2
CSRC := $(shell find csrc -type f) setup.py CMakeLists.txt

.PHONY: demo test test-fast test-gpu docs bench build core clean

$(VENV)/.deps: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.built: $(VENV)/.deps $(CSRC)
	MAX_JOBS=$(JOBS) $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(PY) -c "import easyscale_ext as es; print('easyscale_ext', es.__version__, 'cuda_built', es.cuda_built())"
	touch $@

build: $(VENV)/.built

# The libtorch-free core twice: with CUDA when nvcc exists, and CPU-only, a
# cheap guard that the CPU-only build keeps compiling and passing.
core:
	cmake -S . -B build/core -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
	cmake --build build/core -j $(JOBS)
	ctest --test-dir build/core --output-on-failure
	cmake -S . -B build/core-cpu -G Ninja -DEASYSCALE_CUDA=OFF > /dev/null
	cmake --build build/core-cpu -j $(JOBS)
	ctest --test-dir build/core-cpu --output-on-failure

test: build core
	$(PY) -m pytest -n 2 -m 'not serial' -ra --durations=25 --junitxml=build/tests-parallel.xml
	$(PY) -m pytest -m serial -ra --junitxml=build/tests-serial.xml

FAST := not multiprocess and not slow and not serial and not gpu

test-fast: build
	$(PY) -m pytest -n 2 -m '$(FAST)' -q

docs: build
	$(PY) -m sphinx -W --keep-going -q -b html docs/api build/docs
	@echo "open build/docs/index.html"

test-gpu: build
	$(PY) -m pytest -ra -m gpu

demo: build
	$(VENV)/bin/easyscale demo

bench: build core
	build/core/bench_core
	$(VENV)/bin/easyscale bench

clean:
	rm -rf build $(VENV) easyscale_ext/*.so
