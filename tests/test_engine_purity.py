"""The engine is pure Python: importing every module of recovery/engine loads no Django at all."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import recovery.engine

ROOT = Path(__file__).resolve().parent.parent


def test_it_imports_no_django():
    modules = sorted(f"recovery.engine.{m.name}" for m in pkgutil.iter_modules(recovery.engine.__path__))
    assert {"recovery.engine.classify", "recovery.engine.decide", "recovery.engine.gate"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"the engine pulled in Django: {result.stdout}"
