"""``Registry[T]``: the one idiom for name-keyed registries (scores, tasks, ablation kinds,
corpora, executors, architectures), as lm-evaluation-harness' ``api/registry.py``.

A registry is a ``dict`` (reading code indexes and iterates it as one) that adds each entry once
(``register``: a second entry under one name is an error unless ``overwrite``) and looks names
up with one clear error that lists the valid names and suggests a close one (``lookup``)."""

from __future__ import annotations

import difflib
from typing import Callable, TypeVar

from lens_heads.errors import LensHeadsError

T = TypeVar("T")


class Registry(dict[str, T]):
    """Entries of one kind (``what``: "score", "task", ...), by name."""

    def __init__(self, what: str, entries: dict[str, T] | None = None):
        super().__init__()
        self.what = what
        for name, item in (entries or {}).items():
            self.register(name, item)

    def register(self, name: str, item: T, *, overwrite: bool = False) -> T:
        """Add ``item`` under ``name``; returns it (so it can end a decorator)."""
        if name in self and not overwrite:
            raise LensHeadsError(f"{self.what} {name!r} is already registered (pass overwrite=True to replace it)")
        self[name] = item
        return item

    def decorator(self, key: Callable[[T], str]) -> Callable[[T], T]:
        """A decorator registering what it decorates under ``key(item)``."""
        return lambda item: self.register(key(item), item)

    def lookup(self, name: str) -> T:
        """The entry ``name``, or one error naming the valid ones (and a close match)."""
        if name in self:
            return self[name]
        near = difflib.get_close_matches(str(name), list(self), n=1, cutoff=0.75)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise LensHeadsError(f"unknown {self.what} {name!r}; valid: {', '.join(self)}.{hint}")
