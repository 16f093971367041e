"""commdebug: see every collective a PyTorch distributed program issues.

>>> from commdebug import CommDebugMode
>>> comm = CommDebugMode()
>>> with comm:
...     pass  # your training steps
>>> comm.get_total_counts()
0
"""

__version__ = "0.1.0"

from commdebug.model.dump import load  # noqa: E402
from commdebug.errors import CommDebugError, DumpError  # noqa: E402
from commdebug.capture.mode import CommDebugMode  # noqa: E402
from commdebug.model.trace import CollectiveEvent, Trace  # noqa: E402

__all__ = ["CommDebugMode", "Trace", "CollectiveEvent", "load", "CommDebugError", "DumpError", "__version__"]
