"""Attention scores and soft attention: each score equals its formula computed the slow way, and
soft attention respects padding (alpha 0, no effect on the context, no gradient into padding)."""
import math

import pytest
import torch
from helpers import trainable_through_softmax

from zoo.attention.scores import SCORES, build_score, tanh_via_sigmoid
from zoo.attention.soft import SoftAttention, masked_softmax

B, L, DK, DQ, A = 3, 5, 6, 4, 7


def slow_score(name, module, keys, query):
    """The textbook formula, one (image, location) pair at a time."""
    out = torch.zeros(keys.shape[0], keys.shape[1])
    for b in range(keys.shape[0]):
        for i in range(keys.shape[1]):
            k, q = keys[b, i], query[b]
            if name in ("dot", "scaled_dot"):
                qp = q if k.shape[0] == q.shape[0] else module.query_proj.weight @ q
                e = torch.dot(k, qp) / (math.sqrt(k.shape[0]) if name == "scaled_dot" else 1.0)
            elif name == "general":
                W = module.weight.weight  # [DQ, DK]: k^T W^T q
                e = k @ W.T @ q
            else:  # additive, the paper's f_att with tanh
                hidden = torch.tanh(module.key_proj.weight @ k + module.key_proj.bias + module.query_proj.weight @ q)
                e = module.out.weight[0] @ hidden + module.out.bias[0]
            out[b, i] = e
    return out


@pytest.mark.parametrize("name", SCORES)
@pytest.mark.parametrize("query_dim", [DK, DQ])
def test_score_matches_formula(name, query_dim):
    torch.manual_seed(0)
    module = build_score(name, DK, query_dim, attention_dim=A)
    keys, query = torch.randn(B, L, DK), torch.randn(B, query_dim)
    fast = module(module.project_keys(keys), query)
    assert fast.shape == (B, L)
    torch.testing.assert_close(fast, slow_score(name, module, keys, query), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module.score(keys, query), fast)


def test_tanh_via_sigmoid_is_tanh_with_and_without_autograd():
    x = torch.cat([torch.linspace(-30, 30, 2001), torch.tensor([0.0, 1e-8, -1e-8, 88.0, -88.0])])
    with torch.no_grad():
        torch.testing.assert_close(tanh_via_sigmoid(x.clone()), torch.tanh(x), rtol=0, atol=3e-7)
    leaf = x.clone().requires_grad_(True)
    y = tanh_via_sigmoid(leaf)
    torch.testing.assert_close(y, torch.tanh(x), rtol=0, atol=3e-7)
    y.sum().backward()
    torch.testing.assert_close(leaf.grad, 1 - torch.tanh(x) ** 2, rtol=0, atol=1e-6)
    # its hand-written backward, against finite differences (and a second backward through it)
    small = torch.linspace(-3, 3, 13, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(tanh_via_sigmoid, (small,))


def test_additive_score_under_no_grad_matches_formula_and_keeps_the_projected_keys():
    # Decoding runs without autograd, where the tanh works in place on its temporary: the
    # per-image projected keys, reused at every step, must come out untouched.
    torch.manual_seed(1)
    module = build_score("additive", DK, DQ, attention_dim=A)
    keys, query = torch.randn(B, L, DK), torch.randn(B, DQ)
    with torch.no_grad():
        projected = module.project_keys(keys)
        before = projected.clone()
        scores = module(projected, query)
        torch.testing.assert_close(scores, slow_score("additive", module, keys, query), rtol=1e-5, atol=1e-5)
    assert torch.equal(projected, before)


def test_unknown_score_and_missing_attention_dim():
    with pytest.raises(ValueError, match="unknown attention score"):
        build_score("cosine", DK, DQ, A)
    with pytest.raises(ValueError, match="attention_dim"):
        build_score("additive", DK, DQ)


def test_additive_uses_tanh_not_relu():
    # With all-negative pre-activations a ReLU MLP would give a constant score; tanh does not.
    module = build_score("additive", 1, 1, attention_dim=1)
    with torch.no_grad():
        module.key_proj.weight.fill_(1.0), module.key_proj.bias.fill_(-10.0)
        module.query_proj.weight.zero_(), module.out.weight.fill_(1.0), module.out.bias.zero_()
    keys = torch.tensor([[[-1.0], [-2.0]]])
    scores = module.score(keys, torch.zeros(1, 1))
    torch.testing.assert_close(scores, torch.tanh(torch.tensor([[-11.0, -12.0]])))


@pytest.mark.parametrize("name", SCORES)
def test_soft_attention_respects_padding(name):
    torch.manual_seed(1)
    score = build_score(name, DK, DQ, attention_dim=A)
    attend = SoftAttention(score)
    keys = torch.randn(B, L, DK)
    values = torch.randn(B, L, 3, requires_grad=True)
    query = torch.randn(B, DQ)
    valid = torch.tensor([L, 2, 4])
    mask = torch.arange(L)[None] < valid[:, None]
    # Garbage in the padding must change nothing.
    keys_garbage = torch.where(mask[..., None], keys, torch.full_like(keys, 1e4))
    context, alpha = attend(score.project_keys(keys_garbage), values, query, mask)
    assert alpha.shape == (B, L) and context.shape == (B, 3)
    assert torch.all(alpha[~mask] == 0)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(B))
    for b in range(B):  # reference: attention over the valid prefix only, no mask
        n = int(valid[b])
        ctx_b, alpha_b = attend(score.project_keys(keys[b:b + 1, :n]), values[b:b + 1, :n], query[b:b + 1])
        torch.testing.assert_close(alpha[b, :n], alpha_b[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(context[b], ctx_b[0], rtol=1e-5, atol=1e-6)
    context.sum().backward()
    assert torch.all(values.grad[~mask] == 0) and torch.all(values.grad[mask].abs().sum(-1) > 0)


def test_all_masked_row_gives_zeros_not_nan():
    scores = torch.randn(2, 4)
    mask = torch.tensor([[True, False, True, True], [False] * 4])
    alpha = masked_softmax(scores, mask)
    assert torch.isfinite(alpha).all() and torch.all(alpha[1] == 0)
    torch.testing.assert_close(alpha[0, [0, 2, 3]], torch.softmax(scores[0, [0, 2, 3]], -1))


def test_gradients_reach_score_parameters_and_query():
    torch.manual_seed(2)
    score = build_score("additive", DK, DQ, attention_dim=A)
    attend = SoftAttention(score)
    keys = torch.randn(B, L, DK)
    query = torch.randn(B, DQ, requires_grad=True)
    context, _ = attend(score.project_keys(keys), torch.randn(B, L, 3), query)
    context.pow(2).sum().backward()
    assert query.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(score))


def test_additive_score_training_path_equals_the_autograd_formula():
    """On CPU with autograd the additive score runs a hand-written forward/backward; its values
    and gradients (keys, query, every parameter) are those of w . tanh(W_k k + W_q q + b_k) + b."""
    from zoo.attention.scores import _AdditiveScoresCPU

    torch.manual_seed(2)
    module = build_score("additive", DK, DQ, attention_dim=A)
    keys = torch.randn(B, L, DK, requires_grad=True)
    query = torch.randn(B, DQ, requires_grad=True)
    weights = torch.randn(B, L)

    def formula():
        hidden = torch.tanh(module.key_proj(keys) + module.query_proj(query).unsqueeze(1))
        return module.out(hidden).squeeze(-1)

    results = []
    for fn in (formula, lambda: module.score(keys, query)):
        module.zero_grad()
        keys.grad = query.grad = None
        out = fn()
        (out * weights).sum().backward()
        results.append([out.detach(), keys.grad.clone(), query.grad.clone()]
                       + [p.grad.clone() for p in module.parameters()])
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    args = (torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(2, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(4, dtype=torch.float64, requires_grad=True), torch.randn(1, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(_AdditiveScoresCPU.apply, args)
