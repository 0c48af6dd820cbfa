#!/usr/bin/env bash
# The pure-Python fallback of the compiled hot path (LEVERET_PURE_PYTHON=1 imports the
# .py sources instead of the extensions), on the protocol, broker and store tests:
# about two minutes. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVERET_PURE_PYTHON=1 python -m pytest -q -p no:cacheprovider \
  tests/unit tests/store tests/test_bad_frames.py tests/test_fuzz_frames.py \
  tests/test_basic.py tests/test_queues.py tests/test_exchanges.py tests/test_confirms_tx.py \
  tests/test_channels.py tests/test_connection.py tests/compat/amqp "$@"
