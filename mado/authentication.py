"""Bearer-token authentication for the API, the login backend that keeps service accounts out, and the
limits on guessing: failed sign-ins (django-axes, per username and address, plus per address) and unknown
bearer tokens (per address). See docs/configuration.md, "Sign-in and token limits"."""
from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from datetime import timedelta

from axes.attempts import get_cool_off_threshold
from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db import transaction
from django.db.models import F, Max, OuterRef, Subquery, Sum
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header

from mado import access, tokens
from mado.choices import Scope
from mado.db import PreparedLookup
from mado.models import ApiToken, AuditEvent, JobToken, Membership, Project

# The AccessAttempt rows that count unknown bearer tokens carry this in place of a username. Django
# usernames cannot contain spaces or brackets, so no sign-in is ever counted with them.
TOKEN_ATTEMPT_USERNAME = "[API token]"


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


class UnknownToken(exceptions.AuthenticationFailed):
    """A bearer token that matches no token at all: what guessing produces. Revoked, expired and disabled
    tokens are known tokens (someone held them) and are not counted."""


class TooManyFailedTokens(exceptions.APIException):
    status_code = 429
    default_code = "too_many_failed_tokens"

    def __init__(self, wait: int):
        self.wait = wait
        super().__init__(
            f"Too many requests with unknown API tokens came from this address; retry in {wait} seconds, with the "
            "token copied whole (or a new one). Valid tokens keep working meanwhile.",
            self.default_code,
        )


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the header as 'Authorization: Bearer <token>' with one token.")
        try:
            return _authenticate_bearer(header[1])
        except UnknownToken:
            count_unknown_token(request)  # raises TooManyFailedTokens instead once the address is over the limit
            raise

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class BrowserSessionAuthentication(SessionAuthentication):
    """The signed-in browser: CSRF-checked, and never a service account."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result and access.is_service_user(result[0]):
            return None
        return result


def _authenticate_bearer(value: bytes):
    try:
        raw = value.decode("ascii")
    except UnicodeDecodeError:
        raise UnknownToken("The token contains characters no token has; copy it again.") from None
    if tokens.is_job_token(raw):
        return _authenticate_job_token(raw)
    if raw.startswith(tokens.API_TOKEN_PREFIX):
        return _authenticate_api_token(raw)
    raise UnknownToken("This is not a Mado API token (they start with mmt_, job tokens with mado_mtj_); copy it again.")


def _token_by_hash(model):
    """A token with its user, its project, the user's service account (project_role asks for it) and the
    user's Membership role in that project (`member_role`), in one statement compiled once (mado.db)."""
    role = Membership.objects.filter(project_id=OuterRef("project_id"), user_id=OuterRef("user_id")).values("role")
    return PreparedLookup(lambda token_hash: model.objects.select_related(
        "user", "project", "user__service_account").filter(token_hash=token_hash).annotate(
        member_role=Subquery(role.order_by()[:1])).order_by()[:1], "<hash>")


API_TOKEN_BY_HASH = _token_by_hash(ApiToken)
JOB_TOKEN_BY_HASH = _token_by_hash(JobToken)


def _authenticate_api_token(raw: str):
    from mado.services import record_token_use

    token = API_TOKEN_BY_HASH.first(tokens.hash_token(raw))
    if token is None:
        raise UnknownToken("This API token is not known; issue a new one.")
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
    token = JOB_TOKEN_BY_HASH.first(tokens.hash_token(raw))
    if token is None:
        raise UnknownToken("This job token is not known.")
    if token.revoked_at is not None:
        raise exceptions.AuthenticationFailed("This job token no longer works: its job has ended.")
    # The token carries its creator's current role: someone removed from the project stops recording.
    creator = token.user
    role = token.member_role if access.role_is_a_membership(creator) else access.project_role(creator, token.project)
    if role is None or not token.user.is_active:
        raise exceptions.AuthenticationFailed(
            "The job's creator is no longer a member of the project, so its job token no longer works."
        )
    user = access.job_principal(token.user, token.project, role)
    return user, TokenPrincipal(kind="job", token=token, project=token.project, scopes=frozenset({Scope.READ.value}))


# Client addresses ------------------------------------------------------------------------------

def client_address(request) -> str | None:
    """The address the limits count by (also AXES_CLIENT_IP_CALLABLE). Behind the reverse proxy
    (MADO_BEHIND_PROXY) every request comes from the proxy, so the last X-Forwarded-For entry, the one the
    proxy itself appended, names the client; earlier entries are whatever the client sent and are ignored."""
    meta = request.META
    if settings.BEHIND_PROXY:
        forwarded = _valid_address(meta.get("HTTP_X_FORWARDED_FOR", "").split(",")[-1])
        if forwarded:
            return forwarded
    return _valid_address(meta.get("REMOTE_ADDR", ""))


def _valid_address(value: str) -> str | None:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


# Unknown bearer tokens ---------------------------------------------------------------------------

def count_unknown_token(request) -> None:
    """Count one unknown token from the request's address. Past MADO_TOKEN_FAILURE_LIMIT within the
    window, further unknown tokens from that address get 429 too_many_failed_tokens (not counted, so the
    window ends MADO_TOKEN_COOLOFF_MINUTES after the last counted one); valid tokens are never refused."""
    address = client_address(request)
    if address is None:
        return
    limit = settings.TOKEN_FAILURE_LIMIT
    now = timezone.now()
    window = timedelta(minutes=settings.TOKEN_COOLOFF_MINUTES)
    rows = AccessAttempt.objects.filter(username=TOKEN_ATTEMPT_USERNAME, ip_address=address)
    rows.filter(attempt_time__lte=now - window).delete()
    before = rows.aggregate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
    if (before["failures"] or 0) >= limit:
        raise TooManyFailedTokens(max(1, math.ceil((before["last"] + window - now).total_seconds())))
    with transaction.atomic():
        attempt, created = AccessAttempt.objects.select_for_update().get_or_create(
            username=TOKEN_ATTEMPT_USERNAME, ip_address=address,
            user_agent=request.META.get("HTTP_USER_AGENT", "<unknown>")[:255],
            defaults={"failures_since_start": 1, "attempt_time": now, "get_data": "", "post_data": "",
                      "path_info": request.path[:255], "http_accept": request.META.get("HTTP_ACCEPT", "")[:1025]},
        )
        if not created:
            attempt.failures_since_start = F("failures_since_start") + 1
            attempt.attempt_time = now
            attempt.path_info = request.path[:255]
            attempt.save(update_fields=["failures_since_start", "attempt_time", "path_info"])
    after = rows.aggregate(failures=Sum("failures_since_start"))["failures"] or 0
    if (before["failures"] or 0) < limit <= after:
        _audit_anonymous("token.failures_locked", "address", address, address, {
            "failures": after, "limit": limit, "cooloff_minutes": settings.TOKEN_COOLOFF_MINUTES,
        })


# Failed sign-ins (django-axes) -------------------------------------------------------------------

def axes_request_middleware(get_response):
    """Gives every request the attributes django-axes reads (address, time, user agent) up front. Axes
    sets them only when a sign-in is checked, and its admin action "Clean up expired attempts" fails
    without them (django-axes 8.3.1)."""

    def middleware(request):
        AxesProxyHandler.update_request(request)
        return get_response(request)

    return middleware


class SignInLimitBackend(AxesStandaloneBackend):
    """Refuses a sign-in while its username and address (or its address) are locked out, before the
    password is checked. authenticate() without a request (manage.py commands, the test client's
    login()) is no web sign-in and has no address to count, so it is let through to the next backend."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class SignInAttemptHandler(AxesDatabaseHandler):
    """django-axes' database handler (AXES_HANDLER) with Mado's additions: a second limit per address
    (MADO_LOGIN_ADDRESS_FAILURE_LIMIT, across usernames), an audit row for every failed sign-in and for
    each lock-out, and the unknown-token rows left to their own window."""

    def get_failures(self, request, credentials=None) -> int:
        failures = super().get_failures(request, credentials)  # this username from this address
        limit = settings.LOGIN_FAILURE_LIMIT
        if failures < limit and _address_sign_in_failures(request) >= settings.LOGIN_ADDRESS_FAILURE_LIMIT:
            return limit
        return failures

    def user_login_failed(self, sender, credentials: dict, request=None, **kwargs):
        if request is None:
            return
        refused = bool(getattr(request, "axes_locked_out", False))  # set by SignInLimitBackend
        super().user_login_failed(sender, credentials, request, **kwargs)
        username = get_client_username(request, credentials)
        user = _user_named(username)
        who = {"username": user.get_username()} if user else {"known_user": False}
        _audit_anonymous("user.sign_in_failed", "user", str(user.pk) if user else "", request.axes_ip_address,
                         {**who, "reason": "locked_out" if refused else "wrong_credentials"})
        if not refused and request.axes_locked_out:
            pair = super().get_failures(request, credentials)
            _audit_anonymous("user.sign_in_locked", "user", str(user.pk) if user else "", request.axes_ip_address, {
                **who, "locked": "account_and_address" if pair >= settings.LOGIN_FAILURE_LIMIT else "address",
                "failures": pair if pair >= settings.LOGIN_FAILURE_LIMIT else _address_sign_in_failures(request),
                "cooloff_minutes": settings.LOGIN_COOLOFF_MINUTES,
            })

    def clean_expired_user_attempts(self, request=None, credentials=None) -> int:
        if request is None or not hasattr(request, "axes_attempt_time"):
            threshold = timezone.now() - timedelta(minutes=settings.LOGIN_COOLOFF_MINUTES)
        else:
            threshold = get_cool_off_threshold(request)
        count, _ = AccessAttempt.objects.filter(attempt_time__lte=threshold).exclude(
            username=TOKEN_ATTEMPT_USERNAME).delete()
        tokens_threshold = timezone.now() - timedelta(minutes=settings.TOKEN_COOLOFF_MINUTES)
        token_count, _ = AccessAttempt.objects.filter(username=TOKEN_ATTEMPT_USERNAME,
                                                      attempt_time__lte=tokens_threshold).delete()
        return count + token_count


def sign_in_retry_after(request, credentials=None) -> int:
    """Seconds until a locked-out sign-in may be tried again: the cool-off counted from the last failure
    that made the lock (this username from this address, or else this address)."""
    handler = SignInAttemptHandler()
    threshold = get_cool_off_threshold(request)
    pair = [rows.filter(attempt_time__gte=threshold) for rows in handler.filter_user_attempts(request, credentials)]
    rows = pair[0] if pair else AccessAttempt.objects.none()
    if (rows.aggregate(n=Sum("failures_since_start"))["n"] or 0) < settings.LOGIN_FAILURE_LIMIT:
        rows = _address_sign_in_rows(request)
    last = rows.aggregate(last=Max("attempt_time"))["last"] or timezone.now()
    remaining = last + timedelta(minutes=settings.LOGIN_COOLOFF_MINUTES) - timezone.now()
    return max(1, math.ceil(remaining.total_seconds()))


def _address_sign_in_rows(request):
    return AccessAttempt.objects.filter(ip_address=request.axes_ip_address,
                                        attempt_time__gte=get_cool_off_threshold(request)).exclude(
        username=TOKEN_ATTEMPT_USERNAME)


def _address_sign_in_failures(request) -> int:
    return _address_sign_in_rows(request).aggregate(n=Sum("failures_since_start"))["n"] or 0


def _user_named(username: str | None):
    if not username:
        return None
    model = get_user_model()
    return model._default_manager.filter(**{model.USERNAME_FIELD: username}).first()


def _audit_anonymous(action: str, object_type: str, object_id: str, ip: str | None, after: dict) -> None:
    """An audit row without a signed-in actor (services.audit needs one). Never a password or a token:
    the typed username only when it names a user (an unknown one may be a password typed in the wrong box)."""
    AuditEvent.objects.create(actor=None, actor_label="anonymous", action=action, object_type=object_type,
                              object_id=object_id, after=after, ip=ip)
