"""How many bytes a GGUF file's own header says it holds, to tell a truncated file apart.

A GGUF file is a header (magic, version, tensor count, key/value metadata, one info record per
tensor: name, shape, type, offset into the data section), padding to ``general.alignment``
(default 32), then the tensor data. The file must be at least as long as the data section's
start plus the end of its last tensor. ``declared_size`` reads only the header (the ``gguf``
package supplies the type codes and the block sizes of quantised types) and raises
``Truncated`` when the header itself is cut off.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_ALIGNMENT_KEY = "general.alignment"


class Truncated(Exception):
    """The header ends before its own records do."""


class _Reader:
    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def take(self, fmt: str):
        n = struct.calcsize("<" + fmt)
        data = self.f.read(n)
        if len(data) < n:
            raise Truncated(f"the header is cut off at byte {self.f.tell()}")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self.take("Q")
        if n > self.size:
            raise Truncated(f"a string of {n} bytes at byte {self.f.tell()} exceeds the file")
        data = self.f.read(n)
        if len(data) < n:
            raise Truncated(f"the header is cut off at byte {self.f.tell()}")
        return data.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            return [self.value(item) for _ in range(count)]
        raise Truncated(f"unknown metadata value type {vtype} at byte {self.f.tell()} (corrupt header)")


def declared_size(path: str | os.PathLike) -> int:
    """The smallest size in bytes the file's header allows (data start + end of the last tensor)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, size)
        if f.read(4) != b"GGUF":
            raise Truncated("bad magic bytes (not a GGUF file)")
        r.take("I")  # version
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        alignment = 32
        for _ in range(n_kv):
            key, vtype = r.string(), r.take("I")
            value = r.value(vtype)
            if key == _ALIGNMENT_KEY:
                alignment = int(value)
        end = 0
        for _ in range(n_tensors):
            r.string()
            dims = [r.take("Q") for _ in range(r.take("I"))]
            ttype, offset = r.take("I"), r.take("Q")
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                raise Truncated(f"unknown tensor type {ttype} (corrupt header)") from None
            n = 1
            for d in dims:
                n *= d
            end = max(end, offset + n // block * type_size)
        start = f.tell()
    start += (-start) % alignment
    return start + end
