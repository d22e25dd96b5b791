"""Value validation of job shells (REFERENCE §5): counts are decimal with at most 9 digits, paths are
absolute `[A-Za-z0-9._/+@-]`, words are `[A-Za-z0-9._-]` not starting with `-`. Injection attempts in
variables, paths and names are refused twice: by the server before rendering, and by the script
itself, so a script run with values that bypassed the server still refuses them before any
scheduler command runs."""
from __future__ import annotations

import pytest

from mado.errors import ServiceError
from sites import shells
from sites.choices import Template
from tests.sites.shell_kit import calls, prepare, run, standin

CANARY = "/tmp/mado-injection-canary"
ATTEMPTS = [
    f"gpu; touch {CANARY}",
    f"gpu$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"gpu\ntouch {CANARY}",
    "gpu' '--wrap=id",
    "--wrap=id",
    "-x",
    "a b",
    "$HOME",
    "gpu|id",
    "",
]


def values(**overrides) -> shells.ShellValues:
    fields = {"spec_dir": "/work/mmt/.mmt-submissions/12", "runner": "/work/mmt/.mmt-submissions/12/mmt-runner",
              "job_ids": [12], "project_id": 3, "target_id": 7, "variables": {"PARTITION": "gpu"}}
    fields.update(overrides)
    return shells.ShellValues(**fields)


def refused(**overrides) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        shells.render_submit(shells.builtin_template("slurm"), values(**overrides))
    assert caught.value.code == "invalid_shell_values" and caught.value.status == 422
    return caught.value


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_the_server_refuses_injection_attempts_in_variable_values(attempt):
    assert "variables" in refused(variables={"PARTITION": attempt}).fields


@pytest.mark.parametrize("name", ["A-B", "1ST", "X Y", "X;Y", "", "A" * 65])
def test_the_server_refuses_variable_names_that_are_not_identifiers(name):
    assert "variables" in refused(variables={name: "ok"}).fields


@pytest.mark.parametrize("path", ["relative/dir", "/work/my dir", "/work/$(id)", "/work/`id`", "/work/a;b",
                                  "/work/../etc", "/work/x\n", "/work/'x'", "~/mmt", "/" + "a" * 1024])
def test_the_server_refuses_paths_that_are_not_plain_absolute_paths(path):
    assert set(refused(spec_dir=path, runner=path).fields) == {"spec_dir", "runner"}


@pytest.mark.parametrize("field, value", [
    ("job_ids", []), ("job_ids", [0]), ("job_ids", [-1]), ("job_ids", [1_000_000_000]), ("job_ids", [5, 5]),
    ("job_ids", ["5; id"]), ("project_id", 0), ("target_id", "7"), ("gpu_count", -1), ("gpu_count", True),
    ("walltime_seconds", 0), ("walltime_seconds", 10 ** 9), ("walltime_seconds", 1.5),
])
def test_the_server_refuses_counts_that_are_not_decimal_with_at_most_nine_digits(field, value):
    assert field in refused(**{field: value}).fields


def test_words_and_absolute_paths_are_both_accepted_as_variable_values():
    script = shells.render_submit(shells.builtin_template("slurm"), values(variables={
        "PARTITION": "gpu-a100", "MODULES": "/apps/modules/cuda_12.2+cudnn@9", "QOS": "high.prio_1"}))
    assert "export MMT_VAR_MODULES=/apps/modules/cuda_12.2+cudnn@9" in script


@pytest.mark.parametrize("text, problem", [
    ("PARTITION", "write NAME=VALUE"),
    ("PARTITION=gpu\nPARTITION=cpu", "given twice"),
    ("\n".join(f"V{i}=x" for i in range(65)), "At most 64 variables"),
])
def test_variable_text_is_name_equals_value_lines_at_most_64(text, problem):
    with pytest.raises(ServiceError) as caught:
        shells.parse_variables(text)
    assert problem in caught.value.message


def test_variable_text_ignores_blank_lines_and_comments():
    assert shells.parse_variables("# queue\nPARTITION = gpu\n\nGROUP=gp42\r\n") == {"PARTITION": "gpu",
                                                                                 "GROUP": "gp42"}


@pytest.mark.parametrize("scheduler_id", ["", "1; touch /tmp/x", "$(id)", "-1", "1 2", "a" * 201])
def test_cancel_refuses_scheduler_ids_that_no_job_shell_printed(scheduler_id):
    with pytest.raises(ServiceError):
        shells.render_cancel(shells.builtin_template("slurm"), scheduler_job_id=scheduler_id, target_id=7)


def test_the_scheduler_id_is_the_last_non_empty_stdout_line_and_empty_output_means_none():
    assert shells.parse_scheduler_id("module loaded\n4242\n\n") == "4242"
    assert shells.parse_scheduler_id("12346[].pbs01\n") == "12346[].pbs01"
    assert shells.parse_scheduler_id("") is None
    for bad in ("Submitted batch job 12\n", "x" * 201 + "\n", "$(id)\n"):
        with pytest.raises(ValueError):
            shells.parse_scheduler_id(bad)


def test_stderr_tails_keep_the_last_1000_characters_with_secrets_and_tokens_masked():
    token = "mmt_" + "A" * 43
    tail = shells.stderr_tail("x" * 5000 + f"\nlogin as u1 with {token} at /home/u1/.ssh/id\x1b[0m\n",
                              secrets=["/home/u1/.ssh/id"])
    assert len(tail) == 1000
    assert token not in tail and "/home/u1/.ssh/id" not in tail and "\x1b" not in tail
    assert tail.endswith("login as u1 with **** at ****[0m\n")


# The script's own checks ------------------------------------------------------------------------

def bypassing_script(tmp_path, template: str, **env_overrides):
    """A rendered script whose exports were tampered with after the server validated them."""
    rendered = prepare(tmp_path, template, variables={"PARTITION": "gpu"})
    env = rendered.values.environment()
    env.update(env_overrides)
    lines = ["#!/bin/bash", "set -eu", "umask 077"]
    lines += [f"export {name}=\"{value}\"" if "$" not in value and "`" not in value else f"export {name}='{value}'"
              for name, value in env.items()]
    lines += [shells.builtin_template(template), "mmt_submit"]
    rendered.script.write_text("\n".join(lines) + "\n")
    return rendered


SCHEDULER_COMMAND = {"slurm": "sbatch", "pbs": "qsub", "gridengine": "qsub", "tcs": "pjsub",
                     "docker_host": "docker", "apptainer_host": "apptainer"}


@pytest.mark.parametrize("template", Template.values)
@pytest.mark.parametrize("name, value", [
    ("MMT_VAR_PARTITION", f"gpu$(touch {CANARY})"),
    ("MMT_VAR_PARTITION", "--wrap=id"),
    ("MMT_VAR_PARTITION", "gpu\n"),
    ("MMT_SPEC_DIR", f"/tmp/x; touch {CANARY}"),
    ("MMT_RUNNER", "mmt-runner"),
    ("MMT_JOB_IDS", f"1,2;touch {CANARY}"),
    ("MMT_GPU_COUNT", "01"),
    ("MMT_WALLTIME_SECONDS", "1e9"),
    ("MMT_WALLTIME", "1:00:00"),
    ("MMT_ARRAY_SIZE", "2"),
])
def test_the_job_shell_itself_refuses_tampered_values_before_any_scheduler_command(tmp_path, template, name, value):
    import os

    if os.path.exists(CANARY):
        os.unlink(CANARY)
    bin_dir = tmp_path / "bin"
    command = SCHEDULER_COMMAND[template]
    standin(bin_dir, command, stdout="1\n")
    rendered = bypassing_script(tmp_path, template, **{name: value})
    result = run(rendered.script, bin_dir)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"mado job shell: {name} must"), result.stderr
    assert calls(bin_dir, command) == []
    assert not os.path.exists(CANARY)


def test_the_cancel_script_itself_refuses_a_tampered_scheduler_id(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "scancel")
    script = tmp_path / "cancel.sh"
    script.write_text(shells.render_cancel(shells.builtin_template("slurm"), scheduler_job_id="4242", target_id=7)
                      .replace("export MMT_SCHEDULER_JOB_ID=4242", "export MMT_SCHEDULER_JOB_ID='4242 --user=root'"))
    result = run(script, bin_dir)
    assert result.returncode == 2 and "MMT_SCHEDULER_JOB_ID must" in result.stderr
    assert calls(bin_dir, "scancel") == []


def test_a_site_variable_is_checked_where_the_template_uses_it_too(tmp_path):
    """Values a template derives (defaults and fallbacks) are checked as words as well."""
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stdout="1\n")
    rendered = prepare(tmp_path, "slurm")
    text = rendered.script.read_text().replace("cpus=${MMT_VAR_CPUS:-1}", "cpus=${MMT_VAR_CPUS:-1x}")
    rendered.script.write_text(text)
    result = run(rendered.script, bin_dir)
    assert result.returncode == 2 and "cpus must be a whole number" in result.stderr
    assert calls(bin_dir, "sbatch") == []
