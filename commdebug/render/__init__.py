"""Renderers: pure functions from the trace model to text."""
