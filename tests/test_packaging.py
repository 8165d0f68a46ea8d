"""Packaging: the Dockerfile lints clean, setup.py declares the console script and packages."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_dockerfile_passes_hadolint():
    exe = shutil.which("hadolint") or str(ROOT / ".venv" / "bin" / "hadolint")
    res = subprocess.run([exe, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfile_base_matches_pinned_beam():
    pinned = next(line.split("==")[1].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                  if line.startswith("apache-beam"))
    assert f"FROM apache/beam_python3.11_sdk:{pinned}" in (ROOT / "Dockerfile").read_text()


def test_console_script_and_packages_declared():
    text = (ROOT / "setup.py").read_text()
    assert "dpcda=pipeline.cli:main" in text
    for pkg in ("pipeline", "transforms", "schemas", "privacy", "evaluation"):
        assert f'"{pkg}"' in text
        assert (ROOT / pkg / "__init__.py").exists()


def test_privacy_and_mixing_import_without_beam():
    code = ("import sys; sys.modules['apache_beam'] = None; "
            "import privacy.accounting, privacy.calibration, privacy.dp_stats, privacy.noise, privacy.paper, "
            "transforms.mixing, transforms.plan, transforms.shards")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("module", ["privacy.accounting", "privacy.calibration", "privacy.events",
                                    "privacy.dp_stats", "privacy.noise", "privacy.paper"])
def test_privacy_modules_import_only_allowed_libraries(module):
    import ast
    import importlib

    path = importlib.import_module(module).__file__
    tree = ast.parse(open(path).read())
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert roots <= {"__future__", "dataclasses", "math", "typing", "hashlib", "secrets", "decimal", "fractions",
                     "functools", "numpy", "cryptography", "dp_accounting", "mpmath", "privacy"}, roots
