#!/usr/bin/env bash
# Installs the system tools weightd's tests and benchmarks compare against, when they are missing.
# Debian packages: xxhash (xxhsum), vmtouch, fio; util-linux (fincore) is part of the base system.
set -euo pipefail
need=()
command -v xxhsum >/dev/null || need+=(xxhash)
command -v vmtouch >/dev/null || need+=(vmtouch)
command -v fio >/dev/null || need+=(fio)
command -v fincore >/dev/null || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-tools: missing ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
  exit 0   # tests that need them skip with a reason
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
