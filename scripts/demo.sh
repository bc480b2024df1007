#!/usr/bin/env bash
# README's first command: set everything up, start the local 3-node GPU cluster, and show stune at work.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH=$PWD/.venv/bin:$PATH
export STUNE_PARTITIONS=$PWD/partitions
stune-devcluster up
eval "$(stune-devcluster env)"
exec python -m stune_dev.demo
