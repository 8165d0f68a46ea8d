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


def _dockerignore_rules(text: str) -> list:
    """(regex, exception) per rule of a .dockerignore, as Docker reads it (moby's patternmatcher): paths relative to
    the context, a leading '/' dropped, ``*`` and ``?`` within one path element, ``**`` across elements, ``!`` an
    exception; a rule that matches a folder matches everything under it; the last rule that matches decides."""
    import os
    import re

    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            else:
                c = pattern[i]
                out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c) if c not in "[]" else c)
                i += 1
        rules.append((re.compile(out + "$"), exception))
    return rules


def _docker_excludes(rules, path: str) -> bool:
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    excluded = False
    for regex, exception in rules:
        if any(regex.match(p) for p in prefixes):
            excluded = not exception
    return excluded


def test_dockerignore_keeps_what_the_dockerfile_copies_and_nothing_heavy():
    """docker build . sent the 2.6 GB .venv and data/ as build context: .dockerignore now keeps only what the
    Dockerfile COPYs; every tracked file under a COPY source is in the context."""
    import re

    rules = _dockerignore_rules((ROOT / ".dockerignore").read_text())
    copies = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        m = re.match(r"\s*COPY\s+(?!--from)(.+)", line)
        if m:
            copies += m.group(1).split()[:-1]  # the last word is the destination
    assert copies == ["requirements.txt", "setup.py", "dpcda/"]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for src in copies:
        files = [f for f in tracked if f == src or f.startswith(src)]
        assert files, src
        kept_out = [f for f in files if _docker_excludes(rules, f)]
        assert not kept_out, f"the Dockerfile copies {src}, but .dockerignore leaves out {kept_out[:3]}"
    for heavy in (".venv", ".venv/lib/python3.11/site-packages/torch/__init__.py", "data", "data/fm/train/a.parquet",
                  "releases", "releases/fm/manifest.json", ".git", ".git/objects/ab/cd", "tests/test_api.py",
                  "benchmarks/results/tabular.png", "dpcda/__pycache__/api.cpython-311.pyc", "dpcda/storage/_build.py",
                  "release-x/manifest.json", "out/a", ".pytest_cache/v/x", "venv/bin/python"):  # fmt: skip
        assert _docker_excludes(rules, heavy), heavy
    # the matcher itself, on Docker's documented examples
    assert _docker_excludes(_dockerignore_rules("**/*.go"), "a/b/c.go")
    assert not _docker_excludes(_dockerignore_rules("*/temp*"), "temp.txt")
    assert _docker_excludes(_dockerignore_rules("*/temp*"), "somedir/temporary.txt")
    assert not _docker_excludes(_dockerignore_rules("*.md\n!README.md"), "README.md")


def test_dockerfile_base_matches_pinned_beam():
    pinned = next(
        line.split("==")[1].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.startswith("apache-beam")
    )
    assert f"FROM apache/beam_python3.11_sdk:{pinned}" in (ROOT / "Dockerfile").read_text()


SUBPACKAGES = ("pipeline", "transforms", "mechanisms", "storage", "schemas", "privacy", "evaluation")


def test_one_top_level_package_and_its_console_script():
    text = (ROOT / "setup.py").read_text()
    assert "dpcda=dpcda.pipeline.cli:main" in text
    assert 'find_packages(include=["dpcda", "dpcda.*"])' in text
    for pkg in SUBPACKAGES:
        assert (ROOT / "dpcda" / pkg / "__init__.py").exists()
        assert not (ROOT / pkg).exists(), f"{pkg}/ at the top level: it belongs under dpcda/"


def test_the_version_is_written_once_and_every_reader_agrees():
    """setup.py (which reads dpcda/_version.py as text), ``dpcda.__version__``, the build check's ``VERSION`` and
    ``dpcda.pipeline.__version__`` (the manifest's and the worker image tag's) give the same version, and no other
    module of the package, nor setup.py, writes it."""
    import re

    import dpcda
    import dpcda._version
    import dpcda.pipeline
    import dpcda.storage.build

    want = dpcda._version.__version__
    res = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip().splitlines()[-1] == want, res.stderr
    assert dpcda.__version__ == dpcda.pipeline.__version__ == dpcda.storage.build.VERSION == want
    literal = re.compile(re.escape(f'"{want}"'))
    holders = [p for p in [ROOT / "setup.py", *(ROOT / "dpcda").rglob("*.py")] if literal.search(p.read_text())]
    assert holders == [ROOT / "dpcda" / "_version.py"]


def _third_party_imports() -> dict:
    """Top-level module name -> the dpcda files that import it (stdlib and dpcda itself left out)."""
    import ast

    found: dict = {}
    for path in (ROOT / "dpcda").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root and root != "dpcda" and root not in sys.stdlib_module_names:
                    found.setdefault(root, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_import_is_a_declared_dependency():
    """What pip installs for ``dpcda`` (core or an extra) covers every module the package imports."""
    import re
    from importlib.metadata import packages_distributions, requires

    declared = set()
    for req in requires("dpcda") or []:
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        declared.add(re.sub(r"[-_.]+", "-", name).lower())
    owners = packages_distributions()
    for module, where in sorted(_third_party_imports().items()):
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(module, [])}
        assert dists, f"{module} (imported by {sorted(where)}) is not installed"
        assert dists & declared, f"{module} (imported by {sorted(where)}) comes from {dists}; none is in setup.py"


def test_privacy_and_mechanisms_import_without_beam_or_torch_models():
    code = (
        "import sys; sys.modules['apache_beam'] = None; "
        "import dpcda.privacy.accounting, dpcda.privacy.calibration, dpcda.privacy.dp_stats, dpcda.privacy.noise, "
        "dpcda.privacy.events, dpcda.mechanisms.dpcda, dpcda.mechanisms.plan, dpcda.mechanisms.combiners, "
        "dpcda.mechanisms.postprocess, dpcda.storage.shards"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _imported_roots(path) -> set:
    import ast

    tree = ast.parse(open(path).read())
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    return roots | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def _imported_subpackages(path) -> set:
    """The roots a module imports, with ``dpcda.X`` counted as ``X`` (the layer it reaches)."""
    import ast

    tree = ast.parse(open(path).read())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return {m.split(".")[1] if m.startswith("dpcda.") else m.split(".")[0] for m in names}


PRIVACY = ROOT / "dpcda" / "privacy"
# every module of privacy/, the noise package's included, as its path below privacy/ without ".py"
PRIVACY_MODULES = sorted(str(p.relative_to(PRIVACY).with_suffix("")) for p in PRIVACY.rglob("*.py"))
# The noise package's device implementation holds torch tensors (DESIGN.md: numpy/torch tensors in the noise module);
# no other privacy module may import torch, and privacy.noise loads it only when a caller asks for a device.
PRIVACY_TORCH_PACKAGE = "noise/device/"


def test_the_privacy_module_list_reaches_into_the_noise_package():
    assert "noise/stream" in PRIVACY_MODULES and "noise/device/chacha" in PRIVACY_MODULES


@pytest.mark.parametrize("module", PRIVACY_MODULES)
def test_privacy_modules_import_only_numpy_dp_accounting_and_the_cipher_library(module):
    stdlib = set(sys.stdlib_module_names)
    roots = _imported_roots(PRIVACY / f"{module}.py")
    allowed = {"numpy", "dp_accounting", "cryptography", "dpcda"} | (
        {"torch"} if module.startswith(PRIVACY_TORCH_PACKAGE) else set()
    )
    assert roots - stdlib <= allowed, roots - stdlib


def test_the_noise_module_loads_torch_only_for_a_device():
    code = "import sys, dpcda.privacy.noise, dpcda.privacy.accounting; assert 'torch' not in sys.modules, 'torch'"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "package,forbidden",
    [
        (
            "privacy",
            {"mechanisms", "storage", "transforms", "pipeline", "evaluation", "schemas", "apache_beam", "torch"},
        ),
        ("mechanisms", {"transforms", "pipeline", "evaluation", "apache_beam", "api"}),
        ("storage", {"mechanisms", "transforms", "pipeline", "evaluation", "api"}),
        ("schemas", {"mechanisms", "storage", "transforms", "pipeline", "evaluation", "apache_beam", "torch", "api"}),
        ("evaluation", {"transforms", "pipeline", "apache_beam", "api"}),
        ("transforms", {"pipeline", "api"}),
        ("pipeline", {"api"}),
    ],
)
def test_nothing_imports_upward(package, forbidden):
    """Layers, bottom up: privacy < schemas < storage < mechanisms < evaluation < transforms < pipeline < api; every
    module of a layer's subpackages too (the CLI's subcommands, a mechanism's package, the audit's), imports inside
    functions included."""
    for path in (ROOT / "dpcda" / package).rglob("*.py"):
        bad = _imported_subpackages(path) & forbidden
        if package == "privacy" and str(path.relative_to(PRIVACY)).startswith(PRIVACY_TORCH_PACKAGE):
            bad -= {"torch"}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_transforms_are_thin():
    """transforms/ holds PTransforms and their DoFns only: no module defines more than a few plain functions."""
    import ast
    import importlib

    import apache_beam as beam

    for path in (ROOT / "dpcda" / "transforms").glob("*.py"):
        tree = ast.parse(path.read_text())
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert len(funcs) <= 4, f"{path.name}: {len(funcs)} module-level functions; cores belong in mechanisms/"
        module = importlib.import_module(f"dpcda.transforms.{path.stem}")
        for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            cls = getattr(module, node.name)
            assert issubclass(cls, (beam.PTransform, beam.DoFn, beam.CombineFn)), (
                f"{path.name}: {node.name} is not a Beam transform"
            )


def test_no_import_circles():
    """No two modules of dpcda import each other, directly or through others (imports inside functions count)."""
    import ast

    modules = {}
    for path in (ROOT / "dpcda").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("dpcda"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t not in (name, "dpcda")}
    done, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m) :] + [m])
            return
        if m in done:
            return
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert not cycles, cycles


def test_readme_is_a_short_user_guide_whose_links_resolve():
    """At most 170 lines (results live in docs/ and benchmarks/results/), and every relative link of the README, of
    docs/, of the benchmarks' index and of the result files points at a file that exists."""
    import re

    assert len((ROOT / "README.md").read_text().splitlines()) <= 170
    results = (ROOT / "benchmarks" / "results").glob("*.md")
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md", *results]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"
