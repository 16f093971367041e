"""Capture: the dispatch mode and module hooks that decide what happened. Formats nothing."""
