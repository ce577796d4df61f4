"""Bindings kept per pair of user tensors without keeping the tensors: freed memory stays freed.

An executor slices the caller's tensors into the views its plan runs on (its index-space binding,
made once per aliasing form, says where) and reuses those views while the caller passes the same
memory again (a DDP bucket, a persistent buffer). A cached view of the caller's memory would keep
that memory alive after the caller dropped its tensor (FSDP2 frees unsharded parameters between
uses), so the views are sliced from aliases (:func:`unowned_alias`) that share the storage but not the caller's tensor,
and a :class:`BindingCache` entry ends when the caller's tensor (its view base, where it is a view)
is garbage: a ``weakref.finalize`` on it drops the entry and with it the last reference to the storage.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BindingCache", "unowned_alias", "owner_of"]


def unowned_alias(tensor: Any) -> Any:
    """Return a tensor on ``tensor``'s memory that holds its storage but not ``tensor`` (no view base)."""
    return tensor.new_empty(0).set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


def owner_of(tensor: Any) -> Any:
    """Return the tensor whose life decides whether ``tensor``'s memory is still the caller's: its view base."""
    base = tensor._base
    return tensor if base is None else base


@dataclass(eq=False)  # entries are found by identity; their values hold tensors
class _Entry:
    key: tuple[int, ...]
    value: Any
    finalizers: tuple[weakref.finalize, ...]

    def release(self) -> None:
        for finalizer in self.finalizers:
            finalizer.detach()


class BindingCache:
    """The last ``limit`` values made for tensor pairs, each dropped once a tensor's owner is garbage.

    ``key`` is what identifies the memory (data pointers); ``tensors`` are the caller's tensors
    whose owners (see :func:`owner_of`) must stay alive for the value to be reused. A value must
    not hold the tensors themselves, only :func:`unowned_alias` es of them.
    """

    __slots__ = ("_limit", "_entries", "__weakref__")

    def __init__(self, limit: int = 2) -> None:
        self._limit = limit
        self._entries: list[_Entry] = []  # most recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[int, ...]) -> Any | None:
        """Return the value cached for ``key`` (moved to the front), or None."""
        for position, entry in enumerate(self._entries):
            if entry.key == key:
                if position:
                    self._entries.insert(0, self._entries.pop(position))
                return entry.value
        return None

    def put(self, key: tuple[int, ...], tensors: tuple[Any, ...], value: Any) -> None:
        """Cache ``value`` for ``key`` while every tensor's owner lives; drop the least recently used past the limit."""
        cache = weakref.ref(self)
        owners = {id(owner): owner for owner in map(owner_of, tensors)}
        entry = _Entry(key, value, ())
        # the finalizers hold the entry weakly: an entry the cache dropped must not outlive it there
        entry.finalizers = tuple(
            weakref.finalize(owner, _forget, cache, weakref.ref(entry)) for owner in owners.values()
        )
        for finalizer in entry.finalizers:
            finalizer.atexit = False  # at exit the cache goes too: nothing to forget
        self._entries.insert(0, entry)
        while len(self._entries) > self._limit:
            self._entries.pop().release()

    def clear(self) -> None:
        """Drop every entry."""
        for entry in self._entries:
            entry.release()
        self._entries.clear()

    def _remove(self, entry: _Entry) -> None:
        if entry in self._entries:
            self._entries.remove(entry)
        entry.release()


def _forget(cache: Callable[[], BindingCache | None], entry: Callable[[], _Entry | None]) -> None:
    """Drop ``entry`` from the cache (if both still exist): one of its tensors' owners is garbage."""
    found, dropped = cache(), entry()
    if found is not None and dropped is not None:
        found._remove(dropped)
