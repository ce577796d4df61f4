"""Transfer lists of the classic schedules over arbitrary rank orders, for ``lower_plan``.

A *piece* is ``(offset, count)``: ``count`` consecutive chunks of a buffer, at the same offset
on every rank. ``owned[j]`` lists the pieces that position ``j`` of a ring owns (its own data
for an allgather, the sums it ends with for a reduce-scatter); every position owns the same
number of pieces. Items come out in causal order (every item's input was produced by an
earlier item), step by step, so one threadblock's sends follow the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence

from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.lowering import Transfer

__all__ = [
    "Piece",
    "ring_allgather_items",
    "ring_reducescatter_items",
    "tree_allreduce_items",
    "binary_tree_parents",
    "complement_tree_parents",
]

Piece = tuple[int, int]


def ring_allgather_items(
    ring: Sequence[int], owned: Sequence[Sequence[Piece]], buffer: Buffer, channel: int
) -> list[Transfer]:
    """Return the transfers that pass each position's pieces around ``ring`` (len - 1 steps).

    At step s position i forwards what position i - s owns to position i + 1.
    """
    n = len(ring)
    items = []
    for step in range(n - 1):
        for k in range(len(owned[0])):
            for i in range(n):
                offset, count = owned[(i - step) % n][k]
                items.append(
                    Transfer(ring[i], ring[(i + 1) % n], (buffer, offset), (buffer, offset), count, channel=channel)
                )
    return items


def ring_reducescatter_items(
    ring: Sequence[int], owned: Sequence[Sequence[Piece]], buffer: Buffer, channel: int
) -> list[Transfer]:
    """Return the transfers that sum every piece into its owner around ``ring`` (len - 1 steps).

    At step s position i adds its partial sum of what position i - s - 1 owns into position
    i + 1's copy, in place in ``buffer``; the owner receives last.
    """
    n = len(ring)
    items = []
    for step in range(n - 1):
        for k in range(len(owned[0])):
            for i in range(n):
                offset, count = owned[(i - step - 1) % n][k]
                items.append(
                    Transfer(
                        ring[i],
                        ring[(i + 1) % n],
                        (buffer, offset),
                        (buffer, offset),
                        count,
                        reduce=True,
                        channel=channel,
                    )
                )
    return items


def _orders(parents: dict[int, int | None]) -> tuple[list[int], list[int]]:
    """Return (post-order without the root, pre-order without the root) of a parent map."""
    children: dict[int, list[int]] = {rank: [] for rank in parents}
    root = None
    for rank, parent in sorted(parents.items()):
        if parent is None:
            root = rank
        else:
            children[parent].append(rank)
    pre: list[int] = []
    stack = [root]
    while stack:
        rank = stack.pop()
        pre.append(rank)
        stack.extend(reversed(children[rank]))
    post = pre[::-1]  # reversed pre-order puts every child before its parent
    return [r for r in post if r != root], pre[1:]


def tree_allreduce_items(
    parents: dict[int, int | None], pieces: Sequence[Piece], buffer: Buffer, channel: int
) -> list[Transfer]:
    """Return the transfers of a pipelined tree allreduce over ``pieces`` held in ``buffer``.

    ``parents`` maps each rank of the tree to its parent (None for the root). Each piece is
    summed up the tree (children add into their parent's copy) and then broadcast down; pieces
    follow each other, so piece k + 1 climbs while piece k descends.
    """
    up, down = _orders(parents)
    items = []
    for offset, count in pieces:
        items += [
            Transfer(r, parents[r], (buffer, offset), (buffer, offset), count, reduce=True, channel=channel) for r in up
        ]
        items += [Transfer(parents[r], r, (buffer, offset), (buffer, offset), count, channel=channel) for r in down]
    return items


def _deepest_multiple(lo: int, hi: int) -> int:
    """Return the number in [lo, hi] (lo >= 1) divisible by the largest power of two."""
    power = 1 << hi.bit_length()
    while power > 1 and (hi // power) * power < lo:
        power >>= 1
    return (hi // power) * power


def binary_tree_parents(n: int) -> list[int | None]:
    """Return parent positions of a balanced in-order binary tree over positions 0..n-1.

    Position 0 is the root with one child; positions 1..n-1 form an in-order tree whose root in
    each interval is the number divisible by the largest power of two, so odd positions are
    leaves (the shape of NCCL's double binary tree).

    >>> binary_tree_parents(6)
    [None, 2, 4, 2, 0, 4]
    """
    parents: list[int | None] = [None] * n
    stack = [(1, n - 1, 0)]
    while stack:
        lo, hi, parent = stack.pop()
        if lo > hi:
            continue
        root = _deepest_multiple(lo, hi)
        parents[root] = parent
        stack += [(lo, root - 1, root), (root + 1, hi, root)]
    return parents


def complement_tree_parents(n: int) -> list[int | None]:
    """Return the second tree: the first one mirrored (even n) or shifted by one (odd n).

    Mirroring turns the first tree's leaves (odd positions) into inner positions of the second,
    so each position does the inner-node work in at most one of the two trees.

    >>> complement_tree_parents(6)
    [1, 5, 3, 1, 3, None]
    """
    first = binary_tree_parents(n)
    if n % 2 == 0:
        place = [n - 1 - p for p in range(n)]
    else:
        place = [(p + 1) % n for p in range(n)]
    parents: list[int | None] = [None] * n
    for position, parent in enumerate(first):
        parents[place[position]] = None if parent is None else place[parent]
    return parents
