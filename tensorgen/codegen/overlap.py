"""Overlapping a model's units at link time: on-chip relocation and the boundary between units.

Each unit (a layer, or a fused group) is compiled alone, its scratchpad and accumulator buffers
from address 0 up, and its tokens balanced within it. Two units in a row whose on-chip
footprints fit a memory together are placed in disjoint regions (alternately at the bottom and
at the top of each memory, by rewriting the bases of their views), and the boundary between
them is then weaker than a full barrier:

- the next unit's loads may start once the previous unit's loads are issued -- its weights,
  and activations the previous unit does not store -- up to its first load that waits for a
  token, reads DRAM that the previous unit stores, or sits in a loop (`early_loads`);
- there its loads wait for the previous unit's EX and ST queues to finish (so the unit after
  it, placed where the previous one was, never touches memory the previous one still uses);
- its EX queue waits for the previous unit's stores; ST is in order anyway.

Two token edits make room for the early loads (`early_loads`, `_without_drains`): the SYNCs a
unit ends with on LD that only drain tokens move past the next unit's early loads, and the
initial credits the next unit's EX gives its LD (SYNCs before any of its EX work, which in a
unit compiled alone say only that its buffers start free) are dropped with the waits they
satisfy, when those are the first waits, outside loops. Where a pair does not fit, the full
`barrier` stays. The simulator's hazard check guards the whole: two queues touching one range,
one of them writing, with no token ordering them, is an error.
"""

from __future__ import annotations

from collections.abc import Callable

from tensorgen.mc import isa
from tensorgen.mc.operands import ITEMSIZE, MEMORIES, View

SEQUENCER = ("LOOP", "LOOPB", "IF")
ALIGN = 64  # a relocated unit's views move by a multiple of this


def footprint(
    code: tuple[isa.Instruction, ...] | list[isa.Instruction],
) -> dict[str, tuple[int, int]]:
    """Per on-chip memory, the bytes [lo, hi) every view of `code` may touch: the loop counters
    over their ranges (intervals for LOOPB bounds, IF bodies as if taken), an over-approximation
    where the iterations are not a box, so never too small."""
    spans: dict[str, tuple[int, int]] = {}
    stack: list[tuple[int, tuple[tuple[int, int], ...]]] = [(len(code), ())]
    for pc, ins in enumerate(code):
        while stack[-1][0] <= pc:
            stack.pop()
        ranges = stack[-1][1]
        if ins.mnemonic in SEQUENCER:
            inner = ranges
            if ins.mnemonic == "LOOP":
                inner = ranges + ((0, max(ins.arg("count") - 1, 0)),)
            elif ins.mnemonic == "LOOPB":
                lo = max(_range(a, ranges)[0] // d for a, d in ins.arg("lower").terms)
                hi = min(_range(a, ranges)[1] // d for a, d in ins.arg("upper").terms)
                inner = ranges + ((lo, max(lo, hi)),)
            stack.append((pc + 1 + ins.arg("body"), inner))
            continue
        for _, v in ins.args:
            if isinstance(v, View):
                isz = ITEMSIZE[v.dtype]
                base_lo, base_hi = _range(v.base, ranges)
                ext = [(n - 1) * s * isz for n, s in zip(v.shape, v.strides, strict=True)]
                lo = base_lo + sum(min(0, e) for e in ext)
                hi = base_hi + sum(max(0, e) for e in ext) + isz
                old = spans.get(v.mem, (lo, hi))
                spans[v.mem] = (min(old[0], lo), max(old[1], hi))
    return spans


def place(
    footprints: list[dict[str, tuple[int, int]]], onchip: dict[str, int] | None
) -> tuple[list[dict[str, int]], list[frozenset[str]]]:
    """For each unit, the byte offset its views move by in each memory, and for each boundary
    the memories in which the units on either side of it are kept apart: those in which, the
    later one at the other end of the memory than the earlier one, their regions are disjoint.
    A boundary overlaps when the scratchpad is one of them (`overlaps`). `onchip` (each
    memory's size) None: no unit overlaps, none moves."""
    shifts: list[dict[str, int]] = [dict.fromkeys(MEMORIES, 0) for _ in footprints]
    apart: list[frozenset[str]] = []
    for i in range(1, len(footprints)):
        kept = set()
        for mem in MEMORIES if onchip is not None else ():
            mine, prev = footprints[i].get(mem), footprints[i - 1].get(mem)
            if mine is None or prev is None:
                kept.add(mem)  # one of the two does not use this memory: apart already
                continue
            plo, phi = prev[0] + shifts[i - 1][mem], prev[1] + shifts[i - 1][mem]
            at = (onchip[mem] - mine[1]) // ALIGN * ALIGN if shifts[i - 1][mem] == 0 else 0
            lo, hi = mine[0] + at, mine[1] + at
            if lo >= 0 and hi <= onchip[mem] and (hi <= plo or phi <= lo):
                kept.add(mem)
                shifts[i][mem] = at
        if "spad" not in kept:
            kept = set()
            shifts[i] = dict.fromkeys(MEMORIES, 0)
        apart.append(frozenset(kept))
    return shifts, apart


def overlaps(apart: frozenset[str]) -> bool:
    """Whether a boundary whose units are kept apart in memories `apart` overlaps them."""
    return "spad" in apart


def relocate(code: list[isa.Instruction], shift: dict[str, int]) -> list[isa.Instruction]:
    """`code` with every view of memory m moved up by shift[m] bytes (the same list if none)."""
    if not any(shift.values()):
        return code
    out = []
    for ins in code:
        if any(isinstance(v, View) and shift.get(v.mem) for _, v in ins.args):
            args = tuple(
                (k, _moved(v, shift[v.mem]) if isinstance(v, View) else v) for k, v in ins.args
            )
            ins = isa.Instruction(ins.mnemonic, args, ins.wait, ins.signal)
        out.append(ins)
    return out


def barrier() -> list[isa.Instruction]:
    """SYNCs after which every queue's next instruction starts after every queue's last one."""
    return [
        _sync("LD", signal={"EX"}),
        _sync("ST", signal={"EX"}),
        _sync("EX", wait={"LD", "ST"}, signal={"LD", "ST"}),
        _sync("LD", wait={"EX"}),
        _sync("ST", wait={"EX"}),
    ]


def handover() -> list[isa.Instruction]:
    """What an overlapped boundary puts between two units: the previous unit's end on EX and ST
    signalled to LD (awaited where the next unit's early loads end, `early_loads`), and the next
    unit's EX after the previous unit's stores."""
    return [
        _sync("EX", signal={"LD"}),
        _sync("ST", signal={"LD", "EX"}),
        _sync("EX", wait={"ST"}),
    ]


def without_drains(
    code: list[isa.Instruction],
) -> tuple[list[isa.Instruction], list[isa.Instruction]]:
    """`code` without the SYNCs on LD that end it and only wait (for the tokens its last
    buffers' releases signal), and those SYNCs: the next unit's early loads need not wait for
    them, and `early_loads` puts them back after those."""
    drains: list[int] = []
    for pc in reversed(_top_level(code)):
        ins = code[pc]
        if ins.mnemonic in SEQUENCER:
            break
        if ins.queue != "LD":
            continue
        if ins.mnemonic != "SYNC" or not ins.wait or ins.signal:
            break
        drains.append(pc)
    taken = set(drains)
    return [ins for pc, ins in enumerate(code) if pc not in taken], [
        code[pc] for pc in sorted(drains)
    ]


def early_loads(
    code: list[isa.Instruction],
    drains: list[isa.Instruction],
    reads_stored: Callable[[isa.Instruction], bool],
    apart: frozenset[str],
) -> tuple[list[isa.Instruction], int]:
    """The next unit's `code` with its early loads: its leading top-level LD instructions up to
    the first that waits for a token, is a LOAD that `reads_stored` (DRAM the previous unit
    stores) or that writes a memory the two units share (not in `apart`), or is a loop or IF
    with LD work inside; there (the cut) the previous unit's `drains` and a wait for its end
    (`handover`'s tokens) go. Past the cut, up to the next such wait or loop, the LOADs that
    could have been early are hoisted before it too, when their destination meets none of the
    LOADs they pass (their signals stay where they were, on SYNCs). Its initial credits from EX
    to LD are dropped with the waits they meet, when those come first (`_credits`). Returns the
    code and how many LOADs are early."""
    code = list(code)
    credits = _credits(code)
    met = 0
    cut = None  # the first LD instruction that may not start early
    hoisted: list[isa.Instruction] = []
    passed: list[tuple[str, int, int]] = []  # destinations of the LOADs hoisted ones pass
    for pc in _top_level(code):
        ins = code[pc]
        if ins.mnemonic in SEQUENCER:
            body = code[pc + 1 : pc + 1 + ins.arg("body")]
            if any(b.mnemonic not in SEQUENCER and b.queue == "LD" for b in body):
                cut = pc if cut is None else cut
                break
            continue
        if ins.queue != "LD":
            continue
        if "EX" in ins.wait and met < len(credits) and credits[met] < pc:
            credit = code[credits[met]]
            code[credits[met]] = credit.with_tokens(signal=credit.signal - {"LD"})
            code[pc] = ins = ins.with_tokens(wait=ins.wait - {"EX"})
            met += 1
        if ins.wait:
            cut = pc if cut is None else cut
            break
        if ins.mnemonic != "LOAD":
            continue
        span = _span(ins.arg("dst"))
        late = reads_stored(ins) or span[0] not in apart
        if cut is None and not late:
            continue  # early where it is
        cut = pc if cut is None else cut
        if late or any(m == span[0] and lo < span[2] and span[1] < hi for m, lo, hi in passed):
            passed.append(span)
            continue
        hoisted.append(ins.with_tokens(signal=()))
        code[pc] = _sync("LD", signal=ins.signal) if ins.signal else None
    cut = len(code) if cut is None else cut
    early = sum(
        ins is not None and ins.mnemonic == "LOAD" and ins.queue == "LD" for ins in code[:cut]
    )
    code[cut:cut] = [*hoisted, *drains, _sync("LD", wait={"EX", "ST"})]
    return [ins for ins in code if ins is not None], early + len(hoisted)


def _credits(code: list[isa.Instruction]) -> list[int]:
    """The SYNCs with which a unit's EX signals its LD before it does anything, having waited
    (if at all) only for its own loads: in a unit compiled alone they say only that its buffers
    start free, which a unit placed apart from the one before it may take for granted."""
    out = []
    for pc in _top_level(code):
        ins = code[pc]
        if ins.mnemonic in SEQUENCER:
            break
        if ins.queue != "EX":
            continue
        if ins.mnemonic != "SYNC" or ins.wait - {"LD"}:
            break
        if "LD" in ins.signal:
            out.append(pc)
    return out


def _span(v: View) -> tuple[str, int, int]:
    """The memory and the bytes [lo, hi) a view outside every loop touches."""
    isz = ITEMSIZE[v.dtype]
    ext = [(n - 1) * s * isz for n, s in zip(v.shape, v.strides, strict=True)]
    lo = v.base.const + sum(min(0, e) for e in ext)
    return v.mem, lo, v.base.const + sum(max(0, e) for e in ext) + isz


def _top_level(code: list[isa.Instruction]) -> list[int]:
    """The indices of the instructions outside every loop and IF body."""
    out, pc = [], 0
    while pc < len(code):
        out.append(pc)
        pc += 1 + (code[pc].arg("body") if code[pc].mnemonic in SEQUENCER else 0)
    return out


def _sync(queue: str, wait=(), signal=()) -> isa.Instruction:
    return isa.make("SYNC", queue=isa.QUEUES.index(queue)).with_tokens(wait, signal)


def _moved(v: View, by: int) -> View:
    return View(v.mem, v.dtype, v.base + by, v.shape, v.strides) if by else v


def _range(a, ranges: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    lo = hi = a.const
    for c, (rlo, rhi) in zip(a.coefs, ranges, strict=False):
        lo += min(c * rlo, c * rhi)
        hi += max(c * rlo, c * rhi)
    return lo, hi
