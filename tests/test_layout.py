"""The package's shape, checked from the source: module size, the layers and who may import whom.

Every module under src/fusewise is parsed (its AST, nothing is imported) and every import in it is
read: at module level and inside functions, `import a.b`, `from a import b`, relative imports
(`from .. import x`, `from .x import y`), `importlib.import_module("a.b")`. Each test lists every
violation it finds, with the file, line, what is imported and the rule broken with its reason.
To change a rule, change the tables below (and say why in the reason).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = "fusewise"
SRC = Path(__file__).resolve().parents[1] / "src" / ROOT

# A module over this many lines is split by stage or direction (shared/STYLE.md 1: "a median of
# 100-250 lines a module and a maximum near 500"; 400 keeps the split before it is overdue).
MAX_LINES = 400


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]  # each covers itself and its submodules; the bare ROOT only itself
    may_import: tuple[str, ...]  # other layers it may import, besides its own; "*" for any
    why: str


# Lowest first. A module may import its own layer and the layers named in may_import; anything
# else, a higher layer or a lower one not named, breaks the rule.
LAYERS = (
    Layer(
        "base",
        ("fusewise._version", "fusewise.fixes", "fusewise.cost", "fusewise.hardware"),
        (),
        "cost formulas, hardware ceilings and the fix registry are facts every other layer "
        "reads; they depend on nothing of fusewise",
    ),
    Layer(
        "ops",
        ("fusewise.ops",),
        ("base",),
        "kernels and their launchers work on tensors; they do not know the modules, optimizers "
        "or diagnosis built on them",
    ),
    Layer(
        "wrappers",
        ("fusewise.nn", "fusewise.optim", "fusewise.patch", "fusewise.graphs"),
        ("ops", "base"),
        "nn.Module / optimizer drop-ins, the module swap and the CUDA-graph capture of a step are "
        "thin shells over the ops and torch; they register their fixes, never read a diagnosis",
    ),
    Layer(
        "report",
        ("fusewise.report",),
        ("base",),
        "rendering takes findings as data; it never calls capture, diagnose or the CLI, so a "
        "saved report can be rendered without them",
    ),
    Layer(
        "capture",
        ("fusewise.capture",),
        ("base",),
        "the recorder and the script runner only record; analyzing what was recorded is "
        "diagnose's job (capture -> diagnose would be a cycle)",
    ),
    Layer(
        "diagnose",
        ("fusewise.diagnose",),
        ("capture", "report", "base"),
        "the diagnosis reads what capture recorded and hands findings to report; it does not "
        "run kernels or wrappers",
    ),
    Layer(
        "top",
        (
            ROOT,
            "fusewise.__main__",
            "fusewise.cli",
            "fusewise.demo",
            "fusewise.demo_norms",
            "fusewise.examples",
            "fusewise.verify",
        ),
        ("*",),
        "entry points put the pieces together",
    ),
)

# Inside ops, three kinds of module (ranked, lowest first):
#   helpers   fusewise.ops._*  (a name starting with "_", file or folder): shared by every family
#   families  fusewise.ops.<family>/  one op family per folder; a public module placed directly
#             in ops/ counts as a family of its own, so no op escapes the family rule
#   gatherers fusewise.ops (its __init__) and fusewise.ops.reference: they import the families
OPS = "fusewise.ops"
OPS_GATHERERS = {OPS, "fusewise.ops.reference"}
OPS_RULES = {
    "helper": (
        {"helper"},
        "shared helpers sit below the families: a helper importing a family, ops/__init__ or "
        "ops.reference (which import the families) ties every family to that one",
    ),
    "family": (
        {"helper"},
        "an op family is self-contained: it imports the shared helpers (fusewise.ops._*) and base "
        "only, never another family, nor ops/__init__ or ops.reference, which gather the families "
        "(a cycle)",
    ),
    "gatherer": ({"helper", "family", "gatherer"}, "ops/__init__ and ops.reference gather them"),
}

# Inside diagnose (docs/DESIGN.md, "The analyzer template"): every module is an analyzer except
# driver, which runs them, and the shared modules: thresholds, registry and the helpers diagnose/_*
# (the driver's own rule for what it imports), so a new analyzer file is covered without editing
# this test; a subpackage diagnose/<name>/ is one analyzer. Analyzers are stateless functions over
# the observation that return data (shared/STYLE.md 9: "analyzers never import each other").
DIAGNOSE = "fusewise.diagnose"
DIAGNOSE_SHARED = {"thresholds", "registry", "_*"}  # "_*": any name starting with "_"
DIAGNOSE_NOT_ANALYZERS = {"__init__", "driver"} | DIAGNOSE_SHARED
DIAGNOSE_WHY = (
    "analyzers never import each other (nor driver or diagnose/__init__); what they share lives "
    "in diagnose/thresholds, diagnose/registry and the helpers diagnose/_*, and those import no "
    "analyzer (or two analyzers would be tied through them)"
)


# ---------------------------------------------------------------------------------------------
# Reading the source


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    path: str  # its file, relative to src/
    line: int
    target: str  # the fusewise module imported, dotted

    def where(self) -> str:
        return f"src/{self.path}:{self.line} {self.module} imports {self.target}"


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package, dotted name -> file (a package is named by its __init__)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: set[str]) -> str:
    """The known module a dotted name lands in: itself, else its longest known parent."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, path: Path, known: set[str], src: Path = SRC) -> list[Import]:
    """Every import of a fusewise module that `module` (file `path`) makes, wherever it sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    rel = str(path.relative_to(src.parent))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise AssertionError(f"src/{rel}:{node.lineno}: relative import beyond {ROOT}")
                base = parts[: len(parts) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                # `from pkg import name`: the submodule pkg.name if there is one, else pkg
                sub = f"{origin}.{alias.name}"
                found.append((node.lineno, sub if sub in known else origin))
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in {"import_module", "__import__"}
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return [
        Import(module, rel, line, _resolve(name, known))
        for line, name in sorted(set(found))
        if name == ROOT or name.startswith(ROOT + ".")
    ]


def all_imports(src: Path = SRC) -> list[Import]:
    files = module_files(src)
    known = set(files)
    return [imp for mod, path in files.items() for imp in imports_of(mod, path, known, src)]


def _covers(prefix: str, module: str) -> bool:
    return module == prefix or (prefix != ROOT and module.startswith(prefix + "."))


def layer_of(module: str) -> Layer | None:
    best = None
    for layer in LAYERS:
        for prefix in layer.modules:
            if _covers(prefix, module) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, layer)
    return best[1] if best else None


def ops_kind(module: str) -> tuple[str, str]:
    """(kind, unit) of a module in ops: kind helper/family/gatherer, unit the family's name."""
    if module in OPS_GATHERERS:
        return "gatherer", module
    first = module[len(OPS) + 1 :].split(".")[0]
    if first.startswith("_"):
        return "helper", first
    return "family", first


def _diagnose_name(module: str) -> str:
    """The first name under diagnose/ ("__init__" for the package itself), "_*" for a helper."""
    first = "__init__" if module == DIAGNOSE else module[len(DIAGNOSE) + 1 :].split(".")[0]
    return "_*" if first.startswith("_") and first != "__init__" else first


def analyzer_of(module: str) -> str | None:
    """The analyzer a diagnose module belongs to (its first name under diagnose/), or None."""
    if not _covers(DIAGNOSE, module):
        return None
    name = _diagnose_name(module)
    return None if name in DIAGNOSE_NOT_ANALYZERS else name


# ---------------------------------------------------------------------------------------------
# The rules, each a function from the imports to the violations, so the checks below can be
# tried on a made-up package too.


def size_violations(src: Path = SRC) -> list[str]:
    out = []
    for mod, path in module_files(src).items():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            out.append(f"src/{path.relative_to(src.parent)}: {mod} has {n} lines (> {MAX_LINES})")
    return out


def unplaced_modules(src: Path = SRC) -> list[str]:
    return [
        f"{mod} ({path.relative_to(src.parent)}) is in no layer: add it to LAYERS"
        for mod, path in module_files(src).items()
        if layer_of(mod) is None
    ]


def layer_violations(imports: list[Import]) -> list[str]:
    rank = {layer.name: i for i, layer in enumerate(LAYERS)}
    out = []
    for imp in imports:
        src, dst = layer_of(imp.module), layer_of(imp.target)
        if src is None or dst is None or src is dst or "*" in src.may_import:
            continue
        if dst.name in src.may_import:
            continue
        direction = "a higher layer" if rank[dst.name] > rank[src.name] else "a layer not allowed"
        allowed = ", ".join(src.may_import) or "nothing else"
        out.append(
            f"{imp.where()}: layer {src.name} -> layer {dst.name} ({direction}); "
            f"{src.name} may import {src.name} and {allowed}: {src.why}"
        )
    return out


def family_violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        if not (_covers(OPS, imp.module) and _covers(OPS, imp.target)):
            continue
        (kind, unit), (tkind, tunit) = ops_kind(imp.module), ops_kind(imp.target)
        if kind == "family" and tkind == "family" and unit == tunit:
            continue
        allowed, why = OPS_RULES[kind]
        if tkind in allowed:
            continue
        names = {"helper": "helpers", "family": "families", "gatherer": "gatherers"}
        may = ", ".join(names[k] for k in ("helper", "family", "gatherer") if k in allowed)
        out.append(
            f"{imp.where()}: ops {kind} {unit!r} -> ops {tkind} {tunit!r}; "
            f"an ops {kind} may import ops {may} (and base) only: {why}"
        )
    return out


def analyzer_violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        if not (_covers(DIAGNOSE, imp.module) and _covers(DIAGNOSE, imp.target)):
            continue
        mine, name = analyzer_of(imp.module), _diagnose_name(imp.module)
        target, tname = analyzer_of(imp.target), _diagnose_name(imp.target)
        if mine is not None:  # an analyzer: its own modules and the shared ones only
            if tname == mine or tname in DIAGNOSE_SHARED:
                continue
            what = f"analyzer {mine!r}"
        elif name in DIAGNOSE_SHARED:  # a shared module: anything but an analyzer
            if target is None:
                continue
            what = f"shared module {imp.module.rsplit('.', 1)[-1]!r}"
        else:  # driver, diagnose/__init__
            continue
        kind = f"analyzer {target!r}" if target else f"diagnose module {tname!r}"
        out.append(f"{imp.where()}: {what} -> {kind}; {DIAGNOSE_WHY}")
    return out


def _fail(title: str, violations: list[str]) -> None:
    if violations:
        pytest.fail(f"{title} ({len(violations)}):\n  " + "\n  ".join(violations), pytrace=False)


# ---------------------------------------------------------------------------------------------
# The package


def test_package_found():
    mods = module_files()
    assert ROOT in mods and f"{OPS}" in mods and DIAGNOSE in mods, sorted(mods)


def test_module_size():
    _fail(f"modules over {MAX_LINES} lines", size_violations())


def test_every_module_in_a_layer():
    _fail("modules in no layer", unplaced_modules())


def test_layers():
    _fail("imports across layers", layer_violations(all_imports()))


def test_op_families():
    _fail("imports between op families", family_violations(all_imports()))


def test_analyzers_independent():
    _fail("imports between analyzers", analyzer_violations(all_imports()))


# ---------------------------------------------------------------------------------------------
# The checker itself, on a made-up package: each kind of import is seen and each rule fires.


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / ROOT / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / ROOT


def test_checker_sees_every_form(tmp_path):
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "cost.py": "",
            "report/__init__.py": "",
            "report/text.py": (
                "def f():\n"
                "    from ..diagnose import chains\n"  # function level, relative
                "    import fusewise.capture.script as s\n"  # absolute, aliased
                "    from .. import __version__\n"  # the package root
                "    from fusewise import cost\n"  # allowed
                "    importlib.import_module('fusewise.cli')\n"
            ),
            "capture/__init__.py": "",
            "capture/script.py": "",
            "diagnose/__init__.py": "",
            "diagnose/chains.py": "from . import _gaps, thresholds, syncs\nfrom .driver import x\n",
            "diagnose/_gaps.py": "from .syncs import y\nfrom . import thresholds\n",
            "diagnose/syncs.py": "",
            "diagnose/thresholds.py": "",
            "diagnose/driver.py": "from . import chains, syncs\n",
            "ops/__init__.py": "from .norms import f\nfrom .adamw import g\n",
            "ops/_helper.py": "from .norms.kernels import k\n",
            "ops/reference.py": "from .norms import f\n",
            "ops/norms/__init__.py": "from .kernels import k\nfrom .._helper import h\n",
            "ops/norms/kernels.py": "from ..adamw import g\nfrom ... import cost\n",
            "ops/adamw.py": "from .reference import r\n",
            "cli.py": "",
            "stray.py": "",
        },
    )
    imports = all_imports(src)
    seen = {(i.module, i.target) for i in imports}
    assert {
        ("fusewise.report.text", "fusewise.diagnose.chains"),
        ("fusewise.report.text", "fusewise.capture.script"),
        ("fusewise.report.text", "fusewise"),
        ("fusewise.report.text", "fusewise.cost"),
        ("fusewise.report.text", "fusewise.cli"),
        ("fusewise.ops.norms.kernels", "fusewise.cost"),
    } <= seen

    layers = layer_violations(imports)
    assert len(layers) == 4, layers  # report -> diagnose, capture, top (root), top (cli)
    assert all("fusewise.report.text imports" in v for v in layers)
    families = family_violations(imports)
    assert sorted(v.split(": ")[0].split(" ", 1)[1] for v in families) == [
        "fusewise.ops._helper imports fusewise.ops.norms.kernels",
        "fusewise.ops.adamw imports fusewise.ops.reference",
        "fusewise.ops.norms.kernels imports fusewise.ops.adamw",
    ], families
    analyzers = analyzer_violations(imports)
    assert sorted(v.split(": ")[0].split(" ", 1)[1] for v in analyzers) == [
        "fusewise.diagnose._gaps imports fusewise.diagnose.syncs",
        "fusewise.diagnose.chains imports fusewise.diagnose.driver",
        "fusewise.diagnose.chains imports fusewise.diagnose.syncs",
    ], analyzers
    assert unplaced_modules(src) == [
        "fusewise.stray (fusewise/stray.py) is in no layer: add it to LAYERS"
    ]
