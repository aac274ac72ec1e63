"""What produced a result: the versions of the packages in the pipeline, for metadata and reports."""

from __future__ import annotations

import platform
from typing import Sequence

CORE_PACKAGES = ("lens_heads", "torch", "transformer_lens", "transformers")


def package_versions(packages: Sequence[str] = CORE_PACKAGES) -> dict[str, str | None]:
    """{package: installed version or None} for ``packages``, then ``python``."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for pkg in packages:
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = None
    out["python"] = platform.python_version()
    return out


def lens_heads_version() -> str:
    """The installed lens_heads version (what store keys record): from the package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lens_heads")
    except PackageNotFoundError:  # a source tree on sys.path without an install
        return "0.1.0"
