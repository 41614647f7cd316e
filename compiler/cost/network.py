"""What one collective costs on the network as it is: per NCCL algorithm, and the one NCCL would pick, in nccl-tests'
terms (seconds, algorithm bandwidth, bus bandwidth).

`price(op, nbytes, group, device, fabric)` prices one collective of `nbytes` (nccl-tests' size S: the whole buffer,
as `-b`/`-e` give it) over a `GroupSpan` (its ranks, how many share a scale-up domain, the level its traffic crosses
and the share of its NIC it gets there). `span(cluster, ranks)` builds the GroupSpan of a rank list from the
Cluster: from its `topology` (compiler/layout/topology.py: the slowest level a ring over the ranks crosses) when the
Cluster has one, else from the two tiers of compiler/layout/cluster.py (inside a node, between nodes).
`price_on(cluster, op, nbytes, rows)` prices groups that run at the same moment (every group of one axis), each
at the share of its NIC left to it by the others' flows on the uplinks it crosses (compiler/layout/contention.py;
on a topology whose switches do not nest, a torus, the topology's share for every rank crossing at once).

Bus bandwidth (nccl-tests, doc/PERFORMANCE.md, "Summary"): busbw = algbw × factor, algbw = S / t, with factor
all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, all_to_all (n-1)/n, broadcast and reduce 1; send/recv
is point-to-point, factor 1 (nccl-tests src/sendrecv.cu). The all_reduce factor is kept for NVLS too, as
nccl-tests does (nccl-tests#366: NVLS busbw is the ring bandwidth that would give the same time).

The algorithms (NCCL 2.17 or later; NVLS, NVLink SHARP, came with NCCL 2.17 for Hopper and NVSwitch 3):
    ring       every op. Inside one scale-up domain a rank sends factor·S at the domain's bandwidth. Across domains
               of k of the group's ranks each, the domain's traffic leaves it once per ring over k NICs (k rings
               side by side, one NIC each, as NCCL lays its channels), and each rank still sends (k-1)/k of its
               bytes over the scale-up links: busbw = min(k · NIC · share, scale-up · k/(k-1)). On 8 H100 and
               8 × 400G NDR NICs per node that is 8 × 47 = 376 GB/s, the figure NVIDIA gives for two nodes
               (nccl-tests#290, #309).
    tree       all_reduce across domains: NCCL's double binary tree between domains, a chain inside each. Each
               byte goes up and down the chain (a rank sends 2·S over scale-up: algbw ≤ scale-up / 2); between
               domains a domain sends S over its k NICs on two domains (each is the root of one tree, the leaf of
               the other) and 2·S on more (an interior node sends half the data up and to two children). So a
               2-node tree beats the NICs' bound and loses to the ring at scale, as NVIDIA says (nccl#812,
               nccl-tests#196).
    nvls       all_reduce inside one NVLink domain of a device with NVLink SHARP (h100, h200, h800, b200, gb200):
               the switch reduces; a rank moves S·(1 + 1/n) (multimem load-reduce of its slice, store to all), at
               the NVLS fraction of the NVLink figure (below): algbw = NVLink · eff / (1 + 1/n).
The chosen algorithm is the fastest of those listed (NCCL's tuner picks by its own time model: the choice here is
ours, made the same way). Not modelled: NCCL's protocols (LL, LL128, Simple) and channel counts, which set the
latency regime (a per-step latency from the device's figures stands for them: small messages are priced roughly,
large ones, where bandwidth rules, well); NVLSTree across nodes (NCCL 2.18), CollNet / IB SHARP and PAT (NCCL
2.23, one rank per node) are not offered; contention counts only the groups priced together (`price_on`'s rows:
one axis's groups), not other collectives that overlap them in time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.layout.contention import contention
from compiler.layout.placement import ring_edges

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")

# Fraction of a device's NVLink figure (compiler/layout/devices.py intra_node_gbps, one direction) that NCCL's
# ring reaches (busbw of ring algorithms, any op), and NVLS's (the S·(1 + 1/n) a rank moves per all_reduce).
# - H100/H200/H800 ring: "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective
#   NVLink bandwidth of 370GB/s" (sjeaugey, NVIDIA, nccl-tests#212; again nccl#1442): 370 / 450 = 0.822.
# - H100 NVLS: 8 GPUs reach busbw ~480, algbw ~275 (nccl-tests#212, nccl#2140): 275 × (1 + 1/8) / 450 = 0.6875.
#   The (1 + 1/n) form then gives algbw 258, 265, 270, 275 on 5-8 GPUs, the figures measured in nccl#1455; on 2-4
#   the ring is faster, as measured there.
# - H800: devices.py's 160 GB/s is what DeepSeek-V3's report plans with (§3.2.1), already a reached figure: ring
#   1.0. NVLS: 8 H800 reached busbw 215 GB/s (a user's run, nccl#1374): algbw 122.9 × 9/8 / 160 = 0.864.
# - B200/GB200 (NVLink 5, 900 GB/s one way): B300's 8-GPU figures in nccl#2140 (ring busbw 695, NVLS algbw 483):
#   695 / 900 = 0.772, 483 × 9/8 / 900 = 0.604. B200 shares B300's NVLink; not measured on B200 itself.
# - A100: ~230 GB/s busbw on a DGX A100 (compiler/layout/devices.py's note; nccl-tests#175: 232.5): 230/300 = 0.77.
# - other kinds (cpu, a device given by its figures): 1.0, the figure taken as reached.
NVLINK = {"a100": (0.77, 0.0), "h100": (0.822, 0.6875), "h200": (0.822, 0.6875), "h800": (1.0, 0.864),
          "b200": (0.772, 0.604), "gb200": (0.772, 0.604)}

# Fraction of the NIC's line rate (devices.py inter_node_gbps) NCCL reaches per NIC.
# - ib: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (AddyLaddy, NVIDIA, nccl-tests#290): 47 / 50 = 0.94;
#   NVIDIA's older figures agree (24 GB/s per 200G HDR NIC, 12 per 100G: sjeaugey, nccl-tests#119 and #29).
# - roce: no NVIDIA figure separates it; the ib figure times the ratio of the wire's payload share, RoCEv2 against
#   InfiniBand at a 4096-byte MTU: per packet IB adds LRH 8 + BTH 12 + ICRC 4 + VCRC 2 = 26 bytes; RoCEv2 adds
#   Ethernet 14 + FCS 4 + preamble and gap 20 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 = 82 bytes (IBTA, InfiniBand
#   Architecture Specification vol. 1 and its RoCEv2 annex A17): (4096/4178) / (4096/4122) = 0.9866, so 0.927.
#   Congestion control's cost under load is not in it. Fit a measured figure with `scalec network --measured`.
FABRICS = {"ib": 0.94, "roce": 0.927}
NVLS_DEVICES = ("h100", "h200", "h800", "b200", "gb200")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw for `op` on `n` ranks (doc/PERFORMANCE.md; send/recv: src/sendrecv.cu)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"no bus bandwidth convention for {op}")


@dataclass(frozen=True)
class GroupSpan:
    """How one group's ranks sit on the machines."""

    ranks: int
    per_domain: int
    """The group's ranks in a scale-up domain (NVLink: a node, or `scale_up` devices); the fewest in any, where the
    ranks are spread unevenly: that domain's NICs carry as much as any other's."""
    tier: str
    """The slowest level a ring over the ranks crosses: a topology level (`scale_up`, `leaf`, `top`, ...) or, with no
    topology, `intra_node` / `inter_node`."""
    share: float = 1.0
    """The fraction of its NIC's bandwidth each of the group's flows gets at its slowest uplink, with the groups
    priced beside it (compiler/layout/contention.py); on a torus, the topology's share when every rank crosses."""
    domains: int = 1
    """The scale-up domains the ranks are in."""
    most: int = 0
    """The most of the group's ranks in one domain (0: `per_domain`, an even spread)."""
    sharing: int = 1
    """The groups whose flows leave by the uplink that sets `share`, this one included (1: alone, or no uplink
    crossed, or no topology written: a flat network); on a torus, every group priced with it."""

    @property
    def crosses(self) -> bool:
        return self.domains > 1


@dataclass(frozen=True)
class Algorithm:
    name: str
    seconds: float
    algbw_gbps: float
    busbw_gbps: float
    tier: str


@dataclass(frozen=True)
class Price:
    """Every algorithm NCCL could use for one collective, and the one it would pick (the fastest)."""

    op: str
    ranks: int
    bytes: int
    algorithms: tuple
    chosen: str
    group: GroupSpan

    def json(self) -> dict:
        return {"op": self.op, "ranks": self.ranks, "bytes": self.bytes,
                "algorithms": [{"name": a.name, "seconds": a.seconds, "algbw_gbps": a.algbw_gbps,
                                "busbw_gbps": a.busbw_gbps, "tier": a.tier} for a in self.algorithms],
                "chosen": self.chosen, "sharing": self.group.sharing}


def fabric_efficiency(fabric) -> float:
    """The NIC efficiency of `fabric`: None (no fabric written: ib's), `ib` or `roce`, or an object with a `kind`
    (or `name`) and, optionally, its own `efficiency` (a measured figure written in the file)."""
    if fabric is None:
        return FABRICS["ib"]
    own = getattr(fabric, "efficiency", None)
    if own is not None:
        return float(own)
    kind = fabric if isinstance(fabric, str) else getattr(fabric, "kind", None) or getattr(fabric, "name", None)
    if kind not in FABRICS:
        raise ValueError(f"unknown fabric {kind!r}: known {', '.join(FABRICS)}")
    return FABRICS[kind]


def span(cluster, ranks: tuple, contended=None, sharing: int = 1) -> GroupSpan:
    """The GroupSpan of `ranks` (a ring in that order) on `cluster`: its topology's slowest crossing when it has one
    (`getattr(cluster, "topology", None)`), else the Cluster's two tiers. `contended`: the group's
    compiler/layout/contention.py Contention among the groups that run with it (`price_on` gives it); None: the
    topology's share for every rank crossing at once, said to be shared by `sharing` groups."""
    per_node = cluster.devices_per_node
    topology = getattr(cluster, "topology", None)
    su = per_node if topology is None else topology.scale_up_devices(per_node)
    counts = {}
    for r in ranks:
        counts[r // su] = counts.get(r // su, 0) + 1
    fewest, most = min(counts.values()), max(counts.values())
    spread = dict(per_domain=fewest, domains=len(counts), most=most if most != fewest else 0)
    if topology is None:
        return GroupSpan(len(ranks), tier="inter_node" if len(counts) > 1 else "intra_node", **spread)
    worst = topology.slowest_crossing(ring_edges((tuple(ranks),)), per_node)  # the step that sets the ring's pace
    if worst is None:
        return GroupSpan(len(ranks), tier="scale_up", **spread)
    share, sharing = (worst.share, sharing) if contended is None else (contended.share, contended.sharing)
    return GroupSpan(len(ranks), tier=worst.name, share=share, sharing=sharing, **spread)


def contended(cluster, rows: tuple) -> tuple:
    """Each row's Contention among all of `rows` run at once (compiler/layout/contention.py), or None for each
    where the cluster has no topology (a flat network: nothing shared) or its switches do not nest (a torus: the
    topology's own share, every rank crossing at once)."""
    topology = getattr(cluster, "topology", None)
    got = None if topology is None else contention(topology, rows, cluster.nodes, cluster.devices_per_node)
    return got if got is not None else (None,) * len(rows)


def price(op: str, nbytes: int, group: GroupSpan, device, fabric=None) -> Price:
    """Every algorithm for `op` of `nbytes` over `group` on `device` (compiler.spec.Device: its NVLink and NIC
    figures, latencies and kind), NICs at `fabric`'s efficiency (fabric_efficiency), and the fastest."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(OPS)}")
    n = group.ranks
    ring_eff, nvls_eff = NVLINK.get(device.kind, (1.0, 0.0))
    up = device.intra_node_gbps * ring_eff * 1e9
    net = device.inter_node_gbps * fabric_efficiency(fabric) * group.share * 1e9
    a_up, a_net = device.intra_node_latency_us * 1e-6, device.inter_node_latency_us * 1e-6
    alpha = a_net if group.crosses else a_up
    k, most = group.per_domain, group.most or group.per_domain
    algos = []

    def add(name: str, seconds: float) -> None:
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        algos.append(Algorithm(name, seconds, algbw, algbw * bus_factor(op, n), group.tier))

    if n <= 1 or nbytes <= 0:
        add("ring", 0.0)
        return Price(op, n, nbytes, tuple(algos), "ring", group)
    if op == "send_recv":  # each rank sends S to the next: the slowest pair sets the pace
        add("p2p", alpha + nbytes / (net if group.crosses else up))
    elif op == "all_to_all":  # each rank sends S/n to every other: (k-1)/n of S inside its domain, (n-k)/n out
        inside = nbytes * (most - 1) / n / up
        outside = nbytes * (n - k) / n / net if group.crosses else 0.0
        add("p2p", (n - 1) * alpha + max(inside, outside))
    else:
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        busbw = up if not group.crosses else min(k * net, up * most / (most - 1) if most > 1 else math.inf)
        add("ring", steps * alpha + bus_factor(op, n) * nbytes / busbw)
        if op == "all_reduce" and group.crosses:
            m = group.domains
            algbw = min(k * net / (1 if m == 2 else 2), up / 2 if most > 1 else math.inf)
            add("tree", 2 * math.ceil(math.log2(m)) * a_net + 2 * (most - 1) * a_up + nbytes / algbw)
        if op == "all_reduce" and not group.crosses and device.kind in NVLS_DEVICES and nvls_eff:
            add("nvls", 2 * a_up + nbytes * (1 + 1 / n) / (device.intra_node_gbps * nvls_eff * 1e9))
    chosen = min(algos, key=lambda a: a.seconds).name
    return Price(op, n, nbytes, tuple(algos), chosen, group)


# -- sizes --------------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_size(text: str) -> int:
    """Bytes of `text`: a number and a unit, `1GB` (10^9), `1GiB` or nccl-tests' `1G` (2^30), `256MB`, `4096`."""
    t = text.strip().lower()
    i = len(t)
    while i and t[i - 1].isalpha():
        i -= 1
    number, unit = t[:i], t[i:]
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {text[i:]!r} in size {text!r}: B, KB, MB, GB, TB (powers of 10), "
                         "KiB, MiB, GiB, TiB or nccl-tests' K, M, G, T (powers of 2)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"size {text!r} is not a number and a unit (e.g. 1GB, 256MiB, 4096)") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"size {text!r} must be a positive number of bytes")
    return max(1, int(round(value * _UNITS[unit])))


# -- a file's cluster ---------------------------------------------------------------------------------------------


def rows_of(axes: tuple, world: int, ranks: int | None = None, group: str | None = None) -> tuple:
    """(rank rows, what they are) for `scalec network`: the first `ranks` ranks, every group named `group` of the
    mesh `axes` (compiler/layout/groups.py: an axis, or a folded group such as `dp×cp`; ranks in mesh order, the
    placement being the identity), or, with neither, all `world` ranks."""
    from compiler.layout import groups as G
    if group is not None:
        found = {g.name: g for g in G.groups(axes)}
        alias = group.replace("x", "×").replace("*", "×")
        g = found.get(group) or found.get(alias)
        if g is None:
            raise ValueError(f"no group `{group}` in the mesh {' × '.join(f'{a} {n}' for a, n in axes)}: "
                             f"its groups are {', '.join(found)}")
        _at_least_two(g.rows(), f"the {g.name} groups hold one rank each")
        return g.rows(), f"each {g.name} group"
    if ranks is not None:
        if ranks > world:
            raise ValueError(f"--ranks {ranks} is more than the cluster's {world} devices")
        _at_least_two(((0,) * ranks,), f"--ranks {ranks}")
        return (tuple(range(ranks)),), f"ranks 0-{ranks - 1}"
    _at_least_two(((0,) * world,), "the cluster has one device")
    return (tuple(range(world)),), "every rank"


def _at_least_two(rows: tuple, where: str) -> None:
    if len(rows[0]) < 2:
        raise ValueError(f"{where}: a collective over one rank moves nothing")


def price_on(cluster, op: str, nbytes: int, rows: tuple) -> Price:
    """The slowest of the groups `rows` (each a rank list) for `op` of `nbytes` on `cluster` (its device, its
    `fabric` and `topology` when it has them), all of them running at once: each at the share of its NIC the
    others' flows leave it on the uplinks it crosses (`contended`). A torus's share is its own (every rank
    crossing), said to be shared by every row."""
    fabric = getattr(cluster, "fabric", None)
    among = contended(cluster, rows)
    alone = len(rows) if getattr(cluster, "topology", None) is not None else 1
    worst, seen = None, {}
    for row, c in zip(rows, among):
        g = span(cluster, tuple(row), c, alone)
        if g in seen:
            continue
        seen[g] = p = price(op, nbytes, g, cluster.device, fabric)
        best = min(a.seconds for a in p.algorithms)
        if worst is None or best > min(a.seconds for a in worst.algorithms):
            worst = p
    return worst


def fabric_name(fabric) -> str:
    if fabric is None:
        return "ib (none written: InfiniBand assumed)"
    return fabric if isinstance(fabric, str) else str(getattr(fabric, "kind", None) or getattr(fabric, "name", fabric))


# -- a measurement: nccl-tests' output --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fabric:
    """A fabric with its own NIC efficiency (a measured figure)."""

    kind: str
    efficiency: float


@dataclass(frozen=True)
class Measured:
    """One row of nccl-tests' table: the size S (bytes), its out-of-place time (s), algbw and busbw (GB/s)."""

    bytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float


def parse_nccl_tests(text: str) -> tuple:
    """(ranks, rows) of an nccl-tests run's output (all_reduce_perf and its siblings): the ranks its `#  Rank  N`
    lines list (0 when it prints none), and each row of its table, read from the end of the line (time, algbw,
    busbw, #wrong out of place, then the same in place), so that the columns before (count, type, redop, root)
    may be absent. A file with no such row is refused (ValueError)."""
    ranks, rows = 0, []
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "#":
            ranks += len(words) > 2 and words[1] == "Rank" and words[2].isdigit()
            continue
        if not words[0].isdigit() or len(words) < 9:
            continue
        try:
            time_us, algbw, busbw = float(words[-8]), float(words[-7]), float(words[-6])
        except ValueError:
            continue
        if time_us > 0 and int(words[0]) > 0:
            rows.append(Measured(int(words[0]), time_us * 1e-6, algbw, busbw))
    if not rows:
        raise ValueError("no nccl-tests table found (rows of size, count, type, ..., time, algbw, busbw, #wrong, "
                         "twice): give the output of all_reduce_perf or a sibling")
    return ranks, tuple(rows)


def fit_efficiency(cluster, op: str, rows: tuple, group_rows: tuple) -> tuple:
    """(efficiency, rows used): the fabric's NIC efficiency at which the model's ring (the one algorithm of
    all_to_all and send/recv) takes the measured time for the largest measured sizes (those of at least an eighth of
    the largest: the bandwidth regime), the mean log ratio zero, found by bisection on (0, 1] (the ring's time falls
    as the efficiency grows). The ring, because it is what the NICs pace: NVIDIA benchmarks a fabric with
    NCCL_ALGO=Ring (nccl-tests#290, #309; nccl#812), a tree on two nodes being paced by NVLink as much as by the
    NICs. Refused (ValueError) where the NICs do not set the pace (ranks inside one scale-up domain) or where no
    efficiency up to 1 is fast enough (NCCL ran a tree or NVLSTree: measure with NCCL_ALGO=Ring)."""
    largest = max(r.bytes for r in rows)
    used = tuple(r for r in rows if r.bytes * 8 >= largest)

    def error(e: float) -> float:
        on = with_efficiency(cluster, e)
        return sum(math.log(price_on(on, op, r.bytes, group_rows).algorithms[0].seconds / r.seconds)
                   for r in used) / len(used)

    if abs(error(0.5) - error(1.0)) < 1e-9:
        raise ValueError("these ranks stay inside one scale-up domain: their times say nothing of the fabric's NICs "
                         "(measure across nodes)")
    if error(1.0) > 0:
        raise ValueError("the measurement is faster than the model's ring at any NIC efficiency up to 1: NCCL ran a "
                         "tree or NVLSTree (on two nodes it does); measure with NCCL_ALGO=Ring")
    lo, hi = 1e-3, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if error(mid) > 0 else (lo, mid)
    return (lo + hi) / 2, used


class _WithFabric:
    """A Cluster seen with another fabric (the Cluster's own class may not have the field yet)."""

    def __init__(self, cluster, fabric):
        self._cluster, self.fabric = cluster, fabric

    def __getattr__(self, name):
        return getattr(self._cluster, name)



def with_efficiency(cluster, efficiency: float):
    """`cluster` with its fabric's NIC efficiency replaced by `efficiency` (a measured figure), its kind kept."""
    kind = fabric_name(getattr(cluster, "fabric", None)).split()[0]
    return _WithFabric(cluster, Fabric(kind, efficiency))
