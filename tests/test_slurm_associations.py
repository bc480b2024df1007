"""The one reader of `sacctmgr show assoc` (slurm_tune/slurm/associations.py), from both of its callers: the
live adapter (Slurm.associations) and an admin's export (`stune-fairshare --assoc-file`, load_tree_file).

One rule for a Share that is neither a number nor `parent`: an error naming the command (live) or the file
and line (export), never a made-up share."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.errors import SlurmError
from slurm_tune.fairshare.accountant import AccountantError, load_tree_file
from slurm_tune.slurm import Association, Slurm
from slurm_tune.slurm.associations import AssocFormatError, parse_associations, parse_share

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm"


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def live(tmp_path, version: str, rows: str) -> Slurm:
    _fake(tmp_path, "sinfo", f"echo 'slurm {version}'\n")
    _fake(tmp_path, "scontrol", "echo 'ClusterName = stune'\n")
    (tmp_path / "assoc.txt").write_text(rows)
    _fake(tmp_path, "sacctmgr", f"cat '{tmp_path / 'assoc.txt'}'\n")
    return Slurm(bin_dir=str(tmp_path))


@pytest.mark.parametrize("text, shares", [("7", 7), ("parent", None), ("Parent", None), (" 12 ", 12)])
def test_a_share_is_a_whole_number_or_parent(text, shares):
    assert parse_share(text) == shares


@pytest.mark.parametrize("text", ["", "1.5", "-1", "lots", "\u00b2", "1e3"])
def test_any_other_share_is_refused(text):
    with pytest.raises(ValueError, match="is not a number or 'parent'"):
        parse_share(text)


def test_live_rows_are_this_clusters_in_lft_order(tmp_path):
    slurm = live(
        tmp_path,
        "22.05.8",
        "stune|root|||1||1\nother|root|||1||1\nstune|physics|stune-alice||parent||4\n"
        "stune|physics||root|2||3\n\n",
    )
    assert slurm.associations() == [
        Association("root", "", "", 1, "", 1),
        Association("physics", "", "root", 2, "", 3),
        Association("physics", "stune-alice", "", None, "", 4),
    ]
    assert slurm.calls[0][-1] == "format=Cluster,Account,User,ParentName,Share,Partition,LFT"


def test_live_rows_of_23_11_on_are_in_lineage_order(tmp_path):
    slurm = live(tmp_path, "24.11.5", "stune|physics||root|1||/physics/\nstune|root|||1||/\n")
    assert [a.order for a in slurm.associations()] == ["/", "/physics/"]
    assert slurm.calls[0][-1].endswith(",Lineage")


def test_a_live_share_that_is_not_a_number_names_the_command_and_release(tmp_path):
    slurm = live(tmp_path, "22.05.8", "stune|root|||1||1\nstune|physics||root|lots||2\n")
    with pytest.raises(
        SlurmError,
        match=r"^output of `sacctmgr -n -P show assoc format=Cluster,Account,"
        r"User,ParentName,Share,Partition,LFT` from Slurm 22.05.8 .*line 2: Share "
        r"'lots' is not a number",
    ):
        slurm.associations()


def test_a_share_of_another_cluster_is_not_judged(tmp_path):
    slurm = live(tmp_path, "22.05.8", "stune|root|||1||1\nother|root|||lots||1\n")
    assert [a.account for a in slurm.associations()] == ["root"]


def test_the_captured_outputs_of_every_release_read_the_same_tree():
    for capture in sorted(FIXTURES.glob("*/sacctmgr_show_assoc*.txt")):
        if capture.name.endswith("account_user.txt") or ".stderr" in capture.name:
            continue
        text = capture.read_text()
        if not text.startswith("stune|"):
            continue  # a release's error text for a field it lacks
        fields = ["Cluster", "Account", "User", "ParentName", "Share", "Partition"]
        last = text.splitlines()[0].split("|")[-1]
        if len(text.splitlines()[0].split("|")) == 7:
            fields.append("Lineage" if last.startswith("/") else "LFT")
        rows = parse_associations(text, fields, cluster="stune")
        assert {(a.account, a.user, a.parent, a.shares) for a in rows} == {
            ("root", "", "", 1),
            ("root", "root", "", 1),
            ("biology", "", "root", 1),
            ("biology", "stune-bob", "", 1),
            ("physics", "", "root", 1),
            ("physics", "stune-alice", "", 1),
        }, capture
        if len(fields) == 7:  # tree order: root first, each account before its users
            keys = [(a.account, a.user) for a in rows]
            assert keys[0] == ("root", "")
            assert all(keys.index((a.account, "")) < i for i, a in enumerate(rows) if a.user), capture


# ---- an admin's export: `sacctmgr -P show assoc format=...` with its header ------------------------------

EXPORT = """Account|User|Par Name|Share|LFT
root|||1|1
root|root||1|10
physics||root|2|6
physics|stune-alice||1|7
biology||root|1|2
biology|stune-bob||parent|3
"""


def test_an_export_is_read_with_its_header_and_in_tree_order(tmp_path):
    path = tmp_path / "assoc.txt"
    path.write_text(EXPORT)
    tree = load_tree_file(str(path))
    assert [(a.account, a.user) for a in tree.assocs] == [
        ("root", ""),
        ("biology", ""),
        ("biology", "stune-bob"),
        ("physics", ""),
        ("physics", "stune-alice"),
        ("root", "root"),
    ]
    assert tree.assocs[2].shares is None and tree.assocs[3].shares == 2


@pytest.mark.parametrize(
    "text, where, message",
    [
        (
            EXPORT.replace("physics||root|2|6", "physics||root|two|6"),
            4,
            "Share 'two' is not a number or 'parent'",
        ),
        (
            EXPORT.replace("root|root||1|10", "root|root||1.0|10"),
            3,
            "Share '1.0' is not a number or 'parent'",
        ),
        (EXPORT.replace("root|root||1|10", "root|root||1"), 3, "4 fields, expected 5"),
        (EXPORT.replace("root|root||1|10", "root|root||1|x"), 3, "LFT 'x' is not a number"),
        (
            "\n" + EXPORT.replace("biology|stune-bob||parent|3", "biology|stune-bob|||3"),
            8,
            "Share '' is not a number",
        ),
        ("Account|User|Share\nroot||1\n", 1, "no parent column; export with sacctmgr -P show assoc format="),
    ],
)
def test_a_bad_export_names_the_file_and_line(tmp_path, text, where, message):
    path = tmp_path / "assoc.txt"
    path.write_text(text)
    with pytest.raises(AccountantError) as info:
        load_tree_file(str(path))
    assert str(info.value).startswith(f"{path}:{where}: {message}")


def test_export_variants_sacctmgr_writes_are_read(tmp_path):
    # `sacctmgr -p` ends every line with '|'; format names instead of titles; Lineage; no order column
    for text in (
        "Account|User|Par Name|Share|\nroot|||1|\nphysics||root|1|\n",
        "Account|User|ParentName|Fairshare|Lineage\nphysics||root|1|/physics/\nroot|||1|/\n",
        "Account|User|Par Name|Share\nroot|||1\nphysics||root|1\n",
    ):
        path = tmp_path / "assoc.txt"
        path.write_text(text)
        assert [a.account for a in load_tree_file(str(path)).assocs] == ["root", "physics"], text


def test_an_empty_or_missing_export_is_one_line_error(tmp_path):
    path = tmp_path / "assoc.txt"
    path.write_text("\n\n")
    with pytest.raises(AccountantError, match="empty association file"):
        load_tree_file(str(path))
    with pytest.raises(AccountantError, match="cannot read"):
        load_tree_file(str(tmp_path / "nope.txt"))


@settings(max_examples=2000, deadline=None)
@given(
    st.binary(max_size=300)
    | st.lists(st.sampled_from(["root", "", "1", "parent", "x", "|", "/", "\n", "7"]), max_size=40).map(
        lambda ws: ("Account|User|Par Name|Share|LFT\n" + "".join(ws)).encode()
    )
)
def test_fuzz_any_export_is_rows_or_a_format_error(data):
    try:
        rows = parse_associations(data.decode("utf-8", "replace"))
    except AssocFormatError as exc:
        assert exc.line >= 1 and str(exc)
        return
    assert all(isinstance(r, Association) and (r.shares is None or r.shares >= 0) for r in rows)
