"""The layer vocabulary: one module per layer kind, each holding everything the compiler knows of that kind but its
op records (compiler/ops/):

  SCHEMA     its arguments as `.scale` writes them: name -> binder.Param (type, default, doc), per keyword
  SPEC       its resolved class (frozen dataclass; compiler/spec.py imports them for the Spec's readers)
  resolve    (checker, statement, bound arguments, keyword) -> the spec layer, with its own diagnostics
  TP_ROLES   its leaves' tensor-parallel roles, by the suffix of the leaf's name: `column` (split by output),
             `row` (split by input, then summed), `vocab` (split along the vocabulary); a leaf not listed is
             replicated. The tp pass checks the regions it finds against these roles and refuses a layer whose
             dataflow disagrees (E0407): roles are declared, not guessed, and the pass fails closed.
  LEAF, build  (a layer of the body) the prefix of its leaves' names, and its builder: build(segment, layer,
             prefix) adds its leaves to compiler/model.py's Segment and returns run(segment, x) -> x. The model's
             frame (embedding, positional, head, loss, `residual`, `repeat`) is compiler/model.py's own.

Modules here import no torch at the top: the checker reads them. A builder imports torch and the runtime inside
itself, and keeps the runtime calls the tracer must not enter whole with compiler/layers/calls.py's `kept_whole`.
A new kind is a module here, its entry in KINDS, and the records of the ops it calls.
"""
from __future__ import annotations

from compiler.layers import attention, cross_entropy, embedding, lm_head, mla, mlp, moe, norm, positional, residual

KINDS = (embedding, positional, norm, attention, mla, mlp, moe, residual, lm_head, cross_entropy)

# keyword -> module
BY_NAME = {name: mod for mod in KINDS for name in mod.SCHEMA}

# keyword -> argument table
SCHEMAS = {name: mod.SCHEMA[name] for mod in KINDS for name in mod.SCHEMA}

CONTAINERS = {name for mod in KINDS if getattr(mod, "CONTAINER", False) for name in mod.SCHEMA}


def of(layer):
    """The module of spec layer `layer`'s kind, or None (a `repeat`)."""
    return next((m for m in KINDS if isinstance(layer, m.SPEC)), None)


def tp_role(layer, leaf: str) -> str:
    """The tensor-parallel role of leaf `leaf` (a module name such as `attn_q`) of spec layer `layer`."""
    mod = of(layer)
    roles = getattr(mod, "TP_ROLES", {}) if mod is not None else {}
    return roles.get(leaf.rsplit("_", 1)[-1], "replicated")
