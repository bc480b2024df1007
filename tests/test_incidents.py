"""The incident engine (health/incidents.py) under the Xid policy (health/xid.py): what a run of Xid events
does to a node, evaluation after evaluation, with the state carried over as the hooks carry it; the policy's
profile overrides; bursts, recurrence after a reset or reboot, holds; the ladder's decisions."""

from __future__ import annotations

import healthkit as kit
import pytest

from slurm_tune.errors import ConfigError
from slurm_tune.health import incidents, judge, result, state, xid
from slurm_tune.health.result import DEGRADED, FAIL, OK

T0 = 1_750_000_000.0
HOUR = 3600.0
GPU2 = "0000:47:00"


class Node:
    """One node's kernel log and state, judged by the xid family as the epilog and the periodic run do."""

    def __init__(self, profile, boot="boot-1"):
        self.profile, self.boot = profile, boot
        self.state = state.empty("n1")
        self.seq = 1200
        self.log: list[dict] = []

    def xids(self, code: int, n: int = 1, pci: str = GPU2, text: str = "") -> None:
        for _ in range(n):
            self.seq += 1
            message = f"NVRM: Xid (PCI:{pci}): {code}, pid=2231, name=python, {text}"
            self.log.append(
                {"seq": self.seq, "usec": self.seq * 1000, "pci": pci, "xid": code, "text": message}
            )

    def reboot(self, boot: str) -> None:
        self.boot, self.log = boot, []

    def judge(self, at: float) -> result.Verdict:
        snap = {
            "format": "stune-snapshot/1",
            "captured_at": at,
            "kernel": {"answered": True, "events": {"xid": list(self.log), "boot_id": self.boot}},
            "gpus": {"answered": True, "devices": [{"index": 2, "pci_bus_id": "00000000:47:00.0"}]},
        }
        results, updates = incidents.check(snap, self.profile, self.state)
        judge.merge_state(self.state, updates, rebaseline=True)
        return result.make_verdict(results)


def profile(tmp_path, yaml: str = ""):
    """The hdr profile with `yaml` added to it (health: / remediation: sections)."""
    edits = {"hdr.yaml": [("placement:\n", yaml + "placement:\n")]} if yaml else None
    directory = kit.profile_dir(tmp_path / "profiles", edits)
    return kit.profile("hdr", directory)


def ladder_on(tmp_path, extra: str = ""):
    return profile(tmp_path, f"remediation:\n  enabled: true\n{extra}")


def codes(tmp_path, rules: str):
    """The hdr profile with `health.xid.codes` set to `rules` (YAML lines at the codes' indent)."""
    edits = {"hdr.yaml": [("health:\n", f"health:\n  xid:\n    codes:\n{rules}")]}
    return kit.profile("hdr", kit.profile_dir(tmp_path / "profiles", edits))


def test_three_xid_79_lines_fail_the_node_once_with_the_code_in_the_reason(tmp_path):
    node = Node(profile(tmp_path))
    node.xids(79, 3)
    v = node.judge(T0)
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 79")
    assert [(i["xid"], i["count"], i["level"]) for i in node.state["incidents"]] == [(79, 3, "drain")]
    assert "x3 since" in v.results[0].message and node.state["incident_counts"] == {"79": 3}
    for at in (T0 + 60, T0 + 120):  # nothing new: held, and the reason Slurm holds stays the same
        assert node.judge(at).reason == "gpu2 Xid 79"
    node.xids(79)
    assert node.judge(T0 + 180).reason == "gpu2 Xid 79"  # one more line: the same drain
    assert node.state["incident_counts"] == {"79": 4} and len(node.state["xid_sticky"]) == 2


def test_an_xid_13_storm_is_counted_and_never_held_against_the_node(tmp_path):
    node = Node(profile(tmp_path))
    node.xids(79, pci="0000:07:00")  # one real fault on another GPU, before the storm
    node.judge(T0)
    node.state["xid_sticky"], node.state["incidents"][0]["released"] = [], None
    incidents.clear(node.state, T0 + 1)
    for run in range(300):  # 300 evaluations, 20 000 events
        node.xids(13, 60 if run % 3 == 0 else 70)
        v = node.judge(T0 + 10 + run * 60)
        assert v.status == OK, v.reason
    assert node.state["incident_counts"]["13"] == 20_000
    assert len(node.state["incidents"]) == incidents.INCIDENTS_KEEP
    message = next(r.message for r in v.results if r.check == "gpu.xid")
    assert "Xid 13 (graphics engine exception" in message and "counted, not held against the node" in message


def test_a_storm_does_not_push_out_a_held_fault(tmp_path):
    node = Node(profile(tmp_path))
    node.xids(48)
    node.judge(T0)
    for run in range(incidents.INCIDENTS_KEEP + 20):
        node.xids(13)
        v = node.judge(T0 + 60 * (run + 1))
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 48")
    assert len(node.state["incidents"]) == incidents.INCIDENTS_KEEP
    assert node.state["incidents"][0]["xid"] == 48


def test_a_burst_of_a_warning_xid_escalates_to_a_drain_within_the_window_only(tmp_path):
    node = Node(profile(tmp_path))  # Xid 92: degrade, burst 3 within health.xid.burst_window (1h)
    node.xids(92)
    assert node.judge(T0).status == DEGRADED
    node.xids(92)
    v = node.judge(T0 + 600)
    assert (v.status, v.reason) == (DEGRADED, "gpu2 Xid 92")
    node.xids(92)
    v = node.judge(T0 + 1200)
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 92")
    assert "3 within 1h: a burst" in v.results[0].message
    slow = Node(profile(tmp_path / "slow"))
    for k in range(3):  # three, but 2 h apart: degraded, never a burst
        slow.xids(92)
        assert slow.judge(T0 + k * 2 * HOUR).status == DEGRADED


def test_a_degrade_level_xid_holds_for_health_xid_hold(tmp_path):
    node = Node(profile(tmp_path))
    node.xids(63)  # a row remap recorded: pending until the GPU is reset
    assert node.judge(T0).status == DEGRADED
    assert node.judge(T0 + 23 * HOUR).status == DEGRADED
    assert node.judge(T0 + 25 * HOUR).status == OK


def test_recurrence_after_a_reset_or_a_reboot_escalates(tmp_path):
    node = Node(profile(tmp_path))
    node.xids(94)  # contained ECC: degrade
    assert node.judge(T0).status == DEGRADED
    incidents.clear(node.state, T0 + 60)  # `stune-health clear --xid` after a GPU reset
    assert node.judge(T0 + 120).status == OK
    node.xids(94)
    v = node.judge(T0 + 180)
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 94") and "again after the `clear --xid`" in v.results[
        0
    ].message
    other = Node(profile(tmp_path / "b"))
    other.xids(63)
    other.judge(T0)
    other.reboot("boot-2")
    assert other.judge(T0 + HOUR).status == OK  # the reboot reset the GPUs: released
    other.xids(63)
    v = other.judge(T0 + 2 * HOUR)
    assert v.status == FAIL and "again after the reboot at" in v.results[0].message
    late = Node(profile(tmp_path / "c"))
    late.xids(63)
    late.judge(T0)
    incidents.clear(late.state, T0 + 60)
    late.xids(63)
    assert late.judge(T0 + 8 * 24 * HOUR).status == DEGRADED  # past health.xid.recur_window (7d)


def test_an_application_xid_never_drains_even_in_a_burst_that_recurs(tmp_path):
    p = codes(tmp_path, '      "31": {burst: 3}\n')
    node = Node(p)
    node.xids(31, 2)
    assert node.judge(T0).status == OK
    node.xids(31)
    v = node.judge(T0 + 60)
    assert v.status == DEGRADED and "a burst" in v.results[0].message
    incidents.clear(node.state, T0 + 120)
    node.xids(31, 5)
    assert node.judge(T0 + 180).status == DEGRADED  # a burst, again after the clear: still not a drain


def test_profile_overrides_change_one_field_of_one_code(tmp_path):
    p = codes(tmp_path, '      "92": {burst: 0}\n      "13": {action: degrade}\n')
    table = xid.policy(p)
    assert (table[92].action, table[92].burst, table[92].remedy, table[92].source) == (
        "degrade",
        0,
        "reset",
        "profile",
    )
    assert table[79].source == "stune" and table[13].action == "degrade" and table[13].app
    node = Node(p)
    node.xids(92, 5)
    assert node.judge(T0).status == DEGRADED  # no burst any more
    node.xids(13)
    assert node.judge(T0 + 60).status == DEGRADED
    new = codes(tmp_path / "new", '      "171": {action: drain, remedy: reboot}\n')
    node = Node(new)
    node.xids(171)
    v = node.judge(T0)
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 171") and "set by the profile" in v.results[0].message


@pytest.mark.parametrize(
    "rules, key, words",
    [
        ('"13": {action: drain}', "health.xid.codes.13.action", "the application's"),
        ('"x9": {action: drain}', "health.xid.codes.x9", "not an Xid code"),
        ('"79": {action: reboot}', "health.xid.codes.79.action", "not one of"),
        ('"79": {burst: -1}', "health.xid.codes.79.burst", "below the minimum"),
    ],
)
def test_bad_overrides_name_file_line_and_key(tmp_path, rules, key, words):
    with pytest.raises(ConfigError) as err:
        codes(tmp_path, f"      {rules}\n")
    assert err.value.key == key and words in str(err.value) and err.value.line


def test_the_driver_line_refines_the_rule(tmp_path):
    node = Node(profile(tmp_path))
    fatal = "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    node.xids(149, text=fatal)  # the real GB200 lines (tests/fixtures/xid)
    assert node.judge(T0).status == FAIL
    other = Node(profile(tmp_path / "b"))
    other.xids(145, text="RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001)")
    assert other.judge(T0).status == DEGRADED
    rule = xid.XIDS[154]
    changed = "GPU recovery action changed from 0x0 (None) to "
    assert xid.refine(154, rule, changed + "0x1 (GPU Reset Required)") == ("drain", "reset")
    assert xid.refine(154, rule, changed + "0x2 (Node Reboot Required)") == ("drain", "reboot")
    assert xid.refine(
        154, rule, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    ) == (
        "count",
        "reset",
    )
    assert xid.refine(154, rule, "garbled to 0xzz") == ("drain", "reset")


def test_a_state_from_before_incidents_keeps_its_held_xids(tmp_path):
    node = Node(profile(tmp_path))
    node.state["xid_sticky"] = [{"seq": 77, "xid": 79, "pci": GPU2, "text": "NVRM: Xid ... 79"}]
    node.state["xid_seq"] = 100
    v = node.judge(T0)
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 79")
    assert node.state["incidents"][0]["level"] == "drain" and node.judge(T0 + 60).status == FAIL


def test_garbage_incidents_are_ignored_and_a_bad_number_starts_the_state_over(tmp_path):
    from slurm_tune import fastjson

    node = Node(profile(tmp_path))
    node.state["incidents"] = [{"at": T0, "xid": "79"}, 5, {"at": T0, "xid": 79, "seq": 1, "count": 1}]
    node.xids(13)
    assert node.judge(T0).status == OK and [i["xid"] for i in node.state["incidents"]] == [13]
    good = dict(node.state)
    for key, value in [("at", float("nan")), ("count", -4), ("seq", 2**70)]:
        bad = dict(good, incidents=[dict(good["incidents"][0], **{key: value})])
        (tmp_path / "state.json").write_text(fastjson.dumps(bad))
        loaded, problem = state.read(str(tmp_path))
        assert problem and f"incidents[0].{key}" in problem and "starting over" in problem
        assert loaded.get("incidents", []) == []
    for extra, key in [
        ({"incident_counts": {"79": 1.5}}, "incident_counts.79"),
        ({"ladder": {"steps": [{"step": "reset", "at": -1}]}}, "ladder.steps[0].at"),
        ({"hangs": {"sysfs-ib": {"runs": 2**40, "since": T0}}}, "hangs.sysfs-ib.runs"),
    ]:
        (tmp_path / "state.json").write_text(fastjson.dumps(dict(good, **extra)))
        assert key in state.read(str(tmp_path))[1]


# ---- the ladder's decisions (health/ladder.py takes the steps) --------------------------------------------


def test_without_the_ladder_a_held_xid_just_stays_held(tmp_path):
    node = Node(profile(tmp_path))
    node.xids(48)
    v = node.judge(T0)
    assert v.status == FAIL and "remediation" not in v.results[0].message
    assert incidents.next_step({}, node.state["xid_sticky"], node.profile, "boot-1", T0) is None


def test_the_ladder_resets_then_reboots_then_drains_for_repair(tmp_path):
    node = Node(ladder_on(tmp_path))
    node.xids(48)
    v = node.judge(T0)
    assert (
        v.reason == "gpu2 Xid 48" and "remediation: a GPU reset when the node is idle" in v.results[0].message
    )
    # the ladder reset the GPU (what ladder.py records), which released the held incident
    node.state["ladder"] = {"steps": [{"step": "reset", "at": T0 + 60, "ok": True, "detail": ""}]}
    incidents.release(node.state["incidents"], T0 + 60, "reset", {GPU2})
    node.state["xid_sticky"] = []
    assert node.judge(T0 + 120).status == OK
    node.xids(48)  # it did not clear the fault
    v = node.judge(T0 + HOUR)
    assert v.reason == "gpu2 Xid 48" and "again after the GPU reset" in v.results[0].message
    assert "remediation: a reboot" in v.results[0].message
    node.state["ladder"]["steps"].append(
        {"step": "reboot", "at": T0 + HOUR + 60, "ok": True, "boot_id": "boot-1"}
    )
    v = node.judge(T0 + HOUR + 120)
    assert v.status == FAIL and "waiting for the reboot" in v.results[0].message  # not rebooted yet
    node.reboot("boot-2")
    assert node.judge(T0 + 2 * HOUR).status == OK
    node.xids(48)
    v = node.judge(T0 + 3 * HOUR)
    assert v.status == FAIL and v.reason.startswith("repair: gpu2 Xid 48 x3 after reset ")
    assert (
        ", reboot " in v.reason
        and "drained for repair, held until `stune-health clear --xid`" in v.results[0].message
    )
    node.reboot("boot-3")
    assert node.judge(T0 + 4 * HOUR).reason == v.reason  # a repair is held through reboots
    incidents.clear(node.state, T0 + 5 * HOUR)
    assert node.judge(T0 + 5 * HOUR + 60).status == OK and node.state["ladder"] == {}


def test_a_reboot_that_never_happens_is_given_up_on(tmp_path):
    node = Node(ladder_on(tmp_path))
    node.xids(79)  # remedy reboot: a GPU off the bus cannot be reset
    v = node.judge(T0)
    assert "remediation: a reboot" in v.results[0].message
    node.state["ladder"] = {"steps": [{"step": "reboot", "at": T0 + 60, "ok": True, "boot_id": "boot-1"}]}
    assert "waiting for the reboot" in node.judge(T0 + 600).results[0].message
    v = node.judge(T0 + 60 + 1801)  # remediation.reboot_timeout: 30m
    assert v.reason.startswith("repair: gpu2 Xid 79 x1 after reboot ")


def test_steps_the_partition_turns_off_are_skipped(tmp_path):
    node = Node(ladder_on(tmp_path, "  reset: false\n"))
    node.xids(48)
    assert "remediation: a reboot" in node.judge(T0).results[0].message
    node = Node(ladder_on(tmp_path / "b", "  reset: false\n  reboot: false\n"))
    node.xids(48)
    v = node.judge(T0)
    assert v.reason == "repair: gpu2 Xid 48 x1" and "no automatic fix" in v.results[0].message
    node = Node(ladder_on(tmp_path / "c"))
    node.xids(143)  # GPU initialization failure: nothing to try
    assert node.judge(T0).reason == "repair: gpu2 Xid 143 x1"


def test_a_quiet_ladder_is_forgotten(tmp_path):
    node = Node(ladder_on(tmp_path))
    node.state["ladder"] = {"steps": [{"step": "reset", "at": T0, "ok": True}]}
    node.judge(T0 + 6 * 24 * HOUR)
    assert node.state["ladder"]["steps"]
    node.judge(T0 + 8 * 24 * HOUR)  # remediation.forget_after: 7d with nothing held
    assert node.state["ladder"] == {}
