"""Read-only records with named fields: :class:`FrozenRecord`, the base of the package's records.

Every new worker (a new interpreter, in the spawn servers) defines each record on its import path before it
serves its first connection. A ``typing.NamedTuple`` or a data class generates its class at definition, which
costs many times what defining a plain class with ``__slots__`` does (see docs/restarts.md); a record here is
such a class, with what the package uses of a NamedTuple.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["FrozenRecord"]

R = TypeVar("R", bound="FrozenRecord")


class FrozenRecord:
    """A read-only record: its fields, named in order by ``_fields``, are its ``__slots__``, set once by its
    ``__init__`` (with :meth:`_set`, in that order). Equal to a record of the same class with equal fields,
    hashed by them, shown by them, pickled and copied as its fields; :meth:`_replace` and :meth:`_asdict` as on a
    NamedTuple.

    Example::

        class Point(FrozenRecord):
            _fields = ("x", "y")
            __slots__ = _fields
            x: int
            y: int

            def __init__(self, x: int, y: int = 0) -> None:
                self._set(x, y)

        Point(1)._replace(y=2) == Point(1, 2)  # True
    """

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    """The names of the fields, in order: the order of ``__init__``'s parameters."""

    def _set(self, *values: Any) -> None:
        """Set the fields to ``values``, in the order of ``_fields`` (from ``__init__`` only)."""
        for name, value in zip(self._fields, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def _replace(self: R, **changes: Any) -> R:
        """A record of the same class with the fields ``changes`` names changed."""
        fields = self._asdict()
        fields.update(changes)
        return type(self)(**fields)

    def _asdict(self) -> dict[str, Any]:
        """The fields by name (records among them left as they are)."""
        return {name: getattr(self, name) for name in self._fields}

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only: use _replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, FrozenRecord)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, *self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._values()
