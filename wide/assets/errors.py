"""What fetching an asset raises."""

from __future__ import annotations


class AssetError(RuntimeError):
    """Base class for asset failures."""


class AssetUnavailableError(AssetError):
    """A wheel could not be obtained (offline, PyPI down, pip failed) and is not cached."""


class AssetIntegrityError(AssetError, ValueError):
    """A downloaded wheel or an extracted file does not match its pinned sha256."""
