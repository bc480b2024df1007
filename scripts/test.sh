#!/usr/bin/env bash
# README's second command: set everything up and run the test suite against local Slurm clusters.
#
#   bash scripts/test.sh                 # CI: the whole suite on Slurm 22.05, then every test that uses
#                                        # Slurm again on Slurm 26.05
#   bash scripts/test.sh tests/x.py -q   # one run of those pytest args, on $STUNE_SLURM (default 22.05)
#
# The oldest and the newest supported release: 22.05 is Debian 12's packages, 26.05 Debian sid's, which
# scripts/build-slurm.sh installs first (about a minute, reused). STUNE_TEST_SLURM_MATRIX changes the
# no-argument runs: space-separated SERIES=SCOPE, SCOPE `all` (the whole suite), `slurm` (every test that
# uses Slurm: the cluster tests and the modules that run Slurm's commands, marked `slurm` by conftest.py; the
# rest read captured output or nothing of Slurm's and do not change with the release) or `core` (the adapter
# contract and the health, sbatch, stage and fair-share cluster tests), e.g. "22.05=all 26.05=all 24.11=core"
# (24.11 is compiled from Debian 13's source: about 10 minutes on 2 cores). If a release cannot be had, that
# run is reported as not run and the others still count. Each series gets its own cluster:
# $STUNE_CLUSTER_DIR-<series> and port base +100 per series after the first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH=$PWD/.venv/bin:$PATH

if [ $# -gt 0 ]; then
  echo "test.sh: Slurm ${STUNE_SLURM:-22.05}"
  exec .venv/bin/python -m pytest "$@"
fi

CORE="tests/test_slurm_contract.py tests/test_slurm_adapter.py tests/test_cluster.py tests/test_health_cluster.py
      tests/test_sbatch_cluster.py tests/test_stage_cluster.py tests/test_fairshare_cluster.py"
matrix=${STUNE_TEST_SLURM_MATRIX:-"22.05=all 26.05=slurm"}
base_dir=${STUNE_CLUSTER_DIR:-/var/tmp/stune-cluster}
base_port=${STUNE_CLUSTER_PORT_BASE:-26800}
summary=()
status=0
i=0
# The habits CI keeps (issue 23): ruff's lint and format over the tree, mypy on slurm_tune/ (both configured in
# pyproject.toml). A finding fails the run; the Slurm runs still go, so one CI run shows everything.
echo "===== test.sh: ruff check, ruff format --check, mypy ====="
lint=()
.venv/bin/ruff check --quiet . || lint+=("ruff check")
.venv/bin/ruff format --check --quiet . || lint+=("ruff format --check")
.venv/bin/mypy || lint+=("mypy")
if [ ${#lint[@]} = 0 ]; then
  summary+=("lint: ruff check, ruff format --check and mypy passed")
else
  summary+=("lint: FAILED (${lint[*]})")
  status=1
fi
for entry in $matrix; do
  series=${entry%%=*}
  scope=${entry#*=}
  if [ "$i" = 0 ]; then dir=$base_dir; port=$base_port; else dir=$base_dir-$series; port=$((base_port + 100 * i)); fi
  i=$((i + 1))
  case "$scope" in
    all) args=() ;;
    slurm) args=(-m "cluster or slurm") ;;
    core) read -r -a args <<<"$(echo $CORE)" ;;
    *) echo "test.sh: unknown scope '$scope' in STUNE_TEST_SLURM_MATRIX (all, slurm or core)" >&2; exit 2 ;;
  esac
  if [ "$series" != 22.05 ]; then
    echo "test.sh: installing Slurm $series for its run (scripts/build-slurm.sh $series; reused once there)"
    set +e
    # its progress lines (stderr) go to the terminal as they come, and the last one is kept for the summary
    bash scripts/build-slurm.sh "$series" 2>&1 >/dev/null | tee /tmp/stune-build-slurm.$$ >&2
    rc=${PIPESTATUS[0]}
    set -e
    why=$(tail -n 1 /tmp/stune-build-slurm.$$); rm -f /tmp/stune-build-slurm.$$
    if [ "$rc" = 3 ]; then
      echo "test.sh: Slurm $series NOT RUN: $why"
      summary+=("Slurm $series: not run ($why)")
      continue
    elif [ "$rc" != 0 ]; then
      echo "test.sh: Slurm $series build failed: $why"
      summary+=("Slurm $series: build FAILED ($why)")
      status=1
      continue
    fi
  fi
  # A per-series directory of test.sh's own that another Slurm series made (an earlier run) is remade:
  # devcluster refuses to reuse it, and 22.05 cannot read 26.05's state (or the other way round).
  if [ "$i" != 1 ] && [ -f "$dir/slurm-series" ] && [ "$(cat "$dir/slurm-series")" != "$series" ]; then
    echo "test.sh: $dir holds a Slurm $(cat "$dir/slurm-series") cluster; removing it for $series"
    STUNE_SLURM=$(cat "$dir/slurm-series") STUNE_CLUSTER_DIR=$dir STUNE_CLUSTER_PORT_BASE=$port \
      .venv/bin/stune-devcluster destroy >/dev/null 2>&1 || true
    rm -rf "$dir"
  fi
  echo "===== test.sh: Slurm $series, scope $scope, cluster $dir, ports $port+ ====="
  set +e
  STUNE_SLURM=$series STUNE_CLUSTER_DIR=$dir STUNE_CLUSTER_PORT_BASE=$port .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
  rc=$?
  set -e
  release=$(STUNE_SLURM=$series SLURM_CONF=$dir/etc/slurm.conf .venv/bin/python -c \
    'from stune_dev.devcluster import SlurmInstall; from slurm_tune.slurm import Slurm
print(Slurm(bin_dir=SlurmInstall.choose().bin_dir).version())' 2>/dev/null || echo "$series")
  if [ "$rc" = 0 ]; then result=passed; else result="FAILED (pytest exit $rc)"; status=1; fi
  case "$scope" in all) what="whole suite" ;; slurm) what="every test that uses Slurm" ;; *) what="core cluster tests" ;; esac
  summary+=("Slurm $release: $what: $result")
done
echo "===== test.sh: Slurm versions run ====="
printf '%s\n' "${summary[@]}"
exit $status
