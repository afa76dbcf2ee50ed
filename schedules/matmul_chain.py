"""matmul_chain: both products on the MAC array in 16x16 blocks with every row streaming through
(ACC1 = X @ W1, then ACC2 = H @ W2), the requantizations between and after them on the vector unit."""


def schedule(s):
    jo, ji = s.split(s.loop("S0.j"), 16)
    ko, ki = s.split(s.loop("k"), 16)
    s.reorder(jo, ko, s.loop("S0.i"), ji, ki)
    s.tensorize(s.loop("S0.i"), ji, ki)
    s.vectorize(s.loop("S1.j"))
    no, ni = s.split(s.loop("S2.n"), 16)
    j2o, j2i = s.split(s.loop("S2.j"), 16)
    s.reorder(no, j2o, s.loop("S2.i"), ni, j2i)
    s.tensorize(s.loop("S2.i"), ni, j2i)
    s.vectorize(s.loop("S3.n"))
