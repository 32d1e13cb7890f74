"""Dependencies point one way: the engine never loads streamlit, the pages never load torch."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_runs_without_streamlit():
    modules = sorted(p.stem for p in (ROOT / "engine").glob("*.py") if p.stem not in ("__main__",))
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module('engine.' + m if m != '__init__' else 'engine')\n"
            "assert 'streamlit' not in sys.modules, 'engine imported streamlit'\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_dashboard_files_import_no_torch():
    for path in [ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "ui").glob("*.py")]:
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "torch" not in names, f"{path.relative_to(ROOT)} imports torch"
