"""Reading a ViT's attention: each layer's attention weights, the last layer's CLS-to-patch maps,
and attention rollout (Abnar & Zuidema 2020).

timm's fused attention (`F.scaled_dot_product_attention`) never materialises the attention
weights, so `record_attention` switches fusing off on each attention module for the extraction
only, records the softmax output (the input of `attn_drop`, i.e. before dropout) with forward
hooks, and restores the modules afterwards, even on error."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def _attention_modules(vit: nn.Module) -> list[nn.Module]:
    return [m for m in vit.modules() if hasattr(m, "fused_attn") and isinstance(getattr(m, "attn_drop", None), nn.Module)]


@contextmanager
def record_attention(vit: nn.Module):
    """Within the block, every forward of `vit` (a timm VisionTransformer) appends each layer's
    attention weights [B, heads, N, N] (rows: queries, softmax over keys) to the yielded list."""
    modules = _attention_modules(vit)
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


@torch.no_grad()
def attention_weights(vit: nn.Module, images: torch.Tensor, forward=None) -> torch.Tensor:
    """images [B, C, H, W] (already prepared for `vit`) -> attention [layers, B, heads, N, N].
    `forward` defaults to `vit.forward_features`."""
    with record_attention(vit) as recorded:
        (forward or vit.forward_features)(images)
    return torch.stack(recorded).float()


def cls_attention(attention: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int],
                  cls_index: int | None = 0) -> torch.Tensor:
    """Attention [..., N, N] (a layer's [B, heads, N, N], or all layers') -> CLS-to-patch maps [..., h, w].

    Row `cls_index` (the CLS query) over the patch keys (the last h*w tokens). Without a class
    token (cls_index None) the mean over all queries is used. A map sums to 1 minus the mass the
    query puts on prefix tokens."""
    query = attention.mean(-2) if cls_index is None else attention[..., cls_index, :]  # [B, heads, N]
    patches = query[..., num_prefix_tokens:]
    return patches.reshape(*patches.shape[:-1], *grid)


def rollout(attention: torch.Tensor, head_fusion: str = "mean", residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020, eq. 1): attention [layers, B, heads, N, N] ->
    [B, N, N], the product of the per-layer matrices from the last layer down to the first.

    Each layer's heads are fused (mean in the paper; max/min as options) and the residual
    connection is modelled as A' = residual * I + (1 - residual) * A with rows re-normalised,
    so every row of the result still sums to 1."""
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


def rollout_map(joint: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int],
                cls_index: int | None = 0) -> torch.Tensor:
    """Rollout [B, N, N] -> how much the CLS token (or the mean token) draws from each patch [B, h, w]."""
    query = joint.mean(-2) if cls_index is None else joint[:, cls_index]
    return query[:, num_prefix_tokens:].reshape(-1, *grid)
