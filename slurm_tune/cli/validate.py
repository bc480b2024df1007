"""`stune-validate`: does this partition's software stack compute and train correctly? (docs/validate.md)

    stune-validate run -p PARTITION [--layers ops,converge] [--nodes n1,n2] [--reservation R] [--wait S]
                       [--against-previous] [--json]     layers 1 and 2 as Slurm jobs, judged and stored
    stune-validate report -p PARTITION --verdict pass|fail [--metric name=value ...] [--note TEXT]
                          [--file results.json]          layer 3: record your full training's verdict
    stune-validate show -p PARTITION [--json]            the latest record per layer and node
    stune-validate status -p PARTITION [--json]          the acceptance page: runs, correct, fast, stable
    stune-validate agent --spec JSON                     (inside a validation job: run the layers here)

Common: --store DIR (default $STUNE_ACTIVE_DIR or /var/lib/stune/active; records under validate/).
Exit status: 0 done, every layer run passed; 1 an error (bad profile, Slurm did not answer); 3
(EXIT_ATTENTION) `run`: a layer failed, or could not be judged (unknown, unavailable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..active import acceptance, store
from ..errors import StuneError
from ..hostlist import expand_hostlist
from ..output import json_text
from ..profiles import load_profile
from ..slurm import Slurm
from ..validate import report as layer3
from ..validate import run as runner
from ..validate import show
from ..validate.agent import run_spec
from ..validate.records import valid_record
from . import options
from .common import EXIT_ATTENTION, EXIT_OK, guarded

PROG = "stune-validate"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,report,show,status}")
    common = options.store_parent("records")
    run = sub.add_parser("run", parents=[common], help="run layers 1 and 2 as Slurm jobs, judge and store")
    options.add(run, "partition", required=True)
    run.add_argument("--layers", default="ops,converge", help="comma list of ops, converge (default both)")
    run.add_argument("--nodes", help="these idle nodes (a host list; default one idle node)")
    run.add_argument("--reservation", help="run inside this maintenance reservation")
    run.add_argument("--wait", type=float, help="seconds to wait for the jobs before cancelling them")
    run.add_argument(
        "--against-previous",
        action="store_true",
        help="compare with this partition's own previous passing run (before/after a driver change)",
    )
    options.add(run, "json", help="the judged records as JSON")
    options.add(run, "dry_run", help="say which nodes and jobs; submit and store nothing")
    rep = sub.add_parser("report", parents=[common], help="layer 3: record your full training's verdict")
    options.add(rep, "partition", required=True)
    rep.add_argument("--verdict", required=True, choices=("pass", "fail"))
    rep.add_argument("--metric", action="append", default=[], metavar="NAME=VALUE", help="a number (repeat)")
    rep.add_argument("--note", default="", help="what was trained, where the logs are")
    rep.add_argument("--file", help="a JSON object of results: its numbers become metrics")
    options.add(rep, "json", help="the stored record as JSON")
    options.add(rep, "dry_run", help="print the record; store nothing")
    sh = sub.add_parser("show", parents=[common], help="the latest record per layer and node")
    options.add(sh, "partition", required=True)
    options.add(sh, "json", help="the records as JSON")
    st = sub.add_parser("status", parents=[common], help="the acceptance page: runs, correct, fast, stable")
    options.add(st, "partition", required=True)
    options.add(st, "json", help="the page as JSON")
    agent = sub.add_parser("agent")
    agent.add_argument("--spec", required=True)
    return p


def _layers(text: str) -> tuple[str, ...]:
    layers = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in layers if x not in runner.LAYERS]
    if bad or not layers:
        raise StuneError(f"--layers {text!r}: choose from {', '.join(runner.LAYERS)}")
    return layers


def _run(args, directory: str) -> int:
    profile = load_profile(args.partition, args.partitions_dir)
    opts = runner.Options(
        args.partition,
        directory,
        layers=_layers(args.layers),
        nodes=expand_hostlist(args.nodes) if args.nodes else None,
        reservation=args.reservation,
        wait_s=args.wait,
        against_previous=args.against_previous,
        dry_run=args.dry_run,
    )
    records = runner.run(Slurm.from_env(), profile, opts, log=print if not args.json else lambda _: None)
    if args.dry_run:
        return EXIT_OK
    if args.json:
        sys.stdout.write(json_text({"partition": args.partition, "records": records}))
    else:
        sys.stdout.write(show.run_text(records))
    return EXIT_OK if records and all(r["status"] == "pass" for r in records) else EXIT_ATTENTION


def _show(args, directory: str) -> int:
    history = store.load(directory, args.partition, kind="validate", accept=valid_record)
    latest = show.latest_per_layer_node(history)
    if args.json:
        sys.stdout.write(json_text({"partition": args.partition, "records": latest}))
    else:
        sys.stdout.write(
            show.show_text(latest, history) if latest else f"no validation records for {args.partition}\n"
        )
    return EXIT_OK


def _status(args, directory: str) -> int:
    profile = load_profile(args.partition, args.partitions_dir)
    page = acceptance.build(directory, profile, args.partition, time.time(), profile.active.window)
    sys.stdout.write(json_text(page) if args.json else acceptance.text(page))
    return EXIT_ATTENTION if page["state"] in (acceptance.FAIL, acceptance.ATTENTION) else EXIT_OK


def _main(argv: list[str]) -> int:
    args = options.parse(_parser(), argv)
    if args.command == "agent":
        try:
            spec = json.loads(args.spec)
        except ValueError as exc:
            raise StuneError(f"--spec is not JSON: {exc}") from None
        return run_spec(spec, emit=lambda line: print(line, flush=True))
    directory = store.store_dir(args.store)
    if args.command == "run":
        return _run(args, directory)
    if args.command == "show":
        return _show(args, directory)
    if args.command == "status":
        return _status(args, directory)
    load_profile(args.partition, args.partitions_dir)  # a partition stune knows, not a typo
    record = layer3.record(
        args.partition, args.verdict, args.metric, args.note, args.file, directory, store_it=not args.dry_run
    )
    if args.json:
        sys.stdout.write(json_text(record))
    else:
        done = "would be recorded" if args.dry_run else "recorded"
        print(f"{args.partition}: layer 3 (training) verdict {record['verdict']} {done} by {record['by']}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
