"""engine.maths.gates: the per-seed training gate against chance level."""

import pandas as pd
import pytest

from engine.maths import gates


def _rows(accs: dict) -> pd.DataFrame:
    return pd.DataFrame([{"arch": a, "width": w, "seed": s, "train_acc": v}
                         for (a, w), vs in accs.items() for s, v in enumerate(vs)])


@pytest.mark.parametrize("c, acc, near", [(10, 0.199, True), (10, 0.20, True), (10, 0.201, False),
                                          (2, 0.59, True), (2, 0.61, False), (3, 0.40, True)])
def test_near_chance_is_within_ten_points_of_one_over_c(c, acc, near):
    assert gates.near_chance(acc, c) is near


def test_the_worst_seed_decides_not_the_mean():
    rows = _rows({("relu", 64): [0.99, 0.98, 0.97], ("attn", 64): [0.60, 0.55, 0.15],
                  ("attn", 256): [0.25, 0.30, 0.35]})
    out = gates.untrained(rows, 10)
    assert list(zip(out["arch"], out["width"], strict=True)) == [("attn", 64)]   # mean 0.43 would pass; one seed at 15 %
    assert out.loc[0, "worst"] == 0.15 and out.loc[0, "nets"] == 3 and out.loc[0, "chance"] == 0.1
    assert out.loc[0, "mean"] == pytest.approx((0.60 + 0.55 + 0.15) / 3)


def test_groups_follow_the_columns_present_and_an_empty_frame_passes():
    rows = _rows({("attn", 64): [0.12]}).drop(columns="width")
    assert list(gates.untrained(rows, 10)["arch"]) == ["attn"]
    assert gates.untrained(rows.iloc[:0], 10).empty
    assert gates.untrained(pd.DataFrame({"arch": ["relu"]}), 10).empty   # no accuracy measured: nothing flagged
    with pytest.raises(ValueError, match="2 classes"):
        gates.chance_level(1)
