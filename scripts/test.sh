#!/usr/bin/env bash
# The whole test run, exactly what CI runs (.ci/run): the test dependencies, the whole
# suite on the compiled hot path, a subset of it against a broker of two worker
# processes (tests/workers/subset.txt, LEVERET_TEST_WORKERS=2), then the pure-Python
# fallback on the protocol, broker and store tests. Extra arguments go to the first
# pytest run.
#
# Where a C compiler exists, `pip install -e .` must have compiled the hot path: a build
# that silently fell back to Python fails tests/unit/test_build.py
# (LEVERET_REQUIRE_COMPILED=1). Without a compiler the suite runs on the fallback only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
if command -v cc >/dev/null || command -v gcc >/dev/null; then
  export LEVERET_REQUIRE_COMPILED=1
fi
python -m pytest "$@"
bash scripts/test-workers-subset.sh
bash scripts/test-pure-python.sh
