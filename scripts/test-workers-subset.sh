#!/usr/bin/env bash
# The subset of the suite in tests/workers/subset.txt against `leveret server
# --workers 2` (LEVERET_TEST_WORKERS=2: the `amqp_url` tests share one, and brokers a
# test starts run with --workers 2). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
while IFS= read -r line; do
  line="${line%%#*}"
  line="${line%"${line##*[![:space:]]}"}"
  [[ -z "$line" ]] && continue
  if [[ "$line" == -* ]]; then
    args+=(--deselect "${line#-}")
  else
    args+=("$line")
  fi
done < tests/workers/subset.txt
LEVERET_TEST_WORKERS=2 python -m pytest "${args[@]}" "$@"
