"""The one compiled piece, and it is optional; the metadata lives in pyproject.toml.

``commdebug.capture._frames`` finds a collective's source line without making a frame object of
each frame it skips (see commdebug/capture/source.py). Without a C compiler the install goes on
without it, and the capture walks frame objects instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("commdebug.capture._frames", ["commdebug/capture/_frames.c"], optional=True)])
