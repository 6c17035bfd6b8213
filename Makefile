# weightd: `make demo` and `make test` each build .venv from nothing on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BASE := $(VENV)/.installed-base
WHEELHOUSE := $(VENV)/wheelhouse

.PHONY: demo test bench bench-storm tools clean install install-man wheelhouse

# the shipped dependency set only (what `pip install weightd` gives): make demo runs on it
$(BASE): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77'   # (setuptools: offline builds of this project, tests/test_install.py)
	$(BIN)/python -m pip install -q -e . --config-settings editable_mode=compat \
	  || $(BIN)/python -m pip install -q -e .   # (compat: a path in a .pth, no finder: ~10 ms of every start; deprecated by setuptools, so the default if it goes)
	$(BIN)/python -m compileall -q weightd tiering p2p   # (bytecode, as an installed package has: imports compile nothing)
	touch $(BASE)

# and the test extras
$(STAMP): $(BASE)
	$(BIN)/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat \
	  || $(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# every wheel `pip install weightd` would fetch, for tests/test_install.py: it installs the wheel of this
# checkout into fresh venvs (and through make install DESTDIR=...) with --no-index from here, so the
# tests reach no registry and a dependency that is imported but not declared fails them
$(WHEELHOUSE): pyproject.toml | $(BASE)
	rm -rf $(WHEELHOUSE)
	$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
	  > $(VENV)/requirements.txt
	$(BIN)/python -m pip wheel -q -w $(WHEELHOUSE) -r $(VENV)/requirements.txt 'setuptools>=77'   # (setuptools: building weightd offline)
	touch $(WHEELHOUSE)

wheelhouse: $(WHEELHOUSE)

demo: $(BASE)
	$(BIN)/weightd demo

# system tools the tests and benchmarks compare against (xxhsum, vmtouch, fio, fincore)
tools:
	bash scripts/install-tools.sh

# three workers, a test file each at a time (module fixtures stay in one process): many tests wait on
# rate-capped swarms, daemons and timeouts, so three files overlap their waits on 2 cores (2026-12-06:
# 677 s with three, the machine 83% busy; ~816 s with two) (TEST_JOBS=0: serial)
TEST_JOBS ?= 3
test: $(STAMP) $(WHEELHOUSE) tools
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

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

# Install for systemd: a venv under $(PREFIX) on a system Python (scripts/install-venv.sh: the unit's
# User= must be able to run it), `weightd` linked into $(BINDIR) (what the unit's ExecStart names), the
# unit, sysusers and tmpfiles entries, and the example config if none exists.
#   sudo make install && sudo systemd-sysusers && sudo systemd-tmpfiles --create && sudo systemctl enable --now weightd
# DESTDIR: stage the whole install under it (a package build); paths inside name the final places.
# INSTALL_PY: the interpreter (default: the first Python >= 3.11 of /usr/bin, /usr/local/bin, PATH).
# PIP_FLAGS: extra pip flags (e.g. --no-index --find-links WHEELHOUSE for an offline install).
PREFIX ?= /opt/weightd
BINDIR ?= /usr/bin
UNITDIR ?= /usr/lib/systemd/system
SYSCONFDIR ?= /etc
LIBDIR ?= /usr/lib
MANDIR ?= /usr/share/man
PIP_FLAGS ?=
INSTALL_PY ?=
DESTDIR ?=
install:
	DESTDIR='$(DESTDIR)' INSTALL_PY='$(INSTALL_PY)' PIP_FLAGS='$(PIP_FLAGS)' sh scripts/install-venv.sh $(PREFIX)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(LIBDIR)/sysusers.d $(DESTDIR)$(LIBDIR)/tmpfiles.d \
	  $(DESTDIR)$(SYSCONFDIR)/weightd
	ln -sfn $(PREFIX)/bin/weightd $(DESTDIR)$(BINDIR)/weightd
	sed 's|/usr/bin/weightd|$(BINDIR)/weightd|g; s|/etc/weightd/|$(SYSCONFDIR)/weightd/|g' systemd/weightd.service \
	  > $(DESTDIR)$(UNITDIR)/weightd.service
	install -m 0644 systemd/weightd.sysusers $(DESTDIR)$(LIBDIR)/sysusers.d/weightd.conf
	install -m 0644 systemd/weightd.tmpfiles $(DESTDIR)$(LIBDIR)/tmpfiles.d/weightd.conf
	test -e $(DESTDIR)$(SYSCONFDIR)/weightd/weightd.toml \
	  || install -m 0644 systemd/weightd.toml $(DESTDIR)$(SYSCONFDIR)/weightd/weightd.toml
	$(MAKE) install-man

# the man pages, weightd(1) and weightd.toml(5) (scripts/gen_reference.py makes them from the code)
install-man:
	install -D -m 0644 man/weightd.1 $(DESTDIR)$(MANDIR)/man1/weightd.1
	install -D -m 0644 man/weightd.toml.5 $(DESTDIR)$(MANDIR)/man5/weightd.toml.5
