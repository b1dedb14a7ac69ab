"""Hostile input: generated bad arguments and malformed files for every command end in
one line and exit code 2, never a traceback, a hang, an accepted bad value or a stray file.

Each example runs as its own ``liveput`` process under an address-space limit
(``bench/hostile.py``); the whole corpus (700+ cases, with memory) is ``python -m bench hostile``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.hostile import (
    NUMERIC_OPTIONS,
    TRACE_READERS,
    Case,
    malformed_traces,
    run_case,
    valid_trace,
)

# Each example is a `liveput` process (about 0.4 CPU-s): 15 of each here, the whole corpus in
# the benchmark.
SETTINGS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Bad for every numeric option: each is finite and >= 0 within a documented range.
bad_numbers = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999", "", " ", "0x10", "1,5", "--"]),
    st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="abcxyz!@#%", min_size=1, max_size=6),
)
options = st.sampled_from(
    [(command, option) for command, (_, opts) in NUMERIC_OPTIONS.items() for option in opts]
)


def _judge(case: Case) -> None:
    outcome = run_case(case, timeout_s=60)
    assert outcome.verdict == "ok", (
        case.name,
        outcome.verdict,
        outcome.code,
        outcome.stderr[-600:],
        outcome.left,
    )


@pytest.mark.process
@SETTINGS
@given(option=options, value=bad_numbers)
def test_bad_numbers_are_refused_in_one_line(option, value):
    command, name = option
    base = NUMERIC_OPTIONS[command][0]
    _judge(
        Case(
            f"{command} {name}={value!r}",
            (*base, name, value),
            files=(("trace.csv", valid_trace()),),
        )
    )


@pytest.mark.process
@SETTINGS
@given(
    reader=st.sampled_from(["trace stats", "predict backtest"]),
    content=st.one_of(
        st.binary(max_size=300),
        st.sampled_from(list(malformed_traces().values())),
        st.lists(
            st.tuples(
                st.sampled_from(["0", "-5", "nan", "1e30", "9e15", "60000", "x"]),
                st.sampled_from(["add", "remove", "grow"]),
                st.sampled_from(["a", "b", ""]),
            ),
            min_size=1,
            max_size=6,
        ).map(lambda rows: "".join(f"{t},{k},{n}\n" for t, k, n in rows).encode()),
    ),
)
def test_malformed_traces_never_crash(reader, content):
    # A generated file may happen to be a valid trace: exit 0 is then right; anything but a
    # clean result or a one-line refusal is not.
    _judge(
        Case(
            f"{reader} generated trace", TRACE_READERS[reader], bad=False, files=(("bad", content),)
        )
    )


@pytest.mark.process
@pytest.mark.parametrize(
    "argv",
    [
        ("trace", "generate", "-o", "{dir}/no/such/folder/out.csv"),
        ("trace", "generate", "-o", "{dir}", "--hours", "1"),
        ("trace", "stats", "{dir}/trace.csv", "--interval", "1e-9"),
        (
            "simulate",
            "--trace",
            "{dir}/trace.csv",
            "-o",
            "{dir}/s.json",
            "--report",
            "{dir}/trace.csv",
        ),
        ("agent", "--coordinator", "127.0.0.1:1", "--token", "t", "--notices", "bogus"),
    ],
)
def test_named_hostile_cases(argv):
    _judge(Case(" ".join(argv), argv, files=(("trace.csv", valid_trace()),)))


# -- the pieces, in process -------------------------------------------------------------------


def test_number_checkers_refuse_non_finite_and_out_of_range_and_keep_the_bounds():
    import typer

    from liveput.cli import params

    seconds = params.SECONDS
    assert seconds("0.001") == 0.001 and seconds(60.0) == 60.0
    for bad in ("nan", "inf", "-inf", "0", "1e-9", "1e99", "x", ""):
        with pytest.raises(typer.BadParameter):
            seconds(bad)
    assert params.SEED("0") == 0 and params.SEED("3.0") == 3
    for bad in ("-1", "2.5", "4294967296", "nan"):
        with pytest.raises(typer.BadParameter):
            params.SEED(bad)
    assert params.HOUR_OF_TRACE(None) is None


def test_outputs_get_the_umask_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import os

    from liveput.errors import LiveputError
    from liveput.files import write_text_atomic

    old = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "a.json", "{}\n")
        assert path.stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        assert write_text_atomic(tmp_path / "b.json", "{}\n").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
    with pytest.raises(LiveputError, match="does not exist"):
        write_text_atomic(tmp_path / "no" / "c.json", "x")
    assert not (tmp_path / "no").exists()

    def broken(*_args):  # noqa: ANN002, ANN202 - os.replace failing mid-write
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_text_atomic(tmp_path / "a.json", "new")
    monkeypatch.undo()
    assert (tmp_path / "a.json").read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


def test_work_over_the_memory_budget_is_refused_before_it_is_allocated(monkeypatch, capsys):
    from liveput.cli.main import main

    monkeypatch.setenv("LIVEPUT_MEMORY_GB", "0.01")
    # About 17 MiB of tables for 2,000 instances of gpt-1.5b (gpt-6.7b on 1,024: 3 MiB).
    assert main(["plan", "--nodes", "2000", "--forecast", "2000,2000", "--horizon", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the optimizer's tables for 2000 instances")
    assert "0.01 GiB budget" in err and "\n" not in err
    monkeypatch.setenv("LIVEPUT_MEMORY_GB", "nan")
    assert main(["plan", "--nodes", "64", "--forecast", "64,64", "--horizon", "3"]) == 2
    assert "LIVEPUT_MEMORY_GB" in capsys.readouterr().err


def test_plan_refuses_an_infeasible_current_and_says_when_its_decision_cannot_run_now(capsys):
    import json

    from liveput.cli.main import main

    assert (
        main(["plan", "--nodes", "8", "--current", "1x1", "--forecast", "8,8", "--horizon", "3"])
        == 2
    )
    assert "--current 1x1 cannot run gpt-1.5b: out of memory" in capsys.readouterr().err
    forecast = ",".join(["16"] * 11)
    assert main(["plan", "--nodes", "4", "--forecast", forecast, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    decision = result["decision"]
    assert decision["data_parallel"] * decision["pipeline_stages"] > 4
    assert result["runnable_now"] is False and result["best_now"] is None


def test_models_lists_every_built_in_name_and_each_loads_where_the_list_says(capsys):
    import json

    import torch

    from liveput.cli.main import main
    from liveput.models.jobs import resolve_job
    from liveput.perf import load_profile

    assert main(["models", "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)
    performance = kinds["performance models"]
    assert {"gpt-1.5b", "resnet152", "tiny-gpt"} <= set(performance["names"])
    for name in performance["names"]:
        assert load_profile(name).model == name
    jobs = kinds["jobs (trained for real)"]
    assert "train" in jobs["commands"] and "tiny-gpt" in jobs["names"]
    # Built on the meta device: each name must resolve to a job with layers, which shapes
    # alone show; gpt2-small's random initialization took most of this test's CPU.
    with torch.device("meta"):
        for name in jobs["names"]:
            assert resolve_job(name).num_layers >= 1


POOL = (
    "advise pool --model gpt-1.5b --deadline-hours 2 --trace {dir}/trace.csv --target-samples 1e5"
)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        # An empty list: the option names nothing.
        ("simulate --trace {dir}/trace.csv --policies ''", "--policies: empty; give one or more"),
        ("predict backtest {dir}/long.csv --methods ''", "--methods: empty; give one or more"),
        ("predict backtest {dir}/long.csv --methods ' , '", "--methods: empty"),
        ("advise deepvm --budget-usd-per-hour 3 --types ''", "--types: empty; give one or more"),
        ("advise deepvm --budget-usd-per-hour 3 --types ,", "--types: empty"),
        (
            "advise slo --model resnet152 --target-loss 0.5 --deadline-hours 0.5 --types ,",
            "--types: empty",
        ),
        (
            "advise slo --model resnet152 --target-loss 0.5 --deadline-hours 0.5 --loss-params ''",
            "--loss-params: empty; give one or more comma-separated numbers",
        ),
        (POOL + " --spot-caps ''", "--spot-caps: empty"),
        (
            "coordinator --embedded --token t --provider emulated --spot-max 1 --instance-types ''",
            "--instance-types: empty; give one or more comma-separated instance types",
        ),
        # A span shorter than one interval: not one interval of it is whole.
        ("trace generate -o {dir}/out.csv --hours 0.001", "shorter than one interval"),
        ("trace stats {dir}/trace.csv --interval 7200", "shorter than one --interval (7200 s)"),
        (
            "trace stats {dir}/trace.csv --start-hour 0.1 --end-hour 0.1001",
            "between --start-hour and --end-hour spans 0.36 s, shorter than one --interval",
        ),
        (
            "simulate --trace {dir}/trace.csv --policies reactive --interval 7200",
            "shorter than one --interval (7200 s)",
        ),
        (
            "simulate --trace {dir}/trace.csv --policies reactive --start-hour 0.1 "
            "--end-hour 0.1001",
            "spans 0.36 s, shorter than one --interval (60 s)",
        ),
        (
            "simulate --policies reactive --interval 86400",
            "the default trace spans 12 h, shorter than one --interval (86400 s)",
        ),
        (POOL + " --interval 7200", "shorter than one --interval (7200 s)"),
        (POOL + " --hours 0.001", "--hours 0.001 (3.6 s) is shorter than one --interval (60 s)"),
        (
            "predict backtest {dir}/long.csv --interval 20000",
            "shorter than one --interval (20000 s)",
        ),
    ],
)
def test_an_empty_list_or_a_span_shorter_than_one_interval_is_refused_in_one_line(
    tmp_path, capsys, command, message
):
    import shlex

    from bench.hostile import valid_trace
    from liveput.cli.main import main
    from liveput.traces import generate_trace, write_trace

    (tmp_path / "trace.csv").write_bytes(valid_trace())  # 0.47 h of 60-s intervals
    write_trace(generate_trace(8, 3.0, seed=1), tmp_path / "long.csv")  # past the warm-up
    before = sorted(path.name for path in tmp_path.iterdir())
    code = main(shlex.split(command.format(dir=tmp_path)))
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err, err
    assert "\n" not in err and "Traceback" not in err
    assert sorted(path.name for path in tmp_path.iterdir()) == before  # nothing written
