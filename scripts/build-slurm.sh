#!/usr/bin/env bash
# Install a newer Slurm from Debian into a cache directory outside the checkout, so the test suite can run
# against it as well as against Debian 12's 22.05 packages. Run as root.
#
#   bash scripts/build-slurm.sh [SERIES]   # prints the install prefix on the last line of stdout
#
# SERIES (default $STUNE_SLURM, else 26.05) is one of:
#   26.05  Debian sid's binary packages of slurm-wlm 26.05.5 (about a minute: a download, no compiler).
#          The mirrors serve sid's binaries but not its source. They are unpacked under the prefix, and
#          every program and library there is pointed (patchelf: its loader and search path) at sid's own
#          C library and libraries unpacked beside it, so nothing on the machine is replaced or upgraded.
#          bin/ and sbin/ hold the commands and the daemons, lib/slurm the plugins (PluginDir).
#   24.11  24.11.5 compiled from Debian 13 (trixie)'s source (about 10 minutes on 2 cores).
# 25.11 is not offered: no Debian suite carries it. The mirror is the one the machine's apt configuration
# already uses (a private apt configuration: the machine's own lists are left as they are); no host name is
# written here.
#
# Reuses an existing install. If Debian's files cannot be had (no network, no mirror), it says so in one line
# on stderr and exits 3; callers then run the suite on 22.05 alone and say so. Progress goes to stderr, one
# line per step.
#
# Env: STUNE_SLURM_PREFIX (default /var/cache/stune/slurm-VERSION), STUNE_SLURM_BUILD_JOBS (default: the CPUs).
set -euo pipefail

say() { echo "build-slurm.sh: $*" >&2; }

SERIES=${1:-${STUNE_SLURM:-26.05}}
case "$SERIES" in
  26.05) VERSION=26.05.5 SUITE=sid KIND=binary ;;
  24.11) VERSION=24.11.5 SUITE=trixie KIND=source ;;
  *) say "no build for Slurm $SERIES (26.05 or 24.11; 22.05 is Debian 12's packages)"; exit 2 ;;
esac
PREFIX=${STUNE_SLURM_PREFIX:-/var/cache/stune/slurm-$VERSION}
JOBS=${STUNE_SLURM_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
WORK=$(dirname "$PREFIX")/build
STAMP=$PREFIX/.stune-built

if [ -f "$STAMP" ] && [ -x "$PREFIX/sbin/slurmctld" ]; then
  say "Slurm $VERSION is already installed in $PREFIX"
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

# shellcheck source=scripts/apt-missing.sh
. "$(dirname "$0")/apt-missing.sh"

# The Debian mirror this machine already uses. No host is written here.
debian_mirror() {
  local f mirror=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
    [ -n "$mirror" ] && break
  done
  if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; exit } }' /etc/apt/sources.list)
  fi
  echo "$mirror"
}

# aptopts: a private apt configuration under $WORK for one "deb"/"deb-src" line of $SUITE.
private_apt() {
  local type=$1 mirror=$2 aptdir=$WORK/apt-$SUITE-$1
  mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial" "$aptdir/cache"
  printf '%s %s %s main\n' "$type" "$mirror" "$SUITE" > "$aptdir/sources.list"
  : > "$aptdir/status"  # an empty dpkg status: apt resolves every dependency from $SUITE itself
  aptopts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
           -o "Dir::State::Lists=$aptdir/lists" -o "Dir::State::status=$aptdir/status"
           -o "Dir::Cache=$aptdir/cache" -o "Dir::Cache::Archives=$aptdir/archives"
           -o "Acquire::Check-Valid-Until=false" -o "APT::Sandbox::User=root" -o "APT::Install-Recommends=false"
           -o "Debug::NoLocking=true")
  say "reading $SUITE's package lists from $mirror"
  apt-get "${aptopts[@]}" update -qq >/dev/null 2>&1 || true
}

mirror=$(debian_mirror)
if [ -z "$mirror" ]; then
  say "cannot build Slurm $VERSION: no Debian mirror found in the apt configuration"
  exit 3
fi

install_binary() {
  install_missing_packages "build-slurm.sh: installing patchelf" patchelf
  private_apt deb "$mirror"
  local have
  have=$(apt-cache "${aptopts[@]}" show slurmctld 2>/dev/null | awk '/^Version:/ { print $2; exit }')
  case "$have" in
    "$VERSION"-*) ;;
    *) say "cannot install Slurm $VERSION: $SUITE has slurmctld ${have:-not at all} at $mirror"; exit 3 ;;
  esac
  local archives=$WORK/apt-$SUITE-deb/archives
  rm -f "$archives"/*.deb
  say "downloading Debian $SUITE's slurm-wlm $have and the libraries it needs"
  if ! apt-get "${aptopts[@]}" install --download-only -y -qq slurmctld slurmd slurmdbd slurm-client \
       slurm-wlm-basic-plugins slurm-wlm-mysql-plugin >/dev/null 2>"$WORK/download-$VERSION.log"; then
    say "cannot install Slurm $VERSION: the download from $mirror failed ($(tail -n 1 "$WORK/download-$VERSION.log"))"
    exit 3
  fi
  say "unpacking $(ls "$archives"/*.deb | wc -l) packages into $PREFIX and pointing them at their own libraries"
  rm -rf "$PREFIX"
  local root=$PREFIX/debian deb
  mkdir -p "$root" "$PREFIX/bin" "$PREFIX/sbin" "$PREFIX/lib"
  for deb in "$archives"/*.deb; do dpkg-deb -x "$deb" "$root"; done
  local libs=$root/usr/lib/x86_64-linux-gnu
  local loader=$libs/ld-linux-x86-64.so.2 path=$libs/slurm-wlm:$libs f
  [ -x "$loader" ] || { say "cannot install Slurm $VERSION: no C library loader in $SUITE's libc6"; exit 1; }
  # DT_RPATH (--force-rpath), not RUNPATH: it also serves the libraries each one loads, plugins included
  while IFS= read -r -d '' f; do
    head -c 4 "$f" | grep -q ELF || continue
    if patchelf --print-interpreter "$f" >/dev/null 2>&1; then  # a program, not a library
      patchelf --set-interpreter "$loader" "$f"
    fi
    [ "$f" = "$loader" ] || patchelf --force-rpath --set-rpath "$path" "$f" 2>/dev/null || true
  done < <(find "$root/usr/bin" "$root/usr/sbin" "$libs" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
  for f in sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo sprio squeue \
           sreport srun sshare sstat strigger; do
    [ -x "$root/usr/bin/$f" ] && ln -s "$root/usr/bin/$f" "$PREFIX/bin/$f"
  done
  # Debian names its daemons slurmctld-wlm & co. (for update-alternatives)
  for f in slurmctld slurmd slurmstepd slurmdbd; do
    if [ -x "$root/usr/sbin/$f-wlm" ]; then ln -s "$root/usr/sbin/$f-wlm" "$PREFIX/sbin/$f"
    else ln -s "$root/usr/sbin/$f" "$PREFIX/sbin/$f"; fi
  done
  ln -s "$libs/slurm-wlm" "$PREFIX/lib/slurm"
}

install_source() {
  # Build dependencies first: apt-get source needs dpkg-dev.
  DEPS="build-essential dpkg-dev pkg-config libmunge-dev libmariadb-dev libjson-c-dev libyaml-dev libdbus-1-dev libhwloc-dev
        libpam0g-dev libreadline-dev liblz4-dev zlib1g-dev libcurl4-openssl-dev libhttp-parser-dev libjwt-dev
        libssl-dev python3"
  # shellcheck disable=SC2086  # one word per package
  install_missing_packages "build-slurm.sh: installing build dependencies" $DEPS
  local tarball=$WORK/slurm-wlm_$VERSION.orig.tar.gz
  if [ ! -s "$tarball" ]; then
    private_apt deb-src "$mirror"
    say "fetching the source of slurm-wlm $VERSION ($SUITE)"
    # The .dsc may 404 on a snapshot mirror while the tarball arrives: judge by the tarball, not apt's status.
    (cd "$WORK" && apt-get "${aptopts[@]}" source --download-only slurm-wlm >/dev/null 2>&1) || true
    if [ ! -s "$tarball" ]; then
      say "cannot build Slurm $VERSION: slurm-wlm_$VERSION.orig.tar.gz not available from $mirror ($SUITE)"
      exit 3
    fi
  fi
  local src=$WORK/slurm-$VERSION
  rm -rf "$src"
  mkdir -p "$src"
  tar -xzf "$tarball" -C "$src" --strip-components=1
  cd "$src"
  say "compiling Slurm $VERSION into $PREFIX with $JOBS jobs (about 10 minutes on 2 cores; log in $WORK/make-$VERSION.log)"
  ./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --enable-multiple-slurmd --disable-debug \
    CFLAGS="-O1 -g0" > "$WORK/configure-$VERSION.log" 2>&1 || { say "configure failed, see $WORK/configure-$VERSION.log"; exit 1; }
  make -j"$JOBS" > "$WORK/make-$VERSION.log" 2>&1 || { say "make failed, see $WORK/make-$VERSION.log"; exit 1; }
  make install > "$WORK/install-$VERSION.log" 2>&1 || { say "make install failed, see $WORK/install-$VERSION.log"; exit 1; }
  cd "$WORK" && rm -rf "$src"
}

"install_$KIND"
# Jobs run as the unprivileged test users and call the client commands: the install must be world-readable.
chmod -R o+rX "$PREFIX"
d=$PREFIX
while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
"$PREFIX/sbin/slurmctld" -V >/dev/null || { say "the installed slurmctld does not run: $("$PREFIX/sbin/slurmctld" -V 2>&1 | tail -n 1)"; exit 1; }
touch "$STAMP"
say "$("$PREFIX/sbin/slurmctld" -V) is ready in $PREFIX"
echo "$PREFIX"
