"""On a CUDA GPU: the target's pass and the draft's step replayed as CUDA graphs over static KV caches.

Eager, a small model's pass on a GPU is bound by the host: each of its many small kernels is launched from
Python, and the GPU waits (docs/measurements/speed.md has the figures). A CUDA graph launches the whole
pass at once. A graph replays fixed tensors, so each row count k ≤ K_MAX gets its own graph, captured at
start, over static inputs, among them the slots each row sees as a mask as wide as the cache (a draft
tree's rows see their ancestors only); the keys and values
live in a static cache, written in place. Any transformers causal LM runs over transformers' own
StaticCache (HFStaticPass), an EAGLE-3 draft over its StaticDraftStep; a standalone draft is graphed as the
target is. Both are lent to decodes through compiled_pass.CompiledPass, as the CPU's compiled pass is, and
attached only where every graph agrees with the eager pass on a check prompt.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import StaticCache

from ..core.cache import CachedLM, cache_keyword, tree_feed
from ..core.tree import ancestor_mask, feed_layout
from .block_attention import feed_rows
from .compiled_draft import step_agrees_with_eager
from .compiled_pass import MAX_LEN, TOLERANCE, CompiledPass, agrees_with_eager
from .static_draft import StaticDraftStep
from .static_pass import K_MAX

EVERY_ROW_COUNT = tuple(range(1, K_MAX + 1))  # a graph each, each checked against the eager pass
CHECK_TREE = [-1, -1, 0, 0, 2]  # a draft tree's parents: siblings at two depths, so a row seeing them shows


class HFStaticPass(nn.Module):
    """A transformers causal LM's pass over transformers' StaticCache, as static_pass.StaticPass's: feed k
    tokens at `positions`, get logits [k, V], last hidden [k, H] and aux hidden states [k, n_aux·H]. The
    cache's write position is set from `positions` inside the pass, so a graph replays a rollback too."""

    def __init__(self, model, aux_layer_ids=(), max_len: int = MAX_LEN):
        super().__init__()
        self.parts = (model.get_decoder(), model.get_output_embeddings())  # a tuple: not submodules
        self.aux_layer_ids, self.max_len = tuple(aux_layer_ids), max_len
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.keyword = cache_keyword(self.parts[0].forward)
        self.n_layers = model.config.get_text_config().num_hidden_layers
        zero = torch.zeros(1, dtype=torch.long, device=model.device)
        sees_all = torch.ones(1, max_len, dtype=torch.bool, device=model.device)
        with torch.no_grad():  # allocates the cache's tensors (transformers does so at the first write)
            self(zero, zero, sees_all)
        for layer in self.cache.layers:  # full-attention layers that keep their write position as a tensor
            if type(layer).__name__ != "StaticLayer" or not isinstance(layer.cumulative_length, torch.Tensor):
                raise TypeError(f"a static cache layer of kind {type(layer).__name__} is not served")

    def buffers_of_layer(self, i: int):
        layer = self.cache.layers[i]
        return layer.keys[0], layer.values[0]  # [n_kv, max_len, D]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        """tokens, positions [k] and the slots each row sees, mask [k, max_len] -> (logits, last, aux). The
        mask goes to transformers as a 4D mask, used as given: a draft tree's rows see their ancestors only,
        which a causal mask built from the slots would not say."""
        decoder, lm_head = self.parts
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(positions[0])
        out = decoder(
            input_ids=tokens[None],
            position_ids=positions[None],
            attention_mask=mask[None, None],
            use_cache=True,
            output_hidden_states=bool(self.aux_layer_ids),
            **{self.keyword: self.cache},
        )
        last = out.last_hidden_state[0]
        aux = [out.hidden_states[i][0] for i in self.aux_layer_ids]
        return lm_head(last), last, torch.cat(aux, -1) if aux else last.new_zeros(len(tokens), 0)


class GraphRunner:
    """Runs a static module (HFStaticPass, StaticDraftStep) on a GPU as one CUDA graph per row count, with a
    mask padded to the whole cache; elsewhere (tests), and for a row count with no graph, eagerly."""

    def __init__(self, module: nn.Module, graphs: bool = True):
        self.module, self.use_graphs = module, graphs
        self.graphs = {}  # rows -> (graph, its static inputs, its outputs)

    @torch.inference_mode(False)
    @torch.no_grad()
    def __call__(self, tokens, positions, mask, *inputs):
        given = self._given(tokens, positions, mask, *inputs)
        if not self.use_graphs or len(tokens) not in self.graphs:
            return tuple(self.module(*given))
        graph, static_inputs, outputs = self.graphs[len(tokens)]
        for static, value in zip(static_inputs, given, strict=True):
            static.copy_(value)
        graph.replay()
        return tuple(output.clone() for output in outputs)  # the next replay overwrites the graph's

    def _given(self, tokens, positions, mask, *inputs) -> tuple:
        """The module's inputs, the mask padded (or cut: past the cache no slot is seen) to the whole cache,
        a graph's fixed width."""
        width = min(mask.shape[1], self.module.max_len)
        full = torch.zeros(len(mask), self.module.max_len, dtype=torch.bool, device=mask.device)
        full[:, :width] = mask[:, :width]
        return tokens, positions, full, *inputs

    @torch.inference_mode(False)
    @torch.no_grad()
    def capture(self, tokens, positions, mask, *inputs) -> None:
        """Capture the graph for this row count on these inputs (before any decode runs beside it: a capture
        must not share the GPU with other work)."""
        static_inputs = tuple(v.clone() for v in self._given(tokens, positions, mask, *inputs))
        side = torch.cuda.Stream()  # warm-up off the main stream, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.module(*static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = tuple(self.module(*static_inputs))
        self.graphs[len(tokens)] = graph, static_inputs, outputs


def attach_graphs(pair, log=print, graphs: bool = True) -> None:
    """Lend the pair its target's (`target_pass`) and draft's (`draft_pass`: an EAGLE-3 draft's step, else
    the draft's pass) graphed passes, each only if it agrees with its eager pass; else it stays eager.
    Every row count's graph is captured here, before any decode runs beside a capture."""
    target, draft = pair.target, pair.draft
    if any(len(set(getattr(model, "hf_device_map", {}).values())) > 1 for model in (target, draft)):
        return log("a model spread over several devices stays eager")
    aux = tuple(getattr(draft, "aux_layer_ids", None) or ())
    parts = [("target's pass", target, "target_pass", lambda: HFStaticPass(target, aux))]
    if hasattr(draft, "aux_layer_ids"):
        parts.append(("draft's step", draft, "draft_pass", lambda: StaticDraftStep(draft, MAX_LEN)))
    else:
        parts.append(("draft's pass", draft, "draft_pass", lambda: HFStaticPass(draft)))
    for name, model, slot, build in parts:
        if getattr(pair, slot) is not None:
            continue  # attached by an earlier start of this pair
        try:
            with torch.inference_mode(False), torch.no_grad():
                graphed = graphed_pass(build(), pair.device, graphs)
            if isinstance(graphed.module, StaticDraftStep):
                agreed = step_agrees_with_eager(model, graphed, sizes=EVERY_ROW_COUNT)
            else:
                aux_ids = graphed.module.aux_layer_ids
                chains = agrees_with_eager(model, graphed, aux_ids, EVERY_ROW_COUNT)
                agreed = chains and tree_agrees_with_eager(model, graphed, aux_ids)
        except Exception as err:  # an architecture or version these graphs do not serve: eager
            log(f"the {name} stays eager on this GPU ({type(err).__name__}: {err})")
            continue
        if not agreed:
            log(f"the {name} as CUDA graphs disagrees with the eager one; it stays eager")
            continue
        setattr(pair, slot, graphed)
        log(f"the {name} runs as CUDA graphs")


def tree_agrees_with_eager(model, graphed: CompiledPass, aux_layer_ids) -> bool:
    """Whether a draft tree's pass on `graphed` scores each node as the eager model scores a chain over the
    node's path, to bf16 rounding: the model's attention must honour the mask (a row sees its ancestors
    only), which a causal mask built from the slots does not say and an eager attention adding a boolean
    mask as 0 and 1 does not do. The chains need no mask, so the reference cannot share the fault."""
    vocab = model.config.get_text_config().vocab_size
    prompt = torch.arange(1, 33, device=model.device) % vocab
    feed = torch.arange(40, 41 + len(CHECK_TREE), device=model.device) % vocab  # the unseen token, the nodes
    eager = CachedLM(model, vocab, aux_layer_ids)
    with torch.inference_mode():
        eager.forward(prompt[:-1], keep=1)
        graphed.load(list(eager.cache), len(prompt) - 1)
        rows = tree_feed(len(prompt) - 1, *feed_layout(1, CHECK_TREE, model.device))
        logits, _, _ = graphed.forward(feed, len(prompt) - 1, rows=rows)
        for node, sees in enumerate(ancestor_mask(CHECK_TREE)):
            eager.rollback(len(prompt) - 1)
            path = feed[1:][sees.to(feed.device)]  # the node's ancestors, then the node
            reference, _, _ = eager.forward(torch.cat([feed[:1], path]), keep=1)
            if (logits[node + 1, :vocab].float() - reference[0].float()).abs().max() > TOLERANCE:
                return False
    return True


def graphed_pass(module: nn.Module, device: torch.device, graphs: bool = True) -> CompiledPass:
    """The module lent as a CompiledPass whose runner replays its graphs, one per row count 1..K_MAX,
    captured now on placeholder inputs (the slots they write are rewritten before they are read)."""
    runner = GraphRunner(module, graphs)
    for k in EVERY_ROW_COUNT if graphs else ():
        tokens = torch.zeros(k, dtype=torch.long, device=device)
        if isinstance(module, StaticDraftStep):  # its further input: features [k, H]
            runner.capture(tokens, *feed_rows(0, k, device), module.embed.new_zeros(k, module.embed.shape[1]))
        else:
            runner.capture(tokens, *feed_rows(0, k, device))
    return CompiledPass(module, runner)
