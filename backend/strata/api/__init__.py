"""strata's HTTP service: ``create_app(settings)`` and its routes (run it with ``strata serve``).

``create_app`` is imported on first use (PEP 562): a worker of ``strata serve --workers N`` imports
``strata.api.connections`` to unpickle its config before it answers uvicorn's health check, and must not pay
for the engine's imports first (seconds on a loaded machine, past the check's 5 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strata.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from strata.api import app

        return getattr(app, name)
    raise AttributeError(f"module 'strata.api' has no attribute {name!r}")
