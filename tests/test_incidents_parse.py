"""Xid lines as the kernel log really has them (tests/fixtures/xid/, each with its expected parse), as
/dev/kmsg records, and byte-level garbage: a line is an event or nothing, never an exception."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hw.kernellog import parse_line, parse_xid_record, pci_address, read_xid_events

FIX = Path(__file__).parent / "fixtures" / "xid"
EXPECTED = json.loads((FIX / "expected.json").read_text())
LINES = [line for name in sorted(EXPECTED) for line in (FIX / name).read_text().splitlines()]


def as_log(tmp_path: Path, text: str) -> str:
    (tmp_path / "dev").mkdir(parents=True, exist_ok=True)
    (tmp_path / "dev" / "kmsg").write_text(text)
    return str(tmp_path)


def comparable(events: list[dict]) -> list[dict]:
    return [{**{k: v for k, v in e.items() if k != "text"}, "text_begins": e["text"][:36]} for e in events]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_file_gives_its_written_down_events(tmp_path, name):
    events = read_xid_events(as_log(tmp_path, (FIX / name).read_text()))
    assert comparable(events) == EXPECTED[name]
    for event in events:  # the text is the message from NVRM:, as the driver wrote it
        assert event["text"].startswith("NVRM: ") and event["text"] in (FIX / name).read_text()


def test_every_fixture_is_covered_and_the_forms_are_all_there():
    assert sorted(EXPECTED) == sorted(p.name for p in FIX.glob("xid-*.txt"))
    firsts = [(FIX / n).read_text().lstrip()[:12] for n in EXPECTED]
    assert any(f.startswith("[Fri Aug") for f in firsts)  # dmesg --ctime
    assert any(f.startswith("Nov 29") for f in firsts)  # journalctl -k
    assert any(f.startswith("NVRM: Xid") for f in firsts)  # the bare message
    assert any(f.startswith("[   ") for f in firsts)  # dmesg
    inferred = [e for events in EXPECTED.values() for e in events if e.get("inferred")]
    assert {e["xid"] for e in inferred} == {79}  # the fallen-off-the-bus form with no Xid number


@pytest.mark.parametrize("line", [line for line in LINES if parse_line(line, 1)])
def test_a_real_message_in_a_kmsg_record_parses_the_same_with_the_records_numbers(line):
    message = parse_line(line, 1)["text"]
    event = parse_xid_record(f"4,1288,9912345678,-;{message}")
    assert event is not None and (event["seq"], event["usec"]) == (1288, 9912345678)
    alone = parse_line(line, 1)
    assert (event["xid"], event["pci"], event["text"]) == (alone["xid"], alone["pci"], alone["text"])
    # a live record carries its dictionary lines after a newline: they are not part of the message
    live = parse_line(f"4,7,8,-;{message}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:47:00.0", None)
    assert live is not None and live["text"] == event["text"] and live["seq"] == 7


@pytest.mark.parametrize(
    "line, expected",
    [
        # journalctl (syslog) prefix with the dmesg stamp after it, and the old driver's address without PCI:
        # (pastebin.com/NGng33SB, as found; it is also how /var/log/syslog looks)
        (
            "Nov 22 18:29:55 hostname kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask "
            "00000120, intr 10000000",
            {"seq": 5, "usec": 966503025, "pci": "0000:01:00", "xid": 31},
        ),
        # Xid 154 (forums.developer.nvidia.com, RTX 5080, 595.71.05)
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
            "Required)",
            {"seq": 5, "pci": "0000:01:00", "xid": 154},
        ),
        ("NVRM: GPU at 0000:3b:00.0 has fallen off the bus.", {"seq": 5, "pci": "0000:3b:00", "xid": 79}),
    ],
)
def test_other_real_forms(line, expected):
    event = parse_line(line, 5)
    assert {k: v for k, v in event.items() if k not in ("text", "inferred")} == expected


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:01:00: GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d",  # who the GPU is, not an error
        "NVRM: os_pci_init_handle: invalid context!",
        "NVRM: Xid (PCI:0000:01:00): , Ch 0000005a",  # no code
        "NVRM: Xid (PCI:0000:01:00): 7x9, pid=1",
        "NVRM: Xid (PCI:zz00:01:00): 79, pid=1",  # not an address
        "NVRM: Xid (PCI:0000:01:00.9): 79, pid=1",  # no such PCI function
        "NVRM: Xid (PCI:0000:01:00) 79, pid=1",
        "Xid (PCI:0000:01:00): 79 without the driver's tag",
        "4," + "9" * 5000 + ",1,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1",  # a 5000-digit sequence number
        "4,1,1,-;NVRM: Xid (PCI:0000:07:00): " + "9" * 5000 + ", pid=1",  # a 5000-digit Xid
        "NVRM: GPU at 0000:01:00.0 is fine.",
        "",
    ],
)
def test_lines_that_are_not_xid_events(line):
    assert parse_line(line, 3) is None


def test_without_a_line_number_only_a_kmsg_record_is_an_event():
    assert parse_line("[ 1.5] NVRM: Xid (PCI:0000:01:00): 79, pid=1", None) is None
    assert parse_line("4,10,20,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1", None)["seq"] == 10
    assert parse_line("x,1,1,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1", None) is None  # not a kmsg header
    assert parse_xid_record("x,1,1,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1") is None


def test_a_copy_with_an_unknown_prefix_still_gives_its_events():
    # e.g. pdsh's `n17: ` before each line: the message from NVRM: on is the event, the line number its seq
    event = parse_line("n17: [  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=x", 9)
    assert (event["seq"], event["xid"], event["pci"]) == (9, 31, "0000:01:00")


def test_pci_addresses():
    assert pci_address("PCI:0000:CB:00") == "0000:cb:00"
    assert pci_address("00000000:47:00.0") == "00000000:47:00"
    assert pci_address("0019:01:00") == "0019:01:00"
    for bad in ("0000:47", "0000:47:00:00", "000:47:00", "0000:4g:00", "0000:47:00.", "0000:47:00.8", ""):
        assert pci_address(bad) is None, bad


def _well_formed(event) -> bool:
    return (
        set(event) <= {"seq", "usec", "pci", "xid", "text", "inferred"}
        and type(event["seq"]) is int
        and type(event["xid"]) is int
        and 0 <= event["xid"] < 10**6
        and pci_address(event["pci"]) == event["pci"]
        and event["text"].startswith("NVRM: ")
        and len(event["text"]) <= 400
    )


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_garbage_bytes_are_never_an_exception_and_never_a_malformed_event(data):
    for number in (None, 1):
        event = parse_line(data.decode("utf-8", "replace"), number)
        assert event is None or _well_formed(event)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="NVRM: Xid(PCI0123456789abcdef,.;[]) kernel\n", max_size=120))
def test_near_misses_of_the_grammar_are_never_an_exception(text):
    for number in (None, 2):
        event = parse_line(text, number)
        assert event is None or _well_formed(event)


def test_every_real_line_damaged_at_the_byte_level_parses_or_is_skipped(tmp_path):
    """2000 mutations (flipped, inserted and deleted bytes) of the real lines, read as a log copy: nothing
    raises; a line read is well formed and its Xid is digits that stand in the damaged line."""
    rng = random.Random(25)
    damaged = []
    for _ in range(2000):
        data = bytearray(rng.choice(LINES).encode())
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data) + 1)
            kind = rng.randrange(3)
            if kind == 0 and at < len(data):
                data[at] = rng.randrange(256)
            elif kind == 1:
                data.insert(at, rng.randrange(256))
            elif at < len(data):
                del data[at]
        damaged.append(bytes(data).replace(b"\n", b" "))
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_bytes(b"\n".join(damaged))
    events = read_xid_events(str(tmp_path))
    assert events and all(_well_formed(e) for e in events)
    for event in events:
        line = damaged[event["seq"] - 1].decode("utf-8", "replace")
        assert event["text"] in line
        if not event.get("inferred"):
            assert event["text"].split("):", 1)[1].split(",", 1)[0].strip() == str(event["xid"])
