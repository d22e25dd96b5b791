from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Kind(models.TextChoices):
    SSH = "ssh", _("SSH")
    LOCAL = "local", _("Local (development only)")
    SITE = "site", _("Site")


class Visibility(models.TextChoices):
    PRIVATE = "private", _("Private")
    PUBLIC = "public", _("Public")


class Runtime(models.TextChoices):
    PYTHON = "python", _("Python")
    DOCKER = "docker", _("Docker")
    APPTAINER = "apptainer", _("Apptainer")
    SINGULARITY = "singularity", _("Singularity")


class CpuArch(models.TextChoices):
    AMD64 = "amd64", "amd64"
    ARM64 = "arm64", "arm64"


class DatasetTransfer(models.TextChoices):
    RELAY = "relay", _("Relay through worker")
    DIRECT = "direct", _("Computer downloads directly from the API")


class CheckStatus(models.TextChoices):
    QUEUED = "queued", _("Waiting for the worker to start checking…")
    CLAIMED = "claimed", _("The worker is checking the connection…")
    SUCCEEDED = "succeeded", _("Connection verified")
    FAILED = "failed", _("Could not verify connection")
    EXPIRED = "expired", _("Expired")


OPEN_CHECK_STATUSES = (CheckStatus.QUEUED, CheckStatus.CLAIMED)


class CheckFailure(models.TextChoices):
    NOT_CLAIMED = "not_claimed", _("The selected worker did not claim the check")
    NO_RESULT = "no_result", _("No result received from the worker")
    CHECK_FAILED = "check_failed", _("Could not verify connection")


class ItemStatus(models.TextChoices):
    OK = "ok", _("OK")
    FAILED = "failed", _("Failed")
    NONE = "none", _("None")
    NOT_CHECKED = "not_checked", _("Not checked")


CHECK_ITEM_KEYS = ["connection", "command_execution", "python", "venv", "pip", "git", "docker", "apptainer",
                   "singularity", "gpu", "work_directory", "api"]

CHECK_ITEM_LABELS = {
    "connection": _("SSH connection"),
    "command_execution": _("Command execution"),
    "python": _("Python"),
    "venv": _("venv"),
    "pip": _("pip"),
    "git": _("git"),
    "docker": _("Docker"),
    "apptainer": _("Apptainer"),
    "singularity": _("Singularity"),
    "gpu": _("GPU (nvidia-smi)"),
    "work_directory": _("Working directory"),
    "api": _("API access"),
}

# What to do about each failure code: shown in the Resolution column of the check table.
RESOLUTIONS = {
    "ssh_configuration": _("The key or known_hosts is missing on the worker machine, or the key is not mode 600. "
                           "Run mado-tracking-worker doctor on the worker machine."),
    "ssh_failed": _("Check the host, port, and SSH user, that the public key is in the target's "
                    "~/.ssh/authorized_keys, and that known_hosts has the target's host key."),
    "host_key_unknown": _("known_hosts has no key for this host. Run ssh-keyscan for the host on the worker "
                          "machine, compare the fingerprint with the target's, and add it to known_hosts."),
    "host_key_changed": _("The target's host key differs from the one in known_hosts. Confirm the new key with "
                          "the target's administrator before replacing it; the worker never accepts changed keys."),
    "local_executor_disabled": _("This worker refuses Local computers. Start it with MADO_DEV_MODE=true and "
                                 "MMT_ALLOW_LOCAL_EXECUTOR=true (development only), or use an SSH computer."),
    "command_failed": _("The worker could not start commands on its own host. Check the worker log."),
    "python_missing": _("Install Python 3.11 or later on the target, or enter the path of one."),
    "python_too_old": _("The Python executable is older than 3.11. Install Python 3.11 or later and enter its path."),
    "venv_missing": _("Install the venv module for this Python (on Debian: apt install python3-venv)."),
    "pip_missing": _("Install pip or ensurepip for this Python (on Debian: apt install python3-venv python3-pip)."),
    "git_missing": _("Install git on the target to run Jobs from Git sources."),
    "docker_missing": _("Install Docker on the target to run Docker Jobs."),
    "docker_socket_denied": _("The SSH user cannot use the Docker daemon. Add the user to the docker group and "
                              "log in again."),
    "docker_daemon_unreachable": _("The Docker daemon is not running. Start it (systemctl start docker)."),
    "apptainer_missing": _("Install Apptainer on the target to run Apptainer Jobs."),
    "singularity_missing": _("Install Singularity on the target to run Singularity Jobs."),
    "container_flags_missing": _("This version lacks --cleanenv, --containall, --no-home, --no-mount, --no-eval or "
                                 "--pwd. Install a newer version."),
    "gpu_query_failed": _("nvidia-smi failed although GPU IDs are set. Check the NVIDIA driver on the target, or "
                          "clear the GPU IDs for a CPU-only computer."),
    "work_directory_not_writable": _("The SSH user cannot write to the working directory. Choose another "
                                     "directory or change its permissions."),
    "work_directory_missing": _("No existing directory leads to the working directory. Create it or choose another."),
    "api_unreachable": _("The target cannot reach the worker's MMT_API_URL, which Jobs need for logging. Check the "
                         "route and URL."),
}


class ReadStatus(models.TextChoices):
    QUEUED = "queued", _("The worker is listing directories…")
    CLAIMED = "claimed", _("The worker is listing directories…")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    EXPIRED = "expired", _("Expired")


class ReadError(models.TextChoices):
    NOT_FOUND = "not_found", _("This directory does not exist")
    PERMISSION_DENIED = "permission_denied", _("Cannot read this directory (permission denied)")
    CONNECT_FAILED = "connect_failed", _("The worker could not connect")
    NOT_A_DIRECTORY = "not_a_directory", _("This is not a directory")
    NOT_CLAIMED = "not_claimed", _("The worker did not pick up the read")


class EntryKind(models.TextChoices):
    DIR = "dir", "dir"
    FILE = "file", "file"
    EXEC = "exec", "exec"
    SYMLINK = "symlink", "symlink"
