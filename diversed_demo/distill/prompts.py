"""Broad training prompts for the draft: the target's own self-instructed requests and the project's
templates, across Spec-Bench's categories but never read from it (Spec-Bench is the evaluation set).

A draft learns what the target says after the prompts it trains on; trained on GSM8K, MBPP and a few
hundred instructions only, it agreed with the target far less on writing, summaries or translation. So the
target writes prompts of every category itself, seeded by the project's topic list
(assets/prompts/topics.txt), in three stages, the first two of them the target's sampled generations
(T = 0.8: at T = 1 the 135M target's requests were mostly incoherent):
1. passages: a short news article and an explanatory paragraph per topic (material for summaries,
   extraction, RAG and translation);
2. requests: per category and topic, the target is asked for one user request of that category; per
   passage, a question it answers; per sentence, the target's own translation into German, French or
   Spanish (source text for translating back to English);
3. assembly: requests cleaned and de-duplicated (ROUGE-L ≥ 0.7 against a kept one, as Self-Instruct
   does), and the project's templates filled with topics, passages and sentences.
Each stage's generations are kept in a work folder, written atomically, so a rerun resumes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path

import torch

from ..common.files import read_jsonl_gz, write_text
from ..common.paths import ASSETS
from ..core.prompt import encode_prompt
from ..runtime.batch_generation import generate_batch, padding_id

TOPICS_FILE = ASSETS / "prompts" / "topics.txt"
PROMPTS_FILE = ASSETS / "prompts" / "self_instruct.jsonl.gz"
TEMPERATURE = 0.8

PASSAGE_REQUESTS = [
    "Write a short news article about {topic}.",
    "Write one paragraph that explains {topic} to a curious reader.",
]
# what the target is asked, per category, to produce one user request of that category
SELF_INSTRUCT = {
    "writing": "Write one request that a user could send to an AI assistant asking for a poem, story, letter "
    "or speech about {topic}. Write only the request.",
    "roleplay": "Write one request asking an AI assistant to role-play a character who has to do with "
    "{topic}. Write only the request.",
    "reasoning": "Write one short logic puzzle about {topic}. Write only the puzzle.",
    "math": "Write one short math word problem about {topic}. Write only the problem.",
    "coding": "Write one request asking for a Python function that has to do with {topic}. Write only the "
    "request.",
    "stem": "Write one question a student might ask about the science of {topic}. Write only the question.",
    "humanities": "Write one question about {topic} in history, culture or society. Write only the question.",
    "qa": "Write one trivia question about {topic}. Write only the question.",
}
QUESTION_FOR_PASSAGE = "{passage}\n\nWrite one question that the text above answers. Write only the question."
TRANSLATE_OUT = "Translate into {language}: {sentence}"
LANGUAGES = ["German", "French", "Spanish"]
# the project's own templates, filled with a topic, a passage, a sentence or the target's own text
TEMPLATES = {
    "writing": [
        "Write a short poem about {topic}.",
        "Write a blog post about {topic}.",
        "Write a short story in which {topic} plays a part.",
        "Write a persuasive paragraph about {topic}.",
        "Write an email to a friend about {topic}.",
    ],
    "roleplay": [
        "Pretend you are a guide at an exhibition about {topic}. Welcome the visitors.",
        "Act as a teacher who loves {topic}. Introduce today's lesson.",
        "You are a reporter interviewing an expert on {topic}. Ask your first three questions.",
    ],
    "reasoning": [
        "Give three reasons why people care about {topic}, and explain each one step by step.",
        "Imagine a world without {topic}. What would change? Think it through step by step.",
    ],
    "stem": [
        "Explain how {topic} works to a high-school student.",
        "What can science tell us about {topic}?",
    ],
    "humanities": [
        "How has {topic} shaped human history?",
        "What ethical questions does {topic} raise?",
    ],
    "qa": ["Tell me about {topic}.", "Tell me three facts about {topic}."],
    "summarization": [
        "Summarize the following article in a few sentences.\n\n{passage}",
        "Write a one-paragraph summary of this text:\n\n{passage}",
        "{passage}\n\nSummarize the text above in three bullet points.",
    ],
    "extraction": [
        "Extract every name, place and number mentioned in the following text, as a list.\n\n{passage}",
        "Read the text below and list its key facts as JSON.\n\n{passage}",
        "{passage}\n\nWhat are the main topics of this text? Answer with a list of keywords.",
    ],
    "rag": [
        "Answer the question using the passage below.\n\nPassage: {passage}\n\nQuestion: {question}",
        "{passage}\n\nBased on the text above, {question}",
    ],
}
TRANSLATE_TO = "Translate the following sentence into {language}: {sentence}"
TRANSLATE_BACK = [
    "Translate this {language} text into English: {foreign}",
    "Translate from {language} to English:\n{foreign}",
]


def read_topics(path: Path = TOPICS_FILE) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def generate_texts(
    target, tokenizer, requests, max_new_tokens: int, seed: int, batch_size: int, progress=None
):
    """The target's sampled answer (T = TEMPERATURE) to each request, in order; progress(done, total)."""
    eos_id = tokenizer.eos_token_id
    pad_id = padding_id(tokenizer)
    order = sorted(range(len(requests)), key=lambda i: len(requests[i]))  # less padding
    texts = [""] * len(requests)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        prompts = [encode_prompt(tokenizer, requests[i]) for i in rows]
        generator = torch.Generator(device=target.device).manual_seed(seed * 100_003 + start)
        results = generate_batch(
            target, prompts, [False] * len(rows), max_new_tokens, eos_id, pad_id, generator,
            stop_fraction=1.0, temperature=TEMPERATURE,
        )  # fmt: skip
        for i, (ids, _) in zip(rows, results):
            texts[i] = tokenizer.decode(ids, skip_special_tokens=True)
        if progress:
            progress(start + len(rows), len(requests))
    return texts


def cached_stage(work_dir: Path, name: str, requests: list[str], make) -> list[str]:
    """A stage's texts for `requests`: from work_dir/name.json where it holds these very requests (other
    topics or seeds make it again), else made by make() and written atomically."""
    path = Path(work_dir) / f"{name}.json"
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("requests") == requests:
            return saved["texts"]
    texts = make()
    write_text(path, json.dumps({"requests": requests, "texts": texts}))
    return texts


LABEL = re.compile(r"^\s*(?:\d+[.)]\s*|(?:request|question|problem|puzzle|q|instruction)\s*:\s*)", re.I)


def clean_request(text: str, question: bool) -> str | None:
    """A generated request as a prompt: its first paragraph without a label or quotes, through its first
    question mark where it must be a question; None where nothing usable is left."""
    text = LABEL.sub("", text.strip().split("\n\n")[0]).strip().strip("\"'“”").strip()
    if question:
        if "?" not in text:
            return None
        text = text[: text.index("?") + 1]
    if not 15 <= len(text) <= 400 or "write only" in text.lower():
        return None
    return text


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def clean_passage(text: str, limit: int = 900) -> str | None:
    """Whole sentences of a generated passage up to `limit` characters; None if under 200."""
    kept = ""
    for sentence in sentences(text.replace("\n\n", " ")):
        if len(kept) + len(sentence) + 1 > limit:
            break
        kept = f"{kept} {sentence}".strip()
    return kept if len(kept) >= 200 else None


def dedupe(texts: list[str], threshold: float = 0.7) -> list[str]:
    """Texts in order, dropping any whose ROUGE-L F1 against a kept one reaches `threshold` (Self-Instruct's
    filter)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    kept: list[str] = []
    for text in texts:
        if all(scorer.score(other, text)["rougeL"].fmeasure < threshold for other in kept):
            kept.append(text)
    return kept


def make_passages(target, tokenizer, topics, work_dir, seed, batch_size, progress=None) -> list[dict]:
    """Stage 1: {topic, passage} for each topic and passage request the target answered usably."""
    requests = [(topic, r.format(topic=topic)) for topic in topics for r in PASSAGE_REQUESTS]

    texts = [r for _, r in requests]
    texts = cached_stage(
        work_dir,
        "passages",
        texts,
        lambda: generate_texts(target, tokenizer, texts, 224, seed, batch_size, progress),
    )
    cleaned = [(topic, clean_passage(text)) for (topic, _), text in zip(requests, texts)]
    return [{"topic": topic, "passage": passage} for topic, passage in cleaned if passage]


def make_requests(
    target, tokenizer, topics, passages, work_dir, seed, batch_size, progress=None
) -> list[dict]:
    """Stage 2: the target's requests per category and topic, questions per passage and translations of
    each passage's opening sentence, as rows {kind, category, topic, request, text, …}."""
    rng = random.Random(seed)
    jobs = [
        {"kind": "request", "category": c, "topic": t, "request": r.format(topic=t)}
        for t in topics
        for c, r in SELF_INSTRUCT.items()
    ]
    for p in passages:
        jobs.append({"kind": "question", "category": "rag", **p, "request": QUESTION_FOR_PASSAGE.format(**p)})
        sentence = first_sentence(p["passage"])
        language = rng.choice(LANGUAGES)
        request = TRANSLATE_OUT.format(language=language, sentence=sentence)
        extra = {"sentence": sentence, "language": language, "request": request}
        jobs.append({"kind": "translation", "category": "translation", **p, **extra})

    requests = [j["request"] for j in jobs]
    texts = cached_stage(
        work_dir,
        "requests",
        requests,
        lambda: generate_texts(target, tokenizer, requests, 96, seed + 1, batch_size, progress),
    )
    return [{**job, "text": text} for job, text in zip(jobs, texts)]


def first_sentence(passage: str, limit: int = 240) -> str:
    """The passage's first sentence, its first `limit` characters where longer."""
    return sentences(passage)[0][:limit]


def assemble(topics, passages, requests, seed) -> list[dict]:
    """Stage 3: every prompt, {category, how, prompt}: cleaned and de-duplicated self-instructed requests,
    then the templates filled in."""
    rng = random.Random(seed)
    rows = []
    for category in SELF_INSTRUCT:
        texts = [r["text"] for r in requests if r["kind"] == "request" and r["category"] == category]
        cleaned = [clean_request(t, question=category in ("stem", "humanities", "qa")) for t in texts]
        rows += [
            {"category": category, "how": "self-instruct", "prompt": p} for p in dedupe(filter(None, cleaned))
        ]
    for r in requests:
        if r["kind"] == "question" and (question := clean_request(r["text"], question=True)):
            prompt = rng.choice(TEMPLATES["rag"]).format(passage=r["passage"], question=question)
            rows.append({"category": "rag", "how": "self-instructed question", "prompt": prompt})
        elif r["kind"] == "translation" and (foreign := clean_request(r["text"], question=False)):
            template = rng.choice(TRANSLATE_BACK)
            prompt = template.format(language=r["language"], foreign=foreign)
            rows.append({"category": "translation", "how": "self-translated source", "prompt": prompt})
    for topic in topics:
        for category in ("writing", "roleplay", "reasoning", "stem", "humanities", "qa"):
            prompt = rng.choice(TEMPLATES[category]).format(topic=topic)
            rows.append({"category": category, "how": "template", "prompt": prompt})
    for p in passages:
        for category in ("summarization", "extraction"):
            prompt = rng.choice(TEMPLATES[category]).format(passage=p["passage"])
            rows.append({"category": category, "how": "template, self-written passage", "prompt": prompt})
        language = rng.choice(LANGUAGES)
        prompt = TRANSLATE_TO.format(language=language, sentence=first_sentence(p["passage"]))
        rows.append({"category": "translation", "how": "template, self-written sentence", "prompt": prompt})
    return rows


def build_prompts(
    target, tokenizer, work_dir, seed: int = 0, batch_size: int = 64, topics_file=TOPICS_FILE, progress=None
):
    """All three stages (resumable through work_dir); returns the prompt rows; progress(stage, done, total)
    reports each stage."""
    topics = read_topics(topics_file or TOPICS_FILE)

    def report(stage):
        return (lambda done, total: progress(stage, done, total)) if progress else None

    passages = make_passages(target, tokenizer, topics, work_dir, seed, batch_size, report("passages"))
    requests = make_requests(
        target, tokenizer, topics, passages, work_dir, seed, batch_size, report("requests")
    )
    return assemble(topics, passages, requests, seed)


def prompt_groups(rows: list[dict], words: int = 12, most: int = 5, keys: list | None = None) -> list[int]:
    """Each prompt's group, the first index of its group: prompts that share a run of `words` words found in
    at most `most` prompts (a passage, and the summary, extraction, question and translation prompts made
    from it) go together, and so do prompts with the same one of `keys` where given, so a held-out split by
    group never trains on a held-out prompt's passage. Runs found in more prompts are templates' own words,
    which say nothing of the content."""
    runs = []
    for row in rows:
        tokens = re.findall(r"\w+", row["prompt"].lower())
        runs.append({" ".join(tokens[i : i + words]) for i in range(len(tokens) - words + 1)})
    counts = Counter(run for found in runs for run in found)
    group = list(range(len(rows)))

    def root(i):
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    def join(i, j):
        a, b = sorted((root(i), root(j)))
        group[b] = a

    first_with_key: dict = {}
    for i, key in enumerate(keys or ()):
        join(i, first_with_key.setdefault(key, i))
    first_with: dict[str, int] = {}
    for i, found in enumerate(runs):
        for run in found:
            if counts[run] <= most:
                join(i, first_with.setdefault(run, i))
    return [root(i) for i in range(len(rows))]


def read_prompts(path: Path = PROMPTS_FILE) -> list[dict]:
    """The committed broad prompts, [] where they have not been built."""
    return read_jsonl_gz(path) if Path(path).exists() else []


def prompts_digest(path: Path = PROMPTS_FILE) -> str | None:
    """The sha256 of the prompt file's rows (its decompressed text: a gzip header may hold a time); the rows'
    keys in the shards are indices into it. None without a file."""
    if not Path(path).exists():
        return None
    return hashlib.sha256(gzip.decompress(Path(path).read_bytes())).hexdigest()


def prompts_digests(path: Path = PROMPTS_FILE) -> set[str]:
    """Every digest a shard folder may record for this prompt file: prompts_digest and, as runs logged
    before 2026-11-26 recorded, the sha256 of its bytes."""
    if not Path(path).exists():
        return set()
    return {prompts_digest(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()}
