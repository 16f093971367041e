"""Browser tests of the viewer (a package, so its conftest does not shadow tests/conftest.py)."""
