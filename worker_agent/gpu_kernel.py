"""The GPU challenge, run on the device through the CUDA driver API (docs/nodes.md "GPU challenge").

The control plane names, for each claimed GPU, a nonce, how many bytes to fill, which 64-bit
words to read back, and the size of a timed FMA kernel (nodes/challenge.py). This module:

- loads `libcuda` from the NVIDIA driver with ctypes (no CUDA toolkit, no CUDA image, no
  pip package) and JIT-compiles the hand-written PTX shipped beside it (`ptx/challenge.ptx`);
- per GPU, found by its UUID (cuDeviceGetUuid): allocates the bytes asked, fills every word
  with `pattern_word(nonce, index)` on the device (`cp_fill`), reads back the words the control
  plane named (cuMemcpyDtoH at their offsets), then times `cp_fma` with device events;
- answers `{"uuid", "cuda_name", "cuda_memory_mib", "samples": [16 hex each], "fill_seconds",
  "fma_seconds", "gflops", "fma_check"}` per GPU, or `{"uuid", "error"}` for a GPU it could not
  run on; a node without the driver answers `{"error": "no CUDA driver: …"}` — never a crash.

`pattern_word` and `fma_check_expected` are the pure-Python reference of the two kernels: the
control plane (nodes/challenge.py) verifies with them, so the pattern is defined here once.

Only the standard library, and Python 3.8 syntax: the same file runs inside the probe container
(`python3 -m worker_agent.gpu_kernel '<challenge json>'`, the agent's package mounted read-only)
under whatever python3 the probe image has.
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
import time
from pathlib import Path

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
PTX_PATH = Path(__file__).resolve().parent / "ptx" / "challenge.ptx"
ENTRY_POINTS = ("cp_fill", "cp_fma")
ANSWER_PREFIX = "gpu-kernel-answer "  # the one line the probe container prints

# bounds of what the agent runs, whoever sent it (the control plane asks far less)
GPUS_MAX = 64
SAMPLES_MAX = 1024
FILL_BYTES_MAX = 1 << 41  # 2 TiB
FMA_ITERATIONS_MAX = 100_000_000
FMA_BLOCKS_MAX = 65535
FMA_THREADS = 256  # threads per block of both kernels
FMA_PER_ITERATION = 32  # FMAs per thread and loop iteration of cp_fma
FMA_TAIL = 8  # FMAs per thread after the loop
FMA_A = -1.0  # acc = fma(acc, -1, b): every value an exact small integer
FMA_B_MAX = 1 << 20
FILL_BLOCKS_PER_SM = 8
NONCE_RE = re.compile(r"^[0-9a-f]{16}$")
UUID_RE = re.compile(r"^GPU-[0-9A-Za-z-]{1,76}$")


# --------------------------------------------------------------------------- the reference


def pattern_word(nonce: int, index: int) -> int:
    """Word `index` of the fill (splitmix64 of nonce + (index + 1) · golden ratio), as cp_fill
    writes it."""
    z = (nonce + (index + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def expected_samples(nonce_hex: str, indexes) -> list[str]:
    """The sampled words as the answer carries them: 16 lowercase hex characters each."""
    nonce = int(nonce_hex, 16)
    return [f"{pattern_word(nonce, int(i)):016x}" for i in indexes]


def fma_check_expected(b: int) -> float:
    """What cp_fma leaves in every thread's output: acc_k = b - k for k in 0…7, summed."""
    return float(8 * int(b) - 28)


def fma_flops(gpu: dict) -> int:
    """FLOPs of one cp_fma launch of a GPU's challenge (2 per FMA)."""
    threads = int(gpu["fma_blocks"]) * FMA_THREADS
    return 2 * threads * (int(gpu["fma_iterations"]) * FMA_PER_ITERATION + FMA_TAIL)


# --------------------------------------------------------------------------- the challenge


class ChallengeInvalid(ValueError):
    """A GPU challenge this agent does not run (out of range, unknown form)."""


def check_gpu_challenge(gpus) -> list[dict]:
    """The per-GPU challenges typed and bounded; ChallengeInvalid otherwise."""
    if not isinstance(gpus, list) or len(gpus) > GPUS_MAX:
        raise ChallengeInvalid(f"the GPU challenge is not a list of at most {GPUS_MAX} GPUs")
    checked = []
    for gpu in gpus:
        try:
            item = {
                "uuid": str(gpu["uuid"]),
                "nonce": str(gpu["nonce"]),
                "fill_bytes": int(gpu["fill_bytes"]),
                "samples": [int(i) for i in gpu["samples"]],
                "fma_iterations": int(gpu["fma_iterations"]),
                "fma_blocks": int(gpu["fma_blocks"]),
                "fma_b": int(gpu["fma_b"]),
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise ChallengeInvalid(f"unreadable GPU challenge: {exc!r}") from exc
        words = item["fill_bytes"] // 8
        if not UUID_RE.match(item["uuid"]) or not NONCE_RE.match(item["nonce"]):
            raise ChallengeInvalid("a GPU challenge's uuid or nonce is malformed")
        if not (0 < item["fill_bytes"] <= FILL_BYTES_MAX and item["fill_bytes"] % 8 == 0):
            raise ChallengeInvalid("fill_bytes out of range or not whole 64-bit words")
        if len(item["samples"]) > SAMPLES_MAX or not all(0 <= i < words for i in item["samples"]):
            raise ChallengeInvalid("sample indexes out of range")
        if not (0 < item["fma_iterations"] <= FMA_ITERATIONS_MAX):
            raise ChallengeInvalid("fma_iterations out of range")
        if not (0 < item["fma_blocks"] <= FMA_BLOCKS_MAX and 0 < item["fma_b"] <= FMA_B_MAX):
            raise ChallengeInvalid("fma_blocks or fma_b out of range")
        checked.append(item)
    return checked


# --------------------------------------------------------------------------- the driver API


class NoDriver(Exception):
    """libcuda cannot be loaded or initialised, or it has no device."""


class CudaError(Exception):
    def __init__(self, call: str, code: int, text: str):
        super().__init__(f"{call} failed: {text} ({code})")
        self.call, self.code = call, code


CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
LOG_SIZE = 8192
_p = ctypes.POINTER
_int, _uint, _size, _u64, _ptr = (
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_size_t,
    ctypes.c_uint64,
    ctypes.c_void_p,
)
# name → argument types; every one returns CUresult (an int). The *_v2 names are the ABI the
# driver has exported since CUDA 4 (64-bit device pointers and sizes).
SIGNATURES = {
    "cuInit": (_uint,),
    "cuDriverGetVersion": (_p(_int),),
    "cuDeviceGetCount": (_p(_int),),
    "cuDeviceGet": (_p(_int), _int),
    "cuDeviceGetUuid": (_p(ctypes.c_ubyte * 16), _int),
    "cuDeviceGetName": (ctypes.c_char_p, _int, _int),
    "cuDeviceTotalMem_v2": (_p(_size), _int),
    "cuDeviceGetAttribute": (_p(_int), _int, _int),
    "cuCtxCreate_v2": (_p(_ptr), _uint, _int),
    "cuCtxDestroy_v2": (_ptr,),
    "cuCtxSynchronize": (),
    "cuModuleLoadDataEx": (_p(_ptr), ctypes.c_char_p, _uint, _p(_int), _p(_ptr)),
    "cuModuleGetFunction": (_p(_ptr), _ptr, ctypes.c_char_p),
    "cuModuleUnload": (_ptr,),
    "cuMemAlloc_v2": (_p(_u64), _size),
    "cuMemFree_v2": (_u64,),
    "cuMemsetD32_v2": (_u64, _uint, _size),
    "cuMemcpyDtoH_v2": (_ptr, _u64, _size),
    "cuLaunchKernel": (
        _ptr,
        _uint,
        _uint,
        _uint,
        _uint,
        _uint,
        _uint,
        _uint,
        _ptr,
        _p(_ptr),
        _p(_ptr),
    ),
    "cuEventCreate": (_p(_ptr), _uint),
    "cuEventRecord": (_ptr, _ptr),
    "cuEventSynchronize": (_ptr,),
    "cuEventElapsedTime": (_p(ctypes.c_float), _ptr, _ptr),
    "cuEventDestroy_v2": (_ptr,),
    "cuGetErrorString": (_int, _p(ctypes.c_char_p)),
}
LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so")


class Driver:
    """The few driver API calls the challenge needs; each failure a CudaError with the
    driver's own words (cuGetErrorString)."""

    def __init__(self, lib):
        self.lib = lib
        for name, argtypes in SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise NoDriver(f"libcuda lacks {name} (driver too old)")
            fn.argtypes, fn.restype = list(argtypes), ctypes.c_int

    @classmethod
    def load(cls, names=LIBRARY_NAMES) -> Driver:
        errors = []
        for name in names:
            try:
                lib = ctypes.CDLL(name)
            except OSError as exc:
                errors.append(str(exc))
                continue
            driver = cls(lib)
            try:
                driver("cuInit", 0)
            except CudaError as exc:
                raise NoDriver(str(exc)) from exc
            return driver
        raise NoDriver("; ".join(errors) or "libcuda not found")

    def error_text(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorString(code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode(errors="replace")
        return f"CUDA error {code}"

    def __call__(self, name: str, *args) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise CudaError(name, code, self.error_text(code))

    def version(self) -> int:
        value = ctypes.c_int()
        self("cuDriverGetVersion", ctypes.byref(value))
        return value.value

    # ---- devices
    def devices(self) -> dict[str, int]:
        """UUID (GPU-…) → ordinal of every device this process sees."""
        count = ctypes.c_int()
        self("cuDeviceGetCount", ctypes.byref(count))
        found = {}
        for ordinal in range(count.value):
            device = ctypes.c_int()
            self("cuDeviceGet", ctypes.byref(device), ordinal)
            raw = (ctypes.c_ubyte * 16)()
            self("cuDeviceGetUuid", ctypes.byref(raw), device.value)
            found[format_uuid(bytes(raw))] = device.value
        return found

    def device_info(self, device: int) -> dict:
        name = ctypes.create_string_buffer(256)
        self("cuDeviceGetName", name, 256, device)
        total = ctypes.c_size_t()
        self("cuDeviceTotalMem_v2", ctypes.byref(total), device)
        sms = ctypes.c_int()
        self(
            "cuDeviceGetAttribute",
            ctypes.byref(sms),
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            device,
        )
        return {
            "name": name.value.decode(errors="replace")[:60],
            "total_bytes": total.value,
            "sms": max(1, sms.value),
        }


def format_uuid(raw: bytes) -> str:
    """CUuuid's 16 bytes in NVML's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class Session:
    """One device's context, the JIT-compiled module and its two functions; everything it
    allocated is freed by close()."""

    def __init__(self, driver: Driver, device: int, ptx: bytes):
        self.driver, self.device = driver, device
        self.context, self.module = ctypes.c_void_p(), ctypes.c_void_p()
        self.allocations: list[int] = []
        driver("cuCtxCreate_v2", ctypes.byref(self.context), 0, device)
        try:
            self._load(ptx)
        except BaseException:
            self.close()
            raise

    def _load(self, ptx: bytes) -> None:
        log = ctypes.create_string_buffer(LOG_SIZE)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p).value, LOG_SIZE)
        try:
            self.driver("cuModuleLoadDataEx", ctypes.byref(self.module), ptx, 2, options, values)
        except CudaError as exc:
            detail = log.value.decode(errors="replace").strip()
            raise CudaError(exc.call, exc.code, f"{exc}: {detail[:300]}") from exc
        self.functions = {}
        for name in ENTRY_POINTS:
            function = ctypes.c_void_p()
            self.driver("cuModuleGetFunction", ctypes.byref(function), self.module, name.encode())
            self.functions[name] = function

    def alloc(self, size: int) -> int:
        pointer = ctypes.c_uint64()
        self.driver("cuMemAlloc_v2", ctypes.byref(pointer), size)
        self.allocations.append(pointer.value)
        return pointer.value

    def free(self, pointer: int) -> None:
        self.allocations.remove(pointer)
        self.driver("cuMemFree_v2", pointer)

    def timed_launch(self, name: str, blocks: int, args: list) -> float:
        """Launch `name` on `blocks` × FMA_THREADS threads with `args` (ctypes values) and
        wait for it: its seconds on the device, between two events around it."""
        holders = (ctypes.c_void_p * len(args))(*[ctypes.addressof(arg) for arg in args])
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        self.driver("cuEventCreate", ctypes.byref(start), 0)
        try:
            self.driver("cuEventCreate", ctypes.byref(stop), 0)
            try:
                self.driver("cuEventRecord", start, None)
                self.driver(
                    "cuLaunchKernel",
                    self.functions[name],
                    blocks,
                    1,
                    1,
                    FMA_THREADS,
                    1,
                    1,
                    0,
                    None,
                    holders,
                    None,
                )
                self.driver("cuEventRecord", stop, None)
                self.driver("cuEventSynchronize", stop)
                self.driver("cuCtxSynchronize")  # a launch failure surfaces here at the latest
                elapsed = ctypes.c_float()
                self.driver("cuEventElapsedTime", ctypes.byref(elapsed), start, stop)
                return elapsed.value / 1000.0
            finally:
                self.driver.lib.cuEventDestroy_v2(stop)
        finally:
            self.driver.lib.cuEventDestroy_v2(start)

    def read_u64(self, pointer: int, index: int) -> int:
        word = ctypes.c_uint64()
        self.driver("cuMemcpyDtoH_v2", ctypes.byref(word), pointer + 8 * index, 8)
        return word.value

    def read_f32(self, pointer: int, index: int) -> float:
        value = ctypes.c_float()
        self.driver("cuMemcpyDtoH_v2", ctypes.byref(value), pointer + 4 * index, 4)
        return value.value

    def close(self) -> None:
        lib = self.driver.lib  # best effort: a failing free must not hide the first error
        for pointer in self.allocations:
            lib.cuMemFree_v2(pointer)
        self.allocations = []
        if self.module:
            lib.cuModuleUnload(self.module)
            self.module = ctypes.c_void_p()
        if self.context:
            lib.cuCtxDestroy_v2(self.context)
            self.context = ctypes.c_void_p()


def run_one(driver: Driver, device: int, gpu: dict, ptx: bytes) -> dict:
    """One GPU's answer: the fill, its samples, the timed FMA kernel."""
    info = driver.device_info(device)
    answer = {
        "uuid": gpu["uuid"],
        "cuda_name": info["name"],
        "cuda_memory_mib": info["total_bytes"] >> 20,
    }
    if gpu["fill_bytes"] > info["total_bytes"]:
        total = info["total_bytes"] >> 20
        asked = gpu["fill_bytes"] >> 20
        return answer | {"error": f"the device has {total} MiB, {asked} MiB asked to be filled"}
    session = Session(driver, device, ptx)
    try:
        words = gpu["fill_bytes"] // 8
        memory = session.alloc(gpu["fill_bytes"])
        fill_blocks = min(FMA_BLOCKS_MAX, info["sms"] * FILL_BLOCKS_PER_SM)
        fill_args = [ctypes.c_uint64(memory), ctypes.c_uint64(words)]
        fill_args.append(ctypes.c_uint64(int(gpu["nonce"], 16)))
        fill_seconds = session.timed_launch("cp_fill", fill_blocks, fill_args)
        samples = [f"{session.read_u64(memory, i):016x}" for i in gpu["samples"]]
        session.free(memory)  # before the FMA kernel: only its output stays allocated
        threads = gpu["fma_blocks"] * FMA_THREADS
        out = session.alloc(4 * threads)
        session.driver("cuMemsetD32_v2", out, 0, threads)
        b = ctypes.c_float(float(gpu["fma_b"]))
        warm = [ctypes.c_uint64(out), ctypes.c_uint32(1), ctypes.c_float(FMA_A), b]
        session.timed_launch("cp_fma", gpu["fma_blocks"], warm)  # clocks up, code resident
        args = [ctypes.c_uint64(out), ctypes.c_uint32(gpu["fma_iterations"])]
        args += [ctypes.c_float(FMA_A), b]
        fma_seconds = session.timed_launch("cp_fma", gpu["fma_blocks"], args)
        first, last = session.read_f32(out, 0), session.read_f32(out, threads - 1)
    finally:
        session.close()
    return answer | {
        "samples": samples,
        "fill_seconds": round(fill_seconds, 6),
        "fma_seconds": round(fma_seconds, 6),
        "gflops": round(fma_flops(gpu) / max(fma_seconds, 1e-9) / 1e9, 1),
        # both ends of the output: a kernel that ran only in part leaves the 0 of cuMemsetD32
        # at one of them (8b - 28 is never 0 for a whole b)
        "fma_check": first if first == last else 0.0,
    }


def run_challenge(gpus, *, driver: Driver | None = None, ptx_path: Path = PTX_PATH) -> dict:
    """The answer to the GPU part of a challenge: `{"gpus": [one per GPU], "seconds"}`, or
    `{"error": "…"}` when nothing can run (no CUDA driver, an unreadable challenge)."""
    started = time.monotonic()
    try:
        gpus = check_gpu_challenge(gpus)
    except ChallengeInvalid as exc:
        return {"error": str(exc)[:500]}
    try:
        driver = driver or Driver.load()
        seen = driver.devices()
    except NoDriver as exc:
        return {"error": f"no CUDA driver: {exc}"[:500]}
    except CudaError as exc:
        return {"error": f"no CUDA driver: {exc}"[:500]}
    try:
        ptx = ptx_path.read_bytes() + b"\0"
    except OSError as exc:
        return {"error": f"the challenge's PTX is missing: {exc}"[:500]}
    answers = []
    for gpu in gpus:
        device = seen.get(gpu["uuid"])
        if device is None:
            shown = ", ".join(sorted(seen)) or "none"
            error = f"CUDA sees no device {gpu['uuid']} (it sees: {shown})"
            answers.append({"uuid": gpu["uuid"], "error": error[:500]})
            continue
        try:
            answers.append(run_one(driver, device, gpu, ptx))
        except CudaError as exc:
            answers.append({"uuid": gpu["uuid"], "error": str(exc)[:500]})
    return {"gpus": answers, "seconds": round(time.monotonic() - started, 3)}


def main(argv=None) -> int:
    """`python3 -m worker_agent.gpu_kernel '<json list of per-GPU challenges>'`: prints one
    line, ANSWER_PREFIX + the answer's JSON (the probe container's whole output)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        gpus = json.loads(argv[0]) if argv else None
    except ValueError as exc:
        gpus, answer = None, {"error": f"unreadable challenge: {exc}"}
    else:
        answer = run_challenge(gpus)
    print(ANSWER_PREFIX + json.dumps(answer, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
