import yaml


def test_openapi_schema_documents_the_api_and_both_token_schemes(client, db):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    paths = set(schema["paths"])
    for path in ("/api/v1/jobs/", "/api/v1/compute-leases/", "/api/v1/nodes/", "/api/v1/me/"):
        assert path in paths, path
    assert set(schema["components"]["securitySchemes"]) == {
        "personToken",
        "nodeCredential",
        "cookieAuth",
    }
