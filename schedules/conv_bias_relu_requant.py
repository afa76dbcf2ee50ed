"""conv_bias_relu_requant: the three statements are fused per (image, 16-channel block, row), so
one row of accumulators lives in the accumulator SRAM from its bias init through the
contraction (on the MAC array, zero point subtracted at its inputs) to the requantized output
(vectors); inputs, weights and outputs stay in the scratchpad."""


def schedule(s):
    s.fuse(s.fuse(s.loop("S0.n"), s.loop("S1.n")), s.loop("S2.n"))
    s.fuse(s.fuse(s.loop("S0.k"), s.loop("S1.k")), s.loop("S2.k"))
    h = s.fuse(s.fuse(s.loop("S0.h"), s.loop("S1.h")), s.loop("S2.h"))
    ko, ki = s.split(s.loop("S0.k"), 16)
    s.reorder(h, ki)
    k1 = s.distribute(ki, "S1", "S2")
    s.distribute(k1, "S2")
    co, ci = s.split(s.loop("c"), 16)
    s.reorder(co, s.loop("r"), s.loop("s"), s.loop("S1.w"), k1, ci)
    for t in ("X", "W", "B", "Y"):
        s.stage(t, None, "spad")
    s.stage("ACC", h, "acc")
    s.vectorize(s.loop("S0.w"))
    s.tensorize(s.loop("S1.w"), k1, ci)
    s.vectorize(s.loop("S2.w"))
