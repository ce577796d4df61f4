"""A lane's MSCCL++ operations: each step's ops, the ``nop``s the executor needs, and the cut into threadblocks.

The executor runs at most ``MAX_OPERATION`` (64) ops per threadblock. ``LaneOps`` holds a lane's
ops and puts a ``nop`` only where the executor needs one; ``BatchedLaneOps`` also gathers a lane's
waits and signals into fewer ops, for a rank over the threadblock limit; ``lower_step`` appends a
step's local part; ``cut_threadblock`` cuts a lane into hardware threadblocks of at most 64 ops,
chained by semaphores.
"""

from __future__ import annotations

from taccl_py.ir.algorithm import Buffer, OpType, Step

__all__ = [
    "BatchedLaneOps",
    "LaneOps",
    "MAX_CHANNELS_PER_OPERATION",
    "MAX_OPERATIONS_PER_THREADBLOCK",
    "MAX_SEMAPHORES_PER_OPERATION",
    "Slot",
    "buffer_ref",
    "cut_threadblock",
    "lower_step",
]

MAX_OPERATIONS_PER_THREADBLOCK = 64  # MAX_OPERATION (execution_common.hpp); executor.cc refuses a threadblock with more
MAX_SEMAPHORES_PER_OPERATION = 16  # MAX_DEVICE_SEMAPHORES (execution_common.hpp): ids in one sem_acquire/release
MAX_CHANNELS_PER_OPERATION = 8  # MAX_CHANNEL_PER_OPERATION (execution_common.hpp): ids in one signal/wait
_CHAIN_OPS = 4  # at most an acquire + nop opening a cut piece and a nop + release closing it

Slot = tuple[Buffer, int]


# Ops every thread of a threadblock runs, whatever the channel (the packet ops loop over threadIdx.x).
_ALL_THREAD_OPS = frozenset(
    {"copy", "re", "res", "cpkt", "upkt", "repkt", "recpkt", "respkt", "recspkt", "glres", "gstore"}
)


def _all_threads(op: dict) -> bool:
    return op["name"] in _ALL_THREAD_OPS or (op["name"] in ("put", "ppkt", "rppkt") and op["channel_type"] == "memory")


def _several_threads(op: dict) -> bool:
    """Return whether threads other than 0 run part of ``op``: a data op, or a control op over several ids."""
    return _all_threads(op) or len(op.get("semaphore_ids", ())) > 1 or len(op.get("channel_ids", ())) > 1


def _unsynced(ops: list[dict]) -> bool:
    """Return whether an op that threads other than 0 run comes before the first nop of ``ops``."""
    for op in ops:
        if op["name"] == "nop":
            return False
        if _several_threads(op):
            return True
    return False


def cut_threadblock(ops: list[dict], first_semaphore: int) -> list[list[dict]]:
    """Return a lane's ``ops`` cut into threadblocks under the op limit, chained by semaphores from ``first_semaphore``.

    A piece opens with an acquire (then a nop if an op other threads than 0 run comes before its first
    nop) and closes with a release (after a nop if such an op comes after its last nop), as ``LaneOps`` rules.
    """
    if len(ops) <= MAX_OPERATIONS_PER_THREADBLOCK:
        return [ops]
    # A cut before op i keeps every memory put on one threadblock with the signal that publishes it.
    unsignalled, cuttable = False, []
    for op in ops:
        cuttable.append(not unsignalled and op["name"] not in ("nop", "signal", "flush"))
        if op["name"] in ("put", "signal") and op["channel_type"] == "memory":
            unsignalled = op["name"] == "put"
    pieces, start = [], 0
    while start < len(ops):
        end = last = min(start + MAX_OPERATIONS_PER_THREADBLOCK - _CHAIN_OPS, len(ops))
        while start < end < len(ops) and not cuttable[end]:
            end -= 1
        end = end if end > start else last
        piece = ops[start:end]
        while end < len(ops) and piece and piece[-1]["name"] == "nop":
            piece.pop()  # the next piece syncs after its acquire if it must, and the tail rule below here
        pieces.append(piece)
        start = end
    cut = []
    for number, piece in enumerate(pieces):
        head = tail = []
        if number:
            head = [{"name": "sem_acquire", "semaphore_ids": [first_semaphore + number - 1]}]
            head += [{"name": "nop"}] if _unsynced(piece) else []
        if number + 1 < len(pieces):
            tail = [{"name": "nop"}] if _unsynced(piece[::-1]) else []
            tail += [{"name": "sem_release", "semaphore_ids": [first_semaphore + number]}]
        cut.append(head + piece + tail)
    return cut


class LaneOps:
    """One lane's operations with its channel and remote-buffer references (per channel type).

    A ``nop`` (``__syncthreads``) goes in only where the executor needs one. Control ops, a port
    put and ``pwsf`` run on thread 0 alone (``handleSignal``, ``handleWait``, ``handleFlush``,
    ``handleSem*`` and ``handlePut``'s port branch test ``tid < n`` with n = 1, execution_kernel.hpp),
    so they follow one another in program order; copies, reductions and memory puts run on every
    thread (``mscclpp::copy``/``handleReduceSend`` loop over ``threadIdx.x``). Hence a nop before an
    all-thread op after a wait, acquire, flush or port put (thread 0 passed a gate the others did not
    see), before a signal, release or port put after an all-thread op (thread 0 must publish
    finished data), and between two all-thread ops only when their chunks overlap. An acquire of
    several semaphores runs one per thread (thread i acquires the i-th), so only a nop waits for them
    all: one goes before whatever then uses data (any data op, a signal, flush or release); and a
    release of several semaphores after a gate waits at a nop, as its threads 1.. saw no gate. A wait
    or signal of several channels is the same. Uses of one semaphore (or channel) by different
    threads are kept in order by a nop between them: a semaphore counts acquires and releases, so
    the k-th acquire must stay the k-th.
    """

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.channels: dict[str, list[int]] = {"memory": [], "port": [], "switch": []}
        self.remote: dict[str, list[int]] = {"memory": [], "port": []}
        self.busy: list[tuple[set, set]] = []  # reads and writes of all-thread ops since the last nop
        self.gated = False  # thread 0 passed a wait, acquire, flush or port put since the last nop
        self.split = False  # threads other than 0 may still be acquiring semaphores or waiting
        # (op name, semaphore) or (op name, channel type, channel) -> the thread that ran it since the nop
        self.thread_of: dict[tuple, int] = {}

    def _sync(self) -> None:
        self.ops.append({"name": "nop"})
        self.busy, self.gated, self.split, self.thread_of = [], False, False, {}

    def channel_ref(self, kind: str, gpu_channel: int) -> int:
        """Return the threadblock's index of the GPU's ``gpu_channel`` of type ``kind``, listing it if new."""
        refs = self.channels[kind]
        if gpu_channel not in refs:
            refs.append(gpu_channel)
        return refs.index(gpu_channel)

    def remote_ref(self, kind: str, remote_id: int) -> int:
        """Return the threadblock's index of the GPU's remote buffer ``remote_id``, listing it if new."""
        refs = self.remote[kind]
        if remote_id not in refs:
            refs.append(remote_id)
        return refs.index(remote_id)

    def control(self, name: str, kind: str, gpu_channels: list[int]) -> None:
        """Append a signal, wait or flush of ``gpu_channels`` (distinct, at most 8): thread t runs the t-th."""
        several = len(gpu_channels) > 1
        if name == "signal" and (self.busy or several and self.gated) or name != "wait" and self.split:
            self._sync()
        refs = [self.channel_ref(kind, channel) for channel in gpu_channels]
        # A channel's signals (and waits) count; another thread's since the nop could overtake this one.
        if any(self.thread_of.get((name, kind, ref), thread) != thread for thread, ref in enumerate(refs)):
            self._sync()
        self.ops.append({"name": name, "channel_ids": refs, "channel_type": kind})
        self.thread_of.update(((name, kind, ref), thread) for thread, ref in enumerate(refs))
        self.gated = self.gated or name in ("wait", "flush")
        self.split = self.split or name == "wait" and several

    def semaphores(self, name: str, ids: list[int]) -> None:
        if name == "sem_release" and (self.busy or self.split or self.gated and len(ids) > 1):
            self._sync()
        for start in range(0, len(ids), MAX_SEMAPHORES_PER_OPERATION):
            chunk = ids[start : start + MAX_SEMAPHORES_PER_OPERATION]
            # Thread t runs chunk[t]: a semaphore another thread ran since the nop could overtake it.
            if any(self.thread_of.get((name, semaphore), thread) != thread for thread, semaphore in enumerate(chunk)):
                self._sync()
            self.ops.append({"name": name, "semaphore_ids": chunk})
            self.thread_of.update(((name, semaphore), thread) for thread, semaphore in enumerate(chunk))
        self.gated = self.gated or name == "sem_acquire"
        self.split = self.split or name == "sem_acquire" and len(ids) > 1

    def data(self, op: dict, all_threads: bool = True) -> None:
        reads, writes = _footprint(op)
        if all_threads:
            if self.gated or any(writes & (r | w) or reads & w for r, w in self.busy):
                self._sync()
            self.busy.append((reads, writes))
        elif self.busy or self.split:
            self._sync()
        self.ops.append(op)
        self.gated = self.gated or not all_threads

    def close(self) -> None:
        """Append what is held back; ``ops`` is then whole (a ``LaneOps`` holds nothing back)."""

    def put(self, source: Slot, count: int, kind: str, gpu_channel: int, remote_id: int, target: Slot) -> None:
        """Append a put; across machines a ``pwsf`` (put, signal, flush in one op; port channels only)."""
        op = {"name": "put" if kind == "memory" else "pwsf", "src_buff": [buffer_ref(source, count)]}
        op["dst_buff"] = [{"buffer_id": self.remote_ref(kind, remote_id), "index": target[1], "size": count}]
        if kind == "port":  # the DSL names the channel of a port put; a memory put writes through the buffer
            op["channel_ids"] = [self.channel_ref(kind, gpu_channel)]
        op["channel_type"] = kind
        self.data(op, all_threads=kind == "memory")


class BatchedLaneOps(LaneOps):
    """A lane's operations with its gates and publications gathered into as few ops as order allows.

    A gate (wait, acquire) may run earlier than written, before data ops, and a publication
    (signal, release) later, after them: either only delays. Neither may pass the other, or a wait
    could stand before the signal its own peer waits for. So a lane becomes blocks of gates, data
    ops, publications, each kind of control op of a block issued as one op over several ids
    (thread t runs the t-th). This saves the nops and control ops between steps at the cost of a
    data op's time of latency; ``export`` uses it only for a rank over the threadblock limit. A
    port put (``pwsf``) publishes, so it ends its block's data. Simple plans only: under LL a packet
    read is a gate and a packet write a publication, which this class does not tell from local data ops.
    """

    def __init__(self) -> None:
        super().__init__()
        self._gates: list[tuple[str, str | None, int]] = []  # (op name, channel type or None, id)
        self._body: list[tuple[dict, bool]] = []  # (data op, run by all threads)
        self._publications: list[tuple[str, str | None, int]] = []
        self._sealed = False  # the block published: a gate now opens the next block

    def control(self, name: str, kind: str, gpu_channels: list[int]) -> None:
        if name == "signal":
            self._publications += [(name, kind, channel) for channel in gpu_channels]
        elif name == "wait":
            self._gate([(name, kind, channel) for channel in gpu_channels])
        else:
            self.close()
            super().control(name, kind, gpu_channels)

    def semaphores(self, name: str, ids: list[int]) -> None:
        if name == "sem_release":
            self._publications += [(name, None, semaphore) for semaphore in ids]
        else:
            self._gate([(name, None, semaphore) for semaphore in ids])

    def data(self, op: dict, all_threads: bool = True) -> None:
        self._body.append((op, all_threads))
        self._sealed = self._sealed or not all_threads

    def _gate(self, gates: list[tuple[str, str | None, int]]) -> None:
        if self._publications or self._sealed:
            self.close()
        self._gates += gates

    def close(self) -> None:
        gates, body, publications = self._gates, self._body, self._publications
        self._gates, self._body, self._publications, self._sealed = [], [], [], False
        self._issue(gates)
        for op, all_threads in body:
            super().data(op, all_threads)
        self._issue(publications)

    def _issue(self, controls: list[tuple[str, str | None, int]]) -> None:
        """Append ``controls`` as few ops per (name, channel type), each over distinct ids, in order per id."""
        groups: dict[tuple[str, str | None], list[list[int]]] = {}
        for name, kind, number in controls:
            size = MAX_CHANNELS_PER_OPERATION if kind else MAX_SEMAPHORES_PER_OPERATION
            ops = groups.setdefault((name, kind), [])
            # the first op not yet holding this id keeps a repeated id's uses in order
            target = next((ids for ids in ops if number not in ids and len(ids) < size), None)
            if target is None:
                ops.append(target := [])
            target.append(number)
        for (name, kind), ops in groups.items():
            for ids in ops:
                if kind is None:
                    super().semaphores(name, ids)
                else:
                    super().control(name, kind, ids)


def _footprint(op: dict) -> tuple[set, set]:
    """Return the chunks an op reads and writes: (buffer type, index) locally, (remote buffer id, index) remotely."""
    slots = []
    for key in ("src_buff", "dst_buff"):
        slots.append(
            {
                (ref.get("type", ref.get("buffer_id", ("switch", ref.get("switch_channel_id")))), i)
                for ref in op[key]
                for i in range(ref["index"], ref["index"] + ref["size"])
            }
        )
    return slots[0], slots[1]


def buffer_ref(slot: Slot, count: int) -> dict:
    return {"type": slot[0].value, "index": slot[1], "size": count}


def lower_step(ops: LaneOps, step: Step, land: Slot | None) -> Slot | None:
    """Append the local part of ``step``; return the slot its send part reads."""
    op, count = step.op, step.count
    src = (step.src_buffer, step.src_offset) if step.src_buffer is not None else None
    dst = (step.dst_buffer, step.dst_offset) if step.dst_buffer is not None else None
    if op is OpType.COPY or (op in (OpType.RECV, OpType.RECV_COPY_SEND) and land != dst):
        source = src if op is OpType.COPY else land
        ops.data({"name": "copy", "src_buff": [buffer_ref(source, count)], "dst_buff": [buffer_ref(dst, count)]})
    elif op.reduces:
        inputs, target = ((dst, src), dst) if op is OpType.REDUCE else ((src, land), land)
        if op in (OpType.RECV_REDUCE_COPY, OpType.RECV_REDUCE_COPY_SEND):
            target = dst
        reduce = {"name": "re", "src_buff": [buffer_ref(slot, count) for slot in inputs]}
        reduce.update({"dst_buff": [buffer_ref(target, count)], "reduce_op": "sum"})
        ops.data(reduce)
    return {
        OpType.SEND: src,
        OpType.RECV_COPY_SEND: land,
        OpType.RECV_REDUCE_SEND: land,
        OpType.RECV_REDUCE_COPY_SEND: dst,
    }.get(op)
