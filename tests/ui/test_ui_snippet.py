"""The dial in transformers: the snippet names what w weighs, covers w = 0 and w = 1, and compiles."""

from __future__ import annotations

from diversed_demo.ui import snippet


def test_the_transformers_snippet_names_what_w_weighs_and_compiles(pair):
    hub = snippet.transformers_snippet("org/big", "org/small", 0.35, 1.0, 64)
    assert "assistant_model=draft" in hub and "assistant_ensemble_weight=0.35" in hub
    assert (
        "applies to the TARGET" in hub and 'from_pretrained("org/small")' in hub and "do_sample=True" in hub
    )
    exact = snippet.transformers_snippet("org/big", "org/small", 1.0, 0.0, 64)
    assert "assistant_ensemble_weight" not in exact
    relaxed = snippet.transformers_snippet("org/big", "org/small", 0.0, 1.0, 64)
    assert "assistant_ensemble_weight=0.01" in relaxed
    local = snippet.pair_snippet(
        pair, 0.5, 0.0, 32
    )  # the tiny pair is not on the hub: loaded with this package
    assert "load_pair(" in local and "do_sample=False" in local
    feature = snippet.transformers_snippet("org/big", "assets/draft", 0.5, 1.0, 64, feature_draft=True)
    assert "EAGLE-3" in feature
    for text in (hub, local, feature):
        compile(text, "snippet", "exec")
