"""`stune-admin doctor`'s node facts and version matrix: per node, the GPU model, driver, CUDA, NCCL, HCA
model and firmware, and kernel, from a capture (`--facts DIR`) or, in hardware-less mode, the node's %n sysfs
tree and GPU snapshot; on AMD and Ascend nodes also their vendor's versions (doctor_accel.py: the capture's
`accel` section); then each partition checked for one of each. A fact nothing recorded is '?': said, never
guessed; '-' is a part of another vendor's matrix (an Ascend node has no CUDA). A part of Doctor (doctor.py),
which supplies `add`, `env`, `facts_dir`, `matrix` and `node_profiles`."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable

from ..health.collect import add_drift, full, replay_gpus
from ..output import table
from ..thisnode import expand, uses_node
from .doctor_accel import (
    ACCEL_FACT_KEYS,
    NOT_THIS_VENDOR,
    VENDOR_FACTS,
    AccelChecks,
    accel_facts,
    accel_model,
    nvml_devices,
)
from .findings import ERROR, OK, WARNING

FACT_KEYS = ("gpu_model", "driver", "cuda", "nccl", "hca_model", "hca_fw", "kernel")
HOMOGENEOUS = ("gpu_model", "driver", "cuda", "hca_model", "hca_fw")
UNKNOWN = ("?", NOT_THIS_VENDOR)  # not compared: not recorded, or not this vendor's


class NodeChecks(AccelChecks):
    # what Doctor supplies
    add: Callable[..., None]
    env: dict[str, str]
    facts_dir: str | None
    matrix: dict[str, dict[str, str]]
    snapshots: dict[str, dict | None]
    drift_sysctls: list[str]  # the sysctls any profile names: read from a hardware-less tree
    node_profiles: dict  # node -> the profile of its AMD or Ascend partition (the hardware-less capture's)

    def node_facts(self, node: str) -> dict[str, str] | None:
        snap = self.node_snapshot(node)
        return facts_from_snapshot(snap) if isinstance(snap, dict) else None

    def node_snapshot(self, node: str) -> dict | None:
        """What stune recorded of a node (read once): its capture from --facts, else its hardware-less tree
        and GPU snapshot read now, the drift section included; None when there is neither."""
        if node not in self.snapshots:
            self.snapshots[node] = self._read_snapshot(node)
        return self.snapshots[node]

    def _read_snapshot(self, node: str) -> dict | None:
        snap = None
        if self.facts_dir:
            path = os.path.join(self.facts_dir, f"{node}.json")
            try:
                with open(path, encoding="utf-8") as fh:
                    snap = json.load(fh)
            except (OSError, ValueError):
                snap = None
        if snap is None:
            sysfs = self.env.get("STUNE_SYSFS_ROOT", "")
            gpus = self.env.get("STUNE_GPU_SNAPSHOT", "")
            # hardware-less mode: a per-node (%n) sysfs tree and GPU snapshot are this node's hardware, and
            # readable here; a path without %n would be this host's, not the node's: not used
            root = expand(sysfs, node) if uses_node(sysfs) else None
            gpu_file = expand(gpus, node) if uses_node(gpus) else None
            root = root if root and os.path.isdir(root) else None
            gpu_file = gpu_file if gpu_file and os.path.isfile(gpu_file) else None
            if root or gpu_file:
                try:
                    # never this host's NVML for another node
                    if root:  # an AMD/Ascend node's profile: its capture reads that vendor's devices
                        profile = self.node_profiles.get(node)
                        snap = full(
                            root,
                            profile,
                            node,
                            gpu_file,
                            timeout_s=5.0,
                            nvml=False,
                            environ={**os.environ, **self.env},
                        )
                        add_drift(snap, root, None, 5.0, sysctls=self.drift_sysctls)
                    elif gpu_file:
                        snap = {"gpus": replay_gpus(gpu_file)}
                except Exception as exc:  # a capture problem is a missing fact, not a crash
                    self.add(WARNING, f"node {node}", f"cannot read its recorded hardware: {exc}")
                    return None
        return snap if isinstance(snap, dict) else None

    def check_nodes(self, nodes) -> None:
        missing = []
        for node in nodes:
            facts = self.node_facts(node.name)
            if facts is None:
                missing.append(node.name)
                continue
            self.matrix[node.name] = facts
        if missing:
            self.add(
                WARNING,
                "node facts",
                f"nothing recorded for {', '.join(missing)}: versions and homogeneity not checked there",
                "run `stune-health capture -o DIR/<node>.json` on each node "
                "(pdsh/clush), then `stune-admin doctor --facts DIR`",
            )
        partitions: dict[str, list[str]] = {}
        for node in nodes:
            for p in node.partitions:
                if node.name in self.matrix:
                    partitions.setdefault(p, []).append(node.name)
        for part, members in sorted(partitions.items()):
            uniform = True
            for key in HOMOGENEOUS:
                values = Counter(self.matrix[n][key] for n in members if self.matrix[n][key] not in UNKNOWN)
                if len(values) > 1:
                    uniform = False
                    majority = values.most_common(1)[0][0]
                    odd = [
                        f"{n} ({self.matrix[n][key]})"
                        for n in members
                        if self.matrix[n][key] not in (*UNKNOWN, majority)
                    ]
                    self.add(
                        ERROR,
                        f"partition {part}",
                        f"mixed {key.replace('_', ' ')}: majority {majority}, differs on {', '.join(odd)}",
                        "one generation and one version per partition: upgrade or move those nodes",
                    )
            uniform = self.check_vendor_versions(part, members) and uniform
            unknown = sorted(
                {k for n in members for k in HOMOGENEOUS if self.matrix[n][k] == "?"}
                | self.vendor_unknown(members)
            )
            if unknown:
                self.add(
                    WARNING, f"partition {part}", f"not recorded: {', '.join(unknown)} (said, not guessed)"
                )
            if uniform:
                self.add(OK, f"partition {part}", f"homogeneous over {len(members)} node(s) with facts")

    def matrix_table(self) -> str:
        """One row per node: NVIDIA's columns, then each AMD or Ascend vendor's where a node has it."""
        if not self.matrix:
            return ""
        present = {f.get("accelerator") for f in self.matrix.values()}
        extra = [k for vendor, keys in VENDOR_FACTS.items() if vendor in present for k in keys]
        columns = (*FACT_KEYS, *(["accelerator", *extra] if extra else []))
        return table(
            [(n, *tuple(self.matrix[n].get(k, "?") for k in columns)) for n in sorted(self.matrix)],
            ("node", *columns),
        )


def facts_from_snapshot(snap: dict) -> dict[str, str]:
    """The version-matrix row of one capture: '?' where the capture does not say, 'none' where it answered
    that there is none (a TCP-only node has no HCA)."""

    def one(values, answered_empty: bool = False) -> str:
        values = sorted({str(v) for v in values if v})
        return "/".join(values) if values else ("none" if answered_empty else "?")

    def part(mapping: dict, key: str, kind: type):  # a damaged capture's part reads as empty
        value = mapping.get(key)
        return value if isinstance(value, kind) else kind()

    gpus = part(snap, "gpus", dict)
    devices = part(gpus, "devices", list)
    ib = part(snap, "ib", dict)
    hcas = part(ib, "devices", dict)
    kernel = part(snap, "kernel", dict)
    no_hca = ib.get("answered") is True and not hcas
    accel = accel_facts(snap)
    if accel["accelerator"] in VENDOR_FACTS and not nvml_devices(snap):  # NVIDIA's versions do not apply
        model = one(accel_model(snap))
        driver = cuda = NOT_THIS_VENDOR
    else:
        model = one(d.get("name") for d in devices if isinstance(d, dict))
        driver, cuda = one([gpus.get("driver_version")]), one([gpus.get("cuda_driver_version")])
    return {
        "gpu_model": model,
        "driver": driver,
        "cuda": cuda,
        "nccl": one([snap.get("nccl_version")]),
        "hca_model": one((h.get("hca_type") for h in hcas.values() if isinstance(h, dict)), no_hca),
        "hca_fw": one((h.get("fw_ver") for h in hcas.values() if isinstance(h, dict)), no_hca),
        "kernel": one([kernel.get("release"), snap.get("kernel_release")]),
        **{k: accel[k] for k in ACCEL_FACT_KEYS},
    }
