"""The placement of re-placed experts (runtime/rebalance.py), torch-free: the compiler's cost model
(compiler/cost/rebalance.py) prices the placement the runtime makes with the same functions.

The algorithm is DeepSeek's EPLB (github.com/deepseek-ai/EPLB, `rebalance_experts`; DeepSeek-V3 technical report,
§3.4), written anew here for training:
  1. replication: R times, the expert with the largest load per copy gets one more copy (at most one per rank);
  2. balanced packing: the copies, heaviest first (load / copies), each to the rank with the least load that has a
     free slot and no copy of that expert yet;
  3. hierarchical when ep spans several nodes (and the experts and replicas divide over them): the experts first
     packed onto nodes by balanced packing (E / nodes each), then steps 1 and 2 within each node, so that a token's
     expert traffic stays on its node as far as the load allows.
Every rank computes it from the same all-reduced counts, with ties broken by index: the same placement everywhere.

A placement is a list over the P = E + R global slots (slot g = r·S + i, slot i of ep rank r, S = P / ep): the expert
each holds, -1 for an empty one.
"""
from __future__ import annotations


def canonical(experts: int, ranks: int, slots: int) -> list[int]:
    """The starting (and checkpointed) placement: rank r's first E/ep slots hold experts [r·E/ep, (r+1)·E/ep) in
    order, its other slots are empty (-1)."""
    own = experts // ranks
    return [r * own + i if i < own else -1 for r in range(ranks) for i in range(slots)]


def _replicate(load: list[float], extra: int, most: int) -> list[int]:
    """EPLB's replication: `extra` times, one more copy for the expert with the largest load per copy (the lowest
    index among equals), each expert at most `most` copies. Copies per expert."""
    copies = [1] * len(load)
    for _ in range(extra):
        e = max((e for e in range(len(load)) if copies[e] < most), key=lambda e: (load[e] / copies[e], -e))
        copies[e] += 1
    return copies


def _pack(items: list[tuple[float, int]], bins: int, room: int) -> list[list[int]]:
    """EPLB's balanced packing: the items (weight, expert), heaviest first (the lowest expert among equals), each to
    the bin with the least weight among those with room left that do not hold its expert yet (if every bin with room
    holds it, the least loaded with room). The experts of each bin."""
    held: list[list[int]] = [[] for _ in range(bins)]
    weight = [0.0] * bins
    for w, e in sorted(items, key=lambda it: (-it[0], it[1])):
        open_ = [b for b in range(bins) if len(held[b]) < room]
        fresh = [b for b in open_ if e not in held[b]] or open_
        b = min(fresh, key=lambda b: (weight[b], b))
        held[b].append(e)
        weight[b] += w
    return held


def place(load: list[float], ranks: int, slots: int, nodes: int = 1) -> list[int]:
    """The placement (global slot -> expert) for `load` (choices per expert) over `ranks` ep ranks of `slots` slots
    each, in `nodes` nodes (ranks in node order): hierarchical when several nodes share the experts and replicas
    evenly, else flat. Each rank's experts in increasing order, its empty slots (none when every slot is used) last."""
    experts = len(load)
    extra = ranks * slots - experts
    if nodes > 1 and ranks % nodes == 0 and experts % nodes == 0 and extra % nodes == 0:
        per_node = ranks // nodes
        groups = _pack([(load[e], e) for e in range(experts)], nodes, experts // nodes)
        out: list[int] = []
        for group in groups:
            sub = sorted(group)
            out += [sub[e] if e >= 0 else -1 for e in place([load[e] for e in sub], per_node, slots)]
        return out
    copies = _replicate(load, extra, ranks)
    items = [(load[e] / copies[e], e) for e in range(experts) for _ in range(copies[e])]
    held = _pack(items, ranks, slots)
    return [e for bin_ in held for e in sorted(bin_) + [-1] * (slots - len(bin_))]


def align(new: list[int], old: list[int], ranks: int, nodes: int = 1) -> list[int]:
    """`new` with its ranks' contents given to the ranks of the same node that already hold most of them (a rank's
    set of experts is what balances the load, not which rank holds it): greedily, the (new bin, old rank) pairs with
    the most experts in common first (the lowest indices among equals). The same spread as `new`, fewer moves."""
    slots = len(new) // ranks
    per_node = ranks // nodes if nodes > 0 and ranks % nodes == 0 else ranks
    bins = [new[r * slots:(r + 1) * slots] for r in range(ranks)]
    held = [set(old[r * slots:(r + 1) * slots]) - {-1} for r in range(ranks)]
    pairs = sorted(((len(set(bins[b]) & held[r]), b, r) for b in range(ranks) for r in range(ranks)
                    if b // per_node == r // per_node), key=lambda t: (-t[0], t[1], t[2]))
    given: dict[int, int] = {}
    taken: set[int] = set()
    for _, b, r in pairs:
        if b not in given and r not in taken:
            given[b] = r
            taken.add(r)
    out = [-1] * len(new)
    for b, r in given.items():
        out[r * slots:(r + 1) * slots] = bins[b]
    return out


def rank_loads(slot_load: list[float], ranks: int) -> list[float]:
    slots = len(slot_load) // ranks
    return [sum(slot_load[r * slots:(r + 1) * slots]) for r in range(ranks)]


def spread(loads: list[float]) -> float:
    """max / mean of the ranks' loads: 1 when balanced."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def predicted_slot_load(load: list[float], placement: list[int]) -> list[float]:
    """Each slot's share of `load` under `placement`: an expert's load divided evenly between its copies."""
    copies = [placement.count(e) for e in range(len(load))]
    return [load[e] / copies[e] if e >= 0 else 0.0 for e in placement]


def plan_moves(old: list[int], new: list[int], ranks: int):
    """For each rank: (sends[d], recvs[s], local pairs) that turn placement `old` into `new`. A slot whose expert
    stays is left; another takes its expert from a copy on its own rank if there is one, else from the first slot
    holding it. Slots that become empty are left as they are (nothing reads them)."""
    slots = len(old) // ranks
    plan = [([[] for _ in range(ranks)], [[] for _ in range(ranks)], []) for _ in range(ranks)]
    for g, e in enumerate(new):
        if e < 0 or old[g] == e:
            continue
        d, i = divmod(g, slots)
        holders = [h for h, x in enumerate(old) if x == e]
        if not holders:
            raise AssertionError(f"expert {e} held by no slot before the move")
        src = next((h for h in holders if h // slots == d), holders[0])
        s, j = divmod(src, slots)
        if s == d:
            plan[d][2].append((j, i))
        else:
            plan[s][0][d].append(j)
            plan[d][1][s].append(i)
    return plan
