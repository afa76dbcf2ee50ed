"""depthwise3x3: no reduction over channels, so the MAC array has nothing to hold; everything
fits the scratchpad, and each (channel, row, r, s) step is one vector multiply-accumulate over
the 28 pixels of the row."""


def schedule(s):
    s.reorder(s.loop("n"), s.loop("c"), s.loop("r"), s.loop("s"), s.loop("h"), s.loop("w"))
    s.vectorize(s.loop("w"))
