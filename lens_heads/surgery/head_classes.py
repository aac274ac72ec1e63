"""The diagnosis classes of a head (docs/methods.md §6), in the order they are tested, with
their display names: the one list that diagnosis, figures and the report share."""

from __future__ import annotations

CLASSES: tuple[str, ...] = ("dead", "bos_sink", "low_entropy", "local", "healthy")
SICK: tuple[str, ...] = CLASSES[:-1]
LABELS: dict[str, str] = {"dead": "DEAD", "bos_sink": "BOS-sink", "low_entropy": "low-entropy", "local": "local",
                          "healthy": "healthy"}
SHORT: dict[str, str] = {"dead": "DEAD", "bos_sink": "sink", "low_entropy": "low-H", "local": "local",
                         "healthy": "ok", "absent": "-"}
# not a class: the place of a head a pruned layer no longer has (its statistics are NaN)
ABSENT = "absent"


def canonical(name: str) -> str:
    """"BOS-sink" / "bos_sink" / "DEAD" -> the class id ("bos_sink", "dead")."""
    return str(name).strip().replace("-", "_").lower()


def label(name: str) -> str:
    """The display name of a class (the name itself when it is not one of ``CLASSES``)."""
    c = canonical(name)
    return LABELS.get(c, str(name))
