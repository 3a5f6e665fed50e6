"""Hard attention: the REINFORCE surrogate gives the authors' gradient and, in expectation over the
samples, the exact gradient of the expected cost (checked by enumerating every sample path)."""
import itertools
import math

import pytest
import torch
from helpers import trainable_through_softmax

from zoo.attention.hard import (ESTIMATORS, HardAttention, HardEstimator, HardSpec, MovingAverageBaseline,
                                build_estimator, discounted_cost, leave_one_out_baseline, marginal_log_prob,
                                reinforce_surrogate, sample_locations, straight_through_weights, vimco_signal)
from zoo.attention.scores import build_score


def test_reinforce_gradient_equals_exact_gradient_in_expectation():
    """Two steps over L=3 locations; step 2's distribution depends on step 1's sample; the cost
    depends on both. Summing (probability x surrogate gradient) over all 9 sample paths must give
    reward_scale x d E[cost] / d theta exactly, for any baseline."""
    torch.manual_seed(0)
    L = 3
    theta1 = torch.randn(L, requires_grad=True)
    theta2 = torch.randn(L, L, requires_grad=True)  # row s1: logits of step 2 given s1
    cost_table = torch.randn(L, L) * 2 + 3
    reward_scale, baseline = 0.1, torch.tensor(2.5)

    def log_alphas(s1):
        return torch.stack([torch.log_softmax(theta1, -1), torch.log_softmax(theta2[s1], -1)])  # [2, L]

    # Exact: d/dtheta of E[cost] = sum_paths p(path) cost(path).
    expected_cost = sum(log_alphas(s1)[0, s1].exp() * log_alphas(s1)[1, s2].exp() * cost_table[s1, s2]
                        for s1, s2 in itertools.product(range(L), repeat=2))
    exact = torch.autograd.grad(expected_cost, [theta1, theta2])

    # Estimator, averaged over every path with its (constant) probability.
    estimate = [torch.zeros_like(theta1), torch.zeros_like(theta2)]
    for s1, s2 in itertools.product(range(L), repeat=2):
        la = log_alphas(s1)
        prob = (la[0, s1] + la[1, s2]).exp().detach()
        surrogate = reinforce_surrogate(la.unsqueeze(0), torch.tensor([[s1, s2]]), cost_table[s1, s2].view(1),
                                        baseline, reward_scale=reward_scale, entropy_coef=0.0)
        for acc, g in zip(estimate, torch.autograd.grad(surrogate, [theta1, theta2])):
            acc += prob * g
    for e, x in zip(estimate, exact):
        torch.testing.assert_close(e, reward_scale * x, rtol=1e-5, atol=1e-6)


def test_surrogate_gradient_has_the_authors_form():
    """d/d alpha = (b - cost) * scale * (-onehot(s) / alpha) + lambda_e (log alpha + 1), averaged
    over the batch and summed over the real (unmasked) steps."""
    torch.manual_seed(1)
    B, T, L = 3, 4, 5
    alpha = torch.softmax(torch.randn(B, T, L), -1).requires_grad_(True)
    locations = torch.randint(0, L, (B, T))
    cost = torch.rand(B) * 5
    b, scale, lam = torch.tensor(1.7), 0.1, 0.002
    step_mask = torch.ones(B, T)
    step_mask[1, 2:] = 0
    surrogate = reinforce_surrogate(alpha.log(), locations, cost, b, step_mask, scale, lam)
    (grad,) = torch.autograd.grad(surrogate, alpha)
    onehot = torch.nn.functional.one_hot(locations, L).float()
    authors = (b - cost).view(B, 1, 1) * scale * (-onehot / alpha) + lam * (alpha.log() + 1)
    torch.testing.assert_close(grad, (authors * step_mask[..., None] / B).detach(), rtol=1e-5, atol=1e-7)


def test_surrogate_is_finite_with_masked_locations():
    scores = torch.randn(2, 1, 4, requires_grad=True)
    mask = torch.tensor([True, True, False, False])
    log_alpha = torch.log_softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), -1)
    surrogate = reinforce_surrogate(log_alpha, torch.tensor([[0], [1]]), torch.ones(2), 0.0)
    surrogate.backward()
    assert torch.isfinite(surrogate) and torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[..., 2:] == 0)


def test_baseline_moving_average():
    baseline = MovingAverageBaseline(0.9)
    assert float(baseline.value) == 0.0
    costs = [torch.tensor([1.0, 3.0]), torch.tensor([4.0, 4.0])]
    expected = 0.0
    for c in costs:
        baseline.update(c)
        expected = 0.9 * expected + 0.1 * float(c.mean())
    assert float(baseline.value) == pytest.approx(expected)
    assert "value" in baseline.state_dict()


def test_samples_follow_alpha_and_skip_masked_locations():
    alpha = torch.tensor([0.5, 0.3, 0.2, 0.0])
    log_alpha = torch.log(alpha).clamp(min=torch.finfo(torch.float32).min).expand(40000, 4)
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample_locations(log_alpha, gen), minlength=4).float() / 40000
    assert counts[3] == 0
    torch.testing.assert_close(counts, alpha, atol=0.01, rtol=0)


def test_modes_and_gradient_paths():
    torch.manual_seed(2)
    B, L, D = 4, 6, 3
    score = build_score("additive", D, 5, attention_dim=7)
    attend = HardAttention(score)
    keys = torch.randn(B, L, D)
    values = torch.randn(B, L, D, requires_grad=True)
    query = torch.randn(B, 5)
    out = attend(score.project_keys(keys), values, query, mode="sample")
    torch.testing.assert_close(out.context, values[torch.arange(B), out.location])
    out.context.sum().backward()
    # The sample blocks the path into the attention network; only REINFORCE may train it then.
    assert all(p.grad is None or torch.all(p.grad == 0) for p in score.parameters())
    assert values.grad.abs().sum() > 0
    argmax = attend(score.project_keys(keys), values, query, mode="argmax")
    assert torch.equal(argmax.location, argmax.alpha.argmax(-1))
    expected = attend(score.project_keys(keys), values, query, mode="expected")
    torch.testing.assert_close(expected.context, torch.einsum("bl,bld->bd", expected.alpha, values))
    expected.context.sum().backward()
    # The expected context trains the attention network by backprop (all but the output bias,
    # which the softmax ignores: its gradient is zero up to rounding).
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(score))
    assert score.out.bias.grad.abs().max() < 1e-5
    with pytest.raises(ValueError, match="mode"):
        attend(score.project_keys(keys), values, query, mode="soft")


def test_reinforce_learns_to_attend_to_the_rewarding_location():
    """A bandit: cost 0 at location 2, cost 1 elsewhere; REINFORCE + baseline finds location 2."""
    torch.manual_seed(3)
    logits = torch.zeros(1, 1, 5, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=2.0)
    baseline = MovingAverageBaseline(0.9)
    for _ in range(150):
        log_alpha = torch.log_softmax(logits, -1).expand(64, 1, 5)
        s = sample_locations(log_alpha[:, 0].detach()).unsqueeze(1)
        cost = (s[:, 0] != 2).float()
        loss = reinforce_surrogate(log_alpha, s, cost, baseline.value, reward_scale=1.0, entropy_coef=0.002)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        baseline.update(cost)
    assert torch.softmax(logits, -1)[0, 0, 2] > 0.9


# ----------------------------------------------------------------------------- the other estimators (issue 33)
def test_vimco_signal_equals_the_formula_computed_by_a_loop():
    """Mnih & Rezende 2016: L = log (1/K) sum_k f_k; signal_j = L - log (1/K)(sum_{k != j} f_k + fhat_j),
    fhat_j the geometric mean of the others; the bound's gradient through log f_j is w_j = f_j / sum f."""
    torch.manual_seed(4)
    B, K = 3, 4
    log_f = (torch.randn(B, K) * 3 - 10).requires_grad_(True)
    bound, signal = vimco_signal(log_f)
    for b in range(B):
        f = [math.exp(v) for v in log_f[b].tolist()]
        L = math.log(sum(f) / K)
        assert bound[b].item() == pytest.approx(L, rel=1e-5)
        for j in range(K):
            others = [k for k in range(K) if k != j]
            fhat = math.exp(sum(math.log(f[k]) for k in others) / (K - 1))
            want = L - math.log((sum(f[k] for k in others) + fhat) / K)
            assert signal[b, j].item() == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert not signal.requires_grad
    (grad,) = torch.autograd.grad(bound.sum(), log_f)
    torch.testing.assert_close(grad, torch.softmax(log_f.detach(), 1))


def test_vimco_gradient_equals_the_bound_s_exact_gradient_in_expectation():
    """K = 2 paths of one step over L = 3 cells: summing (probability x VIMCO's gradient) over all 9
    pairs of samples gives exactly d/d(theta, phi) of E[log (1/2)(f(z_1) + f(z_2))], theta the
    attention's logits and phi those of p(y | z)."""
    torch.manual_seed(5)
    L, K = 3, 2
    theta = torch.randn(L, requires_grad=True)
    phi = torch.randn(L, 4, requires_grad=True)  # p(y | z) over 4 words; the caption is word 1

    def log_f(z):
        return torch.log_softmax(phi[z], -1)[1]

    log_q = torch.log_softmax(theta, -1)
    exact_objective = sum(log_q[z1].exp() * log_q[z2].exp() * torch.log((log_f(z1).exp() + log_f(z2).exp()) / K)
                          for z1, z2 in itertools.product(range(L), repeat=2))
    exact = torch.autograd.grad(exact_objective, [theta, phi])
    estimate = [torch.zeros_like(theta), torch.zeros_like(phi)]
    for z1, z2 in itertools.product(range(L), repeat=2):
        log_q = torch.log_softmax(theta, -1)
        prob = (log_q[z1] + log_q[z2]).exp().detach()
        bound, signal = vimco_signal(torch.stack([log_f(z1), log_f(z2)]).unsqueeze(0))
        surrogate = bound.sum() + (signal[0] * torch.stack([log_q[z1], log_q[z2]])).sum()
        for acc, g in zip(estimate, torch.autograd.grad(surrogate, [theta, phi])):
            acc += prob * g
    for e, x in zip(estimate, exact):
        torch.testing.assert_close(e, x, rtol=1e-5, atol=1e-6)


def test_leave_one_out_baseline_is_the_mean_of_the_other_paths():
    cost = torch.rand(2, 3, 5)
    want = torch.stack([torch.stack([sum(cost[b, k] for k in range(3) if k != j) / 2 for j in range(3)])
                        for b in range(2)])
    torch.testing.assert_close(leave_one_out_baseline(cost), want)


def test_marginal_log_prob_equals_an_explicit_sum_over_cells():
    torch.manual_seed(6)
    log_alpha = torch.log_softmax(torch.randn(2, 5), -1)
    cell_log_probs = torch.log_softmax(torch.randn(2, 5, 7), -1)
    got = marginal_log_prob(log_alpha, cell_log_probs)
    for b in range(2):
        for v in range(7):
            want = math.log(sum(math.exp(log_alpha[b, i].item() + cell_log_probs[b, i, v].item()) for i in range(5)))
            assert got[b, v].item() == pytest.approx(want, rel=1e-5)
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(2))  # still a distribution over words


def test_straight_through_is_one_hot_forward_with_the_soft_gradient():
    torch.manual_seed(7)
    logits = torch.randn(4, 6, requires_grad=True)
    gumbel = -torch.empty(4, 6).exponential_().log()
    tau, upstream = 0.5, torch.randn(4, 6)
    weights = straight_through_weights(torch.log_softmax(logits, -1), gumbel, tau)
    sample = (torch.log_softmax(logits, -1) + gumbel).argmax(-1)
    assert torch.equal(weights.detach(), torch.nn.functional.one_hot(sample, 6).float())
    (grad,) = torch.autograd.grad((weights * upstream).sum(), logits)
    soft = torch.softmax((torch.log_softmax(logits, -1) + gumbel) / tau, -1)
    (want,) = torch.autograd.grad((soft * upstream).sum(), logits)
    torch.testing.assert_close(grad, want)


def test_discounted_cost_sums_the_later_words_discounted():
    nll = torch.rand(3, 5)
    gamma = 0.7
    expected = torch.tensor([[sum(gamma ** (s - t) * nll[b, s].item() for s in range(t, 5)) for t in range(5)]
                             for b in range(3)])
    assert torch.allclose(discounted_cost(nll, gamma), expected, atol=1e-6)
    assert torch.equal(discounted_cost(nll, 0.0), nll)  # no discount: each word's own NLL


def test_a_new_estimator_is_one_class_that_the_captioner_runs_by_name():
    """The relaxed Gumbel-softmax (Jang et al. 2017, eq. 1), added as its class in zoo.attention.hard
    alone: registered by name, its step weights are softmax((log alpha + g) / tau), and a captioner
    whose config names it trains with that mixture as each word's context (checked step by step on
    the decoder whose sample reaches only its own word) and its attention learns by backprop."""
    from zoo.data.vocab import SPECIALS
    from zoo.models.captioner import Captioner

    spec = HardSpec(estimator="gumbel_softmax", gumbel_temperature=0.5, entropy_coef=0.0)
    estimator = build_estimator(spec)
    assert type(estimator) is ESTIMATORS["gumbel_softmax"] and estimator.train_mode == "sample"
    log_alpha = torch.randn(3, 5).log_softmax(-1)
    noise = -torch.empty(3, 5).exponential_(generator=torch.Generator().manual_seed(0)).log()
    torch.testing.assert_close(estimator.step_weights(log_alpha, noise), torch.softmax((log_alpha + noise) / 0.5, -1))
    torch.manual_seed(0)
    model = Captioner(vocab=[*SPECIALS, "a", "red", "shirt"], attention="hard", image_size=[32, 32],
                      hard=spec.to_dict(),
                      decoder=dict(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0, attention_query="current",
                                   feed_context=False),
                      backbone={"kind": "stem", "in_chans": 3, "channels": [8], "strides": [8]}).train()
    net, captions = model.net, torch.tensor([[1, 4, 5, 6, 2], [1, 6, 2, 0, 0]])
    annotations = net.encode(torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)))[0]
    gumbel = -torch.empty(2, 4, annotations.shape[1]).exponential_(generator=torch.Generator().manual_seed(2)).log()
    fast = net.teacher_forced(annotations, captions, gumbel, torch.tensor(False))
    projected, (h, c) = net.attend.score.project_keys(annotations), net.init_state(annotations)
    for t in range(4):
        out = net.step(captions[:, t], h, c, projected, annotations, "expected")
        h, c = out["h"], out["c"]
        log_alpha = net.attend(projected, annotations, h, mode="expected").log_alpha
        weights = torch.softmax((log_alpha + gumbel[:, t]) / 0.5, -1)
        z = torch.sigmoid(net.f_beta(h)) * torch.einsum("bl,bld->bd", weights, annotations)
        assert torch.equal(fast["location"][:, t], (log_alpha + gumbel[:, t]).argmax(-1))
        torch.testing.assert_close(fast["logits"][:, t], net.output(net.embed(captions[:, t]), h, z),
                                   rtol=1e-5, atol=1e-5)
    fast["logits"].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable_through_softmax(net.attend.score))
