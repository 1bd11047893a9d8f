"""Training prompts over real passages of documentation: sections parsed from the packages' HTML, prompts
of each category, translation sources whole and in their language only, and held-out groups that keep a
text's prompts together across languages and copies."""

import collections

import pytest
from tiny import tiny_model, tiny_tokenizer

from diversed_demo.common.files import write_jsonl_gz
from diversed_demo.distill import batches, data, passages

ENGLISH = [
    "The package manager keeps a list of every package it knows, and where each one can be downloaded from.",
    "Each line of the sources file names an archive, a release and the components wanted from that archive.",
    "When a new release comes out, the administrator updates these lines and asks for a full upgrade.",
]
GERMAN = [
    "Die Paketverwaltung kennt eine Liste aller Pakete und weiß, wo sie heruntergeladen werden können.",
    "Jede Zeile nennt z.B. ein Archiv, eine Veröffentlichung und die gewünschten Komponenten des Archivs.",
    "This sentence was left in English by the translators and is no source text to translate at all.",
]


def handbook_page(title: str, paragraphs: list[str]) -> str:
    paras = "".join(f'<div class="para">{p} <code class="command">apt</code></div>' for p in paragraphs)
    return (
        f'<html><body><h1 class="title">Book</h1><div class="section"><h2 class="title">6.1. {title}</h2>'
        f'<div class="url">→ <a href="https://www.debian.org/">https://www.debian.org/</a></div>{paras}'
        '<div class="para">The line that the administrator adds to the sources file looks like this:</div>'
        '<pre class="screen">$ apt update &amp;&amp; apt full-upgrade</pre></div></body></html>'
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
        (folder / "index.html").write_text(handbook_page("Legal Notice", paragraphs * 4), encoding="utf-8")
    whatsnew = tmp_path / "doc" / "python3.11" / "html" / "whatsnew"
    whatsnew.mkdir(parents=True)
    (whatsnew / "3.10.html").write_text(
        "<h1>PEP 634: Structural Pattern Matching<a class='headerlink'>¶</a></h1>"
        + "".join(f"<p>{p} Write &amp;lt;b&amp;gt; for bold.</p>" for p in ENGLISH * 5)
        + "<p>Figure 1</p><pre>&gt;&gt;&gt; 2 + 2</pre>"
        + "<h2>C API Changes</h2>"
        "<p>Another section, on the C interface of the interpreter, that no other section shares.</p>",
        encoding="utf-8",
    )
    return tmp_path


def test_sections_keep_prose_and_leave_out_code_links_and_title_pages(docs):
    sections = passages.read_sections(docs)
    assert {(s.document, s.language, s.title) for s in sections} == {
        ("debian-handbook", "English", "The Sources File"),  # its number left out
        ("debian-handbook", "German", "Die Quellendatei"),
        ("python-docs", "English", "PEP 634: Structural Pattern Matching"),  # "PEP" is no number
        ("python-docs", "English", "C API Changes"),
    }  # index.html, the title page with its legal notice, gives none
    handbook = next(s for s in sections if s.language == "English" and s.document == "debian-handbook")
    assert handbook.paragraphs[0] == ENGLISH[0] + " apt"  # inline code kept
    text = " ".join(p for s in sections for p in s.paragraphs)
    for left_out in ("full-upgrade", "2 + 2", "Figure 1", "https://", "looks like this:"):
        assert left_out not in text  # code blocks, captions, link boxes, a code block's introduction
    assert "Write &lt;b&gt; for bold." in text  # entities decoded once: the page's own text


def test_every_category_is_built_and_translations_are_whole_sentences_of_the_language_named(docs):
    rows = passages.build_passage_prompts(docs, seed=0)
    assert set(collections.Counter(r["category"] for r in rows)) == {
        "summarization",
        "extraction",
        "rag",
        "translation",
    }
    translations = [r["prompt"] for r in rows if r["category"] == "translation"]
    assert len(translations) == passages.TRANSLATIONS_PER_SECTION["German"]
    assert sorted(translations) == sorted(
        f"Translate German to English: {s}" for s in GERMAN[:2]
    )  # "z.B." kept
    rag = next(r["prompt"] for r in rows if r["category"] == "rag").splitlines()
    assert len(rag) >= 3 and "the sources file" in rag[-1].lower()  # passages, then the question
    assert passages.as_object("The sound infrastructure") == "the sound infrastructure"
    for kept in ("The Sources File", "Knoppix", "IDLE and idlelib"):  # Title Case, names, acronyms
        assert passages.as_object(kept) == kept
    assert rows == passages.build_passage_prompts(docs, seed=0)  # a pure function of the pages and seed


def test_a_texts_prompts_in_every_language_and_copy_are_held_out_together(docs):
    rows = passages.build_passage_prompts(docs, seed=0)
    groups = passages.heldout_groups(rows)
    handbook = [i for i, r in enumerate(rows) if r["document"] == "debian-handbook"]
    assert {rows[i]["language"] for i in handbook} == {"English", "German"}
    assert len({groups[i] for i in handbook}) == 1  # one section, two languages
    pep = [i for i, r in enumerate(rows) if r["document"] == "python-docs"]
    assert groups[pep[0]] == groups[handbook[0]]  # What's New copied the handbook's sentences
    copied = [
        {**rows[i], "prompt": f"Translate German to English: unrelated text number {i}"} for i in handbook
    ]
    assert len(set(passages.heldout_groups(copied))) == 1  # no shared words: grouped by section alone
    keyed = {"passages": groups}
    for fraction in (0.3, 0.6, 0.9):
        assert (
            len({batches.is_heldout({"key": f"passages/{i}/s0"}, fraction, keyed) for i in handbook + pep})
            == 1
        )
    # a prompt beyond the groups given is held out by its own key
    beyond = [batches.is_heldout({"key": f"passages/{len(rows) + k}/s0"}, 0.5, keyed) for k in range(40)]
    assert 0 < sum(beyond) < 40


def test_shards_are_refused_against_another_passage_file_only_where_they_hold_passages(tmp_path, monkeypatch):
    prompt_file = tmp_path / "passages.jsonl.gz"
    write_jsonl_gz(prompt_file, [{"prompt": "the cat"}, {"prompt": "a dog"}])
    monkeypatch.setattr(
        data, "training_prompts", lambda: {"passages": ["the cat", "a dog"], "gsm8k": ["one two"]}
    )
    monkeypatch.setattr(data, "PROMPT_FILES", {"passages": prompt_file})
    target, tokenizer = tiny_model(0, 2), tiny_tokenizer()

    def generate(folder, sources):
        data.generate_shards(
            target, tokenizer, folder, 10_000, batch_size=2, max_new_tokens=4, sources=sources
        )

    generate(tmp_path / "math", ["gsm8k"])
    generate(tmp_path / "mixed", None)
    assert "passages_prompts_sha256" not in data.read_runs(tmp_path / "math")[0]
    write_jsonl_gz(prompt_file, [{"prompt": "a dog"}, {"prompt": "the cat"}])  # rebuilt: indices moved
    data.check_prompt_files_unchanged(tmp_path / "math")  # holds no passage shards: still fine
    with pytest.raises(ValueError, match="not the file the shards"):
        data.check_prompt_files_unchanged(tmp_path / "mixed")


def test_missing_documentation_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no documentation pages under"):
        passages.build_passage_prompts(tmp_path)
