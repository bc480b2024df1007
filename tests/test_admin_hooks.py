"""The shell hooks exactly as `stune-admin install` places them: `%n` in the env file's paths means what it
means to the Python side (thisnode.expand), so the sampler reads the records the prolog writes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune import thisnode
from slurm_tune.cli.admin import main as admin
from slurm_tune.usage.config import usage_dirs
from slurm_tune.usage.sampler import Sampler

REPO = Path(__file__).resolve().parent.parent
PREAMBLE = REPO / "hooks" / "stune-hook-env.sh"


def sh_expand(texts: list[str], node: str | None) -> list[str]:
    """The preamble's stune_node_path on each text, in one sh run."""
    script = f'. "{PREAMBLE}"\nfor t in "$@"; do stune_node_path "$t"; printf "%s\\0" "$stune_path"; done\n'
    env = {
        "PATH": "/usr/bin:/bin",
        "STUNE_ENV_FILE": "/dev/null",
        **({"SLURMD_NODENAME": node} if node else {}),
    }
    proc = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *texts], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\0")[:-1]


def test_the_hook_preamble_expands_percent_n_as_thisnode_does():
    cases = [
        "/var/lib/stune/usage",
        "/x/%n/usage",
        "/x/%%n/y",
        "%%%n",
        "%",
        "%%",
        "%%%",
        "a%b",
        "%n%n",
        "n%",
        "/x/%N/%j",
        "%%%%n",
        "/sp ace/%n",
    ]
    for node in ("n2", "gpu-a017", None):
        want = [thisnode.expand(t, node or thisnode.host_name(), {}) for t in cases]
        assert sh_expand(cases, node) == want, node


@settings(max_examples=25, deadline=None)
@given(st.lists(st.text(alphabet="%n/a. *?[\\", max_size=12), min_size=1, max_size=20))
def test_the_hook_preamble_and_thisnode_agree_on_any_path(texts):
    assert sh_expand(texts, "n7") == [thisnode.expand(t, "n7") for t in texts]


def install_site(tmp_path: Path, *sets: str) -> Path:
    rc = admin(["install", "--prefix", str(tmp_path), "--role", "node", *(f"--set={s}" for s in sets)])
    assert rc == 0
    return tmp_path / "etc/slurm"


def test_installed_prolog_writes_where_the_sampler_reads_with_percent_n(tmp_path, capsys, monkeypatch):
    """docs/admin.md's per-node STUNE_USAGE_DIR: the placed prolog (no wrapper, SLURMD_NODENAME from slurmd)
    records the job in nodes/n2/usage/jobs, which the sampler for n2 reads; no literal %n directory."""
    template = f"{tmp_path}/nodes/%n/usage"
    etc = install_site(tmp_path, f"STUNE_USAGE_DIR={template}")
    capsys.readouterr()
    proc = subprocess.run(
        [str(etc / "prolog.d/20-stune-jobgpus")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "1,3", "SLURMD_NODENAME": "n2"},
    )
    assert proc.returncode == 0 and proc.stderr == ""
    assert not (tmp_path / "nodes" / "%n").exists()
    monkeypatch.setenv("STUNE_USAGE_DIR", template)
    monkeypatch.setenv("STUNE_USAGE_SPOOL", str(tmp_path / "spool"))
    local, _ = usage_dirs(node="n2")
    sampler = Sampler(source=None, local_dir=local)
    sampler.refresh_jobs()
    assert list(sampler.jobs) == ["7"]


def test_installed_epilog_finds_the_record_under_percent_n(tmp_path, capsys):
    """The placed epilog looks for the job's record where the prolog put it (nodes/n2/usage/jobs/8): a GPU
    job whose record is there gets its summary even when slurmd gives no SLURM_JOB_GPUS to the epilog."""
    template = f"{tmp_path}/nodes/%n/usage"
    spool = tmp_path / "spool"
    spool.mkdir()
    etc = install_site(tmp_path, f"STUNE_USAGE_DIR={template}", f"STUNE_USAGE_SPOOL={spool}")
    capsys.readouterr()
    base = {"SLURM_JOB_ID": "8", "SLURMD_NODENAME": "n2"}
    assert (
        subprocess.run(
            [str(etc / "prolog.d/20-stune-jobgpus")], env={**base, "SLURM_JOB_GPUS": "0"}, timeout=60
        ).returncode
        == 0
    )
    proc = subprocess.run(
        [str(etc / "epilog.d/20-stune-usage")], capture_output=True, text=True, timeout=120, env=base
    )
    assert proc.returncode == 0, proc.stderr
    assert (spool / "8" / "n2.json").exists(), proc.stderr
    assert not (tmp_path / "nodes/n2/usage/jobs/8").exists()
    assert os.listdir(tmp_path / "nodes") == ["n2"]
