"""Broad training prompts for the draft: the target's self-instructed requests, cleaned, de-duplicated and
assembled with the project's templates, resumably."""

import collections
import gzip
import json
import time

import pytest
import torch
from stats import chi_square_pvalue
from tiny import tiny_model, tiny_tokenizer

from diversed_demo.common.files import write_jsonl_gz
from diversed_demo.distill import batches, data, prompts
from diversed_demo.runtime.batch_generation import generate_batch


@pytest.fixture(scope="module")
def target():
    return tiny_model(0, 2)


def test_requests_are_cleaned_to_one_usable_prompt():
    assert (
        prompts.clean_request('Question: "What makes bees dance? They fly."', True)
        == "What makes bees dance?"
    )
    assert prompts.clean_request("1. Write a poem about rain.\n\nSure, here it is.", False) == (
        "Write a poem about rain."
    )
    assert prompts.clean_request("Bees are insects that make honey.", True) is None  # must ask something
    assert prompts.clean_request("Hi?", True) is None  # too short to be a request
    assert prompts.clean_request("Write only the request about bees, please.", False) is None  # an echo
    assert prompts.clean_request("x" * 500, False) is None


def test_passages_keep_whole_sentences_within_the_limit():
    text = " ".join(f"Sentence number {i} is about the sea." for i in range(60))
    passage = prompts.clean_passage(text, limit=300)
    assert len(passage) <= 300 and passage.endswith("sea.") and passage.startswith("Sentence number 0")
    assert prompts.clean_passage("Too short. Far too short.") is None


def test_near_duplicates_are_dropped_in_order():
    texts = [
        "Write a poem about the sea at night.",
        "Write a poem about the sea at night!",  # the same words
        "Write a short poem about the sea at night.",  # ROUGE-L F1 0.94
        "Explain how volcanoes form.",
    ]
    assert prompts.dedupe(texts) == [texts[0], texts[3]]
    assert prompts.dedupe(texts, threshold=1.01) == texts


def test_assembly_covers_every_category_from_the_stages_outputs():
    topics = ["volcanoes", "chess"]
    passage = " ".join(
        ["Chess is a board game for two players, played on a board of sixty-four squares."] * 4
    )
    passages = [{"topic": "chess", "passage": passage}]
    requests = [
        {"kind": "request", "category": c, "topic": t, "text": f"What should I know about {t} for {c}?"}
        for t in topics
        for c in prompts.SELF_INSTRUCT
    ]
    requests += [
        {"kind": "question", "category": "rag", **passages[0], "text": "How many squares does it have?"},
        {"kind": "translation", "category": "translation", **passages[0], "language": "German",
         "text": "Schach ist ein Brettspiel für zwei Spieler."},
    ]  # fmt: skip
    rows = prompts.assemble(topics, passages, requests, seed=0)
    by_category = collections.Counter(r["category"] for r in rows)
    expected = {*prompts.SELF_INSTRUCT, *prompts.TEMPLATES, "translation"}
    assert set(by_category) == expected
    rag = next(r["prompt"] for r in rows if r["how"] == "self-instructed question")
    assert passage in rag and "How many squares does it have?" in rag
    back = next(r["prompt"] for r in rows if r["how"] == "self-translated source")
    assert "German" in back and "Schach ist ein Brettspiel" in back
    assert len({r["prompt"] for r in rows}) == len(rows)
    assert rows == prompts.assemble(topics, passages, requests, seed=0)  # a function of the seed


def test_stages_are_generated_once_and_resumed(tmp_path, target, monkeypatch):
    tokenizer = tiny_tokenizer()
    topics_file = tmp_path / "topics.txt"
    topics_file.write_text("# seed topics\nthe cat\nthe dog\n")
    work = tmp_path / "work"
    rows = prompts.build_prompts(target, tokenizer, work, seed=0, batch_size=8, topics_file=topics_file)
    assert sorted(p.name for p in work.iterdir()) == ["passages.json", "requests.json"]
    passages = json.loads((work / "passages.json").read_text())["texts"]
    assert len(passages) == 2 * len(prompts.PASSAGE_REQUESTS)
    usable = sum(prompts.clean_passage(text) is not None for text in passages)
    requests = json.loads((work / "requests.json").read_text())["texts"]
    assert len(requests) == 2 * len(prompts.SELF_INSTRUCT) + 2 * usable
    templated = collections.Counter(r["category"] for r in rows if r["how"] == "template")
    assert templated == dict.fromkeys(("writing", "roleplay", "reasoning", "stem", "humanities", "qa"), 2)

    def must_not_generate(*args, **kwargs):
        raise AssertionError("a finished stage was generated again")

    with monkeypatch.context() as patch:
        patch.setattr(prompts, "generate_texts", must_not_generate)
        again = prompts.build_prompts(target, tokenizer, work, seed=0, batch_size=8, topics_file=topics_file)
        assert again == rows
    # other topics: the saved texts answer other requests, so the stages are made again
    topics_file.write_text("the bird\n")
    other = prompts.build_prompts(target, tokenizer, work, seed=0, batch_size=8, topics_file=topics_file)
    assert {r["prompt"] for r in other if r["how"] == "template"} == {
        r["prompt"] for r in prompts.assemble(["the bird"], [], [], seed=0)
    }
    assert len(json.loads((work / "passages.json").read_text())["texts"]) == len(prompts.PASSAGE_REQUESTS)
    out = tmp_path / "si.jsonl.gz"
    write_jsonl_gz(out, rows)
    assert prompts.read_prompts(out) == rows
    with gzip.open(out, "rt") as f:
        assert sum(1 for _ in f) == len(rows)
    assert prompts.read_prompts(tmp_path / "absent.jsonl.gz") == []


def test_sampling_temperature_sharpens_the_first_token_as_softmax_of_logits_over_t(target):
    prompt = [1, 5, 6]
    rows = 3000
    temperature = 0.5
    g = torch.Generator().manual_seed(0)
    results = generate_batch(target, [prompt] * rows, [False] * rows, 1, 2, 3, g, temperature=temperature)
    observed = collections.Counter(ids[0] for ids, _ in results)
    with torch.no_grad():
        logits = target(torch.tensor([prompt])).logits[0, -1].float()
    expected = dict(enumerate(torch.softmax(logits / temperature, -1).tolist()))
    assert chi_square_pvalue(observed, expected) > 1e-3
    flat = dict(enumerate(torch.softmax(logits, -1).tolist()))
    assert chi_square_pvalue(observed, flat) < 1e-6  # T = 1 is told apart: the test has power


def test_generation_can_be_limited_to_some_sources(tmp_path, target, monkeypatch):
    monkeypatch.setattr(
        data,
        "training_prompts",
        lambda: {"instructions": ["the cat"], "gsm8k": ["one two"], "broad": ["a dog"]},
    )
    tokenizer = tiny_tokenizer()
    data.generate_shards(target, tokenizer, tmp_path, target_tokens=10_000, batch_size=4, max_new_tokens=6,
                         sources=["broad"])  # fmt: skip
    assert {r["source"] for r in data.load_records(tmp_path)} == {"broad"}
    with pytest.raises(ValueError, match="unknown source"):
        data.generate_shards(target, tokenizer, tmp_path, sources=["spec_bench"])


def test_shards_are_not_resumed_against_other_broad_prompts(tmp_path, target, monkeypatch):
    monkeypatch.setattr(data, "training_prompts", lambda: {"broad": ["a dog", "the cat"]})
    prompt_file = tmp_path / "broad.jsonl.gz"
    write_jsonl_gz(prompt_file, [{"prompt": "a dog"}, {"prompt": "the cat"}])
    monkeypatch.setattr(data, "PROMPT_FILES", {"broad": prompt_file})
    shards = tmp_path / "shards"
    tokenizer = tiny_tokenizer()
    data.generate_shards(
        target, tokenizer, shards, target_tokens=1, batch_size=2, max_new_tokens=4, command="a"
    )
    time.sleep(1.1)  # gzip's header could hold the time: rebuilt with the same rows, the file still matches
    write_jsonl_gz(prompt_file, [{"prompt": "a dog"}, {"prompt": "the cat"}])
    data.generate_shards(target, tokenizer, shards, target_tokens=2, batch_size=2, max_new_tokens=4)
    write_jsonl_gz(prompt_file, [{"prompt": "the cat"}, {"prompt": "a dog"}])  # rebuilt: indices moved
    with pytest.raises(ValueError, match="not the file the shards"):
        data.generate_shards(target, tokenizer, shards, target_tokens=100, batch_size=2, max_new_tokens=4)


def test_prompts_made_from_one_passage_are_held_out_together():
    passage = "the old mill by the river ground flour for the whole valley until the flood of that wet spring"
    other = "a small robot learned to sort the red and blue bricks on the floor of a quiet workshop each day"
    template = "Read the text below and write a short summary of it in your own words please, "
    rows = [
        {"prompt": template + passage},
        {"prompt": f"Which facts does this text state? {passage}"},
        {"prompt": template + other},
        {"prompt": "Write a poem about volcanoes."},
    ]
    rows += [{"prompt": template + f"text number {i} is short"} for i in range(6)]  # the template alone
    groups = prompts.prompt_groups(rows)
    assert groups[0] == groups[1] == 0  # one passage: one group
    assert len(set(groups[2:])) == len(rows) - 2  # a template's own words join nothing
    records = [{"key": f"broad/{i}/s0", "source": "broad"} for i in range(len(rows))]
    for fraction in (0.2, 0.5, 0.8):
        held = [batches.is_heldout(r, fraction, {"broad": groups}) for r in records]
        assert held[0] == held[1]
