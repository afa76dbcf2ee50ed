"""Double buffering: a staging loop whose next footprint is loaded while the current
one computes (ping-pong buffers, tokens between the DMA and compute queues)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tensorgen.codegen.compiled import align
from tensorgen.codegen.lowering.walk import _statements_under
from tensorgen.errors import CodegenError
from tensorgen.mc import isa
from tensorgen.mc.operands import Bound, LoopAffine


@dataclass(frozen=True)
class _Pipeline:
    """A double-buffered loop being emitted: its AST node, iterator and bounds, where it sits
    (the enclosing iterators and bands), and the tensors staged at it, by what the loop does
    with them (`loads`: read from DRAM each iteration, `stores`: written back)."""

    node: object
    name: str
    lo: int
    hi: int
    env: dict
    band: dict
    here: list[str]
    loads: list[str]
    stores: list[str]

    def at(self, value: LoopAffine) -> dict[str, LoopAffine]:
        """The iterators in the iteration where the loop's own is `value`."""
        return {**self.env, self.name: value}


class _DoubleBuffering:
    """Methods of the scheduled lowering (tensorgen.codegen.scheduled._Lowering), one pass."""

    # -- double buffering -----------------------------------------------------------------
    def _pipelined(self, node, pos: int, count: int) -> bool:
        """Whether the loop can overlap its DMAs with its compute: every tensor staged at it has
        two buffers, a tensor both loaded and stored has disjoint boxes in the loop's iterations,
        and no DMA happens deeper inside (its body is pure compute)."""
        here = self._staged_here(node, pos)
        if count < 2 or not here or any(t not in self.double for t in here):
            return False
        if any(t not in self.fresh and t in self.stored and t not in self.disjoint for t in here):
            return False
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        return not any(p > pos and stmts & under for t, (p, stmts, *_) in self.loop_stages.items())

    def _sync(self, queue: str, wait=(), signal=()) -> None:
        """A SYNC on `queue` appended as is, past the emitter's serial chain: a double-buffered
        loop places its own tokens, between queues that run at once."""
        self.em.code.append(
            isa.make("SYNC", queue=isa.QUEUES.index(queue)).with_tokens(
                wait=set(wait), signal=set(signal)
            )
        )

    @contextmanager
    def _unrolled_loop(self, count: int):
        """A LOOP of `count` trips around the instructions emitted inside, yielding its level:
        unlike the emitter's, it adds no SYNC at its end, since the pipeline's tokens already
        leave each trip on the queue it started on."""
        em = self.em
        head = len(em.code)
        em.code.append(isa.make("LOOP", count=count, body=0))
        em.depth += 1
        yield em.depth - 1
        em.depth -= 1
        em.code[head] = isa.make("LOOP", count=count, body=len(em.code) - head - 1)

    def _use_buffers(self, p: _Pipeline, value: LoopAffine, parity: int) -> dict:
        """Point the loop's staged tensors at buffer `parity` (0 or 1) holding the boxes of the
        iteration `value`; the iterators of that iteration."""
        at = p.at(value)
        for t in p.here:
            _, _, mem, base, _, size = self.loop_stages[t]
            nbytes = align(int(np.prod(size)) * self.program.tensor(t).itemsize)
            self.active[t] = (mem, base + parity * nbytes, self._stage_origin(t, at, p.node), size)
        return at

    def _compute_on_ex(self, p: _Pipeline, at: dict, fill_first: bool) -> None:
        """The loop's body for one iteration on the compute queue: the zero fills of its fresh
        tensors (and, with `fill_first`, of an accumulator in its first iteration), then the body,
        which must not leave EX (its DMAs are the pipeline's)."""
        em = self.em
        em.queue, em.fresh_block = "EX", True
        for t in p.here:
            if t in self.fresh:
                self._dma_raw("LOAD", t)  # the zero fill, on EX (if any)
            elif fill_first and t in self.first and t not in self.no_fill:
                self._guarded(self.first[t].first, at, p.node, lambda t=t: self._zero(t, raw=True))
        self._walk(p.node.for_get_body(), at, p.band)
        if em.queue != "EX":
            raise CodegenError("a double-buffered loop's body must run on the compute queue only")

    def _pipelined_loop(self, node, pos: int, name: str, lo: int, hi: int, env, band) -> None:
        """The loop unrolled by two over alternating buffers, with tokens only where buffers
        are shared: the loads of one iteration and the stores of the previous run while the
        MAC array or vector unit computes. Two credits per direction start the pipeline, and
        are drained at its end, so the loop leaves no token behind."""
        here = self._staged_here(node, pos)
        loads = [t for t in here if t not in self.fresh]
        stores = [t for t in here if t in self.stored]
        p = _Pipeline(node, name, lo, hi, env, band, here, loads, stores)
        if set(loads) & set(stores):
            self._pipelined_ahead(p)
            return
        self.em.emit(isa.make("SYNC", queue=1))  # leave the serial chain on EX with everything done
        for _ in range(2):
            if loads:
                self._sync("EX", signal=["LD"])
            if stores:
                self._sync("ST", signal=["EX"])
        # Program order: the loads of the next iteration before the compute and stores of this one,
        # as the queues run them (the simulator gives the DRAM channel in program order among
        # transfers ready at once, so a prefetch behind a store would wait for it). Iteration j
        # uses buffer (j - lo) % 2.
        self._prefetch(p, LoopAffine.make(lo), 0)
        steps = hi - lo  # {load(j + 1); rest(j)} for j in lo..hi-1, then rest(hi)
        if steps // 2:
            with self._unrolled_loop(steps // 2) as level:
                j = LoopAffine.make(lo, {level: 2})
                self._prefetch(p, j + 1, 1)
                self._compute_and_store(p, j, 0)
                self._prefetch(p, j + 2, 0)
                self._compute_and_store(p, j + 1, 1)
        if steps % 2:
            self._prefetch(p, LoopAffine.make(hi), (hi - lo) % 2)
            self._compute_and_store(p, LoopAffine.make(hi - 1), (hi - 1 - lo) % 2)
        self._compute_and_store(p, LoopAffine.make(hi), (hi - lo) % 2)
        for _ in range(2):
            if loads:
                self._sync("LD", wait=["EX"])
            if stores:
                self._sync("EX", wait=["ST"])
        self.em.queue = "LD" if loads and not stores else "EX"
        self.em.fresh_block = True

    def _prefetch(self, p: _Pipeline, value: LoopAffine, parity: int) -> None:
        """On LD, the loads of iteration `value` into buffer `parity`, once compute has freed it."""
        if not p.loads:
            return
        saved = {t: self.active.get(t) for t in p.here}
        self._use_buffers(p, value, parity)
        self._sync("LD", wait=["EX"])
        for t in p.loads:
            self._dma_raw("LOAD", t)
        self._sync("LD", signal=["EX"])
        self.active.update(saved)

    def _compute_and_store(self, p: _Pipeline, value: LoopAffine, parity: int) -> None:
        """Iteration `value` on buffer `parity`: compute once its loads are in (and the store of
        the iteration before has emptied the buffer), then its stores on ST."""
        saved = {t: self.active.get(t) for t in p.here}
        at = self._use_buffers(p, value, parity)
        self._sync("EX", wait=(["LD"] if p.loads else []) + (["ST"] if p.stores else []))
        self._compute_on_ex(p, at, fill_first=False)
        self._sync("EX", signal=(["LD"] if p.loads else []) + (["ST"] if p.stores else []))
        if p.stores:
            self._sync("ST", wait=["EX"])
            for t in p.stores:
                self._dma_raw("STORE", t)
            self._sync("ST", signal=["EX"])
        self.active.update(saved)

    def _pipelined_ahead(self, p: _Pipeline) -> None:
        """A double-buffered loop with a tensor that is loaded and stored (an accumulator whose
        partial sums come back from DRAM): the loop unrolled by two, each iteration loading the
        next one's boxes into the other buffers while it computes. A buffer is loaded once the
        store of the iteration before has emptied it, and an iteration's stores wait for the next
        one's loads, so that a load and a store of one tensor never overlap (their boxes differ,
        but the simulator, like a DMA engine without address checks, orders them by tokens)."""
        self.em.emit(isa.make("SYNC", queue=1))  # leave the serial chain on EX with everything done
        # two credits from ST (each buffer is empty), given after the serial chain
        for _ in range(2):
            self._sync("EX", signal=["ST"])
            self._sync("ST", wait=["EX"], signal=["LD", "EX"])
        saved = {t: self.active.get(t) for t in p.here}
        self._sync("LD", wait=["ST"])
        self._load_ahead(p, LoopAffine.make(p.lo), 0, guard=False)
        self._sync("LD", signal=["EX"])
        count = p.hi - p.lo + 1
        with self._unrolled_loop(count // 2) as level:
            self._iteration_ahead(p, LoopAffine.make(p.lo, {level: 2}), 0, "all")
            last = "all" if count % 2 else "guarded"
            self._iteration_ahead(p, LoopAffine.make(p.lo + 1, {level: 2}), 1, last)
        if count % 2:
            self._iteration_ahead(p, LoopAffine.make(p.hi), 0, "none")
        for t in p.here:
            self.active[t] = saved[t]
        self._sync("LD", wait=["ST"])
        self._sync("EX", wait=["LD"])
        for _ in range(2):
            self._sync("EX", wait=["ST"])
        self.em.queue, self.em.fresh_block = "EX", True

    def _load_ahead(self, p: _Pipeline, value: LoopAffine, parity: int, guard: bool) -> None:
        """The loads of iteration `value` into buffer `parity`; with `guard`, under an IF that
        skips them past the loop's last iteration (the second half of an unrolled trip)."""
        at = self._use_buffers(p, value, parity)
        if not guard:
            for t in p.loads:
                self._load(t, at, p.node, raw=True)
            return
        with self.em.block("IF", cond=Bound(((LoopAffine.make(p.hi) + value.scale(-1), 1),))):
            for t in p.loads:
                self._load(t, at, p.node, raw=True)

    def _iteration_ahead(self, p: _Pipeline, value: LoopAffine, parity: int, ahead: str) -> None:
        """Iteration `value` on buffer `parity`: the next iteration's loads into the other buffer
        (`ahead`: "all", "guarded" for one that may be past the end, or "none"), its compute, then
        its stores once those loads are done."""
        self._sync("LD", wait=["ST"])
        if ahead != "none":
            self._load_ahead(p, value + 1, 1 - parity, ahead == "guarded")
        self._sync("LD", signal=["EX", "ST"])
        self._sync("EX", wait=["LD", "ST"])
        at = self._use_buffers(p, value, parity)
        self._compute_on_ex(p, at, fill_first=True)
        self._sync("EX", signal=["ST"])
        self._sync("ST", wait=["EX", "LD"])
        for t in p.stores:
            self._dma_raw("STORE", t)
        self._sync("ST", signal=["LD", "EX"])
