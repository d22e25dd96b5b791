"""The sites API for people (DESIGN §4/§8): add and change sites, job shell versions, My settings.
Thin views over sites.services; who sees which fields is decided here from computers.access."""
from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from computers import access
from computers.choices import Kind
from computers.models import ComputeTarget
from mado.api.views import json_object
from mado.choices import Scope
from mado.errors import ServiceError
from mado.services import Actor
from sites import known_hosts as kh
from sites import allowed_hosts, checks, keys, services, shells
from sites import serializers as body
from sites.choices import SubmissionMethod
from sites.models import JobShell, SiteSettings

USER_SETTINGS_FIELDS = ["submission", "account", "template", "working_dir", "runner_python", "runner_api_url",
                        "variables", "max_active_submissions", "queue_timeout_seconds"]
CONNECTION_FIELDS = ["host", "port", "ssh_user", "jump_hosts", "known_hosts"]




def _site(user, pk: int) -> ComputeTarget:
    """A site the caller may use or manage; others are 404 so their settings do not leak."""
    target = access.detail_for(user, pk)
    if target.kind != Kind.SITE:
        raise Http404("No site with this id; this computer is not a site.")
    return target


def fingerprints(text: str) -> list[dict]:
    try:
        return [key.display() for key in kh.parse(text or "")]
    except kh.KnownHostsError:
        return []


def site_body(user, target: ComputeTarget) -> dict:
    site = SiteSettings.objects.select_related("launcher").get(target=target)
    manager = access.can_manage(user, target)
    usable = access.can_use(user, target)
    shell = services.current_job_shell(target)
    mine = services.my_settings(user, target)
    body = {
        "id": target.pk, "name": target.name, "kind": target.kind, "owner": target.owner.username,
        "visibility": target.visibility, "enabled": target.enabled,
        "state": "enabled" if target.enabled else "disabled", "usable": usable, "manageable": manager,
        "runtimes": target.runtimes, "cpu_arch": target.cpu_arch,
        **{name: getattr(site, name) for name in USER_SETTINGS_FIELDS},
        "job_shell": {"version": shell.version, "sha256": shell.sha256} if shell else None,
        "runs_under_own_account": site.runs_under_own_account,
        "my_settings_required": site.uses_personal_accounts,
        "my_settings_saved": mine is not None,
        "can_run_jobs": usable and _can_submit(user, target),
        "keys": keys.keys_for_details(user, target),
        "checks": checks.latest_checks(user, target),
    }
    if manager:
        body.update({name: getattr(site, name) for name in CONNECTION_FIELDS})
        body["launcher"] = {"id": site.launcher.pk, "name": site.launcher.name} if site.launcher_id else None
        body["known_hosts_fingerprints"] = fingerprints(site.known_hosts)
        if site.submission == SubmissionMethod.AUTOMATIC and site.launcher_id:
            # False: the launcher's allowed hosts leave out this site's host or a jump host, so it does not log in.
            body["launcher_may_log_in"] = allowed_hosts.site_allowed(site)
    return body


def _can_submit(user, target) -> bool:
    try:
        services.check_can_submit(user, target)
    except ServiceError:
        return False
    return True


def shell_body(shell: JobShell, *, content: bool = False) -> dict:
    body = {"version": shell.version, "sha256": shell.sha256, "bytes": len(shell.content.encode("utf-8")),
            "created_by": shell.created_by.username if shell.created_by else None, "created_at": shell.created_at}
    if content:
        body["content"] = shell.content
    return body


def my_settings_body(target, settings) -> dict:
    if settings is None:
        return {"computer": target.pk, "saved": False, "account_name": "", "working_dir": "", "variables": {}}
    return {"computer": target.pk, "saved": True, "account_name": settings.account_name,
            "working_dir": settings.working_dir, "variables": settings.variables, "updated_at": settings.updated_at}


class TemplateListView(APIView):
    @extend_schema(operation_id="site_templates_list", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"items": shells.builtin_templates(), "next": None})


class SiteListView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}

    @extend_schema(operation_id="sites_list", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        """Sites the caller can use or manage."""
        targets = access.listed_to(request.user).filter(kind=Kind.SITE)
        visible = [t for t in targets if access.can_manage(request.user, t) or access.can_use(request.user, t)]
        return Response({"items": [site_body(request.user, t) for t in visible], "next": None})

    @extend_schema(request=body.SiteCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        target = services.create_site(Actor.from_request(request), json_object(request))
        return Response(site_body(request.user, target), status=201)


class SiteDetailView(APIView):
    required_scopes = {"GET": Scope.READ, "PATCH": Scope.ADMIN}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        return Response(site_body(request.user, _site(request.user, pk)))

    @extend_schema(request=body.SiteChangeSerializer, responses=OpenApiTypes.OBJECT)
    def patch(self, request, pk):
        target = _site(request.user, pk)
        target = services.update_site(Actor.from_request(request), target, json_object(request))
        return Response(site_body(request.user, target))


class JobShellListView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}

    @extend_schema(operation_id="site_job_shells_list", responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        """Everyone who may use the site reads its job shells: they run under their Jobs."""
        target = _site(request.user, pk)
        items = JobShell.objects.filter(target=target).select_related("created_by").order_by("-version")
        return Response({"items": [shell_body(s) for s in items], "next": None})

    @extend_schema(request=body.JobShellSaveSerializer,
                   responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT})
    def post(self, request, pk):
        target = _site(request.user, pk)
        shell, created = services.save_job_shell(Actor.from_request(request), target,
                                                 json_object(request).get("content"))
        return Response({**shell_body(shell, content=True), "created": created}, status=201 if created else 200)


class JobShellDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk, version):
        target = _site(request.user, pk)
        shell = JobShell.objects.filter(target=target, version=version).select_related("created_by").first()
        if shell is None:
            raise Http404(f"Version {version} of this job shell does not exist.")
        return Response(shell_body(shell, content=True))


class MySettingsView(APIView):
    required_scopes = {"GET": Scope.READ, "PUT": Scope.JOBS_WRITE}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        target = _site(request.user, pk)
        return Response(my_settings_body(target, services.my_settings(request.user, target)))

    @extend_schema(request=body.MySettingsSerializer, responses=OpenApiTypes.OBJECT)
    def put(self, request, pk):
        services.refuse_service_account(request.user)  # the same answer whatever the computer
        target = _site(request.user, pk)
        settings = services.save_my_settings(Actor.from_request(request), target, json_object(request))
        return Response(my_settings_body(target, settings))


class SiteCheckView(APIView):
    """Check connection: the launcher logs in as the shared account (`mine: false`, owners and global
    administrators) or as the caller's own account (`mine: true`, after My settings) and runs `true`."""

    required_scopes = {"POST": Scope.JOBS_WRITE}

    @extend_schema(request=body.MineSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, pk):
        target = _site(request.user, pk)
        mine = json_object(request).get("mine", False)
        if not isinstance(mine, bool):
            raise ServiceError("mine is true (check your own account) or false (the shared account).",
                               "invalid", fields={"mine": ["true or false."]})
        check = checks.request_site_check(Actor.from_request(request), target, mine=mine)
        return Response(checks.check_body(check), status=201)


class SiteCheckDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk, check_id):
        target = _site(request.user, pk)
        found = checks.latest_checks(request.user, target)
        for check in found.values():
            if check and check["id"] == check_id:
                return Response(check)
        raise Http404("No such check of yours on this site.")


class SiteKeyRecreateView(APIView):
    """Recreate a key: the launcher makes a new one on its next poll and publishes it in place of the
    old (`mine: true` your own key on an own-account site; `false` the shared key, owners only)."""

    required_scopes = {"POST": Scope.JOBS_WRITE}

    @extend_schema(request=body.MineSerializer, responses={202: OpenApiTypes.OBJECT})
    def post(self, request, pk):
        target = _site(request.user, pk)
        mine = json_object(request).get("mine", False)
        if not isinstance(mine, bool):
            raise ServiceError("mine is true (your own key) or false (the shared account's key).",
                               "invalid", fields={"mine": ["true or false."]})
        keys.request_recreate(Actor.from_request(request), target, mine=mine)
        return Response({"keys": keys.keys_for_details(request.user, target)}, status=202)
