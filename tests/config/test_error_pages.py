"""The console's styled 403 and 404 pages (the site's header and navigation), the API's JSON
error body under /api/ still, and the favicon (issue 22)."""

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.test import RequestFactory

from config import views


def test_a_missing_page_is_the_styled_404_with_navigation(client, member):
    client.force_login(member)
    response = client.get("/console/no-such-page")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'aria-label="Console"' in html  # base.html's navigation
    assert 'aria-label="Where to go from here"' in html and 'href="/console/jobs"' in html
    assert "/console/no-such-page" in html
    # another tenant's job reads the same as one that does not exist
    assert client.get("/console/jobs/999999").status_code == 404


def test_anonymous_people_get_the_404_with_a_sign_in_link(client, db):
    response = client.get("/nowhere")
    assert response.status_code == 404
    assert "/accounts/login/?next=/nowhere" in response.content.decode()


def test_the_operations_pages_answer_a_tenant_with_the_styled_403(client, member):
    client.force_login(member)
    response = client.get("/console/ops/capacity")
    assert response.status_code == 403
    html = response.content.decode()
    assert "You may not open this page" in html and "Only operators" in html
    assert 'aria-label="Console"' in html


def test_the_api_keeps_its_json_errors(client, member):
    client.force_login(member)
    response = client.get("/api/v1/no-such-route")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_found"
    for handler, exc, status, code in (
        (views.page_not_found, Http404(), 404, "not_found"),
        (views.permission_denied, PermissionDenied(), 403, "permission_denied"),
    ):
        response = handler(RequestFactory().get("/api/v1/jobs/1"), exc)
        assert response.status_code == status and response["Content-Type"] == "application/json"
        assert b'"code": "%s"' % code.encode() in response.content


def test_the_favicon_is_served_and_linked(client, member):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    assert b"<svg" in response.content
    client.force_login(member)
    assert 'rel="icon" href="/static/favicon.svg"' in client.get("/").content.decode()
