# Redline — the two commands a user needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Extra pip arguments, e.g. a constraints file (CI pins a CPU build of torch).
PIP_CONSTRAINTS ?=
MODEL ?= starter

.PHONY: run test test-fast lint lint-imports gpu-check gpu-check-device gpu-wheels clean-venv screenshots install-desktop dist wheel bench-app

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# Reinstall whenever the project's metadata changes. An editable install carries no prebuilt kernels (a wheel
# does), so Redline's CPU kernels are built here, once, into this machine's cache
# (inference/kernels/cpu/library.py's ensure_built, what the first load would otherwise do for about a minute); a machine that cannot build them says
# why and runs torch's operators instead.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install $(PIP_CONSTRAINTS) -e '.[test]'
	$(BIN)/python -c "$$KERNELS_BUILD"
	touch $@

define KERNELS_BUILD
from redline.inference.kernels.cpu import library as native
from redline.inference.loading.loader import BUILDING_KERNELS, kernels_to_build
if kernels_to_build("cpu"):
    print(BUILDING_KERNELS + "...", flush=True)
native.ensure_built()
print(native.summary()["text"])
endef
export KERNELS_BUILD

run: $(VENV)/.installed
	$(BIN)/redline --model $(MODEL)

lint-imports: $(VENV)/.installed
	$(BIN)/lint-imports

# The checks every change must pass: the import contracts, ruff (lint and format), then pytest.
lint: $(VENV)/.installed
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Everything: what CI runs.
test: lint
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider

# While working: no packaging build, no slow subprocess or accuracy tests and no tests on the real starter
# model, on every core (pytest-xdist); about two minutes on 2 cores. `make test` runs everything, in one process.
test-fast: lint
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider -n auto -m "not slow and not packaging and not starter"

# PNGs of the main window (mid-reply, finished, prompt-lookup with settings) into docs/screenshots/.
# Offscreen by default; under a virtual display: xvfb-run -s "-screen 0 1400x900x24" make screenshots
screenshots: $(VENV)/.installed
	$(BIN)/python tools/screenshots/screenshots.py
	$(BIN)/python tools/screenshots/wizard_screenshots.py

# Does Redline stay fast over a long day? Start-up, unloading, a 200-reply soak, a 50,000-message history:
# each figure printed against its budget (takes a while on a CPU; see README "Staying fast all day").
BENCH_APP_ARGS ?=
bench-app: $(VENV)/.installed
	$(BIN)/python tools/benchmarks/bench_app.py $(BENCH_APP_ARGS)

clean-venv:
	rm -rf $(VENV)

# The desktop bundle (PyInstaller, one folder): dist/redline/redline. Not part of `make test`.
# Big (torch) and slow to build (minutes); see README "Install".
$(VENV)/.installed-dist: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install $(PIP_CONSTRAINTS) -e '.[test,dist]'
	touch $@

# The wheel, with Redline's CPU kernels built for every variant of this machine's architecture and the OpenMP
# runtime beside them (setup.py): dist/redline-<version>-py3-none-manylinux_2_N_<arch>.whl. A failed kernel build
# fails it. `auditwheel show` (where installed) prints the platform tag the libraries allow; see
# docs/install-and-packaging.md.
wheel: $(VENV)/.installed
	REDLINE_REQUIRE_KERNELS=1 $(BIN)/python -m build --wheel --no-isolation --outdir dist .
	@if [ -x $(BIN)/auditwheel ]; then $(BIN)/auditwheel show $$(ls -t dist/redline-*.whl | head -1); fi

# The bundle carries the kernels too (packaging/redline.spec builds them into it; a failed build fails it).
dist: $(VENV)/.installed-dist
	$(BIN)/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/redline.spec
	dist/redline/redline --version
	@ls dist/redline/_internal/redline/inference/kernels/cpu/prebuilt/
	@du -sh dist/redline

# Linux desktop integration for the current user: launcher, icons, AppStream metadata.
APP_ID := io.github.redline_app.Redline
XDG_DATA_HOME ?= $(HOME)/.local/share
install-desktop: $(VENV)/.installed
	mkdir -p $(XDG_DATA_HOME)/applications $(XDG_DATA_HOME)/metainfo $(XDG_DATA_HOME)/icons
	sed "s|^Exec=redline|Exec=$(abspath $(BIN))/redline|" packaging/linux/$(APP_ID).desktop \
		> $(XDG_DATA_HOME)/applications/$(APP_ID).desktop
	cp packaging/linux/$(APP_ID).metainfo.xml $(XDG_DATA_HOME)/metainfo/
	QT_QPA_PLATFORM=offscreen $(BIN)/python packaging/linux/render_icons.py $(XDG_DATA_HOME)/icons
	update-desktop-database $(XDG_DATA_HOME)/applications 2>/dev/null || true
	@echo "Installed $(APP_ID) for the current user; it appears in your desktop's application menu."

# What a lent GPU can tell in one short window (tools/benchmarks/gpu_check/): an 8B-shaped model eager against
# graphed, batching, TTFT and the next turn, logits against fp32, transformers' baselines, memory under 24/12/8 GB
# caps, most valuable first, each section time-capped (8 minutes in all), the report in $(OUT) rewritten after
# every cell. `make test` runs its --dry-run. See docs/performance.md, "The GPU check".
# GPU_CHECK_ARGS, e.g. --only batch1,memory (a second try at what the first run did not reach) or --budget 300.
OUT ?= gpu-check-out
GPU_CHECK_ARGS ?=
gpu-check: $(VENV)/.installed
	$(BIN)/python tools/benchmarks/gpu_check --out $(OUT) $(GPU_CHECK_ARGS)

# The same check on the lent machine itself: its own python3 (torch with CUDA, transformers), no venv and no package
# index, so the wheels it lacks are carried (`make gpu-wheels` here first; wheels/ travels with the run).
gpu-check-device:
	python3 -m pip install -q --no-index --no-deps wheels/*.whl
	python3 tools/benchmarks/gpu_check --out $(OUT) $(GPU_CHECK_ARGS)

# The wheels a bare GPU machine lacks (it has torch and transformers, no package index): carried as wheels/.
gpu-wheels: $(VENV)/.installed
	$(BIN)/python -m pip download --no-deps -d wheels bitsandbytes gguf platformdirs
