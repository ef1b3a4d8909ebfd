"""A timing message quotes one spread for one history: the one it measured."""
import math
import re

from pytest_mgpu.timing import messages


def _learning(n, spread):
    return {"median_s": 0.011, "history_median_s": 0.01,
            "verdict": {"status": "learning", "x": 0.1, "n_history": n, "center": 0.0, "spread": spread}}


def test_a_learning_history_quotes_its_own_spread_only():
    text = messages.describe(_learning(4, math.log(1.185)))
    assert re.findall(r"(\d+(?:\.\d+)?)% spread|spread (\d+(?:\.\d+)?)%", text) == [("", "18.5")], text
    assert "at this spread 4 launches see only slowdowns above +" in text


def test_one_launch_quotes_no_spread_of_its_own():
    text = messages.describe(_learning(1, 0.01))
    assert "(spread - sd of" in text
    assert "a single launch has no spread between launches" in text
