#!/usr/bin/env bash
# README's second command: set everything up and run the whole test suite against the local cluster.
# The suite's `cluster` fixture starts the cluster (or reuses a running one). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH=$PWD/.venv/bin:$PATH
exec .venv/bin/python -m pytest "$@"
