"""What the layer builders (each kind's `build`) share beyond compiler/model.py's Segment: a runtime function kept as
one call in the traced graph.

The tracer (compiler/trace.py) keeps the functions the op records mark `wrapped` whole where compiler/model.py names
them as its globals (torch.fx's autowrap patches a module's globals). A builder imports the runtime inside its
function (the checker reads its module, torch-free), so its closures hold the functions themselves: it wraps them
with `kept_whole`, which records the same call node torch.fx's autowrap would.
"""
from __future__ import annotations

import functools


@functools.cache
def kept_whole(fn):
    """`fn`, called as is on tensors, and recorded as one `call_function` node of `fn` when an argument is being
    traced (a torch.fx Proxy): its insides (data-dependent routing, a fused kernel) are never traced."""
    from torch import fx

    @functools.wraps(fn)
    def call(*args, **kwargs):
        proxies = []
        fx.node.map_aggregate((args, kwargs), lambda a: proxies.append(a) if isinstance(a, fx.Proxy) else a)
        if not proxies:
            return fn(*args, **kwargs)
        out = proxies[0].tracer.create_proxy("call_function", fn, args, kwargs)
        out.node.meta["is_wrapped"] = True  # as torch.fx's own wrapper marks it (the graph's code declares it)
        return out
    return call
