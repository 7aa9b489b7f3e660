"""``raysaga dashboard``: a web view of the store's runs (FastAPI + uvicorn, one process).

``app.create_app`` is the application; ``server.build`` checks the bind rule and makes it. The
front-end is built from ``dashboard-ui/`` at development time and committed under ``static/``
(no Node and no CDN at install or run time). Needs the ``dashboard`` extra
(``pip install 'raysaga[dashboard]'``). Details: docs/dashboard.md.
"""
