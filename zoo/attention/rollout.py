"""Reading a ViT's attention: each layer's attention weights, the CLS-to-patch maps, and attention
rollout (Abnar & Zuidema 2020). timm's fused attention never materialises the weights, so
`record_attention` switches fusing off for the extraction only and records the input of `attn_drop`
(the softmax, before dropout) with forward hooks."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def record_attention(vit: nn.Module):
    """Within the block, every forward of `vit` (a timm VisionTransformer) appends each layer's
    attention weights [B, heads, N, N] (rows: queries, softmax over keys) to the yielded list."""
    modules = [m for m in vit.modules()
               if hasattr(m, "fused_attn") and isinstance(getattr(m, "attn_drop", None), nn.Module)]
    if not modules:
        raise ValueError(f"{type(vit).__name__} has no timm attention modules to record")
    recorded: list[torch.Tensor] = []
    saved = [m.fused_attn for m in modules]
    hooks = [m.attn_drop.register_forward_hook(lambda _m, inputs, _out: recorded.append(inputs[0].detach()))
             for m in modules]
    try:
        for m in modules:
            m.fused_attn = False
        yield recorded
    finally:
        for m, flag, hook in zip(modules, saved, hooks):
            m.fused_attn = flag
            hook.remove()


def cls_attention(attention: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int],
                  cls_index: int | None = 0) -> torch.Tensor:
    """Attention [..., N, N] -> CLS-to-patch maps [..., h, w]: row `cls_index` (None: the mean over all
    queries) over the last h*w keys; a map sums to 1 minus the mass on prefix tokens."""
    query = attention.mean(-2) if cls_index is None else attention[..., cls_index, :]  # [B, heads, N]
    patches = query[..., num_prefix_tokens:]
    return patches.reshape(*patches.shape[:-1], *grid)


def rollout(attention: torch.Tensor, head_fusion: str = "mean", residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020, eq. 1): attention [layers, B, heads, N, N] -> [B, N, N],
    the product of the layers' A' = residual * I + (1 - residual) * A (heads fused: mean in the
    paper, max or min; rows re-normalised), from the last layer down to the first."""
    fuse = {"mean": lambda a: a.mean(2), "max": lambda a: a.amax(2), "min": lambda a: a.amin(2)}
    if head_fusion not in fuse:
        raise ValueError(f"head_fusion must be one of {', '.join(fuse)}, not '{head_fusion}'")
    fused = fuse[head_fusion](attention.float())  # [layers, B, N, N]
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    layers = residual * eye + (1 - residual) * fused
    layers = layers / layers.sum(-1, keepdim=True)
    joint = layers[0]
    for layer in layers[1:]:  # a loop over depth (<= a few dozen), batched over images
        joint = layer @ joint  # rollout_l = A'_l @ rollout_{l-1}
    return joint


#: rollout [B, N, N] -> how much the CLS token (or the mean token) draws from each patch [B, h, w]
rollout_map = cls_attention
