"""Package boundaries, read from the source: no private core module used outside the core,
benchmarks and tools never import the test suite, and no package imports itself in a
circle (type-checking and function-level imports count: they are circles too)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

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


def test_no_package_module_is_over_400_lines() -> None:
    """Every module of zeal, zeal_edge and zeal_server (migrations aside) fits in 400 lines:
    a module that grows past it has taken on a second job."""
    offenders = {
        str(path.relative_to(ROOT)): lines
        for folder in PACKAGES.values()
        for path in python_files(folder)
        if "migrations" not in path.parts
        if (lines := len(path.read_text().splitlines())) > 400
    }
    assert offenders == {}


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
    """The MQTT topic prefix appears in the code of zeal.topics only; every other module
    builds, parses and filters topics through it (docstrings may describe the layout)."""
    offenders = sorted(
        str(path.relative_to(ROOT))
        for folder in PACKAGES.values()
        for path in python_files(folder)
        if any("zeal/v1" in text for text in _code_strings(path))
    )
    assert offenders == ["shared/zeal/topics.py"]


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
