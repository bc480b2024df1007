"""Proof of the transport NCCL really used (issue 24, §2): a pure parser of NCCL / RCCL / HCCL logs and the
verdict on them. docs/comm.md describes what is read, the statuses and their messages.

    log = parse(data)                       # bytes as the epilog read them -> CommLog; never raises
    verdict = judge([log, ...], Expectation.from_profile(profile))   # a node's logs -> NodeVerdict
    token = verdict.encode()                # for the AdminComment line; decode(token) -> NodeVerdict
    job = merge({"n1": verdict, ...})       # -> JobVerdict, with the job-level messages
    messages(verdict, node="n1")            # a node's verdict in plain words

Modules: cap (the size cap, lines, head + tail), prefix (line prefixes), channels (channel lines), netinfo
(NIC, network, plugin, version and environment lines), problems (warnings and errors), tables (benchmark
tables), state (the parser's tally), parser (parse), model (CommLog), combine (several logs as one), expect
(Expectation), judge (the rules), verdict (NodeVerdict and its fields on the wire), encoding (the wire
format), words (the messages), job (merge).
"""

from .cap import NODE_CAP, join_head_tail
from .combine import combine
from .expect import Expectation
from .job import JobVerdict, merge
from .judge import judge
from .model import CommLog
from .parser import parse
from .verdict import STATUSES, NodeVerdict, decode
from .words import messages

__all__ = [
    "NODE_CAP",
    "STATUSES",
    "CommLog",
    "Expectation",
    "JobVerdict",
    "NodeVerdict",
    "combine",
    "decode",
    "join_head_tail",
    "judge",
    "merge",
    "messages",
    "parse",
]
