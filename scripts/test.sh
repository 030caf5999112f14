#!/usr/bin/env bash
# The whole check: lint, types, generated-code drift, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check events projections volfsm tests bench
ruff format --check events projections volfsm tests bench
mypy --strict events projections volfsm
if [ -f scripts/check_csi_stubs.sh ]; then bash scripts/check_csi_stubs.sh; fi
python -m pytest -q -p no:cacheprovider "$@"
