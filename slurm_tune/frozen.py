"""Read-only data for the hot paths: attribute access to validated plain data (profiles), without the schema,
and small read-only records (cheaper to define than a namedtuple)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own flag costs importing typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:  # for annotations only
    from typing import Self


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class Frozen:
    """Read-only attribute view over validated plain data. Nested mappings come back as Frozen too."""

    __slots__ = ("_data",)

    def __init__(self, data: dict):
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        if isinstance(value, dict):
            return Frozen(value)
        if isinstance(value, list):
            return tuple(Frozen(v) if isinstance(v, dict) else v for v in value)
        return value

    def __setattr__(self, name, value):
        raise AttributeError("profiles are read-only")

    def __getitem__(self, name):
        return self.__getattr__(name)

    def __contains__(self, name):
        return name in self._data

    def __iter__(self):
        return iter(self._data)

    def __eq__(self, other):
        return isinstance(other, Frozen) and self._data == other._data

    def __hash__(self):
        return hash(repr(self._data))

    def get(self, name, default=None):
        return self.__getattr__(name) if name in self._data else default

    def to_dict(self) -> dict:
        return _copy(self._data)

    def __repr__(self):
        return f"Frozen({self._data!r})"


class Record:
    """A small read-only record built from positional values, its fields named by the subclass's __slots__.
    It behaves as a namedtuple does (unpacking, indexing, equality with a plain tuple, hashing, ordering,
    `_replace`, `_asdict`) but is cheaper to define: `collections` costs ~0.2x of a bare interpreter start
    on the hot paths (docs/speed.md). Subclasses annotate their slots at class level, for mypy: bare
    annotations make no class attributes, so they sit beside __slots__ at no cost."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *values, **named):
        if len(values) > len(self.__slots__):
            raise TypeError(f"{type(self).__name__} takes {len(self.__slots__)} values, got {len(values)}")
        for name, value in zip(self.__slots__, values):
            object.__setattr__(self, name, value)
        for name in self.__slots__[len(values) :]:
            try:
                object.__setattr__(self, name, named.pop(name))
            except KeyError:
                raise TypeError(f"{type(self).__name__}: missing {name!r}") from None
        if named:
            raise TypeError(f"{type(self).__name__}: unexpected {sorted(named)}")

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def _values(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def _replace(self, **changes) -> Self:
        return type(self)(*(changes.get(n, getattr(self, n)) for n in self.__slots__))

    def _asdict(self) -> dict:
        return {n: getattr(self, n) for n in self.__slots__}

    def __iter__(self):
        return iter(self._values())

    def __len__(self):
        return len(self.__slots__)

    def __getitem__(self, index):
        return self._values()[index]

    def __eq__(self, other):
        if type(other) is type(self) or type(other) is tuple:
            return self._values() == tuple(other)
        return NotImplemented

    def __hash__(self):
        return hash(self._values())

    def __lt__(self, other):
        return self._values() < tuple(other)

    def __repr__(self):
        return (
            f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"
        )
