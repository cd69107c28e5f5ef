#!/usr/bin/env bash
# Print the path of a CPython 3.13 interpreter (JAX >= 0.11 needs Python >= 3.12), getting one if need be:
#   1. python3.13 on PATH, or one that pyenv installed (/root/.pyenv/versions/3.13.*), or an earlier build of
#      this script (in $SPMDSIM_PYTHON_PREFIX, default ~/.cache/spmdsim/python3.13);
#   2. on Debian 13 (trixie), apt-get install python3.13-venv;
#   3. otherwise (Debian 12) Debian trixie's python3.13 source package, built into that prefix: about 10 minutes
#      on 2 idle cores, 30 under load, once; later runs reuse it.
# Usage: py=$(bash .ci/python3.13.sh) && "$py" -m venv .venv-jax012
set -euo pipefail
prefix=${SPMDSIM_PYTHON_PREFIX:-$HOME/.cache/spmdsim/python3.13}

works() { [ -x "$1" ] && "$1" -c 'import sys, ssl, venv, ensurepip, sqlite3, lzma, bz2, ctypes; assert sys.version_info[:2] == (3, 13)' 2>/dev/null; }

for candidate in "$(command -v python3.13 || true)" /root/.pyenv/versions/3.13.*/bin/python3.13 "$prefix/bin/python3.13"; do
    if [ -n "$candidate" ] && works "$candidate"; then echo "$candidate"; exit 0; fi
done

log() { echo "python3.13.sh: $*" >&2; }
if grep -q '^13' /etc/debian_version 2>/dev/null; then
    log "installing Debian's python3.13-venv"
    apt-get update -qq >&2 && apt-get install -y -qq python3.13-venv >&2
    works /usr/bin/python3.13 && { echo /usr/bin/python3.13; exit 0; }
fi

log "building CPython 3.13 from Debian trixie's source package into $prefix (once; about 10 minutes)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "deb-src http://deb.debian.org/debian trixie main" > /etc/apt/sources.list.d/spmdsim-trixie-src.list
apt-get update -qq >&2
apt-get install -y -qq build-essential libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev \
    libreadline-dev uuid-dev >&2
(cd "$work" && apt-get source --download-only -qq python3.13 >&2)
tarball=$(ls "$work"/python3.13_*.orig.tar.* | head -n1)
tar -xf "$tarball" -C "$work"
src=$(find "$work" -maxdepth 1 -type d -name 'Python-3.13*' | head -n1)
(cd "$src" && ./configure --prefix="$prefix" --quiet >&2 && make -j"$(nproc)" -s >&2 && make -s install >&2)
works "$prefix/bin/python3.13" || { log "the build did not give a working python3.13"; exit 1; }
echo "$prefix/bin/python3.13"
