"""One error body everywhere under /api/: {"error": "<what to fix>", "code": "<snake_case>", "fields": {...}}."""
from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from mado.errors import ServiceError

_DEFAULT_CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    415: "unsupported_media_type",
    429: "throttled",
}


def error_body(error: str, code: str, fields: dict | None = None) -> dict:
    body = {"error": error, "code": code}
    if fields:
        body["fields"] = fields
    return body


def _flatten_fields(detail) -> dict:
    if isinstance(detail, dict):
        return {str(key): _messages(value) for key, value in detail.items()}
    return {}


def _messages(value) -> list[str]:
    if isinstance(value, dict):
        return [f"{k}: {m}" for k, v in value.items() for m in _messages(v)]
    if isinstance(value, (list, tuple)):
        return [m for item in value for m in _messages(item)]
    return [str(value)]


def _validation_error(exc: exceptions.ValidationError) -> dict:
    detail = exc.detail
    fields = _flatten_fields(detail)
    non_field = fields.pop("non_field_errors", None)
    if fields:
        summary = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in fields.items())
        message = f"Fix these fields: {summary}"
        if non_field:
            message = " ".join(non_field) + " " + message
    else:
        message = " ".join(non_field or _messages(detail)) or "The request is not valid."
    return error_body(message, "invalid", fields)


def api_exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        set_rollback()
        return Response(error_body(exc.message, exc.code, exc.fields), status=exc.status)
    if isinstance(exc, Http404):
        message = str(exc)
        if not message or message.endswith("matches the given query."):
            message = "Nothing with this id that you can see; check the id in the path."
        exc = exceptions.NotFound(message)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None, code="role_required")
    if not isinstance(exc, exceptions.APIException):
        return None
    set_rollback()
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))
    if isinstance(exc, exceptions.ValidationError):
        body = _validation_error(exc)
    else:
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) and codes != "error" else _DEFAULT_CODES.get(exc.status_code, "error")
        body = error_body(_sentence(exc), code)
    return Response(body, status=exc.status_code, headers=headers)


def _sentence(exc: exceptions.APIException) -> str:
    if isinstance(exc, exceptions.MethodNotAllowed):
        return f"{exc.detail} Check the API reference at /api/docs/ for the methods this path accepts."
    if isinstance(exc, exceptions.Throttled):
        wait = int(exc.wait or 1)
        return f"Too many requests; retry in {wait} seconds."
    if isinstance(exc, exceptions.NotAuthenticated):
        return "Sign in, or send an API token as 'Authorization: Bearer <token>'."
    return " ".join(_messages(exc.detail))


@csrf_exempt
def json_not_found(request, exception=None):
    return JsonResponse(error_body(f"No API endpoint at {request.path}; see /api/docs/ for the paths.", "not_found"),
                        status=status.HTTP_404_NOT_FOUND)


def json_server_error(request):
    return JsonResponse(error_body("The server failed to handle this request; it has been logged. Try again, and "
                                   "tell the operator if it persists.", "server_error"), status=500)


def json_bad_request(request, exception=None):
    return JsonResponse(error_body("The request could not be read (too large, or malformed); send a smaller or "
                                   "well-formed body.", "bad_request"), status=400)
