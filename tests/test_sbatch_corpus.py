"""Issue 22 §1: no command line loses stune's settings without a word, on the Slurm the suite runs on.

A generated corpus of command lines (options of newer releases and of plugins this cluster does not have,
with and without `=`, `--`, odd quoting, options after the script, directives) goes through stune-sbatch to
the cluster's real sbatch with `--test-only` (sbatch checks the whole line with slurmctld and submits
nothing). A shim in front of sbatch (STUNE_SLURM_BIN) records the environment stune handed it and execs the
real one. Each line either reached sbatch with stune's settings (STUNE_MANAGED and the profile's NCCL_IB_TC)
or printed a one-line warning saying why not; and `--dry-run` agrees with what sbatch accepted. Which words
are unknown is the installed sbatch's business: on 22.05 `--tres-per-task` is warned about, on 24.11 and
later it is an option like any other, and the test expects neither.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from slurm_tune.slurm.commands import SLURM_COMMANDS

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)
HEADS = [["-p", "roce"], ["--partition=roce"], ["-proce"], ["--part", "roce"]]
EXTRAS = [
    [],
    ["--tres-per-task=cpu:1"],
    ["--tres-per-task", "cpu:1"],
    ["--oom-kill-step"],
    ["--mem-update=10"],
    ["--container-type", "oci"],
    ["--container-image", "nvcr.io#nvidia/pytorch:24.05-py3"],
    ["--container-writable"],
    ["--comment", "a b 'c' \"d\" $HOME `x`"],
    ["--job-name=x=y z"],
    ["-J", "it's"],
    ["--nod=1"],
    ["--export=NONE"],
    ["--export=ALL,FOO=1"],
    ["--checkpoint-signal"],
    ["-N1", "-t", "5"],
    ["--bogus-flag"],
    ["-y"],
    ["--time", "5", "--no-such=1"],
    ["--clus=x"],
]


def corpus(script: str) -> list[list[str]]:
    tails = [[script], ["--", script], [script, "--lr", "1", "-p", "vpc"], ["--wrap", "true"]]
    lines = []
    for k, extra in enumerate(EXTRAS):
        lines.append(HEADS[k % 4] + extra + tails[k % 4])
        lines.append(extra + HEADS[(k + 1) % 4] + tails[(k + 2) % 4])
    return lines


@pytest.fixture
def shim(cluster, tmp_path):
    """A Slurm bin directory: every client command is the real one; sbatch first writes down what it got."""
    real = cluster.install.bin_dir or os.path.dirname(
        subprocess.run(
            ["sh", "-c", "command -v sbatch"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in SLURM_COMMANDS:
        if os.path.exists(os.path.join(real, name)):
            (bindir / name).symlink_to(os.path.join(real, name))
    (bindir / "sbatch").unlink()
    (bindir / "sbatch").write_text(
        "#!/bin/sh\n"
        'if [ "$1" != "--help" ]; then\n'
        '  { printf "MANAGED=%s\\n" "${STUNE_MANAGED-}"; printf "TC=%s\\n" "${NCCL_IB_TC-}"; } > "$CORPUS_LOG"\n'
        "fi\n"
        f'exec {real}/sbatch "$@"\n'
    )
    (bindir / "sbatch").chmod(0o755)
    return bindir


def run_line(words, env, log):
    if log.exists():
        log.unlink()
    out = subprocess.run(
        [os.path.join(BIN, "stune-sbatch"), "--test-only", *words],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    seen = dict(line.split("=", 1) for line in log.read_text().splitlines()) if log.exists() else {}
    return out, seen


def test_every_line_of_the_corpus_gets_stunes_settings_or_a_warning(shim, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -t 5\ntrue\n")
    directive = tmp_path / "directive.sh"
    directive.write_text(
        "#!/bin/sh\n#SBATCH --tres-per-task=cpu:1\n#SBATCH -p roce\n#SBATCH --oom-kill-step\ntrue\n"
    )
    refused_script = tmp_path / "refused.sh"
    refused_script.write_text("#!/bin/sh\n#SBATCH -p roce\n#SBATCH --clus=x\ntrue\n")
    log = tmp_path / "sbatch.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SBATCH_", "STUNE_MANAGED"))}
    env.update(
        STUNE_SLURM_BIN=str(shim),
        CORPUS_LOG=str(log),
        STUNE_HISTORY=str(tmp_path / "h.jsonl"),
        STUNE_CACHE_DIR=str(tmp_path / "cache"),
    )
    lines = [*corpus(str(script)), [str(directive)], ["--", str(directive)], [str(refused_script)]]
    report = []
    for words in lines:
        out, seen = run_line(words, env, log)
        dry = subprocess.run(
            [os.path.join(BIN, "stune-sbatch"), "--dry-run", "--test-only", *words],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        ours = [line for line in out.stderr.splitlines() if line.startswith("stune-sbatch:")]
        warned = [line for line in ours if line.startswith("stune-sbatch: warning:")]
        settings = bool(seen.get("MANAGED")) and seen.get("TC") == "106"
        refused = any("sbatch will refuse this" in line for line in warned)
        accepted = out.returncode == 0
        report.append((words, out.returncode, settings, warned, dry.returncode))
        assert seen, f"{words}: sbatch never ran: {out.stderr}"
        assert settings or (refused and warned), (
            f"{words}: stune's settings lost without a word: {out.stderr}"
        )
        unknown = [line for line in warned if "is not in this Slurm's sbatch option table" in line]
        if unknown:
            assert settings, f"{words}: warned, but the settings were dropped too: {out.stderr}"
        if accepted:  # what sbatch accepts, the dry run does not call refused
            assert dry.returncode == 0 and "would refuse" not in dry.stderr, (words, dry.stderr)
        if dry.returncode == 2:
            assert not accepted, (words, out.stderr)
    # the corpus exercises both outcomes on every release: accepted lines, and lines only a warning explains
    assert any(r[1] == 0 and r[2] for r in report)
    assert any(r[3] for r in report)
    # the learned table was cached: a plain submission after the corpus asks sbatch for no help
    assert (tmp_path / "cache" / "sbatch-options.txt").is_file()
