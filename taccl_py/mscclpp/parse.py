"""Read an MSCCL++ execution plan (JSON) into an ``ExecutionPlan``, naming the field of any fault.

Fields are read as ``src/core/executor/execution_plan.cc`` reads them: the top-level fields
with the executor's defaults for the optional ones, each GPU at its own index, threadblocks at
their own index, op names from the executor's table. Beyond the types, every reference is
checked against what it names: a peer or rank must be another GPU of the plan; a threadblock's
channel ids must name the GPU's channels of that type (memory and port channels are numbered
over the peers of all ``connected_to`` lists, switch channels over all rank groups); an op's
``channel_ids`` must name the threadblock's channels of its type; a remote ``buffer_id`` must
name one of the threadblock's remote buffers for the op's channel type; chunk ranges must lie
inside the buffer (a remote buffer's size is that of its GPU); semaphore ids must exist; a
pipeline holds no pipeline. Each fault is one ``FormatError`` line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from taccl_py._io import read_text
from taccl_py.errors import FormatError
from taccl_py.mscclpp.plan import (
    MAX_MESSAGE_SIZE,
    MAX_THREADS_PER_BLOCK,
    BufferKind,
    BufferRef,
    Channel,
    ChannelKind,
    ExecutionPlan,
    Gpu,
    Operation,
    OpName,
    Protocol,
    RankGroup,
    RemoteBuffer,
    RemoteBufferRefs,
    Threadblock,
    ThreadblockChannels,
    ThreadblockGroup,
)
from taccl_py.mscclpp.references import check_references

__all__ = ["looks_like_mscclpp_plan", "parse_mscclpp_plan", "read_mscclpp_plan"]

logger = logging.getLogger(__name__)

# Largest integer a plan may hold: the executor reads sizes as uint64.
_MAX_INT = MAX_MESSAGE_SIZE
_BUFFERS = {kind.value: kind for kind in BufferKind}
_CHANNELS = {kind.value: kind for kind in ChannelKind}
_OPS = {name.value: name for name in OpName}
_PROTOCOLS = {protocol.value: protocol for protocol in Protocol}
# The collective names MSCCL++'s DSL writes (python/mscclpp/language/collectives.py, each
# class's ``self.name``); the executor takes any string, but no other name comes from a plan
# generator, so another is a typo rather than a plan (only the first four have a postcondition here).
_COLLECTIVES = {
    name: name for name in ("allgather", "allreduce", "alltoall", "reducescatter", "sendrecv", "custom", "test")
}
# Top-level fields only an MSCCL++ plan has (execution_plan.cc reads them; a taccl algorithm
# file has none and names its ``schema``), so a plan missing ``gpus`` is still told apart.
_PLAN_FIELDS = frozenset(
    {
        "gpus",
        "protocol",
        "inplace",
        "reuse_resources",
        "num_threads_per_block",
        "use_double_scratch_buffer",
        "buffer_alignment",
        "min_message_size",
        "max_message_size",
    }
)


def parse_mscclpp_plan(text: str, source: str = "<string>") -> ExecutionPlan:
    """Return the execution plan in ``text``; raise ``FormatError`` naming ``source`` and the field at fault.

    Examples
    --------
    >>> plan = parse_mscclpp_plan('{"name": "x", "collective": "allreduce", "protocol": "Simple",'
    ...     ' "inplace": true, "gpus": [{"id": 0, "input_chunks": 1, "output_chunks": 1,'
    ...     ' "scratch_chunks": 0, "threadblocks": [], "channels": []}]}')
    >>> plan.gpus[0].input_chunks
    1
    """
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        where = f"line {line}" if line is not None else None
        raise FormatError(
            source, where, f"not JSON ({getattr(exc, 'msg', exc)})", "an MSCCL++ execution plan"
        ) from None
    reader = _Reader(source)
    plan = reader.plan(document)
    check_references(plan, source)
    logger.debug("read MSCCL++ plan %s from %s: %d GPUs", plan.name, source, len(plan.gpus))
    return plan


def read_mscclpp_plan(path: str | Path) -> ExecutionPlan:
    """Return the execution plan in the file at ``path``; raise ``FormatError`` if unreadable or malformed."""
    return parse_mscclpp_plan(read_text(path), str(path))


class _Reader:
    """Typed field access that names the field's path in every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, fault: str, expected: str) -> FormatError:
        return FormatError(self.source, field, fault, expected)

    def get(self, obj: dict, key: str, field: str, default: Any = ...) -> Any:
        if key in obj:
            return obj[key]
        if default is ...:
            raise self.fail(f"{field}.{key}" if field else key, "missing field", "the field to be present")
        return default

    def object(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(field, f"{type(value).__name__} is not an object", "a JSON object")
        return value

    def array(self, value: Any, field: str) -> list:
        if not isinstance(value, list):
            raise self.fail(field, f"{type(value).__name__} is not an array", "a JSON array")
        return value

    def integer(self, value: Any, field: str, low: int = 0, high: int = _MAX_INT) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"{value!r} is not an integer", "an integer")
        if not low <= value <= high:
            raise self.fail(field, f"{value} out of range", f"an integer in {low}..{high}")
        return value

    def boolean(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(field, f"{value!r} is not a boolean", "true or false")
        return value

    def string(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"{value!r} is not a string", "a string")
        return value

    def choice(self, value: Any, field: str, table: dict) -> Any:
        if not isinstance(value, str) or value not in table:
            raise self.fail(field, f"unknown value {value!r}", "one of " + ", ".join(sorted(table)))
        return table[value]

    def integers(self, value: Any, field: str, high: int = _MAX_INT) -> tuple[int, ...]:
        items = self.array(value, field)
        return tuple(self.integer(item, f"{field}[{i}]", 0, high) for i, item in enumerate(items))

    def plan(self, document: Any) -> ExecutionPlan:
        top = self.object(document, "(top level)")
        if "gpus" not in top:
            raise self.fail("gpus", "missing", "a list of per-GPU programs")
        gpus_json = self.array(top["gpus"], "gpus")
        if not gpus_json:
            raise self.fail("gpus", "no GPUs", "at least one GPU")
        world = len(gpus_json)
        gpus = tuple(self.gpu(gpu, f"gpus[{i}]", i, world) for i, gpu in enumerate(gpus_json))
        min_size = self.integer(self.get(top, "min_message_size", "", 0), "min_message_size")
        max_size = self.integer(self.get(top, "max_message_size", "", MAX_MESSAGE_SIZE), "max_message_size")
        if min_size > max_size:
            # the executor selects a plan for min <= size <= max: such a plan is never run
            raise self.fail("min_message_size", f"{min_size} above max_message_size {max_size}", "at most the maximum")
        return ExecutionPlan(
            name=self.string(self.get(top, "name", ""), "name"),
            collective=self.choice(self.get(top, "collective", ""), "collective", _COLLECTIVES),
            protocol=self.choice(self.get(top, "protocol", ""), "protocol", _PROTOCOLS),
            inplace=self.boolean(self.get(top, "inplace", ""), "inplace"),
            gpus=gpus,
            reuse_resources=self.boolean(self.get(top, "reuse_resources", "", False), "reuse_resources"),
            num_threads_per_block=self.integer(
                self.get(top, "num_threads_per_block", "", MAX_THREADS_PER_BLOCK),
                "num_threads_per_block",
                1,
                MAX_THREADS_PER_BLOCK,
            ),
            use_double_scratch_buffer=self.boolean(
                self.get(top, "use_double_scratch_buffer", "", False), "use_double_scratch_buffer"
            ),
            buffer_alignment=self.integer(self.get(top, "buffer_alignment", "", 16), "buffer_alignment", 1),
            min_message_size=min_size,
            max_message_size=max_size,
        )

    def gpu(self, value: Any, field: str, index: int, world: int) -> Gpu:
        obj = self.object(value, field)
        gpu_id = self.integer(self.get(obj, "id", field), f"{field}.id", 0, world - 1)
        if gpu_id != index:
            raise self.fail(f"{field}.id", f"id {gpu_id} at position {index}", "GPUs listed in id order from 0")
        channels = tuple(
            self.channel(c, f"{field}.channels[{i}]", world)
            for i, c in enumerate(self.array(self.get(obj, "channels", field), f"{field}.channels"))
        )
        remote = tuple(
            self.remote_buffer(b, f"{field}.remote_buffers[{i}]", world)
            for i, b in enumerate(self.array(self.get(obj, "remote_buffers", field, []), f"{field}.remote_buffers"))
        )
        semaphores = tuple(
            self.integer(
                self.get(self.object(s, f"{field}.semaphores[{i}]"), "init_value", f"{field}.semaphores[{i}]"),
                f"{field}.semaphores[{i}].init_value",
            )
            for i, s in enumerate(self.array(self.get(obj, "semaphores", field, []), f"{field}.semaphores"))
        )
        tbs_json = self.array(self.get(obj, "threadblocks", field), f"{field}.threadblocks")
        return Gpu(
            id=gpu_id,
            input_chunks=self.integer(self.get(obj, "input_chunks", field), f"{field}.input_chunks"),
            output_chunks=self.integer(self.get(obj, "output_chunks", field), f"{field}.output_chunks"),
            scratch_chunks=self.integer(self.get(obj, "scratch_chunks", field), f"{field}.scratch_chunks"),
            threadblocks=tuple(self.threadblock(tb, f"{field}.threadblocks[{i}]", i) for i, tb in enumerate(tbs_json)),
            channels=channels,
            remote_buffers=remote,
            semaphores=semaphores,
        )

    def channel(self, value: Any, field: str, world: int) -> Channel:
        obj = self.object(value, field)
        kind = self.choice(self.get(obj, "channel_type", field), f"{field}.channel_type", _CHANNELS)
        if kind is ChannelKind.SWITCH:
            # The DSL writes "buffer_type"; older plans (allreduce_pipeline.json) wrote "buff".
            key = "buffer_type" if "buffer_type" in obj else "buff"
            groups = []
            for i, group in enumerate(self.array(self.get(obj, "rank_groups", field), f"{field}.rank_groups")):
                where = f"{field}.rank_groups[{i}]"
                group = self.object(group, where)
                ranks = self.integers(self.get(group, "ranks", where), f"{where}.ranks", world - 1)
                size = self.integer(self.get(group, "size", where), f"{where}.size", 1)
                groups.append(RankGroup(size, ranks))
            buffer = self.choice(self.get(obj, key, field), f"{field}.{key}", _BUFFERS)
            return Channel(kind, buffer=buffer, rank_groups=tuple(groups))
        peers = self.integers(self.get(obj, "connected_to", field), f"{field}.connected_to", world - 1)
        return Channel(kind, connected_to=peers)

    def remote_buffer(self, value: Any, field: str, world: int) -> RemoteBuffer:
        obj = self.object(value, field)
        access = self.array(self.get(obj, "access_channel_types", field), f"{field}.access_channel_types")
        return RemoteBuffer(
            rank=self.integer(self.get(obj, "rank", field), f"{field}.rank", 0, world - 1),
            buffer=self.choice(self.get(obj, "type", field), f"{field}.type", _BUFFERS),
            access_channel_types=tuple(
                self.choice(c, f"{field}.access_channel_types[{i}]", _CHANNELS) for i, c in enumerate(access)
            ),
        )

    def threadblock(self, value: Any, field: str, index: int) -> Threadblock:
        obj = self.object(value, field)
        tb_id = self.integer(self.get(obj, "id", field), f"{field}.id")
        if tb_id != index:
            raise self.fail(f"{field}.id", f"id {tb_id} at position {index}", "threadblocks listed in id order from 0")
        channels = []
        for i, entry in enumerate(self.array(self.get(obj, "channels", field, []), f"{field}.channels")):
            where = f"{field}.channels[{i}]"
            entry = self.object(entry, where)
            buffer = self.choice(entry["buff"], f"{where}.buff", _BUFFERS) if "buff" in entry else None
            channels.append(
                ThreadblockChannels(
                    self.choice(self.get(entry, "channel_type", where), f"{where}.channel_type", _CHANNELS),
                    self.integers(self.get(entry, "channel_ids", where), f"{where}.channel_ids"),
                    buffer,
                )
            )
        refs = []
        for i, entry in enumerate(
            self.array(self.get(obj, "remote_buffer_refs", field, []), f"{field}.remote_buffer_refs")
        ):
            where = f"{field}.remote_buffer_refs[{i}]"
            entry = self.object(entry, where)
            refs.append(
                RemoteBufferRefs(
                    self.choice(
                        self.get(entry, "access_channel_type", where), f"{where}.access_channel_type", _CHANNELS
                    ),
                    self.integers(self.get(entry, "remote_buffer_ids", where), f"{where}.remote_buffer_ids"),
                )
            )
        ops_json = self.array(self.get(obj, "ops", field), f"{field}.ops")
        ops = tuple(self.operation(op, f"{field}.ops[{i}]", nested=False) for i, op in enumerate(ops_json))
        return Threadblock(tb_id, ops, tuple(channels), tuple(refs))

    def operation(self, value: Any, field: str, nested: bool) -> Operation:
        obj = self.object(value, field)
        name = self.choice(self.get(obj, "name", field), f"{field}.name", _OPS)
        fields: dict[str, Any] = {"name": name}
        if "src_buff" in obj:
            fields["src"] = self.refs(obj["src_buff"], f"{field}.src_buff")
        if "dst_buff" in obj:
            fields["dst"] = self.refs(obj["dst_buff"], f"{field}.dst_buff")
        if "channel_type" in obj:
            fields["channel_type"] = self.choice(obj["channel_type"], f"{field}.channel_type", _CHANNELS)
        if "channel_ids" in obj:
            fields["channel_ids"] = self.integers(obj["channel_ids"], f"{field}.channel_ids")
        if "reduce_op" in obj:
            fields["reduce_op"] = self.string(obj["reduce_op"], f"{field}.reduce_op")
        if "tbg_info" in obj:
            tbg = self.object(obj["tbg_info"], f"{field}.tbg_info")
            size = self.integer(self.get(tbg, "tbg_size", f"{field}.tbg_info"), f"{field}.tbg_info.tbg_size", 1)
            part = self.integer(self.get(tbg, "tb_id", f"{field}.tbg_info"), f"{field}.tbg_info.tb_id", 0, size - 1)
            fields["tbg"] = ThreadblockGroup(part, size)
        for key in ("barrier_id", "num_threadblocks"):
            if key in obj:
                fields[key] = self.integer(obj[key], f"{field}.{key}")
        if "semaphore_ids" in obj:
            fields["semaphore_ids"] = self.integers(obj["semaphore_ids"], f"{field}.semaphore_ids")
        if name is OpName.PIPELINE:
            if nested:
                raise self.fail(f"{field}.name", "a pipeline inside a pipeline", "data and sync ops in a pipeline")
            context = self.object(self.get(obj, "iter_context", field), f"{field}.iter_context")
            where = f"{field}.iter_context"
            fields["unit_size"] = self.integer(self.get(context, "unit_size", where), f"{where}.unit_size", 1)
            fields["num_chunks"] = self.integer(self.get(context, "num_chunks", where), f"{where}.num_chunks", 1)
            body = self.array(self.get(obj, "ops", field), f"{field}.ops")
            fields["ops"] = tuple(self.operation(op, f"{field}.ops[{i}]", nested=True) for i, op in enumerate(body))
        _check_operands(self, fields, field)
        return Operation(**fields)

    def refs(self, value: Any, field: str) -> tuple[BufferRef, ...]:
        refs = []
        for i, item in enumerate(self.array(value, field)):
            where = f"{field}[{i}]"
            obj = self.object(item, where)
            index = self.integer(self.get(obj, "index", where), f"{where}.index")
            size = self.integer(self.get(obj, "size", where), f"{where}.size", 1)
            if "buffer_id" in obj:
                refs.append(BufferRef(index, size, buffer_id=self.integer(obj["buffer_id"], f"{where}.buffer_id")))
            elif "switch_channel_id" in obj:
                channel = self.integer(obj["switch_channel_id"], f"{where}.switch_channel_id")
                refs.append(BufferRef(index, size, switch_channel_id=channel))
            else:
                buffer = self.choice(self.get(obj, "type", where), f"{where}.type", _BUFFERS)
                refs.append(BufferRef(index, size, buffer=buffer))
        return tuple(refs)


# Per op: the kinds of its source and destination operands ("L" local, "R" remote, "S" switch),
# as fixed heads then a repeatable tail with its least count; from the handlers in
# src/core/include/execution_kernel.hpp, which index operands by these positions.
_SHAPES: dict[OpName, tuple[tuple[str, str, int], tuple[str, str, int]]] = {
    OpName.COPY: (("L", "", 0), ("L", "", 0)),
    OpName.COPY_PACKETS: (("L", "", 0), ("L", "", 0)),
    OpName.UNPACK_PACKETS: (("L", "", 0), ("L", "", 0)),
    OpName.GET: (("", "R", 1), ("", "L", 1)),
    OpName.PUT: (("", "L", 1), ("", "R", 1)),
    OpName.PUT_WITH_SIGNAL: (("", "L", 1), ("", "R", 1)),
    OpName.PUT_WITH_SIGNAL_AND_FLUSH: (("", "L", 1), ("", "R", 1)),
    OpName.PUT_PACKETS: (("", "L", 1), ("", "R", 1)),
    OpName.READ_PUT_PACKETS: (("L", "", 0), ("", "R", 1)),
    OpName.REDUCE: (("L", "L", 1), ("L", "", 0)),
    OpName.READ_REDUCE: (("L", "R", 1), ("L", "", 0)),
    OpName.REDUCE_SEND: (("L", "L", 0), ("L", "R", 1)),
    OpName.READ_REDUCE_SEND: (("L", "R", 1), ("L", "R", 1)),
    OpName.REDUCE_PACKETS: (("L", "L", 1), ("L", "", 0)),
    OpName.REDUCE_COPY_PACKETS: (("L", "L", 1), ("LL", "", 0)),
    OpName.REDUCE_SEND_PACKETS: (("L", "L", 0), ("L", "R", 1)),
    OpName.REDUCE_COPY_SEND_PACKETS: (("L", "L", 0), ("LL", "R", 1)),
    OpName.MULTI_LOAD_REDUCE_STORE: (("", "S", 1), ("", "S", 1)),
    OpName.MULTI_STORE: (("L", "", 0), ("S", "", 0)),
    OpName.MULTI_STORE_PACKETS: (("L", "", 0), ("S", "", 0)),
}
_SYNC_FIELDS: dict[OpName, tuple[str, ...]] = {
    OpName.SIGNAL: ("channel_type", "channel_ids"),
    OpName.WAIT: ("channel_type", "channel_ids"),
    OpName.RELAXED_SIGNAL: ("channel_type", "channel_ids"),
    OpName.RELAXED_WAIT: ("channel_type", "channel_ids"),
    OpName.FLUSH: ("channel_type", "channel_ids"),
    OpName.BARRIER: ("barrier_id", "num_threadblocks"),
    OpName.SEM_ACQUIRE: ("semaphore_ids",),
    OpName.SEM_RELEASE: ("semaphore_ids",),
}


def _ref_kind(ref: BufferRef) -> str:
    return "R" if ref.buffer_id is not None else "S" if ref.switch_channel_id is not None else "L"


def _check_operands(reader: _Reader, fields: dict[str, Any], field: str) -> None:
    """Raise ``FormatError`` unless the op has the fields and operand kinds its handler reads."""
    name = fields["name"]
    for key in _SYNC_FIELDS.get(name, ()):
        if key not in fields:
            raise reader.fail(f"{field}.{key}", f"missing field for {name.value}", "the field to be present")
    if name not in _SHAPES:
        return
    for side, key, (head, tail, least) in zip(("src", "dst"), ("src_buff", "dst_buff"), _SHAPES[name]):
        refs = fields.get(side)
        if refs is None:
            raise reader.fail(f"{field}.{key}", f"missing field for {name.value}", "the field to be present")
        kinds = "".join(_ref_kind(ref) for ref in refs)
        rest = kinds[len(head) :]
        if not kinds.startswith(head) or len(rest) < least or (rest and (not tail or rest.strip(tail))):
            shape = head + (f" then {least}+ {tail}" if tail else "")
            raise reader.fail(
                f"{field}.{key}",
                f"operands {kinds or 'none'} for {name.value}",
                f"{shape} (L local, R remote, S switch)",
            )
    if any(_ref_kind(ref) != "L" for ref in fields["src"] + fields["dst"]) and "channel_type" not in fields:
        raise reader.fail(f"{field}.channel_type", f"missing field for {name.value}", "the field to be present")


def looks_like_mscclpp_plan(text: str) -> bool:
    """Return True when ``text`` is a JSON object shaped as an MSCCL++ execution plan, complete or not.

    That is: neither ``schema`` nor ``ranks`` (our algorithm files hold both) and a field a plan
    has (``gpus``, ``protocol``, ``inplace``, ...), so a plan missing a field is refused as a plan.
    """
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return False
    if not isinstance(data, dict) or "schema" in data or "ranks" in data:
        return False
    return not _PLAN_FIELDS.isdisjoint(data)
