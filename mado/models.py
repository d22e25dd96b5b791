"""Identity: projects, memberships, service accounts, API tokens, job tokens and the audit trail."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from mado.choices import ROLE_RANK, Role, TokenKind


class Project(models.Model):
    slug = models.SlugField(_("identifier"), max_length=64, unique=True)
    name = models.CharField(_("name"), max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(_("role"), max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="membership_unique_user")]
        ordering = ["project", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ServiceAccount(models.Model):
    """A non-human principal of one project. Its User row exists so tokens, audit and ownership
    treat it like anyone else; the unusable password keeps it out of the login page."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="service_accounts")
    name = models.CharField(_("name"), max_length=64)
    description = models.CharField(_("description"), max_length=500, blank=True)
    role = models.CharField(_("role"), max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="created_service_accounts"
    )
    created_at = models.DateTimeField(default=timezone.now)
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(Lower("name"), "project", name="service_account_unique_name_ci"),
        ]
        ordering = ["project", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.project.slug})"

    @property
    def is_disabled(self) -> bool:
        return self.disabled_at is not None


class TokenQuerySet(models.QuerySet):
    def usable(self):
        return self.filter(revoked_at__isnull=True, expires_at__gt=timezone.now())


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_tokens")
    kind = models.CharField(max_length=16, choices=TokenKind.choices)
    name = models.CharField(_("name"), max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text=_("The first characters, for recognising the token."))
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = TokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        try:
            holder = self.user.service_account.name
        except (ObjectDoesNotExist, AttributeError):
            holder = self.user.username
        return f"{self.prefix}… ({self.kind}, {holder})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def state(self) -> str:
        if self.is_revoked:
            return "revoked"
        if self.is_expired:
            return "expired"
        if self.holder_disabled:
            return "disabled"
        return "active"

    @property
    def holder_disabled(self) -> bool:
        """A disabled service account's tokens stop working (authentication refuses them), though each
        token row is untouched so that enabling the account is not needed to read what it had."""
        try:
            return self.user.service_account.is_disabled
        except (ObjectDoesNotExist, AttributeError):
            return False


class JobToken(models.Model):
    """The token a running job's code records with. Valid only while its job runs under its lease:
    ending the job revokes it. The job itself arrives with the jobs app; until then the id is kept."""

    job_id = models.BigIntegerField(db_index=True)
    lease_id = models.UUIDField()
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="job_tokens")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_tokens",
        help_text=_("The job's creator, whose current role the token carries."),
    )
    prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job_id", "lease_id"], name="job_token_job_lease")]

    def __str__(self) -> str:
        return f"{self.prefix}… (job {self.job_id})"


class AuditEvent(models.Model):
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    actor_label = models.CharField(max_length=150, blank=True, help_text=_("Username at the time, kept if the user is deleted."))
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True, blank=True, related_name="audit_events")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    ip = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label or '-'} {self.action} {self.object_type}:{self.object_id}"


def role_at_least(role: str | None, minimum: str) -> bool:
    return role is not None and ROLE_RANK[Role(role)] >= ROLE_RANK[Role(minimum)]
