"""OpenAPI (drf-spectacular) descriptions of the two bearer-token schemes."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "pools.authentication.ApiTokenAuthentication"
    name = "personToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A person's API token (cpu_…), with read/write/operate scopes.",
        }


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "nodes.authentication.NodeCredentialAuthentication"
    name = "nodeCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A node's own credential (cpn_…), valid only for that node.",
        }
