"""Public keys launchers publish (seed 003 "Keys and connection checks"): one ed25519 key per launcher
and site for the shared account, or per launcher, site and person for sites under each person's own
account. The private key never leaves the launcher; the server checks and shows the public half."""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from computers import access
from mado.errors import Forbidden, ServiceError
from mado.longpoll import notify
from mado.services import Actor, audit
from mado.validation import BIGINT_MAX, as_int
from sites.choices import AccountKind, SubmissionMethod
from sites.models import Launcher, LauncherKey, SiteSettings, SiteUserSettings
from sites.submissions import SITES_CHANNEL

KEY_TYPE = "ssh-ed25519"
ED25519_KEY_BYTES = 32
COMMENT = re.compile(r"^[A-Za-z0-9._@+-]{1,100}$")
MAX_KEY_TEXT = 1000


def fingerprint(blob: bytes) -> str:
    """As `ssh-keygen -l` prints it: SHA256: and the unpadded base64 of the blob's digest."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def parse_public_key(text) -> tuple[str, str]:
    """One OpenSSH ed25519 public key line → (the normalized line, its fingerprint)."""
    refused = ServiceError("Send one ssh-ed25519 public key line (ssh-ed25519 AAAA… [comment]), as in the .pub "
                           "file; other key types are not accepted.", "invalid_public_key",
                           fields={"public_key": ["Not an ssh-ed25519 public key."]})
    if not isinstance(text, str) or len(text) > MAX_KEY_TEXT:
        raise refused
    if "PRIVATE KEY" in text:
        raise ServiceError("This is a private key: send only the public key (the .pub file); the private key never "
                           "leaves the launcher.", "invalid_public_key",
                           fields={"public_key": ["Private key material."]})
    parts = text.strip().split()
    if len(parts) not in (2, 3) or parts[0] != KEY_TYPE:
        raise refused
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise refused from None
    if _blob_fields(blob) != [KEY_TYPE.encode(), ED25519_KEY_BYTES]:
        raise refused
    line = f"{KEY_TYPE} {parts[1]}"
    if len(parts) == 3 and COMMENT.fullmatch(parts[2]):
        line += f" {parts[2]}"
    return line, fingerprint(blob)


def _blob_fields(blob: bytes) -> list:
    """[key type, key length] of an ed25519 blob (string "ssh-ed25519", string of 32 bytes), or []."""
    try:
        (type_length,) = struct.unpack(">I", blob[:4])
        key_type = blob[4:4 + type_length]
        (key_length,) = struct.unpack(">I", blob[4 + type_length:8 + type_length])
    except struct.error:
        return []
    if len(blob) != 8 + type_length + key_length:
        return []
    return [key_type, key_length]


def publish_key(launcher: Launcher, data: dict) -> LauncherKey:
    """Store (or replace) this launcher's key for (computer, user). `user` null: the shared account."""
    computer = as_int(data.get("computer"), low=1, high=BIGINT_MAX)
    raw_user = data.get("user")
    user_id = None if raw_user is None else as_int(raw_user, low=1, high=BIGINT_MAX)
    if computer is None or (raw_user is not None and (user_id is None or isinstance(raw_user, str))):
        raise ServiceError("Send {computer, user: id or null, public_key} for a site of your config.", "invalid",
                           fields={"computer": ["A computer id."], "user": ["A user id or null."]})
    line, print_ = parse_public_key(data.get("public_key"))
    with transaction.atomic():
        # The site row serialises two publishes for one site: the unique constraints stay quiet.
        site = (SiteSettings.objects.select_for_update(of=("self",)).select_related("target")
                .filter(target_id=computer, launcher=launcher, submission=SubmissionMethod.AUTOMATIC).first())
        if site is None:
            raise ServiceError("This launcher serves no automatic site with this computer id.", "not_found",
                               status=404)
        _check_account(site, user_id)
        key = LauncherKey.objects.filter(launcher=launcher, target=site.target, user_id=user_id).first()
        before = {"fingerprint": key.fingerprint} if key else None
        if key is not None and key.public_key == line:
            return key
        if key is None:
            key = LauncherKey(launcher=launcher, target=site.target, user_id=user_id)
        key.public_key, key.fingerprint, key.created_at = line, print_, timezone.now()
        key.recreate_requested_at = None
        key.save()
        token_user = launcher.token.user if launcher.token_id else None
        audit(Actor(token_user), "site.key.publish", key,
              before=before, after={"computer": computer, "user": user_id, "fingerprint": print_,
                                    "launcher": launcher.name})
    return key


def _check_account(site: SiteSettings, user_id: int | None) -> None:
    if user_id is None:
        if site.account != AccountKind.SHARED:
            raise ServiceError(f"{site.target.name} runs under each person's own account: publish one key per "
                               "user of the config's accounts.", "invalid", fields={"user": ["A user id."]})
        return
    if site.account != AccountKind.PERSONAL:
        raise ServiceError(f"{site.target.name} runs under its shared account: publish its key with user null.",
                           "invalid", fields={"user": ["null for the shared account."]})
    if not SiteUserSettings.objects.filter(target=site.target, user_id=user_id).exists():
        raise ServiceError("This person has not saved My settings on this site; publish keys only for the "
                           "config's accounts.", "invalid", fields={"user": ["Not an account of this site."]})


def keys_of(launcher: Launcher, target) -> list[dict]:
    """What the launcher's config lists: the keys the server already has from it for the site."""
    return [{"user": user, "fingerprint": print_, "recreate": asked is not None} for user, print_, asked in
            LauncherKey.objects.filter(launcher=launcher, target=target).order_by("user_id")
            .values_list("user_id", "fingerprint", "recreate_requested_at")]


def request_recreate(actor: Actor, target, *, mine: bool) -> LauncherKey:
    """Ask the site's launcher for a new key (seed 003 permissions): the shared account's key for the
    owner or a global administrator, one's own key for anyone who can use an own-account site. The
    old key keeps working until the launcher publishes the new one, which then replaces it."""
    user = actor.user
    site = SiteSettings.objects.filter(target=target).select_related("target").first()
    if site is None or site.submission != SubmissionMethod.AUTOMATIC or site.launcher_id is None:
        raise ServiceError(_("Only automatic sites with a launcher have keys."), "site_key_not_applicable")
    if mine:
        if site.account != AccountKind.PERSONAL:
            raise ServiceError(_("%(name)s runs under its shared account: its owner recreates that key.") % {
                "name": target.name}, "site_key_not_applicable")
        if not access.can_use(user, target):
            raise Forbidden(_("You cannot use this computer, so it has no key of yours."), "not_usable")
        owner_of_key = user
    else:
        if site.account != AccountKind.SHARED:
            raise ServiceError(_("%(name)s runs under each person's own account: recreate your own key.") % {
                "name": target.name}, "site_key_not_applicable")
        if not access.can_manage(user, target):
            raise Forbidden(_("Only the computer's owner and global administrators recreate the shared key."),
                            "not_owner")
        owner_of_key = None
    with transaction.atomic():
        key = (LauncherKey.objects.select_for_update()
               .filter(target=target, launcher_id=site.launcher_id, user=owner_of_key).first())
        if key is None:
            raise ServiceError(_("The launcher has not published this key yet; it makes one on its next poll."),
                               "site_key_missing", status=409)
        if key.recreate_requested_at is None:
            key.recreate_requested_at = timezone.now()
            key.save(update_fields=["recreate_requested_at"])
            audit(actor, "site.key.recreate_request", key,
                  after={"computer": target.pk, "user": owner_of_key.pk if owner_of_key else None,
                         "fingerprint": key.fingerprint})
    notify(SITES_CHANNEL)
    return key


def keys_for_details(user, target) -> list[dict]:
    """The keys a person sees in the computer's details: managers the shared account's (they register
    it), everyone who can use the site their own."""
    site = SiteSettings.objects.filter(target=target).select_related("launcher").first()
    if site is None or site.launcher_id is None:
        return []
    keys = LauncherKey.objects.filter(target=target, launcher_id=site.launcher_id).select_related("user")
    shown = []
    if access.can_manage(user, target):
        shown += list(keys.filter(user__isnull=True))
    if user.is_authenticated:
        shown += list(keys.filter(user=user))
    return [{"user": k.user_id, "username": k.user.username if k.user else None, "fingerprint": k.fingerprint,
             "public_key": k.public_key, "launcher": site.launcher.name, "created_at": k.created_at,
             "recreate_requested": k.recreate_requested_at is not None}
            for k in shown]
