"""Slurm's fair-share formulas as stune computes them (Fair Tree and classic), against hand-worked cases,
independent reference implementations (hypothesis), and the tie rules of fair_tree.c."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slurm_tune.fairshare.tree import (
    Assoc,
    AssocTree,
    TreeError,
    algorithm_from_flags,
    classic_factor,
    compute,
)

DEVCLUSTER = [
    Assoc("root"),
    Assoc("biology", parent="root"),
    Assoc("biology", "stune-bob"),
    Assoc("physics", parent="root"),
    Assoc("physics", "stune-alice"),
    Assoc("root", "root"),
]


def test_no_usage_ranks_everyone_first_as_sshare_shows():
    shares = compute(AssocTree(DEVCLUSTER), {})
    assert shares.factors == {
        ("root", "root"): 1.0,
        ("biology", "stune-bob"): 1.0,
        ("physics", "stune-alice"): 1.0,
    }


def test_fair_tree_ranks_by_level_fs_down_the_tree():
    usage = {("physics", "stune-alice"): 200.0, ("biology", "stune-bob"): 100.0}
    shares = compute(AssocTree(DEVCLUSTER), usage)
    # root user (no usage, LevelFS inf) first, then biology (less used), then physics.
    assert shares.factor("root", "root") == 1.0
    assert shares.factor("biology", "stune-bob") == pytest.approx(2 / 3)
    assert shares.factor("physics", "stune-alice") == pytest.approx(1 / 3)
    rows = {(r.account, r.user): r for r in shares.rows}
    assert rows[("physics", "")].effective_usage == pytest.approx(2 / 3)
    assert rows[("physics", "")].level_fs == pytest.approx((1 / 3) / (2 / 3))
    assert rows[("root", "")].raw_usage == 300.0


def test_tied_users_share_a_rank_and_the_next_user_skips_it():
    tree = AssocTree(
        [Assoc("root"), Assoc("a", parent="root"), Assoc("a", "u1"), Assoc("a", "u2"), Assoc("a", "u3")]
    )
    shares = compute(tree, {("a", "u1"): 5.0, ("a", "u2"): 5.0, ("a", "u3"): 9.0})
    assert shares.factor("a", "u1") == shares.factor("a", "u2") == 1.0
    assert shares.factor("a", "u3") == pytest.approx(1 / 3)  # rank 1 of 3: two users ranked above it


def test_an_account_tied_with_the_previous_sibling_starts_its_children_tied():
    # root user and both accounts have no usage: all LevelFS inf. fair_tree.c walks the root user first
    # (users before accounts), then each account starting "tied", so every user keeps rank 3 of 3.
    tree = AssocTree(DEVCLUSTER)
    shares = compute(tree, {("physics", "stune-alice"): 0.0})
    assert set(shares.factors.values()) == {1.0}


def test_fairshare_parent_user_ranks_first_in_its_account():
    tree = AssocTree(
        [
            Assoc("root"),
            Assoc("a", parent="root"),
            Assoc("a", "lead", shares=None),
            Assoc("a", "u1"),
            Assoc("b", parent="root"),
            Assoc("b", "u2"),
        ]
    )
    shares = compute(tree, {("a", "lead"): 1000.0, ("a", "u1"): 1.0, ("b", "u2"): 1.0})
    assert shares.factor("a", "lead") > shares.factor("a", "u1")
    assert tree.level_shares[tree.index[("a", "u1")]] == 1  # a Fairshare=parent user adds no shares


def test_unknown_parent_and_missing_root_are_clear_errors():
    with pytest.raises(TreeError, match="parent account 'nope'"):
        AssocTree([Assoc("root"), Assoc("a", parent="nope")])
    with pytest.raises(TreeError, match="exactly one 'root'"):
        AssocTree([Assoc("a", parent="root")])


def test_algorithm_follows_priority_flags():
    assert algorithm_from_flags("") == "fair_tree"
    assert algorithm_from_flags("(null)") == "fair_tree"
    assert algorithm_from_flags("ACCRUE_ALWAYS,NO_FAIR_TREE") == "classic"
    with pytest.raises(TreeError, match="DEPTH_OBLIVIOUS"):
        algorithm_from_flags("DEPTH_OBLIVIOUS")


def test_classic_hand_worked():
    # two accounts of equal shares, one user each; a used 3/4 of everything.
    tree = AssocTree(
        [
            Assoc("root"),
            Assoc("a", parent="root"),
            Assoc("a", "x"),
            Assoc("b", parent="root"),
            Assoc("b", "y"),
        ]
    )
    shares = compute(tree, {("a", "x"): 300.0, ("b", "y"): 100.0}, "classic")
    # account a: UE = 0.75 (child of root); user x: UE = 0.75 + (0.75 - 0.75) * 1/1 = 0.75; S = 0.5 * 1
    assert shares.factor("a", "x") == pytest.approx(2 ** (-0.75 / 0.5))
    assert shares.factor("b", "y") == pytest.approx(2 ** (-0.25 / 0.5))
    assert classic_factor(0.3, 0.0) == 0.0
    assert classic_factor(0.5, 0.5, damping=2) == pytest.approx(2**-0.5)


# ---- independent references ----------------------------------------------------------------------------
@st.composite
def trees(draw):
    """Random account trees (depth <= 3) with users, shares 1..5 and strictly positive usage."""
    assocs = [Assoc("root")]
    usage = {}
    accounts = ["root"]
    for i in range(draw(st.integers(1, 5))):
        parent = draw(st.sampled_from(accounts))
        name = f"acct{i}"
        assocs.append(Assoc(name, parent=parent, shares=draw(st.integers(1, 5))))
        accounts.append(name)
    for account in accounts[1:]:
        for j in range(draw(st.integers(1, 3))):
            user = f"{account}-u{j}"
            assocs.append(Assoc(account, user, shares=draw(st.integers(1, 5))))
            usage[(account, user)] = draw(st.floats(1.0, 1e6, allow_nan=False))
    # lft order: an account's associations before its sub-accounts' (sacctmgr lists the tree depth-first)
    ordered = [assocs[0]]

    def add(account):
        ordered.extend(a for a in assocs[1:] if a.user and a.account == account)
        for a in assocs[1:]:
            if not a.user and a.parent == account:
                ordered.append(a)
                add(a.account)

    add("root")
    return ordered, usage


def reference_fair_tree(assocs, usage):
    """Fair Tree written from its documentation: users ordered lexicographically by the LevelFS of each
    ancestor along their path (highest first); FairShare = (N - position) / N. None when siblings tie (the
    tie rules are tested by hand above)."""
    children = {}
    for a in assocs[1:]:
        parent = a.account if a.user else a.parent
        children.setdefault(parent, []).append(a)

    def subtree_usage(a):
        if a.user:
            return usage.get((a.account, a.user), 0.0)
        return sum(subtree_usage(c) for c in children.get(a.account, []))

    paths = {}
    tied = []

    def walk(account, prefix):
        kids = children.get(account, [])
        total_shares = sum(k.shares for k in kids)
        total_usage = sum(subtree_usage(k) for k in kids)
        seen = set()
        for k in kids:
            u = subtree_usage(k) / total_usage if total_usage else 0.0
            lfs = (k.shares / total_shares) / u if u else math.inf
            if lfs in seen:
                tied.append(k)
            seen.add(lfs)
            key = (*prefix, (-lfs, 0 if k.user else 1))
            if k.user:
                paths[(k.account, k.user)] = key
            else:
                walk(k.account, key)

    walk("root", ())
    if tied:
        return None
    order = sorted(paths, key=lambda user: paths[user])
    n = len(order)
    return {user: (n - pos) / n for pos, user in enumerate(order)}


@settings(max_examples=200, deadline=None)
@given(trees())
def test_fair_tree_matches_the_documented_ranking(case):
    assocs, usage = case
    expected = reference_fair_tree(assocs, usage)
    assume(expected is not None)
    assert compute(AssocTree(assocs), usage).factors == pytest.approx(expected)


def reference_classic(assocs, usage):
    children = {}
    for a in assocs[1:]:
        children.setdefault(a.account if a.user else a.parent, []).append(a)

    def subtree(a):
        return (
            usage.get((a.account, a.user), 0.0)
            if a.user
            else sum(subtree(c) for c in children.get(a.account, []))
        )

    total = sum(usage.values())
    out = {}

    def walk(account, ue_parent, s_parent, depth):
        kids = children.get(account, [])
        level = sum(k.shares for k in kids)
        for k in kids:
            un = subtree(k) / total
            ue = un if depth == 0 else un + (ue_parent - un) * k.shares / level
            s = s_parent * k.shares / level
            if k.user:
                out[(k.account, k.user)] = 2 ** (-ue / s)
            else:
                walk(k.account, ue, s, depth + 1)

    walk("root", 0.0, 1.0, 0)
    return out


@settings(max_examples=200, deadline=None)
@given(trees())
def test_classic_matches_the_documented_formula(case):
    assocs, usage = case
    assert compute(AssocTree(assocs), usage, "classic").factors == pytest.approx(
        reference_classic(assocs, usage)
    )


@settings(max_examples=150, deadline=None)
@given(trees(), st.data(), st.sampled_from(["fair_tree", "classic"]))
def test_charging_a_user_more_never_raises_their_factor(case, data, algorithm):
    assocs, usage = case
    user = data.draw(st.sampled_from(sorted(usage)))
    extra = data.draw(st.floats(0.0, 10.0))
    tree = AssocTree(assocs)
    before = compute(tree, usage, algorithm).factor(*user)
    more = dict(usage)
    more[user] *= 1.0 + extra
    after = compute(tree, more, algorithm).factor(*user)
    assert after <= before + 1e-12
