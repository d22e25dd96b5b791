"""The computers API (DESIGN §4/§5): thin views over computers.access and computers.services."""
from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from computers import access, kinds, services
from computers.models import DirectoryRead
from computers.serializers import (
    CheckRequestSerializer,
    ComputerInputSerializer,
    ReadRequestSerializer,
    check_body,
    computer_body,
    read_body,
)
from mado.api.views import json_object
from mado.choices import Scope
from mado.services import Actor
from workers.models import Worker


def online_worker(data: dict) -> Worker | None:
    """The worker a request names: `worker` is the worker's row id (GET /api/workers lists it as `id`);
    a bare `worker_id` name is taken only while one online worker holds it — names are labels that
    any service account may say, so an ambiguous one is refused rather than guessed."""
    pk, name = data.get("worker"), data.get("worker_id")
    if pk is None and not name:
        return None
    online = Worker.objects.online().select_related("project", "account")
    if pk is not None:
        worker = online.filter(pk=pk).first()
        if worker is None:
            raise exceptions.ValidationError({"worker": [
                _("No online worker with id %(id)s; start it and press Refresh workers.") % {"id": pk}]})
        return worker
    found = list(online.filter(worker_id=name)[:2])
    if not found:
        raise exceptions.ValidationError({"worker_id": [
            _("No online worker %(name)s; start it and press Refresh workers.") % {"name": name}]})
    if len(found) > 1:
        raise exceptions.ValidationError({"worker_id": [
            _("More than one online worker is named %(name)s (in %(projects)s); name it by id instead: send "
              "worker with the id from GET /api/workers.") % {"name": name,
                                                              "projects": ", ".join(w.project.slug for w in found)}]})
    return found[0]


class ComputerListView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.ADMIN}

    @extend_schema(operation_id="computers_list", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        targets = list(access.listed_to(request.user).select_related("last_check_worker"))
        usable_ids = set(access.usable_by(request.user).values_list("pk", flat=True))
        return Response({"items": [computer_body(request.user, t, usable=t.pk in usable_ids) for t in targets],
                         "next": None})

    @extend_schema(request=ComputerInputSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        target = services.register_computer(Actor.from_request(request), json_object(request))
        return Response(computer_body(request.user, target), status=201)


class ComputerDetailView(APIView):
    required_scopes = {"GET": Scope.READ, "PATCH": Scope.ADMIN}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        return Response(computer_body(request.user, access.detail_for(request.user, pk)))

    @extend_schema(request=ComputerInputSerializer, responses=OpenApiTypes.OBJECT)
    def patch(self, request, pk):
        target = access.managed_for(request.user, pk)
        target = services.update_computer(Actor.from_request(request), target, json_object(request))
        return Response(computer_body(request.user, target))


class CheckListView(APIView):
    required_scopes = {"POST": Scope.ADMIN}

    @extend_schema(request=CheckRequestSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, pk):
        target = access.managed_for(request.user, pk)
        serializer = CheckRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        chosen = serializer.validated_data
        if (chosen.get("worker_id") or chosen.get("worker") is not None) and not access.can_choose_worker(request.user):
            raise exceptions.PermissionDenied(_("Only global administrators can choose the worker for a check."))
        check = services.request_check(Actor.from_request(request), target, online_worker(chosen))
        return Response(check_body(check), status=201)


class CheckDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk, check_id):
        target = access.managed_for(request.user, pk)
        return Response(check_body(get_object_or_404(kinds.checks_of(target), pk=check_id)))


class ReadListView(APIView):
    required_scopes = {"POST": Scope.ADMIN}

    @extend_schema(request=ReadRequestSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, pk):
        if not access.can_choose_worker(request.user):
            raise exceptions.PermissionDenied(_("Only global administrators can read directories through a worker."))
        target = access.managed_for(request.user, pk)
        serializer = ReadRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        read = services.request_read(Actor.from_request(request), target,
                                     online_worker(serializer.validated_data),
                                     serializer.validated_data["path"])
        return Response(read_body(read), status=201)


class ReadDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk, read_id):
        if not access.can_choose_worker(request.user):
            raise exceptions.PermissionDenied(_("Only global administrators can read directories through a worker."))
        target = access.managed_for(request.user, pk)
        read = get_object_or_404(DirectoryRead.objects.select_related("requested_worker"), pk=read_id, target=target)
        return Response(read_body(read))
