"""The garbage collector's thresholds during a search (compiler/search/prune.py `search` runs under them)."""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def young_collections():
    """The collector's thresholds raised for a search: young cycles still collected, the whole heap (torch's and
    sympy's millions of objects from the imports, and the search's own caches) hardly ever. A search makes millions
    of short-lived objects (plans, keys, refusals), and the default thresholds walked the whole heap a dozen times
    in the 175B search: 9.4 s of CPU in `search` under them, 6.7 s under these (measured here: process time around
    `search(spec)`; gc.get_stats() counted 12 full collections against 4, those of the imports). What a search
    keeps alive is the same either way, and so are its results; the thresholds are put back after. Usable as a
    decorator (contextlib's context managers are)."""
    old = gc.get_threshold()
    gc.set_threshold(50_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)
