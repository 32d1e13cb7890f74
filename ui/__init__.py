"""Small helpers for the dashboard's pages: shared settings, job runner, chart rendering.

Widgets turn into plain values here; the pages make one engine call with them and render
what comes back. Nothing here imports torch or does maths.
"""
