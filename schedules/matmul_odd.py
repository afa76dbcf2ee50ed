"""matmul_odd: 16x16 blocks of (j, k) on the MAC array with all 100 rows of A streaming through
(M = 100); the partial blocks of 53 and 37 become smaller MATMULs, not scalar code."""


def schedule(s):
    jo, ji = s.split(s.loop("j"), 16)
    ko, ki = s.split(s.loop("k"), 16)
    s.reorder(jo, ko, s.loop("i"), ji, ki)
    s.tensorize(s.loop("i"), ji, ki)
