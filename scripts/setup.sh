#!/usr/bin/env bash
# Installs everything gptoss needs to build and test on Debian 12 (run as root or with sudo).
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libcpp-httplib-dev libboost1.81-dev libsqlite3-dev
      nodejs npm ca-certificates)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node and npm may come from outside Debian (e.g. a newer Node); accept any that works.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Further set-up steps (npm packages, cached data) live in scripts/setup.d/*.sh.
for s in scripts/setup.d/*.sh; do
  [[ -e $s ]] && bash "$s"
done
echo "setup: ok"
