"""The layer vocabulary: one module per layer kind, each holding what the compiler knows of that kind.

  SCHEMA     its arguments as `.scale` writes them: name -> binder.Param (type, default, doc), per keyword
  resolve    (checker, statement, bound arguments, keyword) -> the spec layer, with its own diagnostics
  TP_ROLES   its leaves' tensor-parallel roles, by the suffix of the leaf's name: `column` (split by output),
             `row` (split by input, then summed), `vocab` (split along the vocabulary); a leaf not listed is
             replicated. The tp pass checks the regions it finds against these roles and refuses a layer whose
             dataflow disagrees (E0407): roles are declared, not guessed, and the pass fails closed.

Modules here import no torch: the checker reads them. The builders of the single-device model are in
compiler/model.py (they need torch).
"""
from __future__ import annotations

from compiler.layers import attention, cross_entropy, embedding, lm_head, mla, mlp, moe, norm, positional, residual

KINDS = (embedding, positional, norm, attention, mla, mlp, moe, residual, lm_head, cross_entropy)

# keyword -> module
BY_NAME = {name: mod for mod in KINDS for name in mod.SCHEMA}

# keyword -> argument table
SCHEMAS = {name: mod.SCHEMA[name] for mod in KINDS for name in mod.SCHEMA}

CONTAINERS = {name for mod in KINDS if getattr(mod, "CONTAINER", False) for name in mod.SCHEMA}


def tp_role(layer, leaf: str) -> str:
    """The tensor-parallel role of leaf `leaf` (a module name such as `attn_q`) of spec layer `layer`."""
    mod = next((m for m in KINDS if isinstance(layer, m.SPEC)), None)
    roles = getattr(mod, "TP_ROLES", {}) if mod is not None else {}
    return roles.get(leaf.rsplit("_", 1)[-1], "replicated")
