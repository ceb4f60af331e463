"""What each GPU sharing class isolates, in words for the people who choose one: the jobs API
(`gpu_sharing_note`), the shapes API, the console's job page, submit form and shapes list.
docs/scheduler.md "What each sharing class isolates" is the long form of the same table."""

from __future__ import annotations

from .choices import GpuSharingClass

C = GpuSharingClass
GPU_SHARING_NOTES = {
    C.EXCLUSIVE: "Whole GPUs, used by this job alone.",
    C.MIG: "A MIG slice: its compute and memory are fenced off by the GPU's hardware.",
    C.MPS: (
        "An MPS share: the node's agent caps this job's CUDA client at its share of the GPU's "
        "compute and memory (an allocation past it fails), but the jobs on the GPU share one "
        "MPS server: a fatal GPU fault of one ends the others, and the caps are set in the "
        "job's environment, so a job that changes them escapes them."
    ),
    C.TIMESLICE: (
        "Time-sliced: shares the whole GPU with other jobs, with no memory or compute "
        "isolation. Another job can use all of the GPU's memory; no amount of it is reserved."
    ),
}


def gpu_sharing_note(resources: dict | None) -> str:
    """What a request's (a job's, a shape's) GPUs isolate, in words; "" without GPUs. A
    time-slice or MPS share of a whole GPU (gpu_milli 1000 or none) holds it alone."""
    resources = resources or {}
    sharing = resources.get("gpu_sharing_class") or C.NONE
    if sharing == C.NONE or not int(resources.get("gpu_count") or 0):
        return ""
    if sharing in (C.TIMESLICE, C.MPS) and int(resources.get("gpu_milli") or 1000) >= 1000:
        return GPU_SHARING_NOTES[C.EXCLUSIVE]
    return GPU_SHARING_NOTES.get(sharing, "")
