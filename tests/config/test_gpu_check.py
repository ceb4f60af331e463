"""`make gpu-check` (deploy/gpu_check.py) run as it is: a throwaway control plane over HTTP and the
real agent in a process of its own, enrolled in a marketplace pool, answering its validation
probe with signed requests. Without a GPU (as here) the node enrolls with none and the verdict
says why it did not pass; the GPU assertions run only where a fixture was recorded."""

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config.builders import RECORDED_GPU
from config.settings import BASE_DIR
from nodes.challenge import build_gpu_challenge
from pools.knobs import DEFAULTS
from tests.nodes.conftest import gpu_kernel_answer

DRILL = [sys.executable, str(BASE_DIR / "deploy" / "gpu_check.py")]


def _environment(tmp_path: Path) -> dict:
    """The suite's environment (its settings module, PostgreSQL's DATABASE_URL …: the drill
    must replace them all), with a TMPDIR of the test's own to see what is left in it."""
    (tmp_path / "tmp").mkdir()
    return os.environ | {"TMPDIR": str(tmp_path / "tmp")}


def _leftovers(tmp_path: Path) -> list:
    """The processes that name the test's TMPDIR in their command line or environment (the
    agent's state dir, the server's DATABASE_URL), and what remains in that TMPDIR."""
    needle = str(tmp_path / "tmp").encode()
    processes = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (
                needle in (proc / "cmdline").read_bytes()
                or needle in (proc / "environ").read_bytes()
            ):
                processes.append(proc.name)
        except OSError:
            continue
    return processes + list((tmp_path / "tmp").iterdir())


def _started(tmp_path: Path) -> bool:
    """The drill's web server runs (its environment names the drill's temp dir)."""
    needle = b"hypercorn"
    for proc in Path("/proc").iterdir():
        try:
            if (
                needle in (proc / "cmdline").read_bytes()
                and str(tmp_path / "tmp").encode() in (proc / "environ").read_bytes()
            ):
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
def test_the_drill_enrolls_a_real_agent_and_reports_the_probes_verdict(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [*DRILL, "--fixture-dir", str(tmp_path / "fixtures")],
        env=_environment(tmp_path),
        cwd=tmp_path,  # the drill finds the tree itself
        capture_output=True,
        text=True,
        timeout=360,
    )
    out = json.loads(done.stdout)  # one JSON object, nothing else on stdout
    assert time.monotonic() - started < 360
    assert out["timings"]["total_s"] < 360
    node, probe = out["node"], out["probe"]
    # enrolled over HTTP with its own key; the validation probe asked and answered, signed
    assert node["key_fingerprint"] and node["events"][0] == "enrolled: (none) -> registered"
    assert "probe_requested: registered -> registered" in node["events"]
    assert probe["state"] in ("passed", "failed") and "probe_requested" in probe["reasons"]
    assert not _leftovers(tmp_path)  # every process stopped, the temp dir removed
    if out["fixture"] is None:  # no NVIDIA driver here: the node has no GPU to challenge
        assert out["fixture_note"].startswith(("no NVIDIA driver", "no NVIDIA GPU"))
        assert not list((tmp_path / "fixtures").glob("*"))
        assert node["gpus"] == 0 and out["gpus"] == []
        # the CPU/memory challenge still ran through the process runtime and matched
        assert probe["state"] == "passed" and node["state"] == "ready"
        assert out["passed"] is False and out["error"].startswith("no NVIDIA")
        assert done.returncode == 1
        return
    # a GPU machine: the fixture recorded, every whole GPU challenged and passed
    assert Path(out["fixture"]).is_file()
    assert out["passed"] is True and done.returncode == 0, out
    assert node["state"] == "ready" and out["gpus"]
    assert all(g["gflops"] and g["fill_seconds"] is not None for g in out["gpus"])


@pytest.mark.slow
def test_an_interrupted_drill_still_tears_everything_down(tmp_path):
    drill = subprocess.Popen(
        [*DRILL, "--fixture-dir", str(tmp_path / "fixtures")],
        env=_environment(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _started(tmp_path):
            assert drill.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        drill.send_signal(signal.SIGTERM)  # what `timeout` sends; Ctrl-C's SIGINT the same
        stdout, _ = drill.communicate(timeout=60)
    finally:
        if drill.poll() is None:
            drill.kill()
            drill.wait()
    out = json.loads(stdout)
    assert drill.returncode == 1 and out["passed"] is False
    assert out["error"].startswith("KeyboardInterrupt"), out["error"]
    assert not _leftovers(tmp_path)


def test_each_gpus_line_has_the_control_planes_own_throughput():
    """What only a GPU machine shows, from an honest answer: the report's per-GPU numbers."""
    spec = importlib.util.spec_from_file_location("gpu_check", DRILL[1])
    drill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drill)
    gpus = [RECORDED_GPU | {"uuid": f"GPU-{n}"} for n in range(2)]
    challenge = build_gpu_challenge(
        gpus,
        classes=dict(DEFAULTS.gpu_throughput_classes),
        tolerance=DEFAULTS.gpu_throughput_tolerance,
        reserve_mib=2048,
        samples=8,
        fma_seconds=0.5,
        unclassed_gflops=10_000,
        rng=random.Random(7),
    )
    answer = gpu_kernel_answer(challenge, gflops_factor=2)
    answer["gpus"][1] = {"uuid": "GPU-1", "error": "CUDA_ERROR_OUT_OF_MEMORY"}
    first, second = drill.gpu_lines(challenge, answer)
    assert first["gflops"] == pytest.approx(2 * first["gflops_min"], rel=1e-3)
    assert first["fill_seconds"] == 0.04 and first["fill_mib"] == RECORDED_GPU["memory_mib"] - 2048
    assert second["gflops"] is None and second["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
