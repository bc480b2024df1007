"""Warnings and errors: NCCL WARN lines by kind, PyTorch's watchdog timeouts, HCCL's error and return codes,
nccl-tests' failure lines.

The forms (the capture that shows each):
- completion errors, old and new: `NET/IB : Got completion with error 4, opcode 1, len 0, vendor err 81`
  (NCCL 2.4, ncclTests24), `NET/IB : Got completion from peer 10.1.32.3<42519> with error 5, opcode 0, len 0,
  vendor err 249` (nccl1737), and since 2.19 `... with status=12 opcode=0 len=0 vendor err 129 (Send)` or
  `NET/IB: ... with status=IBV_WC_RETRY_EXC_ERR(12) opcode=... vendor_err=129 ...`;
- `ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed` (nccl562); other verbs calls; `NET/OFI Couldn't open
  AV` (awsofi24); RCCL's harmless `MSCCL++: Cannot enable MSCCL++; environment is not MSCCL compatible`
  (rcclTests163: counted, no error);
- PyTorch: `[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=216, OpType=ALLTOALL_BASE,
  ..., Timeout(ms)=600000) ran for 600045 milliseconds` (nccl1610; the older form has no SeqNum);
- HCCL: `EI0006: ... Getting socket times out` (vllmascend486), `EI9999: ... hccl fftsplus task timeout`
  (ascendpytorch54), `HcclAllreduce, error code is 6`, plog lines `[ERROR] HCCL(106335,):... hcclRet -> 9`
  and the LINK_ERROR_INFO rows with status `time out` (vllmascend9447);
- nccl-tests: `HCA-14: Test NCCL failure common.cu:1204 'unhandled cuda error ...'` (ncclTests322),
  `NCCL failure all_reduce.cu:95 'unhandled cuda error'` (ncclTests5).
"""

from __future__ import annotations

import re

from .model import EXAMPLE_MAX, FMT_HCCL, FMT_MPI, FMT_TORCH, FMT_TRACEBACK
from .state import State, bump, note

_WC = re.compile(
    r"Got completion(?: from peer (\S{1,80}))? with (?:error ([0-9]{1,4})|status=(?:[A-Z_]{1,40}\()?([0-9]{1,4}))(?![0-9])"
)
_VENDOR = re.compile(r"vendor[ _]err[ =]?([0-9]{1,10})(?![0-9])")
_OP = re.compile(r"OpType=([A-Za-z_]{1,40})")
_TIMEOUT = re.compile(r"Timeout\(ms\)=([0-9]{1,12})(?![0-9])")
_EI = re.compile(r"(?<![A-Za-z0-9])(EI[0-9]{4}):")
_HCCL_RET = re.compile(r"(?:error code is|hcclRet ->|ret\[) ?([0-9]{1,6})(?![0-9])")
_TEST_FAILURE = re.compile(r"(?:Test )?(NCCL|CUDA) failure \S{1,128}:[0-9]{1,6} '(.{0,200})")
_TRACEBACK = ("Traceback (most recent call last)", 'File "', "TraceBack (most recent call last)")
_MPI = ("mpirun ", "Process name:", "Exit code:", "the job to be terminated", "---------")


def warn_kind(msg: str) -> str:
    if "Got completion" in msg:
        return "completion"
    if "ibv_create_qp" in msg:
        return "create_qp"
    if "ibv_" in msg or msg.startswith(("NET/IB", "NET/IBext")):
        return "ibverbs"
    if "NET/OFI" in msg:
        return "ofi"
    if "MSCCL" in msg:
        return "msccl"
    if "onnection" in msg or "socket" in msg or "NET/Socket" in msg or "remote peer" in msg:
        return "connection"
    if "Cuda" in msg or "CUDA" in msg or "cuda" in msg:
        return "cuda"
    if msg.startswith("Call to "):
        return "system"
    return "other"


def read_warn(st: State, prefix: str, msg: str) -> bool:
    kind = warn_kind(msg)
    st.warn(kind, msg)
    if kind == "completion" and (m := _WC.search(msg)) is not None:
        bump(st.completions, int(m.group(2) or m.group(3)))
        if m.group(1):
            note(st.peers, m.group(1).split("<", 1)[0][:64])
        if (v := _VENDOR.search(msg)) is not None:
            note(st.vendor_errors, int(v.group(1)))
    if "rccl" in prefix or "hipify" in prefix or kind == "msccl":
        st.rccl = True
    return True


def read_other(st: State, line: str) -> bool:
    """A line that is not NCCL's own: PyTorch, HCCL, nccl-tests failures, tracebacks, mpirun's footer."""
    if "Watchdog caught collective operation timeout" in line:
        st.watchdog_timeouts += 1
        st.torch = True
        if (m := _OP.search(line)) is not None:
            note(st.watchdog_ops, m.group(1))
        if (m := _TIMEOUT.search(line)) is not None:
            st.watchdog_timeout_ms = max(st.watchdog_timeout_ms, int(m.group(1)))
        note(st.formats, FMT_TORCH)
        return True
    if "ProcessGroupNCCL" in line or "WorkNCCL" in line:
        st.torch = True
        note(st.formats, FMT_TORCH)
        return True
    if ("HCCL" in line or "Hccl" in line or "hccl" in line or "EI" in line) and _read_hccl(st, line):
        return True
    if "failure" in line and (m := _TEST_FAILURE.search(line)) is not None:
        st.test_failures += 1
        st.test_failure = (
            st.test_failure or f"{m.group(1)} failure '{m.group(2).rstrip(chr(39))}'"[:EXAMPLE_MAX]
        )
        return True
    if line.startswith(_TRACEBACK) or (line[:1].isalpha() and "Error: " in line[:60]):
        note(st.formats, FMT_TRACEBACK)
        return True
    if line.startswith(_MPI) or " .. " in line[:6]:
        note(st.formats, FMT_MPI)
        return True
    return False


def _read_hccl(st: State, line: str) -> bool:
    seen = False
    for m in _EI.finditer(line):
        bump(st.hccl_codes, m.group(1))
        seen = True
    if "[ERROR] HCCL(" in line:
        st.hccl_errors += 1
        seen = True
        if "| time out |" in line:
            st.hccl_link_timeouts += 1
    if ("Hccl" in line or "HCCL(" in line) and (ret := _HCCL_RET.search(line)) is not None:
        bump(st.hccl_returns, int(ret.group(1)))
        seen = True
    if seen or "hccl" in line or "HCCL" in line:
        st.hccl = True
        note(st.formats, FMT_HCCL)
        return True
    return False
