"""Renderers: the model (a Trace, RankViews, an analysis result) in, text out; never a file.

Each output is one function or class, ``render_<output>(model, ...) -> str`` (or an iterator of
text chunks, for outputs too large to hold, as :class:`~commdebug.render.chrome_trace.ChromeTrace`
yields); :func:`commdebug.fileio.write_output` writes any of them atomically.
"""
