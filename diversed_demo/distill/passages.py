"""Prompts over real, human-written passages for the draft: summaries, extraction, a question over a
section's paragraphs as retrieved passages (RAG) and translation into English.

A draft trained on the target's self-written passages (short, in its own words) accepted far less on
Spec-Bench's long articles and translation sources than on its held-out records (docs/embedded-pair.md).
These prompts carry long passages written by people, from free documentation that Debian packages:
the Debian Administrator's Handbook in English, German, French, Spanish and Italian, the Debian Reference
in English and German, and Python's tutorial, HOWTOs, FAQ and What's New. Nothing is downloaded: the
packages are unpacked under a root folder (`apt-get download` and `dpkg-deb -x`, docs/cli.md).

Each section of a page is one group, keyed across languages (the handbook's and the reference's
translations share page names and section order), joined with any group whose prompts share a run of
words (What's New copies the HOWTOs), so the held-out split keeps every prompt made from a text, in any
language, together.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from ..common.paths import ASSETS
from .prompts import TEMPLATES, prompt_groups, read_prompts

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
SKIPPED_TITLES = {"Legal Notice", "Copyright"}
# a full stop after these ends no sentence (German, Italian, English abbreviations)
ABBREVIATION = re.compile(
    r"(\b\w\.|\b(?:z\.B|d\.h|u\.a|bzw|evtl|ggf|usw|vgl|ca|Nr|inkl|etc|ecc|es|ad|e\.g|i\.e|cf|vs))\.$"
)
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
    """A page's sections: each h1–h4 heading with the prose paragraphs after it (deeper headings stay in
    their section), a paragraph being a <p> or a DocBook <div class="para">. Code blocks and link boxes are
    left out, and so is a paragraph that introduces a code block ("... looks like this:")."""

    def __init__(self):
        super().__init__(convert_charrefs=True)  # entities decoded once, here
        self.sections: list[tuple[str, list[str]]] = [("", [])]
        self.element: str | None = None  # the heading or paragraph tag being collected ...
        self.depth = 0  # ... and how deep in tags of its name we are inside it
        self.skip: list[str] = []  # the tags of the left-out elements we are inside
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if self.skip:
            if tag == self.skip[0]:  # nested in a left-out element of its own kind
                self.skip.append(tag)
        elif tag in ("pre", "script", "style") or ("class", "url") in attrs:
            self.skip = [tag]
            paragraphs = self.sections[-1][1]
            if tag == "pre" and paragraphs and paragraphs[-1].endswith(":"):
                paragraphs.pop()
        elif self.element is not None:
            self.depth += tag == self.element
        elif tag in ("h1", "h2", "h3", "h4", "p") or (tag == "div" and ("class", "para") in attrs):
            self.element, self.depth, self.text = tag, 1, []

    def handle_endtag(self, tag):
        if self.skip:
            if tag == self.skip[0]:
                self.skip.pop()
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


def page_sections(path: Path, root: Path, document: str, language: str) -> list[Section]:
    parser = SectionParser()
    parser.feed(Path(path).read_text(encoding="utf-8", errors="replace"))
    # the page without its language: de-DE/apt.html and en-US/apt.html, ch01.de.html and ch01.en.html
    page = str(Path(path).relative_to(root))
    page = re.sub(
        r"\.(en|de)\.html$", ".html", re.sub("/(" + "|".join(HANDBOOK_LANGUAGES.values()) + ")/", "/", page)
    )
    sections = []
    for index, (title, paragraphs) in enumerate(parser.sections):
        prose = [p for p in paragraphs if is_prose(p)]
        title = re.sub(r"^(?:Chapter\s+)?(?:\d+|[A-Z])(?:\.\d+)*\.\s+", "", title).strip("¶ ").strip()
        if prose and title not in SKIPPED_TITLES:
            sections.append(Section(document, language, f"{page}#{index}", title, prose))
    return sections


def is_prose(paragraph: str) -> bool:
    """A paragraph of sentences, not a caption, a command line or a table's cell."""
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return len(paragraph) >= 80 and letters >= 0.85 * len(paragraph) and bool(re.search(r"[.!?]", paragraph))


def sentences(paragraph: str) -> list[str]:
    """The paragraph's sentences, not split after an abbreviation ("z.B.", "e.g.") or an initial."""
    found: list[str] = []
    for piece in re.split(r"(?<=[.!?])\s+", paragraph.strip()):
        if found and ABBREVIATION.search(found[-1]):
            found[-1] = f"{found[-1]} {piece}"
        else:
            found.append(piece)
    return found


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
                if not path.name.startswith("index."):  # title pages: legal notices and versions
                    sections += page_sections(path, root, document, language)
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


def split(paragraphs: list[str], limit: int) -> list[str]:
    """The paragraphs in consecutive chunks of up to `limit` characters (a longer paragraph alone)."""
    chunks, start = [], 0
    while start < len(paragraphs):
        count = paragraphs_within(paragraphs, start, limit)
        chunks.append(" ".join(paragraphs[start : start + count]))
        start += count
    return chunks


def translation_sources(section: Section) -> list[str]:
    """The section's whole sentences in its own language, of a length to translate in one go."""
    return [
        s
        for paragraph in section.paragraphs
        for s in sentences(paragraph)
        if 40 <= len(s) <= 300
        and s[-1] in ".!?"
        and not ABBREVIATION.search(s)
        and in_language(s, section.language)
    ]


def as_object(title: str) -> str:
    """A title inside a question: "The sound infrastructure" → "the sound infrastructure"; Title Case,
    names and acronyms kept."""
    words = title.split()
    if len(words) > 1 and words[0].istitle() and all(w.islower() or not w[:1].isalpha() for w in words[1:]):
        return title[0].lower() + title[1:]
    return title


def section_prompts(section: Section, rng: random.Random) -> list[dict]:
    """The prompts one section gives: over its English text a summary and an extraction prompt (where it
    holds 600 characters) and a question over its paragraphs as retrieved passages (where they make two
    chunks); from a translation, sentences to translate."""
    row = {"document": section.document, "language": section.language, "group": section.group}
    if section.language != "English":
        candidates = translation_sources(section)
        picked = rng.sample(candidates, min(len(candidates), TRANSLATIONS_PER_SECTION[section.language]))
        prompts = [TRANSLATE_PROMPT.format(language=section.language, sentence=s) for s in picked]
        return [{**row, "category": "translation", "prompt": prompt} for prompt in prompts]
    rows = []
    text = split(section.paragraphs, 3500)[0]
    if len(text) >= 600:
        summary = rng.choice(SUMMARY_PROMPTS).format(passage=text)
        extraction = rng.choice(TEMPLATES["extraction"]).format(passage=split(section.paragraphs, 1500)[0])
        rows += [{**row, "category": "summarization", "prompt": summary}]
        rows += [{**row, "category": "extraction", "prompt": extraction}]
    chunks = split(section.paragraphs, 1200)[:4]
    if len(chunks) >= 2 and len(section.title) >= 3:
        question = rng.choice(RAG_QUESTIONS).format(title=as_object(section.title))
        question = section.title if section.title.endswith("?") else question  # the FAQ's titles ask
        rag = RAG_PROMPT.format(passages="\n".join(chunks), question=question)
        rows += [{**row, "category": "rag", "prompt": rag}]
    return rows


def build_passage_prompts(root: Path, seed: int = 0) -> list[dict]:
    """Every prompt the documents under `root` give, {category, document, language, group, prompt}."""
    rng = random.Random(seed)
    return [row for section in read_sections(root) for row in section_prompts(section, rng)]


def counts(rows: list[dict]) -> dict:
    """How many prompts, and how many of each category, document and language."""
    by = {
        f"by_{key}": dict(sorted(Counter(r[key] for r in rows).items()))
        for key in ("category", "document", "language")
    }
    return {"prompts": len(rows)} | by


def heldout_groups(rows: list[dict]) -> list[int]:
    """Each prompt's held-out group, the first index of it: prompts from one section (any language) and
    prompts sharing a run of 12 words (a text one document copies from another) go together."""
    # most=8: a passage's three English prompts, copied twice or so
    return prompt_groups(rows, most=8, keys=[row["group"] for row in rows])


def read_passage_prompts(path: Path = PASSAGE_PROMPTS_FILE) -> list[dict]:
    """The committed passage prompts, [] where they have not been built."""
    return read_prompts(path)
