"""Spec directories written locally (`mado-tracking submit`) and over SSH (the launcher) to a real
sshd's login user: modes, contents, exactly the bundled modules, links refused, and the wrapper
starting the bundled runner (a bad directory → exit 2)."""
from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from worker_agent.site import spec
from worker_agent.site.login import run_script

TOKEN = "mado_mtj_" + "A" * 40


def submission(work_dir, job_ids=(11, 12), runner_python="/usr/bin/python3") -> dict:
    root = f"{work_dir}/.mmt-submissions"
    return {"batch": "b", "computer": 7, "job_ids": list(job_ids), "working_dir": str(work_dir), "spec_root": root,
            "runner_python": runner_python, "api_url": "https://tracking.example.org",
            "jobs": [{"id": i, "spec_dir": f"{root}/{i}", "token": f"{TOKEN}{i}", "job": {"id": i, "command": ["x"]}}
                     for i in job_ids]}


def tree(path) -> dict[str, int]:
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            found[os.path.relpath(full, path)] = stat.S_IMODE(os.lstat(full).st_mode)
    return found


def assert_spec_dir(directory, job_id):
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    modes = tree(directory)
    assert modes == {
        "job.json": 0o600, "mmt-runner": 0o700, "lib": 0o700, "lib/worker_agent": 0o700,
        "lib/worker_agent/site": 0o700, "lib/worker_agent/core": 0o700, **{f"lib/{rel}": 0o600 for rel in spec.BUNDLE}}
    data = json.loads((directory / "job.json").read_text())
    assert data == {"format": 1, "api_url": "https://tracking.example.org", "token": f"{TOKEN}{job_id}",
                    "job": {"id": job_id, "command": ["x"]}}
    wrapper = (directory / "mmt-runner").read_text()
    assert wrapper.startswith("#!/bin/sh\n")
    assert f"exec /usr/bin/python3 -I {directory}/lib/worker_agent/site/runner.py \"$@\"" in wrapper
    for rel in spec.BUNDLE:
        assert (directory / "lib" / rel).read_bytes() == (spec.Path(spec.worker_agent.__file__).parent.parent / rel) \
            .read_bytes()


def test_the_local_writer_makes_each_jobs_directory_with_its_token_runner_and_bundled_modules(tmp_path):
    work = tmp_path / "work"
    spec.write_local(submission(work))
    assert stat.S_IMODE(os.lstat(work / ".mmt-submissions").st_mode) == 0o700
    for job_id in (11, 12):
        assert_spec_dir(work / ".mmt-submissions" / str(job_id), job_id)


def test_writing_again_replaces_the_files_and_leaves_no_stale_module(tmp_path):
    work = tmp_path / "work"
    spec.write_local(submission(work, job_ids=(11,)))
    stale = work / ".mmt-submissions/11/lib/worker_agent/old.py"
    stale.write_text("")
    (work / ".mmt-submissions/11").chmod(0o755)
    spec.write_local(submission(work, job_ids=(11,)))
    assert not stale.exists()
    assert_spec_dir(work / ".mmt-submissions" / "11", 11)


def test_the_wrapper_starts_the_bundled_runner_which_refuses_a_bad_directory_with_exit_2(tmp_path):
    work = tmp_path / "work"
    spec.write_local(submission(work, job_ids=(11,)))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "/nonexistent"}
    result = subprocess.run([str(work / ".mmt-submissions/11/mmt-runner"), str(tmp_path / "missing")],
                            capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 2, result.stderr
    assert "Configuration error" in result.stderr and TOKEN not in result.stderr


@pytest.mark.parametrize("linked", [".mmt-submissions", ".mmt-submissions/11", ".mmt-submissions/11/lib"])
def test_a_symbolic_link_from_the_spec_root_down_is_refused(tmp_path, linked):
    work = tmp_path / "work"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / linked).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, work / linked)
    if linked.endswith("lib"):
        spec.write_local(submission(work, job_ids=(11,)))  # lib is replaced, the link itself removed
        assert not (work / linked).is_symlink() and os.listdir(elsewhere) == []
        return
    with pytest.raises(spec.SpecError) as refused:
        spec.write_local(submission(work, job_ids=(11,)))
    assert "symbolic link" in str(refused.value)
    assert os.listdir(elsewhere) == []


def test_a_spec_directory_outside_the_spec_root_is_refused(tmp_path):
    bad = submission(tmp_path / "work", job_ids=(11,))
    bad["jobs"][0]["spec_dir"] = str(tmp_path / "work" / "11")
    with pytest.raises(spec.SpecError, match="is not inside"):
        spec.write_local(bad)


def test_the_remote_writer_over_ssh_makes_the_same_directories_owned_by_the_login_user(pool, login, sshd,
                                                                                       remote_dir):
    connection = pool.get(login())
    spec.write_remote(connection, submission(remote_dir))
    assert os.lstat(remote_dir).st_uid == sshd.home.stat().st_uid
    for job_id in (11, 12):
        directory = remote_dir / ".mmt-submissions" / str(job_id)
        assert os.lstat(directory).st_uid == sshd.home.stat().st_uid
        assert_spec_dir(directory, job_id)
    # The runner the job shell would start, as the login user: a bad directory is a configuration error.
    result = run_script(connection, f"{remote_dir}/.mmt-submissions/11/mmt-runner {remote_dir}/nope", timeout=30)
    assert result.exit_code == 2, result.stderr


def test_the_remote_writer_refuses_a_linked_spec_root_and_says_where(pool, login, remote_dir):
    connection = pool.get(login())
    run_script(connection, f"mkdir -p {remote_dir} && ln -s /tmp {remote_dir}/.mmt-submissions", timeout=20)
    with pytest.raises(spec.SpecError) as refused:
        spec.write_remote(connection, submission(remote_dir, job_ids=(11,)))
    assert str(refused.value).startswith("Writing the spec directories on 127.0.0.1 failed: .mmt-submissions is a "
                                         "symbolic link")
