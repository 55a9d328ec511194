"""The dashboard's ASGI app: the shared ``Dashboard`` (``plaita.dashboard.core``) wired to the routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from plaita.dashboard import routes
from plaita.dashboard.core import HERE, LOOPBACK_HOSTS, TABS, Dashboard, DashboardConfig
from plaita.dashboard.security import SecurityHeaders
from plaita.store.client import Client


def create_app(
    config: DashboardConfig, *, start_monitor: bool = True, sampler_client: Client | None = None
) -> Starlette:
    """The ASGI app; with ``start_monitor`` the sampler runs for the app's lifetime."""
    dash = Dashboard(config, sampler_client=sampler_client)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if start_monitor:
            dash.monitor.start()
        try:
            yield
        finally:
            dash.close()

    app = Starlette(
        routes=[*routes.routes(dash), Mount("/static", StaticFiles(directory=HERE / "static"), name="static")],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=list(config.allowed_hosts), www_redirect=False),
        ],
        lifespan=lifespan,
    )
    app.state.dashboard = dash
    return app


__all__ = ["LOOPBACK_HOSTS", "TABS", "Dashboard", "DashboardConfig", "create_app"]
