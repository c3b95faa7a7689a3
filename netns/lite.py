"""Import-light stand-ins for `typing.NamedTuple` and `enum.StrEnum`, for the CNI plugin's start-up path.

The runtime starts a fresh interpreter for every CNI call, so what the plugin imports is paid on every pod
start: on these machines `typing` costs ~19 ms, `enum` ~8 ms and `json` (through `re`) ~15 ms of a 50 ms budget.
The modules on that path declare their records and choices like this::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from enum import StrEnum as StrChoice
        from typing import NamedTuple as Record
    else:
        from aether.netns.lite import Record, StrChoice

mypy treats a name `TYPE_CHECKING` as true, so it checks them as the real `NamedTuple` / `StrEnum`; at run time
these classes provide the part of those two APIs the code uses (tests/netns/test_netns_lite.py pins the
equivalence, and tests/netns/test_netns_import_budget.py pins what the plugin imports).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, ClassVar, Self


class Record(tuple):  # type: ignore[type-arg]  # a tuple of fields, like typing.NamedTuple
    """Subclass with annotated fields (optionally with defaults); instances are immutable tuples."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _field_defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063  (own fields only; `inspect` is not cheap)
        fields = tuple(name for name in own if not name.startswith("_"))
        defaults: dict[str, Any] = {}
        for index, name in enumerate(fields):
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
            elif defaults:
                raise TypeError(f"{cls.__name__}: field {name!r} without a default follows one with a default")
            setattr(cls, name, property(_getter(index), doc=f"Alias for field number {index}"))
        cls._fields = fields
        cls._field_defaults = defaults

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__} takes {len(fields)} fields, {len(args)} given")
        values = list(args)
        for name in fields[len(args) :]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                raise TypeError(f"{cls.__name__} is missing the field {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__} got unexpected or repeated fields {sorted(kwargs)}")
        return tuple.__new__(cls, values)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({inner})"

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    def _replace(self, **changes: Any) -> Self:
        values = [changes.pop(name, value) for name, value in zip(self._fields, self, strict=True)]
        if changes:
            raise ValueError(f"{type(self).__name__} has no fields {sorted(changes)}")
        return type(self)(*values)

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))


def _getter(index: int) -> Any:
    def get(self: tuple[Any, ...]) -> Any:
        return tuple.__getitem__(self, index)

    return get


class _ChoiceType(type):
    _members: dict[str, Any]
    _names: dict[str, str]

    def __iter__(cls) -> Iterator[Any]:
        return iter(cls._members.values())

    def __len__(cls) -> int:
        return len(cls._members)

    def __contains__(cls, value: object) -> bool:
        return isinstance(value, cls) or (isinstance(value, str) and value in cls._members)


class StrChoice(str, metaclass=_ChoiceType):
    """Subclass with UPPER_CASE str attributes; each becomes the one instance for its value, like StrEnum."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        members: dict[str, StrChoice] = {}
        names: dict[str, str] = {}
        for name, value in list(cls.__dict__.items()):
            if name.isupper() and isinstance(value, str):
                if value in members:
                    raise TypeError(f"{cls.__name__}: {name} repeats the value {value!r}")
                member = str.__new__(cls, value)
                members[value] = member
                names[value] = name
                setattr(cls, name, member)
        cls._members = members
        cls._names = names

    def __new__(cls, value: str) -> Self:
        try:
            return cls._members[value]  # type: ignore[no-any-return]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid {cls.__name__}") from None

    def __getnewargs__(self) -> tuple[str]:
        return (str(self),)

    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {str.__repr__(self)}>"

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def name(self) -> str:
        return type(self)._names[str.__str__(self)]
