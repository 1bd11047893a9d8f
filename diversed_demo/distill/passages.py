"""Prompts over real, human-written passages for the draft: summaries, extraction, questions over
several passages (RAG) and translation into English.

A draft trained on the target's self-written passages (short, in its own words) accepted far less on
Spec-Bench's long articles and translation sources than on its held-out records (docs/embedded-pair.md).
These prompts carry long passages written by people, from free documentation that Debian packages:
the Debian Administrator's Handbook in English, German, French, Spanish and Italian, the Debian Reference
in English and German, and Python's tutorial, HOWTOs, FAQ and What's New. Nothing is downloaded: the
packages are unpacked under a root folder (`apt-get download` and `dpkg-deb -x`, docs/cli.md).

Each section of a page is one group, keyed across languages (the handbook's and the reference's
translations share page names and section order), so the held-out split keeps every prompt made from a
section, in any language, together.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import random
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from ..common.files import read_jsonl_gz
from ..common.paths import ASSETS
from .prompts import TEMPLATES, sentences

PASSAGE_PROMPTS_FILE = ASSETS / "prompts" / "passages.jsonl.gz"
# where each document's pages lie under the root, by language (as Debian installs them under /usr/share)
HANDBOOK_LANGUAGES = {
    "English": "en-US",
    "German": "de-DE",
    "French": "fr-FR",
    "Spanish": "es-ES",
    "Italian": "it-IT",
}
DOCUMENTS = {
    "debian-handbook": [
        (lang, f"doc/debian-handbook/html/{code}/*.html") for lang, code in HANDBOOK_LANGUAGES.items()
    ],
    "debian-reference": [("English", "debian-reference/*.en.html"), ("German", "debian-reference/*.de.html")],
    "python-docs": [
        ("English", f"doc/python3.11/html/{part}/*.html") for part in ("tutorial", "howto", "faq", "whatsnew")
    ],
}
SUMMARY_PROMPTS = ["Summarize: {passage}", *TEMPLATES["summarization"]]
RAG_PROMPT = "{passages}\n{question}"
RAG_QUESTIONS = [
    "What does the text say about {title}?",
    "Explain {title} using the passages above.",
    "Based on the passages above, what should a reader know about {title}?",
]
TRANSLATE_PROMPT = "Translate {language} to English: {sentence}"
# German is Spec-Bench's source language, so it gets most of the translation prompts
TRANSLATIONS_PER_SECTION = {"German": 2, "French": 1, "Spanish": 1, "Italian": 1}
# common words of each language: a sentence left untranslated (in English) is no source to translate
COMMON_WORDS = {
    "English": {"the", "and", "is", "of", "to", "this", "that", "with", "are", "for"},
    "German": {"der", "die", "das", "und", "ist", "nicht", "mit", "sich", "ein", "eine", "auf", "zu"},
    "French": {"le", "la", "les", "et", "est", "des", "une", "dans", "pour", "pas", "sur", "qui"},
    "Spanish": {"el", "la", "los", "las", "y", "es", "una", "del", "para", "por", "con", "que"},
    "Italian": {"il", "la", "di", "che", "è", "e", "una", "per", "non", "del", "della", "sono"},
}


@dataclass
class Section:
    document: str
    language: str
    group: str  # the same section in every language
    title: str
    paragraphs: list[str]


class SectionParser(HTMLParser):
    """A page's sections: each h1–h4 heading with the prose paragraphs after it, a paragraph being a <p> or
    a DocBook <div class="para"> (code blocks left out)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections: list[tuple[str, list[str]]] = [("", [])]
        self.element: str | None = None  # the heading or paragraph tag being collected ...
        self.depth = 0  # ... and how deep in tags of its name we are inside it
        self.skip = 0  # depth inside <pre>, <script>, <style>
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("pre", "script", "style"):
            self.skip += 1
        elif self.element is not None:
            self.depth += tag == self.element
        elif tag in ("h1", "h2", "h3", "h4", "p") or (tag == "div" and ("class", "para") in attrs):
            self.element, self.depth, self.text = tag, 1, []

    def handle_endtag(self, tag):
        if tag in ("pre", "script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag == self.element:
            self.depth -= 1
            if self.depth == 0:
                self.finish()

    def finish(self):
        text = re.sub(r"\s+", " ", "".join(self.text)).strip()
        if self.element.startswith("h"):
            self.sections.append((text, []))
        elif text:
            self.sections[-1][1].append(text)
        self.element = None

    def handle_data(self, data):
        if self.element is not None and not self.skip:
            self.text.append(data)


def page_sections(path: Path, document: str, language: str, root: Path) -> list[Section]:
    parser = SectionParser()
    parser.feed(Path(path).read_text(encoding="utf-8", errors="replace"))
    # the page's name without its language: ch01.de.html and ch01.en.html are one page
    page = re.sub(r"\.(en|de)\.html$", ".html", Path(path).name)
    sections = []
    for index, (title, paragraphs) in enumerate(parser.sections):
        prose = [html.unescape(p) for p in paragraphs if is_prose(p)]
        title = re.sub(r"^[\dA-Z]+(\.\d+)*\.?\s+", "", title).strip("¶ ").strip()
        if prose:
            sections.append(Section(document, language, f"{document}/{page}#{index}", title, prose))
    return sections


def is_prose(paragraph: str) -> bool:
    """A paragraph of sentences, not a caption, a command line or a table's cell."""
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return len(paragraph) >= 80 and letters >= 0.85 * len(paragraph) and re.search(r"[.!?]", paragraph)


def in_language(sentence: str, language: str) -> bool:
    """Whether the sentence has more of the language's common words than of English's."""
    words = re.findall(r"\w+", sentence.lower())
    hits = sum(w in COMMON_WORDS[language] for w in words)
    return hits >= 2 and hits > sum(w in COMMON_WORDS["English"] for w in words)


def read_sections(root: Path) -> list[Section]:
    """Every section of every document found under `root`, in a stable order."""
    root = Path(root)
    sections = []
    for document, patterns in DOCUMENTS.items():
        for language, pattern in patterns:
            for path in sorted(root.glob(pattern)):
                sections += page_sections(path, document, language, root)
    if not sections:
        wanted = ", ".join(pattern for patterns in DOCUMENTS.values() for _, pattern in patterns)
        raise ValueError(f"no documentation pages under {root}: expected {wanted} (see docs/cli.md)")
    return sections


def paragraphs_within(paragraphs: list[str], start: int, limit: int) -> int:
    """How many whole paragraphs from `start` fit in `limit` characters (at least one)."""
    count, length = 1, len(paragraphs[start])
    while start + count < len(paragraphs) and length + len(paragraphs[start + count]) + 1 <= limit:
        length += len(paragraphs[start + count]) + 1
        count += 1
    return count


def passage(paragraphs: list[str], start: int, limit: int) -> str:
    """Whole paragraphs from `start`, up to `limit` characters (at least the first)."""
    return " ".join(paragraphs[start : start + paragraphs_within(paragraphs, start, limit)])


def split(paragraphs: list[str], limit: int) -> list[str]:
    """The paragraphs in consecutive chunks of up to `limit` characters (a longer paragraph alone)."""
    chunks, start = [], 0
    while start < len(paragraphs):
        count = paragraphs_within(paragraphs, start, limit)
        chunks.append(" ".join(paragraphs[start : start + count]))
        start += count
    return chunks


def section_prompts(section: Section, rng: random.Random) -> list[dict]:
    """The prompts one section gives: a summary and an extraction prompt over its English text, a question
    over its paragraphs as retrieved passages, or sentences of it to translate."""
    row = {"document": section.document, "language": section.language, "group": section.group}
    text = passage(section.paragraphs, 0, 3500)
    if section.language != "English":
        candidates = [
            s
            for s in sentences(" ".join(section.paragraphs))
            if 40 <= len(s) <= 300 and in_language(s, section.language)
        ]
        picked = rng.sample(candidates, min(len(candidates), TRANSLATIONS_PER_SECTION[section.language]))
        return [
            {**row, "category": "translation", "prompt": TRANSLATE_PROMPT.format(language=section.language,
                                                                                   sentence=s)}
            for s in picked
        ]  # fmt: skip
    rows = []
    if len(text) >= 600:
        rows.append(
            {**row, "category": "summarization", "prompt": rng.choice(SUMMARY_PROMPTS).format(passage=text)}
        )
        short = passage(section.paragraphs, 0, 1500)
        extraction = rng.choice(TEMPLATES["extraction"]).format(passage=short)
        rows.append({**row, "category": "extraction", "prompt": extraction})
    if len(split(section.paragraphs, 1200)) >= 2 and len(section.title) >= 3:
        chunks = split(section.paragraphs, 1200)[:4]
        title = (
            section.title[0].lower() + section.title[1:] if section.title[1:2].islower() else section.title
        )
        question = rng.choice(RAG_QUESTIONS).format(title=title)
        rows.append(
            {
                **row,
                "category": "rag",
                "prompt": RAG_PROMPT.format(passages="\n".join(chunks), question=question),
            }
        )
    return rows


def build_passage_prompts(root: Path, seed: int = 0) -> list[dict]:
    """Every prompt the documents under `root` give, {category, document, language, group, prompt}."""
    rng = random.Random(seed)
    return [row for section in read_sections(root) for row in section_prompts(section, rng)]


def read_passage_prompts(path: Path = PASSAGE_PROMPTS_FILE) -> list[dict]:
    """The committed passage prompts, [] where they have not been built."""
    return read_jsonl_gz(path) if Path(path).exists() else []


def passage_prompts_digest(path: Path = PASSAGE_PROMPTS_FILE) -> str | None:
    """The sha256 of the file's rows; the shards' keys are indices into it."""
    if not Path(path).exists():
        return None
    return hashlib.sha256(gzip.decompress(Path(path).read_bytes())).hexdigest()
