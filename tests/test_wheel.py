"""The wheel holds the package and only the package (issue 54): built from a copy of this checkout (offline: no
build isolation, the setuptools of this environment), it contains every file of ``hf_cascade/`` (the modules and
the CPU kernels' C++ sources, which are compiled on first use) and nothing else (no model_cards/, docs/, tests/,
examples/). Installed with ``--no-deps`` into a fresh venv, it is what ``import hf_cascade`` imports there: the
venv reaches this environment's torch and transformers through a plain path entry (a ``.pth`` line naming its
site-packages, whose own ``.pth`` files, among them the editable install's finder, are not run), and
``hf_cascade.shipped`` says clearly that the shipped folders are not in a wheel."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what a source checkout holds beside the package and the wheel must not
NOT_IN_WHEEL = ("model_cards/", "docs/", "tests/", "examples/", "shared/")


def _copy_checkout(dst: Path) -> None:
    """The checkout's working tree (what a user's clone holds, uncommitted changes included), without the venv,
    VCS data and build outputs; files hard-linked where possible (no second copy of the heads' weights)."""
    skip = shutil.ignore_patterns(
        ".venv", "venv", ".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache", "results"
    )

    def link(src, dst_file):
        try:
            os.link(src, dst_file)
        except OSError:
            shutil.copy2(src, dst_file)

    shutil.copytree(ROOT, dst, ignore=skip, copy_function=link)


def _package_files() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "hf_cascade").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def _toml(path: Path) -> dict:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return tomllib.loads(path.read_text())


def _build_backend_or_skip() -> None:
    """The wheel is built offline without build isolation, by this environment's backend: skip (saying what to
    install) where it does not meet ``[build-system] requires`` (``pip install -e '.[test]'`` brings it)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    for requirement in map(Requirement, _toml(ROOT / "pyproject.toml")["build-system"]["requires"]):
        try:
            have = version(requirement.name)
        except PackageNotFoundError:
            pytest.skip(
                f"building the wheel offline needs {requirement} in this environment (pip install -e '.[test]')"
            )
        if not requirement.specifier.contains(have, prereleases=True):
            pytest.skip(f"building the wheel offline needs {requirement}, this environment has {have}")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    _build_backend_or_skip()
    tmp = tmp_path_factory.mktemp("wheel")
    _copy_checkout(tmp / "src")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(tmp / "src"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    wheels = list((tmp / "dist").glob("hf_cascade-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_package_data_names_only_what_exists():
    """Each pattern of ``[tool.setuptools.package-data]`` matches files of its package (none names files that
    are elsewhere, such as model_cards/, or nowhere)."""
    data = _toml(ROOT / "pyproject.toml")["tool"]["setuptools"]["package-data"]
    for package, patterns in data.items():
        for pattern in patterns:
            assert list((ROOT / package.replace(".", "/")).glob(pattern)), f"package-data {package}: {pattern!r}"


def test_wheel_holds_the_package_and_nothing_else(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if not n.endswith("/")}
    files = {n for n in names if ".dist-info/" not in n}
    assert not [n for n in files if not n.startswith("hf_cascade/")], sorted(
        n for n in files if not n.startswith("hf_cascade/")
    )
    assert not [n for n in names if n.startswith(NOT_IN_WHEEL) or "/model_cards/" in n]
    assert _package_files() <= files, sorted(_package_files() - files)  # every module and data file
    assert {"hf_cascade/backends/cpu/csrc/panel_linear.cpp", "hf_cascade/backends/cpu/csrc/screen.cpp"} <= files
    assert not [n for n in files if n.endswith((".pyc", ".so", ".safetensors"))]


def test_wheel_installs_and_imports_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # this environment's packages (torch, transformers, ...) by a plain path line: not a site dir, so its .pth
    # files (the editable install of this checkout among them) are not run
    ours = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]
    (purelib / "zz_test_deps.pth").write_text("".join(f"{p}\n" for p in ours))
    res = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    script = """
import sys
from pathlib import Path
import hf_cascade
from hf_cascade.backends.cpu import panel
print("FILE", hf_cascade.__file__)
print("SOURCES", all(Path(s).is_file() for s in panel.SOURCES), len(panel.SOURCES))
try:
    hf_cascade.shipped("gemma-3-270m-glide-xs")
except FileNotFoundError as e:
    print("SHIPPED", e)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    res = subprocess.run(
        [str(python), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    out = dict(
        line.split(" ", 1)
        for line in res.stdout.splitlines()
        if line.split(" ", 1)[0] in ("FILE", "SOURCES", "SHIPPED")
    )
    installed = Path(out["FILE"]).resolve()
    assert installed.is_relative_to(purelib.resolve()), installed  # the wheel's copy, not the checkout
    assert not installed.is_relative_to(ROOT.resolve()), installed
    assert out["SOURCES"] == "True 2"
    assert "a wheel does not carry them" in out["SHIPPED"] and "pip install -e ." in out["SHIPPED"]
