"""The router registry."""

from __future__ import annotations

from wide.registry import Registry
from wide.routers.base import Router

ROUTERS: Registry[Router] = Registry("router", Router)


def register_router(name: str):
    """Class decorator: ``@register_router("name")`` makes a ``Router`` subclass selectable by name."""
    return ROUTERS.register(name)
