"""conv1x1: X and W fit the scratchpad and are loaded once; a 16-channel output plane stays in
the accumulators across the whole reduction; rows of 14 pixels stream through the array."""


def schedule(s):
    ko, ki = s.split(s.loop("k"), 16)
    co, ci = s.split(s.loop("c"), 16)
    s.reorder(s.loop("n"), ko, co, s.loop("h"), s.loop("w"), ki, ci)
    s.stage("X", None, "spad")
    s.stage("W", None, "spad")
    s.stage("Y", ko, "acc")
    s.tensorize(s.loop("w"), ki, ci)
