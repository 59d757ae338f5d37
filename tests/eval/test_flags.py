"""`wide eval`'s routing flags are generated from `WideConfig`: every field is a flag with its docstring as help, a
field added to the class shows up without a second declaration, and values parse by the field's type."""

import ast
import dataclasses
import inspect
import textwrap
from typing import Optional

import pytest

import wide.config
from wide.config import WideConfig
from wide.eval.cli import build_parser, routing_flags_given, routing_from_args


def _field_docstrings(cls) -> dict[str, str]:
    """The docstring under each field, read from the class's source (not through the code under test)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _help() -> str:
    return " ".join(build_parser().format_help().split())  # unwrapped: docstrings compare as one line


def test_help_lists_every_wideconfig_field_with_its_docstring():
    docs = _field_docstrings(WideConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(WideConfig)}, "every field carries a docstring"
    text = _help()
    for name, doc in docs.items():
        assert "--" + name.replace("_", "-") + " " in text, name
        assert doc.replace("- ", "-") in text.replace("- ", "-"), name  # argparse may break a line after a hyphen


def test_a_new_wideconfig_field_becomes_a_flag_without_a_second_declaration(monkeypatch):
    @dataclasses.dataclass
    class Extended(WideConfig):
        probe_knob: Optional[int] = None
        """A throw-away field that only this test declares."""

    monkeypatch.setattr(wide.config, "WideConfig", Extended)
    text = _help()
    assert "--probe-knob PROBE_KNOB" in text and "A throw-away field that only this test declares." in text
    args = build_parser().parse_args(["--probe-knob", "7", "--sparsity", "0.25"])
    assert routing_flags_given(args) == ["--sparsity", "--probe-knob"] and args.probe_knob == 7


def test_flags_keep_their_names_and_values():
    args = build_parser().parse_args(["smollm2-135m", "--router", "topk", "--sparsity", "0.5", "--limit", "200",
                                      "--attn-group-size", "2", "--ffn-group-size", "32", "--dense-layers", "0,-1",
                                      "--targets", "ffn", "--attn-sparsity", "0.3", "--router-rank", "8"])
    cfg = routing_from_args(args)
    assert (cfg.router, cfg.sparsity, cfg.attn_group_size, cfg.ffn_group_size, cfg.dense_layers, cfg.targets,
            cfg.attn_sparsity, cfg.router_rank) == ("topk", 0.5, 2, 32, [0, -1], "ffn", 0.3, 8)
    assert args.limit == 200 and args.model == "smollm2-135m"
    assert routing_from_args(build_parser().parse_args([])) is None  # no routing flag: the dense model
    assert routing_from_args(build_parser().parse_args(["--dense-layers", "[1]"])).dense_layers == [1]
    measured = routing_from_args(build_parser().parse_args(["--sparsity-measure", "weight"]))
    assert measured.sparsity_measure == "weight"  # a field the hand-written flags never had


def test_flags_override_the_routing_mapping():
    args = build_parser().parse_args(["--routing", '{"router": "topk", "sparsity": 0.25, "ffn_group_size": 32}',
                                      "--sparsity", "0.75"])
    cfg = routing_from_args(args)
    assert (cfg.router, cfg.sparsity, cfg.ffn_group_size) == ("topk", 0.75, 32)
    assert routing_flags_given(args) == ["--routing", "--sparsity"]


def test_a_class_path_router_flag_builds_the_router_class():
    from wide.routers import LinearRouter

    spec = '{"class_path": "wide.routers.LinearRouter", "init_args": {"normalize": false}}'
    router = routing_from_args(build_parser().parse_args(["--router", spec])).router
    assert router.func is LinearRouter and router.keywords == {"normalize": False}


@pytest.mark.parametrize("args,message", [
    (["--sparsity", "abc"], "argument --sparsity: expected float, got 'abc'"),
    (["--targets", "both"], "argument --targets: expected one of 'all', 'attention', 'ffn', got 'both'"),
    (["--dense-layers", "0,x"], "argument --dense-layers: expected a comma list of int, got '0,x'"),
    (["--ffn-group-size", "1.5"], "argument --ffn-group-size: expected int, got '1.5'"),
], ids=["float", "literal", "list", "int"])
def test_bad_values_are_one_line_naming_the_flag(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1] == f"wide eval: error: {message}"
