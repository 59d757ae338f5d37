"""The policy registry."""

from __future__ import annotations

from wide.policies.base import Policy
from wide.registry import Registry

POLICIES: Registry[Policy] = Registry("policy", Policy)


def register_policy(name: str):
    """Class decorator: ``@register_policy("name")`` makes a ``Policy`` subclass selectable by name."""
    return POLICIES.register(name)
