"""Guessing passwords and tokens (issue 14, finding 5): failed sign-ins are limited per username and
address (django-axes) and per address, audited and listed in Django admin; unknown bearer tokens are
counted per address and answered 429 past the limit, while valid tokens keep working."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import authenticate
from django.urls import reverse
from django.utils import timezone

from mado.authentication import TOKEN_ATTEMPT_USERNAME
from mado.models import ApiToken, AuditEvent
from tests.conftest import assert_error, bearer

pytestmark = pytest.mark.django_db

LOCKED = "Too many failed sign-ins for this account or from this address"
ELSEWHERE = "10.20.30.40"


def sign_in(client, username: str, password: str, **extra):
    return client.post(reverse("login"), {"username": username, "password": password}, **extra)


def signed_in_as(client) -> str | None:
    from django.contrib.auth import get_user

    user = get_user(client)
    return user.username if user.is_authenticated else None


def fail(client, username: str, times: int, **extra):
    responses = [sign_in(client, username, "not-the-password", **extra) for _ in range(times)]
    return responses


# Sign-ins ---------------------------------------------------------------------------------------

def test_the_limit_locks_that_username_from_that_address_and_the_page_says_for_how_long(client, world):
    limit = settings.LOGIN_FAILURE_LIMIT
    responses = fail(client, "alice", limit)
    assert [r.status_code for r in responses[:-1]] == [200] * (limit - 1)  # the form again, with its error
    assert LOCKED not in responses[0].content.decode()
    locked = responses[-1]
    assert locked.status_code == 429
    page = locked.content.decode()
    assert LOCKED in page and f"Try again in {settings.LOGIN_COOLOFF_MINUTES} minutes" in page
    assert "ask a global administrator to unlock it" in page
    assert 'name="username"' in page and 'value="alice"' in page
    assert 0 < int(locked["Retry-After"]) <= settings.LOGIN_COOLOFF_MINUTES * 60

    # The right password is refused too while the lock lasts ...
    refused = sign_in(client, "alice", "alice-pass-123")
    assert refused.status_code == 429 and LOCKED in refused.content.decode()
    assert signed_in_as(client) is None
    # ... and the refusals do not extend it: the cool-off still runs from the lock-out.
    assert AccessAttempt.objects.get(username="alice").failures_since_start == limit


def test_another_user_at_that_address_and_the_same_user_elsewhere_still_sign_in(client, world):
    fail(client, "alice", settings.LOGIN_FAILURE_LIMIT)
    assert sign_in(client, "alice", "alice-pass-123").status_code == 429

    assert sign_in(client, "bob", "bob-pass-123").status_code == 302
    assert signed_in_as(client) == "bob"
    client.logout()
    assert sign_in(client, "alice", "alice-pass-123", REMOTE_ADDR=ELSEWHERE).status_code == 302
    assert signed_in_as(client) == "alice"


def test_a_successful_sign_in_resets_the_count(client, world):
    limit = settings.LOGIN_FAILURE_LIMIT
    fail(client, "alice", limit - 1)
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302
    client.logout()
    assert all(r.status_code == 200 for r in fail(client, "alice", limit - 1))
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302


def test_many_usernames_failing_from_one_address_lock_that_address(client, world, settings):
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 3
    for name in ["admin", "root", "carol"]:
        assert sign_in(client, name, "guess").status_code in (200, 429)
    response = sign_in(client, "bob", "bob-pass-123")
    assert response.status_code == 429 and LOCKED in response.content.decode()
    assert signed_in_as(client) is None
    assert sign_in(client, "bob", "bob-pass-123", REMOTE_ADDR=ELSEWHERE).status_code == 302
    locked = AuditEvent.objects.get(action="user.sign_in_locked")
    assert locked.after["locked"] == "address" and locked.ip == "127.0.0.1"


def test_the_admin_sign_in_page_is_limited_the_same_way(client, world):
    for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
        client.post(reverse("admin:login"), {"username": "root", "password": "guess"})
    response = client.post(reverse("admin:login"), {"username": "root", "password": "guess"})
    assert response.status_code == 429 and LOCKED in response.content.decode()
    assert client.post(reverse("admin:login"), {"username": "root", "password": "root-pass-123"}).status_code == 429


def test_failed_sign_ins_and_the_lock_out_are_audited_without_the_password(client, world):
    limit = settings.LOGIN_FAILURE_LIMIT
    AuditEvent.objects.all().delete()
    fail(client, "alice", limit, REMOTE_ADDR="10.1.2.3")
    sign_in(client, "alice", "alice-pass-123", REMOTE_ADDR="10.1.2.3")  # refused: locked
    sign_in(client, "alice-pass-123", "whatever")  # a password typed into the username box
    client.post(reverse("login"), {"username": "carol", "password": "nope", "csrfmiddlewaretoken": "csrf-secret-1"})

    failed = list(AuditEvent.objects.filter(action="user.sign_in_failed").order_by("id"))
    assert len(failed) == limit + 3
    for event in failed[:limit]:
        assert event.object_type == "user" and event.object_id == str(world.project_admin.pk)
        assert event.after == {"username": "alice", "reason": "wrong_credentials"}
        assert event.ip == "10.1.2.3" and event.actor is None and event.actor_label == "anonymous"
    assert failed[limit].after == {"username": "alice", "reason": "locked_out"}
    assert failed[-2].after == {"known_user": False, "reason": "wrong_credentials"} and failed[-2].object_id == ""

    locked = AuditEvent.objects.get(action="user.sign_in_locked")
    assert locked.object_id == str(world.project_admin.pk) and locked.ip == "10.1.2.3"
    assert locked.after == {"username": "alice", "locked": "account_and_address", "failures": limit,
                            "cooloff_minutes": settings.LOGIN_COOLOFF_MINUTES}
    everything = json.dumps(list(AuditEvent.objects.values()), default=str)
    assert "not-the-password" not in everything and "alice-pass-123" not in everything
    attempts = json.dumps(list(AccessAttempt.objects.values()), default=str)
    assert "not-the-password" not in attempts and "nope" not in attempts and "csrf-secret-1" not in attempts


def test_a_global_administrator_sees_the_lock_out_in_django_admin_and_unlocks_it(client, world):
    fail(client, "alice", settings.LOGIN_FAILURE_LIMIT)
    attempt = AccessAttempt.objects.get(username="alice")
    admin = client.__class__()
    admin.force_login(world.global_admin)
    assert b"Access attempts" in admin.get(reverse("admin:index")).content
    listing = admin.get(reverse("admin:axes_accessattempt_changelist"))
    assert listing.status_code == 200
    assert b"alice" in listing.content and b"Locked Out" in listing.content
    assert b"127.0.0.1" in listing.content
    detail = admin.get(reverse("admin:axes_accessattempt_change", args=[attempt.pk]))
    assert detail.status_code == 200 and b"not-the-password" not in detail.content
    events = admin.get(reverse("admin:mado_auditevent_changelist") + "?action=user.sign_in_locked")
    assert events.status_code == 200 and b"user.sign_in_locked" in events.content

    deleted = admin.post(reverse("admin:axes_accessattempt_delete", args=[attempt.pk]), {"post": "yes"})
    assert deleted.status_code == 302
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302


def test_a_researcher_does_not_see_the_attempts_in_django_admin(client, world):
    fail(client, "alice", 1)
    client.force_login(world.project_admin)
    response = client.get(reverse("admin:axes_accessattempt_changelist"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))


def test_the_lock_ends_after_the_cool_off(client, world):
    fail(client, "alice", settings.LOGIN_FAILURE_LIMIT)
    AccessAttempt.objects.filter(username="alice").update(
        attempt_time=timezone.now() - timedelta(minutes=settings.LOGIN_COOLOFF_MINUTES, seconds=1))
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302


def test_sign_ins_without_a_request_are_not_counted(world):
    # manage.py commands and the test client's login() call authenticate() without a request.
    for _ in range(settings.LOGIN_FAILURE_LIMIT + 1):
        assert authenticate(username="alice", password="wrong") is None
    assert authenticate(username="alice", password="alice-pass-123") == world.project_admin
    assert not AccessAttempt.objects.exists()


# Bearer tokens ----------------------------------------------------------------------------------

def unknown(address: str, token: str = "mmt_" + "x" * 43):
    return bearer(token).get("/api/auth/token", REMOTE_ADDR=address)


def test_unknown_tokens_from_one_address_get_429_past_the_limit_while_valid_tokens_keep_working(world):
    limit = settings.TOKEN_FAILURE_LIMIT
    address = "10.0.0.5"
    for i in range(limit):
        assert_error(unknown(address, "mmt_" + f"{i:x}" * 43 if i % 3 else "ghp_notours"), 401)
    response = unknown(address)
    body = assert_error(response, 429, "too_many_failed_tokens")
    assert "unknown API tokens" in body["error"] and "retry in" in body["error"]
    assert 0 < int(response["Retry-After"]) <= settings.TOKEN_COOLOFF_MINUTES * 60
    assert_error(unknown(address, "mado_mtj_" + "y" * 43), 429, "too_many_failed_tokens")  # job tokens too

    good = world.member_token(world.member)
    assert bearer(good).get("/api/auth/token", REMOTE_ADDR=address).status_code == 200
    assert bearer(good).get("/api/auth/token", REMOTE_ADDR="10.0.0.6").status_code == 200
    assert bearer(good).get("/api/auth/token").status_code == 200
    # The count is per address: another address still gets the plain 401.
    assert_error(unknown("10.0.0.6"), 401, "authentication_failed")
    attempt = AccessAttempt.objects.get(username=TOKEN_ATTEMPT_USERNAME, ip_address=address)
    assert attempt.failures_since_start == limit  # refusals past the limit are not counted


def test_revoked_and_expired_tokens_are_not_counted_as_guesses(world):
    token = world.member_token(world.member)
    ApiToken.objects.filter(user=world.member).update(revoked_at=timezone.now())
    for _ in range(settings.TOKEN_FAILURE_LIMIT + 2):
        assert "revoked" in assert_error(bearer(token).get("/api/auth/token", REMOTE_ADDR="10.0.0.8"), 401)["error"]
    assert not AccessAttempt.objects.filter(ip_address="10.0.0.8").exists()


def test_the_token_lock_out_is_audited_once_and_listed_in_django_admin(client, world):
    address = "10.0.0.9"
    for _ in range(settings.TOKEN_FAILURE_LIMIT + 3):
        unknown(address)
    event = AuditEvent.objects.get(action="token.failures_locked")
    assert event.object_type == "address" and event.object_id == address and event.ip == address
    assert event.after == {"failures": settings.TOKEN_FAILURE_LIMIT, "limit": settings.TOKEN_FAILURE_LIMIT,
                           "cooloff_minutes": settings.TOKEN_COOLOFF_MINUTES}
    assert "x" * 43 not in json.dumps(list(AuditEvent.objects.values()), default=str)
    client.force_login(world.global_admin)
    listing = client.get(reverse("admin:axes_accessattempt_changelist") + f"?q={address}")
    assert listing.status_code == 200 and TOKEN_ATTEMPT_USERNAME.encode() in listing.content


def test_unknown_tokens_get_401_again_after_the_window(world):
    address = "10.0.0.10"
    for _ in range(settings.TOKEN_FAILURE_LIMIT):
        unknown(address)
    assert unknown(address).status_code == 429
    AccessAttempt.objects.filter(ip_address=address).update(
        attempt_time=timezone.now() - timedelta(minutes=settings.TOKEN_COOLOFF_MINUTES, seconds=1))
    assert_error(unknown(address), 401)


def test_token_failures_do_not_count_against_sign_ins_from_that_address(client, world):
    for _ in range(settings.TOKEN_FAILURE_LIMIT + 1):
        unknown("127.0.0.1")
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302


def test_behind_the_proxy_the_address_is_the_one_the_proxy_appended(world, settings):
    settings.BEHIND_PROXY = True
    limit = settings.TOKEN_FAILURE_LIMIT
    for i in range(limit):
        # The client forges the first entry each time; the proxy appends the real address last.
        bearer("mmt_" + "z" * 43).get("/api/auth/token", REMOTE_ADDR="127.0.0.1",
                                      HTTP_X_FORWARDED_FOR=f"192.0.2.{i}, 198.51.100.7")
    assert AccessAttempt.objects.get(username=TOKEN_ATTEMPT_USERNAME).ip_address == "198.51.100.7"
    blocked = bearer("mmt_" + "z" * 43).get("/api/auth/token", REMOTE_ADDR="127.0.0.1",
                                           HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert_error(blocked, 429, "too_many_failed_tokens")
    # Another client behind the same proxy is not affected.
    other = bearer("mmt_" + "z" * 43).get("/api/auth/token", REMOTE_ADDR="127.0.0.1",
                                         HTTP_X_FORWARDED_FOR="198.51.100.8")
    assert_error(other, 401)


def test_the_admin_action_cleans_up_expired_attempts(client, world):
    fail(client, "alice", 1)
    fail(client, "bob", 1)
    AccessAttempt.objects.filter(username="alice").update(
        attempt_time=timezone.now() - timedelta(minutes=settings.LOGIN_COOLOFF_MINUTES, seconds=1))
    client.force_login(world.global_admin)
    response = client.post(reverse("admin:axes_accessattempt_changelist"), {
        "action": "cleanup_expired_attempts", "_selected_action": list(AccessAttempt.objects.values_list("pk", flat=True))})
    assert response.status_code == 302
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["bob"]


@pytest.mark.parametrize("name,value", [("MADO_LOGIN_FAILURE_LIMIT", "0"), ("MADO_LOGIN_COOLOFF_MINUTES", "soon"),
                                        ("MADO_TOKEN_FAILURE_LIMIT", "many"), ("MADO_LOGIN_ADDRESS_FAILURE_LIMIT", "-1"),
                                        ("MADO_TOKEN_COOLOFF_MINUTES", "0")])
def test_a_bad_limit_stops_start_up_naming_the_variable(name, value, tmp_path):
    from tests.test_settings_env import run_manage

    result = run_manage(["check"], {name: value}, tmp_path)
    assert result.returncode != 0 and name in result.stderr
