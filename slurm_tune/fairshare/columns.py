"""The fast sacct path's columns that stay close to the dump's bytes: strings kept as byte spans (Texts), and
few distinct strings kept as codes (Coded). Each reads like a list and becomes one only when read whole."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class _Column(Sequence):
    """A column that materializes as a list of strings only when read whole (tolist); subclasses give one
    row (_item) and the whole list."""

    __slots__ = ()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        return self._item(i)

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other):
        return isinstance(other, (list, tuple, Sequence)) and self.tolist() == list(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"


class Texts(_Column):
    """A column of strings kept as byte spans of the dump; decoded when read (ASCII only)."""

    __slots__ = ("_buf", "_start", "_end")

    def __init__(self, buf, start: np.ndarray, end: np.ndarray):
        self._buf = buf if isinstance(buf, memoryview) else memoryview(buf)
        self._start, self._end = start, end

    def __len__(self) -> int:
        return len(self._start)

    def _item(self, i):
        return str(self._buf[int(self._start[i]):int(self._end[i])], "ascii")

    def tolist(self) -> list:
        buf = self._buf
        return [str(buf[a:b], "ascii") for a, b in zip(self._start.tolist(), self._end.tolist())]


    def take(self, keep) -> "Texts":
        return Texts(self._buf, self._start[keep], self._end[keep])


class Coded(_Column):
    """A column of few distinct strings: a code per row into `names`."""

    __slots__ = ("codes", "names")

    def __init__(self, codes: np.ndarray, names: list):
        self.codes, self.names = codes, names

    def __len__(self) -> int:
        return len(self.codes)

    def _item(self, i):
        return self.names[self.codes[i]]

    def tolist(self) -> list:
        if not len(self.codes):
            return []
        return np.array(self.names, dtype=object)[self.codes].tolist()


    def take(self, keep) -> "Coded":
        return Coded(self.codes[keep], self.names)

    def factorize(self) -> tuple[np.ndarray, list]:
        """(codes, names) with names in first-seen order, as sacct._factorize gives for the plain list."""
        if not len(self.codes):
            return np.zeros(0, dtype=np.int32), []
        present, first = np.unique(self.codes, return_index=True)
        order = present[np.argsort(first, kind="stable")]
        remap = np.zeros(len(self.names), dtype=np.int32)
        remap[order] = np.arange(len(order), dtype=np.int32)
        return remap[self.codes], [self.names[c] for c in order.tolist()]
