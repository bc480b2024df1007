"""What the partition's profile makes a job expect of NCCL: the fabric, GPUDirect RDMA, the socket interface."""

from __future__ import annotations

from dataclasses import dataclass

from ..gdr import RDMA, gdr_expected  # the one GPUDirect RDMA rule
from ..nodeenv import detect

IB, ROCE, TCP = "ib", "roce", "tcp"
FABRICS = (IB, ROCE, TCP)
FABRIC_WORDS = {IB: "IB", ROCE: "RoCE", TCP: "TCP"}


@dataclass(frozen=True)
class Expectation:
    """fabric: the profile's fabric.type (ib, roce, tcp; anything else judges no transport).
    gdr: GPUDirect RDMA expected: an RDMA fabric whose profile sets nccl.net_gdr_level to a level other than
    LOC (empty lets NCCL decide: then GDR is not expected, its absence no finding). gdr_level: that level, for
    the words. socket_ifname: fabric.socket_ifname, in NCCL_SOCKET_IFNAME's syntax (`eth`, `=eth0`,
    `^docker,lo`); on a tcp fabric NCCL's sockets are expected on it."""

    fabric: str
    gdr: bool = False
    gdr_level: str = ""
    socket_ifname: str = ""

    @classmethod
    def from_profile(cls, profile) -> Expectation:
        """From a partition profile (profilestore.Profile: `.fabric.type`, `.fabric.socket_ifname`,
        `.nccl.net_gdr_level`)."""
        fabric = str(profile.fabric.type or "")
        level = str(profile.nccl.net_gdr_level or "")
        return cls(
            fabric=fabric,
            gdr=gdr_expected(fabric, level),
            gdr_level=level,
            socket_ifname=str(profile.fabric.socket_ifname or ""),
        )

    @property
    def rdma(self) -> bool:
        return self.fabric in RDMA

    @property
    def words(self) -> str:
        """`IB partition`, `RoCE partition`, `TCP partition`."""
        return f"{FABRIC_WORDS.get(self.fabric, self.fabric or 'unknown fabric')} partition"


def ifname_matches(spec: str, name: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME `spec` admits interface `name` (NCCL's rule, nodeenv/detect.py's one home:
    a comma list of prefixes, `=` for exact names, `^` to exclude); an empty spec admits any."""
    return not spec.strip() or detect.ifname_matches(spec, name)
