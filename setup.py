"""The compiled pieces, all optional; the metadata lives in pyproject.toml.

``commdebug.capture._frames`` finds a collective's source line without making a frame object of
each frame it skips (see commdebug/capture/source.py). Without a C compiler the install goes on
without it, and the capture walks frame objects instead.

``commdebug.launch._faults`` writes a rank's fault record when its process dies of a fatal
signal (see commdebug/launch/faults.py). Without it a native crash is not recorded: the readers
then say the cause is unknown.

``commdebug.capture._native`` is light capture's kernel for the collective ops in C++ (see
commdebug/capture/_native.cpp): it is built against torch's headers, so only where torch is
importable when the package is built (``pip install --no-build-isolation``, or ``python setup.py
build_ext --inplace`` in a checkout). Without it light capture records through Python kernels,
which cost a few microseconds more per collective, and says so once.

``commdebug.analysis._late`` makes the late-rank analysis's passes over a rank's calls in C
(see commdebug/analysis/late_digest.py and late_tally.py). Without it the same results come
from Python, more slowly.

``commdebug.formats._kineto`` reads a torch.profiler trace in one pass over its bytes, keeping
only the events commdebug uses (see commdebug/formats/kineto.py). Without it every event is
parsed, which gives the same events, more slowly on a large trace.
"""

from setuptools import Extension, setup


def _native() -> list[Extension]:
    """The C++ kernel, where torch (its headers and libraries) is there to build against."""
    try:
        from torch.utils.cpp_extension import CppExtension
    except ImportError:  # an isolated build: no torch to build against
        print("commdebug: torch is not importable here: light capture's C++ kernel is not built (Python kernels instead)")
        return []
    extension = CppExtension("commdebug.capture._native", ["commdebug/capture/_native.cpp"], extra_compile_args=["-O2", "-g0", "-std=c++20"])
    extension.optional = True
    return [extension]


setup(ext_modules=[Extension("commdebug.capture._frames", ["commdebug/capture/_frames.c"], optional=True),
                   Extension("commdebug.launch._faults", ["commdebug/launch/_faults.c"], optional=True),
                   Extension("commdebug.analysis._late", ["commdebug/analysis/_late.c"], optional=True),
                   Extension("commdebug.formats._kineto", ["commdebug/formats/_kineto.c"],
                             depends=["commdebug/formats/_kineto_json.h"], optional=True),
                   *_native()])
