"""The trace model and its JSON form: what a run did, the same live or loaded from a file."""
