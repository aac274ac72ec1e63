"""The project's one progress-bar idiom: a tqdm bar, silent when not enabled."""

from __future__ import annotations


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "it", leave: bool = False):
    """A ``tqdm.auto`` bar over ``total`` items (a disabled one when not ``enabled``)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=leave, disable=not enabled)
