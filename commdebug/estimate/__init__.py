"""Predicted communication time of recorded collectives on a target cluster (docs/estimate.md).

Offline: a pure function of a trace and a :class:`Cluster`, never on the capture path.

>>> from commdebug.estimate import load_cluster, predict
>>> seconds = predict(commdebug.load("plan.json"), load_cluster("h100-ib400"))   # doctest: +SKIP
"""

from commdebug.estimate.alpha_beta import Prediction, predict, predict_events, predict_trace, resolve_cluster
from commdebug.estimate.cluster import Cluster, Link
from commdebug.estimate.presets import PRESETS, load_cluster

__all__ = ["Cluster", "Link", "load_cluster", "PRESETS", "Prediction", "predict", "predict_events",
           "predict_trace", "resolve_cluster"]
