"""The multi-scale retina of the Recurrent Attention Model (Mnih et al. 2014, sec. 3.1 / 4).

A glimpse at location l is k square patches centred on l; patch i is `patch_size * scale_factor**i`
pixels wide, averaged down to `patch_size x patch_size`; areas outside the image read as zeros.
`locations[:, 0]` is x (columns), `[:, 1]` y (rows), in [-1, 1] with `grid_sample`'s
align_corners=False convention ((-1, -1) is the top-left corner of the top-left pixel): in pixel
edges the centre is `c = (l + 1) / 2 * size`.

Every output cell is the exact area average of the image taken as piecewise constant; sub-pixel
locations blend neighbouring pixels linearly, so the read is continuous in l. Three batched
implementations of that same function (`method=`, no Python loop over the batch, no host sync)
agree to float rounding (`benchmarks/glimpse.py` measures them):
- "crop" (default; fastest on CPU): the largest patch plus one pixel, read as contiguous row strips,
  shifted by the sub-pixel offset with two lerps (the area average over a box shifted by f is the
  lerp, with weight f, of the averages at the neighbouring integer positions), then a pooling
  pyramid serving every scale; needs an integer `scale_factor` and scales on the largest patch's
  cell grid.
- "filterbank": the separable box-filter read `F_y,i . x . F_x,i^T` (`filters()`), RAM's counterpart
  of DRAW's Gaussian read; any `scale_factor`.
- "grid_sample": bilinear samples at every scale's pixel centres, then average pooling (the mean of
  bilinear samples one pixel apart is the same area average); needs an integer `scale_factor`.
`subpixel=False` snaps each glimpse to the nearest pixel edges, as the public ports' slicing retinas
do: a plain crop-and-pool, a step function of l.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.sampling import read_windows

METHODS = ("filterbank", "grid_sample", "crop")


class Retina(nn.Module):
    """images [B, C, H, W], locations [B, 2] (x, y) in [-1, 1] -> [B, num_scales, C, g, g].
    `image_size` (H, W) keeps that size's constant in a buffer: no host-to-device copy per call
    (capturable in a CUDA graph); other sizes still work."""

    def __init__(self, patch_size: int, num_scales: int, scale_factor: float = 2,
                 method: str = "crop", subpixel: bool = True, image_size: tuple[int, int] | None = None):
        super().__init__()
        if patch_size < 1 or num_scales < 1:
            raise ValueError(f"patch_size and num_scales must be >= 1, got {patch_size}, {num_scales}")
        if scale_factor < 1:
            raise ValueError(f"scale_factor must be >= 1, got {scale_factor}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method != "filterbank" and float(scale_factor) != int(scale_factor):
            raise ValueError(f"method {method!r} needs an integer scale_factor, got {scale_factor}")
        big = patch_size * int(scale_factor) ** (num_scales - 1)
        if method == "crop" and any((big - patch_size * int(scale_factor) ** i) % (2 * int(scale_factor) ** i)
                                    for i in range(num_scales)):
            raise ValueError("method 'crop' needs every scale to sit on the cell grid of the largest "
                             "patch (e.g. an even patch_size with scale_factor 2); use 'filterbank'")
        self.patch_size = int(patch_size)
        self.num_scales = int(num_scales)
        self.scale_factor = scale_factor
        self.method = method
        self.subpixel = bool(subpixel)
        # per scale i: the width in pixels of one output cell and of the square patch
        cell_sizes = [float(scale_factor) ** i for i in range(self.num_scales)]
        self.widths = [self.patch_size * d for d in cell_sizes]
        # non-persistent buffers follow .to(device), stay out of checkpoints; float64 keeps any scale exact
        self.register_buffer("_cells", torch.tensor(cell_sizes, dtype=torch.float64), persistent=False)
        self.register_buffer("_widths", torch.tensor(self.widths, dtype=torch.float64), persistent=False)
        self.image_hw = None if image_size is None else (int(image_size[0]), int(image_size[1]))
        size = [] if image_size is None else [self.image_hw[1], self.image_hw[0]]  # (width, height)
        self.register_buffer("_size", torch.tensor(size, dtype=torch.float64), persistent=False)

    def extra_repr(self) -> str:
        return (f"patch_size={self.patch_size}, num_scales={self.num_scales}, "
                f"scale_factor={self.scale_factor}, method={self.method!r}, subpixel={self.subpixel}")

    def _image_size(self, locations: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """[2] = (width, height) in the locations' dtype; from the buffer when the size is the built one."""
        if self.image_hw == (height, width):
            return self._size.to(locations.device, locations.dtype)
        return locations.new_tensor([width, height])

    def centres(self, locations: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """[B, 2] (x, y) in [-1, 1] -> [B, 2] glimpse centres (x, y) in pixel-edge coordinates;
        without `subpixel`, moved so the patch edges fall on the nearest pixel edges."""
        size = self._image_size(locations, height, width)
        centres = (locations + 1) * 0.5 * size
        if self.subpixel:
            return centres
        # the largest patch's edges on pixel edges, and the smaller ones' where widths differ evenly
        half = self.widths[-1] / 2
        return torch.floor(centres - half + 0.5) + half

    def boxes(self, locations: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Pixel boxes of every scale, [B, num_scales, 4] (x0, y0, x1, y1) in pixel edges."""
        c = self.centres(locations, height, width)  # [B, 2]
        half = self._widths.to(locations.device, locations.dtype)[None, :, None] / 2  # [1, k, 1]
        return torch.cat([c[:, None] - half, c[:, None] + half], dim=-1)

    def forward(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or locations.shape != (images.shape[0], 2):
            raise ValueError(f"expected images [B, C, H, W] and locations [B, 2], got "
                             f"{tuple(images.shape)} and {tuple(locations.shape)}")
        return getattr(self, f"_{self.method}")(images, locations.to(images.dtype))  # _crop, _filterbank, ...

    def filters(self, locations: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Box filterbanks Fy [B, k, g, H] and Fx [B, k, g, W]: [b, i, j, a] is the overlap of output
        cell j of scale i with pixel a over the cell width (pixels outside the image are absent)."""
        c = self.centres(locations, height, width)  # [B, 2]
        g = self.patch_size
        d = self._cells.to(locations.device, locations.dtype)  # [k] cell width per scale
        j = torch.arange(g + 1, device=locations.device, dtype=locations.dtype)
        # cell j of scale i spans [e_j, e_{j+1}) with edges e_j = c + (j - g/2) d_i
        offsets = (j[None, :] - g / 2) * d[:, None]  # [k, g+1]

        def bank(centre: torch.Tensor, n: int) -> torch.Tensor:  # centre [B] -> [B, k, g, n]
            edges = centre[:, None, None] + offsets  # [B, k, g+1]
            a = torch.arange(n, device=locations.device, dtype=locations.dtype)
            # covered[e, a] = length of [a, a+1) left of edge e; a cell's overlap: its two edges' difference
            covered = (edges[..., None] - a).clamp_(0, 1)  # [B, k, g+1, n]
            return (covered[:, :, 1:] - covered[:, :, :-1]) / d[:, None, None]

        return bank(c[:, 1], height), bank(c[:, 0], width)

    def _filterbank(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        B, C, H, W = images.shape
        k, g = self.num_scales, self.patch_size
        fy, fx = self.filters(locations, H, W)  # [B, k, g, H], [B, k, g, W]
        # columns first: [B, C*H, W] @ [B, W, k*g] -> [B, C*H, k*g]
        cols = torch.bmm(images.reshape(B, C * H, W), fx.reshape(B, k * g, W).transpose(1, 2))
        cols = cols.view(B, C, H, k, g).permute(0, 3, 2, 1, 4).reshape(B * k, H, C * g)
        # then rows: [B*k, g, H] @ [B*k, H, C*g] -> [B*k, g, C*g]
        out = torch.bmm(fy.reshape(B * k, g, H), cols)
        return out.view(B, k, g, C, g).permute(0, 1, 3, 2, 4)  # [B, k, C, g, g]

    def _grid_sample(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        B, C, H, W = images.shape
        g = self.patch_size
        c = self.centres(locations, H, W)  # [B, 2]
        size = self._image_size(locations, H, W)
        widths = [int(w) for w in self.widths]  # integers: the method needs an integer scale_factor
        grids = []
        for n in widths:  # k <= 4 scales; each one's sample grid, all sampled in one call
            offset = torch.arange(n, device=images.device, dtype=images.dtype) + 0.5 - n / 2  # [n]
            xs = (c[:, None, 0] + offset) / size[0] * 2 - 1  # [B, n] pixel centres -> [-1, 1]
            ys = (c[:, None, 1] + offset) / size[1] * 2 - 1
            grids.append(torch.stack(torch.broadcast_tensors(xs[:, None, :], ys[:, :, None]), -1)
                         .reshape(B, n * n, 2))
        grid = torch.cat(grids, dim=1)[:, None]  # [B, 1, sum n^2, 2]
        samples = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=False)[:, :, 0]  # [B, C, sum n^2]
        blocks = [b.reshape(B, C, n, n) for b, n in zip(samples.split([n * n for n in widths], 2), widths)]
        return torch.stack([F.avg_pool2d(b, n // g) if n > g else b for b, n in zip(blocks, widths)], dim=1)

    def _crop(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        B, C, H, W = images.shape
        g = self.patch_size
        widths = [int(w) for w in self.widths]
        big = widths[-1]
        n = big + 1 if self.subpixel else big  # one extra pixel per axis for a sub-pixel shift
        edge = self.centres(locations, H, W) - big / 2  # [B, 2] largest patch's top-left corner
        corner = torch.floor(edge)
        frac = edge - corner  # [B, 2] in [0, 1); exactly 0 when snapped
        corner = corner.clamp(min=-n, max=max(H, W)).long()  # a far-off window lies outside: zeros
        r = torch.arange(n, device=images.device)
        rows, cols = corner[:, 1, None] + r, corner[:, 0, None] + r  # [B, n]
        row_ok = ((rows >= 0) & (rows < H)).to(images.dtype)  # out-of-image pixels read as 0
        col_ok = ((cols >= 0) & (cols < W)).to(images.dtype)
        # contiguous row strips (a pixel gather costs several times more); pixels outside the image
        # hold other pixels, which the masks multiply by 0
        window = read_windows(images, corner.view(B, 1, 2), n)[:, 0]  # [B, C, n, n]
        if self.subpixel:
            # the sub-pixel shift as two lerps (module docstring); the mask rides on their weights
            fy, fx = frac[:, 1].view(B, 1, 1, 1), frac[:, 0].view(B, 1, 1, 1)
            my, mx = row_ok.view(B, 1, n, 1), col_ok.view(B, 1, 1, n)
            window = torch.addcmul((1 - fy) * my[:, :, :-1] * window[:, :, :-1],
                                   fy * my[:, :, 1:], window[:, :, 1:])  # [B, C, big, n]
            window = torch.addcmul((1 - fx) * mx[..., :-1] * window[..., :-1],
                                   fx * mx[..., 1:], window[..., 1:])  # [B, C, big, big]
        else:
            window = window * (row_ok[:, :, None] * col_ok[:, None, :])[:, None]
        # nested centred windows, smallest first, from a pooling pyramid
        patches, level, cell = [], window, 1  # level: the window averaged over cell x cell boxes
        factor = int(self.scale_factor)
        for w in widths:
            d = w // g
            if d != cell:
                level, cell = _box_pool(level, factor), cell * factor
            o = (big - w) // 2 // cell
            patches.append(level[:, :, o:o + g, o:o + g])
        return torch.stack(patches, dim=1)


def _box_pool(x: torch.Tensor, f: int) -> torch.Tensor:
    """Average f x f boxes of the last two dims by strided adds (several times faster than avg_pool2d
    on CPU for few-channel maps)."""
    rows = x[..., 0::f, :]
    for i in range(1, f):
        rows = rows + x[..., i::f, :]
    out = rows[..., 0::f]
    for i in range(1, f):
        out = out + rows[..., i::f]
    return out * (1.0 / (f * f))
