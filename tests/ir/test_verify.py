"""The IR verifier refuses a malformed program in each way it checks, in one line naming the
statement or tensor; every program the loader builds passes it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tensorgen.errors import IRError
from tensorgen.ir.core import Access, Affine, BinOp, Call, Const, Read, Tensor
from tensorgen.ir.verify import verify_program
from tensorgen.spec.loader import load_program

ROOT = Path(__file__).resolve().parents[2]
MATMUL = load_program(ROOT / "examples" / "matmul_odd.yaml")
S0 = MATMUL.statements[0]


def with_stmt(**changes):
    return dataclasses.replace(MATMUL, statements=(dataclasses.replace(S0, **changes),))


def with_tensor(which: str, **changes):
    tensors = tuple(
        dataclasses.replace(t, **changes) if t.name == which else t for t in MATMUL.tensors
    )
    return dataclasses.replace(MATMUL, tensors=tensors)


def at(tensor: str, *subs: Affine) -> Access:
    return Access(tensor, subs)


II, JJ, KK = (Affine.of({n: 1}) for n in "ijk")

CASES = {
    "duplicate tensor": (
        dataclasses.replace(MATMUL, tensors=(*MATMUL.tensors, MATMUL.tensors[0])),
        r"^program matmul_odd: tensor A is declared twice$",
    ),
    "isl keyword as a name": (with_tensor("A", name="max"), r"tensor 'max' is a word isl reserves"),
    "unknown dtype": (with_tensor("C", dtype="int16"), r"tensor C has dtype 'int16'"),
    "zero extent": (with_tensor("B", shape=(37, 0)), r"tensor B has shape \[37, 0\]"),
    "pad outside the dtype": (
        with_tensor("A", pad=300),
        r"tensor A: pad value 300 does not fit int8",
    ),
    "unknown role": (with_tensor("A", role="weights"), r"tensor A has role 'weights'"),
    "duplicate index": (
        with_stmt(indices=("i", "i", "k")),
        r"statement S0 .*: index i is declared twice",
    ),
    "bounds of another length": (with_stmt(bounds=((0, 99), (0, 52))), r"statement S0 .*: bounds"),
    "empty bounds": (with_stmt(bounds=((0, 99), (5, 4), (0, 36))), r"statement S0 .*: bounds"),
    "unknown operator": (with_stmt(op="*="), r"operator '\*=' \(expected one of =, \+=, max=\)"),
    "unknown tensor": (
        with_stmt(lhs=at("D", II, JJ)),
        r"statement S0 .*: D\[i, j\] names no tensor",
    ),
    "wrong rank": (with_stmt(lhs=at("C", II)), r"C\[i\] has 1 subscripts, C rank 2"),
    "foreign index": (
        with_stmt(rhs=Read(at("A", II, Affine.of({"m": 1})))),
        r"A\[i, m\] uses m, not an index of the statement",
    ),
    "write outside the tensor": (
        with_stmt(lhs=at("C", Affine.of({"i": 1}, 1), JJ)),
        r"statement S0 .*: writes C\[i \+ 1, j\] outside C's shape \[100, 53\]",
    ),
    "write to an input": (with_stmt(lhs=at("A", II, KK)), r"statement S0 .*: writes A, an input"),
    "unknown function": (with_stmt(rhs=Call("sqrt", (Read(at("A", II, KK)),))), r"sqrt\(\) with 1"),
    "wrong arity": (with_stmt(rhs=Call("relu", ())), r"relu\(\) with 0 argument\(s\)"),
    "non-constant scale": (
        with_stmt(rhs=Call("requant", (Read(at("A", II, KK)), Read(at("B", KK, JJ)), Const(0)))),
        r"requant\(\) needs constants in place of B\[k, j\], 0",
    ),
    "unknown binary operator": (
        with_stmt(rhs=BinOp("/", Read(at("A", II, KK)), Const(2))),
        r"operator '/'",
    ),
    "non-finite constant": (with_stmt(rhs=Const(float("nan"))), r"constant nan is not finite"),
    "read of nothing": (
        dataclasses.replace(
            MATMUL,
            tensors=(*MATMUL.tensors, Tensor("T", (37, 53), "int8")),
            statements=(dataclasses.replace(S0, rhs=Read(at("T", KK, JJ))),),
        ),
        r"^statement S0: reads T, which nothing writes$",
    ),
    "output never written": (
        dataclasses.replace(
            MATMUL, tensors=(*MATMUL.tensors, Tensor("E", (2,), "int32", "output"))
        ),
        r"output E is never written",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_program_is_refused_in_one_line(case):
    program, match = CASES[case]
    with pytest.raises(IRError, match=match) as err:
        verify_program(program)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_is_well_formed(path):
    program = load_program(path)
    assert verify_program(program) is program
