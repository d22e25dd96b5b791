"""The identity API (DESIGN §4). Views are thin: parse, look up through mado.access, call services."""
from __future__ import annotations

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from mado import access, services
from mado.api import serializers as s
from mado.choices import Role, Scope
from mado.models import ApiToken, Project, ServiceAccount

NO_STORE = {"Cache-Control": "no-store"}  # answers that carry a plaintext token are never cached


def project_for(request, key: str, minimum: str = Role.VIEWER) -> Project:
    """The project named in the path, if the caller may see it with at least `minimum`; the token, if
    any, must belong to it. Projects the caller cannot see are 404, never 403, so names do not leak."""
    project = access.project_for_user(request.user, key, Role.VIEWER)
    principal = request.auth
    if principal is not None and principal.project.pk != project.pk:
        raise exceptions.PermissionDenied(
            f"This token belongs to project {principal.project.slug}; use a token of project {project.slug}.",
            code="token_project_mismatch",
        )
    if minimum != Role.VIEWER:
        project = access.project_for_user(request.user, key, minimum)
    return project


def json_object(request) -> dict:
    """The request body, which every write endpoint takes as one JSON object."""
    if not isinstance(request.data, dict):
        raise exceptions.ValidationError("Send a JSON object as the request body.")
    return request.data


def token_scopes(request) -> frozenset[str] | None:
    return request.auth.scopes if request.auth is not None else None


def items(data) -> dict:
    return {"items": data, "next": None}


class HealthView(APIView):
    public = True
    permission_classes = [AllowAny]
    authentication_classes = []

    @extend_schema(responses={200: {"type": "object", "properties": {"status": {"type": "string"},
                                                                     "version": {"type": "string"}}}})
    def get(self, request):
        return Response({"status": "ok", "version": settings.VERSION})


class AuthTokenView(APIView):
    required_scopes = {"GET": None}

    @extend_schema(responses=s.TokenInfoSerializer)
    def get(self, request):
        principal = request.auth
        if principal is None:
            raise exceptions.NotAuthenticated("This describes the API token you send; send one as 'Authorization: Bearer <token>'.")
        token = principal.token
        return Response({
            "id": token.pk,
            "kind": principal.kind,
            "project": principal.project.slug,
            "scopes": sorted(principal.scopes),
            "expires_at": getattr(token, "expires_at", None),
        })


class ProjectListView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}

    @extend_schema(responses=s.envelope(s.ProjectSerializer, "ProjectList"))
    def get(self, request):
        projects = access.projects_visible_to(request.user)
        if request.auth is not None:
            projects = projects.filter(pk=request.auth.project.pk)
        return Response(items(s.ProjectSerializer(projects, many=True, context={"request": request}).data))

    @extend_schema(request=s.ProjectCreateSerializer, responses={201: s.ProjectSerializer})
    def post(self, request):
        data = _valid(s.ProjectCreateSerializer, request)
        project = services.create_project(services.Actor.from_request(request), slug=data["name"], name=data.get("title", ""))
        return Response(s.ProjectSerializer(project, context={"request": request}).data, status=201)


class MemberView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}

    @extend_schema(responses=s.envelope(s.MembershipSerializer, "MemberList"))
    def get(self, request, project):
        project = project_for(request, project, Role.ADMIN)
        memberships = project.memberships.select_related("user").order_by("user__username")
        return Response(items(s.MembershipSerializer(memberships, many=True).data))

    @extend_schema(request=s.MemberSerializer, responses={201: s.MemberSerializer})
    def post(self, request, project):
        project = project_for(request, project, Role.ADMIN)
        data = _valid(s.MemberSerializer, request)
        membership = services.set_membership(services.Actor.from_request(request), project, **data)
        return Response({"username": membership.user.username, "role": membership.role}, status=201)


class MemberDetailView(APIView):
    required_scopes = {"DELETE": Scope.ADMIN}

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, project, username):
        project = project_for(request, project, Role.ADMIN)
        services.remove_membership(services.Actor.from_request(request), project, username=username)
        return Response(status=204)


class ServiceAccountListView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}

    @extend_schema(responses=s.envelope(s.ServiceAccountSerializer, "ServiceAccountList"))
    def get(self, request, project):
        project = project_for(request, project, Role.ADMIN)
        accounts = project.service_accounts.select_related("created_by")
        return Response(items(s.ServiceAccountSerializer(accounts, many=True).data))

    @extend_schema(request=s.ServiceAccountCreateSerializer, responses={201: s.ServiceAccountSerializer})
    def post(self, request, project):
        project = project_for(request, project, Role.ADMIN)
        data = _valid(s.ServiceAccountCreateSerializer, request)
        account = services.create_service_account(services.Actor.from_request(request), project, **data)
        return Response(s.ServiceAccountSerializer(account).data, status=201)


def _service_account(request, project_key: str, account_id: int) -> ServiceAccount:
    project = project_for(request, project_key, Role.ADMIN)
    return get_object_or_404(ServiceAccount.objects.select_related("project", "user"), pk=account_id, project=project)


class ServiceAccountTokenView(APIView):
    required_scopes = {"POST": Scope.ADMIN}
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "token_issue"

    @extend_schema(request=s.TokenRequestSerializer, responses={201: s.IssuedTokenSerializer})
    def post(self, request, project, account_id):
        account = _service_account(request, project, account_id)
        data = _valid(s.TokenRequestSerializer, request)
        token, plaintext = services.issue_service_account_token(
            services.Actor.from_request(request), account, **data
        )
        return Response(s.issued_token_body(token, plaintext), status=201, headers=NO_STORE)


class ServiceAccountDisableView(APIView):
    required_scopes = {"POST": Scope.ADMIN}

    @extend_schema(request=None, responses=s.ServiceAccountSerializer)
    def post(self, request, project, account_id):
        account = _service_account(request, project, account_id)
        account = services.disable_service_account(services.Actor.from_request(request), account)
        return Response(s.ServiceAccountSerializer(account).data)


class ProjectTokenView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "token_issue"

    def get_throttles(self):
        return super().get_throttles() if self.request.method == "POST" else []

    @extend_schema(responses=s.envelope(s.TokenSerializer, "TokenList"))
    def get(self, request, project):
        project = project_for(request, project)
        return Response(items(s.TokenSerializer(access.tokens_visible_to(request.user, project), many=True).data))

    @extend_schema(request=s.TokenRequestSerializer, responses={201: s.IssuedTokenSerializer})
    def post(self, request, project):
        project = project_for(request, project, Role.MEMBER)
        data = _valid(s.TokenRequestSerializer, request)
        token, plaintext = services.issue_personal_token(
            services.Actor.from_request(request), project, ceiling=token_scopes(request), **data
        )
        return Response(s.issued_token_body(token, plaintext), status=201, headers=NO_STORE)


class TokenRevokeView(APIView):
    required_scopes = {"POST": Scope.ADMIN}

    @extend_schema(request=None, responses=s.TokenSerializer)
    def post(self, request, token_id):
        projects = access.projects_visible_to(request.user)
        if request.auth is not None:
            projects = projects.filter(pk=request.auth.project.pk)
        token = ApiToken.objects.filter(pk=token_id, project__in=projects).select_related("project", "user").first()
        if token is None or not access.can_revoke(request.user, token):
            raise exceptions.NotFound("No token with this id that you may revoke.")
        token = services.revoke_token(services.Actor.from_request(request), token)
        return Response(s.TokenSerializer(token).data)


def _valid(serializer_class, request) -> dict:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
