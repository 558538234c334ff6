"""Package boundaries: the import contracts of pyproject.toml hold (``lint-imports``) and are
the layers docs/architecture.md shows, every module has a row there, no private core module
is used outside the core, benchmarks and tools never import the test suite, the errors
modules import nothing heavy, and no package imports itself in a circle (type-checking and
function-level imports count: they are circles too)."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import zeal

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"zeal": ROOT / "shared" / "zeal", "zeal_edge": ROOT / "edge" / "zeal_edge"}
PACKAGES["zeal_server"] = ROOT / "server" / "zeal_server"


def imports(path: Path) -> set[str]:
    """Every module a file imports (`from a.b import c` gives a.b and a.b.c), anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def python_files(*folders: Path) -> list[Path]:
    return [p for folder in folders for p in folder.rglob("*.py") if ".venv" not in p.parts]


def test_no_private_core_module_is_imported_outside_the_core() -> None:
    """zeal._* is the core's own: the edge, the server, benchmarks and tools use the public
    names (the core's own tests may test its private helpers)."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in python_files(ROOT / "edge", ROOT / "server", ROOT / "bench", ROOT / "tools")
        for name in imports(path)
        if name.startswith("zeal._")
    ]
    assert offenders == []


def test_benchmarks_and_tools_never_import_the_test_suite() -> None:
    """What tests and benchmarks share lives in tools/testbed."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in python_files(ROOT / "bench", ROOT / "tools")
        for name in imports(path)
        if name == "tests" or name.startswith("tests.")
    ]
    assert offenders == []


def _graph(package: str, folder: Path) -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for path in python_files(folder):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(folder.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return {
        name: {m for m in imports(path) if m in modules and m not in (name, package)}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_package_imports_itself_in_a_circle() -> None:
    """Within zeal, zeal_edge and zeal_server, module imports form no cycle (the package
    __init__, which re-exports its modules, is left out: modules import each other
    directly)."""
    for package, folder in PACKAGES.items():
        graph = _graph(package, folder)
        graph.pop(package, None)
        assert _cycle(graph) is None, package


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a two-module circle is reported."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _code_strings(path: Path) -> list[str]:
    """String constants of a file's code (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def test_the_topic_layout_is_written_in_one_module() -> None:
    """The MQTT topic prefix appears in the code of zeal.mqtt.topics only; every other module
    builds, parses and filters topics through it (docstrings may describe the layout)."""
    offenders = sorted(
        str(path.relative_to(ROOT))
        for folder in PACKAGES.values()
        for path in python_files(folder)
        if any("zeal/v1" in text for text in _code_strings(path))
    )
    assert offenders == ["shared/zeal/mqtt/topics.py"]


def test_the_topic_check_sees_code_and_skips_docstrings(tmp_path: Path) -> None:
    """The check above can fail: a layout string in code (an f-string too) is found, one in
    a docstring is not."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""zeal/v1/a"""\n\ndef f(d):\n    """zeal/v1/b"""\n    return f"zeal/v1/+/{d}/up"\n'
    )
    assert _code_strings(module) == ["zeal/v1/+/", "/up"]


EXPORTS = {
    "zeal": [
        "REASONS",
        "SAMPLERS",
        "AuditReport",
        "Batch",
        "CodeError",
        "CodecParams",
        "Estimate",
        "OutputDistribution",
        "ParameterError",
        "ReadingError",
        "WireError",
        "Zeal",
        "ZealError",
        "ZealWarning",
        "audit",
        "decode_batch",
        "encode_batch",
        "exact_sum",
        "exact_sum_squares",
    ],
    "zeal_edge": ["AgentError", "EdgeError", "OutboxError", "PublishError", "SettingsError"],
    "zeal_server": [
        "IdentityError",
        "ProvisioningError",
        "ServerError",
        "SettingsError",
        "StoreError",
    ],
}


def test_each_package_exports_exactly_its_public_names() -> None:
    """Each package's __all__ is the list above (a change to a public surface is made on
    purpose, here too), every name resolves, and every exception of a package derives from
    its base (ZealError, EdgeError, ServerError)."""
    bases = {"zeal": "ZealError", "zeal_edge": "EdgeError", "zeal_server": "ServerError"}
    for package, names in EXPORTS.items():
        module = importlib.import_module(package)
        assert list(module.__all__) == names, package
        base = getattr(module, bases[package])
        for name in names:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, Exception) and name.endswith("Error"):
                assert issubclass(value, base), (package, name)


LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
DOC = ROOT / "docs" / "architecture.md"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the packages found first on the path from `root` (its pyproject)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_import_contracts_hold() -> None:
    """The layers of pyproject.toml's [tool.importlinter], checked by import-linter itself."""
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10 kept, 0 broken" in result.stdout


def _copy_packages(tmp_path: Path) -> None:
    """The three packages and the contracts, copied to `tmp_path` to be broken there."""
    for folder in PACKAGES.values():
        shutil.copytree(
            folder, tmp_path / folder.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")


def test_a_forbidden_import_breaks_the_contract(tmp_path: Path) -> None:
    """The contract can fail: the store importing the API (a copy of the three packages
    with one import added) is reported, with the import named."""
    _copy_packages(tmp_path)
    models = tmp_path / "zeal_server" / "store" / "models.py"
    models.write_text(models.read_text() + "\nfrom zeal_server.api import schemas  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "zeal_server.store.models -> zeal_server.api.schemas" in result.stdout
    assert "9 kept, 1 broken" in result.stdout


def test_a_writer_or_collector_naming_a_source_kind_breaks_their_contracts(tmp_path: Path) -> None:
    """The collector's writer knows no source and the collector no kind of source: a copy
    where the writer imports Zeal's broker's source and the collector ChirpStack's breaks
    both contracts, with the imports named."""
    _copy_packages(tmp_path)
    broker = tmp_path / "zeal_server" / "broker"
    for name, line in (
        ("writer.py", "from zeal_server.broker import mqttsource  # noqa"),
        ("collector.py", "from zeal_server.broker.chirpstack import source  # noqa"),
    ):
        (broker / name).write_text((broker / name).read_text() + f"\n{line}\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "zeal_server.broker.writer -> zeal_server.broker.mqttsource" in result.stdout
    assert "zeal_server.broker.collector -> zeal_server.broker.chirpstack" in result.stdout
    assert "8 kept, 2 broken" in result.stdout


def test_paho_in_the_core_breaks_its_contracts(tmp_path: Path) -> None:
    """Only zeal.mqtt.client may import paho: a core module importing paho, or that client,
    is reported (a copy of the packages with two imports added)."""
    _copy_packages(tmp_path)
    wire = tmp_path / "zeal" / "wire.py"
    wire.write_text(wire.read_text() + "\nimport paho.mqtt.client  # noqa\n")
    plan = tmp_path / "zeal" / "planning" / "windows.py"
    plan.write_text(plan.read_text() + "\nfrom zeal.mqtt import client  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "zeal.wire -> paho" in result.stdout
    assert "zeal.planning.windows -> zeal.mqtt.client" in result.stdout
    assert "The core imports no paho: only zeal.mqtt.client does (the mqtt extra) BROKEN" in (
        result.stdout
    )
    assert (
        "The core below zeal.mqtt: nothing outside the transport uses its paho client BROKEN"
        in (result.stdout)
    )


def test_the_core_below_mqtt_contract_names_every_other_module() -> None:
    """The contract keeping the core off the paho client lists every module and package of
    zeal but mqtt: a new one is checked too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    listed = next(c for c in contracts if c["id"] == "core-below-mqtt")["source_modules"]
    folder = PACKAGES["zeal"]
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in folder.glob("*/__init__.py")}
    assert sorted(listed) == sorted(f"zeal.{name}" for name in names - {"mqtt"})


def _server_layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    server = next(c for c in contracts if c["id"] == "server")
    return [[name.strip() for name in layer.split("|")] for layer in server["layers"]]


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table under `heading` in docs/architecture.md, as cells."""
    text = DOC.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


def test_the_layer_table_of_the_docs_is_the_import_contract() -> None:
    """Each layer's "may call" in docs/architecture.md names exactly the layers below it in
    the contract, and the table has every layer."""
    layers = _server_layers()
    expected = {
        name: [below for group in layers[i + 1 :] for below in group]
        for i, group in enumerate(layers)
        for name in group
    }
    shown = {
        row[0].strip("`"): re.findall(r"`([^`]+)`", row[2])
        for row in _table("The layers of zeal_server")
    }
    assert shown == expected


def _modules(package: str, folder: Path) -> set[str]:
    found = set()
    for path in python_files(folder):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(folder.parent).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_every_module_has_a_row_in_the_architecture_doc() -> None:
    """docs/architecture.md names every module of the three packages, and no other."""
    documented = {name for row in _table("Modules") for name in re.findall(r"`([^`]+)`", row[0])}
    modules = set().union(*(_modules(package, folder) for package, folder in PACKAGES.items()))
    assert documented == modules


def _loaded_by(module: str) -> set[str]:
    """The top-level packages `python -X importtime -c "import module"` loads."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_the_errors_modules_import_nothing_heavy() -> None:
    """Catching the server's or the edge's errors loads none of SQLAlchemy, paho, numpy,
    zstandard, FastAPI or nats-py (measured by the interpreter's -X importtime)."""
    heavy = {"sqlalchemy", "paho", "numpy", "zstandard", "fastapi", "nats"}
    for module in ("zeal_server.errors", "zeal_edge.errors"):
        loaded = _loaded_by(module)
        assert module.split(".")[0] in loaded  # the measurement sees the package itself
        assert loaded & heavy == set(), module
    assert "numpy" in _loaded_by("zeal_server.app")  # and it would see a heavy one


def test_the_core_declares_its_public_modules() -> None:
    """zeal.PUBLIC_MODULES lists the modules without a leading underscore, and the package
    docstring names each of them."""
    folder = PACKAGES["zeal"]
    files = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    files |= {p.parent.name for p in folder.glob("*/__init__.py")}  # its packages
    assert set(zeal.PUBLIC_MODULES) == {name for name in files if not name.startswith("_")}
    doc = zeal.__doc__ or ""
    assert [m for m in zeal.PUBLIC_MODULES if not re.search(rf"\b{m}\b", doc)] == []


def test_tests_share_helpers_not_test_modules() -> None:
    """What tests share lives in conftest fixtures and helpers modules: no test file imports
    a test module or a conftest."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in python_files(ROOT / "tests")
        for name in imports(path)
        if name.startswith("tests.")
        and any(part.startswith("test_") or part == "conftest" for part in name.split("."))
    ]
    assert offenders == []


def test_the_layers_above_the_store_call_it_through_its_namespace() -> None:
    """The API, the broker and the commands use `zeal_server.store`'s public names, and a
    module of the store only for its tables (`store.models`) or the engine (`store.db`):
    the namespace is what they call, not a re-export they go around. (Ingest, which decides
    what is written, also uses the write path's parts: docs/architecture.md.)"""
    server = PACKAGES["zeal_server"]
    allowed = {"zeal_server.store", "zeal_server.store.models", "zeal_server.store.db"}
    around: list[tuple[str, str]] = []
    through = 0
    for path in python_files(server):
        if path.parent.name in ("store", "ingest") or "migrations" in path.parts:
            continue
        for module in imports(path):
            if not module.startswith("zeal_server.store"):
                continue
            through += module == "zeal_server.store"
            # `from zeal_server.store import x` gives zeal_server.store.x: a module only if
            # there is one by that name
            is_module = module == "zeal_server.store" or (
                module.count(".") == 2 and importlib.util.find_spec(module) is not None
            )
            if is_module and module not in allowed:
                around.append((str(path.relative_to(server)), module))
    assert around == []
    assert through > 5
