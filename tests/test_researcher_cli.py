"""`mado-tracking jobs …` against a real live server."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from jobs.models import Job, LogChunk, SourceArchive
from tests.job_fixtures import gpu_computer
from worker_agent.researcher import _git_source, main

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(world, live_server, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    token = world.token(world.member, ["read", "jobs:write"])
    runner = CliRunner()

    def run(*args, token_value=token, **env):
        return runner.invoke(main, list(args), env={"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token_value,
                                                    "MMT_API_TOKEN_FILE": None, **env})
    run.token = token
    return run


@pytest.fixture
def box(world):
    return gpu_computer(world.global_admin)


def test_help_needs_no_configuration():
    result = CliRunner().invoke(main, ["jobs", "create", "--help"], env={"MMT_API_URL": None, "MMT_API_TOKEN": None})
    assert result.exit_code == 0 and "--computer" in result.output


def test_jobs_create_queues_the_command_after_the_double_dash(cli, box):
    result = cli("jobs", "create", "--computer", str(box.pk), "--gpu", "0", "--gpu", "2", "--param", "lr=0.01",
                 "--param", "name=resnet", "--", "python", "train.py", "--epochs", "3")
    assert result.exit_code == 0, result.output
    job = Job.objects.get()
    assert f"Created job {job.pk} on gpu-host-1" in result.output
    assert job.command == ["python", "train.py", "--epochs", "3"]
    assert job.gpu_ids == ["0", "2"] and job.parameters == {"lr": 0.01, "name": "resnet"}


def test_jobs_create_uploads_a_source_directory_as_an_archive_with_progress(cli, box, tmp_path):
    source = tmp_path / "project"
    (source / ".git").mkdir(parents=True)
    (source / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (source / "train.py").write_text("print('training')\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy==2.1.0\n")
    result = cli("jobs", "create", "--computer", str(box.pk), "--source", str(source), "--requirements",
                 str(requirements), "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert "Uploading source" in result.output
    job = Job.objects.get()
    archive = SourceArchive.objects.get(pk=job.source["id"])
    import tarfile

    with tarfile.open(archive.file.path) as tar:
        names = tar.getnames()
    assert "./train.py" in names and not any(".git" in n for n in names)
    assert job.requirements == "numpy==2.1.0\n"


def test_git_sources_split_url_and_ref():
    assert _git_source("https://github.com/org/repo.git@v1.2") == {"kind": "git", "url": "https://github.com/org/repo.git",
                                                                   "ref": "v1.2"}
    assert _git_source("git@github.com:org/repo.git") == {"kind": "git", "url": "git@github.com:org/repo.git",
                                                          "ref": "HEAD"}


def test_jobs_list_logs_and_stop(cli, box, world):
    created = cli("jobs", "create", "--computer", str(box.pk), "--name", "baseline", "--", "python", "x.py")
    assert created.exit_code == 0, created.output
    job = Job.objects.get()
    listing = cli("jobs", "list")
    assert "baseline" in listing.output and "queued" in listing.output and "bob" in listing.output
    LogChunk.objects.create(job=job, stream="stdout", offset=0, data="epoch 1\n")
    LogChunk.objects.create(job=job, stream="stderr", offset=0, data="warn\n")
    logs = cli("jobs", "logs", str(job.pk))
    assert "epoch 1" in logs.output and "warn" in logs.output
    stopped = cli("jobs", "stop", str(job.pk))
    assert stopped.exit_code == 0 and f"Job {job.pk} was canceled." in stopped.output
    followed = cli("jobs", "logs", str(job.pk), "--follow")
    assert followed.exit_code == 0 and "canceled" in followed.output


@pytest.mark.parametrize("args,env,text", [
    (["jobs", "list"], {"MMT_API_URL": None}, "Set MMT_API_URL"),
    (["jobs", "list"], {"MMT_API_TOKEN": ""}, "Set MMT_API_TOKEN"),
    (["jobs", "list"], {"MMT_API_TOKEN": "mmt_" + "x" * 43}, "Issue a new token"),
    (["jobs", "create", "--computer", "999", "--", "python", "x.py"], {}, "not available to you"),
    (["jobs", "create", "--computer", "1", "--source", ".", "--git", "https://x/y.git", "--", "x"], {}, "not both"),
])
def test_errors_say_what_to_do_and_exit_non_zero(cli, args, env, text):
    result = cli(*args, **env)
    assert result.exit_code != 0
    assert text in result.output
    assert cli.token not in result.output


def test_jobs_create_sets_the_kind_of_the_jobs_run(cli, box):
    from tracking.models import Run

    result = cli("jobs", "create", "--computer", str(box.pk), "--run-kind", "fine-tuning", "--", "python", "ft.py")
    assert result.exit_code == 0, result.output
    assert Run.objects.get(job=Job.objects.get()).kind == "fine-tuning"
    refused = cli("jobs", "create", "--computer", str(box.pk), "--run-kind", "baking", "--", "python", "x.py")
    assert refused.exit_code != 0 and "--run-kind" in refused.output and "fine-tuning" in refused.output
    assert Job.objects.count() == 1
