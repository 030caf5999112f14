#!/usr/bin/env bash
# Lint, types and generated-code drift (the test suite runs after it).
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check events projections volfsm tests bench
ruff format --check events projections volfsm tests bench
mypy --strict events projections volfsm
bash scripts/check_csi_stubs.sh
