"""The instruction table is consistent, and the generated ISA reference in docs/ is current."""

from __future__ import annotations

from pathlib import Path

from tensorgen.mc import isa
from tensorgen.mc.doc import isa_markdown

ROOT = Path(__file__).parents[2]


def test_isa_doc_is_generated_from_the_definitions() -> None:
    assert (ROOT / "docs" / "isa.md").read_text() == isa_markdown(), (
        "run: tensorgen isa-doc > docs/isa.md"
    )


def test_every_instruction_fits_one_word_and_has_unique_opcode() -> None:
    assert len({d.opcode for d in isa.INSTRUCTIONS}) == len(isa.INSTRUCTIONS)
    for d in isa.INSTRUCTIONS:
        assert isa.HEADER.size + d.struct.size <= isa.WORD_BYTES
        assert d.queue is None or d.cost is not None
