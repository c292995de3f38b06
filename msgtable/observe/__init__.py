"""Seeing the server at work: Prometheus metrics and their exposition, and the dashboard.

Modules:
    dashboard/  The live dashboard (``msgtable serve --http HOST:PORT``)
    exposition  Prometheus's text format (version 0.0.4) for msgtable's own metric
    metrics     Prometheus metrics
"""
