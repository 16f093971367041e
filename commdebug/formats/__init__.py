"""Formats in and out: PyTorch Flight Recorder dumps (in), Chrome Trace Event JSON (out)."""
