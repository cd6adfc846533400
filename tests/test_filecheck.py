"""FileCheck directives: matching rules, captures, CHECK-NOT ranges, labels, errors.

Inputs are small hand-written texts (so every expected outcome is evident from the
text itself) plus the printed IR of real traced functions, where the same checks
must hold through a renumbering of the values.
"""
from __future__ import annotations

import dataclasses
import textwrap

import jax.numpy as jnp
import pytest

import jaxpr_cc
from jaxpr_cc.golden.filecheck import (FileCheckFailure, FileCheckSyntaxError, filecheck,
                                       parse_directives)
from jaxpr_cc.golden.program_checks import parse_program_checks, run_program_checks
from jaxpr_cc.passes.base import Pass, register_pass

IR = textwrap.dedent("""\
    func @f(%x:f32[3], %y:f32[3]) -> (f32[3]) {
      %0:f32[3] = sin[accuracy=None] %x
      %1:f32[3] = mul[out_dtype=None] %0, %y
      %2:f32[3] = add %1, %0
      %3:f32[3] = cos[accuracy=None] %2
      return %3
    }
    func @g(%a:i32[]) -> (i32[]) {
      %0:i32[] = mul %a, %a
      %1:i32[] = neg %0
      return %1
    }
    """)


def checks(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def fails(check_text: str, text: str = IR) -> str:
    with pytest.raises(FileCheckFailure) as info:
        filecheck(check_text, text, path="t.checks")
    return str(info.value)


# ------------------------------------------------------------------ basic order
def test_checks_match_in_order():
    filecheck(checks("# CHECK: sin", "# CHECK: mul", "# CHECK: cos", "# CHECK: return"), IR)


def test_check_out_of_order_fails():
    message = fails(checks("# CHECK: cos", "# CHECK: sin[accuracy=None] %x"))
    assert "t.checks:2: error: CHECK: expected string not found in input" in message


def test_check_continues_after_the_previous_match_on_the_same_line():
    filecheck(checks("CHECK: mul", "CHECK: %0, %y"), IR)
    fails(checks("CHECK: %y", "CHECK: mul[out_dtype"), "%1 = mul[out_dtype=None] %0, %y\n")


def test_comment_markers_are_optional():
    filecheck(checks("CHECK: sin", "// CHECK: mul", "; CHECK: add", "   # CHECK: cos"), IR)


def test_pattern_text_is_literal():
    # brackets, dots, parentheses, stars: no regex meaning outside {{ }}
    filecheck(checks("CHECK: f32[3] = sin[accuracy=None] %x"), IR)
    filecheck(checks("CHECK: func @f(%x:f32[3], %y:f32[3]) -> (f32[3])"), IR)
    fails(checks("CHECK: s.n"))
    fails(checks("CHECK: f32[.]"))


def test_blank_runs_match_any_blank_run():
    filecheck(checks("CHECK: add    %1,    %0"), IR)
    filecheck(checks("CHECK: a b"), "a \t  b\n")
    fails(checks("CHECK: a b"), "ab\n")


def test_regex_blocks():
    filecheck(checks("CHECK: {{%[0-9]+}}:f32[3] = {{(sin|cos)}}[accuracy=None] %x"), IR)
    fails(checks("CHECK: {{^}}sin"))  # sin is indented: the line does not start with it


# ------------------------------------------------------------------ NEXT / SAME
def test_check_next_holds_on_the_following_line():
    filecheck(checks("CHECK: sin", "CHECK-NEXT: mul", "CHECK-NEXT: add"), IR)


def test_check_next_fails_on_a_later_line_and_says_where_it_was_found():
    message = fails(checks("CHECK: sin", "CHECK-NEXT: add"))
    assert "t.checks:2: error: CHECK-NEXT: is not on the line after the previous match" in message
    assert "2 lines after it, at line 4" in message
    assert "input line 2" in message  # the previous match


def test_check_next_fails_on_the_same_line():
    message = fails(checks("CHECK: mul", "CHECK-NEXT: %y"))
    assert "found on the same line as it" in message


def test_check_same():
    filecheck(checks("CHECK: mul", "CHECK-SAME: %0", "CHECK-SAME: %y"), IR)
    message = fails(checks("CHECK: mul", "CHECK-SAME: add"))
    assert "is not on the same line as the previous match (found at line 4)" in message


def test_next_and_same_need_a_previous_match():
    with pytest.raises(FileCheckSyntaxError, match=r"t.checks:1: CHECK-NEXT: has no previous match"):
        filecheck(checks("CHECK-NEXT: sin"), IR, path="t.checks")
    with pytest.raises(FileCheckSyntaxError, match=r"t.checks:2: CHECK-SAME: has no previous"):
        filecheck(checks("CHECK-NOT: tanh", "CHECK-SAME: sin"), IR, path="t.checks")


# ------------------------------------------------------------------ NOT
def test_check_not_between_two_matches():
    # `mul` lies between sin and cos; `tanh` appears nowhere
    filecheck(checks("CHECK: sin", "CHECK-NOT: tanh", "CHECK: cos"), IR)
    message = fails(checks("CHECK: sin", "CHECK-NOT: mul", "CHECK: cos"))
    assert "t.checks:2: error: CHECK-NOT: excluded string found in input" in message
    assert "> 3 |   %1:f32[3] = mul[out_dtype=None] %0, %y" in message


def test_check_not_only_covers_the_range_between_its_neighbours():
    # `sin` occurs before the range and `neg` after it: neither is excluded
    filecheck(checks("CHECK: mul", "CHECK-NOT: sin", "CHECK-NOT: neg", "CHECK: cos"), IR)


def test_check_not_at_the_end_covers_the_rest_of_the_input():
    filecheck(checks("CHECK: neg", "CHECK-NOT: mul"), IR)
    fails(checks("CHECK: cos", "CHECK-NOT: neg"))


def test_check_not_at_the_start_covers_the_input_up_to_the_first_match():
    filecheck(checks("CHECK-NOT: neg", "CHECK: cos"), IR)
    fails(checks("CHECK-NOT: sin", "CHECK: cos"))


def test_check_not_uses_captured_variables():
    filecheck(checks("CHECK: [[S:%[0-9]+]]:f32[3] = sin", "CHECK: mul", "CHECK-NOT: [[S]], %y",
                     "CHECK: return"),
              "%0:f32[3] = sin %x\n%1 = mul %2, %y\nreturn %1\n")
    fails(checks("CHECK: [[S:%[0-9]+]]:f32[3] = sin", "CHECK-NOT: [[S]], %y", "CHECK: return"),
          "%0:f32[3] = sin %x\n%1 = mul %0, %y\nreturn %1\n")


# ------------------------------------------------------------------ LABEL
def test_labels_split_the_input_into_blocks():
    filecheck(checks("CHECK-LABEL: func @f(", "CHECK: sin", "CHECK-NOT: neg",
                     "CHECK-LABEL: func @g(", "CHECK: neg"), IR)


def test_a_check_cannot_match_past_the_next_label():
    # `neg` exists only in @g: searching for it inside @f's block must fail
    message = fails(checks("CHECK-LABEL: func @f(", "CHECK: neg", "CHECK-LABEL: func @g("))
    assert "t.checks:2: error: CHECK: expected string not found" in message


def test_check_not_is_bounded_by_the_block():
    # `mul` occurs in @g too; after the last check of @f only @f's rest is searched
    filecheck(checks("CHECK-LABEL: func @f(", "CHECK: add", "CHECK-NOT: mul",
                     "CHECK-LABEL: func @g("), IR)
    fails(checks("CHECK-LABEL: func @f(", "CHECK: cos", "CHECK-NOT: return",
                 "CHECK-LABEL: func @g("))


def test_missing_label_fails():
    message = fails(checks("CHECK-LABEL: func @h("))
    assert "CHECK-LABEL: expected label not found in input" in message


def test_labels_match_in_order():
    fails(checks("CHECK-LABEL: func @g(", "CHECK-LABEL: func @f("))


def test_next_after_a_label_refers_to_the_label_line():
    filecheck(checks("CHECK-LABEL: func @g(", "CHECK-NEXT: mul %a, %a"), IR)


# ------------------------------------------------------------------ captures
def test_captures_survive_renumbering():
    pattern = checks("CHECK: [[S:%[0-9]+]]:f32[3] = sin[accuracy=None] %x",
                     "CHECK-NEXT: [[M:%[0-9]+]]:f32[3] = mul[out_dtype=None] [[S]], %y",
                     "CHECK-NEXT: = add [[M]], [[S]]")
    filecheck(pattern, IR)
    renumbered = IR.replace("%3", "%13").replace("%2", "%12").replace("%1", "%11") \
                   .replace("%0", "%10")
    assert renumbered != IR
    filecheck(pattern, renumbered)
    # the same structure with the operands swapped does not match
    fails(pattern, IR.replace("add %1, %0", "add %0, %1"))


def test_capture_returns_the_variables():
    variables = filecheck(checks("CHECK: [[S:%[0-9]+]]:f32[3] = sin", "CHECK: [[C:%[0-9]+]]:f32[3] = cos"),
                          IR)
    assert variables == {"S": "%0", "C": "%3"}


def test_capture_and_use_in_one_pattern():
    filecheck(checks("CHECK: [[A:%[a-z]+]] = mul [[A]], [[A]]"), "%b = mul %a, %b\n%a = mul %a, %a\n")
    fails(checks("CHECK: [[A:%[a-z]+]] = mul [[A]], [[A]]"), "%b = mul %a, %b\n")


def test_redefinition_replaces_the_value():
    filecheck(checks("CHECK: [[V:%[0-9]+]]:f32[3] = sin", "CHECK: [[V:%[0-9]+]]:f32[3] = mul",
                     "CHECK: add [[V]], %0"), IR)


def test_capture_regex_may_contain_a_character_class():
    variables = filecheck(checks("CHECK: func @[[NAME:[a-z]+]]([[ARG:%[a-z0-9]+]]:i32[])"), IR)
    assert variables == {"NAME": "g", "ARG": "%a"}


def test_failure_message_shows_variable_values_and_closest_line():
    message = fails(checks("CHECK: [[S:%[0-9]+]]:f32[3] = sin", "CHECK: = add [[S]], %1"))
    assert "CHECK: = add [[S]], %1" in message
    assert "with [[S]] = '%0'" in message
    assert "closest match (input line 4" in message
    assert "%2:f32[3] = add %1, %0" in message


def test_failure_message_shows_the_input_around_the_search_start():
    message = fails(checks("CHECK: cos", "CHECK: tanh"))
    assert "input around line 5 (> where the search started):" in message
    lines = message.splitlines()
    context = [l for l in lines if " | " in l]
    # three lines either side of line 5, the search line marked
    assert [l.split("|")[0].split()[-1] for l in context] == ["2", "3", "4", "5", "6", "7", "8"]
    assert any(l.lstrip().startswith("> 5 |") for l in context)


# ------------------------------------------------------------------ syntax errors
@pytest.mark.parametrize("text, message", [
    ("CHECK:", r"x:1: CHECK: has an empty pattern"),
    ("CHECK-NXT: a", r"x:1: unknown directive CHECK-NXT:"),
    ("CHECK: {{[0-9]+", r"x:1: CHECK: '\{\{' is never closed"),
    ("CHECK: [[X:%[0-9]+", r"x:1: CHECK: '\[\[' is never closed"),
    ("CHECK: {{(}}", r"x:1: CHECK: invalid regex"),
    ("CHECK: [[X:(]]", r"x:1: CHECK: invalid regex"),
    ("CHECK: [[1X:%0]]", r"x:1: CHECK: bad variable name '1X'"),
    ("CHECK: [[X:]]", r"x:1: CHECK: \[\[X:\]\] needs a regex"),
    ("CHECK: a\nCHECK: [[Y]]", r"x:2: CHECK: uses variable \[\[Y\]\] before any directive defines"),
    ("CHECK-NOT: [[X:%0]]", r"x:1: CHECK-NOT: cannot define variables"),
    ("CHECK: [[X:%0]]\nCHECK-LABEL: [[X]]", r"x:2: CHECK-LABEL: cannot use variables"),
    ("CHECK-LABEL: [[X:%0]]", r"x:1: CHECK-LABEL: cannot define variables"),
])
def test_syntax_errors_name_the_line(text, message):
    with pytest.raises(FileCheckSyntaxError, match=message):
        parse_directives(text, path="x")


def test_no_directives_is_an_error():
    with pytest.raises(FileCheckSyntaxError, match="no CHECK: directives"):
        filecheck("nothing to see\n", IR)


def test_prefixes_select_directives():
    text = checks("TRACE: sin", "CHECK: neg", "TRACE-NEXT: mul")
    assert [d.kind for d in parse_directives(text, prefix="TRACE")] == ["TRACE", "TRACE-NEXT"]
    assert [d.kind for d in parse_directives(text)] == ["CHECK"]
    filecheck(text, IR, prefix="TRACE")
    with pytest.raises(FileCheckSyntaxError, match="check prefix"):
        parse_directives(text, prefix="9X")


# ------------------------------------------------------------------ RUN lines
PROGRAM = textwrap.dedent("""\
    import jax.numpy as jnp

    def fun(x):
        return jnp.sin(x) * jnp.sin(x)
    # RUN: --check-prefix=TRACE
    # TRACE: [[A:%[0-9]+]]:f32[3] = sin[accuracy=None] %x
    # TRACE-NEXT: [[B:%[0-9]+]]:f32[3] = sin[accuracy=None] %x
    # TRACE-NEXT: mul[out_dtype=None] [[A]], [[B]]
    # RUN: cse
    # CHECK: [[S:%[0-9]+]]:f32[3] = sin[accuracy=None] %x
    # CHECK-NOT: sin
    # CHECK: mul[out_dtype=None] [[S]], [[S]]
    """)


def _traced():
    return jaxpr_cc.trace(lambda x: jnp.sin(x) * jnp.sin(x), jnp.ones(3, jnp.float32))


def test_run_lines_name_pipelines_and_prefixes():
    parsed = parse_program_checks(PROGRAM, "p.py")
    assert [(c.run.pipeline, c.run.prefix, c.run.line) for c in parsed] == [
        ("", "TRACE", 5), ("cse", "CHECK", 9)]
    assert [d.kind for d in parsed[0].directives] == ["TRACE", "TRACE-NEXT", "TRACE-NEXT"]
    assert [d.kind for d in parsed[1].directives] == ["CHECK", "CHECK-NOT", "CHECK"]


def test_run_lines_check_the_traced_and_optimized_ir():
    program = _traced()
    assert run_program_checks(parse_program_checks(PROGRAM, "p.py"), program) == []
    # Without cse both sines survive and the product reads two values: the CSE
    # RUN line's checks fail on the dce output.
    no_cse = PROGRAM.replace("# RUN: cse", "# RUN: dce")
    failures = run_program_checks(parse_program_checks(no_cse, "p.py"), program)
    assert len(failures) == 1
    assert failures[0].startswith("p.py:9: RUN: dce\np.py:12: error: CHECK: expected string not "
                                  "found in input")
    # dropping the last positive check leaves the CHECK-NOT to catch the second sin
    only_not = no_cse.replace("# CHECK: mul[out_dtype=None] [[S]], [[S]]\n", "")
    failures = run_program_checks(parse_program_checks(only_not, "p.py"), program)
    assert len(failures) == 1
    assert failures[0].startswith("p.py:9: RUN: dce\np.py:11: error: CHECK-NOT: excluded string")


def test_run_line_errors():
    with pytest.raises(FileCheckSyntaxError, match=r"p.py:1: RUN: unknown pass 'nope'"):
        parse_program_checks("# RUN: nope\n# CHECK: x\n", "p.py")
    with pytest.raises(FileCheckSyntaxError, match=r"p.py:1: RUN: no CHECK: directives"):
        parse_program_checks("# RUN: cse\n", "p.py")
    with pytest.raises(FileCheckSyntaxError, match=r"p.py:2: CHECK: the file has no '# RUN"):
        parse_program_checks("x = 1\n# CHECK: x\n", "p.py")
    with pytest.raises(FileCheckSyntaxError, match=r"p.py:1: RUN: unknown option"):
        parse_program_checks("# RUN: cse --prefix=X\n# CHECK: x\n", "p.py")
    assert parse_program_checks("x = 1\n", "p.py") == []


@register_pass("test-filecheck-raises")
@dataclasses.dataclass(frozen=True)
class _Raises(Pass):
    def run(self, program, ctx):
        raise RuntimeError("this pass always fails")


def test_a_failing_pipeline_is_a_failed_check():
    failures = run_program_checks(
        parse_program_checks("# RUN: test-filecheck-raises\n# CHECK: x\n", "p.py"), _traced())
    assert failures == ["p.py:1: error: RUN: the pipeline failed: pass 'test-filecheck-raises' "
                        "failed: RuntimeError: this pass always fails"]
