#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of kvedge from Debian packages.
# Idempotent: when everything is already installed it only checks and returns.
# Debian's python3 with NumPy and PyTorch are installed by default: the Python binding's tests
# (tests/python) and its PyTorch engine need them; scripts/opt_reference.py and
# scripts/train_models.py (the decoder's fixtures and the trained models) use the same.
# --reference is kept for compatibility: it adds nothing any more.
set -euo pipefail

REFERENCE=0
for arg in "$@"; do
    case "$arg" in
    --reference) REFERENCE=1 ;;
    -h | --help)
        echo "usage: $0 [--reference]"
        exit 0
        ;;
    *)
        echo "setup: unknown option $arg (usage: $0 [--reference])" >&2
        exit 2
        ;;
    esac
done

PACKAGES=(
    build-essential cmake pkg-config git
    librocksdb-dev libzmq3-dev libczmq-dev liblz4-dev libxxhash-dev libsodium-dev
    # the entropy-coded block body (htscodecs' rANS); bench_entropy compares it with zstd
    libhtscodecs-dev libzstd-dev
    libcmocka-dev libopenblas-dev libmicrohttpd-dev libhiredis-dev libcjson-dev libpcre2-dev
    libutf8proc-dev
    # the Storage Master on etcd: its v3 JSON gateway over libcurl; the tests start etcd clusters
    libcurl4-openssl-dev etcd-server etcd-client
    redis-server iperf3 clang clang-format gnuplot-nox nodejs npm
    prometheus curl tmux
    # test_jitter's link: NFQUEUE in a network namespace
    iptables libnetfilter-queue-dev
    python3 python3-numpy python3-torch
    # test_python_pip: pip install --no-build-isolation into a venv, offline
    python3-venv python3-setuptools python3-wheel
    # test_cli_doc_render and test_install: the man page rendered with groff, read with man
    groff-base man-db
)
if [ "$REFERENCE" -eq 1 ]; then
    : # python3-torch and python3-numpy are in the default list
fi

missing=()
for p in "${PACKAGES[@]}"; do
    # NodeSource's nodejs carries its own npm (and conflicts with Debian's): a working one counts.
    if [ "$p" = npm ] && command -v npm >/dev/null; then
        continue
    fi
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
