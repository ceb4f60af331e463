"""Trace variants: seeded resamples of a given trace toward mixes that are not given."""

import pytest

from scheduling.replay import VARIANTS, Pod, make_variant


def base_trace(specs=False) -> list[Pod]:
    """A small trace of every kind: CPU-only, shares, whole GPUs, multi-GPU (and, when
    ``specs``, some model-constrained pods)."""
    pods = []
    for i in range(40):
        pods.append(Pod(f"cpu-{i:03d}", 4000 + 100 * i, 8192, 0, 0))
    for i in range(100):
        pods.append(Pod(f"share-{i:03d}", 2000, 4096 + i, 1, 100 + 8 * i))
    for i in range(150):
        spec = ("T4", "G2|T4", "P100")[i % 3] if specs and i % 5 == 0 else ""
        pods.append(Pod(f"whole-{i:03d}", 8000, 16384, 1, 1000, spec))
    for i in range(10):
        pods.append(Pod(f"multi-{i:03d}", 32000, 65536, (2, 4, 8)[i % 3], 1000, "G2" * specs))
    return pods


def demand(pods, which) -> float:
    return sum(p.demand for p in pods if which(p)) / sum(p.demand for p in pods)


def is_share(pod) -> bool:
    return pod.num_gpu == 1 and pod.gpu_milli < 1000


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_is_deterministic_for_a_seed_and_renames_what_it_adds(name):
    pods = base_trace(specs=True)
    first = make_variant(pods, name, 42)
    assert make_variant(pods, name, 42) == first
    assert make_variant(pods, name, 43) != first
    assert len({p.name for p in first}) == len(first)
    assert pods == base_trace(specs=True)  # the base is not modified


def test_cpu_variants_add_cpu_only_tasks_drawn_from_the_trace():
    pods = base_trace()
    for name, share in (("cpu20", 0.20), ("cpu40", 0.40)):
        out = make_variant(pods, name, 1)
        cpu_only = [p for p in out if p.num_gpu == 0]
        assert len(cpu_only) / len(out) == pytest.approx(share, abs=0.005)
        assert [p for p in out if p.num_gpu] == [p for p in pods if p.num_gpu]
        shapes = {(p.cpu_milli, p.memory_mib) for p in pods if p.num_gpu == 0}
        assert {(p.cpu_milli, p.memory_mib) for p in cpu_only} <= shapes


def test_share_variants_replace_whole_gpu_tasks_with_the_traces_shares():
    pods = base_trace()
    assert demand(pods, is_share) < 0.3
    every = make_variant(pods, "share100", 5)
    assert all(is_share(p) for p in every if p.num_gpu)
    assert len(every) == len(pods)
    shares = {(p.cpu_milli, p.memory_mib, p.gpu_milli) for p in pods if is_share(p)}
    assert {(p.cpu_milli, p.memory_mib, p.gpu_milli) for p in every if p.num_gpu} <= shares
    sixty = make_variant(pods, "share60", 5)
    assert 0.60 <= demand(sixty, is_share) < 0.65
    assert any(p.num_gpu and not is_share(p) for p in sixty)


def test_the_multi_gpu_variant_adds_copies_of_multi_gpu_tasks():
    pods = base_trace()
    out = make_variant(pods, "multigpu35", 3)
    assert 0.35 <= demand(out, lambda p: p.num_gpu > 1) < 0.40
    assert out[: len(pods)] == pods
    multi = {(p.cpu_milli, p.num_gpu) for p in pods if p.num_gpu > 1}
    assert {(p.cpu_milli, p.num_gpu) for p in out[len(pods) :]} <= multi


def test_the_spec_variant_constrains_more_gpu_tasks_with_constraints_of_their_gpu_count():
    pods = base_trace(specs=True)
    out = make_variant(pods, "spec25", 9)
    gpu_pods = [p for p in out if p.num_gpu]
    constrained = [p for p in gpu_pods if p.gpu_spec]
    assert len(constrained) / len(gpu_pods) == pytest.approx(0.25, abs=0.01)
    seen = {(p.num_gpu, p.gpu_spec) for p in pods if p.gpu_spec}
    assert {(p.num_gpu, p.gpu_spec) for p in constrained} <= seen
    # Only the constraint changes.
    assert [(p.name, p.cpu_milli, p.num_gpu) for p in out] == [
        (p.name, p.cpu_milli, p.num_gpu) for p in pods
    ]


def test_unknown_variants_and_a_spec_variant_without_constraints_are_refused():
    with pytest.raises(ValueError, match="unknown variant"):
        make_variant(base_trace(), "cpu99", 1)
    with pytest.raises(ValueError, match="model-constrained"):
        make_variant(base_trace(), "spec25", 1)
