"""conv3x3_stride2: X stays in the scratchpad; the weights of one block of 16 output channels
(16x64x3x3) are staged per block; an output row of 16 channels accumulates in the
accumulators while its 28 pixels stream through the array at stride 2."""


def schedule(s):
    ko, ki = s.split(s.loop("k"), 16)
    co, ci = s.split(s.loop("c"), 16)
    s.reorder(s.loop("n"), ko, s.loop("h"), co, s.loop("r"), s.loop("s"), s.loop("w"), ki, ci)
    s.stage("X", None, "spad")
    s.stage("W", ko, "spad")
    s.stage("Y", s.loop("h"), "acc")
    s.tensorize(s.loop("w"), ki, ci)
