"""rnn_cell: weights, state and inputs stay on chip for all time steps; both contractions run on
the MAC array in 16x16 blocks (batch streams as M), init and epilogue as vectors over units."""


def schedule(s):
    s.vectorize(s.loop("S0.j"))
    for stmt in ("S1", "S2"):
        jo, ji = s.split(s.loop(f"{stmt}.j"), 16)
        io, ii = s.split(s.loop(f"{stmt}.i"), 16)
        s.reorder(jo, io, s.loop(f"{stmt}.b"), ji, ii)
        s.tensorize(s.loop(f"{stmt}.b"), ji, ii)
    s.vectorize(s.loop("S3.j"))
