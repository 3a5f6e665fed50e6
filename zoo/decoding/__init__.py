"""Batched decoding for sequence models with a step function

    step_fn(tokens [N] int64, state, static) -> (log_probs [N, V], new_state, extras)

`state`: a tensor or nested tuple/list/dict of tensors of first dimension N (reordered when beams
move); `static`: the same for per-image inputs that never change (expanded once, never reordered);
`extras`: per-step tensors [N, ...] recorded along each hypothesis (attention maps, gates, locations).
"""
from zoo.decoding.search import DecodeResult, beam_search, greedy_decode, tree_map

__all__ = ["DecodeResult", "beam_search", "greedy_decode", "tree_map"]
