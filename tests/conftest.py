import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_ENABLE_X64", "0")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"

import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if importlib.util.find_spec("jaxpr_cc") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# Tests measured slowest in the default run (about 6 s or more each on 2 cores), which
# run with `-m heavy`: fresh-process and multi-device duplicates of in-process
# checks, the largest corpus programs, and the slowest parametrizations of families
# whose other cases stay in the default run.  A function name marks all its cases.
HEAVY = {
    "tests/test_emit_python.py::test_emitted_modules_run_in_a_fresh_process",
    "tests/test_io_roundtrip.py::test_fresh_process_round_trip",
    "tests/test_realworld_roundtrip.py",
    "tests/test_issue18_h.py::test_sharded_case",
    "tests/test_nested_checkpointed_loops.py",
    "tests/test_golden_stability.py",
    "tests/test_issue18_sharded_adversary_d.py",
    "tests/test_sharded_adversary18c.py",
    "tests/test_jit_adversary18.py",
    "tests/test_issue18_adversary_g.py",
    "tests/test_forward_mode_realworld_corpus.py::test_backsolve_adjoint_forward_mode_equals_the_reference",
    "tests/test_forward_mode_default.py::test_jacfwd_of_jit_equals_jacrev[optimistix_newton]",
    "tests/test_forward_mode_default.py::test_jacfwd_of_jit_equals_jacrev[optimistix_closure]",
    "tests/test_forward_mode_default.py::test_hessian_of_a_program_mixing_rules_and_plain_code",
    "tests/test_forward_mode_default.py::test_fixed_point_jacfwd_and_hessian[explicit_argument]",
    "tests/test_emit_python_batched_while.py::test_vmapped_fixed_point_after_implicit_diff",
    "tests/test_canonicalize.py::test_random_float_programs_with_special_values",
    "tests/test_io_robustness.py::test_malformed_files_are_refused[damaged_document]",
    "tests/test_issue16_adversary.py::test_slogdet_differentiates_after_tracing",
    "tests/test_issue16_adversary.py::test_no_fixed_point_keeps_the_loops_derivative",
    "tests/test_issue18_i.py::test_exec_of_a_program_compiles_it_like_compile_then_exec[uneven_constraint]",
    "tests/test_issue18_i.py::test_exec_of_a_program_compiles_it_like_compile_then_exec[shard_map]",
    "tests/test_issue18_i.py::test_x64_executable_run_without_x64_is_one_clear_line",
    "tests/test_issue18_l.py::test_opt_list_passes_refuses_other_arguments",
    "tests/test_cli_outputs.py::test_user_prints_do_not_corrupt_stdout_results",
    *(f"tests/test_roundtrip.py::test_trace_matches_jax_on_the_original[{name}]"
      for name in ("35_prng_dropout", "46_transformer_block", "44_hessian_program",
                   "49_shard_map_normalize", "45_mlp_classifier", "07_gather_indexing",
                   "38_half_precision", "53_uint8_image", "37_int8_int16_quantize")),
    *(f"tests/test_roundtrip.py::test_from_jaxpr_to_jaxpr_round_trip[{name}]"
      for name in ("49_shard_map_normalize", "44_hessian_program", "35_prng_dropout")),
    "tests/test_implicit_diff_h.py::test_nested_fixed_points_are_both_rewritten_and_keep_the_gradient",
    "tests/test_implicit_diff_h.py::test_residual_loops_keep_second_derivatives[residual_norm_in_cond]",
    "tests/test_implicit_diff.py::test_forward_mode_with_vjp_to_jvp",
    "tests/test_implicit_diff.py::test_newton_sqrt_with_counter_and_statistics",
    "tests/test_implicit_diff_i.py::test_loops_of_a_custom_vjp_rule_are_left_alone_and_forward_mode_still_works",
    "tests/test_implicit_diff_certificate.py::test_a_deeply_converged_loop_uses_the_implicit_derivative",
    "tests/test_implicit_diff_certificate.py::test_scalar_loops_keep_their_derivative[slow_component_at_its_fixed_point]",
    "tests/test_implicit_diff_certificate.py::test_scalar_loops_keep_their_derivative[components_of_different_scales]",
    "tests/test_implicit_diff_certificate.py::test_a_start_the_parameter_moves_keeps_its_term_with_every_adjoint[dense]",
    "tests/test_implicit_diff_certificate.py::test_the_rate_estimate_sees_a_slow_mode_a_structured_vector_misses",
    "tests/test_implicit_diff_convergence.py::test_half_precision_fixed_point[float16]",
    "tests/test_implicit_diff_convergence.py::test_mixed_float32_float64_state[bicgstab]",
    "tests/test_implicit_diff_convergence.py::test_grad_when_a_state_update_reads_no_parameter[dense]",
    "tests/test_implicit_diff_convergence.py::test_loop_that_did_not_reach_a_fixed_point_keeps_jax_derivative[capped_divergent]",
    "tests/test_implicit_diff_convergence.py::test_convergent_fixed_points_keep_every_derivative[previous_carry]",
    "tests/test_implicit_diff_convergence.py::test_too_many_parameters_for_the_fallback_give_nan_not_a_wrong_number",
    "tests/test_implicit_diff_convergence.py::test_scalar_fixed_point_to_third_order[0.7]",
    "tests/test_implicit_diff_convergence.py::test_converged_loop_with_cap_is_implicit",
    # the slowest cases of families whose other cases stay in the default run
    "tests/test_fixed_point_orders.py::test_derivatives_match_the_unrolled_iteration"
    "[closed_over_parameter-trace]",
    "tests/test_fixed_point_orders.py::test_third_derivative_wrt_a_closed_over_parameter_in_"
    "forward_mode_too[grad_jacfwd_grad]",
    "tests/test_implicit_diff_certificate.py::test_a_start_the_parameter_moves_keeps_its_term_"
    "with_every_adjoint[gmres]",
    "tests/test_transposed_solve_tolerances.py::test_jacfwd_through_a_gmres_adjoint_equals_jax_"
    "reverse_mode",
    "tests/test_closure_adversary_f.py::test_staged_symbolic_zero_vjp_under_vmap[first]",
    "tests/test_closure_adversary_f.py::test_staged_symbolic_zero_vjp_under_vmap[second]",
    "tests/test_implicit_diff_adversary_f.py::test_a_path_far_from_the_fixed_points_"
    "linearization_keeps_its_derivative[curved_path-1.0]",
    "tests/test_implicit_diff_convergence.py::test_positive_scaling_and_squared_norm_are_still_"
    "sizes",
    "tests/test_issue18_h.py::test_device_executable_loaded_where_its_device_is_missing_is_one_line",
    *(f"tests/test_roundtrip.py::test_trace_matches_jax_on_the_original[{name}]"
      for name in ("17_lstm_pytree_carry", "10_reductions", "12_switch_three_branches",
                   "04_einsum_attention", "03_batched_matmul")),
}


def _is_heavy(nodeid: str) -> bool:
    path, _, name = nodeid.partition("::")
    function = name.split("[", 1)[0]
    return path in HEAVY or f"{path}::{function}" in HEAVY or nodeid in HEAVY


def pytest_collection_modifyitems(config, items):
    import pytest
    for item in items:
        if _is_heavy(item.nodeid):
            item.add_marker(pytest.mark.heavy)
