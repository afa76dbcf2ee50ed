"""matmul_256: A (64 KiB) stays in the scratchpad for the whole program; a 256x16 column block
of C stays in the accumulators across the reduction; B is staged 16x16 per k block; the MAC
array holds the B block while all 256 rows of A stream through it."""


def schedule(s):
    jo, ji = s.split(s.loop("j"), 16)
    ko, ki = s.split(s.loop("k"), 16)
    s.reorder(jo, ko, s.loop("i"), ji, ki)
    s.stage("A", None, "spad")
    s.stage("C", jo, "acc")
    s.stage("B", ko, "spad")
    s.tensorize(s.loop("i"), ji, ki)
