"""The check on a Local computer (commands on the worker's own machine) and the parts of the probe
that cannot run here for real: NVIDIA GPUs are absent on these machines, so `nvidia-smi` is a small
stand-in script printing the exact query format of the real tool, names with commas included."""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from worker_agent import target_probe
from worker_agent.probe import run_check
from worker_agent.ssh import ConnectionPool
from worker_agent.text import sanitize_detail

SMI_OUTPUT = ("0, GPU-4f1c2a3b-0000-1111-2222-333344445555, NVIDIA A100-SXM4-80GB, 81920\n"
              "1, GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA RTX A6000, Ada, rev 2, 49140\n")


def local(**extra) -> dict:
    return {"id": 2, "name": "dev", "kind": "local", "working_dir": "", "python_path": "", "gpu_ids": [],
            "runtimes": [], **extra}


def fake_smi(tmp_path, body: str):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return bindir


def items(result) -> dict:
    return {i["key"]: i for i in result["items"]}


def test_gpu_names_with_commas_are_split_from_both_ends():
    gpus = target_probe.parse_gpus(SMI_OUTPUT)
    assert gpus == [
        {"index": 0, "uuid": "GPU-4f1c2a3b-0000-1111-2222-333344445555", "name": "NVIDIA A100-SXM4-80GB",
         "memory_mib": 81920},
        {"index": 1, "uuid": "GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff", "name": "NVIDIA RTX A6000, Ada, rev 2",
         "memory_mib": 49140},
    ]
    assert target_probe.parse_gpus("garbage\n\n") == []


def test_a_local_check_uses_command_execution_and_finds_gpus(tmp_path):
    bindir = fake_smi(tmp_path, f"cat <<'EOF'\n{SMI_OUTPUT}EOF\n")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    pool = ConnectionPool(allow_local=True, local_env=env)
    status, result = run_check(local(gpu_ids=["0", "1"]), pool)
    got = items(result)
    assert status == "succeeded"
    assert result["items"][0]["key"] == "command_execution" and got["command_execution"]["status"] == "ok"
    assert got["gpu"]["status"] == "ok" and "NVIDIA RTX A6000, Ada, rev 2" in got["gpu"]["detail"]
    assert [g["index"] for g in result["gpus"]] == [0, 1] and result["gpus"][1]["memory_mib"] == 49140


def test_gpu_ids_without_a_working_nvidia_smi_fail_the_gpu_item(tmp_path):
    bindir = fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate' >&2; exit 9\n")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    status, result = run_check(local(gpu_ids=["0"]), ConnectionPool(allow_local=True, local_env=env))
    gpu = items(result)["gpu"]
    assert (gpu["status"], gpu["code"]) == ("failed", "gpu_query_failed")
    assert "could not communicate" in gpu["detail"] and "GPU IDs" in gpu["detail"]

    env = dict(os.environ, PATH="/usr/bin:/bin")
    status, result = run_check(local(gpu_ids=[]), ConnectionPool(allow_local=True, local_env=env))
    assert (items(result)["gpu"]["status"], items(result)["gpu"]["code"]) == ("none", None)


def test_local_computers_are_refused_unless_the_worker_allows_them():
    status, result = run_check(local(), ConnectionPool(allow_local=False))
    first = result["items"][0]
    assert status == "failed" and first["key"] == "command_execution" and first["status"] == "failed"
    assert first["code"] == "local_executor_disabled"
    assert "MMT_ALLOW_LOCAL_EXECUTOR=true" in first["detail"] and "MADO_DEV_MODE=true" in first["detail"]


@pytest.fixture
def health_server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok", "version": "9.9.9"}).encode()
            self.send_response(200 if self.path == "/api/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_api_item_asks_the_health_endpoint_from_the_target(health_server):
    status, result = run_check(local(), ConnectionPool(allow_local=True), api_url=health_server)
    api = items(result)["api"]
    assert api["status"] == "ok" and "9.9.9" in api["detail"]


def test_containers_without_the_required_exec_flags_fail(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    old = bindir / "singularity"
    old.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'singularity version 2.6.1'; exit 0; fi\n"
                   "echo 'Usage: singularity exec [--cleanenv] [--containall] [--pwd] image cmd'\n")
    old.chmod(0o755)
    good = bindir / "apptainer"
    good.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'apptainer version 1.3.4'; exit 0; fi\n"
                    "echo '--cleanenv --containall --no-home --no-mount --no-eval --pwd --nv'\n")
    good.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    status, result = run_check(local(), ConnectionPool(allow_local=True, local_env=env))
    got = items(result)
    assert (got["singularity"]["status"], got["singularity"]["code"]) == ("failed", "container_flags_missing")
    assert "--no-home" in got["singularity"]["detail"] and "--nv" in got["singularity"]["detail"]
    assert got["apptainer"]["status"] == "ok" and "apptainer" in result["runtimes"]
    assert "singularity" not in result["runtimes"]


def test_details_are_sanitised():
    assert sanitize_detail("a\x1b[31mred\x07\nnext") == "a[31mred next"
    assert sanitize_detail("token mmt_AbCdEfGhIjKlMnOpQrStUv leaked") == "token mmt_AbCdEfGh… leaked"
    assert sanitize_detail("in /home/w/.ssh/k here", secrets=("/home/w/.ssh/k",)) == ""
    assert sanitize_detail("-----BEGIN OPENSSH PRIVATE KEY-----abc") == ""
    long = sanitize_detail("x" * 500)
    assert len(long) == 200 and long.endswith("…")


def test_a_result_never_carries_the_key_path_even_if_the_target_prints_it(tmp_path):
    """A local computer whose key lives in a directory the check would list as a workdir candidate."""
    key_dir = tmp_path / "home" / "keys"
    key_dir.mkdir(parents=True)
    computer = local(working_dir=str(key_dir / "jobs"))
    computer["ssh_key_path"] = str(key_dir / "jobs")  # the worst case: the path itself shows in a detail
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    status, result = run_check(computer, ConnectionPool(allow_local=True, local_env=env))
    text = json.dumps(result)
    assert str(key_dir / "jobs") not in text
    assert items(result)["work_directory"]["status"] == "ok" and items(result)["work_directory"]["detail"] == ""


def test_the_probe_result_is_found_after_login_shell_noise():
    from worker_agent.probe import parse_probe_output

    out = b"motd: maintenance on Friday\n\n@@mado-probe-result@@ {\"items\": []}\n"
    assert parse_probe_output(out) == {"items": []}
    assert parse_probe_output(b"nothing here\n") is None
