"""Sites (DESIGN §8): the settings of a site computer, its versioned job shells, each person's own
settings, launchers with their public keys, the launchers' connection checks, and the submissions of
Jobs to a site's scheduler."""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from computers.choices import OPEN_CHECK_STATUSES
from computers.models import CheckBase
from sites.choices import (
    DEFAULT_MAX_ACTIVE_SUBMISSIONS,
    DEFAULT_QUEUE_TIMEOUT,
    MAX_ACTIVE_SUBMISSIONS,
    MAX_QUEUE_TIMEOUT,
    MIN_QUEUE_TIMEOUT,
    AccountKind,
    SubmissionMethod,
    SubmissionStatus,
    Template,
)


class Launcher(models.Model):
    """A `mado-tracking-launcher` registered by a global administrator. It holds the private keys;
    the server knows only its token (hashed, in ApiToken) and the public keys it publishes."""

    name = models.CharField(_("Name"), max_length=64, unique=True)
    token = models.OneToOneField("mado.ApiToken", on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="launcher")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    version = models.CharField(max_length=64, blank=True)
    # Where this launcher may log in (sites' destinations and jump hosts): fnmatch-style patterns
    # matched case-insensitively against the host as written, set by global administrators. Empty: nowhere.
    allowed_hosts = models.JSONField(
        _("Allowed hosts"), default=list, blank=True,
        help_text=_("Host name patterns such as *.hpc.example.ac.jp or login[1-4].example.org; sites of this "
                    "launcher may name only matching hosts and jump hosts. Empty: nowhere."))

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class SiteSettings(models.Model):
    """One per site computer (ComputeTarget of kind `site`)."""

    target = models.OneToOneField("computers.ComputeTarget", on_delete=models.CASCADE, related_name="site_settings")
    submission = models.CharField(_("Submission method"), max_length=16, choices=SubmissionMethod.choices,
                                  default=SubmissionMethod.AUTOMATIC)
    account = models.CharField(_("Account"), max_length=16, choices=AccountKind.choices, default=AccountKind.SHARED)
    launcher = models.ForeignKey(Launcher, on_delete=models.PROTECT, null=True, blank=True, related_name="sites")
    host = models.CharField(_("Host"), max_length=255, blank=True)
    port = models.PositiveIntegerField(_("Port"), default=22, validators=[MinValueValidator(1), MaxValueValidator(65535)])
    ssh_user = models.CharField(_("Shared account name"), max_length=64, blank=True,
                                help_text=_("The account everyone runs under, for a shared account."))
    jump_hosts = models.JSONField(_("Jump hosts"), default=list, blank=True,
                                  help_text=_("[user@]host[:port], in the order the launcher hops through them."))
    known_hosts = models.TextField(_("known_hosts"), blank=True)
    working_dir = models.CharField(_("Working directory"), max_length=1024)
    runner_python = models.CharField(_("Runner Python"), max_length=1024)
    runner_api_url = models.CharField(_("API URL seen from the runner"), max_length=2000)
    variables = models.JSONField(_("Variables"), default=dict, blank=True)
    template = models.CharField(_("Started from template"), max_length=16, choices=Template.choices, blank=True)
    max_active_submissions = models.PositiveIntegerField(
        _("Max active submissions"), default=DEFAULT_MAX_ACTIVE_SUBMISSIONS,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_ACTIVE_SUBMISSIONS)])
    queue_timeout_seconds = models.PositiveIntegerField(
        _("Queue timeout (seconds)"), default=DEFAULT_QUEUE_TIMEOUT,
        validators=[MinValueValidator(MIN_QUEUE_TIMEOUT), MaxValueValidator(MAX_QUEUE_TIMEOUT)])
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "site settings"
        constraints = [
            models.CheckConstraint(condition=Q(port__gte=1, port__lte=65535), name="site_port_range"),
            models.CheckConstraint(condition=Q(max_active_submissions__gte=1,
                                               max_active_submissions__lte=MAX_ACTIVE_SUBMISSIONS),
                                   name="site_max_active_range"),
            models.CheckConstraint(condition=Q(queue_timeout_seconds__gte=MIN_QUEUE_TIMEOUT,
                                               queue_timeout_seconds__lte=MAX_QUEUE_TIMEOUT),
                                   name="site_queue_timeout_range"),
        ]

    def __str__(self) -> str:
        return f"site settings of {self.target}"

    @property
    def uses_personal_accounts(self) -> bool:
        """Automatic submission under each requester's own account: My settings are needed."""
        return self.submission == SubmissionMethod.AUTOMATIC and self.account == AccountKind.PERSONAL

    @property
    def runs_under_own_account(self) -> bool:
        """The job shell runs under the requester's account (trust warning): personal or manual."""
        return self.submission == SubmissionMethod.MANUAL or self.account == AccountKind.PERSONAL


class ImmutableRow(Exception):
    pass


class JobShell(models.Model):
    """One version of a site's job shell. Rows are never changed: saving different content makes the
    next version, and each submission keeps the version it ran."""

    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, related_name="job_shells")
    version = models.PositiveIntegerField()
    content = models.TextField()
    sha256 = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["target", "-version"]
        constraints = [
            # Two saves racing for the same next version: the database lets one win.
            models.UniqueConstraint(fields=["target", "version"], name="job_shell_version_once"),
            models.CheckConstraint(condition=Q(version__gte=1), name="job_shell_version_positive"),
        ]

    def __str__(self) -> str:
        return f"job shell v{self.version} of {self.target_id}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ImmutableRow("Job shell versions are immutable; save new content as a new version.")
        super().save(*args, **kwargs)


class SiteUserSettings(models.Model):
    """My settings on a site that runs under each person's own account."""

    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, related_name="site_user_settings")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="site_settings")
    account_name = models.CharField(_("Account name"), max_length=64)
    working_dir = models.CharField(_("Working directory"), max_length=1024, blank=True,
                                   help_text=_("Blank: the computer's working directory."))
    variables = models.JSONField(_("Variables"), default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "site user settings"
        constraints = [models.UniqueConstraint(fields=["target", "user"], name="site_user_settings_once")]

    def __str__(self) -> str:
        return f"{self.user} on {self.target_id}"


class LauncherKey(models.Model):
    """A public key a launcher generated for a site: the shared account's (user empty) or one person's.
    The private key never leaves the launcher's host."""

    launcher = models.ForeignKey(Launcher, on_delete=models.CASCADE, related_name="keys")
    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, related_name="launcher_keys")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                             related_name="launcher_keys")
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=80)
    created_at = models.DateTimeField(default=timezone.now)
    recreate_requested_at = models.DateTimeField(
        null=True, blank=True, help_text=_("Someone asked for a new key; the launcher makes and publishes one."))

    class Meta:
        ordering = ["target", "user", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["launcher", "target"], condition=Q(user__isnull=True),
                                    name="one_shared_key_per_site"),
            models.UniqueConstraint(fields=["launcher", "target", "user"], condition=Q(user__isnull=False),
                                    name="one_personal_key_per_site_user"),
        ]

    def __str__(self) -> str:
        return f"{self.fingerprint} ({self.target_id}, {self.user or 'shared'})"


class SiteCheck(CheckBase):
    """A site's launcher logging in with a fresh connection and running `true` (sites.checks): as the
    shared account (site_user empty), or as one person's own account."""

    ANSWER = "answer"

    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, related_name="site_checks")
    launcher = models.ForeignKey(Launcher, on_delete=models.CASCADE, related_name="checks")
    site_user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                                  related_name="+")
    account_name = models.CharField(max_length=64, blank=True)

    class Meta(CheckBase.Meta):
        constraints = [
            # One open check of the shared account: two owners pressing Check at once get a 409.
            models.UniqueConstraint(fields=["target"],
                                    condition=Q(status__in=OPEN_CHECK_STATUSES, site_user__isnull=True),
                                    name="one_open_site_check_per_target"),
            # On a site under each person's own account, each person checks their own login.
            models.UniqueConstraint(fields=["target", "site_user"],
                                    condition=Q(status__in=OPEN_CHECK_STATUSES, site_user__isnull=False),
                                    name="one_open_site_check_per_user"),
        ]


class CancelState(models.TextChoices):
    QUEUED = "queued", _("Cancellation queued")
    DONE = "done", _("Canceled in the scheduler")
    FAILED = "failed", _("Cancellation failed")


class Submission(models.Model):
    """A Job handed to a site's scheduler by a launcher or by `mado-tracking submit`. Jobs submitted
    together as one array share `batch`; each keeps the job shell version it ran."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="submission")
    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, related_name="submissions")
    job_shell = models.ForeignKey(JobShell, on_delete=models.PROTECT, related_name="submissions")
    launcher = models.ForeignKey(Launcher, on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="submissions")
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+", help_text=_("Who ran mado-tracking submit (manual sites)."))
    batch = models.UUIDField(db_index=True)
    array_index = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=SubmissionStatus.choices, default=SubmissionStatus.CLAIMED)
    account_name = models.CharField(max_length=64, blank=True,
                                    help_text=_("The site account it was submitted under (blank: manual)."))
    work_dir = models.CharField(max_length=1024, blank=True)
    scheduler_job_id = models.CharField(max_length=200, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    lease_id = models.UUIDField(null=True, blank=True)
    claimed_at = models.DateTimeField(default=timezone.now)
    reported_at = models.DateTimeField(null=True, blank=True)
    # The one runner allowed to report for the Job: the first to start; any other gets 409.
    runner_id = models.UUIDField(null=True, blank=True)
    runner_hostname = models.CharField(max_length=255, blank=True)
    runner_started_at = models.DateTimeField(null=True, blank=True)
    # A cluster job's runners, one per replica: {"sub1": {"runner_id", "hostname", "started_at",
    # "running_at"?, "ended"?}}. runner_id/runner_hostname above are main1's; runner_started_at is the
    # first replica's start.
    replica_runners = models.JSONField(default=dict, blank=True)
    # A stop of a Job already in the scheduler: the launcher runs the job shell's mmt_cancel.
    cancel_state = models.CharField(max_length=8, choices=CancelState.choices, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reported_at = models.DateTimeField(null=True, blank=True)
    cancel_error = models.CharField(max_length=1000, blank=True)

    class Meta:
        ordering = ["-claimed_at", "-id"]
        indexes = [models.Index(fields=["target", "status"], name="submission_site_status"),
                   models.Index(fields=["launcher", "cancel_state"], name="submission_cancellations")]

    def __str__(self) -> str:
        return f"submission of job {self.job_id} ({self.status})"
