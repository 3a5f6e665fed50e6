"""Batched beam search returns exactly what a simple per-image, per-hypothesis beam search returns."""
import pytest
import torch

from zoo.decoding import beam_search, greedy_decode
from zoo.decoding.search import tree_map

V, START, END = 9, 1, 2


class ToyModel:
    """A recurrent toy whose rows are computed independently (elementwise ops and row-wise softmax
    only), so one row gives the same bits whether it is decoded alone or in a batch of 320."""

    def __init__(self, n_images, seed=0, end_bias=None):
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(V, V, generator=g)
        self.table = torch.randn(V, V, generator=g) * 2
        self.images = torch.randn(n_images, V, generator=g)
        bias = torch.zeros(n_images, V)
        if end_bias is not None:
            bias[:, END] = torch.as_tensor(end_bias, dtype=torch.float32)
        self.bias = bias

    def init(self):
        state = (torch.zeros(len(self.images), V), torch.zeros(len(self.images)))
        return state, {"image": self.images, "bias": self.bias}

    def step(self, tokens, state, static):
        h, count = state
        h = torch.tanh(0.8 * h + self.embed[tokens] + static["image"])
        logits = 3 * h + self.table[tokens] + static["bias"]
        extras = {"alpha": torch.softmax(h, -1)[:, :4], "beta": torch.sigmoid(h[:, 0])}
        return torch.log_softmax(logits, -1), (h, count + 1), extras


def reference_beam(model, b, k, max_len, length_penalty, start=START, end=END):
    """One image, one hypothesis per step_fn call, Python lists: the obvious beam search.
    model: .init() -> (state, static), trees of [B, ...]; .step(tokens, state, static) -> (log_probs
    [N, V], state, extras). benchmarks/beam.py times it against the batched search."""
    state, static = model.init()
    state, static = tree_map(lambda x: x[b:b + 1], state), tree_map(lambda x: x[b:b + 1], static)
    beams = [dict(score=torch.tensor(0.0), tokens=[], finished=False, state=state, extras=[])]
    for _ in range(max_len):
        if all(beam["finished"] for beam in beams):
            break
        candidates = []
        for beam in beams:
            if beam["finished"]:
                candidates.append(beam)
                continue
            last = beam["tokens"][-1] if beam["tokens"] else start
            logp, new_state, extras = model.step(torch.tensor([last]), beam["state"], static)
            for v in range(logp.shape[-1]):
                candidates.append(dict(score=beam["score"] + logp[0, v], tokens=beam["tokens"] + [v],
                                       finished=v == end, state=new_state,
                                       extras=beam["extras"] + [extras]))
        candidates.sort(key=lambda c: -float(c["score"]))
        beams = candidates[:k]
    pool = [beam for beam in beams if beam["finished"]] or beams

    def normalised(beam):
        return beam["score"] / torch.tensor(float(len(beam["tokens"]))) ** length_penalty

    best = max(pool, key=lambda beam: float(normalised(beam)))
    words = best["tokens"][:-1] if best["finished"] else best["tokens"]
    extras = {n: torch.cat([e[n] for e in best["extras"][:len(words)]]) if words else None
              for n in ("alpha", "beta")}
    return words, float(best["score"]), best["finished"], extras


@pytest.mark.parametrize("beam_size", [1, 3, 5])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_batched_beam_equals_per_image_reference(beam_size, length_penalty):
    # Images 0-1 can never end (fallback), images 2-3 end eagerly, the rest are free.
    end_bias = [-1e4, -1e4, 2.0, 3.0, 0.0, 0.0, -1.0, 0.5]
    model = ToyModel(len(end_bias), seed=beam_size, end_bias=end_bias)
    state, static = model.init()
    results = beam_search(model.step, state, static, len(end_bias), beam_size, START, END, max_len=7,
                          length_penalty=length_penalty)
    assert len(results) == len(end_bias)
    assert not results[0].finished and not results[1].finished and len(results[0].tokens) == 7
    for b, result in enumerate(results):
        words, score, finished, extras = reference_beam(model, b, beam_size, 7, length_penalty)
        assert result.tokens == words, f"image {b}"
        assert result.finished == finished
        assert result.score == pytest.approx(score, abs=1e-5)
        assert result.extras["alpha"].shape == (len(words), 4)
        assert result.extras["beta"].shape == (len(words),)
        if words:
            torch.testing.assert_close(result.extras["alpha"], extras["alpha"])
            torch.testing.assert_close(result.extras["beta"], extras["beta"])


def test_greedy_equals_beam_one_and_check_every_changes_nothing():
    model = ToyModel(16, seed=7, end_bias=torch.linspace(-3, 2, 16))
    state, static = model.init()
    greedy = greedy_decode(model.step, state, static, 16, START, END, max_len=9)
    greedy_each_step = greedy_decode(model.step, state, static, 16, START, END, max_len=9, check_every=1)
    beam = beam_search(model.step, state, static, 16, 1, START, END, max_len=9, length_penalty=0.0)
    assert [r.tokens for r in greedy] == [r.tokens for r in beam] == [r.tokens for r in greedy_each_step]
    assert [r.finished for r in greedy] == [r.finished for r in beam]
    for g, b in zip(greedy, beam):
        assert g.score == pytest.approx(b.score, abs=1e-5)
        torch.testing.assert_close(g.extras["alpha"], b.extras["alpha"])


def test_fallback_when_no_beam_ends():
    model = ToyModel(3, seed=3, end_bias=[-1e4] * 3)
    state, static = model.init()
    for results in (beam_search(model.step, state, static, 3, 4, START, END, max_len=5),
                    greedy_decode(model.step, state, static, 3, START, END, max_len=5)):
        assert all(not r.finished and len(r.tokens) == 5 and END not in r.tokens for r in results)
        assert all(r.extras["alpha"].shape == (5, 4) for r in results)


def test_immediate_end_gives_empty_caption():
    model = ToyModel(2, seed=4, end_bias=[1e4, 1e4])
    state, static = model.init()
    for results in (beam_search(model.step, state, static, 2, 3, START, END, max_len=5),
                    greedy_decode(model.step, state, static, 2, START, END, max_len=5)):
        assert all(r.finished and r.tokens == [] and r.extras["alpha"].shape == (0, 4) for r in results)


def test_bad_arguments():
    model = ToyModel(1)
    state, static = model.init()
    with pytest.raises(ValueError):
        beam_search(model.step, state, static, 1, 0, START, END, max_len=5)
    with pytest.raises(ValueError):
        greedy_decode(model.step, state, static, 1, START, END, max_len=0)


def test_beam_search_drops_finished_images_and_stops_when_all_are_done():
    """Images leave the batch once their k beams have finished (the step function then sees only
    the others' rows), the search ends at the step the last image finishes, and neither changes
    any result."""
    end_bias = [1e4, 1e4, 0.0, 1e4, -1e4]  # eager enders; a free one; one that never ends
    model = ToyModel(len(end_bias), seed=11, end_bias=end_bias)
    state, static = model.init()
    rows_seen = []

    def counting_step(tokens, state, static):
        rows_seen.append(tokens.shape[0])
        return model.step(tokens, state, static)

    results = beam_search(counting_step, state, static, len(end_bias), 3, START, END, max_len=9)
    # after two steps the three eager images' beams have all ended: only 2 images x 3 beams run on
    assert len(rows_seen) == 9 and rows_seen[:3] == [15, 15, 6] and set(rows_seen[3:]) <= {6, 3}
    assert rows_seen == sorted(rows_seen, reverse=True)
    for b, result in enumerate(results):
        words, score, finished, extras = reference_beam(model, b, 3, 9, 1.0)
        assert result.tokens == words and result.finished == finished
        assert result.score == pytest.approx(score, abs=1e-5)
        if words:
            torch.testing.assert_close(result.extras["alpha"], extras["alpha"])
    lazy = beam_search(model.step, state, static, len(end_bias), 3, START, END, max_len=9, check_every=4)
    assert [r.tokens for r in lazy] == [r.tokens for r in results]
    assert [r.score for r in lazy] == pytest.approx([r.score for r in results])
    # every image ends at once: the search stops there, far before max_len
    model = ToyModel(4, seed=12, end_bias=[1e4] * 4)
    state, static = model.init()
    rows_seen.clear()
    assert all(r.tokens == [] for r in beam_search(counting_step, state, static, 4, 2, START, END, max_len=30))
    assert len(rows_seen) == 2  # step 1: beam 0 ends; step 2: the k copies' beam 1 ends
