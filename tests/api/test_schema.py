"""The OpenAPI 3 schema is generated without a single warning, and names the contract's paths."""

from django.contrib.staticfiles import finders
from django.core.management import call_command


def test_the_schema_has_no_warnings_and_the_contract_paths(tmp_path, db):
    target = tmp_path / "schema.yml"
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(target))
    schema = target.read_text()
    for path in (
        "/api/v1/compute-pools/",
        "/api/v1/compute-pools/{id}/shapes/",
        "/api/v1/compute-leases/",
        "/api/v1/compute-leases/{id}/commit/",
        "/api/v1/compute-leases/{id}/renew/",
        "/api/v1/compute-leases/{id}/release/",
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/jobs/{id}/events/",
        "/api/v1/jobs/{id}/explain/",
    ):
        assert f"  {path}:" in schema, path


def test_the_docs_page_serves_its_assets_itself(client, db):
    page = client.get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page
    assert "cdn" not in page.lower() and "https://" not in page
    # collected and served with the project's own static files
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
