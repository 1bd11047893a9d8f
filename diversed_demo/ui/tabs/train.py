"""The Train tab: a DIVERSED head trained with sequence-level RL in the background (one run at a time,
decoding goes on), its reward, acceptance and mean w_t per step, and its head added to the sidebar."""

from __future__ import annotations

import time

import gradio as gr

from ...eval.tasks import TASKS
from ...training import config as train_config
from ...training import loop as train_loop
from ..handlers import bind, user_errors
from ..render import training_figure
from ..runs import TrainingJob, training_status
from ..sidebar import Sidebar, refresh_heads
from ..space import public_space

BUILT_IN, UPLOADED = "Built-in examples", "Uploaded JSONL"


def training_config(task, source, upload, steps, rollouts, lam, lr) -> train_config.HeadTrainConfig:
    """The run's config from the tab's values, its settings and prompts checked here so that a bad upload is
    an error message, not a failed run."""
    if public_space():
        raise ValueError(
            "training is off on this public app (a visitor's run would hold the shared CPU); run it "
            "locally (`make demo`), or launch with --allow-training"
        )
    if source == UPLOADED and not upload:
        raise ValueError("upload a .jsonl file of prompts first, or choose the built-in examples")
    config = train_config.HeadTrainConfig(
        task=task,
        prompts_path=upload if source == UPLOADED else None,
        prompts_may_run_code=False,
        steps=int(steps),
        rollouts_per_prompt=int(rollouts),
        lam=float(lam),
        lr=float(lr),
    )
    train_config.check_config(config)
    train_config.training_examples(config)
    return config


def on_start_training(pair, job, task, source, upload, steps, rollouts, lam, lr, request: gr.Request):
    """Start a run and follow it: (chart, status, head dropdown) every half second, then the new head."""
    with user_errors():
        config = training_config(task, source, upload, steps, rollouts, lam, lr)
    started = job.start(
        lambda callback, should_stop: train_loop.train_head(
            pair, config, callback=callback, should_stop=should_stop, progress=False
        ),
        owner=request.session_hash if request else None,
    )
    if not started:
        gr.Warning("A training run is already in progress; wait for it to finish.")
        return
    while job.running:
        yield training_figure(job.history), training_status(job, int(steps)), gr.skip()
        time.sleep(0.5)
    if job.error:
        gr.Warning(f"Training failed: {job.error}")
    new_head = job.result.path.stem if job.result is not None and job.result.path else None
    yield training_figure(job.history), training_status(job, int(steps)), refresh_heads(pair, new_head)


def on_cancel_training(job, request: gr.Request):
    if not job.cancel(owner=request.session_hash if request else None):
        gr.Warning("No training run of yours is in progress.")
        return gr.skip()
    return training_status(job)


def task_defaults(task):
    """A task's own λ and learning rate."""
    config = train_config.HeadTrainConfig(task=task)
    return config.lam, config.lr


def build_prompt_choice() -> tuple[gr.Dropdown, gr.Radio, gr.File]:
    """The task, and its prompts: the built-in examples or an uploaded file (shown when chosen)."""
    with gr.Row():
        task = gr.Dropdown(
            list(TASKS),
            value="general",
            label="task",
            min_width=200,
            info="the reward: ROUGE-2, math match, pass@1, or fidelity (general)",
        )
        source = gr.Radio([BUILT_IN, UPLOADED], value=BUILT_IN, label="prompts", min_width=200)
        upload = gr.File(
            label='prompts (.jsonl): one {"prompt", "reference"?} per line',
            file_types=[".jsonl"],
            type="filepath",
            visible=False,
            height=120,
            elem_id="train-upload",
        )
    source.change(
        lambda chosen: gr.update(visible=chosen == UPLOADED), source, upload, api_visibility="private"
    )
    return task, source, upload


def build_hyperparameters(task: gr.Dropdown) -> list:
    """Steps, rollouts per prompt, λ and the learning rate, at the general task's defaults (λ and the
    learning rate follow the task)."""
    defaults = train_config.HeadTrainConfig(task="general")
    with gr.Row():
        steps = gr.Slider(
            1, 200, value=defaults.steps, step=1, label="steps", elem_id="train-steps", min_width=160
        )
        rollouts = gr.Slider(
            2,
            8,
            value=defaults.rollouts_per_prompt,
            step=1,
            min_width=160,
            label="rollouts per prompt",
            elem_id="train-rollouts",
        )
        lam = gr.Slider(0, 10, value=defaults.lam, step=0.05, label="λ (speed vs quality)", min_width=160)
        lr = gr.Number(defaults.lr, label="learning rate", min_width=160)
    task.change(task_defaults, task, [lam, lr], api_visibility="private")
    return [steps, rollouts, lam, lr]


def build_train_tab(app: gr.Blocks, pair, job: TrainingJob, sidebar: Sidebar) -> None:
    """The Train tab (off on a public Space); a new head lands in the sidebar's dropdown."""
    public = public_space()
    with gr.Tab("Train", id="train"):
        if public:
            gr.Markdown(
                "Training is off on this public app: a run would hold the shared CPU for minutes. "
                "Run the app locally (`make demo`) to train heads, or launch it with `--allow-training`.",
                elem_id="train-off",
            )
        gr.Markdown(
            "Train a DIVERSED head with sequence-level RL. One run at a time; decoding keeps "
            "working meanwhile. The head is saved to your heads folder and appears in the "
            "sidebar's dropdown."
        )
        task, source, upload = build_prompt_choice()
        hyperparameters = build_hyperparameters(task)
        with gr.Row():
            start_button = gr.Button(
                "Start training", variant="primary", elem_id="train-start", interactive=not public
            )
            cancel_button = gr.Button(
                "Cancel", variant="stop", elem_id="train-cancel", interactive=not public
            )
        status = gr.Markdown("Idle.", elem_id="train-status")
        plot = gr.Plot(training_figure([]), show_label=False)

    # Training runs in the job's thread; these handlers only start, poll and cancel it, so they get their
    # own small pool instead of holding decoding slots.
    start_button.click(
        bind(on_start_training, pair, job),
        [task, source, upload, *hyperparameters],
        [plot, status, sidebar.head],
        concurrency_id="train",
        concurrency_limit=4,
        api_name="train",
    )
    cancel_button.click(
        bind(on_cancel_training, job), None, status, concurrency_limit=None, api_name="cancel_training"
    )
    # A run started by another visitor is shown to everyone: there is only one at a time.
    app.load(lambda: training_status(job), None, status, api_visibility="private")
