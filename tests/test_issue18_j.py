"""Issue 18 adversary adv18j's findings (multi-device cases in a fresh process,
tests/sharded_issue18j_cases.py): a program called on another mesh than traced
is refused in one line; closed-over arrays on other devices than the arguments
are read where the arguments are (jax.jit embeds them); .executable takes
Format in_shardings; compile with only out_shardings follows committed
arguments; a program call places results that read no argument as jax.jit
does.  References: jax.jit."""
import pytest

from eight_devices import run_case_script
from sharded_issue18j_cases import CASE_NAMES


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("issue18j")
    return run_case_script("sharded_issue18j_cases.py", str(out_dir))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_case(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])
