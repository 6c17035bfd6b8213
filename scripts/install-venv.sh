#!/bin/sh
# Installs weightd (this checkout) with its declared dependencies into a virtualenv at PREFIX, as
# `make install` and the container image do; then checks the result with `weightd serve --check=install`.
#
#   scripts/install-venv.sh PREFIX
#
# Environment:
#   DESTDIR     stage under DESTDIR (a package build): the venv is made at DESTDIR/PREFIX and then
#               rewritten to run from PREFIX (scripts' #! lines, pyvenv.cfg, bytecode's file names)
#   INSTALL_PY  the interpreter the venv is built on; default: the first Python >= 3.11 of
#               /usr/bin/python3, /usr/local/bin/python3, python3. It must be one the service's user can
#               run: an interpreter under a private home (pyenv in /root) is refused.
#   PIP_FLAGS   extra pip flags (an offline install: --no-index --find-links WHEELHOUSE)
set -eu
die() { echo "install-venv: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: install-venv.sh PREFIX"
prefix=$1
case $prefix in /*) ;; *) die "PREFIX must be absolute: $prefix" ;; esac
dest=${DESTDIR:-}
dest=${dest%/}
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
py=${INSTALL_PY:-}
if [ -z "$py" ]; then
  for c in /usr/bin/python3 /usr/local/bin/python3 python3; do
    if command -v "$c" >/dev/null 2>&1 && new_enough "$c"; then py=$(command -v "$c"); break; fi
  done
  [ -n "$py" ] || die "no Python 3.11 or newer in /usr/bin, /usr/local/bin or PATH; set INSTALL_PY=/path/to/python3.11"
fi
new_enough "$py" || die "$py is not Python 3.11 or newer; set INSTALL_PY=/path/to/python3.11"
# the daemon runs as its own user (User=weightd): the interpreter and its standard library must be
# reachable by others, or the unit fails at start with "permission denied" on the interpreter
"$py" - <<'PY' || exit 2
import os, stat, sys, sysconfig
for target in (os.path.realpath(sys.executable), sysconfig.get_paths()["stdlib"]):
    p = target
    while True:
        st = os.stat(p)
        need = stat.S_IXOTH | (stat.S_IROTH if p == target else 0)
        if st.st_mode & need != need:
            sys.exit(f"install-venv: {sys.executable} cannot be run by the service's user: {p} is mode "
                     f"{stat.S_IMODE(st.st_mode):04o}; use a system Python (INSTALL_PY=/usr/bin/python3.11)")
        if p == "/":
            break
        p = os.path.dirname(p)
PY
venv=$dest$prefix
if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then die "$venv exists and is not a virtualenv"; fi
# an existing venv on another interpreter (an earlier install on a pyenv, a Python upgrade) is rebuilt
home=$(sed -n 's/^home = //p' "$venv/pyvenv.cfg" 2>/dev/null || true)
want=$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))')
if [ ! -x "$venv/bin/python" ] || [ "$home" != "$want" ]; then
  "$py" -m venv --clear "$venv"
fi
# shellcheck disable=SC2086  # (PIP_FLAGS: words on purpose)
"$venv/bin/python" -m pip install -q --disable-pip-version-check ${PIP_FLAGS:-} .
if [ -n "$dest" ]; then
  # a staged venv names its staging root everywhere: make it the venv at PREFIX it will be
  for f in "$venv"/bin/* "$venv/pyvenv.cfg"; do
    if [ -f "$f" ] && [ ! -L "$f" ] && grep -qI "$venv" "$f" 2>/dev/null; then
      sed -i "s|$venv|$prefix|g" "$f"
    fi
  done
  "$venv/bin/python" -m compileall -q -f -s "$dest" -p / "$venv/lib" >/dev/null || true
fi
# what the image build and ExecStartPre= ask: the config and every module and dependency (from /, so
# the checkout's own packages are not the ones imported)
(cd / && HOME=${HOME:-/root} "$venv/bin/python" -m weightd serve --check=install)
