#!/usr/bin/env bash
# Installs the system tools weightd's tests and benchmarks compare against, when they are missing.
# Debian packages: xxhash (xxhsum), vmtouch, fio, libfuse2, openssl, strace, git-lfs, docker-registry, apache2-utils
# (htpasswd), skopeo, iptables; util-linux (fincore) is part of the base system;
# promtool extracted from Debian's prometheus package into tools/bin (without installing the server).
set -euo pipefail
need=()
command -v xxhsum >/dev/null || need+=(xxhash)
command -v vmtouch >/dev/null || need+=(vmtouch)
command -v fio >/dev/null || need+=(fio)
command -v fincore >/dev/null || need+=(util-linux)
command -v openssl >/dev/null || need+=(openssl)   # tests/test_p2p_tls.py: the README's certificate recipe
command -v strace >/dev/null || need+=(strace)     # tests/test_durability.py: observes every fsync/syncfs
command -v git-lfs >/dev/null || need+=(git-lfs)   # tests/test_hf_import.py: builds the Hub mirror's LFS repository
# tests/test_oci*.py: a real registry (distribution 2.8) with htpasswd basic auth; skopeo pushes as another tool
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v htpasswd >/dev/null || need+=(apache2-utils)
command -v skopeo >/dev/null || need+=(skopeo)
command -v iptables >/dev/null || need+=(iptables)   # tests/test_crossing.py: crossing ports closed by a firewall
# libfuse2: tests/fuse_hang.py (a real hung file server, via fusepy) for the "read that never returns" test
ldconfig -p 2>/dev/null | grep -q 'libfuse.so.2' || need+=(libfuse2)
promtool_missing=0
[ -x tools/bin/promtool ] || command -v promtool >/dev/null || promtool_missing=1
[ ${#need[@]} -eq 0 ] && [ $promtool_missing -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-tools: missing ${need[*]} ${promtool_missing:+promtool}; run as root or install them" >&2
  exit 0   # tests that need them skip with a reason
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
[ ${#need[@]} -gt 0 ] && apt-get install -y -qq "${need[@]}" >/dev/null
if [ $promtool_missing -eq 1 ]; then
  # promtool alone: the prometheus package would also install and start a server
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq prometheus >/dev/null && dpkg -x prometheus_*.deb root)
  mkdir -p tools/bin
  cp "$tmp/root/usr/bin/promtool" tools/bin/promtool
  rm -rf "$tmp"
fi
