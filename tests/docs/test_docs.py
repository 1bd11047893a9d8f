"""README.md and docs/ against the code and the shipped files.

- The defaults docs/cli.md states are the parser's, and every option is listed; the per-task training
  defaults in docs/training.md are HeadTrainConfig's; the recipe there reproduces the shipped heads.
- Every `diversed-demo` command in a code block parses; every relative link and anchor resolves; the
  `make` targets and DIVERSED_* variables the docs name exist.
- README is at most 250 lines, and its Python examples run (on a tiny pair, and on the embedded one).
- The tables of figures the docs quote are the ones the shipped files hold (heads' cards, results/):
  `python tests/docs/test_docs.py` prints them, so a new card or report is pasted, never retyped.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
HEADS = ROOT / "heads"
RESULTS = ROOT / "results"
MAX_README_LINES = 250
PAIR_OPTIONS = ("--target", "--draft", "--device", "--dtype")
HEAD_ORDER = [
    "general",
    "general-greedy",
    "summarization",
    "summarization-greedy",
    "math",
    "math-greedy",
    "code",
    "code-greedy",
]


# --- reading Markdown -------------------------------------------------------------------------------


def sections(text: str, level: str = "## ") -> dict[str, str]:
    """Heading text -> the text under it, up to the next heading of the same level (code blocks skipped)."""
    found, title, lines, fence = {}, None, [], False
    for line in text.splitlines():
        fence ^= line.startswith("```")
        if not fence and line.startswith(level):
            if title is not None:
                found[title] = "\n".join(lines)
            title, lines = line[len(level) :].strip(), []
        else:
            lines.append(line)
    if title is not None:
        found[title] = "\n".join(lines)
    return found


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in `text`, header rows included, separators not."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[\s:|-]+\|", line.strip()):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^ *```{language}\n(.*?)^ *```", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


# --- the parser -------------------------------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """'generate', 'distill data', ... -> its parser."""
    from diversed_demo.cli import build_parser

    found = {}

    def walk(parser, prefix):
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions:
            found[" ".join(prefix)] = parser
        for action in actions:
            for name, sub in action.choices.items():
                walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


def options(parser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}


def default_problem(cell: str, action: argparse.Action) -> str | None:
    """Why a documented default disagrees with the parser's, or None. A cell is `literal`, required, off
    (a flag not given), per task (the task's default, docs/training.md), or words (no value: None)."""
    from diversed_demo.training.config import TASK_DEFAULTS

    literal = re.match(r"`([^`]*)`", cell)
    default = action.default
    if cell == "required":
        return None if action.required else "documented as required"
    if cell == "off":
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        return None if flag else "documented as a flag"
    if cell == "per task":
        ok = default is None and action.dest in TASK_DEFAULTS["*"]
        return None if ok else f"documented as per task; the parser has {default!r}"
    if literal is None:
        return None if default in (None, []) else f"documented without a value; the parser has {default!r}"
    value = literal.group(1)
    if isinstance(default, bool) or default is None:
        return f"documented as {value!r}; the parser has {default!r}"
    if isinstance(default, float):
        same = float(value) == default
    elif isinstance(default, int):
        same = value.lstrip("-").isdigit() and int(value) == default
    else:
        same = value == default
    return None if same else f"documented as {value!r}; the parser has {default!r}"


def test_every_option_of_every_subcommand_is_documented_with_its_default():
    pages = sections((ROOT / "docs" / "cli.md").read_text())
    pair_rows = {row[0].strip("`"): row[1] for row in table_rows(pages["Pair options"]) if row[0] != "option"}
    problems = []
    for name, parser in subcommands().items():
        title = f"`diversed-demo {name}`"
        assert title in pages, f"docs/cli.md has no section {title}"
        documented = {row[0].strip("`"): row[1] for row in table_rows(pages[title]) if row[0] != "option"}
        actual = options(parser)
        if "--target" in actual:
            documented.update({k: v for k, v in pair_rows.items() if k in PAIR_OPTIONS})
        if set(documented) != set(actual):
            problems.append(
                f"{name}: undocumented {sorted(set(actual) - set(documented))}, "
                f"not options {sorted(set(documented) - set(actual))}"
            )
        for option, action in actual.items():
            problem = option in documented and default_problem(documented[option], action)
            if problem:
                problems.append(f"{name} {option}: {problem}")
    assert not problems, "\n".join(problems)


def test_the_pair_options_table_is_the_parsers():
    pages = sections((ROOT / "docs" / "cli.md").read_text())
    rows = {row[0].strip("`"): row[1] for row in table_rows(pages["Pair options"]) if row[0] != "option"}
    assert set(rows) == set(PAIR_OPTIONS)
    actual = options(subcommands()["generate"])
    assert not [o for o in PAIR_OPTIONS if default_problem(rows[o], actual[o])]


def test_the_per_task_training_defaults_are_the_codes():
    from diversed_demo.eval.tasks import TASKS
    from diversed_demo.training.config import TASK_DEFAULTS, HeadTrainConfig

    text = sections((ROOT / "docs" / "training.md").read_text())["Per-task defaults"]
    header, *rows = table_rows(text)
    fields = [cell.strip("`").removeprefix("--").replace("-", "_") for cell in header[1:]]
    assert set(fields) == set(TASK_DEFAULTS["*"])
    assert sorted(row[0].strip("`") for row in rows) == sorted(TASKS)
    for row in rows:
        config = HeadTrainConfig(task=row[0].strip("`"))
        for field, cell in zip(fields, row[1:]):
            assert float(cell.strip("`")) == getattr(config, field), (row[0], field)


def recipe() -> tuple[list[str], list[str], dict[str, str]]:
    """docs/training.md's recipe of the shipped heads: the command of the sampled heads, that of their greedy
    twins and each head's setting (λ, or a target acceptance)."""
    text = sections((ROOT / "docs" / "training.md").read_text())["The recipe of the shipped heads"]
    command, twins = [shlex.split(block.replace("\\\n", " ")) for block in code_blocks(text, "bash")]
    header, *rows = table_rows(text)
    acceptance = {}
    for row in rows:
        head = row[0].strip("`")
        for column, cell in zip(header[1:], row[1:]):
            acceptance[head if column.startswith("sampled") else f"{head}-greedy"] = cell.strip("`")
    return command, twins, acceptance


def test_the_recipe_reproduces_the_shipped_heads_settings():
    from diversed_demo.cli import build_parser
    from diversed_demo.training.config import HeadTrainConfig

    command, twins, acceptance = recipe()
    text = sections((ROOT / "docs" / "training.md").read_text())[
        "Cost heads: a learned verifier that is a curve"
    ]
    costs = shlex.split(code_blocks(text, "bash")[0].replace("\\\n", " "))
    cost_heads = {f"{task}-cost": "" for task in ("general", "summarization", "math", "code")}
    assert command[:2] == twins[:2] == costs[:2] == ["diversed-demo", "train"]
    assert sorted(acceptance | cost_heads) == sorted(p.stem for p in HEADS.glob("*.json"))
    fields = HeadTrainConfig.__dataclass_fields__
    for head, target in (acceptance | cost_heads).items():
        task = head.removesuffix("-greedy").removesuffix("-cost")
        shipped = json.loads((HEADS / f"{head}.json").read_text())["training"]
        recipe_of = twins if head.endswith("-greedy") else costs if head.endswith("-cost") else command
        argv = [
            a.replace("<task>", task).replace("<A>", target).replace("<λ>", target).replace("<name>", head)
            for a in recipe_of[2:]
        ]
        args = build_parser().parse_args(["train", *argv])
        made = HeadTrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
        for key, value in shipped.items():
            if key not in ("name", "out", "run_dir", "prompts_path", "resume"):
                assert json.loads(json.dumps(getattr(made, key))) == value, (head, key)  # tuples as lists


# --- commands, links, names ------------------------------------------------------------------------

PLACEHOLDERS = {
    "<task>": "general",
    "<set>": "spec_bench",
    "<head>": "general",
    "<n>": "10",
    "<T>": "1",
    "<A>": "0.6",
    "<λ>": "4",
    "<name>": "x",
    "<T1|greedy>": "T1",
}


def commands(text: str) -> list[str]:
    """The `diversed-demo ...` lines of the bash blocks, continuation lines joined, comments cut."""
    found = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip()).removeprefix(".venv/bin/")
            if line.startswith("diversed-demo "):
                found.extend(part.strip() for part in line.split("&&"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_in_a_code_block_parses(page, capsys):
    from diversed_demo.cli import build_parser

    found = commands(page.read_text())
    assert found or page.name not in ("README.md", "cli.md", "training.md", "results.md")
    for line in found:
        for key, value in PLACEHOLDERS.items():
            line = line.replace(key, value)
        assert "<" not in line, f"an unknown placeholder in {line!r}"
        try:
            build_parser().parse_args(shlex.split(line)[1:])
        except SystemExit:
            pytest.fail(f"{page.name}: {line!r} does not parse: {capsys.readouterr().err}")


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    text = page.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)}
            assert anchor in anchors, f"{page.name} links to {target}: no such heading"


def test_the_make_targets_named_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for page in PAGES:
        for target in re.findall(r"`make ([\w-]+)", page.read_text()):
            assert target in targets, f"{page.name} names `make {target}`, which the Makefile lacks"


def test_the_environment_variables_named_exist():
    code = "".join(p.read_text() for p in [*ROOT.glob("diversed_demo/**/*.py"), ROOT / "app.py"])
    for page in PAGES:
        for name in set(re.findall(r"DIVERSED_[A-Z_]*[A-Z]", page.read_text())):
            assert name in code, f"{page.name} names {name}, which the code never reads"


# --- README's Python examples -----------------------------------------------------------------------

HUB_PAIR = ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")


def python_examples() -> tuple[list[str], list[str]]:
    """README's Python blocks: those on the embedded pair, and those on a hub pair."""
    blocks = code_blocks(README.read_text(), "python")
    embedded = [b for b in blocks if '"smollm2-135m"' in b]
    hub = [b for b in blocks if b not in embedded]
    assert embedded and hub and all(all(f'"{m}"' in b for m in HUB_PAIR) for b in hub)
    return embedded, hub


def test_the_readme_hub_pair_example_runs_on_a_local_pair(tmp_path, capsys):
    from tiny import save_tiny_pair

    target, draft = save_tiny_pair(tmp_path)
    for block in python_examples()[1]:
        code = block.replace(f'"{HUB_PAIR[0]}"', repr(target)).replace(f'"{HUB_PAIR[1]}"', repr(draft))
        code = code.replace('device="cuda"', 'device="cpu"')
        exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()


@pytest.mark.embedded
@pytest.mark.slow
def test_the_readme_embedded_example_runs(capsys):
    for block in python_examples()[0]:
        exec(compile(block, "README.md", "exec"), {})
    assert "acceptance" in capsys.readouterr().out


# --- figures quoted from the shipped files ------------------------------------------------------------


def num(value: float, digits: int, sign: bool = False) -> str:
    value = 0.0 if round(value, digits) == 0 else value  # no "−0.00"
    return f"{value:{'+' if sign else ''}.{digits}f}".replace("-", "−")


def card(head: str) -> dict:
    return json.loads((HEADS / f"{head}.json").read_text())


def decoding(evaluation: dict) -> str:
    return "greedy" if evaluation["settings"]["temperature"] == 0 else "1"


def verdict_words(evaluation: dict) -> str:
    kind, text = evaluation["verdict"]["kind"], evaluation["verdict"]["text"]
    if kind == "unresolved":
        return "on the frontier" if text.startswith("on the static frontier") else "no claim"
    return {"beyond": "**beyond**", "below": "below", "floor": "floor: no claim"}[kind]


def exact_point(evaluation: dict) -> dict:
    return next(p for p in evaluation["static_points"] if p["w"] == 1.0)


def frontier_table() -> str:
    """docs/results.md: every evaluation in every shipped head's card."""
    from diversed_demo.eval.held_out import HELD_OUT
    from diversed_demo.eval.rewards import QUALITY_LABEL

    lines = [
        "| head | held-out set; quality | T | n | head: acceptance, quality, mean w_t (std) | exact (w = 1): "
        "acceptance, quality | margin over the static frontier at the head's acceptance (± SE, 95% CI) "
        "| head − exact, paired (± SE) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for head in HEAD_ORDER:
        task = card(head)["task"]
        order = [f"{s}, {t}" for s in HELD_OUT[task] for t in ("T=1", "greedy")]
        for key in sorted(card(head)["evaluations"], key=order.index):
            e = card(head)["evaluations"][key]
            h, x, m, v = e["head_point"], exact_point(e), e["quality_margin"], e["versus_exact"]
            lines.append(
                f"| `{head}` | {e['settings']['held_out']}; {QUALITY_LABEL[task]} | {decoding(e)} | "
                f"{e['examples']} | {num(h['acceptance'], 3)}, {num(h['quality'], 3)}, "
                f"{num(h['mean_w'], 2)} ({num(h['w_std'], 2)}) | {num(x['acceptance'], 3)}, "
                f"{num(x['quality'], 3)} | {num(m['estimate'], 3, True)} ± {num(m['stderr'], 3)}, "
                f"[{num(m['ci95'][0], 3, True)}, {num(m['ci95'][1], 3, True)}]: {verdict_words(e)} | "
                f"{num(v['quality_difference'], 3, True)} ± {num(v['stderr'], 3)} |"
            )
    return "\n".join(lines)


SHORT_SET = {
    ("general", "spec_bench"): "Spec-Bench, all 13 categories",
    ("summarization", "spec_bench"): "Spec-Bench summarization",
    ("math", "arithmetic"): "scripted arithmetic",
    ("math", "gsm8k"): "GSM8K test",
    ("code", "mbpp"): "MBPP test",
}
SHORT_QUALITY = {"general": "fidelity", "summarization": "ROUGE-2", "math": "correct", "code": "pass@1"}


def glance_table() -> str:
    """README: each shipped head at the evaluation its card draws (`frontier`)."""
    lines = [
        "| head | held-out set (n) | T | acceptance: exact → head | quality: exact → head "
        "| against the static frontier |",
        "|---|---|---|---|---|---|",
    ]
    for head in HEAD_ORDER:
        c = card(head)
        e, task = c["frontier"], c["task"]
        set_name = next(k for k, v in c["evaluations"].items() if v == e).split(",")[0]
        h, x, m = e["head_point"], exact_point(e), e["quality_margin"]
        lines.append(
            f"| `{head}` | {SHORT_SET[task, set_name]} ({e['examples']}) | {decoding(e)} | "
            f"{num(x['acceptance'], 2)} → {num(h['acceptance'], 2)} | {num(x['quality'], 2)} → "
            f"{num(h['quality'], 2)} {SHORT_QUALITY[task]} | {verdict_words(e)}, "
            f"{num(m['estimate'], 3, True)} ± {num(m['stderr'], 3)} |"
        )
    return "\n".join(lines)


def warm_start_table() -> str:
    """docs/training.md: each shipped head's held-out positions: the warm start's (before RL) and, for a head
    warm-started at scale, the trained head's."""
    lines = [
        "| head | positions fitted / held out | λ (set, or from A) | held-out acceptance "
        "| head's gain over static w | per-token optimum's gain | share kept (warm start; after RL) "
        "| std of w_t | Spearman of w_t with CE − H / H(p) / TV |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for head in HEAD_ORDER:
        c = card(head)
        w = c["warm_start"]
        b, s = w["held_back"], w["held_back"]["separates"]["spearman_w_vs"]
        counts = (
            f"{w['positions']['fit']:,} / {w['positions']['held_out']:,} (at scale)"
            if "positions" in w
            else f"{w['fit']['positions']:,} / {b['positions']:,} ({w['prompts']} prompts)"
        )
        gain, best = b["fidelity"] - b["static_fidelity"], b["oracle_fidelity"] - b["static_fidelity"]
        after = c.get("held_out")
        before = num(gain / best, 2) if best >= 0.02 else "–"  # a share of almost nothing says nothing
        share = f"{before}; {num(after[0]['share_of_optimum'], 2) if after else '–'}"
        lines.append(
            f"| `{head}` | {counts} | {num(w['lam'], 2)} | {num(b['acceptance'], 3)} | "
            f"{num(gain, 2, True)} | {num(best, 2, True)} | {share} | {num(b['w_std'], 2)} | "
            f"{num(s['fidelity_cost'], 2, True)} / {num(s['target_entropy'], 2, True)} / "
            f"{num(s['tv'], 2, True)} |"
        )
    return "\n".join(lines)


def mode_label(mode: str) -> str:
    if mode.startswith("dynamic:"):
        return f"DIVERSED, `{mode.removeprefix('dynamic:')}` head"
    if mode.startswith("static:"):
        return f"static w = {mode.removeprefix('static:')}"
    return {"ar": "target only", "exact": "exact SD"}[mode]


def bench_table() -> str:
    """README and docs/results.md: results/bench.json's overall row per mode."""
    report = json.loads((RESULTS / "bench.json").read_text())
    lines = [
        "| mode | N | tokens/s | speed-up over target only | τ | acceptance |",
        "|---|---|---|---|---|---|",
    ]
    for mode, row in report["overall"].items():
        n = report["settings"]["n_draft"].get(mode, "–")
        acceptance = "–" if row["acceptance_rate"] is None else num(row["acceptance_rate"], 2)
        lines.append(
            f"| {mode_label(mode)} | {n} | {num(row['tokens_per_second'], 1)} | "
            f"{num(row['speedup'], 2)}× | {num(row['tau'], 2)} | {acceptance} |"
        )
    return "\n".join(lines)


def shipped_markdown_table(path: Path) -> str:
    """The first table of a shipped Markdown report."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def verifier_table() -> str:
    """docs/results.md: every point of the rule's evaluations, as results/rule/table.py prints them."""
    from diversed_demo.ui.frontiers import RULE_REPORTS, RULE_REPORTS_GREEDY
    from diversed_demo.ui.result_tables import verifier_markdown

    return verifier_markdown({"T = 1": RULE_REPORTS, "greedy": RULE_REPORTS_GREEDY})


TABLES = {
    "README.md": [glance_table, bench_table],
    "results.md": [
        frontier_table,
        bench_table,
        lambda: shipped_markdown_table(RESULTS / "table.md"),
        lambda: shipped_markdown_table(RESULTS / "batch.md"),
        verifier_table,
    ],
    "training.md": [warm_start_table],
}


@pytest.mark.parametrize("page", sorted(TABLES))
def test_the_quoted_tables_are_the_shipped_files(page):
    text = (README if page == "README.md" else ROOT / "docs" / page).read_text()
    for make in TABLES[page]:
        table = make()
        assert table in text, f"{page} does not quote this table (python tests/docs/test_docs.py):\n{table}"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for page, makers in TABLES.items():
        for make in makers:
            print(f"<!-- {page} -->\n{make()}\n")


def test_the_import_graph_in_architecture_md_is_the_packages():
    """docs/architecture.md's import graph is what `python tests/docs/test_layering.py` prints."""
    from test_layering import import_graph

    printed = [f"{m} -> {', '.join(imported) or '(none)'}" for m, imported in import_graph().items()]
    text = (ROOT / "docs" / "architecture.md").read_text()
    shown = [line for line in text.splitlines() if re.match(r"^[a-z0-9_.]+ -> ", line)]
    assert shown == printed
