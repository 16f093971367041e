"""Analyses: pure functions over loaded traces or rank views (summaries, reports, checks, diffs,
predictions); they return data, and the renderers word it."""
