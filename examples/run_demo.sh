#!/usr/bin/env bash
# The main demo README shows: builds/activates a small venv (no Spark), then runs
# examples/demo.py against a local-disk warehouse (a temp dir, or the first argument).
set -euo pipefail
export TXNTABLE_EXTRAS="${TXNTABLE_EXTRAS:-core}"
source "$(dirname "$0")/../.ci/env.sh"
cd "$repo"
python examples/demo.py "$@"
