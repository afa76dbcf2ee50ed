"""Double buffering: a staging loop whose next footprint is loaded while the current
one computes (ping-pong buffers, tokens between the DMA and compute queues)."""

from __future__ import annotations

import numpy as np

from tensorgen.codegen.compiled import align
from tensorgen.codegen.lowering.walk import _statements_under
from tensorgen.errors import CodegenError
from tensorgen.mc import isa
from tensorgen.mc.operands import Bound, LoopAffine


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

    def _pipelined_loop(self, node, pos: int, name: str, lo: int, hi: int, env, band) -> None:
        """The loop unrolled by two over alternating buffers, with tokens only where buffers
        are shared: the loads of one iteration and the stores of the previous run while the
        MAC array or vector unit computes. Two credits per direction start the pipeline, and
        are drained at its end, so the loop leaves no token behind."""
        em, here = self.em, self._staged_here(node, pos)
        loads = [t for t in here if t not in self.fresh]
        stores = [t for t in here if t in self.stored]
        if set(loads) & set(stores):
            self._pipelined_ahead(node, name, lo, hi, env, band, here, loads, stores)
            return
        em.emit(isa.make("SYNC", queue=1))  # leave the serial chain on EX with everything done
        code = em.code
        sync = lambda q, wait=(), signal=(): code.append(  # noqa: E731
            isa.make("SYNC", queue=["LD", "EX", "ST"].index(q)).with_tokens(
                wait=set(wait), signal=set(signal)
            )
        )
        for _ in range(2):
            if loads:
                sync("EX", signal=["LD"])
            if stores:
                code.append(isa.make("SYNC", queue=2).with_tokens(signal={"EX"}))

        def activate(value: LoopAffine, parity: int) -> dict:
            saved = {t: self.active.get(t) for t in here}
            for t in here:
                _, _, mem, base, _, size = self.loop_stages[t]
                nbytes = align(int(np.prod(size)) * self.program.tensor(t).itemsize)
                self.active[t] = (
                    mem,
                    base + parity * nbytes,
                    self._stage_origin(t, {**env, name: value}, node),
                    size,
                )
            return saved

        def load(value: LoopAffine, parity: int) -> None:
            if not loads:
                return
            saved = activate(value, parity)
            sync("LD", wait=["EX"])
            for t in loads:
                self._dma_raw("LOAD", t)
            sync("LD", signal=["EX"])
            self.active.update(saved)

        def rest(value: LoopAffine, parity: int) -> None:
            saved = activate(value, parity)
            waits = (["LD"] if loads else []) + (["ST"] if stores else [])
            sync("EX", wait=waits)
            em.queue, em.fresh_block = "EX", True
            for t in here:
                if t in self.fresh:
                    self._dma_raw("LOAD", t)  # the zero fill, on EX (if any)
            self._walk(node.for_get_body(), {**env, name: value}, band)
            if em.queue != "EX":
                raise CodegenError(
                    "a double-buffered loop's body must run on the compute queue only"
                )
            sync("EX", signal=(["LD"] if loads else []) + (["ST"] if stores else []))
            if stores:
                sync("ST", wait=["EX"])
                for t in stores:
                    self._dma_raw("STORE", t)
                code.append(isa.make("SYNC", queue=2).with_tokens(signal={"EX"}))
            self.active.update(saved)

        # Program order: the loads of the next iteration before the compute and stores of this one,
        # as the queues run them (the simulator gives the DRAM channel in program order among
        # transfers ready at once, so a prefetch behind a store would wait for it). Iteration j
        # uses buffer (j - lo) % 2.
        load(LoopAffine.make(lo), 0)
        steps = hi - lo  # {load(j + 1); rest(j)} for j in lo..hi-1, then rest(hi)
        if steps // 2:
            head = len(code)
            code.append(isa.make("LOOP", count=steps // 2, body=0))
            em.depth += 1
            level = em.depth - 1
            j = LoopAffine.make(lo, {level: 2})
            load(j + 1, 1)
            rest(j, 0)
            load(j + 2, 0)
            rest(j + 1, 1)
            em.depth -= 1
            code[head] = isa.make("LOOP", count=steps // 2, body=len(code) - head - 1)
        if steps % 2:
            load(LoopAffine.make(hi), (hi - lo) % 2)
            rest(LoopAffine.make(hi - 1), (hi - 1 - lo) % 2)
        rest(LoopAffine.make(hi), (hi - lo) % 2)
        for _ in range(2):
            if loads:
                sync("LD", wait=["EX"])
            if stores:
                sync("EX", wait=["ST"])
        em.queue = "LD" if loads and not stores else "EX"
        em.fresh_block = True

    def _pipelined_ahead(
        self, node, name: str, lo: int, hi: int, env, band, here, loads, stores
    ) -> None:
        """A double-buffered loop with a tensor that is loaded and stored (an accumulator whose
        partial sums come back from DRAM): the loop unrolled by two, each iteration loading the
        next one's boxes into the other buffers while it computes. A buffer is loaded once the
        store of the iteration before has emptied it, and an iteration's stores wait for the next
        one's loads, so that a load and a store of one tensor never overlap (their boxes differ,
        but the simulator, like a DMA engine without address checks, orders them by tokens)."""
        em, code = self.em, self.em.code
        em.emit(isa.make("SYNC", queue=1))  # leave the serial chain on EX with everything done
        sync = lambda q, wait=(), signal=(): code.append(  # noqa: E731
            isa.make("SYNC", queue=["LD", "EX", "ST"].index(q)).with_tokens(
                wait=set(wait), signal=set(signal)
            )
        )
        # two credits from ST (each buffer is empty), given after the serial chain
        for _ in range(2):
            sync("EX", signal=["ST"])
            sync("ST", wait=["EX"], signal=["LD", "EX"])
        saved = {t: self.active.get(t) for t in here}

        def use(value: LoopAffine, parity: int) -> dict[str, LoopAffine]:
            at = {**env, name: value}
            for t in here:
                _, _, mem, base, _, size = self.loop_stages[t]
                nbytes = align(int(np.prod(size)) * self.program.tensor(t).itemsize)
                self.active[t] = (
                    mem,
                    base + parity * nbytes,
                    self._stage_origin(t, at, node),
                    size,
                )
            return at

        def load(value: LoopAffine, parity: int, guard: bool) -> None:
            at = use(value, parity)
            if not guard:
                for t in loads:
                    self._load(t, at, node, raw=True)
                return
            with em.block("IF", cond=Bound(((LoopAffine.make(hi) + value.scale(-1), 1),))):
                for t in loads:
                    self._load(t, at, node, raw=True)

        sync("LD", wait=["ST"])
        load(LoopAffine.make(lo), 0, False)
        sync("LD", signal=["EX"])

        def iteration(value: LoopAffine, parity: int, ahead: str) -> None:
            sync("LD", wait=["ST"])
            if ahead != "none":
                load(value + 1, 1 - parity, ahead == "guarded")
            sync("LD", signal=["EX", "ST"])
            sync("EX", wait=["LD", "ST"])
            em.queue, em.fresh_block = "EX", True
            at = use(value, parity)
            for t in here:
                if t in self.fresh:
                    self._dma_raw("LOAD", t)  # the zero fill, on EX (if any)
                elif t in self.first and t not in self.no_fill:
                    self._guarded(
                        self.first[t].first, at, node, lambda t=t: self._zero(t, raw=True)
                    )
            self._walk(node.for_get_body(), at, band)
            if em.queue != "EX":
                raise CodegenError(
                    "a double-buffered loop's body must run on the compute queue only"
                )
            sync("EX", signal=["ST"])
            sync("ST", wait=["EX", "LD"])
            for t in stores:
                self._dma_raw("STORE", t)
            sync("ST", signal=["LD", "EX"])

        count = hi - lo + 1
        head = len(code)
        code.append(isa.make("LOOP", count=count // 2, body=0))
        em.depth += 1
        level = em.depth - 1
        iteration(LoopAffine.make(lo, {level: 2}), 0, "all")
        iteration(LoopAffine.make(lo + 1, {level: 2}), 1, "all" if count % 2 else "guarded")
        em.depth -= 1
        code[head] = isa.make("LOOP", count=count // 2, body=len(code) - head - 1)
        if count % 2:
            iteration(LoopAffine.make(hi), 0, "none")
        for t in here:
            self.active[t] = saved[t]
        sync("LD", wait=["ST"])
        sync("EX", wait=["LD"])
        for _ in range(2):
            sync("EX", wait=["ST"])
        em.queue, em.fresh_block = "EX", True
