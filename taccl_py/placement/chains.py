"""Cheapest simple paths inside one node, for every (first GPU, last GPU, length).

``exact_chains`` runs a Held-Karp dynamic programme over subsets (O(g^2 2^g)); ``heuristic_chains``
builds greedy nearest-neighbour chains from every first GPU and improves the full-length ones by
2-opt (O(g^3) per chain). ``taccl_py.placement`` joins the per-node tables across nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ChainTable", "exact_chains", "heuristic_chains", "path_cost"]


def path_cost(costs: np.ndarray, order: Sequence[int]) -> float:
    """Return the sum of ``costs[a, b]`` over consecutive entries of ``order`` (µs)."""
    return float(sum(costs[a, b] for a, b in zip(order, order[1:])))


@dataclass(frozen=True)
class ChainTable:
    """Cheapest simple paths inside one node: ``cost[f, l, m]`` over m GPUs from f to l."""

    cost: np.ndarray
    paths: Callable[[int, int, int], tuple[int, ...]]


def _subset_layers(size: int) -> list[np.ndarray]:
    """Return, for p = 0..size, the bit masks over ``size`` items with p bits set."""
    masks = np.arange(1 << size, dtype=np.int64)
    popcount = np.zeros(1 << size, dtype=np.int64)
    for bit in range(size):
        popcount += (masks >> bit) & 1
    return [masks[popcount == p] for p in range(size + 1)]


def _held_karp(local: np.ndarray, first: int, layers: list[np.ndarray]) -> np.ndarray:
    """Return dp[mask, last]: the cheapest path from ``first`` through exactly ``mask`` to ``last``."""
    g = len(local)
    dp = np.full((1 << g, g), np.inf)
    dp[1 << first, first] = 0.0
    for p in range(2, g + 1):
        masks = layers[p][(layers[p] >> first) & 1 == 1]
        for j in range(g):
            if j == first:
                continue
            with_j = masks[(masks >> j) & 1 == 1]
            if len(with_j):
                dp[with_j, j] = np.min(dp[with_j ^ (1 << j)] + local[:, j], axis=1)
    return dp


def exact_chains(local: np.ndarray) -> ChainTable:
    """Return the cheapest simple path for every (first, last, length) by Held-Karp."""
    g = len(local)
    layers = _subset_layers(g)
    cost = np.full((g, g, g + 1), np.inf)
    best_mask = np.zeros((g, g, g + 1), dtype=np.int64)
    for first in range(g):
        dp = _held_karp(local, first, layers)
        for p in range(1, g + 1):
            masks = layers[p][(layers[p] >> first) & 1 == 1]
            values = dp[masks]
            pick = np.argmin(values, axis=0)
            cost[first, :, p] = values[pick, np.arange(g)]
            best_mask[first, :, p] = masks[pick]

    def paths(first: int, last: int, length: int) -> tuple[int, ...]:
        dp = _held_karp(local, first, layers)
        mask, current, path = int(best_mask[first, last, length]), last, [last]
        while mask != 1 << first:
            previous = mask ^ (1 << current)
            current = int(np.argmin(dp[previous] + local[:, current]))
            path.append(current)
            mask = previous
        return tuple(reversed(path))

    return ChainTable(cost, paths)


def heuristic_chains(local: np.ndarray) -> ChainTable:
    """Return greedy nearest-neighbour chains from every first GPU (full ones improved by 2-opt)."""
    g = len(local)
    cost = np.full((g, g, g + 1), np.inf)
    chains: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for first in range(g):
        chain = _greedy_chain(local, first)
        for length in range(1, g + 1):
            prefix = chain if length < g else _two_opt(local, chain)
            prefix = prefix[:length]
            value = path_cost(local, prefix)
            key = (first, prefix[-1], length)
            if value < cost[key]:
                cost[key] = value
                chains[key] = prefix
    return ChainTable(cost, lambda first, last, length: chains[(first, last, length)])


def _greedy_chain(local: np.ndarray, first: int) -> tuple[int, ...]:
    chain, unused = [first], set(range(len(local))) - {first}
    while unused:
        nxt = min(unused, key=lambda j: (local[chain[-1], j], j))
        chain.append(nxt)
        unused.discard(nxt)
    return tuple(chain)


def _two_opt(local: np.ndarray, chain: tuple[int, ...], max_passes: int = 4) -> tuple[int, ...]:
    """Return ``chain`` improved by reversing inner segments (first GPU kept) until no gain."""
    best, best_value = chain, path_cost(local, chain)
    for _ in range(max_passes):
        improved = False
        for i, j in itertools.combinations(range(1, len(best)), 2):
            candidate = best[:i] + best[i : j + 1][::-1] + best[j + 1 :]
            value = path_cost(local, candidate)
            if value < best_value - 1e-9:
                best, best_value, improved = candidate, value, True
        if not improved:
            break
    return best
