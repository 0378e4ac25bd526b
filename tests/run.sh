#!/usr/bin/env bash
# The test command README shows: builds/activates the venv, runs lint, types and the suite.
# Pass pytest arguments through, e.g. `tests/run.sh -m "not slow"` for the quick subset.
set -euo pipefail
source "$(dirname "$0")/../.ci/env.sh"
cd "$repo"
ruff check .
mypy
python -m pytest -q "$@"
