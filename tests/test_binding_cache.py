"""Executor bindings are reused while the caller holds its tensors and never keep them alive after."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="bindings are of torch tensors")


def test_a_binding_lives_as_long_as_the_callers_tensor_and_no_longer() -> None:
    from taccl_py.runtime.executor.binding_cache import BindingCache, unowned_alias

    cache = BindingCache(limit=2)
    tensor = torch.randn(64)
    storage = weakref.ref(tensor.untyped_storage())
    value = {"alias": unowned_alias(tensor)}
    cache.put((tensor.data_ptr(),), (tensor,), value)
    assert cache.get((tensor.data_ptr(),)) is value and value["alias"]._base is None
    del value, tensor
    gc.collect()
    assert len(cache) == 0 and storage() is None


def test_a_view_keeps_its_binding_while_its_base_lives_and_the_least_recent_entry_goes_first() -> None:
    from taccl_py.runtime.executor.binding_cache import BindingCache

    cache = BindingCache(limit=2)
    base = torch.zeros(100)
    cache.put((1,), (base[10:20],), "view of base")  # the view object dies at once; its base does not
    gc.collect()
    assert cache.get((1,)) == "view of base"
    others = [torch.zeros(1), torch.zeros(1)]
    cache.put((2,), (others[0],), "two")
    cache.get((1,))  # used: now the most recent
    cache.put((3,), (others[1],), "three")
    assert [cache.get((k,)) for k in (1, 2, 3)] == ["view of base", None, "three"]
    del base
    gc.collect()
    assert cache.get((1,)) is None and len(cache) == 1
