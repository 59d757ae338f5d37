import pytest

from wide.data.corpus import split_documents, split_indices


def test_split_is_fixed_by_content(docs):
    train, val = split_documents(docs, val_fraction=0.1)
    assert len(val) == 4 and len(train) == 36 and not set(train) & set(val)
    # independent of document order, and of anything but the contents
    rev_train, rev_val = split_documents(docs[::-1], val_fraction=0.1)
    assert set(rev_val) == set(val) and set(rev_train) == set(train)
    # order inside each split follows the source
    train_idx, val_idx = split_indices(docs, val_fraction=0.1)
    assert train_idx == sorted(train_idx) and val_idx == sorted(val_idx)


def test_smaller_fraction_holds_out_a_subset(docs):
    small = set(split_documents(docs, val_fraction=0.1)[1])
    large = set(split_documents(docs, val_fraction=0.3)[1])
    assert small < large


def test_val_docs_and_zero(docs):
    assert len(split_documents(docs, val_docs=7)[1]) == 7
    assert split_documents(docs, val_fraction=0.0) == (docs, [])
    assert len(split_documents(docs[:3], val_fraction=0.01)[1]) == 1  # never rounds down to none


@pytest.mark.parametrize(
    "kwargs, field",
    [
        pytest.param({"val_fraction": 1.0}, "val_fraction", id="fraction-one"),
        pytest.param({"val_fraction": -0.1}, "val_fraction", id="fraction-negative"),
        pytest.param({"val_docs": -1}, "val_docs", id="count-negative"),
        pytest.param({"val_docs": 40}, "val_docs", id="nothing-left"),
    ],
)
def test_bad_split_names_the_field(docs, kwargs, field):
    with pytest.raises(ValueError, match=field):
        split_indices(docs, **kwargs)
