"""A node's reasons in words (the console's node pages): the reason catalogue's label
(pools/reasons.py) and the event's message made into a sentence, in place of the raw code."""

from __future__ import annotations

import re

from django import template

from pools.reasons import Reason

register = template.Library()

UNREACHABLE = re.compile(r"no heartbeat since (?P<since>[\d:]+); (?P<n>\d+) committed lease")


def reason_sentence(code: str | None, message: str | None = "") -> str:
    """'node_unreachable', 'no heartbeat since 10:02:03; 0 committed lease(s) now uncertain' →
    'Heartbeats missed: nothing heard since 10:02:03. No running lease was affected.'"""
    if not code:
        return ""
    try:
        label = Reason(code).label
    except ValueError:
        label = code.replace("_", " ").capitalize()
    message = (message or "").strip()
    if code == Reason.NODE_UNREACHABLE and (m := UNREACHABLE.match(message)):
        n = int(m["n"])
        leases = (
            "No running lease was affected."
            if n == 0
            else f"{n} running lease{'s are' if n > 1 else ' is'} now uncertain "
            "until the node is heard from again or its deadline passes."
        )
        return f"{label}: nothing heard since {m['since']}. {leases}"
    if not message or message.lower() == label.lower():
        return f"{label}."
    return f"{label}: {message[0].upper()}{message[1:]}{'' if message[-1] in '.!?' else '.'}"


@register.filter
def why(node) -> str:
    """The sentence of a node's latest event (nodes_with_latest_event's annotations)."""
    return reason_sentence(getattr(node, "latest_reason", ""), getattr(node, "latest_message", ""))


@register.filter
def reason_label(code: str) -> str:
    """The catalogue's label of a reason code (the code itself when it is not in it)."""
    try:
        return Reason(code).label
    except ValueError:
        return code
