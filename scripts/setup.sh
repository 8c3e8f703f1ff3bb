#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of kvedge from Debian packages.
# Idempotent: when everything is already installed it only checks and returns.
set -euo pipefail

PACKAGES=(
    build-essential cmake pkg-config git
    librocksdb-dev libzmq3-dev libczmq-dev liblz4-dev libxxhash-dev libsodium-dev
    libcmocka-dev libopenblas-dev libmicrohttpd-dev libhiredis-dev
    redis-server iperf3 clang clang-format
)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# redis-server's package starts a system instance; tests and benchmarks run their own.
