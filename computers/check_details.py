"""The connection check's details in the reader's language (issue 14).

A worker writes each item's detail in English (worker_agent/probe.py, target_probe.py, ssh.py) and the
server stores it as sent. On display, a detail that matches one of the sentences below is shown in
the reader's language with the values the worker put in (paths, versions, host names stay as they
are); any other text, from an older or newer worker, is shown as it came. So old workers keep
working, the worker stays free of Django, and nothing about the protocol changes.

Each sentence is written exactly as the worker writes it, with `%(name)s` where the worker puts a
value. A value matches any text; when two sentences match, the one with more fixed words wins
("nvidia-smi failed: %(error)s, but GPU IDs are set…" over "nvidia-smi failed: %(error)s.").
tests/test_i18n_refusals.py runs the real probe and checks that its details are all found here."""
from __future__ import annotations

import re
from functools import lru_cache

from django.utils.translation import gettext
from django.utils.translation import gettext_noop as N_

DETAILS = [
    # worker_agent/probe.py: the first item and what could not be checked after it
    N_("Commands run on this machine"),
    N_("Logged in as %(login)s"),
    N_("Running `true` on the target exited with %(code)s: check the SSH user's login shell."),
    N_("Running `true` on the target did not finish in 15 s."),
    N_("Needs a working connection."),
    N_("No Python 3 was found on the target."),
    N_("The check script could not run with the target's Python: %(error)s"),
    N_("The check script could not run with the target's Python within 90 s."),
    N_("Needs a Python on the target."),
    # worker_agent/ssh.py: why the worker could not connect (ConnectError details)
    N_("No host is set for this computer: enter the SSH host."),
    N_("The SSH port must be a number from 1 to 65535."),
    N_("No SSH user is set for this computer: enter the user to log in as."),
    N_("The SSH key path must be an absolute path on the worker machine: enter it again."),
    N_("The known_hosts path must be an absolute path on the worker machine: enter it again."),
    N_("The SSH key file does not exist on the worker machine. Check the SSH key path, or run "
       "mado-tracking-worker doctor on the worker machine."),
    N_("The worker cannot read the SSH key file: make it owned by the worker's user with mode 600."),
    N_("The SSH key path does not point at a file: check it."),
    N_("The SSH key file has mode %(mode)s, so other users can read it; run chmod 600 on it on the worker "
       "machine."),
    N_("The known_hosts file does not exist on the worker machine. Create it with %(command)s and compare the "
       "fingerprint with the target's host key."),
    N_("The SSH key is protected by a passphrase; the worker needs a key without one (create a dedicated key "
       "with ssh-keygen -N '')."),
    N_("The SSH key file is not a private key the worker can use (OpenSSH ed25519, ECDSA or RSA without a "
       "passphrase)."),
    N_("The host name %(host)s cannot be resolved from the worker machine: check the SSH host."),
    N_("The connection to %(where)s was refused: check the host and port, and that sshd runs on the target."),
    N_("No answer from %(where)s within %(seconds)s s: check the host, the port and any firewall between the "
       "worker and the target."),
    N_("Cannot connect to %(where)s (%(error)s): check the host and port."),
    N_("The known_hosts file cannot be read or parsed: recreate it with %(command)s."),
    N_("The host key of %(host)s is not in the known_hosts file. Compare its fingerprint with the target's, "
       "then add it on the worker machine with %(command)s."),
    N_("The host key of %(host)s does not match the known_hosts file. If the target was reinstalled, verify the "
       "new fingerprint and replace its line (ssh-keygen -R); otherwise treat it as an attack."),
    N_("The target refused the key for user %(user)s: add the public key to that user's ~/.ssh/authorized_keys "
       "on the target."),
    N_("The SSH handshake with %(where)s failed: check that the port is an SSH server and that it accepts the "
       "worker's connection."),
    N_("The connection to %(where)s keeps failing: check the target."),
    N_("The connection to %(where)s broke during a command (%(error)s)."),
    N_("Local computers are turned off on this worker: they run commands as the worker's own user, so they need "
       "MADO_DEV_MODE=true and MMT_ALLOW_LOCAL_EXECUTOR=true (development only)."),
    N_("Cannot run %(program)s: %(error)s."),
    # worker_agent/target_probe.py: each item on the target
    N_("%(path)s does not exist or does not run on the target."),
    N_("%(path)s is Python %(version)s; jobs need 3.11 or later."),
    N_("The newest Python found is %(version)s; jobs need 3.11 or later."),
    N_("Needs a Python 3.11 or later."),
    N_("venv and ensurepip are available"),
    N_("venv or ensurepip is missing (%(error)s); install python3-venv."),
    N_("pip is installed into each job's venv by ensurepip"),
    N_("pip is not available; install python3-pip."),
    N_("%(program)s is not installed."),
    N_("%(client)s; server %(server)s"),
    N_("The SSH user cannot use the Docker socket: add it to the docker group and log in again."),
    N_("The Docker daemon is not reachable: start it (systemctl start docker)."),
    N_("%(version)s lacks exec %(flags)s; upgrade it."),
    N_("%(count)s GPU(s): %(gpus)s"),
    N_("nvidia-smi is not installed."),
    N_("nvidia-smi lists no GPUs."),
    N_("nvidia-smi failed: %(error)s."),
    N_("nvidia-smi is not installed, but GPU IDs are set for this computer. Install the NVIDIA driver or clear the "
       "GPU IDs."),
    N_("nvidia-smi lists no GPUs, but GPU IDs are set for this computer. Install the NVIDIA driver or clear the "
       "GPU IDs."),
    N_("nvidia-smi failed: %(error)s, but GPU IDs are set for this computer. Install the NVIDIA driver or clear the "
       "GPU IDs."),
    N_("No working directory has been entered yet."),
    N_("%(path)s is not a directory."),
    N_("The SSH user cannot write in %(path)s (%(error)s)."),
    N_("%(path)s is writable"),
    N_("%(path)s is writable; %(free)s GiB free"),
    N_("%(path)s does not exist yet and can be created in %(base)s"),
    N_("%(path)s does not exist yet and can be created in %(base)s; %(free)s GiB free"),
    N_("No API URL was given to check."),
    N_("%(url)s answers (version %(version)s)"),
    N_("%(url)s answered without status ok."),
    N_("The target cannot reach %(url)s (%(error)s): jobs need it to record."),
]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[re.Pattern, str]]:
    """(regex, English sentence), the sentences with the most fixed text first."""
    compiled = []
    for sentence in DETAILS:
        parts = _PLACEHOLDER.split(sentence)  # literal, name, literal, name, …, literal
        regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>.+?)" for i, part in enumerate(parts))
        fixed = sum(len(part) for part in parts[::2])
        compiled.append((fixed, re.compile(regex, re.DOTALL), sentence))
    compiled.sort(key=lambda entry: -entry[0])
    return [(regex, sentence) for _, regex, sentence in compiled]


def match(detail: str) -> tuple[str, dict] | None:
    """(the English sentence, its values) when the detail is one of DETAILS; None otherwise."""
    for regex, sentence in _patterns():
        found = regex.fullmatch(detail)
        if found is not None:
            return sentence, found.groupdict()
    return None


def translate(detail) -> str:
    """The detail in the active language; any text it does not know, as it is."""
    detail = str(detail or "")
    found = match(detail)
    if found is None:
        return detail
    sentence, values = found
    try:
        return gettext(sentence) % values
    except (KeyError, ValueError, TypeError):  # a translation with other placeholders: never worse than English
        return detail
