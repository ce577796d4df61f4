"""The lanes of an MSCCL++ plan: their ops, the semaphores between them, their threadblocks, and merging them.

The MSCCL++ executor runs at most ``MAX_OPERATION`` (64) ops per threadblock, and our exporter
keeps at most 64 threadblocks per GPU resident, so a large schedule must spend fewer ops. Two
passes here do that:

* ``lane_dependencies`` keeps only the cross-threadblock dependencies that no other path implies
  (a transitive reduction of the rank's step graph: program order plus ``depends``). A dropped
  dependency costs no semaphore. What is left pairs in order: per ordered pair of lanes, later
  acquires meet later releases, so one counting semaphore per pair serves them all.
* ``merge_lanes`` runs the steps of several of our threadblocks on one *lane* (one instruction
  stream, cut into hardware threadblocks of at most 64 ops), interleaved in one global
  topological order of the algorithm's steps (``step_positions``). Every program-order edge a
  merge adds then runs forward in that order, so no wait can close a cycle, and dependencies
  between merged threadblocks need no semaphore.

``LaneOps`` holds a lane's ops and puts a ``nop`` only where the executor needs one;
``lower_step`` appends a step's local part. ``cut_threadblock`` then cuts each lane into hardware
threadblocks of at most 64 ops, chained by semaphores, and ``lane_semaphores`` numbers the
semaphores the kept dependencies need.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step
from taccl_py.ir.dataflow import build_dataflow

__all__ = [
    "Lane",
    "LaneOps",
    "MAX_OPERATIONS_PER_THREADBLOCK",
    "MAX_SEMAPHORES_PER_OPERATION",
    "Slot",
    "StepKey",
    "buffer_ref",
    "cut_threadblock",
    "lower_step",
    "lane_dependencies",
    "lane_semaphores",
    "merge_lanes",
    "step_positions",
]

MAX_OPERATIONS_PER_THREADBLOCK = 64  # MAX_OPERATION (execution_common.hpp); executor.cc refuses a threadblock with more
MAX_SEMAPHORES_PER_OPERATION = 16  # MAX_DEVICE_SEMAPHORES (execution_common.hpp): ids in one sem_acquire/release
_CHAIN_OPS = 4  # at most an acquire + nop opening a cut piece and a nop + release closing it

StepRef = tuple[int, int]  # (threadblock id, step index) on one rank
StepKey = tuple[int, int, int]  # (rank, threadblock id, step index)
Lane = tuple[StepRef, ...]  # the steps one instruction stream runs, in order
Slot = tuple[Buffer, int]


def step_positions(algorithm: Algorithm) -> dict[StepKey, int]:
    """Return every step's position in one topological order of the algorithm's dataflow (all ranks).

    A step's position is that of its first action; every dependency, program-order edge and
    send-to-receive match enters a step at its first action, so positions increase along them.
    """
    dataflow = build_dataflow(algorithm)
    if dataflow.order is None:
        raise ArgumentError(algorithm.name, "algorithm", "a circular or broken dataflow", "a verified algorithm")
    positions: dict[StepKey, int] = {}
    for position, action_id in enumerate(dataflow.order):
        action = dataflow.actions[action_id]
        positions.setdefault((action.rank, action.threadblock, action.step), position)
    return positions


def _step_graph(prog: RankProgram, lanes: list[Lane]) -> tuple[list[StepRef], dict[StepRef, set[StepRef]]]:
    """Return the rank's steps in a topological order and their successors (lane order plus ``depends``)."""
    successors: dict[StepRef, set[StepRef]] = defaultdict(set)
    indegree: dict[StepRef, int] = {}
    for lane in lanes:
        for before, after in zip(lane, lane[1:]):
            successors[before].add(after)
    for tb in prog.threadblocks:
        for index, step in enumerate(tb.steps):
            for dependency in step.depends:
                if dependency != (tb.id, index):
                    successors[tuple(dependency)].add((tb.id, index))
    nodes = [step for lane in lanes for step in lane]
    for node in nodes:
        indegree.setdefault(node, 0)
        for successor in successors[node]:
            indegree[successor] = indegree.get(successor, 0) + 1
    order = [node for node in nodes if indegree[node] == 0]
    for node in order:  # Kahn's algorithm; ``order`` is its own queue
        for successor in successors[node]:
            indegree[successor] -= 1
            if indegree[successor] == 0:
                order.append(successor)
    if len(order) != len(nodes):
        raise ArgumentError(f"rank {prog.rank}", "threadblocks", "circular dependencies", "a verified algorithm")
    return order, successors


def _descendants(prog: RankProgram, lanes: list[Lane]) -> tuple[list[StepRef], dict, dict[StepRef, int], dict]:
    """Return the topological order, successors, bit of each step and the bit set of its descendants."""
    order, successors = _step_graph(prog, lanes)
    bit = {node: 1 << index for index, node in enumerate(order)}
    below: dict[StepRef, int] = {}
    for node in reversed(order):
        reach = 0
        for successor in successors[node]:
            reach |= bit[successor] | below[successor]
        below[node] = reach
    return order, successors, bit, below


def lane_dependencies(prog: RankProgram, lanes: list[Lane]) -> dict[StepRef, list[StepRef]]:
    """Return, per step, the steps of other lanes it must wait for that no other path already orders before it.

    Notes
    -----
    One pass over the steps in reverse topological order builds each step's descendants as a
    bit set; a dependency u -> v is implied when v descends from another successor of u. The
    cost is O(edges x steps / word size).
    """
    lane_of = {step: number for number, lane in enumerate(lanes) for step in lane}
    order, successors, bit, below = _descendants(prog, lanes)
    kept: dict[StepRef, list[StepRef]] = defaultdict(list)
    for node in order:
        # a step never descends from itself, so v is below some successor of u other than v iff below any
        implied = 0
        for successor in successors[node]:
            implied |= below[successor]
        for successor in successors[node]:
            if lane_of[node] != lane_of[successor] and not implied & bit[successor]:
                kept[successor].append(node)
    return {step: sorted(before) for step, before in kept.items()}


def _merged(first: Lane, second: Lane, position: Callable[[StepRef], int]) -> Lane:
    return tuple(sorted(first + second, key=position))


def merge_lanes(
    prog: RankProgram,
    positions: dict[StepKey, int],
    threadblocks_of: Callable[[list[Lane]], list[int] | None],
    limit: int,
) -> list[Lane]:
    """Return the rank's lanes: one per threadblock, merged greedily until they need at most ``limit`` threadblocks.

    ``threadblocks_of(lanes)`` gives the hardware threadblocks each lane needs once cut into
    pieces of at most 64 ops, or None when a lane breaks another limit (channels per threadblock).
    Each round merges the first pair of ``_candidate_pairs`` whose merged lane stays under a length
    cap (twice the longest threadblock at first, doubled when nothing fits: a lane runs its steps
    one after another, so long lanes lose parallelism) and needs no more threadblocks than the two
    did. When no merge is left to try, the lanes reached come back as they are.

    Notes
    -----
    Every trial lowers the whole rank again, O(lanes x steps) per round; ranks within the limit
    never get here.
    """

    def position(step: StepRef) -> int:
        return positions[(prog.rank, *step)]

    lanes = [tuple((tb.id, i) for i in range(len(tb.steps))) for tb in sorted(prog.threadblocks, key=lambda t: t.id)]
    counts = threadblocks_of(lanes)
    refused: set[tuple[Lane, Lane]] = set()
    # A lane runs its steps one after another: cap its length, doubling the cap only when no merge fits under it.
    cap = 2 * max((len(lane) for lane in lanes), default=1)
    while counts is not None and sum(counts) > limit:
        longest = max(len(lane) for lane in lanes)
        for a, b in _candidate_pairs(prog, lanes, counts):
            if (lanes[a], lanes[b]) in refused or len(lanes[a]) + len(lanes[b]) > cap:
                continue
            trial = [lane for number, lane in enumerate(lanes) if number not in (a, b)]
            trial.append(_merged(lanes[a], lanes[b], position))
            trial_counts = threadblocks_of(trial)
            if trial_counts is not None and sum(trial_counts) <= sum(counts):
                lanes, counts = trial, trial_counts
                break
            refused.add((lanes[a], lanes[b]))
        else:
            if cap >= sum(len(lane) for lane in lanes) and cap > longest:
                break
            cap *= 2
    return lanes


def _candidate_pairs(prog: RankProgram, lanes: list[Lane], counts: list[int]) -> list[tuple[int, int]]:
    """Return pairs of lanes worth merging, best first.

    First pairs joined by kept dependencies, most per step first (a merge drops their semaphores
    and keeps lanes short, which cut into fewer partial pieces); then pairs of one-piece lanes,
    smallest first (two short threadblocks may fit one).
    """
    dependencies = lane_dependencies(prog, lanes)
    lane_of = {step: number for number, lane in enumerate(lanes) for step in lane}
    weight: dict[tuple[int, int], int] = defaultdict(int)
    for step, before in dependencies.items():
        for other in before:
            weight[tuple(sorted((lane_of[other], lane_of[step])))] += 1
    joined = sorted(weight, key=lambda pair: (-weight[pair] / (len(lanes[pair[0]]) + len(lanes[pair[1]])), pair))
    single = sorted((n for n, count in enumerate(counts) if count == 1), key=lambda n: (len(lanes[n]), n))
    small = [(a, b) for i, a in enumerate(single) for b in single[i + 1 :] if (min(a, b), max(a, b)) not in weight]
    small.sort(key=lambda pair: (len(lanes[pair[0]]) + len(lanes[pair[1]]), pair))
    return [tuple(sorted(pair)) for pair in joined + small]


def lane_semaphores(prog: RankProgram, lanes: list[Lane]) -> tuple[dict, dict, int]:
    """Return the semaphores each (threadblock, step) acquires before it and releases after it, and their count.

    One semaphore per ordered pair of lanes; ``lane_dependencies`` leaves per pair only
    dependencies whose releases and acquires come in the same order, so the k-th acquire meets the k-th release.
    """
    lane_of = {step: number for number, lane in enumerate(lanes) for step in lane}
    semaphore_of: dict[tuple[int, int], int] = {}
    acquires: dict[tuple[int, int], list[int]] = defaultdict(list)
    releases: dict[tuple[int, int], list[int]] = defaultdict(list)
    dependencies = lane_dependencies(prog, lanes)
    for lane in lanes:
        for step in lane:
            for other in dependencies.get(step, ()):
                semaphore = semaphore_of.setdefault((lane_of[other], lane_of[step]), len(semaphore_of))
                acquires[step].append(semaphore)
                releases[other].append(semaphore)
    return acquires, releases, len(semaphore_of)


# Ops every thread of a threadblock runs, whatever the channel (the packet ops loop over threadIdx.x).
_ALL_THREAD_OPS = frozenset({"copy", "re", "res", "cpkt", "upkt", "repkt", "recpkt", "respkt", "recspkt"})


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
    pieces, start = [], 0
    while start < len(ops):
        end = min(start + MAX_OPERATIONS_PER_THREADBLOCK - _CHAIN_OPS, len(ops))
        while end < len(ops) and ops[end]["name"] in ("nop", "signal", "flush"):
            end -= 1  # keep a put with its signal (and flush) on one threadblock
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
    release of several semaphores after a gate waits at a nop, as its threads 1.. saw no gate. Uses
    of one semaphore by different threads are kept in order by a nop between them: a semaphore counts
    acquires and releases, so the k-th acquire must stay the k-th.
    """

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.channels: dict[str, list[int]] = {"memory": [], "port": []}
        self.remote: dict[str, list[int]] = {"memory": [], "port": []}
        self.busy: list[tuple[set, set]] = []  # reads and writes of all-thread ops since the last nop
        self.gated = False  # thread 0 passed a wait, acquire, flush or port put since the last nop
        self.split = False  # threads other than 0 may still be acquiring semaphores
        self.thread_of: dict[tuple[str, int], int] = {}  # (op name, semaphore) -> thread that ran it since the nop

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

    def control(self, name: str, kind: str, gpu_channel: int) -> None:
        if name == "signal" and self.busy or name != "wait" and self.split:
            self._sync()
        self.ops.append({"name": name, "channel_ids": [self.channel_ref(kind, gpu_channel)], "channel_type": kind})
        self.gated = self.gated or name in ("wait", "flush")

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

    def put(self, source: Slot, count: int, kind: str, gpu_channel: int, remote_id: int, target: Slot) -> None:
        """Append a put; across machines a ``pwsf`` (put, signal, flush in one op; port channels only)."""
        op = {"name": "put" if kind == "memory" else "pwsf", "src_buff": [buffer_ref(source, count)]}
        op["dst_buff"] = [{"buffer_id": self.remote_ref(kind, remote_id), "index": target[1], "size": count}]
        if kind == "port":  # the DSL names the channel of a port put; a memory put writes through the buffer
            op["channel_ids"] = [self.channel_ref(kind, gpu_channel)]
        op["channel_type"] = kind
        self.data(op, all_threads=kind == "memory")


def _footprint(op: dict) -> tuple[set, set]:
    """Return the chunks an op reads and writes: (buffer type, index) locally, (remote buffer id, index) remotely."""
    slots = []
    for key in ("src_buff", "dst_buff"):
        slots.append(
            {
                (ref.get("type", ref.get("buffer_id")), i)
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
