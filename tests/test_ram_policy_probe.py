"""scripts/ram_policy_probe.py: the read-out and the glimpse placement it relies on."""
import importlib.util
from pathlib import Path

import pytest
import torch

from test_ram import tiny

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ram_policy_probe.py"
spec = importlib.util.spec_from_file_location("ram_policy_probe", SCRIPT)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_read_out_scores_a_linear_code_one_and_noise_about_zero():
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(400, 16, generator=gen)
    offsets = states[:, :2] @ torch.tensor([[0.5, -0.2], [0.1, 0.3]]) + 0.1
    exact = probe._read_out(states, offsets, fit=300)
    assert exact["r2_x"] == pytest.approx(1.0) and exact["r2_y"] == pytest.approx(1.0) and exact["rmse"] < 1e-6
    noise = probe._read_out(states, torch.randn(400, 2, generator=gen), fit=300)
    assert noise["r2_x"] < 0.2 and noise["r2_y"] < 0.2


def test_glimpses_are_placed_where_asked():
    model = tiny().eval()
    images = torch.rand(3, 1, 20, 20)
    wanted = torch.rand(3, model.hparams.num_glimpses, 2) * 2 - 1
    seen = []
    hook = model.glimpse.register_forward_hook(lambda m, args, out: seen.append(args[1]))
    with torch.no_grad():
        probe._accuracy(model, images, torch.zeros(3, dtype=torch.long), wanted)
    hook.remove()
    assert torch.allclose(torch.stack(seen, 1), wanted, atol=1e-6)
