"""The compiled pieces, all optional; the metadata lives in pyproject.toml.

``commdebug.capture._frames`` finds a collective's source line without making a frame object of
each frame it skips (see commdebug/capture/source.py). Without a C compiler the install goes on
without it, and the capture walks frame objects instead.

``commdebug.launch._faults`` writes a rank's fault record when its process dies of a fatal
signal (see commdebug/launch/faults.py). Without it a native crash is not recorded: the readers
then say the cause is unknown.

``commdebug.analysis._late`` makes the late-rank analysis's passes over a rank's calls in C
(see commdebug/analysis/late_digest.py and late_tally.py). Without it the same results come
from Python, more slowly.

``commdebug.formats._kineto`` reads a torch.profiler trace in one pass over its bytes, keeping
only the events commdebug uses (see commdebug/formats/kineto.py). Without it every event is
parsed, which gives the same events, more slowly on a large trace.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("commdebug.capture._frames", ["commdebug/capture/_frames.c"], optional=True),
                   Extension("commdebug.launch._faults", ["commdebug/launch/_faults.c"], optional=True),
                   Extension("commdebug.analysis._late", ["commdebug/analysis/_late.c"], optional=True),
                   Extension("commdebug.formats._kineto", ["commdebug/formats/_kineto.c"],
                             depends=["commdebug/formats/_kineto_json.h"], optional=True)])
