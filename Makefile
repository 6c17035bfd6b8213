# weightd: `make demo` and `make test` each build .venv from nothing on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-storm tools clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/weightd demo

# system tools the tests and benchmarks compare against (xxhsum, vmtouch, fio, fincore)
tools:
	bash scripts/install-tools.sh

test: $(STAMP) tools
	$(BIN)/python -m pytest -q

bench: $(STAMP) tools
	$(BIN)/python bench/manifest.py
	$(BIN)/python bench/promote.py
	$(BIN)/python bench/warm.py
	$(BIN)/python bench/daemon.py
	$(BIN)/python bench/swarm.py
	$(BIN)/python bench/delta.py
	$(BIN)/python bench/disk.py

# needs torch (the CPU wheel, ~1 GB) and root for the blkio throttle
bench-storm: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[torch]'
	$(BIN)/python bench/restart_storm.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
