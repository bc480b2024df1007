"""The Prolog and Epilog hook's Python side (`prolog/10-stune-health` imports it once it has found stune):
export the hook environment file as `set -a; . FILE` would, then run the prolog or the epilog and turn its
verdict into the hook's exit status. Here rather than in the hook script so that it is compiled once (bytecode
cache), not at every job. The script has already checked that root alone can write the file."""

from __future__ import annotations

import os
import sys

NAME = "10-stune-health"
_UNSAFE_VALUE = set("$`\\\"'; &|<>()*?[]{}~\t")


def simple_assignments(text):
    """{NAME: VALUE} when every line is blank, a comment, or `[export ]NAME=VALUE` with a plain or quoted
    literal value (what `set -a; . FILE` would export); None for anything a shell must evaluate."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        name, eq, value = line.partition("=")
        if (
            not eq
            or not name
            or not (name[0].isalpha() or name[0] == "_")
            or not all(c.isalnum() or c == "_" for c in name)
            or not name.isascii()
        ):
            return None
        if value[:1] in ("'", '"'):
            end = value.find(value[0], 1)
            inner, rest = value[1:end], value[end + 1 :]
            if end < 0 or (value[0] == '"' and set("$`\\") & set(inner)):
                return None
            value = inner
        else:
            value, _, rest = value.partition(" ")
            if _UNSAFE_VALUE & set(value) or "#" in value[:1]:
                return None
        if (rest.strip() and not rest.lstrip().startswith("#")) or rest[:1] not in ("", " ", "\t"):
            return None
        out[name] = value
    return out


def shell_assignments(path):
    """What `set -a; . FILE` exports, asked of /bin/sh (for an env file with more than plain assignments)."""
    read, write = os.pipe()
    pid = os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", 'set -a; . "$1" >&2 && exec env -0', "sh", path],
        os.environ,
        file_actions=[(os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_CLOSE, read)],
    )
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise OSError("sourcing it failed")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in data.split(b"\0") if item)


def main(env_file: str | None, bindir: str, mode: str = "prolog") -> int:
    """Exit status for Slurm: 1 only for a judged failure under a trusted policy, else 0."""
    if env_file:
        with open(env_file, encoding="utf-8", errors="replace") as fh:
            settings = simple_assignments(fh.read())
        os.environ.update(shell_assignments(env_file) if settings is None else settings)
    bindir = os.environ.get("STUNE_BIN") or bindir
    os.environ["PATH"] = f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"
    from .node import run_hook

    rc = run_hook(mode)
    if rc == 10:
        return 1  # judged failed: Slurm drains the node (and requeues the job a prolog held back)
    if rc != 0:
        sys.stderr.write(
            f"{NAME}: stune-health {mode} exited {rc}; not failing job {os.environ.get('SLURM_JOB_ID', '')}\n"
        )
    return 0
