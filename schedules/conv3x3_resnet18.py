"""conv3x3_resnet18: X (with its halo) and W fit the 256 KiB scratchpad together, so both are
loaded once; one output row of 16 channels stays in the accumulators across the whole
reduction (c blocks, r, s); the MAC array holds a 16x16 (c, k) weight block while the 56
pixels of the row stream through it."""


def schedule(s):
    ko, ki = s.split(s.loop("k"), 16)
    co, ci = s.split(s.loop("c"), 16)
    s.reorder(s.loop("n"), ko, s.loop("h"), co, s.loop("r"), s.loop("s"), s.loop("w"), ki, ci)
    s.stage("X", None, "spad")
    s.stage("W", None, "spad")
    s.stage("Y", s.loop("h"), "acc")
    s.tensorize(s.loop("w"), ki, ci)
