"""Every numerical tolerance of the suite is a named constant from tests/conftest.py.

A literal such as ``rtol=1e-8`` hides why the test may be that loose (or that tight) and lets
a failing test be "fixed" by loosening it unseen. This test reads every test file's syntax
tree and lists each tolerance given as a number: a keyword rtol/atol/rel/abs (or
rel_tol/abs_tol), a tolerance passed by position to assert_allclose/allclose/isclose/approx,
or a local variable holding such a number that is then used as one. Exact comparisons
(``atol=0``) and integer factors inside a derived bound (``40 * EPS64 * κ³``) are fine; a
float inside one (``1e-9 * ref[0]``) is a literal tolerance.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
KEYWORDS = {"rtol", "atol", "rel", "abs", "rel_tol", "abs_tol"}
# Comparison functions and the position of their first tolerance argument.
POSITIONAL = {"assert_allclose": 2, "allclose": 2, "isclose": 2, "approx": 1}
PROJECT = {"engine", "ui", "pages", "app", "benchmarks"}


def _callee(call: ast.Call) -> tuple[str | None, str | None]:
    """(root name, last name) of what is called: np.testing.assert_allclose -> (np, assert_allclose)."""
    f, last = call.func, None
    while isinstance(f, ast.Attribute):
        last = last or f.attr
        f = f.value
    root = f.id if isinstance(f, ast.Name) else None
    return root, last or root


def _number(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool))


def _floats(node: ast.AST, assigned: dict[str, list[ast.AST]] | None = None) -> list[float]:
    """Floats other than 0 in the arithmetic of a tolerance (``1e-9 * ref[0]``, ``max(tol, 1e-10)``),
    and one assignment back through a name (``tol = 1e-3``); not inside other calls or indexing,
    where a number belongs to a data value (``scale = np.abs(x * 0.5).max()``)."""
    if _number(node):
        return [node.value] if isinstance(node.value, float) and node.value != 0 else []
    if isinstance(node, ast.UnaryOp):
        return _floats(node.operand, assigned)
    if isinstance(node, ast.BinOp):
        return _floats(node.left, assigned) + _floats(node.right, assigned)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min"):
        return [f for a in node.args for f in _floats(a, assigned)]
    if isinstance(node, ast.Name) and assigned:
        return [f for value in assigned.get(node.id, []) for f in _floats(value)]
    return []


def _literals(node: ast.AST, assigned: dict[str, list[ast.AST]]) -> list[float]:
    """The literal tolerances in one tolerance argument: the whole value when it is a number
    other than 0 (``atol=1`` too), else the floats in its arithmetic."""
    if _number(node) or isinstance(node, ast.UnaryOp) and _number(node.operand):
        return [ast.literal_eval(node)] if ast.literal_eval(node) != 0 else []
    return _floats(node, assigned)


def literal_tolerances(source: str) -> list[tuple[int, str]]:
    """(line, text) of every literal tolerance in one test file's source."""
    tree = ast.parse(source)
    # Arguments of the project's own functions (eig_spectrum(rtol=...), spectrum_config(rtol=...))
    # are inputs under test, not tolerances.
    project = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and (n.module or "").split(".")[0] in PROJECT for a in n.names}
    project |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names if a.name.split(".")[0] in PROJECT}
    assigned: dict[str, list[ast.AST]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append(n.value)
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        root, last = _callee(call)
        if root in project:
            continue
        args = [(k.arg, k.value) for k in call.keywords if k.arg in KEYWORDS]
        if last in POSITIONAL:
            args += [(f"argument {i + 1}", a) for i, a in enumerate(call.args) if i >= POSITIONAL[last]]
        for name, value in args:
            if _literals(value, assigned):
                found.append((value.lineno, f"{name}={ast.unparse(value)} in {ast.unparse(call)[:80]}"))
    return found


def test_no_test_file_has_a_literal_tolerance():
    bad = [f"{p.name}:{line}: {text}" for p in sorted(TESTS.glob("*.py")) if p.name != "conftest.py"
           for line, text in literal_tolerances(p.read_text())]
    assert not bad, ("literal tolerances; name them in tests/conftest.py's Tolerances section, "
                     "with a comment saying why:\n" + "\n".join(bad))


@pytest.mark.parametrize("source", [
    "np.testing.assert_allclose(a, b, rtol=1e-8)",
    "torch.testing.assert_close(a, b, rtol=RTOL64, atol=1e-12)",
    "assert x == pytest.approx(y, rel=0.1)",
    "assert x == pytest.approx(y, 1e-3)",
    "np.testing.assert_allclose(a, b, 1e-7, 0)",
    "np.testing.assert_allclose(a, b, rtol=0, atol=0.006)",
    "np.testing.assert_allclose(a, b, atol=1e-9 * b[0])",
    "assert x == pytest.approx(y, rel=max(tol, 1e-10))",
    "tol = 1e-9 * b[0]\nnp.testing.assert_allclose(a, b, atol=tol)",
    "np.testing.assert_allclose(a, b, atol=1)",
    "tol = 1e-3\nnp.testing.assert_allclose(a, b, rtol=tol)",
    "assert math.isclose(a, b, rel_tol=1e-6)",
    "from engine.maths.spectral import eig_spectrum\nassert helper(a, rtol=-1e-3)",
])
def test_each_kind_of_literal_tolerance_is_found(source):
    assert len(literal_tolerances(source)) == 1


@pytest.mark.parametrize("source", [
    "np.testing.assert_allclose(a, b, rtol=RTOL64, atol=ATOL64)",
    "np.testing.assert_allclose(a, b, rtol=0, atol=0)",
    "np.testing.assert_allclose(a, b, rtol=0, atol=RTOL32 * np.abs(b).max())",
    "assert x == pytest.approx(y)",
    "tol = 40 * EPS64 * k**3 * 10\nassert x == pytest.approx(y, rel=max(tol, RTOL64))",
    "from engine.maths.spectral import eig_spectrum\ns = eig_spectrum(lam, rtol=1e-6)",
    "np.testing.assert_allclose(a, b - 0.1 * g, rtol=RTOL64)",
    "n = 40\nnp.testing.assert_allclose(a, b, atol=n * EPS64)",
    "from ui import configs\nc = configs.spectrum_config(s, rtol=1e-8)",
    "scale = np.abs(x * 0.5).max()\nnp.testing.assert_allclose(a, b, atol=RTOL32 * scale)",
])
def test_named_or_exact_tolerances_pass(source):
    assert literal_tolerances(source) == []
