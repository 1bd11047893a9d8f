"""The GPU's graphed passes (runtime/cuda_graphs.py) without the graphs, which need CUDA: a transformers
model over transformers' static cache and the EAGLE-3 draft's step, each fed a mask as wide as its cache
as a graph is, compute what the eager passes do, through rollbacks, restarts and a cache that runs out;
decodes on them are the eager decodes."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_feature_pair
from references import AUX, TREE_PARENTS, decode_like, random_feeds, tree_logits_match_paths
from tiny import tiny_pair

from diversed_demo.core.generate import generate
from diversed_demo.runtime.cuda_graphs import HFStaticPass, attach_graphs, graphed_pass

PROMPT = "Summarize: the village opened its first public swimming pool on Saturday."


@pytest.mark.parametrize("max_len", [128, 48])  # 48: the cache runs out and the decode goes on eagerly
def test_a_decode_over_transformers_static_cache_computes_the_eager_one(max_len):
    model = copy.deepcopy(tiny_pair().target)
    aux = (0, 1)
    feeds, rollbacks = random_feeds(0, model.config.vocab_size, passes=10, prompt=30)
    eager, _ = decode_like(model, feeds, rollbacks, aux)
    static_pass = HFStaticPass(model, aux, max_len)
    assert not static_pass.buffers_of_layer(0)[0].requires_grad  # its allocating pass keeps no autograd graph
    runner = graphed_pass(static_pass, torch.device("cpu"), graphs=False)
    static, held = decode_like(model, feeds, rollbacks, aux, runner=runner)
    assert held == (max_len == 128)
    for (a, _, a_aux), (b, _, b_aux) in zip(eager, static, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b_aux, a_aux, rtol=1e-4, atol=1e-4)


def test_a_tree_over_transformers_static_cache_scores_each_node_as_its_path():
    """A draft tree's rows see their ancestors only, as the mask it is fed says (transformers' own mask,
    built from the slots, let a node see its siblings: the GPU's tree passes were wrong)."""
    model = copy.deepcopy(tiny_pair().target)
    tokens = torch.tensor([7, 9, 11, 13, 15, 17])

    def runner():
        return graphed_pass(HFStaticPass(model, AUX, 128), torch.device("cpu"), graphs=False)

    with torch.no_grad():  # as attach_graphs builds them: a static cache is no inference tensor
        tree_lm, _ = tree_logits_match_paths(model, runner, torch.arange(4, 24), tokens, TREE_PARENTS, False)
        assert tree_lm.compiled is not None  # the tree ran on the static pass, not eagerly
        tree_lm.close()


ON_A_GPU = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
)


@pytest.mark.parametrize("device", ["cpu", ON_A_GPU])  # on the CPU without the graphs; on a GPU with them
@pytest.mark.parametrize("kind", ["standalone", "feature"])
def test_decodes_on_the_attached_passes_are_the_eager_decodes(kind, device):
    pair = copy.deepcopy(tiny_pair() if kind == "standalone" else tiny_feature_pair())
    pair.target.to(device)
    pair.draft.to(device)
    pair.device = torch.device(device)
    runs = {
        "exact": dict(mode="exact"),
        "static": dict(mode="static", ensemble_weight=0.5),
        "exact-tree": dict(mode="exact", tree="3,3,4,7"),
    }
    settings = dict(n_draft=3, max_new_tokens=24, temperature=0.0)
    eager = {name: generate(pair, PROMPT, **run, **settings)[0].token_ids for name, run in runs.items()}
    target_only = generate(pair, PROMPT, mode="ar", **settings)[0].token_ids
    lines = []
    attach_graphs(pair, log=lines.append, graphs=device == "cuda")
    assert pair.target_pass is not None and pair.draft_pass is not None, lines
    for name, run in runs.items():
        assert generate(pair, PROMPT, **run, **settings)[0].token_ids == eager[name]
    assert generate(pair, PROMPT, mode="ar", **settings)[0].token_ids == target_only
    assert eager["exact"] == eager["exact-tree"] == target_only  # the target's own text on them too


def test_a_pass_that_disagrees_is_not_attached(monkeypatch):
    from diversed_demo.runtime import cuda_graphs

    pair = copy.deepcopy(tiny_feature_pair())
    monkeypatch.setattr(cuda_graphs, "agrees_with_eager", lambda *args: False)
    lines = []
    attach_graphs(pair, log=lines.append, graphs=False)
    assert pair.target_pass is None
    assert any("target's pass" in line and "eager" in line for line in lines)
    assert pair.draft_pass is not None  # the draft's check is its own


def test_graphs_whose_tree_rows_see_their_siblings_are_not_attached(monkeypatch):
    """The attach check scores a draft tree against chains over each node's path: a pass that lets a node
    see its siblings (as transformers' own mask from the slots did) stays eager."""
    from diversed_demo.runtime import cuda_graphs

    pair = copy.deepcopy(tiny_pair())
    for model in (pair.target, pair.draft):  # logits on a real model's scale, past the check's bf16 slack
        model.lm_head.weight.data.mul_(20)
    forward = cuda_graphs.HFStaticPass.forward
    monkeypatch.setattr(  # the old fault: the slots' causal mask, whatever the tree's
        cuda_graphs.HFStaticPass,
        "forward",
        lambda self, tokens, positions, mask: forward(
            self,
            tokens,
            positions,
            torch.arange(mask.shape[1]) <= positions[0] + torch.arange(len(tokens))[:, None],
        ),
    )
    lines = []
    attach_graphs(pair, log=lines.append, graphs=False)
    assert pair.target_pass is None and pair.draft_pass is None, lines
    assert any("target's pass" in line and "eager" in line for line in lines)


def test_a_model_spread_over_several_devices_stays_eager():
    pair = copy.deepcopy(tiny_feature_pair())
    pair.target.hf_device_map = {"model.layers.0": 0, "model.layers.1": "cpu"}  # as accelerate marks one
    lines = []
    attach_graphs(pair, log=lines.append, graphs=False)
    assert pair.target_pass is None and lines == ["a model spread over several devices stays eager"]
