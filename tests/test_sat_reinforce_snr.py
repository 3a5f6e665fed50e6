"""scripts/sat_reinforce_snr.py: the REINFORCE gradient's signal and noise by way of charging samples."""
import importlib.util
import math
from pathlib import Path

import torch

from test_captioner import batch_of, tiny

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "sat_reinforce_snr.py"
spec = importlib.util.spec_from_file_location("sat_reinforce_snr", SCRIPT)
snr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snr)


def test_a_baseline_far_from_the_costs_buries_the_signal_and_leave_one_out_does_not():
    model = tiny("hard").eval()
    batches = [batch_of(B=6, T=6, seed=7)]
    with torch.no_grad():
        model.net.baseline.value.fill_(50.0)  # a moving average nowhere near these captions' costs
    table = snr.analyse(model, batches, draws=6)
    assert set(table) == set(snr.VARIANTS)
    assert all(math.isfinite(v) for row in table.values() for v in row.values())
    far, loo = table["caption/moving_average"], table["caption/leave_one_out"]
    assert far["noise"] > 10 * loo["noise"] and far["snr"] < loo["snr"]
