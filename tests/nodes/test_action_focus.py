"""Node actions move focus to what they did (issue 22): the panel an action answers with marks
its outcome — the confirmation of the node's new state, a refusal, a new secret — `autofocus`,
which htmx focuses after the swap; a live refresh of the panel moves no focus."""

import re

import pytest
from django.test import Client

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def operator_client(operator):
    client = Client()
    client.force_login(operator)
    return client


def focused(html: str) -> list[str]:
    return re.findall(r"<(\w+)[^>]*\bautofocus\b[^>]*>", html)


def test_an_action_focuses_its_confirmation(ready_node, operator_client):
    base = f"/console/nodes/{ready_node.node.pk}"
    html = operator_client.post(f"{base}/drain", {"reason": "kernel"}, **HTMX).content.decode()
    assert focused(html) == ["p"]
    assert re.search(r'id="action-done" tabindex="-1" autofocus>Done: \S+ is draining', html)

    refused = operator_client.post(f"{base}/release", {"reason": "no"}, **HTMX).content.decode()
    assert focused(refused) == ["p"] and 'class="error" role="alert"' in refused
    assert 'id="action-done"' not in refused

    rotated = operator_client.post(f"{base}/rotate-credential", {"reason": "leak"}, **HTMX)
    html = rotated.content.decode()
    assert focused(html) == ["div"] and "shown this once" in html


def test_the_live_refresh_of_the_panel_moves_no_focus(ready_node, operator_client):
    html = operator_client.get(f"/console/nodes/{ready_node.node.pk}?part=actions", **HTMX)
    assert focused(html.content.decode()) == []
    assert (
        focused(operator_client.get(f"/console/nodes/{ready_node.node.pk}").content.decode()) == []
    )
