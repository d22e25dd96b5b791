"""The layering of DESIGN §2, checked by import-linter on the real source: the server apps import only
the layers below them (a lower app learns about a higher one by registration), and the agent and the
SDK never import Django or a server app, and the agent core stays standard library only. The contracts live
in .importlinter."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_every_import_keeps_to_the_layers_and_the_agent_stays_apart():
    result = lint_imports(ROOT / ".importlinter")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout, result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The checker sees an upward import: with datasets moved below jobs in the layers, datasets' real
    imports of jobs (its storage, its registrations) run up the layers, and the contract breaks and
    names them."""
    config = (ROOT / ".importlinter").read_text()
    layers = "    tracking | sites | datasets | notifications\n    jobs\n"
    assert layers in config
    reversed_config = tmp_path / "importlinter.ini"
    reversed_config.write_text(config.replace(layers, "    tracking | sites | notifications\n    jobs\n    datasets\n"))
    result = lint_imports(reversed_config)
    assert result.returncode != 0
    assert "datasets is not allowed to import jobs" in result.stdout, result.stdout
    assert "datasets.services -> jobs.storage" in result.stdout, result.stdout
