"""Pipeline schedules as per-rank action lists: what each pp rank computes, in order.

The runtime executes these lists (runtime/pipeline.py) and the compiler proves them (compiler/schedule.py checks
that every receive has its send and no rank waits forever, and prints them), so what is checked is what runs.
Actions print as torch.distributed.pipelining does: `2F0` is stage 2, forward, micro-batch 0; B a full backward,
I the input-gradient half and W the weight-gradient half of a split backward (zero-bubble); SEND_F/RECV_F and
SEND_B/RECV_B move activations and gradients between ranks.

Schedules (p ranks, v stages per rank, m micro-batches):
  gpipe             all forwards, then all backwards (Huang et al. 2019)
  1f1b              p - r - 1 warm-up forwards on rank r, then one forward one backward (Narayanan et al. 2019)
  interleaved-1f1b  v stages per rank, stage s on rank s mod p; micro-batches in groups of p (Narayanan 2021)
  zero-bubble       ZB-H1 (Qi et al. 2024): 1F1B with B split into I and W, rank r deferring its W by r backward
                    slots so they fill the end of the pipeline: bubble (p-1)(F+I-W) instead of (p-1)(F+I+W)
  dualpipev         DeepSeek's DualPipeV (DeepSeek-V3 report §3.2.1; github.com/deepseek-ai/DualPipe, dualpipev.py;
                    torch's ScheduleDualPipeV): two stages per rank folded in a V (rank r holds stages r and 2p-1-r),
                    the forward of one micro-batch overlapped with the backward of another (`OVERLAP_F_B`), so that
                    one's communication (the experts' all-to-all) hides behind the other's compute

An overlapped pair is one action, `Action(-1, "OVERLAP_F_B", -1, (forward, backward))`, printed as torch prints it,
`(0F3;3B1)OVERLAP_F_B`; its sub-actions run in that order where nothing overlaps them (CPU), side by side on two
streams on a GPU (runtime/pipeline.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from runtime.choices import SCHEDULES, V_SHAPED  # one definition, shared with the compiler


class Action(NamedTuple):
    """One step of a rank's list: immutable, ordered and hashed by (stage, kind, mb). A named tuple, not a frozen
    dataclass: the compiler builds every rank's list of every pipeline shape a search times (hundreds of thousands
    of actions), and a frozen dataclass costs several times more to construct."""
    stage: int
    kind: str      # F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, OVERLAP_F_B
    mb: int
    sub: tuple | None = None  # OVERLAP_F_B's (forward, backward); stage and mb are then -1

    def __str__(self) -> str:
        if self.sub is not None:
            return f"({';'.join(map(str, self.sub))}){self.kind}"
        return f"{self.stage}{self.kind}{self.mb}"

    @property
    def parts(self) -> tuple:
        """The computations this action stands for, in the order they run: an overlap's sub-actions, else itself."""
        return self.sub if self.sub is not None else (self,)


@dataclass(frozen=True)
class Layout:
    """Where a pipeline's stages live and how many micro-batches flow through them: the one definition of the
    stage -> rank mapping, read by the schedules, the checker, the runtime's stages and everything named by stage."""
    p: int   # ranks along pp
    v: int   # stages per rank
    m: int   # micro-batches
    style: str = "loop"
    """"loop": stage s on rank s mod p (chunk c of rank r is stage c·p + r); "v": the stages fold back and forth,
    chunk c of rank r is stage c·p + r for even c and c·p + p-1-r for odd c (with v = 2, rank r holds stages r and
    2p-1-r, so the first and the last stage are both on rank 0): torch's generate_stage_to_rank_mapping styles."""

    def __post_init__(self):
        if self.style not in ("loop", "v"):
            raise ValueError(f"stage layout style must be 'loop' or 'v', not {self.style!r}")

    @classmethod
    def of(cls, schedule: str, p: int, v: int, m: int) -> "Layout":
        """The layout a schedule runs on: V-shaped for the schedules in choices.V_SHAPED, looped otherwise."""
        return cls(p, v, m, "v" if schedule in V_SHAPED else "loop")

    @property
    def stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        chunk, i = divmod(stage, self.p)
        return self.p - 1 - i if self.style == "v" and chunk % 2 else i

    def stages_of(self, rank: int) -> list[int]:
        """The stages rank `rank` holds, in chunk order (its first chunk's stage first)."""
        return [c * self.p + (self.p - 1 - rank if self.style == "v" and c % 2 else rank) for c in range(self.v)]


# -- compute orders -----------------------------------------------------------------------------------------------


def _gpipe(lay: Layout, r: int) -> list[Action]:
    return [Action(r, "F", k) for k in range(lay.m)] + [Action(r, "B", k) for k in range(lay.m)]


def _one_f_one_b(lay: Layout, r: int, split: bool = False) -> list[Action]:
    p, m = lay.p, lay.m
    warm = min(m, p - 1 - r)
    out = [Action(r, "F", k) for k in range(warm)]
    backward = 0
    delay = r if split else 0  # ZB-H1: the W of backward j runs after backward j + r
    pending_w: list[int] = []

    def do_backward():
        nonlocal backward
        if split:
            out.append(Action(r, "I", backward))
            pending_w.append(backward)
            if len(pending_w) > delay:
                out.append(Action(r, "W", pending_w.pop(0)))
        else:
            out.append(Action(r, "B", backward))
        backward += 1

    for k in range(warm, m):
        out.append(Action(r, "F", k))
        do_backward()
    while backward < m:
        do_backward()
    out += [Action(r, "W", j) for j in pending_w]
    return out


def _interleaved(lay: Layout, r: int) -> list[Action]:
    """Megatron-LM's interleaved 1F1B for rank r: model chunk c of rank r is stage c·p + r."""
    p, v, m = lay.p, lay.v, lay.m
    total = m * v

    def fwd(k: int) -> Action:
        chunk = (k // p) % v
        return Action(chunk * p + r, "F", (k // (p * v)) * p + k % p)

    def bwd(k: int) -> Action:
        chunk = v - 1 - (k // p) % v
        return Action(chunk * p + r, "B", (k // (p * v)) * p + k % p)

    warm = min(total, (p - r - 1) * 2 + (v - 1) * p)
    out = [fwd(k) for k in range(warm)]
    for i in range(total - warm):
        out += [fwd(warm + i), bwd(i)]
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def _dualpipev(lay: Layout, r: int) -> list[Action]:
    """DeepSeek's DualPipeV for rank r, in the phases DeepSeek's dualpipev.py names them, as torch 2.13's
    ScheduleDualPipeV orders them. Rank r holds stage `a = r` (chunk 0, on the way down the V) and `b = 2p-1-r`
    (chunk 1, on the way back), and each micro-batch passes a, later b, then the backward of b, later of a. F0/B0
    are chunk 0's forward and backward, F1/B1 chunk 1's; micro-batches are taken in order per stage. B is a full
    backward; I and W its input and weight halves (zero-bubble), each W queued when its I runs and taken oldest
    first. m >= 2p.
      1 F0          2(p-1-r) forwards of chunk 0: fill the way down
      2 F0F1        r+1 pairs: the first micro-batches turn at the V's bottom
      3 I1W1F1      p-1-r times: chunk 1's backward split, its W at once, then a forward of chunk 1
      4 F0B1-F1B0   m-2p+r+1 times the steady state: a chunk-0 forward overlapped with a chunk-1 backward, then a
                    chunk-1 forward overlapped with a chunk-0 backward (rank p-1, whose two stages meet at the V's
                    bottom, runs its first F0 and B1 one after the other, not overlapped)
      5 B1-F1B0     p-1-r times: a chunk-1 backward, then a chunk-1 forward overlapped with a chunk-0 backward
      6 B1B0        r+1 pairs of backwards, split into I (W deferred) from the middle pair on: an odd rank's from
                    its B1, an even rank's from its B0, so the deferred W fill the drain's bubbles
      7 W0B0        p-1-r times: a deferred W, then a chunk-0 input backward
      8 W0          r+1 deferred W: the queue emptied"""
    p, m = lay.p, lay.m
    a, b = lay.stages_of(r)
    fwd = {a: 0, b: 0}   # next micro-batch per stage
    bwd = {a: 0, b: 0}
    deferred: list[Action] = []
    out: list[Action] = []

    def forward(st: int) -> Action:
        fwd[st] += 1
        return Action(st, "F", fwd[st] - 1)

    def backward(st: int, split: bool = False) -> Action:
        bwd[st] += 1
        act = Action(st, "I" if split else "B", bwd[st] - 1)
        if split:
            deferred.append(Action(st, "W", act.mb))
        return act

    def overlap(f_st: int, b_st: int) -> None:
        out.append(Action(-1, "OVERLAP_F_B", -1, (forward(f_st), backward(b_st))))

    def weight() -> None:
        if deferred:
            out.append(deferred.pop(0))

    out += [forward(a) for _ in range(2 * (p - 1 - r))]                      # 1
    for _ in range(r + 1):                                                   # 2
        out += [forward(a), forward(b)]
    for _ in range(p - 1 - r):                                               # 3
        out.append(backward(b, split=True))
        weight()
        out.append(forward(b))
    for i in range(m - 2 * p + r + 1):                                       # 4
        if i == 0 and r == p - 1:
            out += [forward(a), backward(b)]
        else:
            overlap(a, b)
        overlap(b, a)
    for _ in range(p - 1 - r):                                               # 5
        out.append(backward(b))
        overlap(b, a)
    middle = (r + 1) // 2                                                    # 6
    for i in range(r + 1):
        out.append(backward(b, split=i > middle or (i == middle and r % 2 == 1)))
        out.append(backward(a, split=i >= middle))
    for _ in range(p - 1 - r):                                               # 7
        weight()
        out.append(backward(a, split=True))
    for _ in range(r + 1):                                                   # 8
        weight()
    return out


def compute_order(schedule: str, lay: Layout) -> dict[int, list[Action]]:
    """Every rank's compute actions. The stages are where the schedule puts them (`Layout.of`: a V for dualpipev)
    whatever `lay.style` says; `verify` with a layout of the other style refuses the lists (a stage computed on a
    rank it does not live on)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    lay = Layout.of(schedule, lay.p, lay.v, lay.m)
    if schedule == "dualpipev":
        if lay.v != 2:
            raise ValueError("dualpipev runs two stages per rank")
        if lay.m < 2 * lay.p:
            raise ValueError(f"dualpipev needs at least 2·pp = {2 * lay.p} micro-batches, not {lay.m}")
    elif schedule != "interleaved-1f1b" and lay.v != 1:
        raise ValueError(f"{schedule} runs one stage per rank")
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved-1f1b": _interleaved,
             "zero-bubble": lambda lay, r: _one_f_one_b(lay, r, split=True), "dualpipev": _dualpipev}[schedule]
    return {r: build(lay, r) for r in range(lay.p)}


def with_communication(order: dict[int, list[Action]], lay: Layout) -> dict[int, list[Action]]:
    """Insert the receives before and the sends after each compute action whose neighbour stage is elsewhere (an
    overlap's: its sub-actions' receives before it, their sends after it, in the sub-actions' order)."""
    last = lay.stages - 1
    out: dict[int, list[Action]] = {}
    for r, actions in order.items():
        seq: list[Action] = []
        for a in actions:
            for x in a.parts:
                if x.kind == "F" and x.stage > 0 and lay.rank_of(x.stage - 1) != r:
                    seq.append(Action(x.stage, "RECV_F", x.mb))
                if x.kind in ("B", "I") and x.stage < last and lay.rank_of(x.stage + 1) != r:
                    seq.append(Action(x.stage, "RECV_B", x.mb))
            seq.append(a)
            for x in a.parts:
                if x.kind == "F" and x.stage < last and lay.rank_of(x.stage + 1) != r:
                    seq.append(Action(x.stage, "SEND_F", x.mb))
                if x.kind in ("B", "I") and x.stage > 0 and lay.rank_of(x.stage - 1) != r:
                    seq.append(Action(x.stage, "SEND_B", x.mb))
        out[r] = seq
    return out


def actions(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    lay = Layout.of(schedule, p, v, m)
    return with_communication(compute_order(schedule, lay), lay)


