"""The text `scalec import` writes for Llama, Mistral, Qwen 2/3, Phi-3, Mixtral and Qwen-MoE configs: each line
of the model section with a comment naming the config.json keys it came from (compiler/importer.py reads the keys;
Gemma's and DeepSeek's sections are compiler/importer_gemma.py's and compiler/importer_deepseek.py's)."""
from __future__ import annotations

import json
import textwrap

from compiler.importer_moe import DISPATCH, DISPATCH_NOTE


def fmt(x) -> str:
    """A number as the .scale grammar reads it back exactly (repr of a float round-trips)."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    return repr(float(x))


# Every imported mixture is dropless (transformers routes every choice): sorted by expert, not padded to a slot per
# token (issue 37: padded, each expert computes every token's slot, and `search` avoids ep for it).
DISPATCH_ROW = (f"        {DISPATCH},", DISPATCH_NOTE)


class TextWriter:
    """The model section of a config whose keys compiler/importer.py's _Importer has read (mixed into it: `src`,
    `get`, `cfg`, `type`, `header`, `experts_key` are its), as (code, comment) rows aligned into text."""

    def emit(self, sizes, kv, eps, tied, rope, attn_bias, mlp_bias, moe, head_dim=None, window=None) -> str:
        """The model section: its sizes, the block (attention, then the MLP or the mixture), the final norm, head
        and loss, each line commented with the keys it came from; above it the header and the notes."""
        s = self.src
        h, n = sizes["hidden_size"], sizes["num_attention_heads"]
        # a head dimension of its own is written only where it is not hidden / heads (Mistral-Nemo, Qwen3-0.6B)
        own = head_dim is not None and (h % n or head_dim != h // n)
        rows: list[tuple[str, str]] = []  # (code, comment)
        qmoe = self.type in ("qwen2_moe", "qwen3_moe")  # experts of their own width (Qwen2-MoE's: a shared one)
        phi = self.type == "phi3"  # Phi-3: Llama's block, the checkpoint's q/k/v and gate/up fused
        rows += self.size_rows(sizes, kv, moe, head_dim, window, own, qmoe, phi)
        rows += [("", "")]
        rows += [("embedding(vocab, hidden)", "model.embed_tokens" + (f"; {s('embd_pdrop')} 0: no dropout" if phi
                                                                       else ""))]
        rows += [("repeat layers {", "model.layers: num_hidden_layers decoder layers")]
        resid = (f"{s('resid_pdrop')} 0: no dropout on the residual branch" if phi else "")
        rows += [("  residual {", resid)]
        rows += [(f"    rmsnorm(hidden, eps = {fmt(eps)})", "input_layernorm: " + s("rms_norm_eps"))]
        rows += self.attention_rows(eps, rope, attn_bias, moe, window, own, qmoe, phi)
        rows += [("  }", "")]
        rows += [("  residual {", resid)]
        rows += [(f"    rmsnorm(hidden, eps = {fmt(eps)})", "post_attention_layernorm: " + s("rms_norm_eps"))]
        rows += self.ffn_rows(moe, mlp_bias, qmoe, phi)
        rows += [("  }", ""), ("}", "")]
        rows += [(f"rmsnorm(hidden, eps = {fmt(eps)})", "model.norm: " + s("rms_norm_eps"))]
        rows += [(f"lm_head(vocab, hidden, tied = {fmt(tied)})", "lm_head: " + s("tie_word_embeddings"))]
        rows += [("cross_entropy", "the causal LM's loss: next-token cross entropy")]
        width = max(len(c) for c, _ in rows) + 2
        body = [("  " + (c.ljust(width) + f"# {m}" if m else c)).rstrip() for c, m in rows]
        head = self.header() + self.notes(qmoe)
        named = " and ".join(k for k in ("architectures", "model_type") if k in self.cfg)
        return "\n".join(head + [f"model {self.type} {{  # {named}"] + body + ["}"]) + "\n"

    def size_rows(self, sizes, kv, moe, head_dim, window, own, qmoe, phi) -> list:
        """The named sizes: vocab, hidden, ffn (and a shared expert's), heads, head_dim, kv_heads, layers, seq,
        window and experts."""
        s = self.src
        h, n = sizes["hidden_size"], sizes["num_attention_heads"]
        rows: list[tuple[str, str]] = []
        rows += [(f"vocab    = {sizes['vocab_size']}", s("vocab_size")),
                 (f"hidden   = {sizes['hidden_size']}", s("hidden_size")),
                 (f"ffn      = {moe[3] if qmoe else sizes['intermediate_size']}",
                  s("moe_intermediate_size" if qmoe else "intermediate_size") + (" (each expert's)" if moe else ""))]
        if self.type == "qwen2_moe":
            rows += [(f"shared   = {moe[4]}", s("shared_expert_intermediate_size") + " (the shared expert's)")]
        rows += [
                 (f"heads    = {sizes['num_attention_heads']}",
                  s("num_attention_heads") + ("" if own else
                                              f"; head_dim = hidden / heads = {h // n}"
                                              + (" (head_dim)" if "head_dim" in self.cfg else ""))),
                 *([(f"head_dim = {head_dim}", s("head_dim") + f"; not hidden / heads = {h} / {n}")]
                   if own else []),
                 (f"kv_heads = {kv}", s("num_key_value_heads") if self.cfg.get("num_key_value_heads") is not None
                  else "num_key_value_heads absent or null: = num_attention_heads"),
                 (f"layers   = {sizes['num_hidden_layers']}", s("num_hidden_layers")),
                 (f"seq      = {sizes['max_position_embeddings']}",
                  s("max_position_embeddings") + " (train's seq_len may be shorter)" +
                  (f"; {s('original_max_position_embeddings')}: read by longrope scaling only, which this model "
                   "has not" if phi else ""))]
        if window is not None:
            rows += [(f"window   = {window}", s("sliding_window") + ": each query sees itself and the window - 1 "
                      "tokens before it")]
        if moe:
            rows += [(f"experts  = {moe[0]}", s(self.experts_key() if qmoe else "num_local_experts"))]
        return rows

    def attention_rows(self, eps, rope, attn_bias, moe, window, own, qmoe, phi) -> list:
        """`attention(...)`: its biases, head_dim, window, q/k norms, rotary base and Llama 3's scaling."""
        s = self.src
        theta, llama3, theta_src, scaling_src = rope
        bias_src = {"llama": s("attention_bias") + " (q, k, v, o)",
                    "qwen3": s("attention_bias") + " (q, k, v, o)",
                    "qwen3_moe": s("attention_bias") + " (q, k, v, o)",
                    "qwen2": "Qwen 2: biases on q, k, v, none on o",
                    "mistral": "Mistral: no biases", "mixtral": "Mixtral: no biases",
                    "phi3": "Phi-3: no biases" + ("; attention_bias false" if "attention_bias" in self.cfg else ""),
                    "qwen2_moe": s("qkv_bias") + (": biases on q, k, v, none on o" if qmoe and moe[6] else
                                                  ": no biases")}[self.type]
        bias = ("bias = false, qkv_bias = true" if self.type == "qwen2" or (qmoe and moe[6])
                else f"bias = {fmt(attn_bias)}")
        attn = [("    attention(hidden, heads, kv_heads = kv_heads,",
                 "self_attn" + (" (the checkpoint's qkv_proj: q rows, then k, then v)" if phi else "") +
                 ": causal, grouped-query"),
                (f"              {bias},", bias_src)]
        if own:
            attn += [("              head_dim = head_dim,", "q, k, v: heads · head_dim wide; o back to hidden")]
        if window is not None:
            attn += [("              window = window,", "sliding-window attention, transformers' mask: "
                      "0 <= q_idx - kv_idx < window")]
        if self.type in ("qwen3", "qwen3_moe"):
            attn += [(f"              qk_norm = rmsnorm, qk_norm_eps = {fmt(eps)},",
                      "self_attn.q_norm, k_norm: RMSNorm over each head's head_dim; " + s("rms_norm_eps"))]
        attn += [(f"              rope_theta = {fmt(theta)}" + ("," if llama3 else ")"),
                  theta_src + "; rotary, Hugging Face's rotate-half layout" + self.rotary_src())]
        rope_row = len(attn) - 1
        if llama3:
            f, lo, hi, orig = llama3
            pad = " " * len("              rope_scaling = llama3(")
            attn += [(f"              rope_scaling = llama3(factor = {fmt(f)},",
                      f"{scaling_src}.factor; rope_type llama3"),
                     (f"{pad}low_freq_factor = {fmt(lo)},", f"{scaling_src}.low_freq_factor"),
                     (f"{pad}high_freq_factor = {fmt(hi)},", f"{scaling_src}.high_freq_factor"),
                     (f"{pad}original_seq = {orig}))", f"{scaling_src}.original_max_position_embeddings")]
        attn[0] = (attn[0][0], "; ".join(x for x in (attn[0][1] + (" within the window" if window is not None
                                                                       else " over the whole sequence"),
                                                          self.window_src(window), self.dropout_src()) if x))
        if "rope_scaling" in self.cfg and self.cfg["rope_scaling"] is None:
            attn[rope_row] = (attn[rope_row][0], attn[rope_row][1] + "; rope_scaling null")
        return attn

    def ffn_rows(self, moe, mlp_bias, qmoe, phi) -> list:
        """The block's second residual's layer: a mixture (Qwen-MoE's, Mixtral's) or the MLP."""
        s = self.src
        rows: list[tuple[str, str]] = []
        if qmoe:  # Qwen-MoE: Qwen2-MoE's has a sigmoid-gated shared expert, Qwen3-MoE's none
            experts, top_k, aux, _, _, norm, _ = moe
            shared = self.type == "qwen2_moe"
            rows += [(f"    moe(hidden, ffn, experts, top_k = {top_k}, capacity_factor = none, act = swiglu,",
                      f"mlp: {s('num_experts_per_tok')}; dropless, as transformers routes; "
                      f"{s('hidden_act')} gating = swiglu; {s('decoder_sparse_step')} 1 and "
                      f"{s('mlp_only_layers')} empty: a mixture in every layer" + ("" if shared else
                                                                                   ", no shared expert")),
                     DISPATCH_ROW,
                     (f"        renormalize = {fmt(norm)}, aux_loss = {fmt(aux)}" + ("," if shared else ")"),
                      f"mlp.gate: {s('norm_topk_prob')}; {s('router_aux_loss_coef')} (see the note above the "
                      "model)")]
            if shared:
                rows += [("        shared_ffn = shared, shared_gate = sigmoid)",
                          "mlp.shared_expert (silu-gated) and mlp.shared_expert_gate: sigmoid(x · w) per token")]
        elif moe:
            experts, top_k, aux = moe
            rows += [(f"    moe(hidden, ffn, experts, top_k = {top_k}, capacity_factor = none, act = swiglu,",
                      f"block_sparse_moe: {s('num_experts_per_tok')}; dropless, as transformers routes; "
                      f"{s('hidden_act')} gating = swiglu"),
                     DISPATCH_ROW,
                     (f"        aux_loss = {fmt(aux)})",
                      f"{s('router_aux_loss_coef')} (see the note above the model); "
                      f"{s('router_jitter_noise')} = 0")]
        else:
            mb = fmt(mlp_bias) if self.type == "llama" else "false"
            rows += [(f"    mlp(hidden, ffn, act = swiglu, bias = {mb})",
                      f"mlp: {s('hidden_act')} gating = swiglu" +
                      (f"; {s('mlp_bias')}" if self.type == "llama" else "; no biases") +
                      ("; the checkpoint's gate_up_proj: gate rows, then up rows" if phi else ""))]
        return rows

    def notes(self, qmoe) -> list:
        """The comment lines under the header: Qwen-MoE's unused dense width, and how the mixtures' router and
        load-balancing loss compare with transformers'."""
        head: list[str] = []
        if qmoe:
            family = "Qwen2-MoE" if self.type == "qwen2_moe" else "Qwen3-MoE"
            head += textwrap.wrap(f"{self.src('intermediate_size')} is the width of {family}'s dense MLP layers, "
                                  "of which this model has none.", 114, initial_indent="# ", subsequent_indent="# ")
        if self.type in ("mixtral", "qwen2_moe", "qwen3_moe"):
            note = ("The router: softmax over the experts, top-k, gates renormalised over the k choices, as in "
                    "transformers. " if not qmoe else "The router: softmax over the experts, top-k, the gates "
                    "renormalised over the k choices or not (renormalize), as in transformers. ") + (
                    "The load-balancing loss differs: transformers adds router_aux_loss_coef × one "
                    "loss only when output_router_logits is true (here "
                    f"{json.dumps(self.get('output_router_logits'))}), pooling every layer's and sequence's tokens, "
                    "its expert fractions summing to k; .scale adds aux_loss × each moe layer's own loss, per "
                    "sequence, fractions summing to 1, summed over the layers.")
            head += textwrap.wrap(note, 114, initial_indent="# ", subsequent_indent="# ")
        return head

    def window_src(self, window=None) -> str:
        """The keys that say attention is over the whole sequence, or within the window."""
        if self.type in ("mistral", "mixtral", "phi3"):
            return f"{self.src('sliding_window')} null" if window is None else ""
        if self.type in ("qwen2", "qwen3") and window is not None:
            if "layer_types" in self.cfg:  # transformers reads the list, not max_window_layers
                return "; ".join([f"{self.src('use_sliding_window')} true", "layer_types all sliding_attention"] +
                                 (["max_window_layers unused"] if "max_window_layers" in self.cfg else []))
            return f"{self.src('use_sliding_window')} true; {self.src('max_window_layers')} 0: every layer windowed"
        if self.type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            unused = [k for k in ("sliding_window", "max_window_layers") if k in self.cfg]
            return "; ".join([f"{self.src('use_sliding_window')} false"] +
                             ([", ".join(unused) + " unused"] if unused else []) +
                             (["layer_types all full_attention"] if "layer_types" in self.cfg else []))
        return ""

    def rotary_src(self) -> str:
        """Phi-3's partial_rotary_factor, where the file gives it (1: every dimension of each head turned)."""
        given = [k for k, d in (("partial_rotary_factor", self.cfg),
                                ("rope_parameters.partial_rotary_factor", self.cfg.get("rope_parameters")))
                 if isinstance(d, dict) and k.split(".")[-1] in d]
        return "".join(f"; {k} 1.0: every dimension" for k in given) if self.type == "phi3" else ""

    def dropout_src(self) -> str:
        return (f"attention_dropout = {json.dumps(self.cfg['attention_dropout'])}" if "attention_dropout" in self.cfg
                else "attention_dropout (absent: 0.0)")
