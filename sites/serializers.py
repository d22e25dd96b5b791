"""Request bodies of the sites, launcher and runner APIs, for the OpenAPI schema (issue 14: every
endpoint in the schema with its real request body, so clients and the fuzzer know what to send). They
document; the validation itself stays in sites.services, sites.submissions, sites.checks, sites.keys
and sites.launchers, so the API and the pages refuse the same things with the same words
(docs/sites-protocol.md)."""
from __future__ import annotations

from rest_framework import serializers

from computers.choices import CpuArch, Runtime, Visibility
from jobs.choices import EndReason, JobStatus
from jobs.serializers import LogChunkSerializer, MetricPointSerializer
from jobs.services import MAX_METRICS_PER_CALL
from mado.validation import BIGINT_MAX, INT32_MAX, INT32_MIN, NAME_PATTERN
from sites.choices import (
    MAX_ACTIVE_SUBMISSIONS,
    MAX_JOB_SHELL_BYTES,
    MAX_JUMP_HOSTS,
    MAX_KNOWN_HOSTS_BYTES,
    MAX_QUEUE_TIMEOUT,
    MAX_VARIABLES,
    MIN_QUEUE_TIMEOUT,
    AccountKind,
    SubmissionMethod,
    Template,
)
from sites.submissions import MAX_CLAIM, RUNNER_END_REASONS

PATH_HELP = "An absolute path of letters, digits and . _ / + @ - (no spaces, quotes, $ or .. parts)."
VARIABLES_HELP = ("NAME=VALUE pairs (names of letters, digits and _; values words or absolute paths), as an "
                  "object; NAME=VALUE lines in one string are accepted too.")


def _id(**options) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=BIGINT_MAX, **options)


def _variables(**options) -> serializers.DictField:
    return serializers.DictField(child=serializers.CharField(max_length=1024),
                                 help_text=f"{VARIABLES_HELP} At most {MAX_VARIABLES}.", **options)


# Sites (people) -------------------------------------------------------------------------------------

class SiteChangeSerializer(serializers.Serializer):
    """PATCH /api/sites/{id}: the fields to change (the job shell changes as a new version instead)."""

    name = serializers.RegexField(NAME_PATTERN.pattern, max_length=64, required=False)
    visibility = serializers.ChoiceField(choices=Visibility.values, required=False)
    enabled = serializers.BooleanField(required=False)
    runtimes = serializers.ListField(child=serializers.CharField(max_length=32), required=False,
                                     max_length=len(Runtime.values),
                                     help_text=f"Of {', '.join(Runtime.values)}; empty: the template's.")
    cpu_arch = serializers.ChoiceField(choices=CpuArch.values, required=False)
    submission = serializers.ChoiceField(choices=SubmissionMethod.choices, required=False)
    account = serializers.ChoiceField(choices=AccountKind.choices, required=False,
                                      help_text="shared: one account for everyone; personal: each person's own.")
    launcher = _id(required=False, allow_null=True, help_text="Automatic sites: the launcher's id.")
    host = serializers.CharField(required=False, allow_blank=True, max_length=253,
                                 help_text="Automatic sites: the login node, without user or port.")
    port = serializers.IntegerField(required=False, min_value=1, max_value=65535)
    ssh_user = serializers.CharField(required=False, allow_blank=True, max_length=64,
                                     help_text="The shared account's name.")
    jump_hosts = serializers.ListField(child=serializers.CharField(max_length=300), required=False,
                                       max_length=MAX_JUMP_HOSTS, help_text="[user@]host[:port], in hop order.")
    known_hosts = serializers.CharField(required=False, allow_blank=True, max_length=MAX_KNOWN_HOSTS_BYTES,
                                        trim_whitespace=False, help_text="ssh-keyscan output for the login node "
                                        "and the jump hosts.")
    working_dir = serializers.CharField(required=False, max_length=1024, help_text=PATH_HELP)
    runner_python = serializers.CharField(required=False, max_length=1024, help_text=PATH_HELP)
    runner_api_url = serializers.URLField(required=False, max_length=2000,
                                          help_text="This server's URL as the compute nodes reach it.")
    variables = _variables(required=False)
    max_active_submissions = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ACTIVE_SUBMISSIONS)
    queue_timeout_seconds = serializers.IntegerField(required=False, min_value=MIN_QUEUE_TIMEOUT,
                                                     max_value=MAX_QUEUE_TIMEOUT)


class SiteCreateSerializer(SiteChangeSerializer):
    """POST /api/sites: a new site; its job shell starts from `template` or from `job_shell`."""

    name = serializers.RegexField(NAME_PATTERN.pattern, max_length=64)
    kind = serializers.ChoiceField(choices=["site"], required=False)
    working_dir = serializers.CharField(max_length=1024, help_text=PATH_HELP)
    runner_python = serializers.CharField(max_length=1024, help_text=PATH_HELP)
    runner_api_url = serializers.URLField(max_length=2000, help_text="This server's URL as the compute nodes reach it.")
    template = serializers.ChoiceField(choices=Template.choices, required=False,
                                       help_text="The built-in job shell to start from (required without job_shell).")
    job_shell = serializers.CharField(required=False, max_length=MAX_JOB_SHELL_BYTES, trim_whitespace=False,
                                      help_text="Version 1 of the job shell, instead of a template.")


class JobShellSaveSerializer(serializers.Serializer):
    content = serializers.CharField(max_length=MAX_JOB_SHELL_BYTES, trim_whitespace=False,
                                    help_text="bash defining mmt_submit and mmt_cancel; content different from the "
                                              "current version makes the next version.")


class MineSerializer(serializers.Serializer):
    mine = serializers.BooleanField(required=False, default=False,
                                    help_text="true: your own account (after My settings); false: the shared "
                                              "account (owners and global administrators).")


class MySettingsSerializer(serializers.Serializer):
    account_name = serializers.RegexField(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$", max_length=64,
                                          help_text="Your account on this computer.")
    working_dir = serializers.CharField(required=False, allow_blank=True, max_length=1024,
                                        help_text=f"Blank: the computer's. {PATH_HELP}")
    variables = _variables(required=False)


# Submissions (launcher and mado-tracking submit) -----------------------------------------------------

class ManualClaimSerializer(serializers.Serializer):
    all = serializers.BooleanField(required=False, default=False,
                                   help_text="Everyone's waiting Jobs of the token's project (the computer's owner).")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_CLAIM)
    work_dir = serializers.CharField(required=False, allow_blank=True, max_length=1024,
                                     help_text=f"Instead of the site's working directory. {PATH_HELP}")
    variables = _variables(required=False)


class SubmissionReportSerializer(serializers.Serializer):
    job_ids = serializers.ListField(child=_id(), min_length=1, max_length=MAX_CLAIM,
                                    help_text="Job ids of one claim, each once.")
    outcome = serializers.ChoiceField(choices=["submitted", "failed", "not_tried"])
    scheduler_job_id = serializers.RegexField(r"^[A-Za-z0-9][\[\]A-Za-z0-9._:-]{0,199}$", required=False,
                                              allow_blank=True, help_text="submitted: the id the job shell printed.")
    error = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                  help_text="failed / not_tried: the (masked) stderr tail or the login's failure.")


class LauncherClaimSerializer(serializers.Serializer):
    computer = _id(help_text="A site of the launcher's config.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_CLAIM)


class LauncherKeySerializer(serializers.Serializer):
    computer = _id(help_text="A site of the launcher's config.")
    user = _id(allow_null=True, help_text="The person of an own-account site; null for the shared account.")
    public_key = serializers.CharField(max_length=1000, help_text="One ssh-ed25519 public key line.")


class LauncherCheckCompleteSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    error = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                  help_text="Why the login or `true` failed.")
    duration_ms = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=3_600_000)


class CancellationReportSerializer(serializers.Serializer):
    job_id = _id(help_text="A Job of a cancellation from the config.")
    ok = serializers.BooleanField()
    error = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)


class LauncherCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(NAME_PATTERN.pattern, max_length=64)
    project = serializers.CharField(max_length=64, help_text="The slug of the project the launcher's token "
                                                             "belongs to.")
    allowed_hosts = serializers.ListField(child=serializers.CharField(max_length=255), required=False,
                                          max_length=100, help_text="Host name patterns (fnmatch) the launcher may "
                                                                    "log in to; empty: nowhere.")


class LauncherChangeSerializer(serializers.Serializer):
    allowed_hosts = serializers.ListField(child=serializers.CharField(max_length=255), max_length=100,
                                          help_text="Replaces the list: host name patterns such as "
                                                    "*.hpc.example.ac.jp or login[1-4].example.org.")


# The runner (the Job's job token) --------------------------------------------------------------------

class RunnerBodySerializer(serializers.Serializer):
    runner_id = serializers.UUIDField(help_text="The uuid the runner made when it started; sent with every call.")


class RunnerStartSerializer(RunnerBodySerializer):
    hostname = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                     help_text="The compute node's name.")
    scheduler_job_id = serializers.RegexField(r"^[A-Za-z0-9][\[\]A-Za-z0-9._:-]{0,199}$", required=False,
                                              allow_blank=True)
    array_index = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=INT32_MAX)
    replica = serializers.CharField(required=False, allow_blank=True, max_length=16,
                                    help_text="A cluster job's replica (main1, sub1 …); main1 or absent otherwise.")


class RunnerHeartbeatSerializer(RunnerBodySerializer):
    status = serializers.ChoiceField(choices=[JobStatus.RUNNING], required=False, allow_null=True,
                                     help_text="running, once the code started.")


class RunnerLogsSerializer(RunnerBodySerializer):
    chunks = LogChunkSerializer(many=True)


class RunnerMetricsSerializer(RunnerBodySerializer):
    metrics = serializers.ListField(child=MetricPointSerializer(), max_length=MAX_METRICS_PER_CALL)


class RunnerOutputFileSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX)
    sha256 = serializers.CharField(required=False, allow_blank=True)
    kind = serializers.CharField(required=False, default="file")


class RunnerOutputsSerializer(RunnerBodySerializer):
    result = serializers.CharField(allow_blank=True, trim_whitespace=False, help_text="The text of result.json.")
    files = RunnerOutputFileSerializer(many=True, help_text="The outputs directory as the runner saw it.")
    manifest = serializers.CharField(required=False, allow_null=True, trim_whitespace=False)


class RunnerFinishSerializer(RunnerBodySerializer):
    status = serializers.ChoiceField(choices=[JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED])
    exit_code = serializers.IntegerField(required=False, allow_null=True, min_value=INT32_MIN, max_value=INT32_MAX)
    end_reason = serializers.ChoiceField(choices=[(r, EndReason(r).label) for r in RUNNER_END_REASONS],
                                         required=False, allow_null=True)
    error = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
