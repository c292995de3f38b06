"""The live dashboard (``msgtable serve --http HOST:PORT``): a web page of every table and
subscription, its JSON API, and the rate history behind its plots."""

from __future__ import annotations

from .api import ApiError, DashboardApi
from .history import RateHistory
from .web import DashboardServer, parse_listen

__all__ = ["ApiError", "DashboardApi", "DashboardServer", "RateHistory", "parse_listen"]
