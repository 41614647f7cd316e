"""How every imported mixture of experts is dispatched: the one line each importer writes into its `moe(...)` call
(compiler/importer.py for Mixtral and Qwen's mixtures, compiler/importer_deepseek.py for DeepSeek's). Released
routers are dropless, and grouped dispatch sorts each choice's rows to its expert instead of giving every expert a
padded slot for every token: the same result, without `experts / top_k` times the expert compute."""
from __future__ import annotations

DISPATCH = "dispatch = grouped"
DISPATCH_NOTE = "dropless: rows sorted by expert, no padded slot per token (the same result as `padded`)"
