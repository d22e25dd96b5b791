"""Job shells (REFERENCE §5): the built-in templates, validation of saved content and of every value
passed in, rendering into the bash script a launcher or `mado-tracking submit` runs, and reading the
scheduler's answer.

A job shell defines two functions: `mmt_submit`, which submits the Jobs and prints only the scheduler
job id as its last stdout line, and `mmt_cancel`, which cancels the job `MMT_SCHEDULER_JOB_ID`. The
rendered script exports the `MMT_*` variables (validated here, and again by the script itself), then
the job shell, then calls one of the two functions.

A third, `mmt_find`, is optional (every built-in template has one; an owner's own job shell may
not): when the answer to an earlier try was lost, it looks for the job that try submitted, named
`mmt-<first Job id>`, so it is adopted rather than submitted twice. Status 0: found, and it printed
the scheduler job id (nothing on hosts without a scheduler, where it finds the runners still
running); status 1: not found, printed nothing; any other status: it could not tell, and the script
fails without submitting.

A fourth, `mmt_supports_clusters`, says the job shell runs cluster jobs (docs/cluster-jobs.md,
"Sites"): given `MMT_CLUSTER_SIZE` N > 1, its mmt_submit asks the scheduler for N nodes and starts one
runner per node, each learning its replica from `SLURM_PROCID` (or `MMT_REPLICA_INDEX`). Only its
presence counts, never its output: the server lets cluster jobs reach a site only while the site's
current job shell defines it (sites.services.runs_clusters), and renders no cluster job with a shell that does not.
The built-in Slurm template defines it; the others do not.

Standard library only (plus mado.errors and Django's gettext for the messages), so the rules can be read in
one place."""
from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from mado.errors import ServiceError
from sites.choices import DEFAULT_WALLTIME_SECONDS, MAX_JOB_SHELL_BYTES, MAX_VARIABLES, Template

TEMPLATE_DIR = Path(__file__).resolve().parent / "job_shells"
COMMON_MARKER = "#@common\n"
HOSTS_MARKER = "#@hosts\n"  # the runner-starting part the Docker and Apptainer host templates share

# The value rules, the same as the checks inside every built-in job shell.
PATH = re.compile(r"^/[A-Za-z0-9._/+@-]{0,1023}$")
WORD = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,199}$")
DOTDOT = re.compile(r"(^|/)\.\.(/|$)")
VARIABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
SCHEDULER_ID = re.compile(r"^[A-Za-z0-9][\[\]A-Za-z0-9._:-]{0,199}$")
FUNCTION = r"^[ \t]*(function[ \t]+{name}\b|{name}[ \t]*\([ \t]*\))"
CLUSTER_FUNCTION = "mmt_supports_clusters"
MAX_WORD_OR_PATH = 1024
MAX_CLUSTER_SIZE = 64  # jobs.choices.MAX_CLUSTER_SIZE; kept here so this module stays standalone

# Cancel command of each built-in template (None: no scheduler, the runner stops when asked).
CANCEL_COMMANDS = {
    Template.SLURM: "scancel",
    Template.PBS: "qdel",
    Template.GRIDENGINE: "qdel",
    Template.TCS: "pjdel",
    Template.DOCKER_HOST: None,
    Template.APPTAINER_HOST: None,
}


# Built-in templates ------------------------------------------------------------------------------

@cache
def builtin_template(key: str) -> str:
    """The built-in job shell `key` (a Template value), with the common checks written in, so what the
    owner sees and edits is exactly what runs."""
    if key not in Template.values:
        raise ServiceError(_("Choose a job shell template from %(templates)s.") % {
            "templates": ", ".join(Template.values)}, "unknown_template", fields={"template": [_("Unknown template.")]})
    body = (TEMPLATE_DIR / f"{key}.sh").read_text()
    common = (TEMPLATE_DIR / "_common.sh").read_text()
    hosts = (TEMPLATE_DIR / "_hosts.sh").read_text()
    return body.replace(COMMON_MARKER, common, 1).replace(HOSTS_MARKER, hosts, 1)


def builtin_templates() -> list[dict]:
    return [{"key": t.value, "label": str(t.label), "content": builtin_template(t.value),
             "cancel_command": CANCEL_COMMANDS[t]} for t in Template]


# Saved content -----------------------------------------------------------------------------------

def normalize_content(content) -> str:
    """Line endings of a pasted script made Unix ones (a CR breaks every bash line)."""
    if not isinstance(content, str):
        raise ServiceError("The job shell must be text.", "invalid_job_shell", fields={"content": ["Text expected."]})
    return content.replace("\r\n", "\n").replace("\r", "\n")


def content_sha256(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def validate_content(content: str) -> None:
    """1 B – 1 MiB of text defining mmt_submit and mmt_cancel (mmt_find is optional), which bash can
    parse (`bash -n` only parses: nothing of the content runs on the server)."""
    size = len(content.encode("utf-8"))
    problem = None
    if not content.strip():
        problem = _("The job shell is empty; start from a template.")
    elif size > MAX_JOB_SHELL_BYTES:
        problem = _("The job shell is %(size)s bytes; keep it under 1 MiB.") % {"size": size}
    elif "\0" in content:
        problem = _("The job shell contains a NUL character; paste it as plain text.")
    else:
        missing = [name for name in ("mmt_submit", "mmt_cancel") if not defines(content, name)]
        if missing:
            problem = (_("The job shell must define %(functions)s: mmt_submit submits and prints the scheduler job id "
                         "as its last line, mmt_cancel cancels MMT_SCHEDULER_JOB_ID.")
                       % {"functions": " and ".join(f"{m}()" for m in missing)})
        else:
            problem = bash_syntax_error(content)
    if problem:
        raise ServiceError(problem, "invalid_job_shell", fields={"content": [problem]})


def defines(content: str, name: str) -> bool:
    """Whether the job shell defines the function `name` (`name() {` or `function name`)."""
    return bool(re.search(FUNCTION.format(name=name), content, re.MULTILINE))


def supports_clusters(content: str) -> bool:
    """Whether a job shell declares that it starts one runner per replica (`mmt_supports_clusters`)."""
    return defines(content, CLUSTER_FUNCTION)


def bash_syntax_error(content: str) -> str | None:
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="mado-job-shell-") as handle:
        handle.write(content)
        handle.flush()
        result = subprocess.run(["bash", "-n", handle.name], check=False, capture_output=True, text=True, timeout=10)
    if result.returncode == 0:
        return None
    detail = result.stderr.replace(handle.name, "job shell").strip().splitlines()
    return _("bash cannot parse the job shell: %(detail)s.") % {"detail": "; ".join(detail[:3]) or "syntax error"}


# Values ------------------------------------------------------------------------------------------

def is_path(value) -> bool:
    return isinstance(value, str) and bool(PATH.fullmatch(value)) and not DOTDOT.search(value)


def is_word(value) -> bool:
    return isinstance(value, str) and bool(WORD.fullmatch(value))


def is_variable_value(value) -> bool:
    return is_word(value) or is_path(value)


PATH_RULE = gettext_noop("an absolute path of letters, digits and . _ / + @ - (no spaces, quotes, $ or .. parts)")
WORD_RULE = gettext_noop("a word of letters, digits and . _ - that does not start with -")


def path_rule() -> str:
    """PATH_RULE in the reader's language."""
    return _(PATH_RULE)


def word_rule() -> str:
    return _(WORD_RULE)


def parse_variables(raw, *, field_name: str = "variables") -> dict[str, str]:
    """`NAME=VALUE` lines (or a JSON object) into an ordered dict. Values are words or absolute paths:
    they reach scheduler options, so quotes, spaces, `$` and the like are refused, not escaped."""
    if raw in (None, ""):
        return {}
    pairs: list[tuple[str, object, int | None]] = []
    if isinstance(raw, dict):
        pairs = [(str(k), v, None) for k, v in raw.items()]
    elif isinstance(raw, str):
        for number, line in enumerate(raw.replace("\r\n", "\n").split("\n"), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, value = line.strip().partition("=")
            if not sep:
                raise _invalid(field_name, _("Line %(number)s: write NAME=VALUE.") % {"number": number})
            pairs.append((name.strip(), value.strip(), number))
    elif isinstance(raw, list):
        for number, line in enumerate(raw, start=1):
            name, sep, value = str(line).partition("=")
            if not sep:
                raise _invalid(field_name, _("Entry %(number)s: write NAME=VALUE.") % {"number": number})
            pairs.append((name.strip(), value.strip(), number))
    else:
        raise _invalid(field_name, _("Give the variables as NAME=VALUE lines."))
    out: dict[str, str] = {}
    for name, value, number in pairs:
        where = _("Line %(number)s: ") % {"number": number} if number else ""
        if not VARIABLE_NAME.fullmatch(name):
            raise _invalid(field_name, where + _("%(name)s is not a variable name: use letters, digits and _, "
                                                 "starting with a letter (at most 64).") % {"name": repr(name)})
        if name in out:
            raise _invalid(field_name, where + _("%(name)s is given twice.") % {"name": name})
        if not isinstance(value, str) or not is_variable_value(value):
            raise _invalid(field_name, where + _("The value of %(name)s must be %(word)s, or %(path)s.") % {
                "name": name, "word": word_rule(), "path": path_rule()})
        out[name] = value
    if len(out) > MAX_VARIABLES:
        raise _invalid(field_name, _("At most %(max)s variables; %(count)s given.") % {
            "max": MAX_VARIABLES, "count": len(out)})
    return out


def walltime_hms(seconds: int) -> str:
    """HH:MM:SS; hours go past 24 (30 hours is 30:00:00), as every scheduler here accepts."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


@dataclass
class ShellValues:
    """What a job shell gets for one submission (one Job, or an array of Jobs with the same needs)."""

    spec_dir: str
    runner: str
    job_ids: list[int]
    project_id: int
    target_id: int
    gpu_count: int = 0
    walltime_seconds: int = DEFAULT_WALLTIME_SECONDS
    variables: dict[str, str] = field(default_factory=dict)
    # A cluster job's replicas: one node and one runner each. 1 for every other Job.
    cluster_size: int = 1

    def validate(self) -> None:
        errors: dict[str, list[str]] = {}
        for name in ("spec_dir", "runner"):
            if not is_path(getattr(self, name)):
                errors[name] = [f"Must be {PATH_RULE}."]
        ids = self.job_ids
        if not ids or not all(_positive_count(i) for i in ids) or len(set(ids)) != len(ids):
            errors["job_ids"] = ["Give one or more different Job ids."]
        for name in ("project_id", "target_id"):
            if not _positive_count(getattr(self, name)):
                errors[name] = ["Must be a positive whole number of at most 9 digits."]
        if not _count(self.gpu_count):
            errors["gpu_count"] = ["The GPU count must be a whole number of at most 9 digits."]
        if not _positive_count(self.cluster_size) or self.cluster_size > MAX_CLUSTER_SIZE:
            errors["cluster_size"] = [f"The cluster size is a whole number from 1 to {MAX_CLUSTER_SIZE}."]
        elif self.cluster_size > 1 and len(ids or []) != 1:
            errors["cluster_size"] = ["A cluster job is submitted alone, never in an array."]
        if not _count(self.walltime_seconds) or self.walltime_seconds < 1:
            errors["walltime_seconds"] = ["The time limit must be 1 second or more, at most 9 digits."]
        try:
            parse_variables(self.variables)
        except ServiceError as exc:
            errors["variables"] = exc.fields.get("variables", [exc.message])
        if errors:
            summary = " ".join(f"{name}: {' '.join(messages)}" for name, messages in errors.items())
            raise ServiceError(f"These job shell values are refused: {summary}", "invalid_shell_values",
                               fields=errors)

    def environment(self) -> dict[str, str]:
        self.validate()
        env = {
            "MMT_SPEC_DIR": self.spec_dir,
            "MMT_RUNNER": self.runner,
            "MMT_JOB_IDS": ",".join(str(i) for i in self.job_ids),
            "MMT_ARRAY_SIZE": str(len(self.job_ids)),
            "MMT_GPU_COUNT": str(self.gpu_count),
            "MMT_WALLTIME_SECONDS": str(self.walltime_seconds),
            "MMT_WALLTIME": walltime_hms(self.walltime_seconds),
            "MMT_PROJECT_ID": str(self.project_id),
            "MMT_TARGET_ID": str(self.target_id),
        }
        if self.cluster_size > 1:
            # Only for cluster jobs, so every other script is what it always was.
            env["MMT_CLUSTER_SIZE"] = str(self.cluster_size)
            env["MMT_NODES"] = str(self.cluster_size)  # one node per replica
        env.update({f"MMT_VAR_{name}": value for name, value in self.variables.items()})
        return env


# What an adopting script runs after the job shell. mmt_find runs in a subshell (its stdout is the
# answer) on the left of ||, so a status of 1 does not stop the script under `set -e`.
ADOPT_CALL = """\
mmt_find_status=0
mmt_found=$(mmt_find) || mmt_find_status=$?
case $mmt_find_status in
0) if [ -n "$mmt_found" ]; then printf '%s\\n' "$mmt_found"; fi ;;
1) mmt_submit ;;
*)
    printf 'mado job shell: mmt_find could not tell whether %s was already submitted (status %s); %s\\n' \\
        "mmt-${MMT_JOB_IDS%%,*}" "$mmt_find_status" "not submitting it again." >&2
    exit "$mmt_find_status"
    ;;
esac"""
NO_FIND = "# This job shell defines no mmt_find, so an earlier try cannot be found: submitting again.\nmmt_submit"


def render_submit(content: str, values: ShellValues, *, title: str = "", adopt: bool = False) -> str:
    """The whole script for one submission: values exported, the job shell, then mmt_submit. With
    `adopt` (the answer to an earlier try was lost), mmt_find first: the id of the job that try
    submitted is printed as the last stdout line instead of submitting again; when mmt_find finds
    nothing, or the job shell does not define it, mmt_submit runs."""
    if adopt:
        call = ADOPT_CALL if defines(content, "mmt_find") else NO_FIND
    else:
        call = "mmt_submit"
    return _render(content, values.environment(), call, title)


def render_cancel(content: str, *, scheduler_job_id: str, target_id: int, variables: dict[str, str] | None = None,
                  title: str = "") -> str:
    """The whole script that cancels one scheduler job with the same job shell."""
    if not isinstance(scheduler_job_id, str) or not SCHEDULER_ID.fullmatch(scheduler_job_id):
        raise ServiceError("The scheduler job id is not one a job shell printed.", "invalid_shell_values",
                           fields={"scheduler_job_id": ["Letters, digits and . _ : - [ ] only."]})
    if not _positive_count(target_id):
        raise ServiceError("The computer id must be a positive number.", "invalid_shell_values",
                           fields={"target_id": ["Invalid."]})
    variables = parse_variables(variables or {})
    env = {"MMT_SCHEDULER_JOB_ID": scheduler_job_id, "MMT_TARGET_ID": str(target_id)}
    env.update({f"MMT_VAR_{name}": value for name, value in variables.items()})
    return _render(content, env, "mmt_cancel", title)


def _render(content: str, env: dict[str, str], call: str, title: str) -> str:
    lines = ["#!/bin/bash"]
    if title:
        lines.append("# " + " ".join(title.split()))
    lines += ["set -eu", "umask 077"]
    # Validated above; quoted anyway, so even a value that slipped through stays one word.
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines += ["", "# ---- job shell ----", content.rstrip("\n"), "# ---- end of job shell ----", "", call, ""]
    return "\n".join(lines)


# Answers -----------------------------------------------------------------------------------------

def parse_scheduler_id(stdout: str) -> str | None:
    """The scheduler job id a job shell printed as its last stdout line; None when it printed nothing
    (hosts without a scheduler). ValueError when the last line is not an id (≤ 200 chars, no spaces)."""
    lines = [line.strip() for line in (stdout or "").splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1]
    if len(last) > 200 or not SCHEDULER_ID.fullmatch(last):
        raise ValueError(f"The job shell's last stdout line is not a scheduler job id: {last[:80]!r}")
    return last


def stderr_tail(stderr: str, secrets: list[str] = (), limit: int = 1000) -> str:
    """The last `limit` characters of a failed job shell's stderr, with secrets masked and control
    characters (other than newlines and tabs) removed."""
    text = stderr or ""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "****")
    text = re.sub(r"(?:mmtj?|mado_mtj)_[A-Za-z0-9_-]{16,}", "****", text)
    text = "".join(ch for ch in text if ch in "\n\t" or ch.isprintable())
    return text[-limit:]


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 999_999_999


def _positive_count(value) -> bool:
    return _count(value) and value >= 1


def _invalid(field_name: str, message: str) -> ServiceError:
    return ServiceError(message, "invalid_variables", fields={field_name: [message]})
