"""Batched greedy decoding and batched beam search over B x k hypotheses: one step-function call per
time step for all images and beams; the only host syncs are the "is everything finished?" check
(every `check_every` steps) and the final conversion to lists. Beam search drops the images whose
beams have all finished, so a batch costs what its images' own searches cost.

Beam search (tests/test_decoding.py holds a per-image reference with the same rules): each image
keeps k hypotheses ranked by summed log-probability; a hypothesis that emits <end> stays in the
beam with its score frozen, competing for the k slots; the search stops when every beam is
finished or after `max_len` steps; the answer is the finished hypothesis with the best
`score / length ** length_penalty` (length counts the words and <end>), else the best unfinished
one (`finished=False`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

StepFn = Callable[[torch.Tensor, Any, Any], tuple[torch.Tensor, Any, dict]]


@dataclass
class DecodeResult:
    tokens: list[int]  # the words' ids, without <start> and <end>
    score: float  # summed log-probability (including the <end> step when finished)
    finished: bool  # False when the hypothesis was cut at max_len
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [n_words, ...]


def tree_map(fn: Callable[[torch.Tensor], torch.Tensor], tree: Any) -> Any:
    if tree is None:
        return None
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        mapped = [tree_map(fn, v) for v in tree]
        return type(tree)(*mapped) if hasattr(tree, "_fields") else type(tree)(mapped)
    return tree


def _results(tokens: list[torch.Tensor], n_words: torch.Tensor, scores: torch.Tensor, finished: torch.Tensor,
             extras: list[dict[str, torch.Tensor]]) -> list[DecodeResult]:
    """Per step (T >= 1) tokens [B] and extras name -> [B, ...]; n_words, scores, finished [B]
    -> one result per image."""
    extras = {name: torch.stack([e[name] for e in extras], dim=1) for name in extras[0]}  # [B, T, ...]
    tokens_list, n_list = torch.stack(tokens, dim=1).tolist(), n_words.tolist()
    score_list, finished_list = scores.tolist(), finished.tolist()
    return [DecodeResult(tokens_list[b][:n_list[b]], score_list[b], bool(finished_list[b]),
                         {name: value[b, :n_list[b]] for name, value in extras.items()})
            for b in range(len(n_list))]


@torch.no_grad()
def greedy_decode(step_fn: StepFn, state: Any, static: Any, batch_size: int, start_id: int, end_id: int,
                  max_len: int, check_every: int = 1) -> list[DecodeResult]:
    """Pick the most likely word at every step, for B images at once. state/static: trees of [B, ...]."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    device = _device_of(state, static)
    tokens = torch.full((batch_size,), start_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    n_words = torch.zeros(batch_size, dtype=torch.long, device=device)
    scores = torch.zeros(batch_size, device=device)
    out_tokens, out_extras = [], []
    for t in range(max_len):
        log_probs, state, extras = step_fn(tokens, state, static)  # [B, V]
        step_logp, tokens = log_probs.max(dim=-1)
        scores = scores + torch.where(finished, torch.zeros_like(step_logp), step_logp)
        ended = tokens == end_id
        n_words = n_words + (~finished & ~ended).long()
        finished = finished | ended
        out_tokens.append(tokens)
        out_extras.append(extras)
        if (t + 1) % check_every == 0 and bool(finished.all()):
            break
    return _results(out_tokens, n_words, scores, finished, out_extras)


@torch.no_grad()
def beam_search(step_fn: StepFn, state: Any, static: Any, batch_size: int, beam_size: int, start_id: int,
                end_id: int, max_len: int, length_penalty: float = 1.0, check_every: int = 1) -> list[DecodeResult]:
    """Beam search for B images at once over B * k rows. state/static: trees of [B, ...]. Between
    the checks for finished images (a host sync every `check_every` steps) finished beams continue
    with <end> at no cost, which changes nothing in the result."""
    if beam_size < 1 or max_len < 1:
        raise ValueError(f"beam_size and max_len must be >= 1, got {beam_size}, {max_len}")
    B, k = batch_size, beam_size
    device = _device_of(state, static)
    expand = lambda x: x.repeat_interleave(k, dim=0)  # noqa: E731  [B, ...] -> [B * k, ...]
    state, static = tree_map(expand, state), tree_map(expand, static)
    beams = torch.arange(k, device=device)
    tokens = torch.full((B * k,), start_id, dtype=torch.long, device=device)
    # Only beam 0 is alive at the start, so the k copies of <start> do not fill the beam with clones.
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    finished = torch.zeros(B, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, k, dtype=torch.long, device=device)  # tokens emitted, <end> included
    alive = torch.arange(B, device=device)  # the images still searching; rows alive*k .. alive*k+k-1
    n_alive = B
    token_hist, parent_hist, extras_hist = [], [], []
    for t in range(max_len):
        log_probs, state, extras = step_fn(tokens, state, static)  # [A * k, V], A = images alive
        V = log_probs.shape[-1]
        log_probs = log_probs.view(n_alive, k, V)
        was_finished = finished[alive]  # [A, k]
        # A finished hypothesis continues with <end> at no cost: its score is frozen.
        frozen = torch.full_like(log_probs, float("-inf"))
        frozen[..., end_id] = 0.0
        log_probs = torch.where(was_finished.unsqueeze(-1), frozen, log_probs)
        candidates = (scores[alive].unsqueeze(-1) + log_probs).view(n_alive, k * V)
        top, index = candidates.topk(k, dim=1)  # [A, k], sorted best first
        parent, token = index // V, index % V
        parent_finished = was_finished.gather(1, parent)
        scores[alive] = top
        lengths[alive] = lengths[alive].gather(1, parent) + (~parent_finished).long()
        finished[alive] = parent_finished | (token == end_id)
        rows = (torch.arange(n_alive, device=device).unsqueeze(1) * k + parent).view(-1)  # parents' rows [A * k]
        state = tree_map(lambda x: x.index_select(0, rows), state)
        # history at full batch size: an image that left keeps its beams (parent = itself, <end>)
        full_token = torch.full((B, k), end_id, dtype=torch.long, device=device).index_copy_(0, alive, token)
        full_parent = beams.expand(B, k).index_copy(0, alive, parent)
        token_hist.append(full_token)
        parent_hist.append(full_parent)
        extras_hist.append({name: value.new_zeros(B, k, *value.shape[1:]).index_copy_(
            0, alive, value.index_select(0, rows).view(n_alive, k, *value.shape[1:]))
            for name, value in extras.items()})
        tokens = token.view(-1)
        if (t + 1) % check_every == 0:
            searching = ~finished[alive].all(dim=1)  # [A]
            keep = searching.nonzero().squeeze(1)  # the step's one host sync
            if keep.numel() == 0:
                break
            if keep.numel() < n_alive:  # some images are done: their rows leave the batch
                keep_rows = (keep.unsqueeze(1) * k + beams).view(-1)
                state = tree_map(lambda x: x.index_select(0, keep_rows), state)
                static = tree_map(lambda x: x.index_select(0, keep_rows), static)
                tokens = tokens.index_select(0, keep_rows)
                alive = alive.index_select(0, keep)
                n_alive = int(keep.numel())

    normalised = scores / lengths.clamp(min=1).to(scores.dtype) ** length_penalty
    has_finished = finished.any(dim=1)
    best_finished = normalised.masked_fill(~finished, float("-inf")).argmax(dim=1)
    choice = torch.where(has_finished, best_finished, normalised.argmax(dim=1))  # fallback: unfinished
    # Walk the back-pointers from the chosen beam to the first step.
    choice = choice.unsqueeze(1)  # [B, 1]
    beam, out_tokens, out_extras = choice, [], []
    for t in reversed(range(len(token_hist))):
        out_tokens.append(token_hist[t].gather(1, beam).squeeze(1))
        out_extras.append({name: _gather_beam(value, beam) for name, value in extras_hist[t].items()})
        beam = parent_hist[t].gather(1, beam)
    chosen_finished = finished.gather(1, choice).squeeze(1)
    n_words = lengths.gather(1, choice).squeeze(1) - chosen_finished.long()
    return _results(out_tokens[::-1], n_words, scores.gather(1, choice).squeeze(1), chosen_finished,
                    out_extras[::-1])


def _gather_beam(value: torch.Tensor, beam: torch.Tensor) -> torch.Tensor:
    """value [B, k, ...], beam [B, 1] -> [B, ...]."""
    index = beam.view(-1, 1, *([1] * (value.dim() - 2))).expand(-1, 1, *value.shape[2:])
    return value.gather(1, index).squeeze(1)


def _device_of(*trees: Any) -> torch.device:
    found: list[torch.device] = []
    tree_map(lambda x: found.append(x.device) or x, trees)
    return found[0] if found else torch.device("cpu")
