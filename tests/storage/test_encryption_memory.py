"""A large output is sealed and opened as it streams (jobs/encryption_at_rest.py): storing and
downloading ~200 MiB keeps the process's memory bounded by a few chunks, not the file's size.

Measured two ways while the bytes flow: the peak of Python's allocations (tracemalloc), and the
process's resident set (VmRSS, sampled at every chunk the source gives or the download yields)
above what it was when the transfer started."""

import hashlib
import resource
import tracemalloc

import pytest

from config.builders import submit_job
from jobs import artifacts

SIZE = 200 * 1024 * 1024
BOUND = 32 * 1024 * 1024  # well under the file's size: a handful of 1 MiB chunks and slack


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Stream:
    """SIZE bytes made as they are read (a counter through SHAKE-128: not compressible, never
    all in memory), with the resident set sampled at every read."""

    def __init__(self):
        self.given = 0
        self.sha256 = hashlib.sha256()
        self.start_rss = rss()
        self.peak_rss = self.start_rss

    def read(self, n=-1):
        n = SIZE - self.given if n is None or n < 0 else min(n, SIZE - self.given)
        if n <= 0:
            return b""
        data = hashlib.shake_128(self.given.to_bytes(8, "big")).digest(n)
        self.given += n
        self.sha256.update(data)
        self.peak_rss = max(self.peak_rss, rss())
        return data


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


def test_a_200_mib_output_streams_in_and_out_in_bounded_memory(api, member, pool, tenant, media):
    job = submit_job(pool, tenant)
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    source = Stream()
    tracemalloc.start()
    try:
        output = artifacts.job_output_store(job=job, attempt=1, name="big.bin", fileobj=source)
        _, store_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()

        response = api(member).get(f"/api/v1/jobs/{job.pk}/outputs/big.bin")
        assert response.status_code == 200 and response["Content-Length"] == str(SIZE)
        digest, got, start = hashlib.sha256(), 0, rss()
        download_rss = start
        for part in response.streaming_content:
            digest.update(part)
            got += len(part)
            download_rss = max(download_rss, rss())
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    maxrss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - maxrss_before

    assert output.size == SIZE == got
    assert output.sha256 == source.sha256.hexdigest() == digest.hexdigest()
    assert (media / output.file.name).stat().st_size > SIZE  # header and tags: all stored
    store_rss_growth = source.peak_rss - source.start_rss
    download_rss_growth = download_rss - start
    print(
        f"\n200 MiB output: store peak {store_peak / 2**20:.1f} MiB traced, RSS +"
        f"{store_rss_growth / 2**20:.1f} MiB; download peak {download_peak / 2**20:.1f} MiB "
        f"traced, RSS +{download_rss_growth / 2**20:.1f} MiB; ru_maxrss +"
        f"{maxrss_growth / 2**20:.1f} MiB"
    )
    assert store_peak < BOUND and download_peak < BOUND
    assert store_rss_growth < BOUND and download_rss_growth < BOUND
    assert maxrss_growth < BOUND
