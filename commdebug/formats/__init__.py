"""Readers: every file commdebug reads (its dumps, PyTorch Flight Recorder's) into the trace model."""
