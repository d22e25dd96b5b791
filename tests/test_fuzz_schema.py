"""The fuzzer (issue 14): schemathesis reads /api/schema/ from the live server and sends every operation
generated requests, schema-valid and schema-breaking ones, as five principals: a project member (a
personal token with every member scope), a global administrator, a worker (its service account's
worker:execute token, after a hello), the job token of a claimed, running job (on the runner paths,
that of a site Job its launcher claimed and whose runner started) and a registered launcher's token
(launcher:execute). No answer may be a server error, and every 4xx answer carries the documented body
{"error": <sentence>, "code": <snake_case>, "fields"?: {...}}.

Bounded and repeatable (about a minute on a quiet machine): a few examples per operation and mode,
derandomized (the same requests every run), no shrinking, no example database. Each generated request goes to
every principal still in the running for the operation; one refused with 401/403 by the first request
gets one schema-breaking request more, not the whole set. Then the boundary cases of schemathesis's
coverage phase (values just past and at their bounds, missing fields, wrong types and content types)
and a request with generated path parameters go to the first principal the operation admits.

Path parameters name real objects of a prepared world (a computer, claimed jobs, a check, a read, a
dataset version, a site, its site check, a spare launcher), so requests get past the 404s. Worker and
runner bodies carry the real worker id, leases and runner id, and launcher bodies the launcher's site,
wherever the generated ones are valid, so they get past those checks.
Long-poll waits are cut to 0 seconds. Operations that take something away (revoke, disable, complete,
a new token, goodbye…) run last, against spare objects where they can.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import time
import uuid
from collections import Counter

import pytest
import requests
import schemathesis
from django.core.servers.basehttp import WSGIRequestHandler
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from mado import services
from mado.choices import Role
from mado.validation import NAME_PATTERN
from tests.conftest import ALL_MEMBER_SCOPES, World, bearer
from tests.datasets.conftest import Uploader
from tests.job_fixtures import JobWorker, gpu_computer, job_request

# Source archives are bytes like any other: the server itself refuses what is not a .tar.gz.
schemathesis.serializer.alias("application/gzip", "application/octet-stream")

PRINCIPALS = ["member", "global_admin", "worker", "job", "launcher"]
# Examples per operation: schema-valid, schema-breaking, with generated path parameters, and boundary
# cases of schemathesis's coverage phase. For a deeper or another search than the suite's:
# MADO_FUZZ_SCALE=5 multiplies them, MADO_FUZZ_SEED=n draws other examples than the derandomized ones,
# MADO_FUZZ_PATHS=<regex> fuzzes only the operations whose path matches.
SCALE = int(os.environ.get("MADO_FUZZ_SCALE") or 1)
SEED = os.environ.get("MADO_FUZZ_SEED")
PATHS = re.compile(os.environ.get("MADO_FUZZ_PATHS") or ".")
EXAMPLES = {"positive": 3 * SCALE, "negative": 3 * SCALE, "free_paths": 1 * SCALE, "coverage": 20 * SCALE}
# Who gets an operation's boundary cases and generated paths: the first of these it admits.
COVERAGE_ORDER = ["worker", "job", "launcher", "global_admin", "member"]
REQUEST_TIMEOUT = 20
ERROR_CODE = re.compile(r"^[a-z][a-z0-9_]*$")
# Operations whose success takes something away from a principal (its token, its worker, its job; a
# launcher's recreated token replaces the old one): run last and only on the prepared objects, so the
# other operations are fuzzed with everything still working; goodbye very last.
LAST = re.compile(r"/(revoke|disable|complete|finish|stop|lost|token|release)$")


class FuzzWorld:
    """The objects the path parameters name, and the principals' tokens."""

    def __init__(self, tmp_path):
        self.world = world = World()
        self.computer = gpu_computer(world.global_admin)
        admin_token = world.token(world.global_admin, ALL_MEMBER_SCOPES)
        self.worker = JobWorker(world.worker_token, "fuzz-worker")
        assert self.worker.hello().status_code == 200
        member = bearer(world.member_token(world.member))
        # Two claimed, running jobs: the worker's fuzz may end the first; the second's token is the job principal.
        jobs = [member.post("/api/projects/lab/jobs", job_request(self.computer), format="json").json()
                for _ in range(2)]
        self.job, self.job_token_job = (self.worker.claim() for _ in jobs)
        for item in (self.job, self.job_token_job):
            self.worker.heartbeat(item, "running")
        admin = bearer(admin_token)
        self.check = admin.post(f"/api/computers/{self.computer.pk}/checks", {"worker_id": "fuzz-worker"},
                                format="json").json()
        check_item = self.worker.claim_check()
        self.read = admin.post(f"/api/computers/{self.computer.pk}/reads", {"path": "/data",
                                                                            "worker_id": "fuzz-worker"},
                               format="json").json()
        read_item = self.worker.claim_read()
        self.leases = {"check": check_item["lease_id"], "read": read_item["lease_id"]}
        uploader = Uploader(world.token(world.member, ["read", "registry:write"]))
        self.dataset = uploader.create_dataset("speech", description="fuzzed").json()
        self.version = uploader.upload(self.dataset["id"], {"a.txt": b"aaaa"})
        self.site, self.launcher, launcher_token = self._site(world, tmp_path)
        self.site_check, self.runner = self._site_jobs(world)
        # Recreating a token, revoking and changing allowed hosts act on this one, not on the principal's.
        self.spare_launcher = self._launcher(world, "spare-launcher")[0]
        # Things the fuzz may revoke or disable without hurting the principals.
        spare = services.create_service_account(services.Actor(world.global_admin), world.project,
                                                name="spare-bot", role=Role.MEMBER)
        self.spare_account = spare.pk
        spare_token, _ = services.issue_token(services.SYSTEM, user=world.member, project=world.project,
                                              scopes=["read"])
        self.spare_token = spare_token.pk
        self.tokens = {"member": world.member_token(world.member), "global_admin": admin_token,
                       "worker": world.worker_token, "job": self.job_token_job["job_token"],
                       "launcher": launcher_token}

    def headers(self, principal: str, path: str) -> dict:
        """The runner paths take the job token of the site Job they name (the job principal's there)."""
        token = self.runner["token"] if principal == "job" and path.startswith("/api/runner/") else \
            self.tokens[principal]
        return {"Authorization": f"Bearer {token}"}

    @staticmethod
    def _launcher(world, name: str):
        from sites import launchers

        return launchers.register_launcher(services.Actor(world.global_admin), name, world.project,
                                           ["login.example.org"])

    @staticmethod
    def _site(world, tmp_path):
        """A site computer with a launcher, for the sites, launcher and runner paths."""
        import subprocess

        from sites import services as site_services
        from sites.models import Launcher

        key = tmp_path / "login.key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)], check=True)
        kind, blob = (tmp_path / "login.key.pub").read_text().split()[:2]
        launcher, token = FuzzWorld._launcher(world, "fuzz-launcher")
        site = site_services.create_site(services.Actor(world.global_admin), {
            "name": "fuzz-site", "submission": "automatic", "account": "shared", "launcher": launcher.pk,
            "visibility": "public",
            "host": "login.example.org", "port": 22, "ssh_user": "mmt", "jump_hosts": [],
            "known_hosts": f"login.example.org {kind} {blob}\n", "working_dir": "/work/mmt",
            "runner_python": "/usr/bin/python3", "runner_api_url": "https://tracking.example.org",
            "variables": "PARTITION=gpu", "template": "slurm"})
        return site, launcher, token

    def _site_jobs(self, world):
        """A connection check the launcher is asked for, and a site Job it claimed whose runner started:
        {id, token, runner_id}."""
        from sites import checks, submissions

        check = checks.request_site_check(services.Actor(world.global_admin), self.site, mine=False)
        member = bearer(world.member_token(world.member))
        for _ in range(2):
            created = member.post("/api/projects/lab/jobs", job_request(self.site), format="json")
            assert created.status_code == 201, created.content
        items = submissions.launcher_claim(self.launcher, self.site.pk, 1)
        claimed = items[0]["jobs"][0]
        runner = {"id": claimed["id"], "token": claimed["token"], "runner_id": str(uuid.uuid4())}
        started = requests_like(runner, "start", {"runner_id": runner["runner_id"], "hostname": "node-01"})
        assert started.status_code == 200, started.content
        return check, runner

    def path_parameters(self, path: str, principal: str) -> dict:
        job = self.job_token_job if principal == "job" else self.job
        values = {"project": "lab", "account_id": self.spare_account, "token_id": self.spare_token,
                  "dataset": "speech", "version": self.version["id"], "path": "a.txt", "job_id": job["id"],
                  "check_id": self.check["id"], "read_id": self.read["id"], "computer_id": self.computer.pk}
        if path.startswith("/api/computers/"):
            values["id"] = self.computer.pk
        elif path.startswith("/api/jobs/"):
            values["id"] = job["id"]
        elif path.startswith("/api/sites/"):
            values["id"] = self.site.pk
            values["version"] = 1  # the job shell's
        elif path.startswith("/api/launchers/"):
            values["id"] = self.spare_launcher.pk
        if path.startswith("/api/worker/checks/"):
            values["check_id"] = self.check["id"]
        if path.startswith("/api/launcher/checks/"):
            values["check_id"] = self.site_check.pk
        if path.startswith("/api/runner/"):
            values["job_id"] = self.runner["id"]
        return values

    def realistic(self, case, principal: str) -> None:
        """Worker bodies speak as the real worker, under the real leases, so they get past the lease
        checks to the code behind them: a worker_id or lease_id that is valid as generated is replaced
        (one a schema-breaking case broke is left as it is)."""
        job = self.job_token_job if principal == "job" else self.job
        path = case.operation.path
        lease = (self.leases["check"] if "/checks/" in path else self.leases["read"] if "/reads/" in path
                 else job["lease_id"])
        for values in (case.body, case.query):
            if not isinstance(values, dict):
                continue
            if isinstance(values.get("worker_id"), str) and NAME_PATTERN.match(values["worker_id"]):
                values["worker_id"] = "fuzz-worker"
            if isinstance(values.get("lease_id"), str) and _is_uuid(values["lease_id"]):
                values["lease_id"] = lease
            if isinstance(values.get("runner_id"), str) and _is_uuid(values["runner_id"]):
                values["runner_id"] = self.runner["runner_id"]
            if path.startswith("/api/launcher/") and _is_id(values.get("computer")):
                values["computer"] = self.site.pk


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def requests_like(runner: dict, call: str, body: dict):
    """A runner call through the test client, as the runner makes it at its start."""
    return bearer(runner["token"]).post(f"/api/runner/jobs/{runner['id']}/{call}", body, format="json")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def limit_waits(case) -> None:
    """Long-polls answer at once: a schema-valid wait of up to 30 s would stall the fuzz."""
    for values in (case.body, case.query):
        if isinstance(values, dict) and isinstance(values.get("wait"), (int, float)) and not isinstance(
                values["wait"], bool) and 0 < values["wait"] <= 30:
            values["wait"] = 0


def problem_of(response) -> str | None:
    """What is wrong with an answer: a server error, or a 4xx without the documented error body."""
    if response.status_code >= 500:
        return f"server error {response.status_code}: {response.text[:300]}"
    if not 400 <= response.status_code < 500:
        return None
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} without a JSON body: {response.text[:200]!r}"
    if not isinstance(body, dict) or not isinstance(body.get("error"), str) or not body["error"].strip():
        return f"{response.status_code} without an error sentence: {str(body)[:300]}"
    if not isinstance(body.get("code"), str) or not ERROR_CODE.match(body["code"]):
        return f"{response.status_code} without a snake_case code: {str(body)[:300]}"
    if "fields" in body and not isinstance(body["fields"], dict):
        return f"{response.status_code} with fields that are not an object: {str(body)[:300]}"
    if set(body) - {"error", "code", "fields"}:
        return f"{response.status_code} with undocumented keys {sorted(set(body) - {'error', 'code', 'fields'})}"
    return None


def fuzz(strategy, examples: int, send) -> None:
    @hypothesis_settings(max_examples=examples, derandomize=SEED is None, database=None, deadline=None,
                         phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                         print_blob=False)
    @given(case=strategy)
    def run(case):
        send(case)

    if SEED is not None:
        run = seed(int(SEED))(run)

    try:
        run()
    except Unsatisfiable:
        pass  # nothing to break: no body, no query, and the path parameters are fixed


def order(operation) -> tuple:
    return (operation.path == "/api/worker/goodbye", bool(LAST.search(operation.path)), operation.path,
            operation.method)


@pytest.fixture
def fuzz_world(transactional_db, live_server, settings, tmp_path, monkeypatch):
    settings.MEDIA_ROOT = tmp_path / "media"
    # The test server writes headers and body in separate sends: with Nagle's algorithm each answer on
    # a kept-alive connection waits for the client's delayed ACK (~40 ms), most of the fuzz's time.
    monkeypatch.setattr(WSGIRequestHandler, "disable_nagle_algorithm", True)
    return FuzzWorld(tmp_path)


# Coverage scenarios by what they tend to find: values just past a bound first, then valid values at
# a bound, then content types and methods; wrong types last (the server's type checks answer alike).
SCENARIO_SHARES = [
    ({"value_above_maximum", "value_below_minimum", "string_above_max_length", "string_below_min_length",
      "array_above_max_items", "array_below_min_items", "invalid_format", "invalid_pattern", "invalid_enum_value",
      "object_missing_required_property", "missing_parameter", "object_unexpected_properties"}, 0.6),
    ({"valid_object", "valid_string", "object_required_and_optional", "object_only_required",
      "object_additional_property", "default_positive_test"}, 0.3),
    ({"malformed_content_type", "unsupported_content_type", "unspecified_http_method"}, 0.1),
    ({"incorrect_type"}, 1.0),
]


def coverage_cases(schema, operation, limit: int) -> list:
    """Schemathesis's coverage phase for the operation: deterministic boundary cases (values just past
    or at their bounds, missing fields, wrong content types and methods, wrong types), at most `limit`,
    each kind its share (SCENARIO_SHARES; what one leaves goes to the next), evenly thinned."""
    config = schema.config.generation_for(operation=operation, phase="coverage")
    cases = list(itertools.islice(schema.iter_coverage_cases(
        operation, generation_modes=list(GenerationMode), generation_config=config), 2000))
    groups = [[case for case in cases if _scenario(case) in names] for names, _ in SCENARIO_SHARES]
    groups[-1] += [case for case in cases if not any(_scenario(case) in names for names, _ in SCENARIO_SHARES)]
    picked: list = []
    left = 0
    for group, (_, share) in zip(groups, SCENARIO_SHARES):
        quota = min(limit - len(picked), math.ceil(share * limit) + left)
        chosen = _thin(group, quota)
        left = quota - len(chosen)
        picked += chosen
    return picked


def _scenario(case) -> str:
    data = case._meta.phase.data if case._meta is not None else None
    return getattr(getattr(data, "scenario", None), "value", "")


def _mutates_path(case) -> bool:
    data = case._meta.phase.data if case._meta is not None else None
    return getattr(getattr(data, "parameter_location", None), "value", None) == "path"


def _thin(cases: list, limit: int) -> list:
    if limit <= 0:
        return []
    step = max(1, math.ceil(len(cases) / limit))
    return cases[::step][:limit]


def test_no_operation_answers_any_principal_a_server_error_or_an_undocumented_error_body(fuzz_world, live_server):
    raw = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(raw)
    operations = sorted((result.ok() for result in schema.get_all_operations()), key=order)
    assert len(operations) > 80, "every endpoint is in the schema"
    operations = [operation for operation in operations if PATHS.search(operation.path)]
    sessions = {principal: requests.Session() for principal in PRINCIPALS}
    failures: list[str] = []
    answers: Counter = Counter()
    unreached: list[str] = []
    started = time.monotonic()

    def send(case, principals, *, fixed_paths: bool) -> dict[str, int]:
        """The case as each principal; returns the status each got."""
        statuses = {}
        generated = dict(case.path_parameters or {})
        for principal in principals:
            if fixed_paths:
                case.path_parameters = {**generated, **{name: value for name, value in fuzz_world.path_parameters(
                    case.operation.path, principal).items() if name in generated}}
            fuzz_world.realistic(case, principal)
            limit_waits(case)
            response = case.call(base_url=live_server.url, session=sessions[principal],
                                 headers=fuzz_world.headers(principal, case.operation.path), timeout=REQUEST_TIMEOUT)
            statuses[principal] = response.status_code
            answers[f"{response.status_code // 100}xx"] += 1
            problem = problem_of(response)
            if problem:
                failures.append(f"{case.operation.method.upper()} {case.formatted_path} as {principal}: {problem}\n"
                                f"    body: {str(case.body)[:300]}  query: {case.query}")
        return statuses

    try:
        for operation in operations:
            names = {p.name for p in operation.path_parameters}
            fixed = {name: value for name, value in fuzz_world.path_parameters(operation.path, "member").items()
                     if name in names} or None
            positive = operation.as_strategy(generation_mode=GenerationMode.POSITIVE, path_parameters=fixed)
            negative = operation.as_strategy(generation_mode=GenerationMode.NEGATIVE, path_parameters=fixed)
            probe: dict[str, int] = {}
            fuzz(positive, 1, lambda case: probe.update(send(case, PRINCIPALS, fixed_paths=True)))
            refused = sorted(p for p, status in probe.items() if status in (401, 403))
            if refused:  # refused before the input is read: one schema-breaking request more is enough
                fuzz(negative, 1, lambda case: send(case, refused, fixed_paths=True))
            admitted = [principal for principal in PRINCIPALS if principal not in refused]
            if not admitted:
                unreached.append(f"{operation.method.upper()} {operation.path}")
                continue
            fuzz(positive, EXAMPLES["positive"], lambda case: send(case, admitted, fixed_paths=True))
            fuzz(negative, EXAMPLES["negative"], lambda case: send(case, admitted, fixed_paths=True))
            # Generated paths and boundary cases go to one principal: the first that got past the probe.
            chosen = next((p for p in COVERAGE_ORDER if probe.get(p, 500) < 400), admitted[0])
            # Generated ids are small numbers: on a revoke or a disable they would hit a principal's own.
            destructive = bool(LAST.search(operation.path))
            if names and not destructive:
                fuzz(operation.as_strategy(), EXAMPLES["free_paths"],
                     lambda case: send(case, [chosen], fixed_paths=False))
            for case in coverage_cases(schema, operation, EXAMPLES["coverage"]):
                send(case, [chosen], fixed_paths=destructive or not _mutates_path(case))
    finally:
        for http in sessions.values():
            http.close()
    print(f"fuzzed {len(operations)} operations as {len(PRINCIPALS)} principals in {time.monotonic() - started:.0f} s:"
          f" {sum(answers.values())} requests, {dict(sorted(answers.items()))}; refused to all: {unreached}")
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:60])


def test_every_json_request_body_in_the_schema_names_its_fields(db):
    """Issue 14: every endpoint is in the schema with its real request body, so the fuzzer can reach it."""
    from rest_framework.test import APIClient

    paths = APIClient().get("/api/schema/?format=json").json()["paths"]
    undescribed = set()
    for path, operations in paths.items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None and "$ref" not in body["schema"]:
                undescribed.add(f"{method.upper()} {path}")
    assert undescribed == set(), "describe these bodies with a request serializer"
