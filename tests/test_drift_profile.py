"""The profile's drift section: defaults per fabric, what the profile and site.yaml set winning over them, `~`
switching a check off, and one-line errors for bad sysctl names and values; docs/health.md's table is
FABRIC_DEFAULTS."""

from __future__ import annotations

from pathlib import Path

import healthkit as kit
import pytest

from slurm_tune.driftspec import FABRIC_DEFAULTS
from slurm_tune.errors import ConfigError
from slurm_tune.profiles import validate_directory

REPO = Path(__file__).resolve().parent.parent


def test_each_fabric_gets_its_defaults():
    for partition in ("hdr", "roce", "vpc"):
        profile = kit.profile(partition)
        wanted = FABRIC_DEFAULTS[profile.fabric.type]
        drift = profile.drift.to_dict()
        assert {k: drift[k] for k in wanted} == wanted
        assert drift["thp"] == ["always", "madvise"] and drift["sysctls"] == {}
    assert kit.profile("roce").drift.roce_mtu_min == 4200 and kit.profile("hdr").drift.roce_mtu_min is None
    assert (
        kit.profile("vpc").drift.cpu_governor is None
        and kit.profile("hdr").drift.cpu_governor == "performance"
    )


def test_the_profile_and_site_yaml_win_and_null_switches_a_check_off(tmp_path):
    site = (
        REPO / "partitions/site.yaml"
    ).read_text() + "  drift:\n    cpu_governor: schedutil\n    iommu: [translated]\n"
    directory = kit.profile_dir(
        tmp_path / "p",
        {
            "site.yaml": site,
            "hdr.yaml": [("cache:\n", "drift:\n  iommu: ~\n  numa_balancing: true\ncache:\n")],
        },
    )
    hdr, vpc = kit.profile("hdr", directory).drift, kit.profile("vpc", directory).drift
    assert (hdr.cpu_governor, hdr.iommu, hdr.numa_balancing) == ("schedutil", None, True)
    assert (vpc.cpu_governor, vpc.iommu, vpc.numa_balancing) == ("schedutil", ("translated",), None)


@pytest.mark.parametrize(
    "body, problem",
    [
        ("sysctls: {../../etc/shadow: 1}", "is not a sysctl name"),
        ("sysctls: {net..core: 1}", "is not a sysctl name"),
        ("sysctls: {rmem_max: 1}", "is not a sysctl name"),
        ("sysctls: {net.core.rmem_max: '>=lots'}", "`>=` needs a whole number"),
        ("iommu: [passthrough, bypass]", "'bypass' is not one of: off, passthrough, translated"),
        ("thp: []", "needs at least 1 item"),
        ("cpu_governer: performance", "unknown key (did you mean 'cpu_governor'?)"),
        ("roce_mtu_min: 100", "below the minimum 576"),
    ],
)
def test_a_bad_drift_setting_is_one_line_naming_the_file_and_key(tmp_path, body, problem):
    directory = kit.profile_dir(tmp_path / "p", {"hdr.yaml": [("cache:\n", f"drift:\n  {body}\ncache:\n")]})
    with pytest.raises(ConfigError) as err:
        validate_directory(str(directory))
    text = str(err.value)
    assert "hdr.yaml:" in text and problem in text and "drift." in text, text
    assert "\n" not in text


def test_the_docs_table_of_defaults_is_fabric_defaults():
    doc = (REPO / "docs/health.md").read_text()
    table = doc[doc.index("| key | ib | roce | tcp |") :].split("\n\n")[0].splitlines()[2:]
    rows = {line.split("|")[1].strip().split(" ")[0].strip("`,"): line for line in table}

    def shown(value) -> str:
        if value is None:
            return "not checked"
        if isinstance(value, list):
            return "`[" + ", ".join(value) + "]`"
        if isinstance(value, bool):
            return str(value).lower()
        return f"`{value}`" if isinstance(value, str) else str(value)

    for key in ("iommu", "cpu_governor", "numa_balancing", "slurmd_memlock", "roce_mtu_min"):
        cells = [c.strip() for c in rows[key].split("|")[2:5]]
        for cell, fabric in zip(cells, ("ib", "roce", "tcp")):
            assert cell.startswith(shown(FABRIC_DEFAULTS[fabric][key])), (key, fabric, cell)
