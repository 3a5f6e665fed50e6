"""The multi-scale retina of the Recurrent Attention Model (Mnih et al. 2014, sec. 3.1 / 4).

A glimpse at location l is k square patches centred on l. Patch i is `patch_size * scale_factor**i`
pixels wide and is resized to `patch_size x patch_size` by averaging, so every output cell of patch
i is the mean of a `scale_factor**i`-wide box of pixels. Areas outside the image read as zeros.

Coordinates. `locations[:, 0]` is x (columns), `locations[:, 1]` is y (rows), both in [-1, 1];
(0, 0) is the image centre, (-1, -1) the top-left corner of the top-left pixel and (1, 1) the
bottom-right corner of the bottom-right pixel (the `align_corners=False` convention of
`grid_sample`). In pixel-edge coordinates (pixel a covers [a, a + 1)) the centre is
`c = (l + 1) / 2 * size`, and a location is *integer-aligned* when the patch edges
`c -+ width / 2` fall on pixel edges: there every method below reads exactly the pixels a slicing
reference reads.

Every output cell is the exact area average of the image taken as piecewise constant (pixel a
covers [a, a + 1)); sub-pixel locations blend neighbouring pixels linearly instead of snapping, so
the read is continuous in l. Three batched implementations of that same function (`method=`),
each one op over batch x scales, with no Python loop over the batch and no host sync; they agree
to float rounding everywhere, and `benchmarks/glimpse.py` measures them:

- "crop" (default; fastest on CPU): read the largest patch plus one pixel from the image, row by
  row as contiguous strips (out-of-image pixels masked to zero, no padded copy), shift it by the
  sub-pixel offset with two lerps (the area average over a box shifted by f is the lerp, with
  weight f, of the averages at the neighbouring integer positions), then average-pool a pyramid:
  pooling the window by the scale factor once per scale serves all larger scales. Needs an
  integer `scale_factor` and scales on the largest patch's cell grid (e.g. even `patch_size` with
  factor 2).
- "filterbank": the separable box-filter read `patch_i = F_y,i . x . F_x,i^T`, RAM's counterpart
  of DRAW's Gaussian read (`filters()` returns F). Row j of F_x,i holds the overlap of output
  cell j with each pixel column over the cell width. Two batched matmuls; any `scale_factor`.
- "grid_sample": bilinear samples at the pixel centres of every scale (one `grid_sample` call),
  then average pooling. The mean of bilinear samples spaced one pixel apart is the same area
  average. Needs an integer `scale_factor`.
The image gradient flows through all three (RAM never needs the location gradient: its sampled
locations are detached).

`subpixel=False` snaps each glimpse to the nearest pixel edges instead, as the public ports'
slicing retinas do (`floor(edge + 0.5)`): the read is then a plain crop-and-pool, which costs no
interpolation ("crop" gathers a window one pixel narrower and skips its two lerps), but is a step
function of l.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.sampling import read_windows

METHODS = ("filterbank", "grid_sample", "crop")


class Retina(nn.Module):
    """images [B, C, H, W], locations [B, 2] (x, y) in [-1, 1] -> [B, num_scales, C, g, g].

    `image_size` (H, W), when given, builds the image-size constant once as a buffer for images of
    that size (other sizes still work): no host-to-device copy per call on a GPU, which also makes
    the read capturable in a CUDA graph."""

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
        # per scale i: the width in pixels of one output cell (scale_factor ** i) and of the square
        # patch (patch_size * scale_factor ** i)
        cell_sizes = [float(scale_factor) ** i for i in range(self.num_scales)]
        self.widths = [self.patch_size * d for d in cell_sizes]
        # Constants as non-persistent buffers: they follow .to(device) and stay out of checkpoints.
        # float64 keeps any scale factor exact; reads cast them to the locations' dtype.
        self.register_buffer("_cells", torch.tensor(cell_sizes, dtype=torch.float64), persistent=False)
        self.register_buffer("_widths", torch.tensor(self.widths, dtype=torch.float64), persistent=False)
        self.image_hw = None if image_size is None else (int(image_size[0]), int(image_size[1]))
        size = [] if image_size is None else [self.image_hw[1], self.image_hw[0]]  # (width, height)
        self.register_buffer("_size", torch.tensor(size, dtype=torch.float64), persistent=False)

    def extra_repr(self) -> str:
        return (f"patch_size={self.patch_size}, num_scales={self.num_scales}, "
                f"scale_factor={self.scale_factor}, method={self.method!r}, subpixel={self.subpixel}")

    # ------------------------------------------------------------------ geometry
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
        # The largest patch's edges land on pixel edges, and so do the smaller ones' wherever the
        # widths differ by an even number of pixels (which method 'crop' requires anyway).
        half = self.widths[-1] / 2
        return torch.floor(centres - half + 0.5) + half

    def boxes(self, locations: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Pixel boxes of every scale, [B, num_scales, 4] as (x0, y0, x1, y1) in pixel-edge
        coordinates (for drawing; they may extend past the image)."""
        c = self.centres(locations, height, width)  # [B, 2]
        half = self._widths.to(locations.device, locations.dtype)[None, :, None] / 2  # [1, k, 1]
        return torch.cat([c[:, None] - half, c[:, None] + half], dim=-1)

    # ------------------------------------------------------------------ forward
    def forward(self, images: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or locations.shape != (images.shape[0], 2):
            raise ValueError(f"expected images [B, C, H, W] and locations [B, 2], got "
                             f"{tuple(images.shape)} and {tuple(locations.shape)}")
        return getattr(self, f"_{self.method}")(images, locations.to(images.dtype))  # _crop, _filterbank, ...

    def filters(self, locations: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Box filterbanks Fy [B, k, g, H] and Fx [B, k, g, W]: entry [b, i, j, a] is the overlap
        of output cell j of scale i with pixel a, over the cell width (rows sum to 1 inside the
        image; pixels outside the image are simply absent, so they read as zero)."""
        c = self.centres(locations, height, width)  # [B, 2]
        g = self.patch_size
        d = self._cells.to(locations.device, locations.dtype)  # [k] cell width per scale
        j = torch.arange(g + 1, device=locations.device, dtype=locations.dtype)
        # cell j of scale i spans [e_j, e_{j+1}) with edges e_j = c + (j - g/2) d_i
        offsets = (j[None, :] - g / 2) * d[:, None]  # [k, g+1]

        def bank(centre: torch.Tensor, n: int) -> torch.Tensor:  # centre [B] -> [B, k, g, n]
            edges = centre[:, None, None] + offsets  # [B, k, g+1]
            a = torch.arange(n, device=locations.device, dtype=locations.dtype)
            # covered[e, a] = length of [a, a+1) left of edge e; the overlap of a cell with pixel
            # a is the difference between its two edges' values.
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
        # Clamp far-off corners (the window then lies wholly outside and reads zeros).
        corner = corner.clamp(min=-n, max=max(H, W)).long()
        r = torch.arange(n, device=images.device)
        rows, cols = corner[:, 1, None] + r, corner[:, 0, None] + r  # [B, n]
        row_ok = ((rows >= 0) & (rows < H)).to(images.dtype)  # out-of-image pixels read as 0
        col_ok = ((cols >= 0) & (cols < W)).to(images.dtype)
        # The window's rows, copied as contiguous strips (zoo.attention.sampling.read_windows; a
        # pixel-by-pixel gather cost several times more): its pixels outside the image hold other
        # pixels, which the masks below multiply by 0.
        window = read_windows(images, corner.view(B, 1, 2), n)[:, 0]  # [B, C, n, n]
        if self.subpixel:
            # The area average over a box shifted by f in (0, 1) pixels is the linear
            # interpolation, with weight f, between the averages at the two neighbouring integer
            # positions; the out-of-image mask rides on the interpolation weights.
            fy, fx = frac[:, 1].view(B, 1, 1, 1), frac[:, 0].view(B, 1, 1, 1)
            my, mx = row_ok.view(B, 1, n, 1), col_ok.view(B, 1, 1, n)
            window = torch.addcmul((1 - fy) * my[:, :, :-1] * window[:, :, :-1],
                                   fy * my[:, :, 1:], window[:, :, 1:])  # [B, C, big, n]
            window = torch.addcmul((1 - fx) * mx[..., :-1] * window[..., :-1],
                                   fx * mx[..., 1:], window[..., 1:])  # [B, C, big, big]
        else:
            window = window * (row_ok[:, :, None] * col_ok[:, None, :])[:, None]
        # Nested centred windows, smallest first; pooling the whole window by the scale factor
        # once per scale serves every larger scale (a pyramid) when the offsets line up.
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
    """Average non-overlapping f x f boxes of the last two dims (sizes divisible by f) with strided
    adds: several times faster than avg_pool2d on CPU for the few-channel maps here."""
    rows = x[..., 0::f, :]
    for i in range(1, f):
        rows = rows + x[..., i::f, :]
    out = rows[..., 0::f]
    for i in range(1, f):
        out = out + rows[..., i::f]
    return out * (1.0 / (f * f))
