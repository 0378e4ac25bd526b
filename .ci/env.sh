#!/usr/bin/env bash
# Sourced by tests/run.sh and examples/run_demo.sh: makes sure Java 17+ and a venv with every
# dependency exist, then activates the venv. The venv is cached outside the checkout, keyed by
# a hash of pyproject.toml, because pyspark is a 456 MB source package that is slow to build.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${TXNTABLE_EXTRAS:-dev,spark}"

if ! command -v java >/dev/null 2>&1 || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then
  if [[ "$extras" == *spark* ]]; then
    echo "[env] installing openjdk-17-jre-headless" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  fi
fi

py="${PYTHON:-python3}"
key="$( (cat "$repo/pyproject.toml"; echo "$extras"; "$py" --version) | sha256sum | cut -c1-16)"
cache="${TXNTABLE_VENV_CACHE:-$HOME/.cache/txntable}"
venv="$cache/venv-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "[env] building venv $venv (cold path; pyspark takes a few minutes)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
  # Dependencies only: the project itself is installed editable from this checkout below,
  # so a cached venv never points at an old clone.
  "$venv/bin/python" - "$repo/pyproject.toml" "$extras" > "$cache/reqs-$key.txt" <<'PY'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(data["dependencies"])
for extra in sys.argv[2].split(","):
    reqs += data.get("optional-dependencies", {}).get(extra, [])
print("\n".join(reqs))
PY
  "$venv/bin/python" -m pip install -q -r "$cache/reqs-$key.txt"
  touch "$venv/.complete"
fi
touch "$venv/.complete"  # marks the venv as used: others unused for a day are pruned
find "$cache" -maxdepth 2 -name .complete -mtime +0 -printf '%h\n' 2>/dev/null | while read -r old; do
  if [ "$old" != "$venv" ]; then rm -rf "$old"; fi
done
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo" >/dev/null
# shellcheck disable=SC1091
source "$venv/bin/activate"
export PYSPARK_PYTHON="$venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$venv/bin/python"
