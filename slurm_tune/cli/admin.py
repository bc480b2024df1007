"""`stune-admin`: tools for the cluster admin (profile validation, and more as they land)."""
from __future__ import annotations

import argparse

from .common import guarded

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


def _topology(args) -> int:
    import fnmatch
    import sys

    from ..errors import ConfigError
    from ..topology import build_topology, parse_ibnetdiscover, render

    source = "<stdin>" if args.input == "-" else args.input
    if args.input == "-":
        if sys.stdin.isatty():
            raise ConfigError(source, None, "", "give ibnetdiscover output: `ibnetdiscover | stune-admin "
                                                "topology` or `stune-admin topology FILE`")
        text = sys.stdin.read()
    else:
        try:
            with open(args.input, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(source, None, "", f"cannot read: {exc.strerror}") from None
    keep = (lambda name: any(fnmatch.fnmatchcase(name, g) for g in args.match)) if args.match else None
    topology = build_topology(parse_ibnetdiscover(text, source), keep=keep, hca=args.hca,
                              all_rails=args.all_rails)
    if not topology.leaves:
        raise ConfigError(source, None, "", "no node found on any switch (check --match / --hca)")
    conf = render(topology, source)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(conf)
        except OSError as exc:
            raise ConfigError(args.output, None, "", f"cannot write: {exc.strerror}") from None
        print(f"wrote {args.output}: {len(topology.leaves)} leaf switch(es), "
              f"{sum(len(v) for v in topology.leaves.values())} node placement(s)", file=sys.stderr)
    else:
        sys.stdout.write(conf)
    return 0


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split(":", 1)[1].strip())
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check-profiles", help="validate partitions/*.yaml and site.yaml; one line per error")
    check.add_argument("directory", nargs="?", help="profile directory (default: $STUNE_PARTITIONS or "
                                                   "/etc/stune/partitions)")
    topo = sub.add_parser("topology", help="ibnetdiscover output to topology.conf",
                          description="Read `ibnetdiscover` output (a file, or stdin) and write a Slurm "
                                      "topology.conf for topology/tree.")
    topo.add_argument("input", nargs="?", default="-", help="ibnetdiscover output file (default: stdin)")
    topo.add_argument("-o", "--output", help="write topology.conf here (default: stdout)")
    topo.add_argument("--match", action="append", metavar="GLOB",
                      help="keep only nodes whose name matches (repeatable), e.g. 'gpu*'")
    topo.add_argument("--hca", metavar="NAME", help="place each node by the HCA with this name in its "
                                                    "description (e.g. mlx5_0); default: its first HCA")
    topo.add_argument("--all-rails", action="store_true", help="list a node under every leaf its HCAs reach")
    args = parser.parse_args(argv)
    if args.cmd == "check-profiles":
        return _check_profiles(args)
    return _topology(args)


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
