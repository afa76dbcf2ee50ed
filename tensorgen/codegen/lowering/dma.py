"""DMA and guards: loads and stores of staged footprints at their origins, zero-fill,
and guarded pieces."""

from __future__ import annotations

from tensorgen.mc import isa
from tensorgen.mc.operands import Bound, Box, LoopAffine, View


class _DmaGuards:
    """Methods of the scheduled lowering (tensorgen.codegen.scheduled._Lowering), one pass."""

    def _stage_origin(
        self, tensor: str, env: dict[str, LoopAffine], node
    ) -> tuple[LoopAffine, ...]:
        """The origin of `tensor`'s box in the iteration of its staging loop that the AST `node`
        runs in: schedule dimensions that are not loops around it are constants there."""
        return tuple(
            self._dims_value(const, coefs, env, node)
            for const, coefs in self.loop_stages[tensor][4]
        )

    def _dims_value(
        self, const: int, coefs: dict[str, int], env: dict[str, LoopAffine], node
    ) -> LoopAffine:
        """const + sum(c * d<k>) over schedule dimensions, in the loops around the AST `node`."""
        value = LoopAffine.make(const)
        for name, c in coefs.items():
            k = int(name[1:])  # the schedule dimension d<k>
            if f"c{k}" in env:
                value = value + env[f"c{k}"].scale(c)
            else:
                value = value + self._dim_constant(node, k) * c
        return value

    def _guarded(self, pieces, env: dict[str, LoopAffine], node, body) -> None:
        """`body` under each piece (a conjunction of constraints >= 0 over schedule dimensions)
        that can hold around `node`: unguarded where the piece always holds there, in an IF
        otherwise."""
        for piece in pieces:
            terms = [self._dims_value(const, coefs, env, node) for const, coefs in piece]
            if any(not any(t.coefs) and t.const < 0 for t in terms):
                continue
            terms = [t for t in terms if any(t.coefs)]
            if not terms:
                body()
                continue
            with self.em.block("IF", cond=Bound(tuple((t, 1) for t in terms))):
                body()

    def _load(self, tensor: str, env: dict[str, LoopAffine], node, raw: bool = False) -> None:
        """Load a staged buffer (or zero it, if fresh); a buffer whose iterations that are the
        first to touch their box are known is zeroed in those and loaded in the others. `raw`:
        without tokens (in a double-buffered loop; loads only, the zeroing is on EX)."""
        first = self.first.get(tensor)
        load = (
            (lambda: self._dma_raw("LOAD", tensor)) if raw else (lambda: self._dma("LOAD", tensor))
        )
        if first is None:
            load()
            return
        if not raw and tensor not in self.no_fill:
            self._guarded(first.first, env, node, lambda: self._zero(tensor))
        self._guarded(first.rest, env, node, load)

    def _zero(self, tensor: str, raw: bool = False) -> None:
        mem, base, _, size = self.active[tensor]
        view = View(
            mem,
            self.program.tensor(tensor).dtype,
            LoopAffine.make(base),
            size,
            self._strides(tensor, size),
        )
        ins = isa.make("VFILL", dst=view, imm=0)
        if raw:
            self.em.code.append(ins)
        else:
            self.em.emit(ins)

    def _dma_raw(self, kind: str, tensor: str) -> None:
        """A DMA (or zero fill) appended without the serial token chain."""
        before = self.em.queue, len(self.em.code)
        self.em.queue = (
            {"LOAD": "LD", "STORE": "ST"}[kind]
            if not (kind == "LOAD" and tensor in self.fresh)
            else "EX"
        )
        self._dma(kind, tensor)
        for i in range(before[1], len(self.em.code)):
            self.em.code[i] = self.em.code[i].with_tokens(wait=set(), signal=set())
        self.em.queue = before[0]

    def _dma(self, kind: str, tensor: str) -> None:
        mem, base, origin, size = self.active[tensor]
        t = self.program.tensor(tensor)
        view = View(mem, t.dtype, LoopAffine.make(base), size, self._strides(tensor, size))
        if kind == "LOAD" and tensor in self.fresh:
            if tensor not in self.unfilled:
                # a padded temporary (an activation between fused layers) whose elements are all
                # written before they are read starts as its pad value: its halo is never written
                padded = t.role == "none" and not self.schedule.initial_value_read(tensor)
                halo = _halo_extent(origin, size, t.shape, self.em.counts)
                if padded and tensor not in self.compact and halo is not None:
                    # every element of the tensor is written before it is read: only the halo
                    # needs the pad (issue 14: filling a fused 3x3's whole input cost ~1 cycle
                    # per 16 bytes on EX; per band, its rows inside the image in every band)
                    for part in _halo_views(view, halo, t.itemsize):
                        self.em.emit(isa.make("VFILL", dst=part, imm=t.pad))
                    return
                pad = t.pad if padded else 0
                self.em.emit(
                    isa.make("VFILL", dst=view, imm=pad)
                )  # starts as zeros (a halo as the pad value) and no other box meets it
            return
        if kind == "LOAD" and tensor in self.compact:
            # one DMA per accessed row, each into its row of the compact buffer
            d, step, rows = self.compact[tensor]
            strides = self._strides(tensor, size)
            one = size[:d] + (1,) + size[d + 1 :]
            for i in range(rows):
                row = View(
                    mem, t.dtype, LoopAffine.make(base + i * strides[d] * t.itemsize), one, strides
                )
                at = tuple(o + i * step if k == d else o for k, o in enumerate(origin))
                self.em.emit(isa.make("LOAD", dst=row, src=Box(self.index[tensor], at, one)))
            return
        box = Box(self.index[tensor], tuple(origin), size)
        self.em.emit(
            isa.make(kind, dst=view, src=box)
            if kind == "LOAD"
            else isa.make(kind, dst=box, src=view)
        )


def _halo_extent(origin, size, shape, counts: list[int | None]) -> list[tuple[int, int]] | None:
    """Per dimension, how many of a box's first and last elements lie outside the tensor in
    some iteration of the loops around it (their trip counts `counts`), if the loops moving
    its origin have fixed counts; else None. Filled in every iteration, an element outside the
    tensor in another one is inside in this one, where it is written before it is read."""
    out = []
    for o, n, s in zip(origin, size, shape, strict=True):
        if any(c and (lv >= len(counts) or counts[lv] is None) for lv, c in enumerate(o.coefs)):
            return None
        lo = o.const + sum(min(0, c * (counts[lv] - 1)) for lv, c in enumerate(o.coefs) if c)
        hi = o.const + sum(max(0, c * (counts[lv] - 1)) for lv, c in enumerate(o.coefs) if c)
        out.append((max(0, min(n, -lo)), max(0, min(n, hi + n - s))))
    return out


def _halo_views(view: View, halo: list[tuple[int, int]], itemsize: int) -> list[View]:
    """The slabs of a buffer (`view`) outside its tensor, `halo` its first and last elements
    outside along each dimension: along each, the rows before the tensor and after it, the
    slabs of earlier dimensions left out (so that no element is filled twice)."""
    if any(lo + hi >= n for n, (lo, hi) in zip(view.shape, halo, strict=True)):
        return [view]
    parts, lo_in, hi_in = [], [], []
    for d, (n, (lo, hi)) in enumerate(zip(view.shape, halo, strict=True)):
        for start, count in ((0, lo), (n - hi, hi)):
            if count <= 0:
                continue
            at = [0] * len(view.shape)
            size = list(view.shape)
            for e in range(d):
                at[e], size[e] = lo_in[e], hi_in[e] - lo_in[e]
            at[d], size[d] = start, count
            if all(size):
                offset = sum(a * st for a, st in zip(at, view.strides, strict=True)) * itemsize
                parts.append(
                    View(view.mem, view.dtype, view.base + offset, tuple(size), view.strides)
                )
        lo_in.append(lo)
        hi_in.append(n - hi)
    return parts
