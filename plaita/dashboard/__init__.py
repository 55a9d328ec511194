"""The operator's web dashboard (``plaita dashboard``): fleet, lifecycle, queue, throughput, DLQ.

Needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn). Reads Redis only through
plaita.store; templates and static files ship inside this package (no build step, no CDN).
"""
