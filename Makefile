# weightd: `make demo` and `make test` each build .venv from nothing on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-storm tools clean install

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77'   # (setuptools: offline builds of this project, tests/test_daemon.py make install)
	$(BIN)/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat \
	  || $(BIN)/python -m pip install -q -e '.[test]'   # (compat: a path in a .pth, no finder: ~10 ms of every start; deprecated by setuptools, so the default if it goes)
	$(BIN)/python -m compileall -q weightd tiering p2p   # (bytecode, as an installed package has: imports compile nothing)
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
	$(BIN)/python -m pip install -q -e '.[torch]' --config-settings editable_mode=compat \
	  || $(BIN)/python -m pip install -q -e '.[torch]'
	$(BIN)/python bench/restart_storm.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

# Install for systemd: a venv under $(PREFIX), `weightd` linked into $(BINDIR) (what the unit's
# ExecStart names), the unit, sysusers and tmpfiles entries, and the example config if none exists.
#   sudo make install && sudo systemd-sysusers && sudo systemd-tmpfiles --create && sudo systemctl enable --now weightd
# PIP_FLAGS: extra pip flags (e.g. --no-index --find-links WHEELHOUSE for an offline install).
PREFIX ?= /opt/weightd
BINDIR ?= /usr/bin
UNITDIR ?= /usr/lib/systemd/system
SYSCONFDIR ?= /etc
LIBDIR ?= /usr/lib
PIP_FLAGS ?=
install:
	test -x $(PREFIX)/bin/python || $(PY) -m venv $(PREFIX)
	$(PREFIX)/bin/python -m pip install -q $(PIP_FLAGS) .
	install -d $(BINDIR) $(UNITDIR) $(LIBDIR)/sysusers.d $(LIBDIR)/tmpfiles.d $(SYSCONFDIR)/weightd
	ln -sfn $(PREFIX)/bin/weightd $(BINDIR)/weightd
	sed 's|/usr/bin/weightd|$(BINDIR)/weightd|; s|/etc/weightd/|$(SYSCONFDIR)/weightd/|' systemd/weightd.service > $(UNITDIR)/weightd.service
	install -m 0644 systemd/weightd.sysusers $(LIBDIR)/sysusers.d/weightd.conf
	install -m 0644 systemd/weightd.tmpfiles $(LIBDIR)/tmpfiles.d/weightd.conf
	test -e $(SYSCONFDIR)/weightd/weightd.toml || install -m 0644 systemd/weightd.toml $(SYSCONFDIR)/weightd/weightd.toml
	$(BINDIR)/weightd --version
