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


class _StepReward:
    """A stand-in RAM whose reward is 1 exactly when the first glimpse's sampled x is right of the
    canvas centre: with the policy's mean at the centre, E[R] = Phi(mu_x / sigma), so moving that
    glimpse's mean one sigma toward an item on the right gains sigma * phi(0) / sigma = phi(0) =
    0.399 of reward (to first order), and the second glimpse, which the reward ignores, gains 0."""

    class hparams:
        num_glimpses = 2

    def current_std(self):
        return 0.3

    def policy_noise(self, policy, batch_size, like, generator):
        return torch.randn(2, batch_size, 2, generator=generator)

    def rollout(self, images, policy, noise, std):
        locations = (std * noise).clamp(-1, 1).transpose(0, 1)  # [B, T, 2]: the mean is the centre
        right = (locations[:, 0, 0] > 0).float()
        return {"logits": torch.stack([1 - right, right], -1), "locations": locations}


def test_reward_pull_measures_the_known_derivative_and_zero_where_the_reward_does_not_look():
    n, paths = 200, 64
    item = torch.tensor([[0.5, 0.0]]).expand(n, 2)  # to the right of every glimpse's mean
    steps = probe._reward_pull(_StepReward(), torch.zeros(n, 1, 4, 4), torch.ones(n, dtype=torch.long), item,
                               paths, torch.Generator().manual_seed(0))
    # the per-canvas mean baseline shrinks the estimate by (K - 1) / K
    expected = 0.3989 * (paths - 1) / paths
    assert steps[0]["reward_per_sigma"] == pytest.approx(expected, abs=4 * steps[0]["standard_error"] + 1e-3)
    assert abs(steps[1]["reward_per_sigma"]) < 4 * steps[1]["standard_error"] + 1e-3
    assert steps[0]["standard_error"] < 0.02 and steps[0]["path_std"] > 0
    # an item on the left reverses the first glimpse's pull
    left = probe._reward_pull(_StepReward(), torch.zeros(n, 1, 4, 4), torch.ones(n, dtype=torch.long), -item,
                              paths, torch.Generator().manual_seed(0))
    assert left[0]["reward_per_sigma"] == pytest.approx(-steps[0]["reward_per_sigma"], abs=2e-3)


def test_the_pull_of_a_models_own_return_scales_with_it_and_its_signal_to_noise_does_not():
    """A return that is twice the paper's reward pulls twice as hard, with the same signal-to-noise
    ratio; the return of the second glimpse alone (the first ignored) does not pull the first."""
    n, paths = 200, 32
    item = torch.tensor([[0.5, 0.0]]).expand(n, 2)

    def doubled(out, labels):
        return 2 * (out["logits"].argmax(-1) == labels).float()[:, None].expand(-1, 2)

    steps = probe._reward_pull(_StepReward(), torch.zeros(n, 1, 4, 4), torch.ones(n, dtype=torch.long), item,
                               paths, torch.Generator().manual_seed(0), own_returns=doubled)
    for step in steps:
        assert step["own"]["reward_per_sigma"] == pytest.approx(2 * step["reward_per_sigma"], abs=1e-6)
        assert step["own"]["snr_batch128"] == pytest.approx(step["snr_batch128"], rel=1e-5)
    assert steps[0]["snr_batch128"] > 1

    def blind(out, labels):
        return torch.rand(len(labels), 2, generator=torch.Generator().manual_seed(1))

    steps = probe._reward_pull(_StepReward(), torch.zeros(n, 1, 4, 4), torch.ones(n, dtype=torch.long), item,
                               paths, torch.Generator().manual_seed(0), own_returns=blind)
    assert abs(steps[0]["own"]["reward_per_sigma"]) < 4 * steps[0]["own"]["standard_error"] + 1e-3
