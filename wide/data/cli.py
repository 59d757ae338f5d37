"""``wide data <command>``: data tools (``generate``: self-generated training data, `wide.data.generate`;
``arithmetic``: synthetic arithmetic text, `wide.data.arithmetic`)."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

COMMANDS = {"generate": "sample continuations or chat answers from the dense model into jsonl shards",
            "arithmetic": "synthetic basic-arithmetic documents (scored items excluded) as a jsonl file"}


def data_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide data``; returns the exit status."""
    argv = list(sys.argv[2:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        listing = "\n".join(f"  {name:10s} {what}" for name, what in COMMANDS.items())
        stream = sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr
        print(f"usage: wide data <command> [options]\n\ncommands:\n{listing}", file=stream)
        return 0 if stream is sys.stdout else 2
    if argv[0] == "arithmetic":
        from wide.data.arithmetic import arithmetic_main

        return arithmetic_main(argv[1:])
    from wide.data.generate import generate_main

    return generate_main(argv[1:])
