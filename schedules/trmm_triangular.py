"""trmm_triangular: put the triangular reduction k outside the output columns j, which are
independent and have constant bounds, and run j as vectors."""


def schedule(s):
    s.reorder(s.loop("i"), s.loop("k"), s.loop("j"))
    s.vectorize(s.loop("j"))
