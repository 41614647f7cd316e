"""`scalec import` of Gemma 2 (Gemma2ForCausalLM) and Gemma 3's language model (Gemma3ForCausalLM, model_type
gemma3_text): the config.json as a `.scale` model section (compiler/importer.py holds the shared reading of keys,
the tables of defaults and of irrelevant keys, and the entry point).

What Gemma's layers are, read from transformers' modeling_gemma2.py and modeling_gemma3.py:
  - embeddings multiplied by √hidden_size (`embedding(..., scaled = true)`);
  - RMSNorms scaling by (1 + weight) in fp32 (`rmsnorm(..., zero_centered = true)`), four a layer: before and after
    attention (input_layernorm, post_attention_layernorm), before and after the MLP (pre_feedforward_layernorm,
    post_feedforward_layernorm), each sub-layer's output normalised before it joins the residual stream;
  - a GeGLU MLP (hidden_activation gelu_pytorch_tanh: `mlp(..., act = geglu)`);
  - attention with a head_dim of its own, scores over √query_pre_attn_scalar (`query_scale` where that is not
    head_dim), layers of two kinds (`layer_types`: sliding_attention within `sliding_window`, full_attention over the
    whole sequence); Gemma 2 soft-caps its scores (attn_logit_softcapping) and its logits (final_logit_softcapping);
    Gemma 3 normalises each head's q and k (zero-centred too) and turns its two kinds of layer by rotary bases of
    their own (rope_local_base_freq on the sliding layers, rope_theta, optionally linearly scaled, on the global).

The layer kinds repeat with a period (Gemma 2: sliding, full; Gemma 3: five sliding, one full), so the layers are
written as `repeat N { one period of layers }`, and where the count is not a multiple of the period (Gemma-3-1B's 26
layers, 4 × 6 + 2), the rest as a second repeat of its own period. runtime/hf_names.py maps the checkpoint's layers
onto those blocks (a `stack`, computed from the model by compiler/hf_header.stack).
"""
from __future__ import annotations

import json

GEMMA_TYPES = ("gemma2", "gemma3_text")
SLIDING, FULL = "sliding_attention", "full_attention"


def period(kinds: list) -> int:
    """The shortest p such that the kinds repeat every p layers (the last period may be cut short)."""
    return next(p for p in range(1, len(kinds) + 1) if all(kinds[i] == kinds[i % p] for i in range(len(kinds))))


def repeats(kinds: list) -> list[tuple[int, int, list]]:
    """(first layer, count, one period of kinds) of each repeat writing `kinds`: whole periods, then the rest by its
    own period, and so on."""
    out, first = [], 0
    while first < len(kinds):
        rest = kinds[first:]
        p = period(rest)
        count = len(rest) // p
        out.append((first, count, rest[:p]))
        first += count * p
    return out


class GemmaLayout:
    """A Gemma 2 or Gemma 3 (text) config's model section: mixed into compiler/importer.py's reader of keys
    (`error`, `get`, `src`, `pos_int`, `number`, `boolean`, `must_be`, `unknown_keys`, `header`, `fmt`), which is
    not imported here so that the importer's one entry point can choose this one."""

    def run(self) -> str | None:
        self.unknown_keys()
        g2 = self.type == "gemma2"
        sizes = {k: self.pos_int(k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                              "num_hidden_layers", "num_attention_heads", "head_dim",
                                              "max_position_embeddings", "query_pre_attn_scalar")}
        kv = self.get("num_key_value_heads")
        kv = sizes["num_attention_heads"] if kv is None else self.pos_int("num_key_value_heads")
        n = sizes["num_attention_heads"]
        if n and kv and n % kv:
            self.error(("num_key_value_heads",), f"{kv} key/value heads do not divide {n} heads",
                       label=f"{n} % {kv} == {n % kv}", help="grouped-query attention shares each key/value head "
                       "among num_attention_heads / num_key_value_heads query heads")
        if sizes["head_dim"] and sizes["head_dim"] % 2:
            self.error(("head_dim",), f"head_dim {sizes['head_dim']} is odd", label="rotary embeddings turn pairs",
                       help="rotary embeddings turn pairs of each head's dimensions: head_dim must be even")
        eps = self.number("rms_norm_eps")
        tied = self.boolean("tie_word_embeddings")
        bias = self.boolean("attention_bias")
        self.must_be("hidden_activation", lambda v: v == "gelu_pytorch_tanh",
                     "hidden_activation {} is not expressible",
                     "Gemma's MLP gates by gelu with its tanh approximation (`act = geglu`): only "
                     "gelu_pytorch_tanh maps")
        if "hidden_act" in self.cfg:  # older files write both; transformers' Gemma reads hidden_activation
            self.must_be("hidden_act", lambda v: v in ("gelu_pytorch_tanh", "gelu"),
                         "hidden_act {} is not Gemma's",
                         "transformers' Gemma reads hidden_activation; hidden_act is gelu_pytorch_tanh in every "
                         "released file")
        self.must_be("attention_dropout", lambda v: v in (0, 0.0, None) and not isinstance(v, bool),
                     "attention dropout {} is not expressible",
                     "attention in .scale has no dropout; set it to 0.0 to train without it")
        self.must_be("use_bidirectional_attention", lambda v: v in (None, False),
                     "use_bidirectional_attention {} (attention over the whole text, EmbeddingGemma) is not "
                     "expressible", "a causal language model attends to earlier tokens only: set it to false")
        caps = {k: self.cap(k) for k in ("attn_logit_softcapping", "final_logit_softcapping")}
        kinds = self.layer_kinds(sizes["num_hidden_layers"])
        window = self.pos_int("sliding_window") if kinds and SLIDING in kinds else None
        rope = self.gemma_rope(kinds)
        if self.diags or None in sizes.values() or None in (kv, eps, tied, bias) or kinds is None or rope is None:
            return None
        return self.emit_gemma(sizes, kv, eps, tied, bias, caps, kinds, window, rope)

    def cap(self, key: str) -> float | None:
        """A soft cap (null: none)."""
        v = self.get(key)
        return None if v is None else self.number(key)

    def layer_kinds(self, layers: int | None) -> list | None:
        """Each layer's attention kind: `layer_types` where the file lists them, else transformers' rule (Gemma 2:
        even layers sliding; Gemma 3: every sliding_window_pattern-th layer full, the others sliding)."""
        if not layers:
            return None
        types = self.cfg.get("layer_types")
        if types is None:
            if self.type == "gemma2":
                return [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
            key = next((k for k in ("sliding_window_pattern", "_sliding_window_pattern") if k in self.cfg),
                       "sliding_window_pattern")
            p = self.cfg.get(key, 6)
            if isinstance(p, bool) or not isinstance(p, int) or p <= 0:
                self.error((key,), f"`{key}` must be a positive integer, not {json.dumps(p)}", label="not a period")
                return None
            return [SLIDING if (i + 1) % p else FULL for i in range(layers)]
        if not isinstance(types, list):
            self.error(("layer_types",), "`layer_types` must be a list", label="not a list")
            return None
        bad = [i for i, t in enumerate(types) if t not in (SLIDING, FULL)]
        for i in bad:
            self.error(("layer_types", i), f"layer {i} is {json.dumps(types[i])}, not expressible",
                       label="not expressible in .scale", help="attention in .scale is causal over the whole "
                       "sequence (\"full_attention\") or within a window (\"sliding_attention\")")
        if len(types) != layers:
            self.error(("layer_types",), f"`layer_types` names {len(types)} layers, not num_hidden_layers = {layers}",
                       label="wrong length")
            return None
        return None if bad else list(types)

    def gemma_rope(self, kinds):
        """{kind: (theta, linear factor or None, where it was read)}: Gemma 2's one base (rope_theta or
        rope_parameters); Gemma 3's per kind, from rope_parameters' per-kind entries (transformers 5) or rope_theta,
        rope_scaling (the full layers') and rope_local_base_freq (the sliding ones); None after an error."""
        params, scaling = self.cfg.get("rope_parameters"), self.cfg.get("rope_scaling")
        if params is not None and scaling is not None:
            self.error(("rope_scaling",), "both rope_scaling and rope_parameters are given",
                       label="written twice", help="transformers 5 reads rope_parameters; keep one")
            return None
        if self.type == "gemma2":
            d = params if params is not None else scaling
            where = "rope_parameters" if params is not None else "rope_scaling"
            entry = self.rope_entry(d, where, "rope_theta", allow_linear=False)
            return None if entry is None else {SLIDING: entry, FULL: entry}
        if params is not None and any(k in params for k in (SLIDING, FULL)):
            out = {}
            for kind in (SLIDING, FULL):
                entry = self.rope_entry(params.get(kind), ("rope_parameters", kind), None,
                                        allow_linear=True, default=1e4 if kind == SLIDING else 1e6)
                if entry is None:
                    return None
                out[kind] = entry
            return out
        full = self.rope_entry(params if params is not None else scaling,
                               "rope_parameters" if params is not None else "rope_scaling", "rope_theta",
                               allow_linear=True)
        local = self.number("rope_local_base_freq")
        if full is None or local is None:
            return None
        return {FULL: full, SLIDING: (local, None, self.src("rope_local_base_freq"))}

    def rope_entry(self, d, where, theta_key, allow_linear: bool, default=None):
        """(theta, linear factor or None, its source) of one rope setting: `d` a rope_parameters / rope_scaling
        object (or None: `theta_key`'s value, or `default`)."""
        path = where if isinstance(where, tuple) else (where,)
        name = ".".join(path)
        theta = self.get(theta_key) if theta_key else default
        src = self.src(theta_key) if theta_key else f"{name} (absent: transformers' default)"
        if d is None:
            if theta_key and self.number(theta_key) is None:
                return None
            return theta, None, src
        if not isinstance(d, dict):
            self.error(path, f"`{name}` must be an object or null", label="not an object")
            return None
        if "rope_theta" in d:
            theta, src = d["rope_theta"], f"{name}.rope_theta"
            if self.number("rope_theta", path + ("rope_theta",), theta) is None:
                return None
        kind_key = "rope_type" if "rope_type" in d else "type"
        kind = d.get(kind_key, "default")
        if kind == "default":
            return theta, None, src
        if kind == "linear" and allow_linear:
            factor = self.number("factor", path + ("factor",), d.get("factor"))
            return None if factor is None else (theta, factor, src + f"; {name}.factor (rope_type linear)")
        self.error(path + (kind_key,), f"rope type {json.dumps(kind)} is not expressible here",
                   label="not expressible in .scale",
                   help="Gemma's rotary embeddings in .scale are unscaled" +
                        (" or, on Gemma 3's global layers, linearly scaled" if allow_linear else ""))
        return None

    # -- the text -------------------------------------------------------------------------------------------------

    def emit_gemma(self, sizes, kv, eps, tied, bias, caps, kinds, window, rope) -> str:
        s, g2 = self.src, self.type == "gemma2"
        h, n, hd = sizes["hidden_size"], sizes["num_attention_heads"], sizes["head_dim"]
        rows: list[tuple[str, str]] = [
            (f"vocab    = {sizes['vocab_size']}", s("vocab_size")),
            (f"hidden   = {h}", s("hidden_size")),
            (f"ffn      = {sizes['intermediate_size']}", s("intermediate_size")),
            (f"heads    = {n}", s("num_attention_heads")),
            (f"head_dim = {hd}", s("head_dim") + (f"; not hidden / heads = {h} / {n}" if h % n or hd != h // n
                                                   else "")),
            (f"kv_heads = {kv}", s("num_key_value_heads") if self.cfg.get("num_key_value_heads") is not None
             else "num_key_value_heads absent or null: = num_attention_heads"),
            (f"seq      = {sizes['max_position_embeddings']}",
             s("max_position_embeddings") + " (train's seq_len may be shorter)")]
        if window is not None:
            rows += [(f"window   = {window}", s("sliding_window") + ": each query sees itself and the window - 1 "
                      "tokens before it")]
        rows += [("", ""), ("embedding(vocab, hidden, scaled = true)", "model.embed_tokens, × √hidden_size")]
        norm = f"rmsnorm(hidden, eps = {self.fmt(eps)}, zero_centered = true)"
        pattern = [k for k in ("sliding_window_pattern", "_sliding_window_pattern") if k in self.cfg]
        where = ("layer_types" + (f", which transformers reads over {pattern[0]}" if pattern else "")
                 if "layer_types" in self.cfg else pattern[0] if pattern else "transformers' layer pattern")
        where += f", of {s('num_hidden_layers')} {sizes['num_hidden_layers']}"
        for first, count, kind_list in repeats(kinds):
            last = first + count * len(kind_list) - 1
            runs: list = []  # the block's layers as runs of one kind: "5 sliding, 1 full"
            for k in kind_list:
                if runs and runs[-1][1] == k:
                    runs[-1][0] += 1
                else:
                    runs.append([1, k])
            text = ", then ".join(f"{c} {'sliding' if k == SLIDING else 'full'}" for c, k in runs)
            rows += [(f"repeat {count} {{", f"model.layers {first}..{last} (by {where}): {text}"
                      + (" in each block" if count > 1 else ""))]
            for kind in kind_list:
                rows += self.gemma_layer(kind, norm, bias, caps, window, rope, sizes, eps)
            rows += [("}", "")]
        rows += [(norm, "model.norm: " + s("rms_norm_eps"))]
        cap = caps["final_logit_softcapping"]
        rows += [(f"lm_head(vocab, hidden, tied = {self.fmt(tied)}" + (f", softcap = {self.fmt(cap)})" if cap else ")"),
                  "lm_head: " + s("tie_word_embeddings") + f"; {s('final_logit_softcapping')}" +
                  ("" if cap else " null: uncapped"))]
        rows += [("cross_entropy", "the causal LM's loss: next-token cross entropy")]
        width = max(len(c) for c, _ in rows) + 2
        body = [("  " + (c.ljust(width) + f"# {m}" if m else c)).rstrip() for c, m in rows]
        head = self.header()
        named = " and ".join(k for k in ("architectures", "model_type") if k in self.cfg)
        return "\n".join(head + [f"model {self.type} {{  # {named}"] + body + ["}"]) + "\n"

    def gemma_layer(self, kind, norm, bias, caps, window, rope, sizes, eps) -> list[tuple[str, str]]:
        """One decoder layer: `residual { norm  attention  norm }  residual { norm  mlp  norm }`, the attention's
        arguments a line each with the keys they came from."""
        s = self.src
        theta, factor, theta_src = rope[kind]
        pad = " " * len("    attention(")
        what = ("self_attn (sliding_attention): within the window" if kind == SLIDING else
                "self_attn (full_attention): over the whole sequence") + f"; causal ({s('use_bidirectional_attention')}" \
            + f" false); {s('attention_dropout')} 0"
        args = [("hidden, heads, kv_heads = kv_heads,", what),
                (f"bias = {self.fmt(bias)}, head_dim = head_dim,", s("attention_bias") + "; q, k, v: heads · head_dim")]
        if kind == SLIDING:
            args.append(("window = window,", "transformers' mask: 0 <= q_idx - kv_idx < sliding_window"))
        if sizes["query_pre_attn_scalar"] != sizes["head_dim"]:
            args.append((f"query_scale = {sizes['query_pre_attn_scalar']},",
                         s("query_pre_attn_scalar") + ": scores over its root, not head_dim's"))
        if caps["attn_logit_softcapping"]:
            args.append((f"softcap = {self.fmt(caps['attn_logit_softcapping'])},", s("attn_logit_softcapping")))
        else:
            args[0] = (args[0][0], args[0][1] + f"; {s('attn_logit_softcapping')} null: scores uncapped")
        if self.type == "gemma3_text":
            args.append((f"qk_norm = zero_centered_rmsnorm, qk_norm_eps = {self.fmt(eps)},",
                         "self_attn.q_norm, k_norm: (1 + w) RMSNorm over each head_dim; " + s("rms_norm_eps")))
        if factor is None:
            args.append((f"rope_theta = {self.fmt(theta)})", theta_src))
        else:
            args += [(f"rope_theta = {self.fmt(theta)},", theta_src.split("; ")[0]),
                     (f"rope_scaling = linear(factor = {self.fmt(factor)}))", theta_src.split("; ", 1)[1])]
        attention = [(("    attention(" if k == 0 else pad) + code, note) for k, (code, note) in enumerate(args)]
        return [("  residual {", ""),
                (f"    {norm}", "input_layernorm: " + s("rms_norm_eps")),
                *attention,
                (f"    {norm}", "post_attention_layernorm"),
                ("  }", ""),
                ("  residual {", ""),
                (f"    {norm}", "pre_feedforward_layernorm"),
                ("    mlp(hidden, ffn, act = geglu, bias = false)",
                 "mlp: " + s("hidden_activation") + " gating = geglu; no biases"),
                (f"    {norm}", "post_feedforward_layernorm"),
                ("  }", "")]
