"""``python -m bench startup``: the pipeline it starts is cut evenly, and a benchmark that takes
no options refuses them in one line instead of a traceback."""

from __future__ import annotations

import pytest

from bench.__main__ import main as bench_main
from bench.bench_startup import even_bounds


@pytest.mark.parametrize(("layers", "stages"), [(14, 8), (6, 4), (5, 5), (18, 1)])
def test_the_start_up_pipeline_cuts_every_layer_into_stages_of_nearly_equal_length(
    layers: int, stages: int
) -> None:
    bounds = even_bounds(layers, stages)
    assert bounds[0] == 0 and bounds[-1] == layers and len(bounds) == stages + 1
    lengths = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(SystemExit, match="9 stages for 8 layers"):
        even_bounds(8, 9)


def test_a_benchmark_without_options_refuses_them_in_one_line(capsys) -> None:
    assert bench_main(["runtime", "--help"]) == 2
    assert "python -m bench runtime takes no options (given: --help)" in capsys.readouterr().out
