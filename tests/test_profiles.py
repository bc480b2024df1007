"""Partition profiles: the shipped examples load, and every kind of mistake is one line with file:line:key."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_tune.errors import ConfigError
from slurm_tune.profiles import load_profile, load_profiles, validate_directory, version_key

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "partitions"


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """A writable copy of the shipped profiles, with its own cache directory."""
    monkeypatch.setenv("STUNE_CACHE_DIR", str(tmp_path / "cache"))
    directory = tmp_path / "partitions"
    shutil.copytree(SHIPPED, directory)
    return directory


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_shipped_profiles_cover_the_three_fabrics(profiles):
    loaded = load_profiles(profiles)
    assert {p.fabric.type for p in loaded.values()} == {"ib", "roce", "tcp"}
    hdr = loaded["hdr"]
    assert [h.device for h in hdr.fabric.hcas] == [f"mlx5_{i}" for i in range(8)]
    assert hdr.fabric.rate_gbps == 200
    assert hdr.versions.hca_firmware["MT_0000000223"].min == "20.31.1014"
    assert hdr.cache.quota == 3 * 2**40
    assert loaded["roce"].fabric.hcas[0].netdev == "eth1"
    assert loaded["vpc"].fabric.socket_ifname == "ens5"


def test_site_defaults_apply_and_a_partition_overrides_them(profiles):
    write(
        profiles,
        "site.yaml",
        """
        defaults:
          nccl: {ib_timeout: 20, ib_retry_cnt: 5}
          health: {max_gpu_temp_c: 80}
        """,
    )
    text = (profiles / "hdr.yaml").read_text().replace("nccl:\n", "nccl:\n  ib_timeout: 23\n")
    (profiles / "hdr.yaml").write_text(text)
    loaded = load_profiles(profiles)
    assert loaded["hdr"].nccl.ib_timeout == 23  # partition wins
    assert loaded["hdr"].nccl.ib_retry_cnt == 5  # site default, merged key by key
    assert loaded["vpc"].nccl.ib_timeout == 20
    assert loaded["vpc"].health.max_gpu_temp_c == 80
    line = (profiles / "hdr.yaml").read_text().splitlines().index("  ib_timeout: 23") + 1
    assert loaded["hdr"].origin("nccl.ib_timeout") == f"{profiles}/hdr.yaml:{line}"
    assert loaded["vpc"].origin("nccl.ib_retry_cnt").endswith("site.yaml:2")
    assert loaded["vpc"].origin("placement.switches") == "built-in default"


@pytest.mark.parametrize(
    "name, text, line, key, words",
    [
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: [{device: mlx5_0}]\n  speed: 200\n",
            5,
            "fabric.speed",
            "unknown key",
        ),
        ("hdr.yaml", "partition: hdr\nfabric:\n  type: infiniband\n", 3, "fabric.type", "not one of"),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: [{device: mlx5_0, port: one}]\n",
            4,
            "fabric.hcas[0].port",
            "expected an integer",
        ),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: [{device: mlx5_0}]\nnccl:\n  ib_timeout: 40\n",
            6,
            "nccl.ib_timeout",
            "above the maximum 31",
        ),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: []\n",
            4,
            "fabric.hcas",
            "at least one HCA",
        ),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: [{device: mlx5_0}]\ncache:\n  quota: lots\n",
            6,
            "cache.quota",
            "not a size",
        ),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: [{device: mlx5_0}]\n"
            "nccl:\n  env: {IB_HCA: mlx5_0}\n",
            6,
            "nccl.env.IB_HCA",
            "must start with 'NCCL_'",
        ),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  hcas: [{device: mlx5_0}]\n"
            "versions:\n  gpu_driver: {min: '535.1', allowed: ['535.2']}\n",
            6,
            "versions.gpu_driver",
            "either `min` or `allowed`",
        ),
        (
            "hdr.yaml",
            "partition: hdr\nfabric:\n  type: ib\n  type: roce\n",
            4,
            "fabric.type",
            "duplicate key",
        ),
        ("hdr.yaml", "partition: hdr\nfabric: {type: ib\n", 3, "", "invalid YAML"),
        ("hdr.yaml", "partition: hdr\n", 1, "fabric.type", "is required"),
        (
            "roce.yaml",
            "partition: roce\nfabric:\n  type: roce\n  hcas:\n    - {device: mlx5_0}\n",
            5,
            "fabric.hcas[0].netdev",
            "netdev",
        ),
        (
            "site.yaml",
            "defaults:\n  nccl:\n    ib_timout: 20\n",
            3,
            "defaults.nccl.ib_timout",
            "did you mean 'ib_timeout'",
        ),
        (
            "vpc.yaml",
            "partition: vpc\nfabric:\n  type: tcp\n  socket_ifname: ens5\ncache:\n"
            "  high_watermark: 0.5\n  low_watermark: 0.6\n",
            7,
            "cache.low_watermark",
            "below high_watermark",
        ),
    ],
)
def test_a_bad_file_names_file_line_and_key(profiles, name, text, line, key, words):
    path = write(profiles, name, text)
    with pytest.raises(ConfigError) as info:
        load_profiles(profiles)
    err = info.value
    assert (err.path, err.line, err.key) == (str(path), line, key)
    assert words in str(err)
    assert str(err).startswith(f"{path}:{line}: ")
    assert "\n" not in str(err)


def test_two_files_cannot_define_one_partition(profiles):
    shutil.copy(profiles / "hdr.yaml", profiles / "hdr-copy.yaml")
    with pytest.raises(ConfigError, match=r"hdr.yaml:.*partition.*already defined in .*hdr-copy.yaml"):
        load_profiles(profiles)


def test_unknown_partition_lists_the_known_ones(profiles):
    with pytest.raises(
        ConfigError, match=r"no profile for partition 'gpu' \(profiles: amd, ascend, hdr, roce, vpc\)"
    ):
        load_profile("gpu", profiles)


def test_cache_is_used_and_invalidated_by_an_edit(profiles):
    first = load_profile("hdr", profiles)
    probe = (
        "import sys; from slurm_tune.profiles import load_profile; "
        f"p = load_profile('hdr', {str(profiles)!r}); print(p.nccl.ib_timeout, 'yaml' in sys.modules)"
    )
    env = dict(os.environ, STUNE_CACHE_DIR=os.environ["STUNE_CACHE_DIR"], PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(first.nccl.ib_timeout), "False"]  # served from the cache, no yaml
    hdr = profiles / "hdr.yaml"
    hdr.write_text(hdr.read_text().replace("nccl:\n", "nccl:\n  ib_timeout: 19\n"))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["19", "True"]  # edit seen, file re-validated
    assert load_profile("hdr", profiles).digest != first.digest


def test_a_cached_profile_is_read_alone_and_a_damaged_one_is_validated_again(profiles):
    import marshal

    from slurm_tune import profilestore

    first = load_profile("hdr", profiles)
    cache = Path(profilestore._cache_path(str(profiles)))
    fingerprint, packed = marshal.loads(cache.read_bytes())
    assert set(packed) == {"amd", "ascend", "hdr", "roce", "vpc"} and all(
        isinstance(v, bytes) for v in packed.values()
    )
    assert load_profile("hdr", profiles).to_dict() == first.to_dict()  # from the cache
    packed["hdr"] = b"\xff\x00"
    cache.write_bytes(marshal.dumps((fingerprint, packed)))
    assert load_profile("hdr", profiles).to_dict() == first.to_dict()
    assert {name: p.to_dict() for name, p in load_profiles(profiles).items()}["hdr"] == first.to_dict()


def test_a_bad_edit_is_caught_even_after_a_good_load_was_cached(profiles):
    load_profiles(profiles)
    hdr = profiles / "hdr.yaml"
    hdr.write_text(hdr.read_text().replace("rate_gbps: 200", "rate_gbps: fast"))
    with pytest.raises(ConfigError, match=r"fabric\.rate_gbps: expected an integer"):
        load_profiles(profiles)


def test_profiles_are_read_only(profiles):
    profile = load_profile("hdr", profiles)
    with pytest.raises(AttributeError):
        profile.partition = "other"


def test_version_key_orders_real_versions():
    assert version_key("20.31.1014") > version_key("20.30.1004")
    assert version_key("535.161.08") > version_key("535.104.05")
    assert version_key("12.2") < version_key("12.10")
    assert version_key("garbage") == ()


def test_check_profiles_command_prints_one_line_per_error(profiles):
    write(profiles, "vpc.yaml", "partition: vpc\nfabric:\n  type: tcp\n  socket_ifname: 5\n  mtu: 9000\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from slurm_tune.cli.admin import main; raise SystemExit(main())",
            "check-profiles",
            str(profiles),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == f"stune-admin: {profiles}/vpc.yaml:5: fabric.mtu: unknown key "
        "(known: type, hcas, rate_gbps, socket_ifname, gid_index)"
    )
    assert "Traceback" not in proc.stderr


def test_validate_directory_bypasses_the_cache(profiles):
    assert set(validate_directory(profiles)) == {"amd", "ascend", "hdr", "roce", "vpc"}


def test_the_typed_profile_has_every_key_of_the_schema_with_its_type():
    """profiletypes.py (what mypy knows of a profile) against PROFILE_SCHEMA: the same keys in every section,
    each with the type its spec returns."""
    from slurm_tune import profiletypes, schema
    from slurm_tune.profilecheck import PROFILE_SCHEMA

    simple = {schema.Str: "str", schema.Int: "int", schema.Float: "float", schema.Bool: "bool"}
    simple.update({schema.Size: "int", schema.Duration: "int"})
    classes: dict[str, str] = {}  # a Section's key set -> the class that types it

    def spelled(spec, name: str) -> str:
        if isinstance(spec, schema.Nullable):
            return spelled(spec.inner, name) + " | None"
        if isinstance(spec, schema.List):
            return f"tuple[{spelled(spec.item, name)}, ...]"
        if isinstance(spec, schema.Map):
            return "Frozen"
        if isinstance(spec, schema.Section):
            return section(spec, name)
        return simple[type(spec)]

    def section(spec, name: str) -> str:
        key = ",".join(sorted(spec.fields))
        wanted = classes.get(key)
        candidates = [
            c
            for c in vars(profiletypes).values()
            if isinstance(c, type) and c.__module__ == profiletypes.__name__
        ]
        found = [c for c in candidates if set(c.__annotations__) == set(spec.fields)]
        assert found, f"no class in profiletypes.py types section {name} ({key})"
        cls = wanted or found[0].__name__
        classes[key] = cls
        annotations = vars(profiletypes)[cls].__annotations__
        for field, inner in spec.fields.items():
            assert annotations[field] == spelled(inner, f"{name}.{field}"), f"{name}.{field}"
        return cls

    assert section(PROFILE_SCHEMA, "profile") == "Sections"
