"""The GPU challenge's runner without a GPU (worker_agent/gpu_kernel.py): no driver gives a clear
error; the PTX holds the entry points and parameters the host uses; the host code, driven by a
fake libcuda that runs the kernels' reference in Python, reads back what the control plane
recomputes; the probe's container spec is the job path's (never started: no GPU here)."""

import ctypes
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from worker_agent import gpu_kernel as gk
from worker_agent.probe import (
    AGENT_MOUNT,
    AGENT_PACKAGE,
    gpu_kernel_assignment,
    parse_gpu_answer,
    run_gpu_kernel,
)
from worker_agent.runtime.container_spec import job_options, volume_mounts

UUID = "GPU-0123abcd-aaaa-bbbb-cccc-dddddddddddd"


def challenge(**changes) -> dict:
    gpu = {
        "uuid": UUID,
        "nonce": "0123456789abcdef",
        "fill_bytes": 1 << 16,
        "samples": [0, 5, 4095, (1 << 13) - 1],
        "fma_iterations": 3,
        "fma_blocks": 2,
        "fma_b": 100,
    }
    return gpu | changes


def cuda_available() -> bool:
    try:
        gk.Driver.load()
    except gk.NoDriver:
        return False
    return True


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA driver")
def test_without_libcuda_the_answer_says_so_and_nothing_crashes():
    answer = gk.run_challenge([challenge()])
    assert answer["error"].startswith("no CUDA driver: ")
    assert "libcuda" in answer["error"]


def test_a_challenge_out_of_range_is_refused_before_the_driver():
    assert "sample" in gk.run_challenge([challenge(samples=[1 << 13])])["error"]
    assert "fill_bytes" in gk.run_challenge([challenge(fill_bytes=7)])["error"]
    assert "malformed" in gk.run_challenge([challenge(nonce="zz")])["error"]
    assert "list" in gk.run_challenge({"uuid": UUID})["error"]


# --------------------------------------------------------------------------- the PTX


def entry_params(ptx: str, name: str) -> list[str]:
    match = re.search(rf"\.visible \.entry {name}\(([^)]*)\)", ptx)
    assert match, f"no entry {name}"
    return re.findall(r"\.param \.(\w+) (\w+)", match[1])


def test_the_ptx_holds_the_entry_points_the_host_looks_up():
    ptx = gk.PTX_PATH.read_text()
    assert re.search(r"^\.version \d+\.\d+$", ptx, re.M)
    assert re.search(r"^\.target sm_[5-7]\d$", ptx, re.M)  # JIT-portable to any later device
    assert re.search(r"^\.address_size 64$", ptx, re.M)
    # the parameters match what Session.timed_launch passes (types and count)
    assert [t for t, _ in entry_params(ptx, "cp_fill")] == ["u64", "u64", "u64"]
    assert [t for t, _ in entry_params(ptx, "cp_fma")] == ["u64", "u32", "f32", "f32"]
    assert set(gk.ENTRY_POINTS) == set(re.findall(r"\.visible \.entry (\w+)\(", ptx))
    assert ptx.count("{") == ptx.count("}")
    # every register used is declared, every branch target defined
    for body in re.findall(r"\{(.*?)\n\}", ptx, re.S):
        declared = {
            (prefix, n)
            for prefix, count in re.findall(r"\.reg \.\w+ %(\w+)<(\d+)>;", body)
            for n in range(int(count))
        }
        used = {(p, int(n)) for p, n in re.findall(r"%(p|r|rd|f)(\d+)\b", body)}
        assert used <= declared, used - declared
        labels = set(re.findall(r"^(\w+):$", body, re.M))
        assert set(re.findall(r"bra (\w+);", body)) <= labels
    # 32 FMAs in the loop and 8 after it, as FMA_PER_ITERATION and FMA_TAIL count them
    loop = ptx.split("FMA_LOOP:")[1].split("FMA_TAIL:")
    assert loop[0].count("fma.rn.f32") == gk.FMA_PER_ITERATION
    assert loop[1].count("fma.rn.f32") == gk.FMA_TAIL


def test_the_ptx_ships_as_package_data():
    text = (Path(gk.__file__).parent / "pyproject.toml").read_text()
    assert '"ptx/*.ptx"' in text


# --------------------------------------------------------------------------- a fake libcuda


class FakeCuda:
    """libcuda's calls as the Driver makes them, the kernels run by the Python reference."""

    def __init__(self, uuid_bytes: bytes, total: int):
        self.memory: dict[int, bytearray] = {}
        self.next = 0x10000000
        self.functions = {10: "cp_fill", 11: "cp_fma"}
        self.launches = []
        self.lib = SimpleNamespace()
        ok = 0

        def out(ref, value):
            ref._obj.value = value
            return ok

        def alloc(ref, size):
            self.next += 1 << 40
            self.memory[self.next] = bytearray(size)
            return out(ref, self.next)

        def where(pointer):
            base = max(b for b in self.memory if b <= pointer)
            return self.memory[base], pointer - base

        def copy(dst, src, size):
            buf, offset = where(src)
            ctypes.memmove(ctypes.addressof(dst._obj), bytes(buf[offset : offset + size]), size)
            return ok

        def memset(pointer, value, count):
            buf, offset = where(pointer)
            buf[offset : offset + 4 * count] = value.to_bytes(4, "little") * count
            return ok

        def launch(function, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
            name = self.functions[function.value]
            self.launches.append((name, gx, bx))
            if name == "cp_fill":
                pointer = ctypes.c_uint64.from_address(params[0]).value
                count = ctypes.c_uint64.from_address(params[1]).value
                nonce = ctypes.c_uint64.from_address(params[2]).value
                buf, offset = where(pointer)
                for i in range(count):
                    word = gk.pattern_word(nonce, i).to_bytes(8, "little")
                    buf[offset + 8 * i : offset + 8 * i + 8] = word
            else:
                pointer = ctypes.c_uint64.from_address(params[0]).value
                a = ctypes.c_float.from_address(params[2]).value
                b = ctypes.c_float.from_address(params[3]).value
                assert a == gk.FMA_A
                threads = gx * bx
                value = ctypes.c_float(8 * b - 28)
                buf, offset = where(pointer)
                buf[offset : offset + 4 * threads] = bytes(value) * threads
            return ok

        functions = {
            "cuInit": lambda flags: ok,
            "cuDriverGetVersion": lambda ref: out(ref, 12040),
            "cuDeviceGetCount": lambda ref: out(ref, 1),
            "cuDeviceGet": lambda ref, ordinal: out(ref, ordinal),
            "cuDeviceGetUuid": lambda ref, dev: ctypes.memmove(ref._obj, uuid_bytes, 16) and ok,
            "cuDeviceGetName": lambda buf, size, dev: setattr(buf, "value", b"Fake H100") or ok,
            "cuDeviceTotalMem_v2": lambda ref, dev: out(ref, total),
            "cuDeviceGetAttribute": lambda ref, attr, dev: out(ref, 4),
            "cuCtxCreate_v2": lambda ref, flags, dev: out(ref, 1),
            "cuCtxDestroy_v2": lambda ctx: ok,
            "cuCtxSynchronize": lambda: ok,
            "cuModuleLoadDataEx": lambda ref, ptx, n, o, v: (
                out(ref, 2) if ptx[-1:] == b"\0" else 218
            ),
            "cuModuleGetFunction": lambda ref, mod, name: out(
                ref, {"cp_fill": 10, "cp_fma": 11}[name.decode()]
            ),
            "cuModuleUnload": lambda mod: ok,
            "cuMemAlloc_v2": alloc,
            "cuMemFree_v2": lambda pointer: self.memory.pop(pointer) and ok,
            "cuMemsetD32_v2": memset,
            "cuMemcpyDtoH_v2": copy,
            "cuLaunchKernel": launch,
            "cuEventCreate": lambda ref, flags: out(ref, 7),
            "cuEventRecord": lambda event, stream: ok,
            "cuEventSynchronize": lambda event: ok,
            "cuEventElapsedTime": lambda ref, start, stop: out(ref, 250.0),
            "cuEventDestroy_v2": lambda event: ok,
            "cuGetErrorString": lambda code, ref: out(ref, b"fake error"),
        }
        for name, fn in functions.items():
            setattr(self.lib, name, fn)


def uuid_bytes(uuid: str) -> bytes:
    return bytes.fromhex(uuid[4:].replace("-", ""))


def test_the_host_fills_reads_back_and_times_as_the_control_plane_recomputes():
    fake = FakeCuda(uuid_bytes(UUID), total=1 << 30)
    gpu = challenge()
    answer = gk.run_challenge([gpu], driver=gk.Driver(fake.lib))
    [got] = answer["gpus"]
    assert "error" not in got, got
    assert got["uuid"] == UUID and got["cuda_name"] == "Fake H100"
    assert got["cuda_memory_mib"] == 1024
    assert got["samples"] == gk.expected_samples(gpu["nonce"], gpu["samples"])
    assert got["fma_check"] == gk.fma_check_expected(gpu["fma_b"])
    assert got["fma_seconds"] == 0.25
    assert got["gflops"] == round(gk.fma_flops(gpu) / 0.25 / 1e9, 1)
    # fill over 4 SMs × 8 blocks; a warm-up FMA launch, then the timed one
    assert fake.launches == [("cp_fill", 32, 256), ("cp_fma", 2, 256), ("cp_fma", 2, 256)]
    assert fake.memory == {}  # everything freed


def test_a_device_it_cannot_find_or_fill_is_an_error_of_that_gpu():
    fake = FakeCuda(uuid_bytes("GPU-99999999-aaaa-bbbb-cccc-dddddddddddd"), total=1 << 30)
    [got] = gk.run_challenge([challenge()], driver=gk.Driver(fake.lib))["gpus"]
    assert got["uuid"] == UUID and got["error"].startswith(f"CUDA sees no device {UUID}")
    small = FakeCuda(uuid_bytes(UUID), total=1 << 15)
    [got] = gk.run_challenge([challenge()], driver=gk.Driver(small.lib))["gpus"]
    assert "asked to be filled" in got["error"]


def test_the_container_entry_point_prints_one_answer_line(tmp_path):
    """What the GPU probe container runs, with only the package mounted: stdlib imports only."""
    package = tmp_path / "worker_agent"
    package.mkdir()
    shutil.copy(AGENT_PACKAGE / "__init__.py", package)
    shutil.copy(AGENT_PACKAGE / "gpu_kernel.py", package)
    shutil.copytree(AGENT_PACKAGE / "ptx", package / "ptx")
    command = list(gpu_kernel_assignment(3, [challenge()], "img@sha256:" + "0" * 64).command)
    done = subprocess.run(
        [sys.executable, "-S", *command[1:]],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    answer = parse_gpu_answer(done.stdout)
    if cuda_available():
        assert "gpus" in answer
    else:
        assert answer["error"].startswith("no CUDA driver"), done.stdout + done.stderr


# --------------------------------------------------------------------------- the probe's path


def test_the_gpu_probe_container_is_a_job_container_with_the_devices():
    image = "127.0.0.1:5000/python@sha256:" + "a" * 64
    assignment = gpu_kernel_assignment(42, [challenge()], image)
    assert assignment.image == image and assignment.network_mode == "none"
    assert assignment.command[:4] == ("python3", "-B", "-m", "worker_agent.gpu_kernel")
    assert json.loads(assignment.command[4]) == [challenge()]
    options = job_options(
        assignment,
        name="cp-probe",
        labels={},
        mounts=volume_mounts(assignment),
        network={"network_mode": "none"},
        device_ids=list(assignment.limits.gpus),
        engine_runtime=None,
    )
    [request] = options["device_requests"]
    assert request["Driver"] == "nvidia" and request["DeviceIDs"] == [UUID]
    assert request["Capabilities"] == [["gpu"]]
    [mount] = options["mounts"]
    assert mount["Target"] == f"{AGENT_MOUNT}/worker_agent" and mount["ReadOnly"] is True
    assert mount["Source"] == str(AGENT_PACKAGE) and mount["Type"] == "bind"
    env = options["environment"]
    assert env["PYTHONPATH"] == AGENT_MOUNT and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert options["read_only"] is True and options["cap_drop"] == ["ALL"]


def test_without_a_container_runtime_it_runs_in_the_agents_process():
    seen = []

    def kernel(gpus):
        seen.append(gpus)
        return {"gpus": [{"uuid": g["uuid"], "samples": []} for g in gpus], "seconds": 1}

    nvml = [{"uuid": UUID, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}]
    process = SimpleNamespace(name="process")
    for runtime in (None, process):
        answer = run_gpu_kernel(
            1,
            {"gpus": [challenge()]},
            runtime=runtime,
            workdir=Path("/nonexistent"),
            nvml_gpus=nvml,
            run_in_process=kernel,
        )
        assert answer["gpus"][0]["model"] == "NVIDIA H100 80GB HBM3"  # NVML's, added
        assert answer["gpus"][0]["memory_mib"] == 81559
    assert len(seen) == 2


def test_under_docker_without_a_gpu_probe_image_it_says_so():
    docker = SimpleNamespace(name="docker")
    answer = run_gpu_kernel(
        1, {"gpus": [challenge()], "image": ""}, runtime=docker, workdir=Path("/x"), nvml_gpus=[]
    )
    assert "NODE_GPU_PROBE_IMAGE" in answer["error"]
