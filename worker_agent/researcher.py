"""`mado-tracking`: the researcher's command line. Create jobs, list them, follow their logs, stop them.

It talks to the server with a personal API token (`MMT_API_URL`, `MMT_API_TOKEN` or
`MMT_API_TOKEN_FILE`); the project is the token's own project."""
from __future__ import annotations

import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import click

from worker_agent import __version__, datasets_cli
from worker_agent.cli_client import Api, api_client, token_project

UPLOAD_CHUNK = 256 * 1024
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mado-tracking")
@click.option("--api-url", envvar="MMT_API_URL", help="Address of the Mado server. [MMT_API_URL]")
@click.option("--token-file", envvar="MMT_API_TOKEN_FILE", type=click.Path(dir_okay=False),
              help="Read the API token from this file. [MMT_API_TOKEN_FILE]")
@click.pass_context
def main(ctx: click.Context, api_url: str | None, token_file: str | None) -> None:
    """Work with Mado Compute from the command line."""
    ctx.obj = {"api_url": api_url, "token_file": token_file}


@main.group()
def jobs() -> None:
    """Create, list, follow and stop jobs."""


def _parse_param(values: tuple[str, ...]) -> dict:
    params = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: write parameters as NAME=VALUE.", param_hint="--param")
        try:
            params[name] = json.loads(raw)
        except ValueError:
            params[name] = raw
    return params


def _git_source(value: str) -> dict:
    """URL@REF; an '@' inside the URL (git@host:org/repo.git) is not a ref separator."""
    url, sep, ref = value.rpartition("@")
    if not sep or not ref or "/" in ref or ":" in ref or not url:
        return {"kind": "git", "url": value, "ref": "HEAD"}
    return {"kind": "git", "url": url, "ref": ref}


def _archive(directory: Path) -> Path:
    """The source directory as a .tar.gz in a temporary file (caches and VCS folders left out)."""
    handle = tempfile.NamedTemporaryFile(prefix="mado-source-", suffix=".tar.gz", delete=False)
    handle.close()

    def keep(info: tarfile.TarInfo):
        parts = Path(info.name).parts
        return None if any(p in SKIPPED_DIRS for p in parts) else info

    with tarfile.open(handle.name, "w:gz") as tar:
        tar.add(directory, arcname=".", filter=keep)
    return Path(handle.name)


def _upload_source(api: Api, project: str, directory: Path) -> dict:
    archive = _archive(directory)
    try:
        size = archive.stat().st_size
        with open(archive, "rb") as data, click.progressbar(length=size, label="Uploading source",
                                                            file=sys.stderr) as bar:
            def chunks():
                while block := data.read(UPLOAD_CHUNK):
                    bar.update(len(block))
                    yield block

            return api.call("PUT", f"/api/projects/{project}/sources", data=chunks(),
                            headers={"Content-Type": "application/gzip", "Content-Length": str(size)})
    finally:
        archive.unlink(missing_ok=True)


# The kinds of a Run (the server's tracking.choices.RunKind; it checks them again).
RUN_KINDS = ["training", "fine-tuning", "inference", "evaluation", "preprocessing", "other"]


@jobs.command("create", context_settings={"ignore_unknown_options": True})
@click.option("--computer", type=int, help="The computer's ID (Global settings → Computers); not for multi-node.")
@click.option("--runtime", default="python", show_default=True,
              type=click.Choice(["python", "docker", "apptainer", "singularity"]))
@click.option("--image", default="", help="Image for docker/apptainer/singularity jobs.")
@click.option("--gpu", "gpus", multiple=True, help="A GPU ID to reserve; repeat for more (SSH and Local computers).")
@click.option("--gpu-count", type=click.IntRange(0, 64),
              help="How many GPUs a site's scheduler gives the job (sites; they pick the GPUs themselves).")
@click.option("--requirements", type=click.Path(exists=True, dir_okay=False), help="A requirements.txt for the venv.")
@click.option("--source", type=click.Path(exists=True, file_okay=False), help="A directory uploaded as the source.")
@click.option("--git", "git_source", help="A git source as URL@REF.")
@click.option("--param", "params", multiple=True, help="A parameter NAME=VALUE (JSON values allowed); repeat.")
@click.option("--input-dataset", "input_datasets", type=click.IntRange(1), multiple=True,
              help="A dataset version ID the job reads (MMT_INPUT_DATASET_DIRS); repeat for more.")
@click.option("--walltime", type=click.IntRange(1, 30 * 24 * 3600), help="Seconds before the job is stopped.")
@click.option("--name", default="", help="The run name.")
@click.option("--run-kind", type=click.Choice(RUN_KINDS),
              help="What the job's Run does (the Runs page filters by it; only training and fine-tuning Runs "
                   "register result.json models). Default: other.")
@click.option("--cluster-size", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Replicas to run (main1, sub1, …); resources are per replica.")
@click.option("--cluster-mode", type=click.Choice(["single-node", "multi-node"]), default="single-node",
              show_default=True, help="All replicas on --computer, or spread over --compute-group.")
@click.option("--compute-group", help="The compute group (name or ID) of a multi-node cluster job.")
@click.option("--gpus-per-replica", type=click.IntRange(0, 64), help="GPUs each replica gets (cluster jobs).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def jobs_create(ctx, computer, runtime, image, gpus, gpu_count, requirements, source, git_source, params,
                input_datasets, walltime, name, run_kind,
                cluster_size, cluster_mode, compute_group, gpus_per_replica, command):
    """Queue COMMAND on a computer, e.g. `mado-tracking jobs create --computer 3 -- python train.py`,
    or N replicas of it: `--cluster-size 3 --cluster-mode multi-node --compute-group lab-nodes`."""
    if source and git_source:
        raise click.UsageError("Choose --source DIR or --git URL@REF, not both.")
    multi = cluster_size > 1 and cluster_mode == "multi-node"
    if not multi and computer is None:
        raise click.UsageError("Give --computer ID, or run a multi-node cluster job with --cluster-size N "
                               "--cluster-mode multi-node --compute-group GROUP.")
    if cluster_size > 1 and gpus:
        raise click.UsageError("A cluster job does not name GPUs: give --gpus-per-replica N instead of --gpu.")
    if cluster_size > 1 and gpu_count is not None:
        raise click.UsageError("A cluster job asks its GPUs per replica: give --gpus-per-replica N instead of "
                               "--gpu-count.")
    if gpus and gpu_count is not None:
        raise click.UsageError("Give --gpu ID (SSH and Local computers) or --gpu-count N (sites), not both.")
    api = api_client(ctx)
    project = token_project(api)
    body = {"runtime": runtime, "image": image, "command": list(command),
            "parameters": _parse_param(params), "name": name, **_placement(computer, gpus, cluster_size, cluster_mode,
                                                                           compute_group, gpus_per_replica)}
    if gpu_count is not None:
        body["gpu_count"] = gpu_count  # the server refuses it on SSH and Local computers, saying to use --gpu
    if walltime:
        body["walltime_seconds"] = walltime
    if input_datasets:
        body["input_datasets"] = list(input_datasets)
    if run_kind:
        body["run_kind"] = run_kind
    if requirements:
        body["requirements"] = Path(requirements).read_text()
    if git_source:
        body["source"] = _git_source(git_source)
    if source:
        uploaded = _upload_source(api, project, Path(source))
        body["source"] = {"kind": "archive", "id": uploaded["id"]}
    job = api.call("POST", f"/api/projects/{project}/jobs", json=body)
    where = (f"compute group {job['compute_group']['name']}" if job.get("compute_group")
             else job["computer"]["name"])
    size = f", {job['cluster_size']} replicas" if job.get("cluster_size", 1) > 1 else ""
    click.echo(f"Created job {job['id']} on {where}{size} ({job['status']}).")
    click.echo(f"Follow it with: mado-tracking jobs logs {job['id']} --follow")


def _placement(computer, gpus, cluster_size, cluster_mode, compute_group, gpus_per_replica) -> dict:
    """The create fields that say where the job runs (docs/cluster-jobs.md); the server checks them."""
    body = {"gpu_ids": list(gpus), **({"computer": computer} if computer is not None else {})}
    if cluster_size > 1:
        body.update(cluster_size=cluster_size, cluster_mode=cluster_mode, gpu_ids=[])
        if gpus_per_replica is not None:
            body["gpus_per_replica"] = gpus_per_replica
    elif gpus_per_replica:
        body["gpus_per_replica"] = gpus_per_replica  # refused by the server with what to give instead
    if compute_group:
        body["compute_group"] = compute_group
    return body


@jobs.command("list")
@click.option("--status", type=click.Choice(["queued", "claimed", "running", "finished", "failed", "canceled"]))
@click.option("--json", "as_json", is_flag=True, help="Print the JSON answer.")
@click.pass_context
def jobs_list(ctx, status, as_json):
    """The project's jobs, newest first."""
    api = api_client(ctx)
    answer = api.call("GET", f"/api/projects/{token_project(api)}/jobs", params={"status": status} if status else None)
    if as_json:
        click.echo(json.dumps(answer["items"], indent=2))
        return
    click.echo(f"{'ID':>6}  {'STATUS':10} {'CREATOR':12} {'COMPUTER':16} {'GPUS':8} NAME")
    for job in answer["items"]:
        flag = " (not responding)" if job.get("unresponsive") else ""
        click.echo(f"{job['id']:>6}  {job['status']:10} {job['created_by'][:12]:12} {job['computer']['name'][:16]:16} "
                   f"{','.join(job['gpu_ids']) or '-':8} {job['name']}{flag}")


@jobs.command("logs")
@click.argument("job_id", type=int)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.1, 60))
@click.option("--replica", help="Only this replica of a cluster job (main1, sub1, …); all when absent.")
@click.pass_context
def jobs_logs(ctx, job_id, follow, interval, replica):
    """Print a job's stdout and stderr (stderr to stderr)."""
    api = api_client(ctx)
    after = 0
    while True:
        params = {"after": after, **({"replica": replica} if replica else {})}
        page = api.call("GET", f"/api/jobs/{job_id}/logs", params=params)
        for chunk in page["items"]:
            click.echo(chunk["data"], nl=False, err=chunk["stream"] == "stderr")
        after = page["next"]
        if page["items"]:
            continue
        if not follow or page["status"] in ("finished", "failed", "canceled"):
            if follow:
                click.echo(f"[job {job_id} {page['status']}]", err=True)
            return
        time.sleep(interval)


@jobs.command("stop")
@click.argument("job_id", type=int)
@click.pass_context
def jobs_stop(ctx, job_id):
    """Request stop: SIGTERM, SIGKILL after 10 s, then the job ends as canceled."""
    job = api_client(ctx).call("POST", f"/api/jobs/{job_id}/stop")
    if job["status"] == "canceled":
        click.echo(f"Job {job_id} was canceled.")
    else:
        click.echo(f"Stop requested for job {job_id}; the worker stops it and it ends as canceled.")


# `submit` and `runner` live with the rest of the sites agent (worker_agent/site/), `datasets` in datasets_cli.
from worker_agent.site.cli import runner_command, submit_command  # noqa: E402

main.add_command(submit_command, "submit")
main.add_command(runner_command, "runner")
main.add_command(datasets_cli.datasets)
