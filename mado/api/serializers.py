from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from mado import access
from mado.choices import Role, Scope
from mado.models import ApiToken, Membership, Project, ServiceAccount


class ProjectCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64, help_text="Identifier: lower-case letters, digits and hyphens.")
    title = serializers.CharField(max_length=200, required=False, allow_blank=True)


class ProjectSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Project
        fields = ["id", "slug", "name", "created_at", "role"]

    def get_role(self, project) -> str | None:
        return access.project_role(self.context["request"].user, project)


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.CharField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "email", "role", "created_at"]


class ServiceAccountCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    role = serializers.ChoiceField(choices=Role.choices)
    description = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class ServiceAccountSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    disabled = serializers.BooleanField(source="is_disabled", read_only=True)

    class Meta:
        model = ServiceAccount
        fields = ["id", "name", "role", "description", "created_by", "created_at", "disabled", "disabled_at"]


class TokenRequestSerializer(serializers.Serializer):
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), allow_empty=False)
    expires_in_days = serializers.IntegerField(min_value=1, max_value=settings.TOKEN_MAX_DAYS, required=False,
                                               default=settings.TOKEN_MAX_DAYS)
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class TokenSerializer(serializers.ModelSerializer):
    holder = serializers.SerializerMethodField()
    state = serializers.CharField(read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "kind", "name", "prefix", "holder", "scopes", "created_at", "expires_at", "revoked_at",
                  "last_used_at", "state"]

    def get_holder(self, token) -> str:
        account = access.service_account_of(token.user)
        return account.name if account else token.user.username


class IssuedTokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    token = serializers.CharField(help_text="The plaintext token. Shown once; only its hash is stored.")
    prefix = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    expires_at = serializers.DateTimeField()


class TokenInfoSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=["personal", "service", "job", "launcher"])
    project = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    expires_at = serializers.DateTimeField(allow_null=True)


def issued_token_body(token: ApiToken, plaintext: str) -> dict:
    return {"id": token.pk, "token": plaintext, "prefix": token.prefix, "scopes": token.scopes,
            "expires_at": token.expires_at}


def envelope(serializer_class, name: str):
    """The OpenAPI shape of a list answer: {"items": [...], "next": cursor-or-null}."""
    from drf_spectacular.utils import inline_serializer

    return inline_serializer(name=name, fields={
        "items": serializer_class(many=True),
        "next": serializers.CharField(allow_null=True),
    })
