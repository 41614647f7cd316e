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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from runtime.choices import SCHEDULES  # one definition, shared with the compiler


class Action(NamedTuple):
    """One step of a rank's list: immutable, ordered and hashed by (stage, kind, mb). A named tuple, not a frozen
    dataclass: the compiler builds every rank's list of every pipeline shape a search times (hundreds of thousands
    of actions), and a frozen dataclass costs several times more to construct."""
    stage: int
    kind: str      # F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


@dataclass(frozen=True)
class Layout:
    p: int   # ranks along pp
    v: int   # stages per rank
    m: int   # micro-batches

    @property
    def stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        return stage % self.p


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


def compute_order(schedule: str, lay: Layout) -> dict[int, list[Action]]:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    if schedule != "interleaved-1f1b" and lay.v != 1:
        raise ValueError(f"{schedule} runs one stage per rank")
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved-1f1b": _interleaved,
             "zero-bubble": lambda lay, r: _one_f_one_b(lay, r, split=True)}[schedule]
    return {r: build(lay, r) for r in range(lay.p)}


def with_communication(order: dict[int, list[Action]], lay: Layout) -> dict[int, list[Action]]:
    """Insert the receives before and the sends after each compute action whose neighbour stage is elsewhere."""
    last = lay.stages - 1
    out: dict[int, list[Action]] = {}
    for r, actions in order.items():
        seq: list[Action] = []
        for a in actions:
            if a.kind == "F" and a.stage > 0 and lay.rank_of(a.stage - 1) != r:
                seq.append(Action(a.stage, "RECV_F", a.mb))
            if a.kind in ("B", "I") and a.stage < last and lay.rank_of(a.stage + 1) != r:
                seq.append(Action(a.stage, "RECV_B", a.mb))
            seq.append(a)
            if a.kind == "F" and a.stage < last and lay.rank_of(a.stage + 1) != r:
                seq.append(Action(a.stage, "SEND_F", a.mb))
            if a.kind in ("B", "I") and a.stage > 0 and lay.rank_of(a.stage - 1) != r:
                seq.append(Action(a.stage, "SEND_B", a.mb))
        out[r] = seq
    return out


def actions(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    lay = Layout(p, v, m)
    return with_communication(compute_order(schedule, lay), lay)


