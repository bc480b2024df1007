"""`stune-admin`: tools for the cluster admin (profile validation, and more as they land)."""
from __future__ import annotations

import argparse

from .common import guarded, not_implemented

PROG = "stune-admin"


def _check_profiles(args) -> int:
    from ..profiles import profile_dir, validate_directory

    directory = args.directory or profile_dir()
    profiles = validate_directory(directory)
    for name, profile in sorted(profiles.items()):
        hcas = ",".join(f"{h.device}:{h.port}" for h in profile.fabric.hcas) or "-"
        print(f"{name:12s} {profile.fabric.type:5s} hcas={hcas} gpus={profile.gpu.count} "
              f"digest={profile.digest}  ({profile.source})")
    print(f"{len(profiles)} profile(s) OK in {directory}")
    return 0


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split(":", 1)[1].strip())
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check-profiles", help="validate partitions/*.yaml and site.yaml; one line per error")
    check.add_argument("directory", nargs="?", help="profile directory (default: $STUNE_PARTITIONS or "
                                                   "/etc/stune/partitions)")
    sub.add_parser("topology", help="ibnetdiscover output to topology.conf")
    args = parser.parse_args(argv)
    if args.cmd == "check-profiles":
        return _check_profiles(args)
    return not_implemented(PROG, args.cmd)


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
