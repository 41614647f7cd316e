"""The `.scale` file's `placement`: which rank each coordinate of the mesh gets, and the bytes a step moves over
each tier under it.

The mesh's axes are listed outermost first (compiler/layout/groups.py); by default the innermost varies fastest,
so the coordinate whose row-major index is i runs on rank i. A `RankMap` is any permutation instead: `ranks[i]`
is the rank of the coordinate with row-major index i. (It is not called Placement: in the vocabulary that word is
DTensor's Replicate / Shard / Partial, compiler/layout/placements.py.) Groups keep their meaning (the ranks that
differ only along some axes, ordered along them: groups.py's rows of row-major indices); only their ranks change,
so `RankMap.apply(group.rows())` gives each group's rank lists, and `RankMap.mesh()` the rank tensor to build a
DeviceMesh from as it is (never re-sorted).

Three ways to get one:
    order(axes, names)        the user's `placement = order(tp, pp, dp)`: `names` innermost first, the first
                              varying fastest over the ranks (`order_problems` says what is wrong with one).
    snake_order(axes, names)  the same order as a boustrophedon: consecutive ranks always neighbours in the mesh.
    auto(...)                 the least bytes over the slowest tier, then the next, and so on down, so that the
                              heaviest traffic lands on the fastest tier.

Traffic (`tier_bytes`): each group's collectives are priced as rings over the group's ranks in order (NCCL's ring
algorithm), each rank sending its group's per-rank bytes to the next rank of the ring, and the traffic between
consecutive ranks crosses the level the topology gives (compiler/layout/topology.py). The input is a dict from
an axis (or a tuple of axes: a folded group such as ("dp", "cp")) to the bytes each rank sends per step; the
ledger will provide it. Rings are the model: a tree or NVLS moves its bytes on other pairs, not modelled here.

auto's algorithm. Meta's Llama 3 training ("The Llama 3 Herd of Models" §3.3) orders its parallelism [TP, CP,
PP, DP] for the network and has its scheduler keep a job's traffic within pods, off the 1:7 aggregation layer;
auto does that for any mesh and tree, as a minimum cut of the mesh's communication graph per level (our
formulation):
 1. every order of the axes larger than one (innermost first), laid out plainly and as a snake, puts the
    coordinates on ranks; consecutive blocks of devices_per_node ranks are "virtual nodes", and the bytes between
    them a weighted communication graph;
 2. the virtual nodes are assigned to physical nodes. On a tree (fat-tree, rails under PXN, dragonfly, a Slurm
    switch tree; a scale-up domain over several nodes below its leaves), top-down: the graph is cut into the top
    level's children (pods) with the fewest bytes across, a balanced k-way minimum cut (exact by branch and bound
    when the canonical assignments number at most `exhaustive`, else contiguous blocks and greedy graph growing,
    each refined by Kernighan-Lin swaps), then each part into the next level's children, down to the nodes; beside
    it, the virtual nodes as a grid cut into equal boxes at each level (the factorisation with the least bytes
    between boxes). Elsewhere (a torus): every node order when nodes! <= `exhaustive`, else the topology's
    starting orders (a torus's snakes, rings of single hops) refined by pairwise swaps;
 3. on a tree of at most REFINE_LIMIT ranks, the best of these is re-cut top-down rank by rank (the same k-way
    cut over coordinates, starting from where it put them), which reaches staircases no axis order makes;
 4. the least bytes over the slowest level wins (the most oversubscribed links: the issue's objective); among the
    candidates tied there, the least time of the step's collectives (`seconds`, the step-time model's pricing on
    the described network, given by compiler/cost/links.py), then the least bytes over the next levels down;
    ties keep the earlier candidate, the mesh's own order (every axis order is also a candidate as laid out, on
    the nodes as numbered) first. `keep` passes over candidates the program cannot build (rank_order.py).
tests/test_placement.py holds auto to brute force: every placement of meshes up to 16 ranks, and every axis order
× node-to-pod assignment up to 64. At 16,384 ranks (Llama 3 405B's mesh) auto takes seconds: cache it per mesh,
traffic and topology. Torch-free; imports nothing of compiler.cost.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, replace

from compiler.layout.partition import KL_LIMIT, cut, partition
from compiler.layout.topology import Problem, locate, snake

REFINE_LIMIT = 256
"""The rank-level re-cut runs on meshes of up to this many ranks."""


@dataclass(frozen=True)
class RankMap:
    """The rank of every mesh coordinate: `ranks[i]` for the coordinate whose row-major index is i."""

    axes: tuple
    """((axis, size), ...) outermost first."""
    ranks: tuple

    def __post_init__(self):
        world = math.prod(n for _, n in self.axes)
        if len(self.ranks) != world or sorted(self.ranks) != list(range(world)):
            raise ValueError(f"a rank map of a {world}-rank mesh must hold each rank 0..{world - 1} once, "
                             f"not {len(self.ranks)} ranks")

    @classmethod
    def identity(cls, axes: tuple) -> "RankMap":
        return cls(tuple(axes), tuple(range(math.prod(n for _, n in axes))))

    @property
    def world(self) -> int:
        return len(self.ranks)

    def index(self, coord: tuple) -> int:
        """The row-major index of a coordinate (one entry per axis, outermost first)."""
        i = 0
        for c, (_, n) in zip(coord, self.axes):
            i = i * n + c
        return i

    def rank(self, coord: tuple) -> int:
        return self.ranks[self.index(coord)]

    def coord(self, rank: int) -> tuple:
        i = self.ranks.index(rank)
        out = []
        for _, n in reversed(self.axes):
            i, c = divmod(i, n)
            out.append(c)
        return tuple(reversed(out))

    def apply(self, rows) -> tuple:
        """Rows of row-major indices (groups.py's `Group.rows()`) as rows of ranks under this placement."""
        return tuple(tuple(self.ranks[i] for i in row) for row in rows)

    def rows(self, names) -> tuple:
        """The ranks of every group folding the axes `names` (an axis or a tuple of them), each ordered along its
        axes in mesh order (the innermost fastest), the groups ordered by their first coordinate."""
        return self.apply(_rows(self.axes, (names,) if isinstance(names, str) else tuple(names)))

    def mesh(self):
        """The rank tensor, nested lists shaped like the axes (outermost first): DeviceMesh's `mesh` argument."""
        def nest(flat, sizes):
            if not sizes:
                return flat[0]
            step = len(flat) // sizes[0]
            return [nest(flat[k * step:(k + 1) * step], sizes[1:]) for k in range(sizes[0])]
        return nest(list(self.ranks), [n for _, n in self.axes])

    def relocate(self, nodes: tuple, devices_per_node: int) -> "RankMap":
        """The same placement with node v's devices moved to node `nodes[v]`, each keeping its local index."""
        return RankMap(self.axes, tuple(nodes[r // devices_per_node] * devices_per_node + r % devices_per_node
                                          for r in self.ranks))


@functools.lru_cache(maxsize=64)
def _rows(axes: tuple, names: tuple) -> tuple:
    """groups.py's stride patterns expanded: row-major indices of the coordinates that differ only along `names`,
    each row ordered along them (the innermost fastest), the rows by their first index."""
    unknown = [n for n in names if n not in dict(axes)]
    if unknown:
        raise ValueError(f"the mesh has no axis {', '.join(unknown)}")
    strides, inner = {}, 1
    for axis, n in reversed(axes):
        strides[axis] = inner
        inner *= n
    offsets, bases = [0], [0]
    for axis, n in axes:
        if axis in names:
            offsets = [o + k * strides[axis] for o in offsets for k in range(n)]
        else:
            bases = [b + k * strides[axis] for b in bases for k in range(n)]
    return tuple(tuple(b + o for o in offsets) for b in bases)


def order_problems(axes: tuple, names) -> tuple:
    """What is wrong with `order(names)` on a mesh of `axes`: an axis named twice, one missing, one unknown."""
    known = [a for a, _ in axes]
    out = [Problem("placement", f"axis {n} is named {names.count(n)} times", f"name {n} once")
           for n in dict.fromkeys(names) if names.count(n) > 1]
    out += [Problem("placement", f"the mesh has no axis {n}", f"name the mesh's axes: {', '.join(known)}")
            for n in dict.fromkeys(names) if n not in known]
    missing = [a for a in known if a not in names]
    if missing:
        out.append(Problem("placement", f"order(...) leaves out {', '.join(missing)}",
                           "name every axis of the mesh, innermost first"))
    return tuple(out)


def order(axes: tuple, names) -> RankMap:
    """The placement `order(names...)`: names innermost first, so `names[0]` varies fastest over the ranks.
    order(axes, reversed mesh order) is the identity. Raises ValueError on a bad order (order_problems)."""
    names = tuple(names)
    problems = order_problems(tuple(axes), names)
    if problems:
        raise ValueError("; ".join(p.message for p in problems))
    sizes, stride, strides = dict(axes), 1, {}
    for n in names:
        strides[n] = stride
        stride *= sizes[n]
    ranks = []
    for coord in itertools.product(*(range(n) for _, n in axes)):
        ranks.append(sum(c * strides[a] for c, (a, _) in zip(coord, axes)))
    return RankMap(tuple(axes), tuple(ranks))


def snake_order(axes: tuple, names) -> RankMap:
    """Like `order`, but each step of an axis reverses the order of the axes inside it (boustrophedon), so that
    consecutive ranks always differ along one axis by one: a block of consecutive ranks is then a compact region
    of the mesh even where it does not hold whole rings (a staircase cut). Raises ValueError like `order`."""
    names = tuple(names)
    problems = order_problems(tuple(axes), names)
    if problems:
        raise ValueError("; ".join(p.message for p in problems))
    sizes = dict(axes)
    at = {c: r for r, c in enumerate(snake([sizes[n] for n in names]))}
    position = [names.index(a) for a, _ in axes]
    ranks = [at[tuple(coord[position.index(k)] for k in range(len(names)))]
             for coord in itertools.product(*(range(n) for _, n in axes))]
    return RankMap(tuple(axes), tuple(ranks))


@dataclass(frozen=True)
class TierBytes:
    """The bytes one step moves over each level (names fastest first), in all and per group of `traffic`."""

    levels: tuple
    total: tuple
    by_group: tuple
    """((group, bytes per level), ...) in the order of the traffic dict."""

    def __getitem__(self, level: str) -> float:
        return self.total[self.levels.index(level)]

    def key(self) -> tuple:
        """The order auto minimises: the slowest level's bytes first."""
        return tuple(reversed(self.total))

    def slowest(self, group) -> str:
        """The slowest level a group's traffic crosses ('' when it moves nothing)."""
        per = dict(self.by_group)[group]
        return next((self.levels[i] for i in reversed(range(len(per))) if per[i]), "")


def ring_edges(rows: tuple):
    """(sender, receiver) of each step of a ring over each row: every rank to the next, the last to the first."""
    for row in rows:
        if len(row) > 1:
            yield from zip(row, row[1:] + row[:1])


def tier_bytes(rank_map: RankMap, topology, devices_per_node: int, traffic: dict, locate=locate) -> TierBytes:
    """The bytes over each level of `topology` for one step: each group of `traffic` (axis or tuple of axes ->
    bytes each rank sends per step) as rings over its rows under `rank_map`."""
    levels = topology.levels(devices_per_node)
    total, by_group = [0] * len(levels), []
    for group, per_rank in traffic.items():
        per = [0] * len(levels)
        for a, b in ring_edges(rank_map.rows(group)):
            per[topology.level(locate(a, devices_per_node), locate(b, devices_per_node), devices_per_node)] += \
                per_rank
        by_group.append((group, tuple(per)))
        total = [t + p for t, p in zip(total, per)]
    return TierBytes(levels, tuple(total), tuple(by_group))


def group_crossing(rank_map: RankMap, names, topology, devices_per_node: int, locate=locate):
    """The slowest crossing of any ring step of the groups folding `names` under `rank_map` (the step that sets
    the ring's pace, the least share among the slowest); None when the groups hold one rank each."""
    return topology.slowest_crossing(ring_edges(rank_map.rows(names)), devices_per_node, locate)


@dataclass(frozen=True)
class Choice:
    """What auto chose: the rank map, the axis order it started from (innermost first) and how it was laid out,
    the physical node of each virtual node, and the bytes per level."""

    rank_map: RankMap
    order: tuple
    snake: bool
    """Whether the order was laid out as a snake (snake_order) rather than plainly (order)."""
    nodes: tuple | None
    """The physical node of each virtual node of the order; None when the rank-level re-cut moved single ranks."""
    bytes: TierBytes
    refused: bool = False
    """Whether a placement with fewer bytes (by TierBytes.key) failed auto's `keep` and was passed over."""
    seconds: float | None = None
    """The time of the groups' collectives under this placement, where `seconds` broke a tie over it."""


def auto(axes: tuple, traffic: dict, topology, nodes: int, devices_per_node: int,
         exhaustive: int = 20000, seconds=None, keep=None) -> Choice:
    """The placement of the mesh `axes` with the least bytes over the slowest level (the module's docstring gives
    the algorithm); among placements with the same bytes there, the least `seconds(rank_map)` (the step-time
    model's time of the groups' collectives on the described network), then the least bytes over the next levels.
    `keep(rank_map)`: whether a placement may be chosen (the resolution's: torch's process groups must hold it);
    every axis order laid out plainly is a candidate, so with `keep` = rank_order.in_order one always is.
    `exhaustive` bounds the assignments an exact search may enumerate (0: the heuristics alone)."""
    axes = tuple(axes)
    if math.prod(n for _, n in axes) != nodes * devices_per_node:
        raise ValueError(f"the mesh's {math.prod(n for _, n in axes)} ranks are not {nodes} nodes of "
                         f"{devices_per_node}")
    big = [a for a, n in reversed(axes) if n > 1]
    ones = tuple(a for a, n in reversed(axes) if n == 1)
    found = []  # (key, order of discovery, start, names, snaked, node_map): the mesh's own order first
    for perm in itertools.permutations(big):
        names = (*perm, *ones)
        for layout in (order, snake_order):
            start = _laid(layout is snake_order, axes, names)
            graph, inside = _graph(start, traffic, topology, devices_per_node)
            maps = [_assign(graph, topology, nodes, devices_per_node, exhaustive)]
            if layout is order:
                maps[:0] = [tuple(range(nodes))]  # the order itself, on the nodes as they are numbered
                maps.append(_box_map(_extents(axes, names, devices_per_node), graph, topology, nodes,
                                     devices_per_node))
            for node_map in filter(None, maps):
                key = _key(graph, inside, node_map, topology, devices_per_node)
                found.append((key, len(found), start, names, layout is snake_order, node_map))
    found.sort(key=lambda f: f[:2])
    choices = (Choice(start.relocate(node_map, devices_per_node), names, snaked, node_map, None)
               for _, _, start, names, snaked, node_map in found)
    best = next(c for c in choices if keep is None or keep(c.rank_map))
    best = replace(best, bytes=tier_bytes(best.rank_map, topology, devices_per_node, traffic))
    refined = _refine(best.rank_map, traffic, topology, nodes, devices_per_node, exhaustive)
    if refined is not None and (keep is None or keep(refined)):
        result = tier_bytes(refined, topology, devices_per_node, traffic)
        if result.key() < best.bytes.key():
            best = Choice(refined, best.order, best.snake, None, result)
    refused = found[0][0] < best.bytes.key()  # before the tie-break, which may trade the lower levels' bytes
    if seconds is not None:
        best = _by_time(best, found, seconds, keep, topology, devices_per_node, traffic)
    return replace(best, refused=refused)


@functools.lru_cache(maxsize=256)
def _laid(snaked: bool, axes: tuple, names: tuple) -> RankMap:
    """`order` or `snake_order`, kept: auto lays out every order of the same few meshes again on each call."""
    return (snake_order if snaked else order)(axes, names)


def _by_time(best: Choice, found: list, seconds, keep, topology, per_node: int, traffic: dict) -> Choice:
    """Among the placements with `best`'s bytes over the slowest level (kept by `keep`), the one whose collectives
    take least time (`seconds`), then the least bytes over the next levels; `best` where it ties."""
    top = best.bytes.key()[0]
    tied, seen = [(seconds(best.rank_map), best.bytes.key(), -1, best)], {best.rank_map.ranks}
    for key, k, start, names, snaked, node_map in found:
        if key[0] != top:
            continue
        placed = start.relocate(node_map, per_node)
        if placed.ranks in seen or (keep is not None and not keep(placed)):
            continue
        seen.add(placed.ranks)
        tied.append((seconds(placed), key, k, Choice(placed, names, snaked, node_map, None)))
    time, _, _, chosen = min(tied, key=lambda t: t[:3])
    if chosen is not best:
        chosen = replace(chosen, bytes=tier_bytes(chosen.rank_map, topology, per_node, traffic))
    return replace(chosen, seconds=time)


def _refine(rank_map: RankMap, traffic: dict, topology, nodes: int, per_node: int, exhaustive: int):
    """The placement's ranks re-cut top-down at the level of single ranks, where a node may hold any set of
    coordinates (a staircase no axis order makes): at each level of the tree, the coordinates of a domain are
    partitioned among its children starting from where `rank_map` put them (exact when small, else Kernighan-Lin
    from there). None where the network is not a tree or the world exceeds REFINE_LIMIT ranks."""
    tree = _hierarchy(topology, nodes, per_node)
    world = rank_map.world
    if tree is None or world > REFINE_LIMIT:
        return None
    su = topology.scale_up_devices(per_node)
    levels = [tuple(level[r // per_node] for r in range(world)) for level in tree]
    levels.append(tuple(r // per_node for r in range(world)))
    if su < per_node:
        levels.append(tuple(r // su for r in range(world)))
    adj: dict = {c: {} for c in range(world)}
    identity = RankMap.identity(rank_map.axes)
    for group, per_rank in traffic.items():
        for u, v in ring_edges(identity.rows(group)):
            adj[u][v] = adj[u].get(v, 0) + per_rank
            adj[v][u] = adj[v].get(u, 0) + per_rank
    current, out = rank_map.ranks, [0] * world

    def split(coords: list, ranks: list, depth: int) -> None:
        if depth == len(levels):
            for c, r in zip(sorted(coords, key=lambda c: current[c]), sorted(ranks)):
                out[c] = r
            return
        children: dict = {}
        for r in sorted(ranks):
            children.setdefault(levels[depth][r], []).append(r)
        sizes = [len(g) for g in children.values()]
        parts = partition(coords, sizes, adj, exhaustive, _start(coords, children, levels[depth], current))
        for part, group in zip(parts, children.values()):
            split(part, group, depth + 1)

    split(list(range(world)), list(range(world)), 0)
    return RankMap(rank_map.axes, tuple(out))


def _graph(rank_map: RankMap, traffic: dict, topology, per_node: int) -> tuple:
    """The ring steps between different virtual nodes, ((node, local), (node, local)) -> bytes, and the bytes per
    level of the steps inside a node (which no node map moves)."""
    out: dict = {}
    inside = [0] * len(topology.levels(per_node))
    for group, per_rank in traffic.items():
        if not per_rank:
            continue
        steps = _kept_steps if rank_map.world <= TABLE_LIMIT else _steps
        across, within = steps(rank_map, group, topology, per_node)
        for key, count in across:
            out[key] = out.get(key, 0) + per_rank * count
        inside = [t + per_rank * n for t, n in zip(inside, within)]
    return out, tuple(inside)


def _steps(rank_map: RankMap, group, topology, per_node: int) -> tuple:
    """The ring steps of the groups folding `group` under `rank_map`, whatever their bytes: those between virtual
    nodes, (((node, local), (node, local)), count), and the count per level of those inside a node. Kept on meshes
    of up to TABLE_LIMIT ranks (`_kept_steps`): a search asks auto about the same few meshes under hundreds of
    plans' traffic."""
    across: dict = {}
    within = [0] * len(topology.levels(per_node))
    for a, b in ring_edges(rank_map.rows(group)):
        if a // per_node == b // per_node:
            within[topology.level((0, a % per_node), (0, b % per_node), per_node)] += 1
        else:
            key = (divmod(a, per_node), divmod(b, per_node))
            across[key] = across.get(key, 0) + 1
    return tuple(across.items()), tuple(within)


def _key(graph: dict, inside: tuple, node_map, topology, per_node: int) -> tuple:
    """The bytes per level, slowest first (TierBytes.key), of the steps in `graph` with the virtual nodes on
    `node_map`, plus those inside the nodes."""
    levels = list(inside)
    table = _level_table(topology, per_node) if len(node_map) * per_node <= TABLE_LIMIT else None
    for ((u, lu), (v, lv)), w in graph.items():
        a, b = (node_map[u], lu), (node_map[v], lv)
        if table is None:
            levels[topology.level(a, b, per_node)] += w
            continue
        level = table.get((a, b))
        if level is None:
            level = table[a, b] = topology.level(a, b, per_node)
        levels[level] += w
    return tuple(reversed(levels))


TABLE_LIMIT = 4096
"""Meshes of up to this many ranks keep the level of each pair of (node, local) they meet (`_level_table`) and
their groups' ring steps (`_kept_steps`): a search asks auto about the same few clusters hundreds of times."""
_kept_steps = functools.lru_cache(maxsize=512)(_steps)


@functools.lru_cache(maxsize=64)
def _level_table(topology, per_node: int) -> dict:
    """The levels met so far between (node, local) pairs on `topology`, filled by `_key`."""
    return {}


def _assign(graph: dict, topology, nodes: int, per_node: int, exhaustive: int) -> tuple:
    """The physical node of each virtual node."""
    tree = _hierarchy(topology, nodes, per_node)
    if tree is None:
        return _search_orders(graph, topology, nodes, per_node, exhaustive)
    adj: dict = {v: {} for v in range(nodes)}
    for ((u, _), (v, _)), w in graph.items():
        adj[u][v] = adj[u].get(v, 0) + w
        adj[v][u] = adj[v].get(u, 0) + w
    out = [0] * nodes
    _split(list(range(nodes)), list(range(nodes)), tree, adj, exhaustive, out)
    return tuple(out)


def _extents(axes: tuple, names: tuple, per_node: int):
    """The virtual nodes of `order(axes, names)` as a grid, first extent fastest: a node holds the innermost axes
    whole and a divisor f of the next, so the grid is (that axis / f, the axes outside it). None when a node's
    devices are not such a block."""
    sizes, inside = dict(axes), 1
    for i, name in enumerate(names):
        n = sizes[name]
        if per_node % inside == 0 and n % (per_node // inside) == 0 and per_node // inside <= n:
            rest = [n // (per_node // inside)] + [sizes[m] for m in names[i + 1:]]
            return tuple(e for e in rest if e > 1) or (1,)
        inside *= n
    return None


def _box_map(extents, graph: dict, topology, nodes: int, per_node: int):
    """The node map cutting the grid of virtual nodes into equal boxes at each level of a uniform tree (k children
    of a box: k = Π k_d, k_d dividing the box's extent d, the factorisation with the least bytes between the
    sub-boxes), the sub-boxes in grid order onto the children in node order: what splitting each axis into
    factors and ordering the factors would lay out (JAX's mesh_utils does the like on TPU slices). None where the
    nodes are not a grid or the tree not uniform."""
    tree = _hierarchy(topology, nodes, per_node)
    if extents is None or tree is None or math.prod(extents) != nodes:
        return None
    adj: dict = {v: {} for v in range(nodes)}
    for ((u, _), (v, _)), w in graph.items():
        adj[u][v] = adj[u].get(v, 0) + w
        adj[v][u] = adj[v].get(u, 0) + w
    out = [0] * nodes

    def members(box: tuple) -> list:
        return sorted(sum(c * math.prod(extents[:d]) for d, c in enumerate(coord))
                      for coord in itertools.product(*(range(a, a + e) for a, e in box)))

    def split(box: tuple, phys: list, depth: int) -> bool:
        if depth == len(tree):
            for v, p in zip(members(box), sorted(phys)):
                out[v] = p
            return True
        children: dict = {}
        for p in sorted(phys):
            children.setdefault(tree[depth][p], []).append(p)
        if len({len(c) for c in children.values()}) != 1:
            return False
        best = None
        for ks in _factorizations(len(children), [e for _, e in box]):
            subs = [tuple((a + i * (e // k), e // k) for (a, e), k, i in zip(box, ks, idx))
                    for idx in (tuple(reversed(t)) for t in itertools.product(*(range(k) for k in reversed(ks))))]
            c = cut([members(b) for b in subs], adj)
            if best is None or c < best[0]:
                best = (c, subs)
        return best is not None and all(split(b, child, depth + 1)
                                        for b, child in zip(best[1], children.values()))

    return tuple(out) if split(tuple((0, e) for e in extents), list(range(nodes)), 0) else None


def _factorizations(k: int, extents: list) -> list:
    """Every (k_0, k_1, ...) with product k and k_d dividing extents[d]."""
    if not extents:
        return [()] if k == 1 else []
    return [(d, *rest) for d in range(1, k + 1) if k % d == 0 and extents[0] % d == 0
            for rest in _factorizations(k // d, extents[1:])]


def _start(coords: list, children: dict, domain: tuple, current: tuple) -> list:
    """The coordinates of a domain split among its children as the current placement has them; those a re-cut
    above moved in from elsewhere (or past a child's size) fill the children with room, in order."""
    keys = list(children)
    parts, spill = [[] for _ in keys], []
    for c in coords:
        k = keys.index(domain[current[c]]) if domain[current[c]] in children else -1
        (parts[k] if k >= 0 and len(parts[k]) < len(children[keys[k]]) else spill).append(c)
    for part, key in zip(parts, keys):
        while len(part) < len(children[key]):
            part.append(spill.pop(0))
    return parts


def _hierarchy(topology, nodes: int, per_node: int):
    """The nested domains coarsest first (below the top), or None where the levels are not a tree of nodes."""
    domains = topology.domains(nodes)
    if domains is None:
        return None
    su = topology.scale_up_devices(per_node)
    levels = [*((tuple(n // (su // per_node) for n in range(nodes)),) if su > per_node else ()), *domains]
    for fine, coarse in zip(levels, levels[1:]):
        if len(set(zip(fine, coarse))) != len(set(fine)):
            return None  # a fine domain straddles two coarse ones
    return tuple(reversed(levels))


def _split(vnodes: list, phys: list, tree: tuple, adj: dict, exhaustive: int, out: list) -> None:
    """Cut `vnodes` into the children of the domain holding `phys` (tree[0] gives each node's child), recurse."""
    if not tree:
        for v, p in zip(vnodes, sorted(phys)):
            out[v] = p
        return
    children: dict = {}
    for p in sorted(phys):
        children.setdefault(tree[0][p], []).append(p)
    groups = list(children.values())
    parts = partition(vnodes, [len(g) for g in groups], adj, exhaustive)
    for part, group in zip(parts, groups):
        _split(part, group, tree[1:], adj, exhaustive, out)


def _search_orders(graph: dict, topology, nodes: int, per_node: int, exhaustive: int) -> tuple:
    """Node maps for a network that is not a tree: every permutation when nodes! ≤ exhaustive, else the
    topology's starting orders refined by pairwise swaps, by the lexicographic bytes per level."""
    nothing = (0,) * len(topology.levels(per_node))

    def key(node_map):
        return _key(graph, nothing, node_map, topology, per_node)

    if math.factorial(nodes) <= exhaustive:
        return min(itertools.permutations(range(nodes)), key=key)
    best = min(topology.node_orders(nodes), key=key)
    if nodes > KL_LIMIT:
        return tuple(best)
    best, score, improved = list(best), key(best), True
    while improved:
        improved = False
        for i, j in itertools.combinations(range(nodes), 2):
            best[i], best[j] = best[j], best[i]
            s = key(best)
            if s < score:
                score, improved = s, True
            else:
                best[i], best[j] = best[j], best[i]
    return tuple(best)
