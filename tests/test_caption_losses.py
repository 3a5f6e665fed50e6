"""zoo.models.caption_losses against slow, obvious references."""
import math

import pytest
import torch

from zoo.models import caption_losses as losses


def test_doubly_stochastic_is_eq_14_over_real_steps():
    alpha = torch.rand(2, 4, 3).softmax(-1)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    expected = sum(sum((1 - sum(alpha[b, t, i].item() for t in range(4) if mask[b, t])) ** 2 for i in range(3))
                   for b in range(2)) / 2
    assert losses.doubly_stochastic(alpha, mask).item() == pytest.approx(expected, rel=1e-5)


def test_caption_nll_masks_pads():
    logits, targets = torch.randn(2, 3, 5), torch.tensor([[1, 2, 0], [3, 0, 0]])
    mask = (targets != 0).float()
    nll = losses.caption_nll(logits, targets, mask)
    assert nll[0, 2] == 0 and nll[1, 1] == 0 and nll[1, 2] == 0
    assert nll[0, 0].item() == pytest.approx(-logits[0, 0].log_softmax(-1)[1].item(), rel=1e-5)


@pytest.mark.parametrize("target", ["box", "mass"])
def test_supervised_attention_on_a_hand_case(target):
    # one caption, 4 cells, 2 items: item 0 covers cells 0-1, item 1 cell 3; steps name item 0, nothing, item 1
    alpha = torch.tensor([[[0.4, 0.2, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25], [0.1, 0.1, 0.1, 0.7]]])
    masks = torch.tensor([[[True, True, False, False], [False, False, False, True]]])
    word_items = torch.tensor([[-1, 0, -1, 1]])  # per token; token 0 is <start>
    loss = losses.supervised_attention(alpha.log(), masks, word_items, torch.ones(1, 3), target)
    if target == "box":
        expected = -(0.5 * math.log(0.4) + 0.5 * math.log(0.2)) - math.log(0.7)
    else:
        expected = -math.log(0.6) - math.log(0.7)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
