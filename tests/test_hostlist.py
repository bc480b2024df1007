"""Slurm host lists (slurm_tune/hostlist.py): expansion, compression, and the round trip between them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hostlist import MAX_RANGE, compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    "expr, names",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1-2,5],gpu[08-10]", ["n1", "n2", "n5", "gpu08", "gpu09", "gpu10"]),
        ("n[1-3,5],gpu07,a[08-10]", ["n1", "n2", "n3", "n5", "gpu07", "a08", "a09", "a10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("", []),
        ("n[a,2]", ["na", "n2"]),
        ("n[1-2", ["n[1-2"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        (" n[1-2] ", ["n1", "n2"]),
    ],
)
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


def test_a_forged_huge_range_is_taken_literally_not_expanded():
    assert expand_hostlist("n[0-999999999999]") == ["n0-999999999999"]
    assert len(expand_hostlist(f"n[1-{MAX_RANGE}]")) == MAX_RANGE


@pytest.mark.parametrize(
    "names, expr",
    [
        (["node01", "node02", "node03", "node07"], "node[01-03,07]"),
        (["cn1", "cn2", "cn10", "gpu9"], "cn[1-2,10],gpu9"),
        (["login"], "login"),
        (["node01", "node09", "node10", "node11"], "node[01,09-11]"),
        (["a1", "a01"], "a1,a01"),  # a1 is not a01: different names
        (["sw-a", "cn3"], "cn3,sw-a"),
        (["n2", "n1", "n2"], "n[1-2]"),  # order and duplicates do not matter
        (["n09", "n10"], "n[09-10]"),  # n10 fits the padded width of n09
        (["n010", "n10"], "n10,n010"),  # but not a wider one
        (["n\u0663"], "n\u0663"),  # a non-ASCII digit is no number: the name stays as it is
        ([], ""),
    ],
)
def test_compress_hostlist(names, expr):
    assert compress_hostlist(names) == expr


# Host names as Slurm and DNS allow them: letters, digits, '-', '.', '_' (no ',' or brackets, which are the
# list's own syntax), often ending in a number with or without zero padding.
NAME_CHARS = "abcxyz-._0123456789"
names = st.one_of(
    st.text(NAME_CHARS, min_size=1, max_size=12),
    st.builds(
        lambda prefix, number, width: f"{prefix}{number:0{width}d}",
        st.sampled_from(["n", "gpu", "node", "rack1-n", "a.b", ""]),
        st.integers(0, 5000),
        st.integers(1, 6),
    ),
)


@settings(max_examples=3000, deadline=None)
@given(st.lists(names, max_size=40))
def test_compress_then_expand_gives_back_the_same_names(hosts):
    expr = compress_hostlist(hosts)
    expanded = expand_hostlist(expr)
    assert sorted(expanded) == sorted(set(hosts))
    assert len(expanded) == len(set(hosts))  # every name once
    assert compress_hostlist(expanded) == expr  # and compressing again changes nothing


@settings(max_examples=2000, deadline=None)
@given(st.text(NAME_CHARS + "[],", max_size=40))
def test_expand_takes_any_text_without_raising(text):
    names = expand_hostlist(text)
    assert all(isinstance(n, str) and n for n in names)
