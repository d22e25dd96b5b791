"""The launcher API (DESIGN §8): global administrators register launchers, recreate their tokens and
revoke them; a launcher, with its `launcher:execute` token, reads its config, publishes its public
keys, answers connection checks, claims and reports submissions and reports cancellations
(docs/sites-protocol.md). Launcher tokens reach
only the views here that set `allow_launcher_token` (mado.permissions refuses them everywhere else)."""
from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from mado.api.views import json_object
from mado.choices import Scope
from mado.errors import ServiceError
from mado.longpoll import MAX_WAIT_SECONDS
from mado.models import Project
from mado.services import Actor
from sites import checks, keys, launchers, submissions
from sites import serializers as body
from sites.models import Launcher


def launcher_body(launcher: Launcher) -> dict:
    project = launchers.project_of(launcher)
    token = launcher.token
    return {
        "id": launcher.pk, "name": launcher.name, "project": project.slug if project else None,
        "state": launchers.state_of(launcher),
        "created_by": launcher.created_by.username if launcher.created_by else None,
        "created_at": launcher.created_at, "last_used_at": launchers.last_used(launcher),
        "revoked_at": launcher.revoked_at, "hostname": launcher.hostname, "version": launcher.version,
        "token_prefix": token.prefix if token else None,
        "allowed_hosts": list(launcher.allowed_hosts or []),
        "sites": list(launcher.sites.values_list("target_id", flat=True).order_by("target_id")),
        # Sites that name a host outside allowed_hosts: the launcher does not log in to them.
        "sites_outside_allowed_hosts": [site.target_id for site in launchers.outside_allowed_hosts(launcher)],
    }


def _with_token(launcher: Launcher, plaintext: str, status: int = 200) -> Response:
    launcher = Launcher.objects.select_related("token__project", "created_by").get(pk=launcher.pk)
    response = Response({**launcher_body(launcher), "token": plaintext}, status=status)
    response["Cache-Control"] = "no-store"
    return response


class GlobalAdminView(APIView):
    """Launcher management: global administrators only (a session, or a token with `admin`)."""

    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN, "PATCH": Scope.ADMIN}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        launchers.require_global_admin(Actor.from_request(request))

    def launcher(self, pk) -> Launcher:
        return get_object_or_404(Launcher.objects.select_related("token__project", "created_by"), pk=pk)


class LauncherListView(GlobalAdminView):
    @extend_schema(operation_id="launchers_list", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        items = Launcher.objects.select_related("token__project", "created_by")
        return Response({"items": [launcher_body(launcher) for launcher in items], "next": None})

    @extend_schema(request=body.LauncherCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        data = json_object(request)
        slug = data.get("project")
        project = Project.objects.filter(slug=slug).first() if isinstance(slug, str) else None
        if project is None:
            raise ServiceError("Give the identifier of an existing project for the launcher's token.",
                               "invalid_project", fields={"project": ["Unknown project."]})
        launcher, plaintext = launchers.register_launcher(Actor.from_request(request), data.get("name"), project,
                                                          data.get("allowed_hosts"))
        return _with_token(launcher, plaintext, status=201)


class LauncherDetailView(GlobalAdminView):
    @extend_schema(operation_id="launchers_retrieve", responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        return Response(launcher_body(self.launcher(pk)))

    @extend_schema(operation_id="launchers_update", request=body.LauncherChangeSerializer,
                   responses=OpenApiTypes.OBJECT)
    def patch(self, request, pk):
        """Change the hosts the launcher may log in to: `{"allowed_hosts": ["*.hpc.example.ac.jp", …]}`."""
        data = json_object(request)
        unknown = sorted(set(data) - {"allowed_hosts"})
        if unknown:
            raise ServiceError(f"Only allowed_hosts changes here; not {', '.join(unknown)}.", "read_only_fields",
                               fields={name: ["Read only."] for name in unknown})
        launcher = self.launcher(pk)
        if "allowed_hosts" in data:
            if not isinstance(data["allowed_hosts"], list):
                raise ServiceError("Give allowed_hosts as a list of host name patterns.", "invalid_allowed_hosts",
                                   fields={"allowed_hosts": ["A list of patterns."]})
            launchers.set_allowed_hosts(Actor.from_request(request), launcher, data["allowed_hosts"])
        return Response(launcher_body(self.launcher(pk)))


class LauncherTokenView(GlobalAdminView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        launcher, plaintext = launchers.recreate_token(Actor.from_request(request), self.launcher(pk))
        return _with_token(launcher, plaintext)


class LauncherRevokeView(GlobalAdminView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        launcher = launchers.revoke(Actor.from_request(request), self.launcher(pk))
        launcher = Launcher.objects.select_related("token__project", "created_by").get(pk=launcher.pk)
        return Response(launcher_body(launcher))


class LauncherView(APIView):
    """Base of what a launcher calls. Only a launcher token: people and other tokens are 403."""

    allow_launcher_token = True
    required_scopes = {"GET": Scope.LAUNCHER_EXECUTE, "POST": Scope.LAUNCHER_EXECUTE}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if getattr(request.auth, "kind", None) != "launcher":
            raise exceptions.PermissionDenied("This endpoint takes a launcher token (scope launcher:execute).",
                                              code="launcher_token_required")
        self.launcher = launchers.launcher_for_token(request.auth.token)
        if self.launcher is None:
            raise exceptions.PermissionDenied("This token belongs to no active launcher; recreate its token.",
                                              code="launcher_revoked")


class LauncherConfigView(LauncherView):
    @extend_schema(operation_id="launcher_config",
                   parameters=[OpenApiParameter("wait", float, description="Seconds (0–30) to hold the answer "
                                                "while there is nothing to do.")],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request):
        raw = request.query_params.get("wait", "0")
        try:
            wait = float(raw)
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            raise exceptions.ValidationError({"wait": [f"wait is a number of seconds from 0 to {MAX_WAIT_SECONDS}."]})
        return Response(launchers.config(self.launcher, hostname=request.headers.get("X-Launcher-Hostname", ""),
                                         version=request.headers.get("X-Launcher-Version", ""), wait=wait))


class LauncherKeysView(LauncherView):
    @extend_schema(operation_id="launcher_keys_publish", request=body.LauncherKeySerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request):
        key = keys.publish_key(self.launcher, json_object(request))
        return Response({"computer": key.target_id, "user": key.user_id, "fingerprint": key.fingerprint})


class LauncherCheckCompleteView(LauncherView):
    @extend_schema(operation_id="launcher_check_complete", request=body.LauncherCheckCompleteSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request, check_id):
        check = checks.complete(self.launcher, check_id, json_object(request))
        return Response({"id": check.pk, "status": check.status})


class LauncherClaimView(LauncherView):
    @extend_schema(operation_id="launcher_submissions_claim", request=body.LauncherClaimSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request):
        body = json_object(request)
        items = submissions.launcher_claim(self.launcher, body.get("computer"), body.get("limit"))
        return _no_store(Response({"items": items}))


class LauncherReportView(LauncherView):
    @extend_schema(operation_id="launcher_submissions_report", request=body.SubmissionReportSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request):
        jobs = submissions.report(Actor.from_request(request), json_object(request), launcher=self.launcher)
        return Response({"jobs": jobs})


class LauncherCancellationReportView(LauncherView):
    @extend_schema(operation_id="launcher_cancellations_report", request=body.CancellationReportSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request):
        return Response(submissions.report_cancellation(self.launcher, json_object(request)))


def _no_store(response: Response) -> Response:
    """Claims carry job tokens: no cache keeps them."""
    response["Cache-Control"] = "no-store"
    return response
