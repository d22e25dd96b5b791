"""From Jobs to the script a launcher or `mado-tracking submit` runs: the site's current job shell
version (recorded with the submission), the site's variables, then the requester's own, then --var."""
from __future__ import annotations

import pytest

from mado.errors import ServiceError
from mado.services import Actor
from sites import services
from tests.sites.conftest import make_job
from tests.sites.shell_kit import calls, run, standin

pytestmark = pytest.mark.django_db


def test_jobs_render_with_the_current_job_shell_version_named_in_the_script(world, make_site):
    target = make_site(world.member)
    job = make_job(target, world.member, world.project, walltime_seconds=5400)
    script, shell = services.render_submission(target, [job])
    assert shell.version == 1
    assert script.splitlines()[1] == (f"# Mado Compute: job shell version 1 of computer {target.pk} "
                                      f"(sha256 {shell.sha256[:12]}), Jobs {job.pk}")
    assert f"export MMT_SPEC_DIR=/work/mmt/.mmt-submissions/{job.pk}" in script
    assert "export MMT_WALLTIME=01:30:00" in script and "export MMT_VAR_PARTITION=gpu" in script


def test_a_job_without_a_time_limit_gets_one_hour(world, make_site):
    target = make_site(world.member)
    values = services.shell_values(target, [make_job(target, world.member, world.project)])
    assert values.walltime_seconds == 3600 and values.gpu_count == 0


def test_an_older_version_renders_when_asked_for_and_a_newer_one_by_default(world, make_site):
    target = make_site(world.member)
    first = services.current_job_shell(target)
    services.save_job_shell(Actor(world.member), target, "mmt_submit() { echo 1; }\nmmt_cancel() { :; }\n")
    job = make_job(target, world.member, world.project)
    assert services.render_submission(target, [job])[1].version == 2
    script, shell = services.render_submission(target, [job], job_shell=first)
    assert shell == first and "sbatch" in script


def test_command_line_variables_override_the_sites_and_are_validated(world, make_site):
    target = make_site(world.member)
    job = make_job(target, world.member, world.project)
    values = services.shell_values(target, [job], extra_variables={"PARTITION": "debug"}, work_dir="/scratch/me")
    assert values.variables["PARTITION"] == "debug" and values.spec_dir.startswith("/scratch/me/")
    with pytest.raises(ServiceError):
        services.shell_values(target, [job], extra_variables={"PARTITION": "debug;id"})


def test_jobs_of_different_needs_are_not_submitted_as_one_array(world, make_site):
    target = make_site(world.member)
    jobs = [make_job(target, world.member, world.project, walltime_seconds=600),
            make_job(target, world.member, world.project, walltime_seconds=1200)]
    with pytest.raises(ServiceError) as caught:
        services.shell_values(target, jobs)
    assert caught.value.code == "invalid_submission"
    same = [make_job(target, world.member, world.project, gpu_count=1) for _ in range(3)]
    assert services.shell_values(target, same).job_ids == [j.pk for j in same]


def test_the_cancellation_script_cancels_with_the_versions_cancel_command(world, make_site, tmp_path):
    target = make_site(world.member, template="tcs", variables="GROUP=gp42")
    script = tmp_path / "cancel.sh"
    script.write_text(services.render_cancellation(target, services.current_job_shell(target), "5678"))
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjdel")
    result = run(script, bin_dir)
    assert result.returncode == 0, result.stderr
    assert calls(bin_dir, "pjdel")[0]["argv"] == ["5678"]
