# Sourced by setup.sh and build-slurm.sh: their one way to install Debian packages.
#
#   install_missing_packages LABEL PKG...   # installs those not installed yet, saying "LABEL: PKG ..." first;
#                                           # does nothing (and touches no index) when all are there
# With STUNE_APT_NO_DAEMONS=1, a temporary policy-rc.d keeps the packages from starting system-wide daemons
# (removed again even when apt-get fails).

install_missing_packages() {
  local label=$1 p missing=""
  shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -n "$missing" ] || return 0
  echo "$label:$missing" >&2
  local added_policy=0
  if [ "${STUNE_APT_NO_DAEMONS:-0}" = 1 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && added_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  # shellcheck disable=SC2086  # one word per package
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  if [ "$added_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
}
