"""The simulator's event kinds, in the order they run when due at the same time (arrivals run
last). LAUNCH: a pipelined node's batch starts computing, so the node takes its next batch."""
DEPART, LAUNCH, REFILL, DOWN, UP, REFRESH, TICK, WINDOW = range(8)
