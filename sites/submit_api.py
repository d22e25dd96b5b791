"""`mado-tracking submit` (docs/sites-protocol.md "Manual submission"): a person's own API token
claims their `waiting_manual` Jobs on a manual site and reports how submitting them went. Job tokens
are refused (a Job's code never submits Jobs). Thin views over sites.submissions."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from mado.api.views import json_object
from mado.choices import Scope
from mado.services import Actor
from computers import access
from computers.choices import Kind
from sites import serializers as body
from sites import submissions


def _site(user, pk: int):
    """A site the caller may use or manage; others are 404 so their settings do not leak."""
    target = access.detail_for(user, pk)
    if target.kind != Kind.SITE:
        raise exceptions.NotFound("No site with this id; this computer is not a site.")
    return target


class SubmitView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.JOBS_WRITE}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.auth is not None and request.auth.is_job:
            raise exceptions.PermissionDenied("Submitting Jobs takes your own API token with jobs:write, not a job "
                                              "token.", code="job_token_forbidden")

    def project(self):
        """Jobs of the token's project only: write tokens are issued per project. None for a browser
        session: sites.submissions then takes the projects where the caller may write Jobs now."""
        return self.request.auth.project if self.request.auth is not None else None


class SubmitSummaryView(SubmitView):
    @extend_schema(operation_id="site_submit_summary",
                   parameters=[OpenApiParameter("all", int, description="1: count everyone's waiting Jobs too "
                                                "(the computer's owner).")],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        everyone = request.query_params.get("all", "0")
        if everyone not in ("0", "1", "true", "false"):
            raise exceptions.ValidationError({"all": ["all is 0 or 1."]})
        return Response(submissions.manual_summary(request.user, _site(request.user, pk), self.project(),
                                                   everyone=everyone in ("1", "true")))


class SubmitClaimView(SubmitView):
    @extend_schema(operation_id="site_submissions_claim", request=body.ManualClaimSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        items = submissions.manual_claim(Actor.from_request(request), _site(request.user, pk), self.project(),
                                         json_object(request))
        response = Response({"items": items})
        response["Cache-Control"] = "no-store"  # job tokens
        return response


class SubmitReportView(SubmitView):
    @extend_schema(operation_id="site_submissions_report", request=body.SubmissionReportSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        target = _site(request.user, pk)
        jobs = submissions.report(Actor.from_request(request), json_object(request), submitted_by=request.user,
                                  target=target)
        return Response({"jobs": jobs})
