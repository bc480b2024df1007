#!/usr/bin/env bash
# Build a modern Slurm (24.11, Debian 13's slurm-wlm source) into a cache directory outside the checkout, so
# the test suite can run against it as well as against Debian 12's 22.05 packages. Run as root.
#
#   bash scripts/build-slurm.sh            # prints the install prefix on the last line of stdout
#
# Reuses an existing build. If the source cannot be had (no network, no mirror), it says so in one line on
# stderr and exits 3; callers then run the suite on 22.05 alone and say so.
#
# Env: STUNE_SLURM_PREFIX (default /var/cache/stune/slurm-24.11.5), STUNE_SLURM_BUILD_JOBS (default 2).
set -euo pipefail

VERSION=24.11.5
PREFIX=${STUNE_SLURM_PREFIX:-/var/cache/stune/slurm-$VERSION}
JOBS=${STUNE_SLURM_BUILD_JOBS:-2}
WORK=$(dirname "$PREFIX")/build
STAMP=$PREFIX/.stune-built

say() { echo "build-slurm.sh: $*" >&2; }

if [ -f "$STAMP" ] && [ -x "$PREFIX/sbin/slurmctld" ]; then
  echo "$PREFIX"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "run as root (it installs build dependencies)"
  exit 1
fi
mkdir -p "$WORK"
# One build at a time (setup.sh may be run from two shells).
exec 9>"$WORK/.lock"
flock 9
if [ -f "$STAMP" ] && [ -x "$PREFIX/sbin/slurmctld" ]; then
  echo "$PREFIX"
  exit 0
fi

# Build dependencies first: apt-get source needs dpkg-dev.
DEPS="build-essential dpkg-dev pkg-config libmunge-dev libmariadb-dev libjson-c-dev libyaml-dev libdbus-1-dev libhwloc-dev
      libpam0g-dev libreadline-dev liblz4-dev zlib1g-dev libcurl4-openssl-dev libhttp-parser-dev libjwt-dev
      libssl-dev python3"
# shellcheck source=scripts/apt-missing.sh
. "$(dirname "$0")/apt-missing.sh"
# shellcheck disable=SC2086  # one word per package
install_missing_packages "build-slurm.sh: installing build dependencies" $DEPS

tarball=$WORK/slurm-wlm_$VERSION.orig.tar.gz
if [ ! -s "$tarball" ]; then
  # The Debian mirror this machine already uses, for trixie's source packages. No host is written here.
  mirror=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
    [ -n "$mirror" ] && break
  done
  if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; exit } }' /etc/apt/sources.list)
  fi
  if [ -z "$mirror" ]; then
    say "cannot build Slurm $VERSION: no Debian mirror found in the apt configuration"
    exit 3
  fi
  # A private apt configuration: only trixie's sources, so the machine's own apt lists are left as they are.
  aptdir=$WORK/apt
  mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial"
  printf 'deb-src %s trixie main\n' "$mirror" > "$aptdir/sources.list"
  aptopts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
           -o "Dir::State::Lists=$aptdir/lists" -o "Dir::Cache::Archives=$aptdir/archives"
           -o "Acquire::Check-Valid-Until=false" -o "APT::Sandbox::User=root")
  apt-get "${aptopts[@]}" update -qq >/dev/null 2>&1 || true
  # The .dsc may 404 on a snapshot mirror while the tarball arrives: judge by the tarball, not apt's status.
  (cd "$WORK" && apt-get "${aptopts[@]}" source --download-only slurm-wlm >/dev/null 2>&1) || true
  if [ ! -s "$tarball" ]; then
    say "cannot build Slurm $VERSION: slurm-wlm_$VERSION.orig.tar.gz not available from $mirror (trixie)"
    exit 3
  fi
fi

src=$WORK/slurm-$VERSION
rm -rf "$src"
mkdir -p "$src"
tar -xzf "$tarball" -C "$src" --strip-components=1
cd "$src"
say "building Slurm $VERSION into $PREFIX (a few minutes)"
./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --enable-multiple-slurmd --disable-debug \
  CFLAGS="-O1 -g0" > "$WORK/configure.log" 2>&1 || { say "configure failed, see $WORK/configure.log"; exit 1; }
make -j"$JOBS" > "$WORK/make.log" 2>&1 || { say "make failed, see $WORK/make.log"; exit 1; }
make install > "$WORK/install.log" 2>&1 || { say "make install failed, see $WORK/install.log"; exit 1; }
# Jobs run as the unprivileged test users and call the client commands: the install must be world-readable.
chmod -R o+rX "$PREFIX"
d=$PREFIX
while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
"$PREFIX/sbin/slurmctld" -V >/dev/null
touch "$STAMP"
cd "$WORK" && rm -rf "$src"
echo "$PREFIX"
