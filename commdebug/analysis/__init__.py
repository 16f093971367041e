"""Analysis: pure functions over one or many loaded traces (summaries, ranks, checks, diffs)."""
