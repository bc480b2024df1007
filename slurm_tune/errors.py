"""The one error family stune raises. Only entry points turn these into messages and exit codes."""
from __future__ import annotations


class StuneError(Exception):
    """Base of every error stune raises on purpose. str() is one line, fit for a user."""


class ConfigError(StuneError):
    """A profile or config file is wrong. Names the file, line and key path."""

    def __init__(self, path: str, line: int | None, key: str, problem: str):
        self.path, self.line, self.key, self.problem = path, line, key, problem
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


class SlurmError(StuneError):
    """A Slurm command failed or timed out. Carries the command, its exit code and Slurm's own message."""

    def __init__(self, command: list[str], returncode: int | None, message: str):
        self.command, self.returncode = list(command), returncode
        self.message = message.strip()
        code = "timed out" if returncode is None else f"failed (exit {returncode})"
        first = self.message.splitlines()[0] if self.message else "(no message)"
        super().__init__(f"{self.command[0] if self.command else 'slurm'} {code}: {first}")


class ClusterError(StuneError):
    """The local development cluster could not be brought up or down."""
