"""strata's HTTP service: ``create_app(settings)`` and its routes (run it with ``strata serve``)."""

from strata.api.app import create_app

__all__ = ["create_app"]
