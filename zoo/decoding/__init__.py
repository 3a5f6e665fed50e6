"""Batched decoding for sequence models with a step-function interface.

A model plugs in with a step function

    step_fn(tokens [N] int64, state, static) -> (log_probs [N, V], new_state, extras)

where `state` is a tensor or a (nested) tuple/list/dict of tensors whose first dimension is N (the
decoder reorders it when beams move), `static` the same for per-image inputs that never change
(annotation vectors: expanded once, never reordered), and `extras` a dict of per-step tensors
[N, ...] to record along each hypothesis (attention maps, gates, chosen locations).
"""
from zoo.decoding.search import DecodeResult, beam_search, greedy_decode, tree_map

__all__ = ["DecodeResult", "beam_search", "greedy_decode", "tree_map"]
