"""jacobi1d: every time step is one vector over space (space carries no dependence within a step);
the array stays in the scratchpad across steps instead of going through DRAM each step."""


def schedule(s):
    s.vectorize(s.loop("i"))
