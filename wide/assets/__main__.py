"""``python -m wide.assets``: the same as ``wide assets``."""

from wide.assets.cli import assets_main

raise SystemExit(assets_main())
