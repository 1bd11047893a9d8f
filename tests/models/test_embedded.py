"""A few checks on the real embedded pair (SmolLM2-135M-Instruct target and its shipped EAGLE-3 draft)."""

import json
import subprocess
import sys

import pytest
import torch

from diversed_demo.core.generate import generate
from diversed_demo.models.eagle import Eagle3Draft
from diversed_demo.models.heads import load_head
from diversed_demo.runtime.plan import load_pair

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def embedded():
    return load_pair(dtype="float32")


def test_embedded_draft_is_a_feature_draft_on_the_target_embedding(embedded):
    assert isinstance(embedded.draft, Eagle3Draft)
    assert embedded.draft.embed_tokens.weight is embedded.target.get_input_embeddings().weight
    assert max(embedded.draft.aux_layer_ids) < embedded.target.config.num_hidden_layers
    assert embedded.tokenizer.chat_template  # chat prompts go through the template


def test_embedded_draft_proposes_only_its_vocabulary(embedded):
    vocab = embedded.draft.draft_token_ids.tolist()
    assert len(vocab) < embedded.vocab_size
    summary, events = generate(
        embedded,
        "Write a haiku about the sea.",
        mode="static",
        ensemble_weight=0.5,
        n_draft=3,
        max_new_tokens=24,
        seed=0,
    )
    drafted = {e.token_id for e in events if e.kind in ("accepted", "rejected")}
    assert drafted and drafted <= set(vocab)


@pytest.mark.parametrize("name", ["summarization", "general"])
def test_shipped_heads_load_and_decode_on_the_embedded_pair(embedded, name):
    head = load_head(name, embedded)  # refused if the draft, target or tokenizer changed since training
    summary, events = generate(
        embedded,
        "Summarize: the cat sat on the mat all day.",
        mode="dynamic",
        head=head,
        n_draft=3,
        max_new_tokens=12,
        seed=0,
    )
    assert summary.new_tokens > 0 and 0 <= summary.mean_w <= 1


def test_greedy_exact_sd_equals_greedy_target_on_embedded_pair(embedded):
    prompt = "Name three primary colors."
    reference, _ = generate(embedded, prompt, mode="ar", max_new_tokens=24, temperature=0)
    summary, _ = generate(embedded, prompt, mode="exact", n_draft=4, max_new_tokens=24, temperature=0)
    assert summary.token_ids == reference.token_ids
    assert reference.text.strip()


EXACTNESS_PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "What is 17 times 23? Show your steps.",
)


@pytest.mark.parametrize("prompt", EXACTNESS_PROMPTS)
def test_greedy_exact_sd_is_target_only_token_for_token_in_the_default_dtype(prompt):
    """As the app runs the pair (its dtype measured here, bf16 on most CPUs), at several draft lengths:
    a verification gives each position the logits a one-token pass gives it (block_attention.py)."""
    pair = load_pair(compiled="off")
    reference, _ = generate(pair, prompt, mode="ar", max_new_tokens=40, temperature=0)
    for n_draft in (2, 5, "auto"):
        summary, _ = generate(pair, prompt, mode="exact", n_draft=n_draft, max_new_tokens=40, temperature=0)
        assert summary.token_ids == reference.token_ids, (str(pair.runtime), n_draft)


@pytest.mark.slow
def test_cli_generate_json_on_embedded_pair():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diversed_demo.cli",
            "generate",
            "--prompt",
            "What is 2 + 3?",
            "--mode",
            "static",
            "--w",
            "0.5",
            "--max-new-tokens",
            "12",
            "--seed",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result["summary"]) == {
        "acceptance_rate",
        "tau",
        "new_tokens",
        "tokens_per_second",
        "wall_time_s",
    }
    emitted = [e for e in result["events"] if e["kind"] != "rejected"]
    assert len(emitted) == result["summary"]["new_tokens"] <= 12
    assert {"token_id", "text", "kind", "w", "p", "q", "accept_prob"} <= set(result["events"][0])


@pytest.mark.slow
def test_cli_plain_output_and_bad_input():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diversed_demo.cli",
            "generate",
            "--prompt",
            "Say hi.",
            "--mode",
            "exact",
            "--max-new-tokens",
            "8",
            "--temperature",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "acceptance" in out.stdout and "tok/s" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "diversed_demo.cli", "generate", "--prompt", "Hi", "--w", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "ensemble weight" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_the_memoised_gguf_conversion_equals_transformers_own(tmp_path, monkeypatch):
    """The cached conversion reads the GGUF once (models/gguf_patches.read_once); its weights, tokenizer and
    config must be exactly what transformers' own, unmemoised path gives."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from diversed_demo.models.embedded import embedded_gguf_path
    from diversed_demo.models.gguf_cache import _converted_gguf_dir

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    gguf_path = embedded_gguf_path()
    converted = _converted_gguf_dir(gguf_path)
    ours = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ours_tok = AutoTokenizer.from_pretrained(converted)
    theirs_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert (
        ours_tok.get_vocab() == theirs_tok.get_vocab() and ours_tok.chat_template == theirs_tok.chat_template
    )


@pytest.mark.slow
def test_the_converted_tokenizer_names_the_gguf_special_tokens(tmp_path, monkeypatch):
    """The special tokens come from the GGUF's own ids, whatever transformers made of them: 5.17 (the GPU
    image's) named <|im_start|> as EOS, which ended decodes at the wrong token and made every shipped head
    refuse the pair (the tokenizer fingerprint includes the special tokens)."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    from diversed_demo.models.embedded import embedded_gguf_path
    from diversed_demo.models.gguf_cache import _converted_gguf_dir, special_tokens_from_config

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    fields = gguf.GGUFReader(embedded_gguf_path()).fields
    gguf_ids = {
        name: int(fields[f"tokenizer.ggml.{key}_token_id"].contents())
        for name, key in [("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")]
    }
    converted = _converted_gguf_dir(embedded_gguf_path())
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert {name: getattr(tokenizer, f"{name}_token_id") for name in gguf_ids} == gguf_ids
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None  # what transformers 5.17 made of it
    special_tokens_from_config(tokenizer, AutoConfig.from_pretrained(converted))
    assert {name: getattr(tokenizer, f"{name}_token_id") for name in gguf_ids} == gguf_ids


def test_embedded_target_in_bf16_decodes_on_its_gguf_4bit_weights(monkeypatch):
    """In bf16 the target's 210 projections use the GGUF's own Q4_1 blocks (checked bitwise against its
    weights when first packed) through lean layers; its logits stay within bf16's own noise of transformers'
    bf16 layers: one-token, verification-sized and prompt passes."""
    from diversed_demo.core.cache import CachedLM
    from diversed_demo.runtime import gguf_int4
    from diversed_demo.runtime.gguf_int4 import GgufLinear
    from diversed_demo.runtime.lean_layer import LeanLlamaLayer
    from diversed_demo.runtime.stock import stock_layers

    monkeypatch.setattr(gguf_int4, "int4_pays", lambda dtype: True)  # what is tested is the computation
    pair = load_pair(dtype="bfloat16")
    target = pair.target
    assert sum(isinstance(m, GgufLinear) for name, m in target.named_modules() if name != "lm_head") == 210
    on_amx = len(target.model.layers[0].qkv) == 1
    assert (type(target.lm_head) is GgufLinear) == on_amx  # its Q8_0 blocks, multiplied as stored on AMX
    assert all(type(layer) is LeanLlamaLayer for layer in target.model.layers)
    ids = pair.tokenizer("The three primary colors are red, yellow and blue. Mixing them gives")["input_ids"]

    def passes():
        lm = CachedLM(target, pair.vocab_size)
        out = [lm.forward(torch.tensor(ids[:-8]), keep=4)[0]]
        for k in (1, 4, 7):
            out.append(lm.forward(torch.tensor(ids[-8:][:k]), keep=k)[0])
            lm.rollback(len(ids) - 8)
        return torch.cat(out).float()

    with torch.inference_mode():
        ours = passes()
        with stock_layers(target):
            stock = passes()
    kl = torch.nn.functional.kl_div(
        ours.log_softmax(-1), stock.log_softmax(-1), log_target=True, reduction="none"
    )
    assert kl.sum(-1).max() < 0.02  # bf16 against float32 is ~0.002–0.007 either way
    assert (ours.argmax(-1) == stock.argmax(-1)).float().mean() >= 0.9


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("llama_cpp") is None, reason="llama-cpp-python is optional"
)
def test_the_bench_times_llama_cpp_on_the_same_gguf(embedded):
    from diversed_demo.eval.bench import BENCH_DECODING, parse_modes, run_bench
    from diversed_demo.eval.tasks import app_examples
    from diversed_demo.models.embedded import embedded_gguf_path

    example = next(iter(app_examples().values()))[0]
    modes = parse_modes("ar,exact", embedded, BENCH_DECODING.replace(max_new_tokens=16))
    report = run_bench(embedded, [example], modes, n_draft=2, vs_llama_cpp=embedded_gguf_path())
    peer = report["llama_cpp"]
    assert peer["tokens_per_second"] > 0
    ours = report["overall"]["exact"]["tokens_per_second"]
    assert peer["ours_vs_llama_cpp"]["exact"] == pytest.approx(ours / peer["tokens_per_second"])
