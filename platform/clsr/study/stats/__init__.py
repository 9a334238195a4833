"""Statistics over seeds, with no I/O: verdicts against papers, effects with their intervals, Pareto fronts."""
