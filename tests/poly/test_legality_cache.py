"""find_violation remembers legal schedules by the program's structure (statement domains and
dependences), not its identity: renamed layers share verdicts, different structures never do."""

from __future__ import annotations

import islpy as isl

from tensorgen.poly import legality
from tensorgen.spec.loader import parse_program

CHAIN = """tensorgen: 1
tensors:
  A: {shape: [8], dtype: int8, role: input}
  B: {shape: [8], dtype: int8}
  C: {shape: [8], dtype: int8, role: output}
statements:
  - B[i] = A[i]
  - C[i] = B[i]
"""

# S1 before S0: breaks CHAIN's flow dependence, legal where S1 does not read B
BACKWARDS = isl.UnionMap("{ S0[i] -> [1, i] : 0 <= i < 8; S1[i] -> [0, i] : 0 <= i < 8 }")


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = legality._find_violation

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(legality, "_find_violation", counted)
    monkeypatch.setattr(legality, "_LEGAL", {})
    return calls


def test_a_renamed_program_reuses_the_legal_verdict(monkeypatch) -> None:
    calls = _counting(monkeypatch)
    free = parse_program(CHAIN.replace("C[i] = B[i]", "C[i] = A[i]"))
    renamed = parse_program(CHAIN.replace("C[i] = B[i]", "C[i] = A[i]").replace("C", "D"))
    assert legality.find_violation(free, BACKWARDS) is None
    assert legality.find_violation(renamed, BACKWARDS) is None
    assert len(calls) == 1


def test_a_different_structure_is_checked_again(monkeypatch) -> None:
    calls = _counting(monkeypatch)
    free = parse_program(CHAIN.replace("C[i] = B[i]", "C[i] = A[i]"))
    chain = parse_program(CHAIN)
    assert legality.find_violation(free, BACKWARDS) is None
    viol = legality.find_violation(chain, BACKWARDS)
    assert viol is not None and viol.kind == "flow"
    assert legality.find_violation(chain, BACKWARDS) is not None  # violations are not remembered
    assert len(calls) == 3


def test_dependences_are_shared_by_structure_not_constants(monkeypatch) -> None:
    """Layers that differ only in the constants of their statements (a requantization's scale)
    get the same dependences, worked out once; another access gets its own."""
    monkeypatch.setattr(legality, "_RELAXED", {})
    one = parse_program(CHAIN.replace("C[i] = B[i]", "C[i] = B[i] + 1"))
    two = parse_program(CHAIN.replace("C[i] = B[i]", "C[i] = B[i] + 7"))
    other = parse_program(CHAIN.replace("C[i] = B[i]", "C[i] = A[i] + 1"))
    assert legality.relaxed_dependences(one) is legality.relaxed_dependences(two)
    deps = dict(legality.relaxed_dependences(one))
    assert not deps["flow"].is_empty()  # S1 reads what S0 writes
    assert dict(legality.relaxed_dependences(other))["flow"].is_empty()
    assert len(legality._RELAXED) == 2
