"""`diversed-demo` command line: every subcommand's arguments, and the plain functions each one calls.

This module is the top layer: nothing in the package imports it. Models load only inside the subcommand
that needs them, after its values are checked, so bad input fails in a second rather than after loading.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from .common.files import write_jsonl_gz, write_text


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", default=None, help="target: hub id, directory or .gguf (default: embedded smollm2-135m)"
    )
    parser.add_argument(
        "--draft", default=None, help="draft: hub id, directory or .gguf (default: the embedded draft)"
    )
    parser.add_argument(
        "--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto (on a CPU: fp32 or bf16, whichever is measured faster here; bf16/fp16 on a GPU), "
        "float32, bfloat16, float16",
    )


def command_line() -> str:
    """How this command was called, for reports and cards."""
    return " ".join(["diversed-demo"] + sys.argv[1:])


def pair_from_args(args, compiled: str = "off"):
    """The pair the arguments name, as the runtime runs it here (runtime/plan.py); compiled: when its
    compiled passes are built ("background", "wait": before returning, as the bench times, or "off")."""
    from .models.embedded import EMBEDDED
    from .runtime.plan import load_pair

    pair = load_pair(args.target or EMBEDDED, args.draft, args.device, args.dtype, compiled=compiled)
    print(f"runtime: {pair.runtime}", file=sys.stderr)
    return pair


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    from .core.settings import MODES

    parser.add_argument("--prompt", required=True)
    parser.add_argument("--mode", choices=MODES, default="static")
    parser.add_argument("--w", type=float, default=0.5, help="static ensemble weight in [0, 1] (1 = exact)")
    parser.add_argument(
        "--head", default=None, help="head file (.safetensors) or name in heads/, for --mode dynamic"
    )
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-chat", action="store_true", help="feed the prompt raw, without the chat template"
    )
    parser.add_argument(
        "--no-lookup",
        action="store_true",
        help="greedy decoding: draft without prompt lookup (copies from the text in place of drafted tokens)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object with text, summary and events"
    )
    add_pair_arguments(parser)
    parser.set_defaults(func=run_generate)


def run_generate(args) -> int:
    from .core.generate import speculative_generate
    from .core.settings import check_args
    from .core.stats import Summary

    # Bad values fail before the models load (seconds), not after.
    check_args(
        args.mode,
        args.w,
        args.head,
        args.n_draft,
        args.max_new_tokens,
        args.temperature,
        args.top_p,
        args.seed,
    )
    if args.mode == "dynamic":
        from .models.heads import load_head, resolve_head_path

        resolve_head_path(args.head)  # a missing head fails here too, not after the models load
    pair = pair_from_args(args, compiled="background")
    head = load_head(args.head, pair) if args.mode == "dynamic" else None
    stream = speculative_generate(
        pair,
        args.prompt,
        mode=args.mode,
        ensemble_weight=args.w,
        head=head,
        n_draft=args.n_draft,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        chat=not args.no_chat,
        prompt_lookup=not args.no_lookup,
    )
    events = []
    for item in stream:
        if isinstance(item, Summary):
            summary = item
        else:
            events.append(item)
            if not args.json and item.kind != "rejected":
                print(item.text, end="", flush=True)
    if args.json:
        print(generate_json(summary, events))
    else:
        print("\n")
        print(format_summary(summary))
    return 0


def generate_json(summary, events) -> str:
    """generate --json: one object with the text, the summary's figures and every token event."""
    summary_keys = ("acceptance_rate", "tau", "new_tokens", "tokens_per_second", "wall_time_s")
    event_keys = ("token_id", "text", "kind", "w", "p", "q", "accept_prob")
    figures = summary.to_dict()
    return json.dumps(
        {
            "text": summary.text,
            "summary": {k: figures[k] for k in summary_keys},
            "events": [{k: getattr(e, k) for k in event_keys} for e in events],
        },
        ensure_ascii=False,
    )


def format_summary(summary) -> str:
    from .common.formatting import fmt

    mean_w = "" if summary.mean_w is None else f"  mean w {summary.mean_w:.3f}"
    return (
        f"acceptance {fmt(summary.acceptance_rate)}  tau {fmt(summary.tau, '.2f')}  "
        f"new tokens {summary.new_tokens}  {summary.tokens_per_second:.1f} tok/s  "
        f"wall {summary.wall_time_s:.2f} s{mean_w}"
    )


def add_distill_arguments(parser: argparse.ArgumentParser) -> None:
    stages = parser.add_subparsers(dest="stage", required=True)
    prompts = stages.add_parser(
        "prompts", help="build broad training prompts: the target's self-instructed requests (resumable)"
    )
    prompts.add_argument("--work-dir", default="runs/prompts", help="each stage's generations (resume)")
    prompts.add_argument("--out", default=None, help="default: assets/prompts/self_instruct.jsonl.gz")
    prompts.add_argument("--batch-size", type=int, default=64)
    prompts.add_argument("--seed", type=int, default=0)
    prompts.add_argument(
        "--topics", default=None, help="seed topics, one a line (default: assets/prompts/topics.txt)"
    )
    prompts.set_defaults(func=run_distill_prompts)
    passages = stages.add_parser(
        "passages", help="build training prompts over passages of free documentation Debian packages"
    )
    passages.add_argument(
        "--docs",
        default="/usr/share",
        help="where the documentation packages are unpacked (default: /usr/share)",
    )
    passages.add_argument("--out", default=None, help="default: assets/prompts/passages.jsonl.gz")
    passages.add_argument("--seed", type=int, default=0)
    passages.set_defaults(func=run_distill_passages)
    add_distill_data_arguments(
        stages.add_parser("data", help="sample the target's own responses to training prompts (resumable)")
    )
    add_distill_train_arguments(
        stages.add_parser("train", help="train the feature draft on the generated data (resumable)")
    )
    export = stages.add_parser("export", help="copy the best draft to assets/draft with its card")
    export.add_argument("--work-dir", default="runs/distill")
    export.add_argument("--out", default=None, help="default: assets/draft")
    export.set_defaults(func=run_distill_export)
    measure = stages.add_parser("measure", help="Spec-Bench figures of the embedded draft, into its card")
    measure.add_argument("--per-category", type=int, default=2)
    measure.add_argument("--max-new-tokens", type=int, default=64)
    measure.add_argument("--n-draft", type=int, default=4)
    measure.add_argument("--draft", default=None, help="a saved draft folder (default: assets/draft)")
    measure.set_defaults(func=run_distill_measure)
    transfer = stages.add_parser(
        "transfer", help="drafts' held-out figures on the target's own responses to Spec-Bench prompts"
    )
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
    from .distill.config import DraftTrainConfig

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


def run_distill_train(args) -> int:
    from .distill import data
    from .distill.config import DraftTrainConfig
    from .distill.train import train_draft
    from .models.embedded import EMBEDDED
    from .models.loading import is_eagle3_dir
    from .runtime.plan import load_pair

    config = DraftTrainConfig(
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
    if not 0 <= config.replay <= 1:
        raise ValueError(f"--replay must be between 0 and 1, not {config.replay}")
    if config.replay and not config.sources:
        raise ValueError("--replay keeps a share of the sources outside --sources: give --sources too")
    for name, value in (
        ("--epochs", config.epochs),
        ("--lr", config.lr),
        ("--batch-tokens", config.batch_tokens),
        ("--ttt-steps", config.ttt_steps),
        ("--eval-every", config.eval_every),
    ):
        if not value > 0:
            raise ValueError(f"{name} must be positive, not {value}")
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
        command_line(),
        init_from=args.init,
    )
    print(json.dumps(state["best"]))
    return 0


def run_distill_export(args) -> int:
    from .distill import card

    out = card.export(args.work_dir, args.out)
    print(f"wrote {out}")
    return 0


def run_distill_measure(args) -> int:
    from .distill import card
    from .models.embedded import EMBEDDED, EMBEDDED_DRAFT_DIR
    from .runtime.plan import load_pair

    pair = load_pair(EMBEDDED, args.draft, "auto", "float32", compiled="off")
    draft_dir = args.draft or EMBEDDED_DRAFT_DIR
    figures = card.measure(
        pair, args.per_category, args.max_new_tokens, args.n_draft, draft_dir, command_line()
    )
    print(json.dumps(figures, indent=2))
    return 0


def run_distill_transfer(args) -> int:
    from .distill.transfer import paired_difference, spec_bench_responses, transfer_figures
    from .models.embedded import EMBEDDED, EMBEDDED_DRAFT_DIR
    from .models.loading import is_eagle3_dir, load_eagle3
    from .runtime.plan import load_pair

    drafts = [d.strip() for d in (args.drafts or str(EMBEDDED_DRAFT_DIR)).split(",") if d.strip()]
    missing = [d for d in drafts if not is_eagle3_dir(Path(d))]
    if missing:
        raise ValueError(f"not saved EAGLE-3 drafts (no speculators config.json): {', '.join(missing)}")
    generating = load_pair(EMBEDDED, None, "auto", "bfloat16", compiled="off")
    use_eager_attention_on_cpu(generating.target)
    records, pad_id = spec_bench_responses(
        generating, args.per_category, args.max_new_tokens, args.seed, args.batch_size
    )
    report = {
        "command": command_line(),
        "prompts": len(records),
        "response_tokens": sum(len(r["response_ids"]) for r in records),
    }
    scoring = load_pair(
        EMBEDDED, None, "auto", "float32", compiled="off"
    ).target  # as `distill train` loads it
    report["drafts"] = {
        draft: transfer_figures(load_eagle3(Path(draft), scoring), scoring, records, pad_id, args.bf16)
        for draft in drafts
    }
    baseline = report["drafts"][drafts[0]]
    report["against_first_per_category"] = {  # expected accepted per block, paired by category
        draft: paired_difference(baseline, report["drafts"][draft]) for draft in drafts[1:]
    }
    text = json.dumps(report, indent=2)
    if args.json:
        write_text(Path(args.json), text + "\n")
    print(text)
    return 0


def run_distill_prompts(args) -> int:
    from collections import Counter

    from tqdm import tqdm

    from .distill import prompts
    from .models.embedded import EMBEDDED
    from .runtime.plan import load_pair

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
    from .distill import passages

    rows = passages.build_passage_prompts(Path(args.docs), args.seed)
    out = args.out or passages.PASSAGE_PROMPTS_FILE
    write_jsonl_gz(out, rows)
    print(json.dumps(passages.counts(rows) | {"out": str(out)}))
    return 0


def use_eager_attention_on_cpu(target) -> None:
    """Eager attention for batched one-token steps: on the CPU, SDPA's kernel took 4.6 ms a layer at 96 rows
    where eager took under 1 (docs/measurements/distill.md)."""
    if target.device.type == "cpu":
        target.set_attn_implementation("eager")


def source_list(text: str | None) -> list[str] | None:
    """--sources as a list, checked before any model loads."""
    from .distill.data import SOURCE_GROUP

    if not text:
        return None
    sources = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(sources) - set(SOURCE_GROUP))
    if unknown or not sources:
        raise ValueError(f"--sources {text!r}: unknown {unknown}; choose from {', '.join(SOURCE_GROUP)}")
    return sources


def run_distill_data(args) -> int:
    from tqdm import tqdm

    from .distill import data
    from .models.embedded import EMBEDDED
    from .runtime.plan import load_pair

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
        command_line(),
    )
    bar.close()
    print(json.dumps(result))
    return 0


def add_train_arguments(parser) -> None:
    from .training.config import TASK_DEFAULTS, HeadTrainConfig

    defaults = HeadTrainConfig()
    parser.add_argument(
        "--task", default=defaults.task, help="summarization, math, code or general (fidelity)"
    )
    parser.add_argument("--prompts", dest="prompts_path", default=None, help="JSONL of {prompt, reference?}")
    add_head_config_arguments(parser, defaults)
    for name in TASK_DEFAULTS["*"]:  # unset: the task's own default
        parser.set_defaults(**{name: None})
    parser.add_argument("--name", default=None, help="the head's name (default <task>-<time>)")
    parser.add_argument("--out", default=None, help="head path (default: the user heads folder)")
    parser.add_argument(
        "--run-dir", default=None, help="checkpoint folder (default <user heads folder>/runs/<name>)"
    )
    parser.add_argument(
        "--no-resume", dest="resume", action="store_false", help="ignore an existing checkpoint"
    )
    parser.add_argument(
        "--suggest-lam",
        action="store_true",
        help="print the quartiles of (CE − H)/TV over exact-SD rollouts of the task's prompts (the "
        "per-token optimum lets the draft through where this is below λ) and exit",
    )
    add_pair_arguments(parser)
    parser.set_defaults(func=run_train)


def add_head_config_arguments(parser, defaults) -> None:
    """A flag for each number of HeadTrainConfig, with its default."""
    helps_int = {
        "warm_start_prompts": "before RL, decode this many training prompts at static w = --w-init and fit "
        "the head offline to the per-token optimum (default 0: off)",
        "warm_start_steps": "full-batch AdamW steps of that fit",
    }
    for name in (
        "steps",
        "prompts_per_step",
        "rollouts_per_prompt",
        "max_new_tokens",
        "n_draft",
        "epochs",
        "hidden_size",
        "warmup_steps",
        "checkpoint_every",
        "seed",
        "warm_start_prompts",
        "warm_start_steps",
    ):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, default=getattr(defaults, name), help=helps_int.get(name)
        )
    helps = {
        "lam": "weight of the acceptance term (default per task: 5 for general and summarization, else 0.15)",
        "dense_fidelity": "weight of the exact per-token expected fidelity (default 1 for general and "
        "summarization, else 0)",
        "lr": "AdamW learning rate (default per task: 1e-3 for general and summarization, else 3e-3)",
        "target_acceptance": "hold the rollouts' mean acceptance 1 − w·TV at this value (an augmented "
        "Lagrangian: λ starts at --lam and adapts after each step; with a warm start, "
        "λ is set once from the recorded positions); default off: λ fixed",
        "penalty": "ρ of that augmented Lagrangian: the gap penalty's weight and the multiplier's step",
    }
    for name in (
        "temperature",
        "lam",
        "dense_fidelity",
        "lr",
        "grad_clip",
        "w_min",
        "w_init",
        "target_acceptance",
        "penalty",
        "warm_start_lr",
    ):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=float, default=getattr(defaults, name), help=helps.get(name)
        )


def run_train(args) -> int:
    from .training.config import HeadTrainConfig, check_config
    from .training.loop import train_head

    fields = HeadTrainConfig.__dataclass_fields__
    config = HeadTrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    check_config(config)
    if args.suggest_lam:
        from .training.diagnostics import fidelity_cost_quartiles

        quartiles = fidelity_cost_quartiles(pair_from_args(args), config)
        print(f"(CE − H)/TV quartiles on {config.task}: " + " / ".join(f"{q:.2f}" for q in quartiles))
        return 0
    result = train_head(pair_from_args(args), config)
    print(f"head saved to {result.path}" if result.path else "cancelled")
    return 0


def add_frontier_arguments(parser) -> None:
    from .eval.frontier import DEFAULT_WEIGHTS
    from .eval.held_out import HELD_OUT

    parser.add_argument("--task", default="summarization", choices=sorted(HELD_OUT))
    parser.add_argument("--head", action="append", default=[], help="head name or path (repeatable)")
    parser.add_argument("--weights", default=",".join(f"{w:g}" for w in DEFAULT_WEIGHTS))
    sets = "; ".join(f"{task}: {', '.join(sets)}" for task, sets in HELD_OUT.items())
    parser.add_argument(
        "--set", dest="set_name", default=None, help=f"held-out set (default: the task's first) — {sets}"
    )
    parser.add_argument("--limit", type=int, default=12, help="held-out examples (the first of the set)")
    parser.add_argument(
        "--data",
        default=None,
        help="the set's file: Spec-Bench question.jsonl, GSM8K test.jsonl or "
        "mbpp.jsonl (default: in $DIVERSED_DATA or ../shared/data)",
    )
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--plot", default=None, help="HTML plot path (default runs/frontier/<task>-<set>.html)"
    )
    parser.add_argument("--json", default=None, help="write all points and margins as JSON")
    parser.add_argument(
        "--write-card",
        action="store_true",
        help="store each head's figures in its card beside it (<head>.json) and in its safetensors metadata",
    )
    parser.add_argument(
        "--log",
        default=None,
        help="JSONL of every decode; a rerun with the same settings "
        "resumes from it (long evaluations survive a stop)",
    )
    add_pair_arguments(parser)
    parser.set_defaults(func=run_frontier)


def run_frontier(args) -> int:
    from tqdm.auto import tqdm

    from .eval.frontier import evaluate_heads
    from .eval.held_out import held_out_examples
    from .models.heads import resolve_head_path

    weights = parse_weights(args.weights)
    for head in args.head:  # before the models load: the heads and the held-out set exist
        resolve_head_path(head)
    examples = held_out_examples(args.task, args.limit, args.data, args.set_name)
    pair = pair_from_args(args)
    bar = tqdm(
        desc=f"frontier {args.task}", unit="decode", total=len(examples) * (len(weights) + len(args.head))
    )
    report, points = evaluate_heads(
        pair,
        args.task,
        args.head,
        weights,
        args.limit,
        args.data,
        args.n_draft,
        args.max_new_tokens,
        args.temperature,
        args.write_card,
        command_line(),
        progress=lambda *_: bar.update(1),
        set_name=args.set_name,
        log_path=args.log,
    )
    bar.close()
    print_frontier(report)
    write_frontier_plot(report, points, args.task, args.temperature, args.plot)
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    return 0


def parse_weights(spec: str) -> list[float]:
    try:
        weights = [float(w) for w in spec.split(",")]
    except ValueError:
        raise ValueError(f"--weights must be comma-separated numbers, not {spec!r}") from None
    if not all(0 <= w <= 1 for w in weights):
        raise ValueError(f"--weights must be in [0, 1], not {spec!r}")
    return weights


def print_frontier(report: dict) -> None:
    """The points as a table, then each head's verdict, acceptance margin and difference from exact."""
    import pandas as pd

    from .common.formatting import fmt

    if "log" in report:
        print(f"log: {report['log']['path']} ({report['log']['decodes_reused']} decodes read back)")
    print(pd.DataFrame(report["points"]).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for name, m in report["heads"].items():
        acceptance = m["acceptance_margin"]
        print(
            f"{name}: {m['verdict']['text']}\n{name}: acceptance margin at the head's quality "
            f"{fmt(acceptance['estimate'], '+.4f')} ± {fmt(acceptance['stderr'], '.4f')}"
        )
        if m["versus_exact"] is not None:
            v = m["versus_exact"]
            print(
                f"{name} − exact (w = 1), paired over {v['examples']} examples: "
                f"quality {v['quality_difference']:+.4f} ± {fmt(v['stderr'], '.4f')}, "
                f"acceptance {v['acceptance']['exact']:.3f} → {v['acceptance']['head']:.3f}"
            )


def write_frontier_plot(report: dict, points, task: str, temperature: float, plot: str | None) -> None:
    from .eval.frontier_figure import frontier_figure

    path = Path(plot or Path("runs/frontier") / f"{task}-{report['set']}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    frontier_figure(
        points,
        f"Frontier on {task}, {report['set']} ({report['examples']} held-out examples, T = {temperature:g})",
    ).write_html(path)
    print(f"plot: {path}")


def print_and_write(report: dict, table: str, json_path: str | None, markdown_path: str | None) -> None:
    """Print a report's Markdown table; write the report as JSON and the table where asked."""
    print(table)
    if json_path:
        write_text(json_path, json.dumps(report, indent=2) + "\n")
    if markdown_path:
        write_text(markdown_path, table + "\n")


def add_table_arguments(parser) -> None:
    parser.add_argument(
        "--sets",
        default="summarization,math:arithmetic,math:gsm8k,code,general",
        help="comma-separated task or task:held-out set (default: every task; math on both sets)",
    )
    parser.add_argument("--temperatures", default="1,0", help="comma-separated; 0 = greedy (default 1,0)")
    parser.add_argument(
        "--head",
        action="append",
        default=[],
        metavar="TASK=HEAD",
        help="the head of a task (default: the shipped heads/<task>); repeatable",
    )
    parser.add_argument("--limit", type=int, default=20, help="held-out examples per set (the first of each)")
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the table as JSON here (e.g. results/table.json)")
    parser.add_argument(
        "--markdown", default=None, help="write the Markdown table here (e.g. results/table.md)"
    )
    add_pair_arguments(parser)
    parser.set_defaults(func=run_table)


def run_table(args) -> int:
    from tqdm.auto import tqdm

    from .eval.held_out import held_out_examples
    from .eval.table import markdown, parse_sets, parse_temperatures, results_table
    from .models.heads import greedy_twin, load_head, resolve_head_path

    sets, temperatures = parse_sets(args.sets), parse_temperatures(args.temperatures)
    if args.limit < 1 or args.n_draft < 1 or args.max_new_tokens < 1:
        raise ValueError("--limit, --n-draft and --max-new-tokens must be positive integers")
    chosen = {}
    for item in args.head:
        task, sep, head = item.partition("=")
        if not sep or not head:
            raise ValueError(f"--head takes TASK=HEAD, not {item!r}")
        chosen[task] = head
    head_paths = {
        task: resolve_head_path(chosen.get(task, task)) for task in dict(sets)
    }  # fails before loading
    greedy_paths = {}  # the greedy twin (<head>-greedy) of a head, where one exists, serves T = 0
    for task, path in head_paths.items():
        with contextlib.suppress(ValueError):
            greedy_paths[task] = resolve_head_path(greedy_twin(path.stem))
    for task, set_name in sets:
        held_out_examples(task, args.limit, None, set_name)
    pair = pair_from_args(args)
    heads = {task: (path.stem, load_head(path, pair)) for task, path in head_paths.items()}
    greedy_heads = {task: (path.stem, load_head(path, pair)) for task, path in greedy_paths.items()}
    bar = tqdm(total=len(sets) * len(temperatures) * 3 * args.limit, desc="table")
    report = results_table(
        pair,
        sets,
        heads,
        temperatures,
        args.limit,
        args.n_draft,
        args.max_new_tokens,
        args.seed,
        progress=lambda: bar.update(1),
        greedy_heads=greedy_heads,
    )
    bar.close()
    report["command"] = command_line()
    print_and_write(report, markdown(report), args.json, args.markdown)
    return 0


def add_bench_arguments(parser) -> None:
    from .eval.bench import DEFAULT_MODES

    parser.add_argument(
        "--modes",
        default=DEFAULT_MODES,
        help="comma-separated: ar, exact, static:<w>, dynamic:<head>; a name ending in /no-lookup drafts "
        "without prompt lookup (greedy decoding's copies from the text), e.g. exact/no-lookup",
    )
    parser.add_argument(
        "--per-category", type=int, default=2, help="questions per Spec-Bench category (0 = all)"
    )
    parser.add_argument(
        "--categories",
        default=None,
        help="comma-separated Spec-Bench categories to run (default all), e.g. summarization,math_reasoning",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="Spec-Bench question.jsonl (default: spec_bench/ in $DIVERSED_DATA or ../shared/data)",
    )
    parser.add_argument(
        "--app-examples",
        type=int,
        default=None,
        metavar="K",
        help="time the app's first K example prompts instead of Spec-Bench (1: the example the "
        "app opens with)",
    )
    parser.add_argument(
        "--n-draft",
        default="auto",
        help="draft length for every mode, or auto: each mode's best by the analytic bound at the "
        "acceptance of a calibration run on the project's own prompts (default)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (Spec-Bench's setting)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--vs-transformers", action="store_true", help="also time transformers' generate (greedy)"
    )
    parser.add_argument(
        "--vs-llama-cpp",
        action="store_true",
        help="also time llama.cpp's target-only decoding of the same GGUF (greedy; needs "
        "llama-cpp-python, which compiles llama.cpp)",
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=None,
        metavar="K",
        help="instead: time K decodes of each question as one batch (how head training decodes "
        "rollouts) against one after another, per mode (N from --n-draft, 4 where auto)",
    )
    parser.add_argument("--json", default=None, help="write the machine-readable report here")
    parser.add_argument("--markdown", default=None, help="write the Markdown table here")
    parser.add_argument("--plot", default=None, help="write a plotly HTML chart here")
    add_pair_arguments(parser)
    parser.set_defaults(func=run_bench_command)


def run_bench_command(args) -> int:
    from tqdm.auto import tqdm

    from .eval.bench import parse_modes, run_batch_bench, run_bench
    from .eval.bench_report import batch_markdown, bench_figure, markdown_table

    # Everything that can be checked without the models is checked before they load.
    examples = bench_examples(args)
    parse_modes(args.modes)
    if args.n_draft != "auto" and not (args.n_draft.isdigit() and int(args.n_draft) >= 1):
        raise ValueError(f"--n-draft must be a positive integer or auto, not {args.n_draft!r}")
    n_draft = args.n_draft if args.n_draft == "auto" else int(args.n_draft)
    if args.batch_rows is not None and args.batch_rows < 2:
        raise ValueError(f"--batch-rows must be at least 2, not {args.batch_rows}")
    llama_cpp_gguf = llama_cpp_target(args) if args.vs_llama_cpp else None
    pair = pair_from_args(args, compiled="wait")
    modes = parse_modes(args.modes, pair)
    bar = tqdm(total=len(examples) * len(modes), desc="bench")
    if args.batch_rows is not None:
        report = run_batch_bench(
            pair,
            examples,
            modes,
            args.batch_rows,
            4 if n_draft == "auto" else n_draft,
            args.max_new_tokens,
            args.temperature,
            args.seed,
            progress=lambda: bar.update(1),
        )
        bar.close()
        print_and_write(report, batch_markdown(report), args.json, args.markdown)
        return 0
    report = run_bench(
        pair,
        examples,
        modes,
        n_draft,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        args.vs_transformers,
        progress=lambda: bar.update(1),
        vs_llama_cpp=llama_cpp_gguf,
    )
    bar.close()
    print_and_write(report, markdown_table(report), args.json, args.markdown)
    if args.plot:
        bench_figure(report).write_html(args.plot)
    return 0


def llama_cpp_target(args):
    """The target's GGUF for --vs-llama-cpp, checked before the models load."""
    import importlib.util

    from .models.embedded import EMBEDDED
    from .models.loading import gguf_file

    gguf = gguf_file(args.target or EMBEDDED)
    if gguf is None:
        raise ValueError("--vs-llama-cpp needs a GGUF target (the embedded one, or a .gguf file)")
    if importlib.util.find_spec("llama_cpp") is None:
        raise ValueError("--vs-llama-cpp needs llama-cpp-python: pip install llama-cpp-python (it compiles)")
    return gguf


def bench_examples(args) -> list:
    """The questions to bench: the app's first K example prompts, or Spec-Bench's first turns."""
    from .eval.tasks import app_examples, load_spec_bench

    if args.app_examples is not None:
        if args.app_examples < 1:
            raise ValueError(f"--app-examples must be a positive integer, not {args.app_examples}")
        return [e for task_examples in app_examples().values() for e in task_examples][: args.app_examples]
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    return load_spec_bench(args.data, categories, per_category=args.per_category or None)


def add_app_arguments(parser) -> None:
    add_pair_arguments(parser)
    parser.add_argument(
        "--host", default=None, help="interface to listen on (default 127.0.0.1; 0.0.0.0 to share on a LAN)"
    )
    parser.add_argument("--port", type=int, default=None, help="port (default 7860 or $GRADIO_SERVER_PORT)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument(
        "--allow-training",
        action="store_true",
        help="keep the Train tab on where the app is public (--share, a non-loopback --host, a Space)",
    )
    parser.set_defaults(func=run_app)


def run_app(args) -> int:
    from .ui.app import build_app, launch
    from .ui.examples import load_examples
    from .ui.opening import measured_opening
    from .ui.space import mark_public

    warning = mark_public(args.host, args.share, args.allow_training)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    pair, examples = pair_from_args(args, compiled="background"), load_examples()
    app = build_app(pair, examples, start=measured_opening(pair, examples))
    launch(app, server_name=args.host, server_port=args.port, share=args.share)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diversed-demo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_arguments(sub.add_parser("generate", help="decode one prompt and print text and summary"))
    add_distill_arguments(sub.add_parser("distill", help="train the embedded feature draft from the target"))
    add_train_arguments(sub.add_parser("train", help="train an ensemble head with sequence-level RL"))
    add_frontier_arguments(sub.add_parser("frontier", help="static-w frontier vs heads on a held-out set"))
    add_bench_arguments(sub.add_parser("bench", help="Spec-Bench speed and quality table"))
    add_table_arguments(
        sub.add_parser("table", help="paper-style results: exact SD vs DIVERSED per task and temperature")
    )
    add_app_arguments(sub.add_parser("app", help="launch the Gradio app"))
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as err:  # bad input: a message, not a traceback
        print(f"diversed-demo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diversed-demo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
