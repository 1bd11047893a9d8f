"""--dtype auto on a CPU: the dtype measured fastest here, once per machine and pair, with its reasons."""

import time

import pytest
from tiny import save_tiny_pair

from diversed_demo.eval import bench_report
from diversed_demo.models.loading import EMBEDDED
from diversed_demo.runtime import amx_gguf, dtype_choice, plan
from diversed_demo.runtime.dtype_choice import choice_note, choose_dtype
from diversed_demo.runtime.plan import load_pair
from diversed_demo.runtime.theory import analytic_speedup


@pytest.fixture
def saved_pair(tmp_path):
    return save_tiny_pair(tmp_path)


def fake_costs(fast: str):
    """measure_costs where `fast` runs a target token in 10 ms and the other dtype in 20 ms."""

    def measure(pair, prompt_ids, n_drafts, **kwargs):
        name = str(pair.target.dtype).removeprefix("torch.")
        return {
            "target_ms": 10.0 if name == fast else 20.0,
            "c": 0.1,
            "r": 0.05,
            "v": {n: 1.0 + 0.05 * n for n in n_drafts},
        }

    return measure


@pytest.mark.parametrize("fast", ["float32", "bfloat16"])
def test_the_dtype_with_the_fastest_bound_is_chosen(saved_pair, monkeypatch, fast):
    target, draft = saved_pair
    monkeypatch.setattr(dtype_choice, "measure_costs", fake_costs(fast))
    pair, choice = choose_dtype(lambda d: load_pair(target, draft, "cpu", d), [1, 5, 6, 7], alpha=0.6)
    assert choice["dtype"] == fast and str(pair.target.dtype) == f"torch.{fast}"
    best = choice["figures"][fast]
    assert best["tokens_per_second"] == pytest.approx(1e3 * best["bound"] / 10.0)
    assert best["bound"] == pytest.approx(
        max(analytic_speedup(0.6, n, 0.1, 1.0 + 0.05 * n, 0.05) for n in range(1, 7))  # r counted too
    )
    assert choice["figures"][fast]["tokens_per_second"] > max(
        f["tokens_per_second"] for d, f in choice["figures"].items() if d != fast
    )
    assert fast in choice_note(choice) and choice["cpu"] in choice_note(choice)


def test_auto_measures_once_then_reuses_the_choice(saved_pair, monkeypatch, tmp_path):
    target, draft = saved_pair
    monkeypatch.setenv("DIVERSED_DTYPE_CHOICES", str(tmp_path / "choices.json"))
    monkeypatch.setattr(dtype_choice, "measure_costs", fake_costs("bfloat16"))
    first = load_pair(target, draft, "cpu")
    assert first.dtype_choice["dtype"] == "bfloat16" and not first.dtype_choice.get("cached")

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(dtype_choice, "choose_dtype", no_measuring)
    again = load_pair(target, draft, "cpu")
    assert str(again.target.dtype) == "torch.bfloat16" and again.dtype_choice["cached"]
    assert "earlier start" in choice_note(again.dtype_choice)


def timed_dtypes(monkeypatch, tmp_path, bf16: bool) -> list:
    """A CPU with (or without) bf16 arithmetic where float32 times faster: the list each dtype timed is noted
    in, choices kept under tmp_path."""
    monkeypatch.setenv("DIVERSED_DTYPE_CHOICES", str(tmp_path / "choices.json"))
    monkeypatch.setattr(dtype_choice, "bf16_instructions", lambda: bf16)
    timed, measure = [], fake_costs("float32")

    def counting(pair, *args, **kwargs):
        timed.append(str(pair.target.dtype).removeprefix("torch."))
        return measure(pair, *args, **kwargs)

    monkeypatch.setattr(dtype_choice, "measure_costs", counting)
    return timed


def test_a_servers_first_start_takes_bf16_untimed_and_the_next_start_completes_the_choice(
    saved_pair, monkeypatch, tmp_path
):
    """Where the CPU has bf16 arithmetic a first start serves on bf16 with nothing timed (its page comes
    first); the next start measures α and times both, keeps the faster (here float32), then never times
    again."""
    target, draft = saved_pair
    timed = timed_dtypes(monkeypatch, tmp_path, bf16=True)
    alphas, alpha = [], dtype_choice.calibration_alpha
    monkeypatch.setattr(dtype_choice, "calibration_alpha", lambda *a, **k: alphas.append(1) or alpha(*a, **k))
    first = load_pair(target, draft, "cpu", serve_first=True)
    assert timed == [] and alphas == [] and str(first.target.dtype) == "torch.bfloat16"
    assert first.dtype_choice["untimed"] == ["bfloat16", "float32"] and first.costs is None
    assert "bfloat16 and float32 timed at the next start" in choice_note(first.dtype_choice)
    assert "timed at the next start" in first.runtime.dtype_why

    loaded, fast_pair = [], plan.fast_pair
    monkeypatch.setattr(plan, "fast_pair", lambda *a: loaded.append(a[3]) or fast_pair(*a))
    second = load_pair(target, draft, "cpu", serve_first=True)
    assert loaded == ["bfloat16", "float32"]  # each once
    assert timed == ["bfloat16", "float32"] and str(second.target.dtype) == "torch.float32"
    assert alphas == [1] and set(second.dtype_choice["figures"]) == {"bfloat16", "float32"}
    assert "untimed" not in second.dtype_choice

    third = load_pair(target, draft, "cpu", serve_first=True)
    assert len(timed) == 2 and third.dtype_choice["cached"]


def test_a_choice_timed_beside_a_busy_core_serves_its_start_and_is_timed_again(
    saved_pair, monkeypatch, tmp_path
):
    """A timing whose thread got a fraction of the CPU time the clock shows (another process on a core:
    here a timing that sleeps) is used for that start, said so, and not kept: the next start times again."""
    target, draft = saved_pair
    timed = timed_dtypes(monkeypatch, tmp_path, bf16=False)
    measure = dtype_choice.measure_costs
    monkeypatch.setattr(dtype_choice, "measure_costs", lambda *a, **k: time.sleep(0.25) or measure(*a, **k))
    first = load_pair(target, draft, "cpu")
    assert first.dtype_choice["shared"] and "timed again at the next start" in choice_note(first.dtype_choice)
    assert not (tmp_path / "choices.json").exists()
    monkeypatch.setattr(dtype_choice, "measure_costs", measure)  # the cores free again
    second = load_pair(target, draft, "cpu")
    assert len(timed) == 4 and "shared" not in second.dtype_choice and (tmp_path / "choices.json").exists()


def test_a_load_that_waits_on_the_disk_is_not_taken_for_a_busy_core(saved_pair, monkeypatch, tmp_path):
    """Loading a dtype (reading weights: the thread waits, no core is taken) is outside the judged timing:
    the choice is kept however long the loads wait."""
    target, draft = saved_pair
    timed_dtypes(monkeypatch, tmp_path, bf16=False)
    make = plan.fast_pair
    monkeypatch.setattr(plan, "fast_pair", lambda *a, **k: time.sleep(0.25) or make(*a, **k))
    first = load_pair(target, draft, "cpu")
    assert set(first.dtype_choice["figures"]) == {"bfloat16", "float32"}
    assert "shared" not in first.dtype_choice and (tmp_path / "choices.json").exists()


def test_without_bf16_arithmetic_a_first_start_times_every_dtype(saved_pair, monkeypatch, tmp_path):
    target, draft = saved_pair
    timed = timed_dtypes(monkeypatch, tmp_path, bf16=False)
    pair = load_pair(target, draft, "cpu", serve_first=True)
    assert sorted(timed) == ["bfloat16", "float32"] and str(pair.target.dtype) == "torch.float32"
    assert "untimed" not in pair.dtype_choice


def test_without_bf16_arithmetic_a_gguf_target_on_the_gguf_kernel_starts_on_bf16_untimed(
    saved_pair, monkeypatch, tmp_path
):
    """Where the GGUF kernel (bf16 rows by the GGUF's blocks) serves the target, a first start serves on
    bf16 with nothing timed, even on a CPU without bf16 arithmetic (AVX2)."""
    target, draft = saved_pair
    timed = timed_dtypes(monkeypatch, tmp_path, bf16=False)
    monkeypatch.setattr(dtype_choice, "gguf_kernel_serves", lambda name: name == target)
    pair = load_pair(target, draft, "cpu", serve_first=True)
    assert timed == [] and str(pair.target.dtype) == "torch.bfloat16"
    assert pair.dtype_choice["untimed"] == ["bfloat16", "float32"]


def test_the_gguf_kernel_serves_gguf_targets_only(saved_pair):
    target, _ = saved_pair
    assert not dtype_choice.gguf_kernel_serves(target)  # a transformers folder: no GGUF blocks
    assert dtype_choice.gguf_kernel_serves(EMBEDDED) == (amx_gguf.instruction_set() is not None)


def test_an_explicit_dtype_is_never_measured(saved_pair, monkeypatch):
    target, draft = saved_pair
    monkeypatch.setattr(dtype_choice, "choose_dtype", lambda *a, **k: pytest.fail("measured"))
    pair = load_pair(target, draft, "cpu", "float32")
    assert str(pair.target.dtype) == "torch.float32" and pair.dtype_choice is None


def test_a_head_stays_in_fp32_over_a_bf16_pair(saved_pair, tmp_path):
    from diversed_demo.core.generate import generate
    from diversed_demo.models.heads import load_head, new_head, save_head

    target, draft = saved_pair
    pair = load_pair(target, draft, "cpu", "bfloat16")
    save_head(new_head(pair), tmp_path / "h.safetensors")
    head = load_head(tmp_path / "h.safetensors", pair)
    assert {str(p.dtype) for p in head.parameters()} == {"torch.float32"}
    summary, events = generate(pair, [1, 5, 6, 7], mode="dynamic", head=head, n_draft=3, max_new_tokens=12)
    ws = [e.w for e in events if e.w is not None]
    assert ws and all(0 <= w <= 1 for w in ws) and summary.new_tokens == 12


def test_the_bench_header_says_which_dtype_and_why():
    choice = {
        "dtype": "bfloat16",
        "alpha": 0.5,
        "cpu": "AVX512 with bf16",
        "figures": {"float32": {"tokens_per_second": 20.0}, "bfloat16": {"tokens_per_second": 41.0}},
    }
    report = {
        "settings": {
            "examples": 1,
            "max_new_tokens": 8,
            "temperature": 0,
            "dtype": "bfloat16",
            "threads": 2,
            "device": "cpu",
            "n_draft": {"exact": 2},
            "dtype_choice": choice,
        },
        "costs": {"c": 0.1, "v": {2: 1.05}},
    }
    header = "\n".join(bench_report.settings_lines(report))
    assert "dtype bfloat16: the fastest here" in header and "41 tokens/s, float32 20" in header
