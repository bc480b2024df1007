"""A small, declarative schema for stune's YAML config files.

ReFrame-style: validate at load time and point at the bad key with file:line. The loaded value is plain data
(dicts, lists, scalars) so it can be cached with `marshal`; `Frozen` gives read-only attribute access.
Hot path: see docs/speed.md.
"""

from __future__ import annotations

from .durations import DurationError
from .durations import parse as parse_duration
from .errors import ConfigError
from .frozen import _copy

REQUIRED = object()
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


class Where:
    """Where a value came from: the file, and a map from key path to line, filled while validating."""

    def __init__(self, path: str):
        self.path = path
        self.lines: dict[str, int] = {}

    def error(self, key: str, problem: str, line: int | None = None) -> ConfigError:
        if line is None:
            line = self.lines.get(key) or self._nearest_line(key)
        return ConfigError(self.path, line, key, problem)

    def _nearest_line(self, key: str) -> int | None:
        """A missing key has no line of its own: point at its enclosing section (or the file's start)."""
        while "." in key:
            key = key.rsplit(".", 1)[0]
            if key in self.lines:
                return self.lines[key]
        return self.lines.get("")


def _type_name(value) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "empty",
    }.get(type(value), type(value).__name__)


class Spec:
    """One node of a schema. `check` turns a raw YAML value into the stored value, or raises ConfigError."""

    def __init__(self, default=REQUIRED, doc: str = ""):
        self.default, self.doc = default, doc

    def check(self, value, key: str, where: Where):
        raise NotImplementedError

    def complete(self, value, key: str, where: Where):
        """Fill defaults below this node (only sections have any)."""
        return value


class Str(Spec):
    def __init__(
        self,
        default=REQUIRED,
        choices: tuple[str, ...] | None = None,
        doc: str = "",
        prefix: str | None = None,
        absolute_path: bool = False,
        nonempty: bool = True,
    ):
        super().__init__(default, doc)
        self.choices, self.prefix, self.absolute_path, self.nonempty = (
            choices,
            prefix,
            absolute_path,
            nonempty,
        )

    def check(self, value, key, where):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not self.choices:
            value = str(value)  # a version like 535.104 parses as a float
        if not isinstance(value, str):
            raise where.error(key, f"expected a string, got {_type_name(value)}")
        if self.nonempty and not value.strip():
            raise where.error(key, "must not be empty")
        if self.choices and value not in self.choices:
            raise where.error(key, f"{value!r} is not one of: {', '.join(self.choices)}")
        if self.prefix and not value.startswith(self.prefix):
            raise where.error(key, f"{value!r} must start with {self.prefix!r}")
        if self.absolute_path and not value.startswith("/"):
            raise where.error(key, f"{value!r} must be an absolute path")
        return value


class Int(Spec):
    def __init__(self, default=REQUIRED, min: float | None = None, max: float | None = None, doc: str = ""):
        super().__init__(default, doc)
        self.min, self.max = min, max

    def check(self, value, key, where):
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(key, f"expected an integer, got {_type_name(value)} {value!r}")
        if self.min is not None and value < self.min:
            raise where.error(key, f"{value} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise where.error(key, f"{value} is above the maximum {self.max}")
        return value


class Float(Int):
    def check(self, value, key, where):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise where.error(key, f"expected a number, got {_type_name(value)} {value!r}")
        value = float(value)
        if self.min is not None and value < self.min:
            raise where.error(key, f"{value:g} is below the minimum {self.min:g}")
        if self.max is not None and value > self.max:
            raise where.error(key, f"{value:g} is above the maximum {self.max:g}")
        return value


class Bool(Spec):
    def check(self, value, key, where):
        if not isinstance(value, bool):
            raise where.error(key, f"expected true or false, got {_type_name(value)} {value!r}")
        return value


class Size(Spec):
    """A byte size: an integer, or a number with K/M/G/T/P (binary units), e.g. 800G or 1.5T."""

    def check(self, value, key, where):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        text = (
            str(value).strip().upper().removesuffix("B").removesuffix("I") if isinstance(value, str) else ""
        )
        unit = text[-1:] if text[-1:] in _UNITS else ""
        try:
            number = float(text[:-1] if unit else text)
        except ValueError:
            raise where.error(key, f"{value!r} is not a size (e.g. 500G, 1.5T, or bytes)") from None
        if number < 0 or number != number:
            raise where.error(key, f"{value!r} must be a positive size")
        return int(number * _UNITS[unit])


class Duration(Spec):
    """Seconds, by durations' rules: 300, 90s, 10m, 1.5h, 7d, 2w, 1d12h or Slurm's 7-00:00:00."""

    def check(self, value, key, where):
        try:
            return parse_duration(value)
        except DurationError as exc:
            raise where.error(key, str(exc)) from None


class Nullable(Spec):
    """`inner`, or null (an explicit `~` switches a site default off)."""

    def __init__(self, inner: Spec, default=None, doc: str = ""):
        super().__init__(default, doc or inner.doc)
        self.inner = inner

    def check(self, value, key, where):
        return None if value is None else self.inner.check(value, key, where)

    def complete(self, value, key, where):
        return None if value is None else self.inner.complete(value, key, where)


class List(Spec):
    def __init__(self, item: Spec, default=(), min_items: int = 0, doc: str = "", unique: bool = False):
        super().__init__(list(default) if default is not REQUIRED else REQUIRED, doc)
        self.item, self.min_items, self.unique = item, min_items, unique

    def check(self, value, key, where):
        if not isinstance(value, list):
            raise where.error(key, f"expected a list, got {_type_name(value)}")
        if len(value) < self.min_items:
            raise where.error(key, f"needs at least {self.min_items} item(s)")
        out = [self.item.check(v, f"{key}[{i}]", where) for i, v in enumerate(value)]
        if self.unique:
            seen = set()
            for i, v in enumerate(out):
                marker = repr(v)
                if marker in seen:
                    raise where.error(f"{key}[{i}]", f"duplicate entry {v!r}")
                seen.add(marker)
        return out

    def complete(self, value, key, where):
        return [self.item.complete(v, f"{key}[{i}]", where) for i, v in enumerate(value)]


class Map(Spec):
    """A mapping with free keys (checked by `key_spec`) and values of one spec."""

    def __init__(self, value: Spec, key_spec: Str | None = None, default=None, doc: str = ""):
        super().__init__({} if default is None else default, doc)
        self.value, self.key_spec = value, key_spec or Str()

    def check(self, value, key, where):
        if not isinstance(value, dict):
            raise where.error(key, f"expected a mapping, got {_type_name(value)}")
        return {
            k: self.value.check(v, f"{key}.{k}", where)
            for k, v in ((self.key_spec.check(k, f"{key}.{k}", where), v) for k, v in value.items())
        }

    def complete(self, value, key, where):
        return {k: self.value.complete(v, f"{key}.{k}", where) for k, v in value.items()}


class Section(Spec):
    """A mapping with fixed keys. Unknown keys are errors; missing keys take their defaults."""

    def __init__(self, fields: dict[str, Spec], default=None, doc: str = ""):
        super().__init__({} if default is None else default, doc)
        self.fields = fields

    def check(self, value, key, where):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise where.error(key, f"expected a mapping, got {_type_name(value)}")
        out = {}
        for name, raw in value.items():
            sub = f"{key}.{name}" if key else str(name)
            spec = self.fields.get(name)
            if spec is None:
                close = _closest(str(name), self.fields)
                hint = f" (did you mean {close!r}?)" if close else f" (known: {', '.join(self.fields)})"
                raise where.error(sub, f"unknown key{hint}")
            out[name] = spec.check(raw, sub, where)
        return out

    def complete(self, value, key, where):
        out = {}
        for name, spec in self.fields.items():
            sub = f"{key}.{name}" if key else name
            if name in value:
                out[name] = spec.complete(value[name], sub, where)
            elif spec.default is REQUIRED:
                raise where.error(sub, "is required")
            else:
                default = spec.default
                out[name] = (
                    spec.complete(_copy(default), sub, where)
                    if isinstance(spec, (Section, Nullable)) and default is not None
                    else _copy(default)
                )
        return out


def _closest(name: str, candidates) -> str | None:
    """The candidate one edit or transposition away, for a 'did you mean' hint (difflib is too slow here)."""
    best, best_d = None, 3
    for cand in candidates:
        d = _distance(name, cand)
        if d < best_d:
            best, best_d = cand, d
    return best


def _distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def deep_merge(base: dict, override: dict) -> dict:
    """`override` wins; sections merge key by key; lists and scalars are replaced whole."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


# ---- YAML with line numbers -------------------------------------------------------------------------------


def _import_yaml():
    """PyYAML. The prolog starts Python without `site` (-I -S; hot path: see docs/speed.md), so on a profile
    cache miss the installation's site-packages may not be on the path yet: add it then, once."""
    try:
        import yaml
    except ImportError:
        import sys

        if not sys.flags.no_site:
            raise
        import site

        site.main()
        import yaml
    return yaml


def load_yaml(path: str, text: str | None = None) -> tuple[object, Where]:
    """Parse YAML into plain data, recording each key path's line. Syntax errors become ConfigError."""
    yaml = _import_yaml()  # a cache miss only; hot path: see docs/speed.md

    where = Where(path)
    try:
        if text is None:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, "", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        loader = loader_cls(text)
        try:
            node = loader.get_single_node()
            data = _construct(loader, node, "", where)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(path, line, "", f"invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, "", f"invalid YAML: {exc}") from None
    return data, where


def _construct(loader, node, key: str, where: Where):
    yaml = _import_yaml()

    if node is None:
        return None
    where.lines.setdefault(key, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, object] = {}
        loader.flatten_mapping(node)
        for key_node, value_node in node.value:
            name = loader.construct_object(key_node, deep=True)
            if not isinstance(name, (str, int, float, bool)) or isinstance(name, bool):
                raise ConfigError(where.path, key_node.start_mark.line + 1, key, f"bad key {name!r}")
            name = str(name)
            sub = f"{key}.{name}" if key else name
            if name in out:
                raise ConfigError(where.path, key_node.start_mark.line + 1, sub, "duplicate key")
            where.lines[sub] = key_node.start_mark.line + 1
            out[name] = _construct(loader, value_node, sub, where)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            sub = f"{key}[{i}]"
            where.lines[sub] = item.start_mark.line + 1
            items.append(_construct(loader, item, sub, where))
        return items
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise ConfigError(where.path, node.start_mark.line + 1, key, f"bad value: {exc}") from None
