"""``jaxpr_cc.compile`` of programs traced from NamedSharding arrays or under
jax.set_mesh, without in_shardings, and with PartitionSpec in_shardings under
jax.set_mesh: jax.jit's values and output shardings through passes, save, load,
compile and executable save/load (tests/sharded_compile_cases.py, on 8 host
devices in a fresh process)."""
import pytest

from eight_devices import run_case_script
from sharded_compile_cases import CASE_NAMES


def _run(out_dir, n_devices: int, *extra):
    return run_case_script("sharded_compile_cases.py", str(out_dir), *extra, devices=n_devices)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sharded_compile")


@pytest.fixture(scope="module")
def reports(out_dir):
    return _run(out_dir, 8)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_compile(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])


def test_saved_sharded_program_loads_with_one_device(reports, out_dir):
    assert "named_inputs_no_in_shardings" in reports[1], reports[0].stderr[-4000:]
    res, found = _run(out_dir, 1, "--one-device")
    assert "load_with_one_device" in found, res.stderr[-4000:]
    assert found["load_with_one_device"]["problems"] == [], \
        "\n".join(found["load_with_one_device"]["problems"])
