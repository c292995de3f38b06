"""The live dashboard (``msgtable serve --http HOST:PORT``): a web page of every table and
subscription, its JSON API, and the rate history behind its plots.

Modules:
    api      The dashboard's JSON API, without HTTP
    history  The dashboard's rate history
    web      The dashboard over HTTP
"""

from __future__ import annotations

from .api import ApiError, DashboardApi
from .history import RateHistory
from .web import DashboardServer, parse_listen

__all__ = ["ApiError", "DashboardApi", "DashboardServer", "RateHistory", "parse_listen"]
