"""`diversed-demo distill <stage>`: make the embedded feature draft from the target — training prompts
(prompts, passages), the target's responses (data), training (train), the shipped copy and its figures
(export, measure), and how its held-out figures carry over to Spec-Bench (transfer)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..common.files import write_jsonl_gz, write_text
from . import shared


def add_distill_arguments(parser: argparse.ArgumentParser) -> None:
    stages = parser.add_subparsers(dest="stage", required=True)
    add_distill_prompts_arguments(
        stages.add_parser(
            "prompts", help="build broad training prompts: the target's self-instructed requests (resumable)"
        )
    )
    add_distill_passages_arguments(
        stages.add_parser(
            "passages", help="build training prompts over passages of free documentation Debian packages"
        )
    )
    add_distill_data_arguments(
        stages.add_parser("data", help="sample the target's own responses to training prompts (resumable)")
    )
    merge = stages.add_parser(
        "merge", help="merge shard folders generated apart from copies of one folder into a new one"
    )
    merge.add_argument("out", help="the new shard folder")
    merge.add_argument("base", help="the folder each was copied from (its shards are taken once)")
    merge.add_argument("folders", nargs="+", help="shard folders, in the order their shards are numbered")
    merge.set_defaults(func=run_distill_merge)
    add_distill_train_arguments(
        stages.add_parser("train", help="train the feature draft on the generated data (resumable)")
    )
    export = stages.add_parser("export", help="copy the best draft to assets/draft with its card")
    export.add_argument("--work-dir", default="runs/distill")
    export.add_argument("--out", default=None, help="default: assets/draft")
    export.add_argument(
        "--earlier",
        default=None,
        help="comma-separated work dirs of the sittings this run continued from (--init), oldest first",
    )
    export.set_defaults(func=run_distill_export)
    measure = stages.add_parser("measure", help="Spec-Bench figures of the embedded draft, into its card")
    measure.add_argument("--per-category", type=int, default=2)
    measure.add_argument("--max-new-tokens", type=int, default=64)
    measure.add_argument("--n-draft", type=int, default=4)
    measure.add_argument("--draft", default=None, help="a saved draft folder (default: assets/draft)")
    measure.set_defaults(func=run_distill_measure)
    add_distill_transfer_arguments(
        stages.add_parser(
            "transfer", help="drafts' held-out figures on the target's own responses to Spec-Bench prompts"
        )
    )


def add_distill_prompts_arguments(prompts) -> None:
    prompts.add_argument("--work-dir", default="runs/prompts", help="each stage's generations (resume)")
    prompts.add_argument("--out", default=None, help="default: assets/prompts/self_instruct.jsonl.gz")
    prompts.add_argument("--batch-size", type=int, default=64)
    prompts.add_argument("--seed", type=int, default=0)
    prompts.add_argument(
        "--topics", default=None, help="seed topics, one a line (default: assets/prompts/topics.txt)"
    )
    prompts.set_defaults(func=run_distill_prompts)


def add_distill_passages_arguments(passages) -> None:
    passages.add_argument(
        "--docs",
        default="/usr/share",
        help="where the documentation packages are unpacked (default: /usr/share)",
    )
    passages.add_argument("--out", default=None, help="default: assets/prompts/passages.jsonl.gz")
    passages.add_argument("--seed", type=int, default=0)
    passages.set_defaults(func=run_distill_passages)


def add_distill_data_arguments(data) -> None:
    data.add_argument(
        "--tokens", type=int, default=1_200_000, help="stop once the responses hold this many tokens"
    )
    data.add_argument("--batch-size", type=int, default=96)
    data.add_argument("--max-new-tokens", type=int, default=384)
    data.add_argument("--minutes", type=float, default=None, help="stop after this long (resume later)")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--out", default=None, help="shard folder (default: assets/draft/data)")
    data.add_argument("--gen-dtype", default="bfloat16", help="the target's dtype while sampling")
    data.add_argument(
        "--sources",
        default=None,
        help="comma-separated prompt sources to sample (default: all): instructions, general, summarization, "
        "gsm8k, mbpp, humaneval, broad, passages",
    )
    data.set_defaults(func=run_distill_data)


def add_distill_train_arguments(train) -> None:
    from ..distill.config import DraftTrainConfig

    defaults = DraftTrainConfig()
    train.add_argument(
        "--work-dir", default="runs/distill", help="checkpoints and the best draft (default: runs/distill)"
    )
    train.add_argument("--data", default=None, help="shard folder (default: assets/draft/data)")
    train.add_argument("--epochs", type=float, default=defaults.epochs)
    train.add_argument(
        "--ttt-steps", type=int, default=defaults.ttt_steps, help="draft positions trained by unrolling"
    )
    train.add_argument(
        "--step-decay", type=float, default=defaults.step_decay, help="loss weight decay per position"
    )
    train.add_argument("--lr", type=float, default=defaults.lr)
    train.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    train.add_argument("--bf16", action="store_true", help="bf16 autocast (GPUs, CPUs with AMX)")
    train.add_argument(
        "--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps"
    )
    train.add_argument(
        "--dtype",
        default="float32",
        help="the target's weights (default float32; --bf16 sets the compute precision)",
    )
    train.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens)
    train.add_argument("--eval-every", type=int, default=defaults.eval_every)
    train.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab_size)
    train.add_argument(
        "--sources", default=None, help="comma-separated sources to train on (default: all), e.g. broad"
    )
    train.add_argument(
        "--replay",
        type=float,
        default=defaults.replay,
        help="with --sources: the fraction of the other sources' records kept",
    )
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--minutes", type=float, default=None, help="stop after this long (rerun to resume)")
    train.add_argument(
        "--init",
        default=None,
        help="start from this saved draft (e.g. assets/draft) instead of a "
        "fresh one; a work dir with a checkpoint resumes that instead",
    )
    train.set_defaults(func=run_distill_train)


def add_distill_transfer_arguments(transfer) -> None:
    transfer.add_argument(
        "--drafts", default=None, help="saved draft folders, comma-separated (default: assets/draft)"
    )
    transfer.add_argument("--per-category", type=int, default=2)
    transfer.add_argument("--max-new-tokens", type=int, default=256)
    transfer.add_argument("--seed", type=int, default=0)
    transfer.add_argument("--batch-size", type=int, default=13)
    transfer.add_argument("--bf16", action="store_true", help="score under bf16 autocast, as --bf16 trains")
    transfer.add_argument("--json", default=None, help="also write the figures to this file")
    transfer.set_defaults(func=run_distill_transfer)


def run_distill_train(args) -> int:
    from ..distill import data
    from ..distill.config import DraftTrainConfig
    from ..distill.train import train_draft
    from ..models.embedded import EMBEDDED
    from ..models.loading import is_eagle3_dir
    from ..runtime.plan import load_pair

    config = DraftTrainConfig(  # refuses bad values itself
        epochs=args.epochs,
        ttt_steps=args.ttt_steps,
        step_decay=args.step_decay,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        batch_tokens=args.batch_tokens,
        eval_every=args.eval_every,
        draft_vocab_size=args.draft_vocab,
        seed=args.seed,
        bf16=args.bf16,
        sources=source_list(args.sources),
        replay=args.replay,
    )
    if args.init is not None and not is_eagle3_dir(args.init):
        raise ValueError(f"--init {args.init}: not a saved EAGLE-3 draft (no speculators config.json there)")
    records = data.load_records(args.data or data.SHARDS_DIR)
    if not records:
        raise FileNotFoundError(
            f"no generated data in {args.data or data.SHARDS_DIR}: run `diversed-demo distill data` first"
        )
    data.check_prompt_files_unchanged(args.data or data.SHARDS_DIR, records)  # the held-out groups index them
    pair = load_pair(EMBEDDED, None, args.device, args.dtype, compiled="off")
    state = train_draft(
        pair,
        records,
        config,
        args.work_dir,
        args.minutes,
        shared.command_line(),
        init_from=args.init,
    )
    print(json.dumps(state["best"]))
    return 0


def run_distill_merge(args) -> int:
    from ..distill.data import merge_shards

    print(json.dumps(merge_shards(Path(args.out), Path(args.base), [Path(f) for f in args.folders])))
    return 0


def run_distill_export(args) -> int:
    from ..distill import card

    earlier = [d.strip() for d in (args.earlier or "").split(",") if d.strip()]
    out = card.export(args.work_dir, args.out, earlier=earlier)
    print(f"wrote {out}")
    return 0


def run_distill_measure(args) -> int:
    from ..distill import card
    from ..models.embedded import EMBEDDED, EMBEDDED_DRAFT_DIR
    from ..runtime.plan import load_pair

    pair = load_pair(EMBEDDED, args.draft, "auto", "float32", compiled="off")
    draft_dir = args.draft or EMBEDDED_DRAFT_DIR
    figures = card.measure(
        pair, args.per_category, args.max_new_tokens, args.n_draft, draft_dir, shared.command_line()
    )
    print(json.dumps(figures, indent=2))
    return 0


def run_distill_transfer(args) -> int:
    from ..distill.transfer import check_drafts, spec_bench_responses, transfer_report
    from ..models.embedded import EMBEDDED, EMBEDDED_DRAFT_DIR
    from ..runtime.batch_generation import use_eager_attention_on_cpu
    from ..runtime.plan import load_pair

    drafts = [d.strip() for d in (args.drafts or str(EMBEDDED_DRAFT_DIR)).split(",") if d.strip()]
    check_drafts(drafts)
    generating = load_pair(EMBEDDED, None, "auto", "bfloat16", compiled="off")
    use_eager_attention_on_cpu(generating.target)
    records, pad_id = spec_bench_responses(
        generating, args.per_category, args.max_new_tokens, args.seed, args.batch_size
    )
    scoring = load_pair(
        EMBEDDED, None, "auto", "float32", compiled="off"
    ).target  # as `distill train` loads it
    report = transfer_report(records, pad_id, drafts, scoring, args.bf16, shared.command_line())
    text = json.dumps(report, indent=2)
    if args.json:
        write_text(Path(args.json), text + "\n")
    print(text)
    return 0


def run_distill_prompts(args) -> int:
    from collections import Counter

    from tqdm import tqdm

    from ..distill import prompts
    from ..models.embedded import EMBEDDED
    from ..runtime.batch_generation import use_eager_attention_on_cpu
    from ..runtime.plan import load_pair

    pair = load_pair(EMBEDDED, None, "auto", "bfloat16", compiled="off")
    use_eager_attention_on_cpu(pair.target)
    bars = {}

    def progress(stage, done, total):
        bar = bars.setdefault(stage, tqdm(total=total, desc=stage, unit="prompt", dynamic_ncols=True))
        bar.n = done
        bar.refresh()

    rows = prompts.build_prompts(
        pair.target, pair.tokenizer, args.work_dir, args.seed, args.batch_size, args.topics, progress
    )
    for bar in bars.values():
        bar.close()
    out = args.out or prompts.PROMPTS_FILE
    write_jsonl_gz(out, rows)
    print(
        json.dumps(
            {"prompts": len(rows), "by_category": Counter(r["category"] for r in rows), "out": str(out)}
        )
    )
    return 0


def run_distill_passages(args) -> int:
    from ..distill import passages

    rows = passages.build_passage_prompts(Path(args.docs), args.seed)
    out = args.out or passages.PASSAGE_PROMPTS_FILE
    write_jsonl_gz(out, rows)
    print(json.dumps(passages.counts(rows) | {"out": str(out)}))
    return 0


def source_list(text: str | None) -> list[str] | None:
    """--sources as a list, checked before any model loads."""
    from ..distill.data import SOURCE_GROUP

    if not text:
        return None
    sources = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(sources) - set(SOURCE_GROUP))
    if unknown or not sources:
        raise ValueError(f"--sources {text!r}: unknown {unknown}; choose from {', '.join(SOURCE_GROUP)}")
    return sources


def run_distill_data(args) -> int:
    from tqdm import tqdm

    from ..distill import data
    from ..models.embedded import EMBEDDED
    from ..runtime.batch_generation import use_eager_attention_on_cpu
    from ..runtime.plan import load_pair

    sources = source_list(args.sources)
    pair = load_pair(EMBEDDED, None, "auto", args.gen_dtype, compiled="off")
    use_eager_attention_on_cpu(pair.target)
    bar = tqdm(total=args.tokens, desc="response tokens", unit="tok", dynamic_ncols=True)

    def progress(done, total):
        bar.n = min(done, total)
        bar.refresh()

    result = data.generate_shards(
        pair.target,
        pair.tokenizer,
        args.out or data.SHARDS_DIR,
        args.tokens,
        args.batch_size,
        args.max_new_tokens,
        args.seed,
        args.minutes,
        progress,
        sources,
        shared.command_line(),
    )
    bar.close()
    print(json.dumps(result))
    return 0
