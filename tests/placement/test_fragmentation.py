"""The FGD fragmentation measure and the typical workload it is measured against."""

import pytest

from placement.fragmentation import Shape, Workload
from placement.types import Request

from .factories import WORKLOAD


def test_fragmentation_counts_idle_gpu_typical_requests_cannot_use():
    # Two GPUs with 300 free each: the 500-milli share cannot use them, nor a whole GPU.
    assert WORKLOAD.fragmentation("A100", 64000, 0, (300, 300)) == pytest.approx(600)
    # One full GPU: usable by both typical requests, no fragment.
    assert WORKLOAD.fragmentation("A100", 64000, 0, (1000, 0)) == 0
    # 700 free: the share fits (no fragment), the whole GPU does not (700 fragment).
    assert WORKLOAD.fragmentation("A100", 64000, 0, (700,)) == pytest.approx(350)
    # Not enough CPU for either: all idle GPU is stranded.
    assert WORKLOAD.fragmentation("A100", 1000, 0, (1000, 1000)) == pytest.approx(2000)


def test_fragmentation_respects_model_constraints_and_memory():
    constrained = Workload((Shape(1000, 1000, 1, frozenset({"H100"}), memory_mib=4096),), (1.0,))
    assert constrained.fragmentation("A100", 8000, 8192, (1000,)) == 1000
    assert constrained.fragmentation("H100", 8000, 8192, (1000,)) == 0
    assert constrained.fragmentation("H100", 8000, 1024, (1000,)) == 1000


def test_typical_shapes_keep_the_most_frequent_up_to_coverage():
    counts = {Shape(1, 100, 1): 90, Shape(2, 200, 1): 6, Shape(3, 300, 1): 4}
    workload = Workload.from_counts(counts, coverage=0.95)
    assert workload.shapes == (Shape(1, 100, 1), Shape(2, 200, 1))
    assert sum(workload.probabilities) == pytest.approx(1.0)


def test_workload_from_requests_measures_the_mix_as_the_default_does():
    # Shapes apart from memory, each with the mean memory of its requests (the default's
    # memory-coupled measure needs a typical memory per shape, not one shape per memory size).
    share = dict(cpu_millicores=1000, gpu_count=1, gpu_milli=250, sharing="timeslice")
    requests = [Request(memory_mib=512, **share)] * 2 + [
        Request(memory_mib=2048, **share),
        Request(cpu_millicores=2000),
    ]
    workload = Workload.from_requests(requests)
    assert workload.shapes == (Shape(1000, 250, 1, frozenset(), 1024), Shape(2000, 0, 0))
    assert workload.probabilities == (0.75, 0.25)
