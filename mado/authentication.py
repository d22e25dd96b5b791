"""Bearer-token authentication for the API, and the login backend that keeps service accounts out."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.backends import ModelBackend
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header

from mado import access, tokens
from mado.choices import Scope
from mado.models import ApiToken, JobToken, Project


@dataclass(frozen=True)
class TokenPrincipal:
    """What a request's token allows: kept in request.auth. Session requests have request.auth None."""

    kind: str  # personal | service | launcher | job
    token: ApiToken | JobToken
    project: Project
    scopes: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_job(self) -> bool:
        return self.kind == "job"


class HumanOnlyModelBackend(ModelBackend):
    def user_can_authenticate(self, user):
        return super().user_can_authenticate(user) and not access.is_service_user(user)


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the header as 'Authorization: Bearer <token>' with one token.")
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token contains characters no token has; copy it again.") from None
        if raw.startswith(tokens.JOB_TOKEN_PREFIX):
            return _authenticate_job_token(raw)
        if raw.startswith(tokens.API_TOKEN_PREFIX):
            return _authenticate_api_token(raw)
        raise exceptions.AuthenticationFailed("This is not a Mado API token (they start with mmt_); copy it again.")

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class BrowserSessionAuthentication(SessionAuthentication):
    """The signed-in browser: CSRF-checked, and never a service account."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result and access.is_service_user(result[0]):
            return None
        return result


def _authenticate_api_token(raw: str):
    from mado.services import record_token_use

    token = (
        ApiToken.objects.select_related("user", "project", "user__service_account")
        .filter(token_hash=tokens.hash_token(raw))
        .first()
    )
    if token is None:
        raise exceptions.AuthenticationFailed("This API token is not known; issue a new one.")
    if token.revoked_at is not None:
        raise exceptions.AuthenticationFailed(
            f"This API token ({token.prefix}…) was revoked on {token.revoked_at:%Y-%m-%d}; issue a new one."
        )
    if token.expires_at <= timezone.now():
        raise exceptions.AuthenticationFailed(
            f"This API token ({token.prefix}…) expired on {token.expires_at:%Y-%m-%d}; issue a new one."
        )
    user = token.user
    if not user.is_active:
        raise exceptions.AuthenticationFailed("The user holding this API token is deactivated.")
    account = access.service_account_of(user)
    if account is not None and account.is_disabled:
        raise exceptions.AuthenticationFailed(
            f"The service account {account.name} is disabled, so its tokens no longer work."
        )
    record_token_use(token)
    return user, TokenPrincipal(kind=token.kind, token=token, project=token.project, scopes=frozenset(token.scopes))


def _authenticate_job_token(raw: str):
    token = JobToken.objects.select_related("user", "project").filter(token_hash=tokens.hash_token(raw)).first()
    if token is None:
        raise exceptions.AuthenticationFailed("This job token is not known.")
    if token.revoked_at is not None:
        raise exceptions.AuthenticationFailed("This job token no longer works: its job has ended.")
    # The token carries its creator's current role: someone removed from the project stops recording.
    role = access.project_role(token.user, token.project)
    if role is None or not token.user.is_active:
        raise exceptions.AuthenticationFailed(
            "The job's creator is no longer a member of the project, so its job token no longer works."
        )
    user = access.job_principal(token.user, token.project, role)
    return user, TokenPrincipal(kind="job", token=token, project=token.project, scopes=frozenset({Scope.READ.value}))
