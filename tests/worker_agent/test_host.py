"""What the host says of itself beside its inventory: the CPU features a job may require."""

from pathlib import Path

from worker_agent.host import Host, cpu_features

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse4_2 avx avx2 fma aes avx512f avx512_bf16 amx_tile hypervisor ssbd
processor\t: 1
flags\t\t: fpu
"""
ARM = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 sve sve2
CPU implementer\t: 0x41
"""


def test_the_x86_flags_a_job_may_require_are_reported_sorted(tmp_path: Path):
    (tmp_path / "cpuinfo").write_text(X86)
    features = cpu_features(tmp_path / "cpuinfo")
    assert features == ["aes", "amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "fma", "sse4_2"]


def test_arm_features_come_from_their_own_line(tmp_path: Path):
    (tmp_path / "cpuinfo").write_text(ARM)
    assert cpu_features(tmp_path / "cpuinfo") == ["aes", "asimd", "sve", "sve2"]


def test_a_host_whose_kernel_does_not_say_reports_none(tmp_path: Path):
    assert cpu_features(tmp_path / "absent") == []
    (tmp_path / "cpuinfo").write_text("processor\t: 0\n")
    assert cpu_features(tmp_path / "cpuinfo") == []


def test_enrollment_carries_this_hosts_features_in_the_form_the_control_plane_takes():
    import re

    features = Host().describe()["features"]
    assert features == cpu_features()
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,39}", name) for name in features)
