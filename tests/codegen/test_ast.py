"""isl's AST of a schedule, built without its constant dimensions, is the AST of the whole one."""

from __future__ import annotations

from pathlib import Path

import islpy as isl
import pytest

from tensorgen.codegen.lowering import walk
from tensorgen.driver import compile_auto, compile_default
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

EXAMPLES = Path(__file__).parents[2] / "examples"


def _whole_ast(schedule: isl.UnionMap, stage_dims: tuple[int, ...], piece_maps: dict):
    """The AST as isl builds it from every dimension of `schedule` (the lowering before it
    dropped the constant ones), and the points of each statement it runs, in order."""
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    if stage_dims:
        n = schedule.get_map_list().get_at(0).dim(isl.dim_type.out)
        dims = ", ".join(f"d{i}" for i in range(n))
        build = build.set_options(
            isl.UnionMap("{ " + "; ".join(f"[{dims}] -> separate[{p}]" for p in stage_dims) + " }")
        )
    points = []

    def note(node, build):
        executed = build.get_schedule().get_map_list().get_at(0)
        name = executed.get_tuple_name(isl.dim_type.in_)
        points.append(piece_maps[name].intersect_domain(executed.domain()).range())
        return node

    build, handle = build.set_at_each_domain(note)
    ast = build.node_from_schedule_map(schedule)
    del handle
    return ast, points


@pytest.mark.parametrize(
    ("example", "target", "auto"),
    [
        ("conv3x3_resnet18.yaml", "tg1", True),
        ("conv3x3_stride2.yaml", "tg1", True),
        ("depthwise3x3.yaml", "tg1", True),
        ("matmul_odd.yaml", "tiny", True),
        ("rnn_cell.yaml", "tiny", False),
        ("jacobi1d.yaml", "tiny", False),
    ],
)
def test_the_ast_without_constant_dimensions_is_the_whole_schedules(
    example: str, target: str, auto: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    build = walk._ast

    def recorded(schedule, stage_dims, piece_maps):
        ast, points = build(schedule, stage_dims, piece_maps)
        seen.append((schedule, stage_dims, piece_maps, ast, points))
        return ast, points

    monkeypatch.setattr(walk, "_ast", recorded)
    monkeypatch.setattr(walk, "_ASTS", {})  # built here, not found from another test
    program = load_program(EXAMPLES / example)
    tgt = load_target(target)
    if auto:
        compile_auto(program, tgt)
    else:
        compile_default(program, tgt)
    assert seen
    dropped = 0
    for schedule, stage_dims, piece_maps, ast, points in seen:
        want, want_points = _whole_ast(schedule, stage_dims, piece_maps)
        assert ast.to_C_str() == want.to_C_str()
        assert [str(p) for p in points] == [str(p) for p in want_points]
        n = schedule.get_map_list().get_at(0).dim(isl.dim_type.out)
        dropped += n - len(walk._without_constant_dims(schedule, stage_dims)[1])
    if auto:
        assert dropped  # the searched schedules have constant dimensions: the test tests them


def test_a_dimension_constant_in_one_statement_only_is_kept() -> None:
    # d0 orders S before T (0, then 1): a different constant per statement is a sequence
    schedule = isl.UnionMap("{ S[i] -> [0, i, 5] : 0 <= i < 4; T[i] -> [1, i, 5] : 0 <= i < 4 }")
    dropped, kept = walk._without_constant_dims(schedule, ())
    assert kept == (0, 1)
    assert walk._without_constant_dims(schedule, (2,))[1] == (0, 1, 2)
    assert dropped.get_map_list().get_at(0).dim(isl.dim_type.out) == 2
