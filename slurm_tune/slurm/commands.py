"""Slurm's client commands: `SlurmCommands`, the part of the adapter that knows where the commands are, which
slurm.conf they read and how long they may take, and runs them (through spawn.py). `Slurm` (adapter.py)
builds every query and update on it, through SlurmReader (reader.py) and SlurmAccounting (accounting.py). A
submission needs only this part: stune-sbatch passes the job to sbatch and asks Slurm nothing on its plain
path (the hot-path rules: docs/speed.md); on the rare path that asks, adapter.queries_on() makes the whole
adapter of the same handle.
"""

from __future__ import annotations

import os

from ..errors import SlurmError
from .spawn import spawn_capture, spawn_relay

DEFAULT_TIMEOUT_S = 30.0
SLURM_COMMANDS = frozenset(
    {
        "sacct",
        "sacctmgr",
        "salloc",
        "sattach",
        "sbatch",
        "sbcast",
        "scancel",
        "scontrol",
        "scrontab",
        "sdiag",
        "sinfo",
        "sprio",
        "squeue",
        "sreport",
        "srun",
        "sshare",
        "sstat",
        "strigger",
    }
)


class SlurmCommands:
    """The client commands of one cluster. `conf` is the slurm.conf path (SLURM_CONF); None means Slurm's
    default. `calls` records every command run, so tests can count RPCs."""

    def __init__(
        self, conf: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, bin_dir: str | None = None
    ):
        self.conf, self.timeout, self.bin_dir = conf, timeout, bin_dir
        self.calls: list[list[str]] = []

    @classmethod
    def from_env(cls, timeout: float = DEFAULT_TIMEOUT_S):
        return cls(
            conf=os.environ.get("SLURM_CONF") or None,
            timeout=timeout,
            bin_dir=os.environ.get("STUNE_SLURM_BIN") or None,
        )

    def __repr__(self):
        return f"{type(self).__name__}(conf={self.conf!r})"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        env["SLURM_TIME_FORMAT"] = "%s"  # epoch seconds: no locale or timezone parsing
        if extra:
            env.update(extra)
        return env

    def executable(self, name: str) -> str:
        """A Slurm client command from bin_dir when one is set; anything else (runuser...) from PATH."""
        return os.path.join(self.bin_dir, name) if self.bin_dir and name in SLURM_COMMANDS else name

    def run(
        self,
        argv: list[str],
        *,
        input: str | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        check: bool = True,
    ) -> str:
        """Run one Slurm command and return its stdout. Raises SlurmError on failure or timeout."""
        rc, out, err = self.run_full(argv, input=input, timeout=timeout, env=env)
        if check and rc != 0:
            raise SlurmError(argv, rc, err or out)
        return out

    def run_full(
        self,
        argv: list[str],
        *,
        input: str | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); raises SlurmError only when the command cannot run or times out."""
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        limit = self.timeout if timeout is None else timeout
        try:
            rc, out, err = spawn_capture(argv, input, self.env(env), limit, self.executable(argv[0]))
        except TimeoutError:
            raise SlurmError(argv, None, f"no answer within {limit:g}s") from None
        except OSError as exc:
            raise SlurmError(argv, 127, f"cannot run {argv[0]}: {exc.strerror}") from None
        return rc, out, err

    def sbatch_passthrough(
        self, args: list[str], script: bytes | None, env: dict[str, str]
    ) -> tuple[int, str]:
        """Run `sbatch ARGS` as the user would: its stderr is ours, its stdout is relayed to ours as it
        comes (and returned, for the job id), `script` (when given) is its stdin, and its exit status is
        returned (128+N for a signal). No timeout: sbatch has its own, and --wait lasts as long as the job."""
        argv = ["sbatch", *args]
        self.calls.append(argv)
        if self.conf and "SLURM_CONF" not in env:
            env = dict(env, SLURM_CONF=self.conf)
        try:
            rc, out = spawn_relay(["sbatch", *args], script, env, self.executable("sbatch"))
        except OSError as exc:
            raise SlurmError(argv, 127, f"cannot run sbatch: {exc.strerror}") from None
        return rc, out
