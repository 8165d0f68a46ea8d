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
    pinned = next(
        line.split("==")[1].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.startswith("apache-beam")
    )
    assert f"FROM apache/beam_python3.11_sdk:{pinned}" in (ROOT / "Dockerfile").read_text()


def test_console_script_and_packages_declared():
    text = (ROOT / "setup.py").read_text()
    assert "dpcda=pipeline.cli:main" in text
    for pkg in ("pipeline", "transforms", "mechanisms", "storage", "schemas", "privacy", "evaluation"):
        assert f'"{pkg}"' in text
        assert (ROOT / pkg / "__init__.py").exists()


def test_privacy_and_mechanisms_import_without_beam_or_torch_models():
    code = (
        "import sys; sys.modules['apache_beam'] = None; "
        "import privacy.accounting, privacy.calibration, privacy.dp_stats, privacy.noise, privacy.events, "
        "mechanisms.dpcda, mechanisms.plan, mechanisms.combiners, mechanisms.postprocess, storage.shards"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _imported_roots(path) -> set:
    import ast

    tree = ast.parse(open(path).read())
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    return roots | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


PRIVACY_MODULES = sorted(p.stem for p in (ROOT / "privacy").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("module", PRIVACY_MODULES)
def test_privacy_modules_import_only_numpy_dp_accounting_and_the_cipher_library(module):
    stdlib = set(sys.stdlib_module_names)
    roots = _imported_roots(ROOT / "privacy" / f"{module}.py")
    assert roots - stdlib <= {"numpy", "dp_accounting", "cryptography", "privacy"}, roots - stdlib


@pytest.mark.parametrize(
    "package,forbidden",
    [
        (
            "privacy",
            {"mechanisms", "storage", "transforms", "pipeline", "evaluation", "schemas", "apache_beam", "torch"},
        ),
        ("mechanisms", {"transforms", "pipeline", "evaluation", "apache_beam"}),
        ("storage", {"mechanisms", "transforms", "pipeline", "evaluation"}),
        ("schemas", {"mechanisms", "storage", "transforms", "pipeline", "evaluation", "apache_beam", "torch"}),
        ("evaluation", {"transforms", "pipeline", "apache_beam"}),
    ],
)
def test_nothing_imports_upward(package, forbidden):
    """Layers, bottom up: privacy < schemas < storage < mechanisms < evaluation < transforms < pipeline."""
    for path in (ROOT / package).glob("*.py"):
        bad = _imported_roots(path) & forbidden
        assert not bad, f"{path.name} imports {bad}"


def test_transforms_are_thin():
    """transforms/ holds PTransforms and their DoFns only: no module defines more than a few plain functions."""
    import ast

    for path in (ROOT / "transforms").glob("*.py"):
        tree = ast.parse(path.read_text())
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assert len(funcs) <= 4, f"{path.name}: {len(funcs)} module-level functions; cores belong in mechanisms/"
        assert all(
            any(getattr(b, "attr", getattr(b, "id", "")) in ("PTransform", "DoFn", "CombineFn") for b in c.bases)
            for c in classes
        ), f"{path.name}: a class that is not a Beam transform"
