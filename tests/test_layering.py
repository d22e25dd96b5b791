"""The layering of DESIGN §2, checked by import-linter on the real source: the server apps import only
the layers below them (a lower app learns about a higher one by registration), and the agent and the
SDK never import Django or a server app, and the agent core stays standard library only. The contracts live
in .importlinter. Within a layer no two modules import each other either, not even from inside a function:
a cycle is a module that cannot be read, tested or moved without the other."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import grimp

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
    imports of jobs (its registrations) run up the layers, and the contract breaks and
    names them."""
    config = (ROOT / ".importlinter").read_text()
    layers = "    tracking | sites | datasets | notifications\n    jobs\n"
    assert layers in config
    reversed_config = tmp_path / "importlinter.ini"
    reversed_config.write_text(config.replace(layers, "    tracking | sites | notifications\n    jobs\n    datasets\n"))
    result = lint_imports(reversed_config)
    assert result.returncode != 0
    assert "datasets is not allowed to import jobs" in result.stdout, result.stdout
    assert "datasets.apps -> jobs.inputs" in result.stdout, result.stdout


def import_cycles(graph) -> list[list[str]]:
    """The groups of modules that import each other around a cycle (strongly connected, Tarjan)."""
    modules = sorted(graph.modules)
    known = set(modules)
    edges = {module: sorted(set(graph.find_modules_directly_imported_by(module)) & known) for module in modules}
    order, low, stack, on_stack, cycles = {}, {}, [], set(), []
    for root in modules:
        if root in order:
            continue
        work = [(root, iter(edges[root]))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == order[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        cycles.append(sorted(group))
            elif child not in order:
                order[child] = low[child] = len(order)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[module] = min(low[module], order[child])
    return cycles


def project_graph():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    packages = sorted(set(config["importlinter"]["root_packages"].split()))
    sys.path.insert(0, str(ROOT))
    try:
        # An import under `if TYPE_CHECKING:` never runs: a runner may name its manager's type.
        return grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(ROOT))


def test_no_two_modules_import_each_other():
    assert import_cycles(project_graph()) == []


def test_a_cycle_is_found_and_named():
    graph = project_graph()
    graph.add_import(importer="jobs.models", imported="jobs.services")  # jobs.services imports jobs.models
    assert any({"jobs.models", "jobs.services"} <= set(group) for group in import_cycles(graph))
