"""The template of an op family (docs/DESIGN.md): every folder of fusewise.ops has the same files,
kernels.py holds only Triton kernels, reference.py only torch; and what importing fusewise
registers (each family's fix and cost model). Imports between families and module sizes:
tests/test_layout.py."""

import ast
import pathlib

import pytest

import fusewise
from fusewise import cost, fixes

OPS = pathlib.Path(fusewise.__file__).parent / "ops"
# every folder is a family: a new one is checked without editing this test
FAMILIES = sorted(p.parent.name for p in OPS.glob("*/__init__.py"))
TEMPLATE = ("__init__.py", "kernels.py", "launch.py", "op.py", "reference.py", "cost.py")


def _imports(path: pathlib.Path) -> set[str]:
    """Absolute names of the modules `path` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(OPS.parent.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from .. import _dispatch` imports a module; `from .op import f` a name of one
            names = [f"{base}.{a.name}" for a in node.names]
            if base.startswith("fusewise") and all(_is_module(n) for n in names):
                found.update(names)
            else:
                found.add(base)
    return found


def _is_module(name: str) -> bool:
    rel = pathlib.Path(*name.split(".")[1:])
    root = OPS.parent
    return (root / rel).with_suffix(".py").exists() or (root / rel / "__init__.py").exists()


def test_the_families_are_found():
    assert {"norms", "adamw", "linear_ce", "gated", "rotary"} <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_the_template_files(family):
    files = {p.name for p in (OPS / family).glob("*.py")}
    assert set(TEMPLATE) <= files, f"ops/{family} lacks {sorted(set(TEMPLATE) - files)}"


@pytest.mark.parametrize("family", FAMILIES)
def test_kernels_hold_only_triton_functions_and_references_only_torch(family):
    tree = ast.parse((OPS / family / "kernels.py").read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        assert isinstance(node, ast.FunctionDef), ast.dump(node)[:80]
        assert any(ast.unparse(d) == "triton.jit" for d in node.decorator_list), node.name
    refs = _imports(OPS / family / "reference.py")
    assert {n.split(".")[0] for n in refs} <= {"torch", "math", "__future__"}


def test_importing_fusewise_registers_each_family_fix():
    apis = {
        ("fusion-chain", "norm"): ("fusewise.ops.layer_norm", "fusewise.ops.norms"),
        ("fusion-chain", "optimizer"): ("fusewise.optim.AdamW", "fusewise.ops.adamw"),
        ("fusion-chain", "cross-entropy"): (
            "fusewise.ops.linear_cross_entropy",
            "fusewise.ops.linear_ce",
        ),
        ("fusion-chain", "rotary"): ("fusewise.ops.apply_rotary", "fusewise.ops.rotary"),
        ("fusion-chain", "gated-activation"): ("fusewise.ops.swiglu", "fusewise.ops.gated"),
    }
    for (kind, pattern), (api, origin) in apis.items():
        (fix,) = fixes.registered(kind, pattern)
        assert (fix.api, fix.origin) == (api, origin)
        text = fixes.text(kind, pattern)
        assert text.startswith(api) and text.index(api) < text.index("; or ")  # before generic
    assert "fusewise.ops.linear_cross_entropy" in fixes.text("fusion-chain", "cross-entropy")
    assert "logits never materialised" in fixes.text("fusion-chain", "cross-entropy")


def test_the_families_cost_models_are_registered():
    assert {
        "fusewise.norm_fwd.",
        "fusewise.norm_bwd.",
        "fusewise.linear_ce_",
        "fusewise.rotary_fwd.",
        "fusewise.rotary_bwd.",
    } <= set(cost._REGISTERED)


@pytest.mark.parametrize("family", FAMILIES)
def test_importing_fusewise_loads_every_family_and_it_registers_its_fix(family):
    """A family folder that ops/__init__.py does not import would register nothing: the
    diagnosis would never recommend it."""
    import sys

    assert f"fusewise.ops.{family}" in sys.modules, f"fusewise.ops does not import ops/{family}"
    origins = {f.origin for fs in fixes._REGISTERED.values() for f in fs}
    assert f"fusewise.ops.{family}" in origins, f"ops/{family} registers no fix"
