"""A job manifest (the body of POST /jobs, YAML or JSON) and the submit flags over it."""

import argparse

import pytest

from poolctl.cli import build_parser
from poolctl.config import UsageError
from poolctl.manifest import merge, pairs, read


def flags(*argv) -> argparse.Namespace:
    return build_parser().parse_args(["submit", *argv])


def test_flags_set_and_override_fields_and_merge_maps():
    body = {"name": "a", "env": {"A": "1"}, "shape": "cpu-small", "command": ["true"]}
    merged = merge(body, flags("--name", "b", "--env", "B=2", "--max-runtime", "60"))
    assert merged == {
        "name": "b",
        "env": {"A": "1", "B": "2"},
        "shape": "cpu-small",
        "command": ["true"],
        "max_runtime_s": 60,
    }
    assert body["env"] == {"A": "1"}  # the manifest itself is left alone


def test_a_shape_and_inline_resources_replace_each_other():
    inline = merge({"shape": "cpu-small"}, flags("--cpu", "500", "--memory", "256", "--gpus", "1"))
    assert "shape" not in inline
    assert inline["resources"] == {
        "cpu_millicores_min": 500,
        "memory_mib_min": 256,
        "gpu_count": 1,
        "gpu_sharing_class": "exclusive",  # the class that needs no share, when none is given
    }
    shaped = merge({"resources": {"cpu_millicores_min": 1}}, flags("--shape", "gpu-1"))
    assert shaped == {"shape": "gpu-1"}


def test_the_command_comes_after_the_double_dash():
    assert merge({}, flags("--name", "x", "--", "sh", "-c", "echo hi"))["command"] == [
        "sh",
        "-c",
        "echo hi",
    ]


def test_key_value_flags_need_the_equals_sign():
    assert pairs(["A=1", "B=x=y", "C="], "--env") == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(UsageError, match="--env takes KEY=VALUE, not 'A'"):
        pairs(["A"], "--env")


def test_json_and_yaml_files_and_what_is_not_a_manifest(tmp_path):
    (tmp_path / "a.json").write_text('{"name": "j"}')
    (tmp_path / "b.yml").write_text("name: y\ncommand: [echo, 1]\n")
    (tmp_path / "c.yaml").write_text("- a list\n")
    (tmp_path / "d.json").write_text("name: yaml-in-a-json-file\n")
    assert read(str(tmp_path / "a.json")) == {"name": "j"}
    assert read(str(tmp_path / "b.yml")) == {"name": "y", "command": ["echo", 1]}
    with pytest.raises(UsageError, match="a manifest is a mapping"):
        read(str(tmp_path / "c.yaml"))
    with pytest.raises(UsageError, match="is not valid JSON"):
        read(str(tmp_path / "d.json"))
    with pytest.raises(UsageError, match="cannot read"):
        read(str(tmp_path / "missing.yaml"))


def test_every_preference_and_minimum_has_a_flag():
    args = flags(
        *("--cpu", "500", "--memory", "256", "--gpus", "1", "--gpus-preferred", "4"),
        *("--gpu-memory", "20000", "--gpu-memory-preferred", "80000"),
        *("--gpu-driver-min", "550", "--cuda-min", "12.4", "--trust-level-min", "2"),
        *(
            "--region",
            "eu",
            "--region-preferred",
            "eu-west",
            "--zone",
            "a",
            "--zone-preferred",
            "b",
        ),
        *("--warm-image", "--affinity", "disk=ssd", "--affinity-preferred", "rack=r1"),
    )
    merged = merge({}, args)
    assert merged["resources"] == {
        "cpu_millicores_min": 500,
        "memory_mib_min": 256,
        "gpu_count": 1,
        "gpu_sharing_class": "exclusive",
        "gpu_count_preferred": 4,
        "gpu_memory_mib_min": 20000,
        "gpu_memory_mib_preferred": 80000,
        "gpu_driver_version_min": "550",
        "gpu_cuda_version_min": "12.4",
        "trust_level_min": 2,
        "regions": ["eu"],
        "regions_preferred": ["eu-west"],
        "zones": ["a"],
        "zones_preferred": ["b"],
        "warm_image_required": True,
    }
    assert merged["affinity"] == {"disk": "ssd"}
    assert merged["affinity_preferred"] == {"rack": "r1"}


def test_compute_capability_and_zone_anti_affinity_have_flags():
    args = flags(
        *("--gpus", "1", "--gpu-memory", "40960", "--compute-capability-min", "8.0"),
        *("--anti-affinity", "app=web", "--anti-affinity-scope", "zone"),
    )
    merged = merge({"anti_affinity": {"tier": "db"}}, args)
    assert merged["resources"]["gpu_compute_capability_min"] == "8.0"
    assert merged["anti_affinity"] == {"tier": "db", "app": "web"}
    assert merged["anti_affinity_scope"] == "zone"
    assert "anti_affinity_scope" not in merge({}, flags())  # the API's default: host
    with pytest.raises(UsageError, match="invalid choice"):  # not a scope
        flags("--anti-affinity-scope", "rack")


def test_required_node_features_have_a_repeatable_flag():
    merged = merge({}, flags("--node-feature", "avx512", "--node-feature", "sgx"))
    assert merged["resources"]["node_features_required"] == ["avx512", "sgx"]
    assert "node_features_required" not in merge({}, flags()).get("resources", {})
