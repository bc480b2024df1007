"""What `--stage` adds to a submission: STUNE_STAGE for the TaskProlog, the variables the job reads, the
warnings for sources this host cannot see, pyxis's --container-mounts for them, and the fallback for a
partition without a profile (no cache tier: each variable points at its source)."""

from __future__ import annotations

from .export import export_with, parse_export
from .options import Effective
from .setting import ENV, NOTE, OPTION, STAGED, WARNING, Setting, origin

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile


def stage_settings(stage_args: list[str], required: bool, cwd: str, eff: Effective, environ) -> list[Setting]:
    """--stage SRC[:NAME] / --stage-required -> STUNE_STAGE for the TaskProlog."""
    if not stage_args and not required:
        return []
    from ..stage.spec import ENV_VAR, encode_requests

    requests = stage_requests_of(stage_args, eff, cwd)
    value = encode_requests(requests, required)
    import os

    missing = [r for r in requests if not os.path.exists(r.source)]
    present = [r for r in requests if r not in missing]
    what = ", ".join(str(r) for r in present) or ("the profile's cache.stage" if not missing else "nothing")
    rule = "rule: --stage" + (" --stage-required" if required else "")
    out = [Setting(ENV, ENV_VAR, value, rule, True, f"staged on each node into the cache tier: {what}")]
    out.extend(  # what the job script reads: STUNE_STAGE above is the request, not a path
        Setting(
            STAGED,
            r.variable,
            None,
            rule,
            True,
            f"your job reads ${r.variable}: on each node, the staged copy of {r.source} in the cache "
            "tier (the source itself when it is not staged"
            + (", or the job fails: --stage-required)" if required else ")"),
        )
        for r in requests
    )
    for r in missing:
        then = (
            "the job will fail (--stage-required)"
            if required
            else f"{r.variable} will point at the missing source"
        )
        out.append(
            Setting(
                WARNING,
                "stage",
                None,
                rule,
                True,
                f"{r.source} does not exist on this host: nothing to stage unless the nodes see it; {then}",
            )
        )
    return out


def stage_requests_of(stage_args: list[str], eff: Effective, cwd: str):
    """The --stage requests, a relative SRC taken from the job's directory (--chdir included)."""
    from ..stage.spec import parse_stage_arg

    chdir = eff.get("chdir")
    base = cwd
    if chdir is not None and chdir.value:
        base = chdir.value if chdir.value.startswith("/") else f"{cwd.rstrip('/')}/{chdir.value}"
    return [parse_stage_arg(arg, base) for arg in stage_args]


def container_settings(profile: Profile, eff: Effective, stage_args: list[str], cwd: str) -> list[Setting]:
    """With a pyxis container, a staged dataset's path (the cache tier, or the source it falls back to) must be
    mounted into it: stune adds --container-mounts for them unless you gave your own."""
    from .options import LONG

    image = eff.get("container-image")
    if image is None or not stage_args or "container-mounts" not in LONG:
        return []
    tier = profile.cache.path  # None: no cache tier, the job reads the sources
    paths = ([tier] if tier else []) + [r.source for r in stage_requests_of(stage_args, eff, cwd)]
    source = "rule: --container-image with --stage; " + origin(profile, "cache.path")
    mine = eff.get("container-mounts")
    if mine is not None:
        return [
            Setting(
                NOTE,
                "container",
                None,
                source,
                False,
                f"kept your --container-mounts={mine.value} ({mine.where}): add {','.join(paths)} to it, "
                "or the staged data is not visible in the container",
            )
        ]
    if tier and "%" in tier:
        return [
            Setting(
                NOTE,
                "container",
                None,
                source,
                True,
                f"cache.path {tier} differs per node: mount it with --container-mounts yourself",
            )
        ]
    value = ",".join(f"{p}:{p}" for p in dict.fromkeys(paths))
    return [
        Setting(
            OPTION,
            "--container-mounts",
            value,
            source,
            True,
            "the cache tier and the sources, at the same paths inside the container, so "
            "$STUNE_STAGE_<NAME> resolves there",
        )
    ]


def unprofiled_stage(
    stage_args: list[str], eff: Effective, cwd: str
) -> tuple[dict[str, str], list[str], list[str]]:
    """A partition without a profile has no cache tier: each --stage dataset's variable points at its source,
    so the job script still finds it. (env, sbatch options, warnings)."""
    import os

    requests = stage_requests_of(stage_args, eff, cwd)
    env = {r.variable: r.source for r in requests}
    warnings = [
        f"no cache tier for this partition: nothing is staged; {r.variable}={r.source} (the source)"
        + ("" if os.path.exists(r.source) else ", which does not exist on this host")
        for r in requests
    ]
    export_option = export_with(parse_export(eff.get("export")), env)
    return env, [export_option] if export_option else [], warnings
