"""How the adapter reads Slurm's answers: `SlurmReader`, between the client commands (commands.py) and the
queries (accounting.py, adapter.py). It knows the release of the client commands (`version()`, read once per
process), takes the list out of a Slurm JSON document (`_json`) and the columns out of a `-P`/`-o a|b`
listing (`_rows`), and names the command and the release in the SlurmFormatError for output of a layout
stune does not know (`_unknown`).
"""

from __future__ import annotations

import os

from ..errors import SlurmError, SlurmFormatError
from .commands import SlurmCommands
from .spawn import spawn_capture

TYPE_CHECKING = False  # (typing's constant, without importing typing on stune-sbatch's path)
if TYPE_CHECKING:
    from .version import SlurmVersion

# The release per (sinfo executable, PATH): read once per process.
_VERSIONS: dict[tuple[str, str], SlurmVersion] = {}


class SlurmReader(SlurmCommands):
    """The client commands, and the reading every query shares: the release, Slurm's JSON documents, `-P`
    listings, and the error for output this adapter does not know."""

    # ---- the Slurm release ------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        """The release of the Slurm client commands this handle runs, read once per process and executable
        directory (`sinfo --version`: 'slurm 24.11.5', Debian's 'slurm-wlm 22.05.8')."""
        key = (self.executable("sinfo"), os.environ.get("PATH", ""))
        found = _VERSIONS.get(key)
        if found is None:  # not in self.calls: it reaches no daemon, and RPC counts stay as they were
            argv = ["sinfo", "--version"]
            try:
                rc, out, err = spawn_capture(argv, None, self.env(), self.timeout, key[0])
            except TimeoutError:
                raise SlurmError(argv, None, f"no answer within {self.timeout:g}s") from None
            except OSError as exc:
                raise SlurmError(argv, 127, f"cannot run sinfo: {exc.strerror}") from None
            if rc != 0:
                raise SlurmError(argv, rc, err or out)
            from .version import (  # at first use, not with the adapter (test_slurm_adapter)
                parse_version,
                warn_if_untested,
            )

            found = parse_version(out, argv)
            _VERSIONS[key] = found
            warn_if_untested(found)
        return found

    def _json(self, argv: list[str], key: str, out: str | None = None) -> list[dict]:
        """The `key` list of a Slurm JSON document (argv's stdout, or `out` when already run); SlurmError for
        Slurm's own errors and for any document that has no such list (a format this adapter does not know)."""
        import json  # the JSON queries only: json loads re (~0.8x a bare start; docs/speed.md)

        if out is None:
            out = self.run(argv)
        try:
            doc = json.loads(out)
        except ValueError as exc:
            raise self._unknown(argv, None, f"unreadable JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise self._unknown(argv, None, "not a JSON object")
        errors = doc.get("errors") or []
        if not isinstance(errors, list):
            raise self._unknown(argv, doc, "'errors' is not a list")
        errors = [e for e in errors if e]
        if errors:
            raise SlurmError(
                argv,
                0,
                "; ".join(str(e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors),
            )
        records = doc.get(key)
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise self._unknown(argv, doc, f"no '{key}' list")
        return records

    def _unknown(self, argv: list[str], doc, problem: str) -> SlurmFormatError:
        """A SlurmFormatError for output of a layout this adapter does not know, naming the whole command and
        the release (from the document's own meta when it has one, else the detected release)."""
        from .version import document_release  # at first use, not with the adapter (test_slurm_adapter)

        release = document_release(doc)
        if release is None:
            try:  # the error path may spend one more command on naming the release
                release = self.version().release
            except SlurmError:
                release = None
        return SlurmFormatError(argv, release, problem)

    def _rows(self, argv: list[str], width: int):
        """(line number, columns) of each non-empty line of a `-P`/`-o a|b` listing with `width` columns;
        a SlurmFormatError naming the line for any line of another width."""
        for number, line in enumerate(self.run(argv).splitlines(), 1):
            if not line.strip():
                continue
            cols = line.split("|")
            if len(cols) != width:
                raise self._unknown(
                    argv, None, f"line {number} has {len(cols)} columns, expected {width}: {line[:120]!r}"
                )
            yield number, cols
