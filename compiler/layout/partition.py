"""Balanced k-way minimum cuts: items (a placement's virtual nodes or mesh coordinates) into parts of given sizes
with the least weight between parts, the mechanism compiler/layout/placement.py's auto decides with.

`partition` is exact (depth-first branch and bound, parts of equal size interchangeable) when the canonical
assignments number at most `exhaustive`, else the best of the caller's start, contiguous blocks and greedy graph
growing, each refined by Kernighan-Lin swaps (Kernighan & Lin, "An Efficient Heuristic Procedure for Partitioning
Graphs", Bell System Technical Journal 1970). Balanced partitioning is NP-hard in general; the heuristics are held
to brute force in tests/test_placement.py. `adj` is {item: {item: weight}}, symmetric. Torch-free.
"""
from __future__ import annotations

import itertools
import math

KL_LIMIT = 128
"""Kernighan-Lin refinement and pairwise-swap searches run on up to this many items (each swap costs a quadratic
scan); larger graphs keep their best start (a 16,384-rank mesh: the grid's boxes)."""
GROW_LIMIT = 4 * KL_LIMIT
"""Greedy graph growing (a linear scan per item placed) runs on up to this many items."""


def cut(parts: list, adj: dict) -> float:
    """The weight of the edges between different parts."""
    where = {v: k for k, part in enumerate(parts) for v in part}
    return sum(w for u in where for v, w in adj[u].items() if v in where and where[v] != where[u]) / 2


def canonical_count(sizes: list) -> int:
    """How many ways to cut sum(sizes) items into parts of `sizes`, parts of equal size interchangeable."""
    n, count = sum(sizes), 1
    for s in sizes:
        count *= math.comb(n, s)
        n -= s
    for m in _multiplicities(sizes):
        count //= math.factorial(m)
    return count


def _multiplicities(sizes: list) -> list:
    return [sizes.count(s) for s in set(sizes)]


def partition(vnodes: list, sizes: list, adj: dict, exhaustive: int, start: list | None = None) -> list:
    """`vnodes` cut into parts of `sizes` with the least weight between parts: exact (branch and bound) when the
    canonical assignments number at most `exhaustive`, else the best of `start` (parts of `sizes`, kept on a
    tie), contiguous blocks and greedy graph growing, each refined by Kernighan-Lin swaps."""
    if len(sizes) == 1:
        return [list(vnodes)]
    starts = [start] if start is not None else []
    if canonical_count(sizes) <= exhaustive:
        starts.append(_exact(vnodes, sizes, adj))
    else:
        starts += [_blocks(vnodes, sizes), *([_grow(vnodes, sizes, adj)] if len(vnodes) <= GROW_LIMIT else [])]
        if len(vnodes) <= KL_LIMIT:
            starts = [_kernighan_lin(s, adj) for s in starts]
    return min(starts, key=lambda parts: cut(parts, adj))


def _blocks(vnodes: list, sizes: list) -> list:
    out, i = [], 0
    for s in sizes:
        out.append(list(vnodes[i:i + s]))
        i += s
    return out


def _grow(vnodes: list, sizes: list, adj: dict) -> list:
    """Greedy graph growing: each part from the first free node, then the free node most connected to it."""
    free, out = dict.fromkeys(vnodes), []
    for s in sizes:
        part = [next(iter(free))]
        del free[part[0]]
        link = dict.fromkeys(free, 0)
        while len(part) < s:
            for v, w in adj[part[-1]].items():
                if v in link:
                    link[v] += w
            pick = max(link, key=link.get)  # the first of the most connected, in the nodes' order
            del link[pick], free[pick]
            part.append(pick)
        out.append(part)
    return out


def _kernighan_lin(parts: list, adj: dict) -> list:
    """Swap the pair of nodes in different parts that lowers the cut most, until no swap lowers it."""
    parts = [list(p) for p in parts]
    where = {v: k for k, p in enumerate(parts) for v in p}
    while True:
        link = {v: [0] * len(parts) for v in where}
        for u in where:
            for v, w in adj[u].items():
                if v in where:
                    link[u][where[v]] += w
        best, swap = 0, None
        for u, v in itertools.combinations(sorted(where), 2):
            a, b = where[u], where[v]
            if a == b:
                continue
            gain = link[u][b] - link[u][a] + link[v][a] - link[v][b] - 2 * adj[u].get(v, 0)
            if gain > best:
                best, swap = gain, (u, v)
        if swap is None:
            return [sorted(p) for p in parts]
        u, v = swap
        a, b = where[u], where[v]
        parts[a][parts[a].index(u)], parts[b][parts[b].index(v)] = v, u
        where[u], where[v] = b, a


def _exact(vnodes: list, sizes: list, adj: dict) -> list:
    """The least cut by depth-first branch and bound; an empty part is tried once per size (equal parts are
    interchangeable); the first assignment found of the least cut is kept."""
    k, where = len(sizes), {}
    fill, best = [0] * k, [math.inf, None]

    def go(i: int, cost: float) -> None:
        if cost >= best[0]:
            return
        if i == len(vnodes):
            best[0], best[1] = cost, dict(where)
            return
        u, tried = vnodes[i], set()
        link, placed = [0] * k, 0  # u's weight to each part's items so far, and to all of them
        for v, w in adj[u].items():
            if v in where:
                link[where[v]] += w
                placed += w
        for j in range(k):
            if fill[j] == sizes[j] or (fill[j] == 0 and sizes[j] in tried):
                continue
            if fill[j] == 0:
                tried.add(sizes[j])
            add = placed - link[j]
            where[u] = j
            fill[j] += 1
            go(i + 1, cost + add)
            fill[j] -= 1
            del where[u]

    go(0, 0)
    return [[v for v in vnodes if best[1][v] == j] for j in range(k)]
