"""Where a launcher may log in (issue 14, finding 2). The shared launcher sits inside networks the people
who add sites may not reach themselves, so a site may name as its login node and jump hosts only hosts
that a global administrator allowed for its launcher: a list of fnmatch-style patterns (`*`, `?`,
`[1-4]`, `[!x]`) matched case-insensitively against the host as written in the site's settings (not
the address it resolves to). An empty list allows nowhere: a new launcher logs in nowhere until an
administrator sets its list (migration 0005 gave launchers that already served sites exactly the
hosts those sites name).

Also here: what a connection check's failure may say to people who are not global administrators.
The launcher's own message tells a closed port from one that is not SSH from an SSH server with a
given host key; that goes to the audit log and to global administrators. Everyone else reads only
what they can fix."""
from __future__ import annotations

import re
from fnmatch import fnmatchcase

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from mado.errors import ServiceError

MAX_PATTERNS = 100
MAX_PATTERN_LENGTH = 255
# Host name and address characters, plus the glob's own: no user@, no :port (ports are not restricted),
# no spaces or slashes.
PATTERN = re.compile(r"^[a-z0-9.\-_:*?\[\]!]+$")
JUMP_HOST = re.compile(r"^(?:[^@\s]+@)?(?P<host>\[[^\]\s]+\]|[^:\s]+)(?::[0-9]+)?$")
WHERE = gettext_noop("Global administration → Launchers")


def parse(raw) -> list[str]:
    """The patterns from a list or from text (one per line; spaces and commas also separate them),
    lower-cased, each once, in the order given. Refuses anything else with a ServiceError naming
    `allowed_hosts`."""
    if raw in (None, ""):
        return []
    if isinstance(raw, str):
        items = re.split(r"[\s,]+", raw)
    elif isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        items = raw
    else:
        raise _invalid(_("Give the allowed hosts as a list of host name patterns."))
    patterns: list[str] = []
    for item in items:
        pattern = item.strip().lower()
        if not pattern:
            continue
        # One colon is a port (an IPv6 address has two or more): ports are not part of the rule.
        if len(pattern) > MAX_PATTERN_LENGTH or not PATTERN.fullmatch(pattern) or pattern.count(":") == 1:
            raise _invalid(_("%(item)s is not a host name pattern: use letters, digits, '.', '-', ':' and the "
                             "wildcards *, ? and [...] (no user@ and no :port), such as *.hpc.example.ac.jp or "
                             "login[1-4].example.org.") % {"item": item.strip()[:80]})
        if pattern not in patterns:
            patterns.append(pattern)
    if len(patterns) > MAX_PATTERNS:
        raise _invalid(_("At most %(max)s allowed host patterns.") % {"max": MAX_PATTERNS})
    return patterns


def _invalid(message: str) -> ServiceError:
    return ServiceError(message, "invalid_allowed_hosts", fields={"allowed_hosts": [message]})


def matches(patterns, host: str) -> bool:
    name = (host or "").strip().strip("[]").lower()
    return bool(name) and any(fnmatchcase(name, str(pattern).lower()) for pattern in patterns or [])


def jump_host_name(entry: str) -> str:
    match = JUMP_HOST.fullmatch(str(entry).strip())
    return match["host"].strip("[]") if match else str(entry).strip()


def refused(launcher, hosts: list[str]) -> list[str]:
    """Those of `hosts` the launcher may not log in to."""
    patterns = launcher.allowed_hosts if launcher is not None else []
    return [host for host in hosts if not matches(patterns, host)]


def rule(launcher, host: str) -> str:
    """Why `host` is refused: the launcher's patterns, and who changes them."""
    patterns = launcher.allowed_hosts or []
    if not patterns:
        return (_("The launcher %(launcher)s may not log in to any host yet, so it cannot log in to %(host)s: a "
                  "global administrator sets the hosts it may log in to on %(where)s.")
                % {"launcher": launcher.name, "host": host, "where": _(WHERE)})
    return (_("The launcher %(launcher)s may log in only to hosts matching %(patterns)s, and %(host)s is not one of "
              "them. Choose a host that matches, or ask a global administrator to allow it on %(where)s.")
            % {"launcher": launcher.name, "patterns": ", ".join(patterns), "host": host, "where": _(WHERE)})


def site_errors(launcher, host: str, jump_hosts: list[str]) -> dict[str, list[str]]:
    """Field errors of a site whose login node or jump hosts its launcher may not log in to."""
    if launcher is None:
        return {}
    errors: dict[str, list[str]] = {}
    if host and refused(launcher, [host]):
        errors["host"] = [rule(launcher, host)]
    bad_jumps = refused(launcher, [jump_host_name(j) for j in jump_hosts or []])
    if bad_jumps:
        errors["jump_hosts"] = [rule(launcher, bad_jumps[0])]
    return errors


def site_allowed(site) -> bool:
    """Whether the site's launcher may log in to its login node and every jump host now."""
    launcher = site.launcher
    if launcher is None:
        return False
    return not refused(launcher, [site.host, *(jump_host_name(j) for j in site.jump_hosts or [])])


def site_refusal(site) -> str:
    """The sentence for a site whose launcher may no longer log in to one of its hosts."""
    for host in [site.host, *(jump_host_name(j) for j in site.jump_hosts or [])]:
        if refused(site.launcher, [host]):
            return rule(site.launcher, host)
    return ""


# What a failed connection check says to people other than global administrators -----------------

# Launcher messages that reveal nothing about the network beyond what the person entered: the
# launcher's own keys and configuration, a login that succeeded, and a key refused by a host whose
# host key matched the known_hosts the owner pasted.
USER_FIXABLE = (
    re.compile(r"^The launcher has no key for this "),
    re.compile(r"^The launcher's key for this login cannot be read"),
    re.compile(r"^This launcher does not serve that computer"),
    re.compile(r"^The login node's host, port or account is missing"),
    re.compile(r"^At most \d+ jump hosts"),
    re.compile(r"^The jump host .* is not \[user@\]host\[:port\]"),
    re.compile(r"^Logged in, but "),
    re.compile(r"^(?:the login node|jump host \d+) \S+ refused the launcher's key: "),
)


def user_fixable(detail: str) -> bool:
    return any(pattern.match(detail or "") for pattern in USER_FIXABLE)


GENERIC_PREFIX = "Could not log in to "


def check_failure_for_users(detail: str, host: str, port: int, account: str) -> str:
    """The failure as people who are not global administrators read it: the launcher's message when it
    says only what they can fix, else which login failed and what to check."""
    if user_fixable(detail):
        return detail
    who = f" as {account}" if account else ""
    return (f"{GENERIC_PREFIX}{host}:{port}{who}: check the host, port and account (and the jump hosts and "
            "known_hosts) in the computer's settings. Global administrators can read the launcher's own message.")


# What a failed submission says to people (issue 14, the same rule as connection checks) ----------

# Launcher messages about the network between the launcher and the site: whether a name resolves, a
# port is closed or open, a server speaks SSH, which host key it shows. Only global administrators read
# them; everyone else reads which login failed and who can fix it.
NETWORK_MESSAGES = (
    re.compile(r"^The host name \S+ cannot be resolved"),
    re.compile(r"^The connection to \S+ was refused"),
    re.compile(r"^No answer from \S+ within"),
    re.compile(r"^Cannot connect to \S+"),
    re.compile(r"^The jump host \S+ could not open a connection to"),
    re.compile(r"^The SSH handshake with "),
    re.compile(r"^The host key of "),
)
NOT_TRIED = re.compile(r"^Not tried: logging in to \S+ failed first: ")


def login_reason(detail: str) -> str:
    """The login's own failure inside a `not_tried` report ("Not tried: logging in to h failed first: …")."""
    return NOT_TRIED.sub("", detail or "", count=1)


def reveals_network(detail: str) -> bool:
    """Whether a launcher's message tells something about the network behind it (NETWORK_MESSAGES, or a
    `not_tried` login failure that is not user-fixable); other messages are the job shell's own output
    on the login node, or what the user can fix."""
    if NOT_TRIED.match(detail or ""):
        return not user_fixable(login_reason(detail))
    return any(pattern.match(detail or "") for pattern in NETWORK_MESSAGES)


def sees_launcher_messages(user) -> bool:
    """Global administrators read the launcher's own messages (checks, submissions); others what they can fix."""
    from mado import access as identity

    return identity.is_global_admin(user)
