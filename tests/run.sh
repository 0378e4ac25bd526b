#!/usr/bin/env bash
# The test command README shows: builds/activates the venv, runs lint, types and the suite.
# Pass pytest arguments through, e.g. `tests/run.sh -m "not slow"` for the quick subset.
set -euo pipefail
source "$(dirname "$0")/../.ci/env.sh"
cd "$repo"
ruff check .
mypy
if [ "$#" -gt 0 ]; then
  exec python -m pytest -q "$@"
fi
# The whole suite: most tests on two xdist workers (they wait on I/O, sleeps and subprocesses
# more than they compute: on two workers the suite used ~1.1 cores), then, one at a time, the
# tests marked `alone` — runs sized by work and several JVMs, which beside another worker's
# load stretch towards their time limits.
workers="${TXNTABLE_TEST_WORKERS:-2}"
status=0
python -m pytest -q -n "$workers" -m "not alone" || status=$?
python -m pytest -q -m alone || status=$?
exit "$status"
