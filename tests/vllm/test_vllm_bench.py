"""`python -m diversed_demo.vllm bench`: every mode through vLLM (heads included), fidelity, the heads' share
of decoding time, this project's decoder beside it, and the settings it refuses before an engine starts."""

import json
import subprocess
import sys

import pytest

BENCH = [
    sys.executable,
    "-m",
    "diversed_demo.vllm",
    "bench",
    "--categories",
    "math",
    "--max-new-tokens",
    "16",
]


def bench(*arguments, timeout=900):
    return subprocess.run([*BENCH, *arguments], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--modes", "ar,dynamic:general", "--drafting", "greedy"], "needs --drafting probabilistic"),
        (["--modes", "ar,dynamic:nope"], "no head 'nope'"),
        (["--modes", "ar,exact", "--beside", "missing.json"], "missing.json"),
    ],
)
def test_what_cannot_run_is_refused_before_an_engine_starts(arguments, message):
    result = bench(*arguments, timeout=120)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_a_report_of_other_settings_is_refused_beside(tmp_path):
    other = tmp_path / "decoder.json"
    other.write_text(json.dumps({"settings": {"examples": 1, "max_new_tokens": 64, "temperature": 1.0}}))
    result = bench("--modes", "ar,exact", "--temperature", "1", "--beside", str(other), timeout=120)
    assert result.returncode == 2 and "its max_new_tokens is 64, this run's 16" in result.stderr


@pytest.mark.embedded
@pytest.mark.slow
def test_a_bench_with_a_head_reports_its_share_and_the_decoder_beside(tmp_path):
    decoder = (
        tmp_path / "decoder.json"
    )  # a decoder report of the same settings, as `diversed-demo bench` writes
    decoder.write_text(
        json.dumps(
            {
                "settings": {"examples": 1, "max_new_tokens": 16, "temperature": 1.0},
                "overall": {"exact/no-lookup": {"acceptance_rate": 0.25, "tau": 1.5, "fidelity": -2.0}},
            }
        )
    )
    report_path, table_path = tmp_path / "report.json", tmp_path / "report.md"
    result = bench(
        "--modes", "ar,exact,cost:4,dynamic:general", "--temperature", "1", "--beside", str(decoder),
        "--json", str(report_path), "--markdown", str(table_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    overall = report["overall"]
    assert set(overall) == {"ar", "exact", "cost:4", "dynamic:general"}
    for row in overall.values():
        assert len(row["fidelity_scores"]) == 1 and row["fidelity"] < 0 and row["new_tokens"] > 0
    assert 0 < overall["dynamic:general"]["head_step_share"] < 1  # the heads ran, and took part of the time
    assert "head_step_share" not in overall["exact"]
    assert report["settings"]["drafting"] == "probabilistic"
    exact = report["beside"]["modes"]["exact"]
    assert exact["decoder"]["acceptance_rate"] == 0.25
    assert exact["vllm"]["acceptance_rate"] == overall["exact"]["acceptance_rate"]
    assert set(report["beside"]["modes"]) == {"exact"}  # the modes both reports ran
    table = table_path.read_text()
    assert "| dynamic:general |" in table and "Beside this project's decoder" in table
