"""Small template filters of the console: stored ISO times as datetimes, codes as words."""

from django import template
from django.utils.dateparse import parse_datetime

register = template.Library()


@register.filter
def iso(value):
    """An ISO 8601 string (a JSON field's time, e.g. a forecast's window) as a datetime."""
    if not isinstance(value, str):
        return value
    return parse_datetime(value)


@register.filter
def words(code):
    """A reason or field code as words: "node_not_schedulable(draining)" → "node not
    schedulable (draining)"."""
    return str(code).replace("_", " ").replace("(", " (")


@register.filter
def gpu_sharing_note(request):
    """What a job's or a shape's GPUs isolate, in words ("" without GPUs): a request dict (a
    job's `resources`) or a shape (pools/gpu_sharing.py)."""
    from pools.gpu_sharing import gpu_sharing_note as note

    as_request = getattr(request, "as_request", None)
    return note(as_request() if callable(as_request) else request)


@register.filter
def sharing_class_note(sharing_class):
    """A sharing class's note for the submit form's choice ("" for none)."""
    from pools.gpu_sharing import GPU_SHARING_NOTES

    return GPU_SHARING_NOTES.get(sharing_class, "")
