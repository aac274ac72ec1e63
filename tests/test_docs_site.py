"""The documentation site (mkdocs.yml, docs/hooks.py): it builds in strict mode, every public name
of lens_heads has a reference entry with its own docstring, and the README, methods,
architecture and the example notebooks are pages."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("mkdocs_jupyter")

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plain(fragment: str) -> str:
    """HTML to the words a reader sees, spaces collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_every_public_name_has_its_docstring_in_the_reference(site):
    import lens_heads

    page = _plain((site / "reference" / "index.html").read_text(encoding="utf-8"))
    for name in lens_heads.__all__:
        doc = getattr(lens_heads, name).__doc__ if name not in ("ZOO", "ARCHITECTURES", "SCORES") else None
        assert f"lens_heads.{name}" in page, name
        if doc:  # the first words of the docstring, as the page shows them (markup removed)
            words = re.sub(r"[`*]", "", doc.strip().split("\n")[0]).split()[:6]
            assert " ".join(words) in page, (name, words)
    for attribute in ("The offline model zoo", "Every architecture lens_heads knows", "Every score function by id"):
        assert attribute in page


def test_pages_hold_the_readme_methods_architecture_and_notebooks(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "The two commands" in home and 'src="explorer.png"' in home and (site / "explorer.png").is_file()
    assert "Sequential decisions" in (site / "methods" / "index.html").read_text(encoding="utf-8")
    assert "wing" in (site / "architecture" / "index.html").read_text(encoding="utf-8").lower()
    for name in ("01_finding_dormant_heads", "02_zeroing_heads", "03_repairing_heads"):
        page = (site / "examples" / name / "index.html").read_text(encoding="utf-8")
        assert "data:image/png;base64," in page  # the committed figures
        assert "smollm2-135m" in page.lower()
    assert not list(site.rglob("*.py"))  # the hooks and scripts under docs/ are not published


def test_a_public_name_without_a_docstring_is_found(tmp_path):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '"""A package."""\nfrom dataclasses import dataclass\n\n__all__ = ["documented", "bare", "Shape", "TABLE", "NOTED"]\n\n'
        'def documented():\n    """Does a thing."""\n\n\ndef bare():\n    pass\n\n\n@dataclass\nclass Shape:\n    x: int = 0\n\n\n'
        'TABLE = {"a": 1}\n\nNOTED = {"b": 2}\n"""What NOTED holds."""\n')
    assert _hooks().missing_docstrings("fakepkg", [str(tmp_path)]) == ["bare", "Shape", "TABLE"]


def test_links_are_made_right_for_the_site():
    hooks = _hooks()
    page = hooks.readme_page()
    assert "](docs/" not in page and "](explorer.png)" in page
    assert "](https://github.com/TransformerLensOrg/TransformerLens)" in page
    fix = hooks.fix_links
    assert fix("[m](docs/methods.md#13-adaptive)") == "[m](methods.md#13-adaptive)"
    assert fix("![shot](docs/explorer.png)") == "![shot](explorer.png)"
    assert fix("[the store](lens_heads/results/store.py)") == "the store (`lens_heads/results/store.py`)"
    assert fix("[gone](no/such/file.md)") == "[gone](no/such/file.md)"  # left for strict mode to report
    assert fix("[web](https://example.org/a.md) [here](#layout)") == "[web](https://example.org/a.md) [here](#layout)"
