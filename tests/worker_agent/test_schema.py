"""The inventory format, defined once (worker_agent/schemas/), and the agent standing alone."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

import worker_agent
from worker_agent.inventory import inventory_document
from worker_agent.schema import (
    INVENTORY_SCHEMA,
    SCHEMA_VERSION,
    InventoryInvalid,
    inventory_errors,
)

from .test_inventory import recorded_reading

AGENT = Path(worker_agent.__file__).parent  # the source tree here, or an installed copy
BIG = 10**18


def document(**changes) -> dict:
    """The recorded 4×H100 node's inventory as the agent sends it, with `changes`."""
    doc = inventory_document(recorded_reading(), cpu_millicores=64000, memory_mib=512000)
    return doc | changes


def with_gpu(**changes) -> list[dict]:
    gpus = document()["gpus"]
    gpus[0] |= changes
    return gpus


def test_the_schema_is_versioned_json_schema():
    Draft202012Validator.check_schema(INVENTORY_SCHEMA)
    assert INVENTORY_SCHEMA["$id"].endswith(f"inventory:v{SCHEMA_VERSION}")
    assert INVENTORY_SCHEMA["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_the_agent_sends_a_versioned_inventory_the_schema_takes():
    doc = document(numa=[{"id": 0, "cpus": 32}, {"id": 1, "cpus": [0, 1, 2], "memory_mib": 1024}])
    assert doc["schema_version"] == SCHEMA_VERSION
    assert inventory_errors(doc) == []
    assert [gpu["index"] for gpu in doc["gpus"]] == [0, 1, 2, 3]
    assert inventory_errors({"cpu_millicores": 1000, "memory_mib": 1024}) == []  # v1 implied


def test_the_agent_refuses_to_send_what_the_schema_refuses():
    with pytest.raises(InventoryInvalid, match="memory_mib: Ensure this value is less"):
        inventory_document(recorded_reading(), cpu_millicores=64000, memory_mib=BIG)


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        (document(memory_mib=BIG), ("memory_mib",), "less than or equal to 2147483647"),
        (document(cpu_millicores=-1), ("cpu_millicores",), "greater than or equal to 0"),
        (document(cpu_millicores="64000"), ("cpu_millicores",), "Must be an integer."),
        (document(cpu_millicores=64000.0), ("cpu_millicores",), "Must be an integer."),
        (document(cpu_millicores=True), ("cpu_millicores",), "Must be an integer."),
        (document(schema_version=2), ("schema_version",), "Must be 1."),
        (document(colour="blue"), ("colour",), "Unknown field."),
        (document(gpus=with_gpu(index=70_000)), ("gpus", 0, "index"), "less than or equal"),
        (document(gpus=with_gpu(numa_node=40_000)), ("gpus", 0, "numa_node"), "less than"),
        (document(gpus=with_gpu(model="")), ("gpus", 0, "model"), "at least 1 characters"),
        (document(gpus=with_gpu(mig_enabled="yes")), ("gpus", 0, "mig_enabled"), "true or false"),
        (document(gpus=with_gpu(sharing_mode="all")), ("gpus", 0, "sharing_mode"), "one of"),
        (
            document(gpus=with_gpu(mig_slices=[{"profile": "1g.10gb", "memory_mib": BIG}])),
            ("gpus", 0, "mig_slices", 0, "memory_mib"),
            "less than or equal to 1048576",
        ),
        (document(numa=[{"id": 0, "cpus": "all"}]), ("numa", 0, "cpus"), "A count of CPUs"),
        (document(numa=[{"id": 0, "cpus": [BIG]}]), ("numa", 0, "cpus"), "A count of CPUs"),
        (document(numa=[{"id": i} for i in range(300)]), ("numa",), "no more than 256 elements"),
        (document(gpus=with_gpu(index=1)), ("gpus",), "GPU indexes must be unique."),
        (
            document(gpus=with_gpu(uuid=with_gpu()[1]["uuid"])),
            ("gpus",),
            "GPU UUIDs must be unique.",
        ),
    ],
)
def test_each_error_names_the_field_path(doc, path, message):
    errors = inventory_errors(doc)
    assert [p for p, _ in errors] == [path], errors
    assert message in errors[0][1]


def test_missing_fields_are_named_once_each():
    gpus = with_gpu()
    del gpus[0]["uuid"], gpus[0]["model"]
    errors = inventory_errors({"gpus": gpus})
    assert sorted(p for p, _ in errors) == [
        ("cpu_millicores",),
        ("gpus", 0, "model"),
        ("gpus", 0, "uuid"),
        ("memory_mib",),
    ]
    assert {m for _, m in errors} == {"This field is required."}


def test_messages_never_echo_a_large_value():
    [(_, message)] = inventory_errors(document(numa=[{"id": i} for i in range(300)]))
    assert len(message) < 80


@pytest.mark.skipif(not (AGENT / "pyproject.toml").exists(), reason="an installed copy")
def test_the_distribution_ships_the_schema():
    setuptools = tomllib.loads((AGENT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"worker_agent": "."}
    shipped = {p for glob in setuptools["package-data"]["worker_agent"] for p in AGENT.glob(glob)}
    assert AGENT / f"schemas/inventory-v{SCHEMA_VERSION}.json" in shipped


def test_the_agent_imports_nothing_of_the_control_plane():
    """In a fresh interpreter without Django settings: every agent module, and no Django."""
    modules = [
        "worker_agent." + ".".join(p.relative_to(AGENT).with_suffix("").parts)
        for p in AGENT.rglob("*.py")
        if p.stem != "__init__"
    ]
    code = (
        f"import sys, json\nfor m in {modules!r}: __import__(m)\n"
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no DJANGO_SETTINGS_MODULE
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=AGENT.parent, env=env, capture_output=True, check=True
    )
    loaded = set(json.loads(out.stdout))
    assert "worker_agent" in loaded and modules
    control_plane = {"django", "rest_framework", "channels", "celery"}
    control_plane |= {"config", "pools", "nodes", "leases", "scheduling", "jobs"}
    assert not loaded & control_plane


@pytest.mark.parametrize("capability", ["9.0", "10.0", "8.6", "12.10"])
def test_a_compute_capability_is_major_dot_minor(capability):
    assert inventory_errors(document(gpus=with_gpu(compute_capability=capability))) == []


@pytest.mark.parametrize("capability", ["9", "9.0.1", "nine", "", " 9.0", "9.0\n", 9.0, "1234.0"])
def test_a_compute_capability_that_is_not_major_dot_minor_is_refused(capability):
    errors = inventory_errors(document(gpus=with_gpu(compute_capability=capability)))
    assert errors and errors[0][0] == ("gpus", 0, "compute_capability")
