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
