"""OpenAPI descriptions of our authentication classes (imported by MadoConfig.ready)."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "mado.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (mmt_…) of a project, or a job token (mado_mtj_…) inside a running job.",
        }


class BrowserSessionScheme(OpenApiAuthenticationExtension):
    target_class = "mado.authentication.BrowserSessionAuthentication"
    name = "browserSession"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
