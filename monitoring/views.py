"""GET /metrics: the Prometheus text format, for a global administrator's token with metrics:read (or
their signed-in browser) and for the addresses in METRICS_ALLOWED_ADDRESSES."""
from __future__ import annotations

from django.http import HttpResponse
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from prometheus_client.exposition import choose_encoder
from rest_framework import exceptions
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.views import APIView

from mado import access as identity_access
from mado.choices import Scope
from mado.permissions import ScopePermission
from monitoring import access
from monitoring.collector import REGISTRY


class GlobalAdminRequired(exceptions.PermissionDenied):
    default_code = "global_admin_required"


class MetricsCredentialsRequired(exceptions.AuthenticationFailed):
    """401 with what a scraper sends (the API's generic NotAuthenticated sentence speaks of signing in)."""

    default_code = "not_authenticated"


class MetricsPermission(ScopePermission):
    def has_permission(self, request, view):
        if access.from_allowed_address(request):
            return True
        try:
            super().has_permission(request, view)  # launcher and job tokens, and the scope, refused as anywhere
        except exceptions.NotAuthenticated:
            raise MetricsCredentialsRequired(_(
                "Send a token with the metrics:read scope as 'Authorization: Bearer <token>', or scrape from an "
                "address listed in MADO_METRICS_ALLOWED_ADDRESSES.")) from None
        if not identity_access.is_global_admin(request.user):
            raise GlobalAdminRequired(_(
                "Only a global administrator reads /metrics: use a global administrator's own token with the "
                "metrics:read scope, or scrape from an address listed in MADO_METRICS_ALLOWED_ADDRESSES."))
        return True


class AnyAccept(BaseContentNegotiation):
    """Prometheus asks for text/plain or OpenMetrics, which the view writes itself (choose_encoder); the
    refusals stay JSON whatever the Accept header, never 406."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class MetricsView(APIView):
    permission_classes = [MetricsPermission]
    content_negotiation_class = AnyAccept
    required_scopes = {"GET": Scope.METRICS_READ, "HEAD": Scope.METRICS_READ}

    def get(self, request):
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return HttpResponse(encoder(REGISTRY), content_type=content_type)


_metrics_view = MetricsView.as_view()


@csrf_exempt
def metrics(request):
    """The URL's view. A plain function to the URL resolver, so drf-spectacular does not count /metrics
    among the API's paths: the schema's common prefix (/api/), and with it every operationId, stays as it
    is. docs/monitoring.md describes the endpoint."""
    return _metrics_view(request)
