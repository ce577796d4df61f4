"""Max-min fair rates of the routes that share links, by progressive filling (for the replay).

``MaxMinSharing`` keeps per-link and per-route scratch tables across the many recomputations of
one replay (thousands on a 64-GPU schedule), so that each recomputation costs list lookups over
the routes it touches instead of building dictionaries. Every float is computed by the same
operations in the same order as a straightforward dictionary version would, so rates, and hence
simulated times, do not depend on these tables.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

__all__ = ["MaxMinSharing"]

# A flow never gets a rate below this fraction of its link's capacity: max-min shares are
# positive in exact arithmetic, this only guards against float cancellation to 0.
MIN_RATE_FRACTION = 1e-12


class MaxMinSharing:
    """Scratch tables for max-min fair rates (bytes/µs) over one component of routes at a time.

    ``route_links[r]`` are the link indices of route r and ``capacity[l]`` the capacity of link l
    (bytes/µs). A call stamps the entries it writes, so no table is cleared between calls.
    """

    __slots__ = ("route_links", "capacity", "spare", "unfixed", "rate", "fixed_at", "seen_at", "stamp")

    def __init__(self, route_links: Sequence[tuple[int, ...]], capacity: Sequence[float]) -> None:
        self.route_links = route_links
        self.capacity = capacity
        self.spare = [0.0] * len(capacity)  # capacity not yet given to fixed routes
        self.unfixed = [0] * len(capacity)  # flows on the link whose rate is not fixed yet
        self.rate = [0.0] * len(route_links)  # per route, valid where fixed_at is the stamp
        self.fixed_at = [0] * len(route_links)
        self.seen_at = [0] * len(capacity)
        self.stamp = 0

    def component(self, seeds: set[int], link_routes: Sequence[set[int]]) -> tuple[set[int], list[int]]:
        """Return the routes sharing links (transitively) with ``seeds`` and the links they use.

        The routes come as a set filled in discovery order: callers iterate it, and the order
        of a set depends on how it was filled.
        """
        self.stamp += 1
        stamp, seen_at, route_links = self.stamp, self.seen_at, self.route_links
        members = set(seeds)
        frontier = list(members)
        links = []
        while frontier:
            for link in route_links[frontier.pop()]:
                if seen_at[link] != stamp:
                    seen_at[link] = stamp
                    links.append(link)
                    for other in link_routes[link]:
                        if other not in members:
                            members.add(other)
                            frontier.append(other)
        return members, links

    def rates(
        self,
        links: Sequence[int],
        link_routes: Sequence[set[int]],
        route_flows: Sequence[set[int]],
        link_count: Sequence[int],
    ) -> list[float]:
        """Return the table whose entries for the routes on ``links`` hold their max-min rate (bytes/µs).

        ``links`` must be a whole component (``component``). The link with the smallest fair
        share (spare capacity / flows not yet fixed) fixes its routes at that share; shares only
        grow as flows are fixed, so a lazy heap finds the next bottleneck. ``link_routes`` gives
        the order in which a link's routes are fixed, and so the order of the subtractions from
        every other link's spare capacity.
        """
        stamp, capacity, route_links = self.stamp, self.capacity, self.route_links
        spare, unfixed, rate, fixed_at = self.spare, self.unfixed, self.rate, self.fixed_at
        heap = []
        for link in links:
            spare[link] = free = capacity[link]
            unfixed[link] = count = link_count[link]
            if count:
                heap.append((free / count, link))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            share, link = pop(heap)
            count = unfixed[link]
            if not count or share != spare[link] / count:
                continue  # a stale entry: the link was fixed, or its share moved since
            share = max(share, capacity[link] * MIN_RATE_FRACTION)
            for route_id in link_routes[link]:
                if fixed_at[route_id] == stamp:
                    continue
                fixed_at[route_id] = stamp
                rate[route_id] = share
                flows = len(route_flows[route_id])
                used = share * flows
                for other in route_links[route_id]:
                    spare[other] -= used
                    left = unfixed[other] - flows
                    unfixed[other] = left
                    if left and other != link:
                        push(heap, (spare[other] / left, other))
        return rate
