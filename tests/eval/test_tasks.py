"""Prompts, continuations and gold indices match lm-eval's default task configs; acc / acc_norm as lm-eval scores them."""

import pytest

from wide.eval.tasks import DEFAULT_TASKS, TASKS, hellaswag_preprocess, load_questions, parse_tasks
from wide.eval.zeroshot import score_questions


def q(task, doc):
    return TASKS[task].to_question(doc)


def test_seven_tasks_in_paper_order_with_lm_eval_metrics():
    assert DEFAULT_TASKS == ("arc_easy", "arc_challenge", "boolq", "winogrande", "piqa", "openbookqa", "hellaswag")
    assert {t: TASKS[t].metrics for t in ("boolq", "winogrande")} == {"boolq": ("acc",), "winogrande": ("acc",)}
    assert all(TASKS[t].metrics == ("acc", "acc_norm") for t in ("arc_easy", "arc_challenge", "piqa", "openbookqa",
                                                                "hellaswag"))
    assert [TASKS[t].headline for t in DEFAULT_TASKS] == ["acc_norm", "acc_norm", "acc", "acc", "acc_norm", "acc_norm",
                                                         "acc_norm"]


def test_arc_prompt():
    doc = {"question": "Which is a gas?", "choices": {"text": ["ice", "steam"], "label": ["1", "2"]}, "answerKey": "2"}
    out = q("arc_easy", doc)
    assert out.contexts == ("Question: Which is a gas?\nAnswer:",) * 2
    assert out.continuations == (" ice", " steam") and out.gold == 1 and out.norm_texts == ("ice", "steam")


def test_boolq_prompt_and_gold_from_bool_answer_or_label():
    doc = {"passage": "Water boils at 100 C.", "question": "does water boil at 100 c", "answer": True}
    out = q("boolq", doc)
    assert out.contexts[0] == "Water boils at 100 C.\nQuestion: does water boil at 100 c?\nAnswer:"
    assert out.continuations == (" no", " yes") and out.gold == 1
    assert q("boolq", {**doc, "label": 0}).gold == 0


def test_winogrande_partial_scoring():
    doc = {"sentence": "Sarah was a better surgeon than Maria so _ got the easier cases.", "option1": "Sarah",
           "option2": "Maria", "answer": "2"}
    out = q("winogrande", doc)
    assert out.contexts == ("Sarah was a better surgeon than Maria so Sarah",
                            "Sarah was a better surgeon than Maria so Maria")
    assert out.continuations == (" got the easier cases.",) * 2 and out.gold == 1


def test_piqa_and_openbookqa_prompts():
    out = q("piqa", {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0})
    assert out.contexts[0] == "Question: Open a jar\nAnswer:" and out.continuations == (" twist the lid", " eat the lid")
    doc = {"question_stem": "The sun is a", "choices": {"text": ["star", "planet"], "label": ["A", "B"]},
           "answerKey": " A"}
    out = q("openbookqa", doc)
    assert out.contexts == ("The sun is a",) * 2 and out.continuations == (" star", " planet") and out.gold == 0


def test_hellaswag_preprocess_and_prompt():
    assert hellaswag_preprocess(" A man [title] Step one [step] goes  on. ") == "A man. Step one goes on."
    doc = {"activity_label": "Roof shingle removal", "ctx_a": "A man is on a roof.", "ctx_b": "he",
           "endings": ["is ripping tiles [step] off.", "sings."], "label": "0"}
    out = q("hellaswag", doc)
    assert out.contexts[0] == "Roof shingle removal: A man is on a roof. He"
    assert out.continuations == (" is ripping tiles off.", " sings.") and out.norm_texts == ("is ripping tiles off.",
                                                                                            "sings.")


def test_acc_and_acc_norm():
    out = q("arc_easy", {"question": "?", "choices": {"text": ["a", "bbbbbbbbbb"], "label": ["A", "B"]},
                         "answerKey": "B"})
    # raw log-likelihood prefers the short choice; per character the long one wins
    assert score_questions([out], [(-2.0, False), (-5.0, False)]) == {"acc": 0.0, "acc_norm": 1.0}
    # ties go to the first choice, like numpy.argmax
    assert score_questions([out], [(-1.0, False), (-1.0, False)])["acc"] == 0.0


def test_parse_tasks():
    assert parse_tasks("all") == list(DEFAULT_TASKS) and parse_tasks(None) == list(DEFAULT_TASKS)
    assert parse_tasks("none") == [] and parse_tasks("") == []
    assert parse_tasks("obqa,arc-e,piqa") == ["openbookqa", "arc_easy", "piqa"]
    with pytest.raises(ValueError, match="hellaswag"):
        parse_tasks("helaswag")


def test_load_questions_from_saved_dataset(olmo_cache):
    qs = load_questions("hellaswag", limit=3)
    assert len(qs) == 3 and all(len(x.continuations) == 4 for x in qs)
    assert all("[step]" not in c for x in qs for c in x.continuations)
    with pytest.raises(ValueError, match="limit"):
        load_questions("piqa", limit=0)
