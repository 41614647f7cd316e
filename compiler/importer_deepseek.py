"""`scalec import` of DeepSeek-V2 (DeepseekV2ForCausalLM, model_type deepseek_v2: DeepSeek-V2, V2-Lite) and
DeepSeek-V3 (DeepseekV3ForCausalLM, deepseek_v3: V3, R1): the config.json as a `.scale` model section
(compiler/importer.py holds the shared reading of keys, the tables of defaults and of irrelevant keys, and the entry
point).

What the layers are, read from transformers' modeling_deepseek_v2.py and modeling_deepseek_v3.py (5.x):
  - attention is multi-head latent attention (`mla(...)`: q through a low-rank bottleneck, or projected directly
    without q_lora_rank; keys and values from a shared latent; one rotary key part shared by every head), its rotary
    pairs interleaved (V2: complex multiplication of adjacent pairs; V3: rope_interleave, true in every release), the
    latents' norms at transformers' fixed epsilon 1e-6 (DeepseekV3RMSNorm(q_lora_rank), not rms_norm_eps);
  - the first `first_k_dense_replace` layers have a dense MLP (intermediate_size), the others a mixture: routed
    experts (moe_intermediate_size each) beside `n_shared_experts` shared ones, which transformers builds as one MLP
    n_shared_experts × moe_intermediate_size wide; so the layers are written as two `repeat`s;
  - V3's router: sigmoid scores, the best topk_group of n_group groups (a group's score the sum of its two best
    experts' biased scores), top-k by score + e_score_correction_bias, gates the unbiased scores, renormalised
    (norm_topk_prob), × routed_scaling_factor; the bias is the language's ExpertBias (`bias_update`);
  - V2's router: softmax, greedy top-k (`topk_method` greedy; group_limited_greedy, DeepSeek-V2's 236B, groups by a
    group's best expert, which the language's group-limited routing, by the sum of the best two, does not write), no
    renormalisation (transformers' DeepseekV2 ignores norm_topk_prob), × routed_scaling_factor.
"""
from __future__ import annotations

import json
import textwrap

from compiler.importer_moe import DISPATCH, DISPATCH_NOTE  # every importer's mixture is dispatched alike

DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")

# DeepSeek's own config keys transformers' classes do not have (its remote code's), read with DeepSeek's values
OWN_DEFAULTS = {"moe_layer_freq": 1, "scoring_func": None, "topk_method_v3": "noaux_tc", "seq_aux": True,
                "aux_loss_alpha": None}
_YARN_FIELDS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                "attention_factor", "truncate")


class DeepseekLayout:
    """A DeepSeek-V2 or V3 config's model section: mixed into compiler/importer.py's reader of keys (`error`, `get`,
    `src`, `pos_int`, `number`, `boolean`, `must_be`, `unknown_keys`, `header`, `fmt`)."""

    def run(self) -> str | None:
        self.unknown_keys()
        v3 = self.type == "deepseek_v3"
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        sizes = {k: self.pos_int(k) for k in keys}
        layers, heads = sizes["num_hidden_layers"], sizes["num_attention_heads"]
        q_rank = None if self.get("q_lora_rank") is None else self.pos_int("q_lora_rank")
        dense = self.get("first_k_dense_replace")
        if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
            self.error(("first_k_dense_replace",), f"`first_k_dense_replace` must be an integer ≥ 0, not "
                       f"{json.dumps(dense)}", label="not a layer count")
            dense = None
        elif layers is not None:
            dense = min(dense, layers)
        sparse = None if dense is None or layers is None else layers - dense
        if dense:
            sizes["intermediate_size"] = self.pos_int("intermediate_size")
        eps = self.number("rms_norm_eps")
        tied = self.boolean("tie_word_embeddings")
        kv = self.get("num_key_value_heads")
        if kv is not None and kv != heads:
            self.error(("num_key_value_heads",), f"num_key_value_heads {json.dumps(kv)} differs from "
                       f"num_attention_heads {json.dumps(heads)}", label="not expressible in .scale",
                       help="multi-head latent attention gives every head its own key and value from the latent: "
                            "transformers' DeepSeek needs them equal")
        rope_dim = sizes["qk_rope_head_dim"]
        if rope_dim and rope_dim % 2:
            self.error(("qk_rope_head_dim",), f"qk_rope_head_dim {rope_dim} is odd", label="rotary embeddings "
                       "turn pairs", help="the rotary part of each query and key must be even (DeepSeek's: 64)")
        for key, want, what in (("head_dim", rope_dim, "qk_rope_head_dim (transformers sets it so)"),
                                ("qk_head_dim", None if None in (sizes["qk_nope_head_dim"], rope_dim)
                                 else sizes["qk_nope_head_dim"] + rope_dim, "qk_nope_head_dim + qk_rope_head_dim")):
            if self.cfg.get(key) is not None and want is not None and self.cfg[key] != want:
                self.error((key,), f"{key} {json.dumps(self.cfg[key])} is not {what} = {want}",
                           label="inconsistent", help=f"transformers derives {key} from the other sizes: remove it")
        self.must_be("hidden_act", lambda v: v == "silu", "hidden_act {} is not expressible",
                     "DeepSeek's MLPs and experts are silu-gated (`act = swiglu`); only `silu` maps")
        self.must_be("attention_dropout", lambda v: v in (0, 0.0) and not isinstance(v, bool),
                     "attention dropout {} is not expressible",
                     "attention in .scale has no dropout; set it to 0.0 to train without it")
        self.must_be("attention_bias", lambda v: v is False, "attention_bias {} is not expressible",
                     "`mla` has no biases (q_a_proj, kv_a_proj_with_mqa and o_proj would have them): only false maps")
        if not v3:
            self.must_be("mlp_bias", lambda v: v is False, "mlp_bias {} is not expressible",
                         "DeepSeek's dense MLP and shared experts in .scale have no biases: only false maps")
        interleave = self.boolean("rope_interleave") if v3 else True
        rope = self.deepseek_rope()
        moe = self.deepseek_moe() if sparse else None
        if self.diags or None in sizes.values() or None in (dense, eps, tied, interleave, rope) \
                or (sparse and (moe is None or None in moe.values())):
            return None  # q_lora_rank None is V2-Lite's direct q; a bad one is among the diagnostics
        return self.emit_deepseek(sizes, q_rank, dense, sparse, eps, tied, interleave, rope, moe)

    def own(self, key: str):
        """A key of DeepSeek's remote code that transformers' classes lack: the file's value, or DeepSeek's."""
        if key in self.cfg:
            return self.cfg[key]
        return OWN_DEFAULTS["topk_method_v3" if key == "topk_method" else key]

    def deepseek_moe(self) -> dict | None:
        v3 = self.type == "deepseek_v3"
        experts, top_k = self.pos_int("n_routed_experts"), self.pos_int("num_experts_per_tok")
        ffn = self.pos_int("moe_intermediate_size")
        shared = self.get("n_shared_experts")
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            self.error(("n_shared_experts",), f"`n_shared_experts` must be an integer ≥ 0, not {json.dumps(shared)}",
                       label="not an expert count")
            shared = None
        if experts and top_k and top_k > experts:
            self.error(("num_experts_per_tok",), f"{top_k} experts per token out of {experts}",
                       label="more than n_routed_experts", help="each token picks distinct experts")
        freq = self.own("moe_layer_freq")
        if not (freq == 1 and not isinstance(freq, bool)):
            self.error(("moe_layer_freq",), f"moe_layer_freq {json.dumps(freq)} makes only every so many layers after "
                       "the dense ones sparse, which is not expressible", label="not expressible in .scale",
                       help="transformers' DeepSeek ignores it (a mixture in every layer from first_k_dense_replace "
                            "on); DeepSeek's code reads it: only 1 maps, where both agree")
        scale = self.number("routed_scaling_factor")
        scoring = self.own("scoring_func")
        want_scoring = "sigmoid" if v3 else "softmax"
        if scoring is not None and scoring != want_scoring:
            self.error(("scoring_func",), f"scoring_func {json.dumps(scoring)} is not {self.arch}'s",
                       label="not expressible in .scale", help=f"transformers' {self.arch} scores the experts by "
                       f"{want_scoring} whatever the file says; only \"{want_scoring}\" maps")
        method = self.own("topk_method") if v3 else self.get("topk_method")
        groups = topk_groups = 1
        if v3:
            if method != "noaux_tc":
                self.error(("topk_method",), f"topk_method {json.dumps(method)} is not DeepSeek-V3's",
                           label="not expressible in .scale", help="transformers' DeepseekV3 routes as noaux_tc (the "
                           "expert bias and group-limited top-k) whatever the file says; only \"noaux_tc\" maps")
            groups, topk_groups = self.pos_int("n_group"), self.pos_int("topk_group")
            if experts and groups and experts % groups:
                self.error(("n_group",), f"{groups} groups do not divide {experts} experts",
                           label=f"{experts} % {groups} == {experts % groups}",
                           help="group-limited routing cuts the experts into equal groups")
            if groups and topk_groups and topk_groups > groups:
                self.error(("topk_group",), f"topk_group {topk_groups} is more than the {groups} groups",
                           label="more than n_group", help="a token chooses among its best topk_group groups")
            norm = self.boolean("norm_topk_prob")
        else:
            if method == "group_limited_greedy":
                self.error(("topk_method",), "topk_method \"group_limited_greedy\" (DeepSeek-V2's: a group scored by "
                           "its best expert) is not expressible", label="not expressible in .scale",
                           help="`moe(..., groups, topk_groups)` scores a group by the sum of its two best experts "
                                "(DeepSeek-V3's); only \"greedy\" maps for DeepSeek-V2")
            elif method != "greedy":
                self.error(("topk_method",), f"topk_method {json.dumps(method)} is not one of DeepSeek-V2's",
                           label="not expressible in .scale", help="\"greedy\" (top-k over every expert) maps")
            self.must_be("norm_topk_prob", lambda v: v is False,
                         "norm_topk_prob {} is not read by transformers' DeepseekV2",
                         "transformers' DeepSeek-V2 router never renormalises its gates (DeepSeek's own code "
                         "would): set it to false, which is what both compute")
            norm = False
        seq_aux = self.own("seq_aux")
        if seq_aux is not True:
            self.error(("seq_aux",), f"seq_aux {json.dumps(seq_aux)} (a batch-wise balance loss) is not expressible",
                       label="not expressible in .scale", help="`aux_loss` in .scale is per sequence (DeepSeek's "
                       "seq_aux true)")
        aux = self.own("aux_loss_alpha")
        if aux is None:
            aux = 0.0
        elif self.number("aux_loss_alpha", positive=False) is None:
            aux = None
        elif aux < 0:
            self.error(("aux_loss_alpha",), "aux_loss_alpha must not be negative", label="negative")
            aux = None
        self.must_be("output_router_logits", lambda v: isinstance(v, bool),
                     "output_router_logits must be true or false, not {}", "true or false")
        return dict(experts=experts, top_k=top_k, ffn=ffn, shared=shared, scale=scale, groups=groups,
                    topk_groups=topk_groups, norm=norm, aux=aux)

    def deepseek_rope(self):
        """(theta, yarn dict or None, theta's source, scaling's source) from rope_theta / rope_scaling (DeepSeek's
        files, transformers 4) or rope_parameters (transformers 5); None after an error."""
        params, scaling = self.cfg.get("rope_parameters"), self.cfg.get("rope_scaling")
        if params is not None and scaling is not None:
            self.error(("rope_scaling",), "both rope_scaling and rope_parameters are given",
                       label="written twice", help="transformers 5 reads rope_parameters; keep one")
            return None
        d, where = (params, "rope_parameters") if params is not None else (scaling, "rope_scaling")
        theta, theta_src = self.get("rope_theta"), self.src("rope_theta")
        if d is None:
            return (theta, None, theta_src, None) if self.number("rope_theta") else None
        if not isinstance(d, dict):
            self.error((where,), f"`{where}` must be an object or null", label="not an object")
            return None
        kind_key = "rope_type" if "rope_type" in d else "type"
        kind = d.get(kind_key, "default")
        if kind not in ("default", "yarn"):
            self.error((where, kind_key), f"rope type {json.dumps(kind)} is not expressible",
                       label="not expressible in .scale",
                       help="`mla`'s rotary embeddings are unscaled (default) or YaRN's (yarn, DeepSeek's releases)")
            return None
        for k in d:
            if k not in ("rope_type", "type", "rope_theta", *_YARN_FIELDS) or (kind == "default" and k in _YARN_FIELDS):
                self.error((where, k), f"unknown key `{k}` in `{where}`" if k not in _YARN_FIELDS else
                           f"`{k}` is given for rope_type default", code="E0953" if k not in _YARN_FIELDS else "E0954",
                           label="not known to `scalec import`" if k not in _YARN_FIELDS else "not read",
                           help="rope types that map: default, and yarn with " + ", ".join(_YARN_FIELDS[:6]))
        read = self.theta_in(d, where, theta, theta_src)
        if read is None:
            return None
        theta, theta_src = read
        if kind == "default":
            return None if self.diags else (theta, None, theta_src, None)
        return self.yarn(d, where, theta, theta_src)

    def yarn(self, d: dict, where: str, theta, theta_src):
        """YaRN's figures as transformers reads them (modeling_rope_utils._compute_yarn_parameters): factor (absent:
        max_position_embeddings / original_max_position_embeddings), beta_fast 32 and beta_slow 1 when absent or 0,
        mscale and mscale_all_dim (the cos/sin factor mscale(factor, mscale) / mscale(factor, mscale_all_dim), the
        softmax scale × mscale(factor, mscale_all_dim)², DeepSeek's yarn_apply_mscale), truncate true."""
        if "original_max_position_embeddings" not in d:
            self.error((where, "type" if "type" in d else "rope_type"), "rope type yarn without "
                       "`original_max_position_embeddings`", label="incomplete",
                       help="YaRN rescales the frequencies of the context length the model was pretrained at")
            return None
        orig = self.pos_int("original_max_position_embeddings", (where, "original_max_position_embeddings"),
                            d["original_max_position_embeddings"])
        out = {"original_seq": orig}
        for k, default in (("factor", None), ("beta_fast", 32), ("beta_slow", 1), ("mscale", None),
                           ("mscale_all_dim", None), ("attention_factor", None)):
            v = d.get(k)
            if v is None or (k in ("beta_fast", "beta_slow") and v == 0):
                out[k] = default
                continue
            out[k] = self.number(k, (where, k), v, positive=k != "mscale_all_dim")
            if out[k] is None:
                return None
        truncate = d.get("truncate", True)
        if not isinstance(truncate, bool):
            self.error((where, "truncate"), f"`truncate` must be true or false, not {json.dumps(truncate)}",
                       label="not a boolean")
            return None
        out["truncate"] = truncate
        if orig is None:
            return None
        if out["factor"] is None:
            seq = self.get("max_position_embeddings")
            out["factor"] = seq / orig if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None
            if out["factor"] is None:
                return None
        return (theta, out, theta_src, where)

    # -- the text -------------------------------------------------------------------------------------------------

    def emit_deepseek(self, sizes, q_rank, dense, sparse, eps, tied, interleave, rope, moe) -> str:
        s, fmt, v3 = self.src, self.fmt, self.type == "deepseek_v3"
        theta, yarn, theta_src, scaling_src = rope
        h, n = sizes["hidden_size"], sizes["num_attention_heads"]
        rows: list[tuple[str, str]] = [(f"vocab    = {sizes['vocab_size']}", s("vocab_size")),
                                       (f"hidden   = {h}", s("hidden_size")),
                                       (f"heads    = {n}", s("num_attention_heads") + "; " + (
                                           s("num_key_value_heads") + " the same" if self.cfg.get(
                                               "num_key_value_heads") is not None else
                                           "num_key_value_heads absent or null: = num_attention_heads"))]
        if dense:
            rows += [(f"ffn      = {sizes['intermediate_size']}", s("intermediate_size") + ": the dense layers' MLP")]
        if sparse:
            rows += [(f"moe_ffn  = {moe['ffn']}", s("moe_intermediate_size") + ": each routed expert's"),
                     (f"experts  = {moe['experts']}", s("n_routed_experts"))]
        if dense:
            rows += [(f"dense    = {dense}", s("first_k_dense_replace") + ": the first layers, with a dense MLP")]
        if sparse:
            rows += [(f"sparse   = {sparse}", f"{s('num_hidden_layers')} {sizes['num_hidden_layers']} - "
                      f"first_k_dense_replace: the mixture-of-experts layers; {self.src('moe_layer_freq')} 1")]
        rows += [(f"seq      = {sizes['max_position_embeddings']}",
                  s("max_position_embeddings") + " (train's seq_len may be shorter)"), ("", "")]
        rows += [("embedding(vocab, hidden)", "model.embed_tokens")]
        attn = self.mla_rows(sizes, q_rank, interleave, theta, yarn, theta_src, scaling_src)
        norm = f"rmsnorm(hidden, eps = {fmt(eps)})"
        for name, count, first in (("dense", dense, 0), ("sparse", sparse, dense)):
            if not count:
                continue
            rows += [(f"repeat {name} {{", f"model.layers {first}..{first + count - 1}")]
            rows += [("  residual {", ""), (f"    {norm}", "input_layernorm: " + s("rms_norm_eps"))]
            rows += attn + [("  }", ""), ("  residual {", ""),
                            (f"    {norm}", "post_attention_layernorm: " + s("rms_norm_eps"))]
            if name == "dense":
                rows += [("    mlp(hidden, ffn, act = swiglu, bias = false)",
                          f"mlp: {s('hidden_act')} gating = swiglu; no biases" +
                          ("" if v3 else f" ({s('mlp_bias')})"))]
            else:
                rows += self.moe_rows(moe)
            rows += [("  }", ""), ("}", "")]
        rows += [(norm, "model.norm: " + s("rms_norm_eps"))]
        rows += [(f"lm_head(vocab, hidden, tied = {fmt(tied)})", "lm_head: " + s("tie_word_embeddings"))]
        rows += [("cross_entropy", "the causal LM's loss: next-token cross entropy")]
        width = max(len(c) for c, _ in rows) + 2
        body = [("  " + (c.ljust(width) + f"# {m}" if m else c)).rstrip() for c, m in rows]
        head = self.header()
        notes = []
        if not dense:
            notes.append(f"{s('intermediate_size')} is the width of the dense layers' MLP, of which this model has "
                         "none (first_k_dense_replace 0).")
        if v3:
            mtp = self.cfg.get("num_nextn_predict_layers", 1)
            notes.append(f"{s('num_nextn_predict_layers')} {json.dumps(mtp)}: DeepSeek-V3's multi-token-prediction "
                         "module (its checkpoint's layer num_hidden_layers) is not written, as transformers builds "
                         "none either.")
            if "quantization_config" in self.cfg:
                notes.append("quantization_config: how the checkpoint stores its weights (DeepSeek-V3's fp8 blocks "
                             "with their scales), not the architecture; `init = from(...)` reads unquantised "
                             "weights (dequantise first).")
        if sparse:
            notes.append("The router: " + ("sigmoid scores, the best topk_group of n_group groups, top-k by score + "
                                           "the expert bias, gates the unbiased scores" + (
                                               " renormalised" if moe["norm"] else "") if v3 else
                                           "softmax over the experts, greedy top-k, the gates not renormalised") +
                         ", × routed_scaling_factor, as transformers routes. "
                         + ("Transformers keeps e_score_correction_bias fixed; .scale moves it by `bias_update` "
                            "after each step (DeepSeek-V3's γ, 0.001 in its report; the config has no key for it: "
                            "set 0.0 to keep the loaded bias fixed). " if v3 else "") +
                         "Transformers computes no load-balancing loss for DeepSeek; .scale adds aux_loss × each "
                         "moe layer's own per-sequence loss (DeepSeek's seq_aux), aux_loss from aux_loss_alpha "
                         + ("(here " + json.dumps(self.cfg["aux_loss_alpha"]) + ")" if "aux_loss_alpha" in self.cfg
                            else "(absent: 0, none)") + f"; {self.src('output_router_logits')} "
                         f"{json.dumps(self.get('output_router_logits'))} only returns the router's logits.")
        else:
            moe_keys = [k for k in ("moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                                    "num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor",
                                    "norm_topk_prob", "scoring_func", "topk_method", "aux_loss_alpha", "seq_aux",
                                    "moe_layer_freq", "output_router_logits") if k in self.cfg]
            if moe_keys:
                notes.append(f"Every layer is dense (first_k_dense_replace ≥ num_hidden_layers): {', '.join(moe_keys)} "
                             "unused.")
        for note in notes:
            head += textwrap.wrap(note, 114, initial_indent="# ", subsequent_indent="# ")
        named = " and ".join(k for k in ("architectures", "model_type") if k in self.cfg)
        return "\n".join(head + [f"model {self.type} {{  # {named}"] + body + ["}"]) + "\n"

    def mla_rows(self, sizes, q_rank, interleave, theta, yarn, theta_src, scaling_src) -> list[tuple[str, str]]:
        s, fmt, v3 = self.src, self.fmt, self.type == "deepseek_v3"
        pad = " " * len("    mla(")
        q = (f"q_lora_rank = {q_rank}, ", "; " + s("q_lora_rank") + ": q_a_proj, q_a_layernorm, q_b_proj") \
            if q_rank is not None else ("", "; q_lora_rank null: q_proj from hidden directly")
        rows = [(f"    mla(hidden, heads, {q[0]}kv_lora_rank = {sizes['kv_lora_rank']},",
                 "self_attn: multi-head latent attention" + q[1] + "; " + s("kv_lora_rank") + ": kv_a_proj_with_mqa, "
                 "kv_a_layernorm, kv_b_proj; " + s("attention_bias") + "; " +
                 (f"attention_dropout = {json.dumps(self.cfg['attention_dropout'])}" if "attention_dropout" in
                  self.cfg else "attention_dropout (absent: 0.0)")),
                (f"{pad}qk_nope_head_dim = {sizes['qk_nope_head_dim']}, "
                 f"qk_rope_head_dim = {sizes['qk_rope_head_dim']},",
                 f"{s('qk_nope_head_dim')}, {s('qk_rope_head_dim')}" +
                 "".join(f"; {k} = nope + rope" if k == "qk_head_dim" else f"; {k} = qk_rope_head_dim"
                         for k in ("head_dim", "qk_head_dim") if k in self.cfg)),
                (f"{pad}v_head_dim = {sizes['v_head_dim']},", s("v_head_dim") +
                 "; the latents' norms at transformers' fixed eps 1e-6 (mla's norm_eps default)")]
        inter = "" if interleave else "rope_interleave = false, "
        inter_src = (s("rope_interleave") + (": adjacent pairs" if interleave else ": the halves turned")) if v3 \
            else "DeepSeek-V2 turns adjacent pairs (as complex numbers)"
        if yarn is None:
            rows += [(f"{pad}{inter}rope_theta = {fmt(float(theta))})", f"{inter_src}; {theta_src}" +
                      ("; rope_scaling null" if "rope_scaling" in self.cfg and self.cfg["rope_scaling"] is None
                       else "")),]
            return rows
        rows += [(f"{pad}{inter}rope_theta = {fmt(float(theta))},", f"{inter_src}; {theta_src}")]
        ypad = pad + " " * len("rope_scaling = yarn(")
        mscale = [f"mscale = {fmt(yarn['mscale'])}"] if yarn["mscale"] is not None else []
        mscale += [f"mscale_all_dim = {fmt(yarn['mscale_all_dim'])}"] if yarn["mscale_all_dim"] is not None else []
        last = ", ".join(mscale)
        rows += [(f"{pad}rope_scaling = yarn(factor = {fmt(yarn['factor'])}, original_seq = {yarn['original_seq']},",
                  f"{scaling_src}: rope type yarn, factor" + ("" if "factor" in self.cfg[scaling_src] else
                                                             " (absent: max_position_embeddings / original)") +
                  ", original_max_position_embeddings"),
                 (f"{ypad}beta_fast = {fmt(yarn['beta_fast'])}, beta_slow = {fmt(yarn['beta_slow'])}" +
                  (")" if not last and yarn["attention_factor"] is None and yarn["truncate"] else ","),
                  f"{scaling_src}.beta_fast, beta_slow (absent or 0: 32 and 1)")]
        tail = mscale + ([f"attention_factor = {fmt(yarn['attention_factor'])}"]
                         if yarn["attention_factor"] is not None else []) + \
            ([] if yarn["truncate"] else ["truncate = false"])
        if tail:
            rows += [(f"{ypad}{', '.join(tail)}))", f"{scaling_src}: the cos/sin factor and the softmax scale "
                      "× mscale(factor, mscale_all_dim)², as transformers' DeepSeek")]
        else:
            rows[-1] = (rows[-1][0][:-1] + "))" if rows[-1][0].endswith(")") else rows[-1][0], rows[-1][1])
        return rows

    def moe_rows(self, moe) -> list[tuple[str, str]]:
        s, fmt, v3 = self.src, self.fmt, self.type == "deepseek_v3"
        pad = " " * len("    moe(")
        shared = moe["shared"]
        rows = [(f"    moe(hidden, moe_ffn, experts, top_k = {moe['top_k']}, capacity_factor = none, act = swiglu,",
                 f"mlp.experts, mlp.gate: {s('num_experts_per_tok')}; dropless, as transformers routes; "
                 f"{s('hidden_act')} gating = swiglu"),
                (f"{pad}{DISPATCH},", DISPATCH_NOTE),
                (f"{pad}renormalize = {fmt(moe['norm'])}, aux_loss = {fmt(float(moe['aux']))},",
                 (s("norm_topk_prob") if v3 else "DeepSeek-V2: never renormalised" +
                  (f" ({s('norm_topk_prob')})" if "norm_topk_prob" in self.cfg else "")) +
                 f"; {self.src('aux_loss_alpha')} (see the note above the model)")]
        router = [f"scoring = {'sigmoid' if v3 else 'softmax'}"]
        src = ["scoring_func " + ("sigmoid" if v3 else "softmax") + ("" if "scoring_func" in self.cfg else
                                                                      " (absent: transformers')")]
        if v3:
            router += [f"groups = {moe['groups']}", f"topk_groups = {moe['topk_groups']}"]
            src += [s("n_group"), s("topk_group"), self.src("topk_method") + " noaux_tc"]
        else:
            src += [s("topk_method") + " greedy" + ("; n_group, topk_group unused" if any(
                k in self.cfg for k in ("n_group", "topk_group")) else "")]
        router += [f"routed_scale = {fmt(float(moe['scale']))}"]
        src += [s("routed_scaling_factor")]
        if v3:
            router += ["bias_update = 0.001"]
            src += ["mlp.gate.e_score_correction_bias (see the note above the model)"]
        if shared:
            rows += [(f"{pad}shared_ffn = {shared} * moe_ffn,",
                      f"mlp.shared_experts: one MLP {s('n_shared_experts')} × moe_intermediate_size wide")]
        else:  # no shared_ffn argument: its default is none (transformers builds a zero-width MLP)
            src += [f"{s('n_shared_experts')} 0: no shared expert"]
        rows += [(pad + ", ".join(router) + ")", "; ".join(src))]
        return rows
