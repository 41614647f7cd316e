"""The held-out split of a token file (`train { eval_split = F }`): one formula, read by the checker (compiler/check.py,
which knows the file's length from its sidecar or its size, and imports no torch) and by runtime/data.py.

The file's W = (tokens - 1) // seq_len windows of seq_len + 1 tokens are counted as training reads them; the last
H = floor(W · F) windows' worth of tokens, H · seq_len + 1 of them, is held out: evaluation reads those H windows in
order, and training reads only the tokens before them, cut into windows again. Not one token of the held-out tail
is in any training window (not even the one token where the training windows' last target would have touched it:
training may lose one window to that gap). The tail, not a keyed sample: a file written in document order keeps
whole documents on either side of the cut but the one it falls in, as Megatron-LM's contiguous `--split` does.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    train_windows: int
    """Windows training permutes each epoch: those of the tokens before the held-out tail."""
    eval_windows: int
    """Held-out windows, H."""
    eval_first: int
    """The first token of the held-out tail: eval window h starts at eval_first + h · seq_len."""


def split_windows(tokens: int, seq_len: int, fraction: float) -> Split:
    """The split of a file of `tokens` ids into training and held-out windows; `fraction` 0 holds nothing out. The
    caller checks that both parts are large enough (H ≥ the evaluation's sequences, training ≥ 1 window)."""
    windows = (tokens - 1) // seq_len
    if not fraction:
        return Split(train_windows=windows, eval_windows=0, eval_first=tokens)
    held = int(windows * fraction + 1e-9)  # floor, not fooled by 30 × 0.1 = 3.0000000000000004 or 2.9999...
    first = tokens - held * seq_len - 1
    return Split(train_windows=max(0, (first - 1) // seq_len), eval_windows=held, eval_first=first)
