"""The install manifest and the file operations install and uninstall record in it.

place_file puts one file in place idempotently (an admin's edit is kept and its diff shown, unless --force),
make_dirs creates directories root-owned and remembers which it created, and the manifest (path -> sha256,
and those directories) is what lets `uninstall` remove exactly what was placed. Report is what a run did.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field

from .. import safeio
from ..errors import StuneError

MANIFEST_FORMAT = "stune-install/1"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Report:
    dry_run: bool
    changed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    checked: int = 0
    out: list[str] = field(default_factory=list)
    manifest_dirty: bool = False  # the manifest learned something (a file already as stune would place it)
    planned: set[str] = field(default_factory=set)  # directories a dry run would have created by now

    def say(self, line: str) -> None:
        self.out.append(line)


def load_manifest(path: str) -> dict:
    try:
        fd = safeio.open_file(path)
    except FileNotFoundError:
        return {"format": MANIFEST_FORMAT, "files": {}, "dirs": []}
    except OSError as exc:
        raise StuneError(f"{path}: cannot read the install manifest: {exc}") from None
    try:
        data = safeio.read_bounded(fd, 1 << 20)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data or b"")
    except ValueError:
        doc = None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != MANIFEST_FORMAT
        or not isinstance(doc.get("files"), dict)
    ):
        raise StuneError(f"{path}: not a stune install manifest; move it away to start over")
    doc.setdefault("dirs", [])
    return doc


def save_manifest(path: str, manifest: dict) -> None:
    safeio.write_atomic(path, json.dumps(manifest, indent=1, sort_keys=True) + "\n", mode=0o644)


def read_or_none(path: str) -> bytes | None:
    """A file's bytes, None when it does not exist."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _diff(path: str, old: bytes, new: bytes) -> str:
    return "".join(
        difflib.unified_diff(
            old.decode(errors="replace").splitlines(True),
            new.decode(errors="replace").splitlines(True),
            f"{path} (yours)",
            f"{path} (stune's)",
        )
    )


def place_file(report: Report, manifest: dict, path: str, data: bytes, mode: int, force: bool) -> None:
    report.checked += 1
    current = read_or_none(path)
    recorded = manifest["files"].get(path, {}).get("sha256")
    if current == data:
        st = os.lstat(path)
        if stat.S_IMODE(st.st_mode) != mode or st.st_uid != os.geteuid():
            if not report.dry_run:  # through a no-follow descriptor: never the target of a planted symlink
                fd = safeio.open_file(path, single_link=False)
                try:
                    os.fchown(fd, os.geteuid(), os.getegid())
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
            report.changed.append(path)
            report.say(f"fixed owner/mode {mode:04o}: {path}")
        if recorded != sha256(data) and not report.dry_run:
            manifest["files"][path] = {"sha256": sha256(data), "mode": mode}
            report.manifest_dirty = True
        return
    if current is not None and sha256(current) != recorded and not force:
        report.kept.append(path)
        report.say(f"kept (edited by an admin; --force replaces it): {path}")
        report.say(_diff(path, current, data).rstrip("\n"))
        return
    verb = (
        "placed" if current is None else ("replaced (--force)" if sha256(current) != recorded else "updated")
    )
    make_dirs(report, manifest, os.path.dirname(path), 0o755)
    report.say(f"{'would be ' if report.dry_run else ''}{verb}: {path}")
    report.changed.append(path)
    if report.dry_run:
        return
    safeio.write_atomic(path, data, mode=mode)
    manifest["files"][path] = {"sha256": sha256(data), "mode": mode}


def make_dirs(report: Report, manifest: dict, path: str, mode: int, group: int | None = None) -> None:
    """Create `path` (and missing parents) root-owned with `mode`; remember what was created."""
    missing = []
    probe = path
    while probe and not os.path.isdir(probe) and probe not in report.planned:
        missing.append(probe)
        probe = os.path.dirname(probe)
    for d in reversed(missing):
        report.changed.append(d)
        final_mode = (
            mode if d == path else 0o755
        )  # parents: 0755 and root's group, as the real run makes them
        if report.dry_run:  # the same line as the real run, once per directory
            report.planned.add(d)
            report.say(f"would create: {d}/ ({final_mode:04o})")
            continue
        os.mkdir(d, 0o755)
        os.chown(d, 0 if os.geteuid() == 0 else -1, group if d == path and group is not None else -1)
        os.chmod(d, final_mode)
        manifest["dirs"].append(d)
        report.say(f"created: {d}/ ({final_mode:04o})")
