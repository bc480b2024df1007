#!/usr/bin/env bash
# One-time setup on a Debian 12 machine, as root: OS packages, a virtualenv in .venv with stune and its
# extras, and the local Slurm cluster's prerequisites. Safe to run again; it only does what is missing.
#
#   bash scripts/setup.sh              # everything
#   bash scripts/setup.sh --packages   # only the Debian packages (what `stune-devcluster up` runs)
set -euo pipefail
only_packages=0
case "${1:-}" in
  "") ;;
  --packages) only_packages=1 ;;
  *) echo "setup.sh: unknown argument '$1' (--packages, or none)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
REPO=$PWD

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages and starts Slurm daemons)" >&2
  exit 1
fi

PKGS="python3 python3-venv python3-dev munge mariadb-server mariadb-client slurmctld slurmd slurmdbd slurm-client
      hwloc util-linux procps fio iperf3 lua5.1 lua5.4"
# policy-rc.d keeps the packages from starting system-wide daemons; stune runs its own under one directory.
# shellcheck source=scripts/apt-missing.sh
. scripts/apt-missing.sh
# shellcheck disable=SC2086  # one word per package
STUNE_APT_NO_DAEMONS=1 install_missing_packages "setup.sh: installing Debian packages" $PKGS
[ "$only_packages" = 1 ] && exit 0

# Debian's interpreter, not a per-user one: jobs run as other users and must be able to run stune.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
fi
stamp=.venv/.stune-installed
# bin/: the hot commands' launchers are copied into .venv/bin at install time, so a changed one needs a reinstall
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
    || [ -n "$(find bin -newer "$stamp")" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # compat mode: a plain path entry. The default finder imports pathlib and re at every interpreter start,
  # which would double the start-up cost of the prolog and stune-sbatch.
  .venv/bin/python -m pip install -q -e ".[nvml,reports,accountant,test]" --config-settings editable_mode=compat
  touch "$stamp"
fi
# The dev cluster's command, from this checkout (stune_dev is not in the wheel; the compat editable install
# puts the checkout on the venv's sys.path).
printf '#!/bin/sh\nexec "%s" -m stune_dev "$@"\n' "$REPO/.venv/bin/python" > .venv/bin/stune-devcluster
chmod 755 .venv/bin/stune-devcluster

# torch (CPU) for the distributed-training template tests (tests/test_sbatch_torch.py: gloo on two dev-cluster
# nodes). Pinned to the local +cpu build: PyPI carries no +cpu version, so pip can never fall back to the
# multi-gigabyte CUDA wheel. Where no such wheel is offered, say so once; those tests then fail with the reason.
TORCH_VERSION=2.13.0+cpu
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '$TORCH_VERSION')" \
    2>/dev/null; then
  .venv/bin/python -m pip install -q --only-binary=:all: "torch==$TORCH_VERSION" >/dev/null 2>&1 \
    || echo "setup.sh: torch $TORCH_VERSION is not available to pip here (no local wheel): the PyTorch template tests will fail" >&2
fi

# Test jobs run as unprivileged users (stune-alice, stune-bob): they need to reach the checkout and the venv.
dir=$REPO
while [ "$dir" != / ]; do
  if [ "$(( 0$(stat -c %a "$dir") & 1 ))" = 0 ]; then chmod o+x "$dir"; fi
  dir=$(dirname "$dir")
done
chmod -R o+rX "$REPO" 2>/dev/null || true

# A built Slurm for the cluster tests when one is asked for (STUNE_SLURM=24.11); test.sh builds it for its
# CI matrix itself. Reused when present.
if [ "${STUNE_SLURM:-22.05}" != 22.05 ]; then
  bash scripts/build-slurm.sh >/dev/null
fi
