#!/usr/bin/env bash
# Set up .venv (idempotent) and run a job: `demo` (the main job) or `test` (ruff, mypy, then the
# whole suite on parallel workers; a finding of either checker fails the run before pytest starts).
#   bash scripts/dev.sh demo [commdebug demo options]
#   bash scripts/dev.sh test [pytest options]          everything, as CI runs it
#   bash scripts/dev.sh test --fast [pytest options]   ruff, then the tests that start no process and no browser
set -euo pipefail
cd "$(dirname "$0")/.."

job="${1:-}"
case "$job" in demo|test) shift ;; *) echo "usage: bash scripts/dev.sh demo|test [args...]" >&2; exit 2 ;; esac

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || { echo "scripts/dev.sh: $PYTHON not found (Python 3.11 is needed)" >&2; exit 1; }
# torch is pinned to the CPU wheel here, not in pyproject: an open range pulls the CUDA build.
TORCH_PIN="torch==2.13.0"

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.setup-$(cat pyproject.toml setup.py commdebug/capture/_frames.c commdebug/capture/_native.cpp commdebug/launch/_faults.c commdebug/analysis/_late.c commdebug/formats/_kineto.c commdebug/formats/_kineto_json.h scripts/dev.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "== installing $TORCH_PIN and commdebug[test] into .venv" >&2
  # torch first, then commdebug without build isolation: light capture's C++ kernel is built
  # against the torch it runs with (setup.py)
  .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_PIN" "setuptools>=64"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation -e ".[test]"
  rm -f .venv/.setup-* && touch "$stamp"
fi

if [ "$job" = demo ]; then
  exec .venv/bin/commdebug demo "$@"
fi

fast=0
if [ "${1:-}" = --fast ]; then fast=1; shift; fi

# Static checks first (seconds with their caches): a finding stops the run with the tool's message.
# Versions are pinned in the `test` extra of pyproject.toml, settings in its [tool.ruff] and
# [tool.mypy] tables (docs/development.md).
echo "== ruff check" >&2
.venv/bin/ruff check --quiet

# The suite starts hundreds of Python processes: with their modules' bytecode cached (an
# environment may turn that off) an offline verb starts in half the CPU time, and each worker
# rewrites the test modules' asserts once, not at every run.
unset PYTHONDONTWRITEBYTECODE

# pytest's exit status, except that collecting no test is a failure too
run_pytest() {
  set +e
  .venv/bin/python -m pytest "$@"
  local rc=$?
  set -e
  if [ "$rc" = 5 ]; then
    echo "scripts/dev.sh: pytest collected no tests; that is a failure" >&2
    exit 1
  fi
  exit "$rc"
}

if [ "$fast" = 1 ]; then
  # The loop for every change: seconds, not minutes (docs/development.md says when to run which).
  run_pytest --no-processes "$@"
fi

echo "== mypy" >&2
.venv/bin/mypy

# System programs some tests drive, from Debian with apt-get, only when missing: Chromium for the
# browser tests (through Playwright; never `playwright install`), and Prometheus, its Pushgateway
# and node_exporter, which the Prometheus tests start themselves (docs/development.md).
missing=()
for program in chromium prometheus prometheus-pushgateway prometheus-node-exporter; do
  [ -x "/usr/bin/$program" ] || missing+=("$program")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]} with apt-get" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Parallel workers (pytest-xdist): tests that share a module's fixture stay in one worker, the
# ones that start processes go out first (tests/conftest.py). PYTEST_WORKERS overrides how many
# (docs/development.md has the measurements behind the default).
run_pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "$@"
