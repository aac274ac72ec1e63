"""Installation: the package's torch requirement is a floor, and the constraints file the README's
commands pass caps it without replacing a torch the user already has (pip's own resolver, dry run)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fake_torch(venv: Path, version: str) -> None:
    """A venv that 'has' torch ``version`` (its distribution metadata: all pip looks at)."""
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    info = Path(purelib) / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("pip\n")


def _installed_here(venv: Path) -> Path:
    """Constraints pinning every distribution of the test's own environment (but torch and this
    package) to its installed version: what the resolver decides then depends on our metadata and
    the constraints file, not on what the package index serves today (a newer transformer-lens
    needing a newer torch would otherwise fail this test on a fresh machine only)."""
    from importlib.metadata import distributions

    skip = {"torch", "lens-heads", "lens_heads"}
    pins = sorted({f"{d.metadata['Name']}=={d.version}" for d in distributions()
                   if d.metadata["Name"] and d.metadata["Name"].lower() not in skip})
    path = venv / "installed-here.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


def _would_install(venv: Path, *extra: str) -> dict[str, str]:
    report = venv / "report.json"
    out = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--dry-run", "--report", str(report),
                          "-e", str(ROOT), "-c", str(_installed_here(venv)), *extra],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.skip(f"pip could not resolve here (no package index?): {out.stderr.strip().splitlines()[-1:]}")
    data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in data["install"]}


def test_an_existing_torch_stays_with_and_without_the_constraints(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _fake_torch(venv, "2.6.0+cu124")  # a GPU user's build, older than this project's
    plain = _would_install(venv)
    assert "torch" not in plain and "transformer-lens" in plain
    constrained = _would_install(venv, "-c", str(ROOT / "constraints.txt"))
    assert "torch" not in constrained and "transformer-lens" in constrained


def test_the_requirement_is_a_floor_and_the_cap_is_in_the_constraints_file():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = [d for d in deps if d.startswith("torch")]
    assert torch_req == ["torch>=2.6"]
    from packaging.requirements import Requirement

    cap = [Requirement(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
    assert [r.name for r in cap] == ["torch"]
    assert cap[0].specifier.contains("2.13.0+cpu") and not cap[0].specifier.contains("2.14.0")
    assert sysconfig.get_python_version() >= "3.11"
