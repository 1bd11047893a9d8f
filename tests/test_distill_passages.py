"""Training prompts over real passages of documentation: sections parsed from the packages' HTML, prompts
of each category, translation sources in their language only, and one held-out group per section across
languages."""

import collections

import pytest

from diversed_demo.common.files import write_jsonl_gz
from diversed_demo.distill import batches, data, passages

ENGLISH = [
    "The package manager keeps a list of every package it knows, and where each one can be downloaded from.",
    "Each line of the sources file names an archive, a release and the components wanted from that archive.",
    "When a new release comes out, the administrator updates these lines and asks for a full upgrade.",
]
GERMAN = [
    "Die Paketverwaltung kennt eine Liste aller Pakete und weiß, wo sie heruntergeladen werden können.",
    "Jede Zeile der Quellendatei nennt ein Archiv, eine Veröffentlichung und die gewünschten Komponenten.",
    "This sentence was left in English by the translators and is no source text to translate at all.",
]


def handbook_page(title: str, paragraphs: list[str]) -> str:
    paras = "".join(f'<div class="para">{p} <code class="command">apt</code></div>' for p in paragraphs)
    return (
        f'<html><body><h1 class="title">Book</h1><div class="section"><h2 class="title">6.1. {title}</h2>'
        f'{paras}<pre class="screen">$ apt update &amp;&amp; apt full-upgrade</pre></div></body></html>'
    )


@pytest.fixture
def docs(tmp_path):
    for code, title, paragraphs in [
        ("en-US", "The Sources File", ENGLISH),
        ("de-DE", "Die Quellendatei", GERMAN),
    ]:
        folder = tmp_path / "doc" / "debian-handbook" / "html" / code
        folder.mkdir(parents=True)
        (folder / "sect.apt-sources.html").write_text(handbook_page(title, paragraphs * 4), encoding="utf-8")
    tutorial = tmp_path / "doc" / "python3.11" / "html" / "tutorial"
    tutorial.mkdir(parents=True)
    (tutorial / "intro.html").write_text(
        "<h1>3. An Informal Introduction<a class='headerlink'>¶</a></h1>"
        + "".join(f"<p>{p}</p>" for p in ENGLISH * 5)
        + "<p>Figure 1</p><pre>&gt;&gt;&gt; 2 + 2</pre>",
        encoding="utf-8",
    )
    return tmp_path


def test_sections_keep_prose_and_leave_out_code_and_captions(docs):
    sections = passages.read_sections(docs)
    assert {(s.document, s.language) for s in sections} == {
        ("debian-handbook", "English"), ("debian-handbook", "German"), ("python-docs", "English")
    }  # fmt: skip
    handbook = next(s for s in sections if s.language == "English" and s.document == "debian-handbook")
    assert handbook.title == "The Sources File"  # its number left out
    assert handbook.paragraphs[0] == ENGLISH[0] + " apt"  # inline code kept, entities and tags gone
    text = " ".join(p for s in sections for p in s.paragraphs)
    assert "full-upgrade" not in text and "2 + 2" not in text and "Figure 1" not in text
    intro = next(s for s in sections if s.document == "python-docs")
    assert intro.title == "An Informal Introduction"


def test_every_category_is_built_and_translations_come_from_the_language_named(docs):
    rows = passages.build_passage_prompts(docs, seed=0)
    by_category = collections.Counter(r["category"] for r in rows)
    assert set(by_category) == {"summarization", "extraction", "rag", "translation"}
    translations = [r for r in rows if r["category"] == "translation"]
    assert translations and all(r["prompt"].startswith("Translate German to English: ") for r in translations)
    assert all("left in English" not in r["prompt"] for r in translations)
    rag = next(r for r in rows if r["category"] == "rag")
    assert rag["prompt"].count("\n") >= 2 and "sources file" in rag["prompt"].splitlines()[-1].lower()
    assert rows == passages.build_passage_prompts(docs, seed=0)  # a pure function of the pages and seed


def test_a_sections_prompts_in_every_language_are_held_out_together(docs, tmp_path, monkeypatch):
    rows = passages.build_passage_prompts(docs, seed=0)
    handbook = [i for i, r in enumerate(rows) if r["document"] == "debian-handbook"]
    assert {rows[i]["language"] for i in handbook} == {"English", "German"}
    assert len({rows[i]["group"] for i in handbook}) == 1  # one section, two languages: one group
    groups = {"passages": [r["group"] for r in rows]}
    for fraction in (0.3, 0.6, 0.9):
        held = {batches.is_heldout({"key": f"passages/{i}/s0"}, fraction, groups) for i in handbook}
        assert len(held) == 1
    prompt_file = tmp_path / "passages.jsonl.gz"
    write_jsonl_gz(prompt_file, rows)
    monkeypatch.setattr(passages, "PASSAGE_PROMPTS_FILE", prompt_file)
    monkeypatch.setattr(data, "read_passage_prompts", lambda: passages.read_passage_prompts(prompt_file))
    assert data.training_prompts()["passages"] == [r["prompt"] for r in rows]


def test_missing_documentation_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no documentation pages under"):
        passages.build_passage_prompts(tmp_path)
