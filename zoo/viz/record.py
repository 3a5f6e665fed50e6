"""Pictures of attention, the same wherever they show (`zoo attend`'s strips and HTML report, the
W&B panels, `zoo caption --attention-dir`): `attention_panels` draws every one.

Every map is visible at its own scale: each is drawn from 0 to its own top, its peak, but never below
`CONTRAST` x the uniform level 1/N (N cells), so a sharp map (DRAW's filters peak at hundreds x
uniform) shows however much sharper than its neighbours it is, and a near-uniform map still looks
dark and flat. The figure says so (the colour bar's legend), and each step prints its peak (x
uniform), its scale and its spread, exp(H) / N (`zoo.metrics.trust.spread`: 1 = uniform; the one
entropy unit of every figure and JSON of the zoo). A degenerate map is a grey panel."""
from __future__ import annotations

import base64
import html
import io
from itertools import cycle
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from zoo.guards.writes import json_text
from zoo.viz.common import colormap, font, to_rgb_uint8

CONTRAST = 8.0  # the lowest top of a colour scale, x the uniform level (a flat map stays dark)
BOX_COLOURS = [("cyan", (0, 230, 255)), ("red", (255, 60, 60)), ("green", (80, 255, 80)), ("yellow", (255, 200, 0))]
TARGET_COLOUR = ("white", (255, 255, 255))
DEGENERATE_GREY = (110, 110, 110)


def attention_panels(image: Any, maps: torch.Tensor, labels: list[str], boxes=None, degenerate=None,
                     size: int = 128):
    """image [C, H, W] in [0, 1] (or PIL); maps [T, h, w] over the image on any grid; labels T strings;
    boxes T lists of (x0, y0, x1, y1, rgb) in image pixels; degenerate [T] bool -> (panels, bars,
    bar_of): (picture, text lines) per step and for the colour bar, and each step's bar index."""
    from zoo.metrics.trust import spread

    base = to_rgb_uint8(image)
    H, W = base.shape[:2]
    scale = size / max(H, W)
    pw, ph = max(1, round(W * scale)), max(1, round(H * scale))
    base = np.asarray(Image.fromarray(base).resize((pw, ph), Image.NEAREST if scale >= 2 else Image.BILINEAR),
                      dtype=np.float32)
    T = len(labels)
    bad = [False] * T if degenerate is None else [bool(d) for d in degenerate]
    # each map's peak in multiples of the uniform weight 1/N, and its spread exp(H) / N
    flat = torch.nan_to_num(maps.detach().flatten(1).double().cpu(), nan=0.0, posinf=0.0, neginf=0.0)
    peak, spreads = flat.amax(1) * flat.shape[1], spread(maps.detach().cpu()) if T else None
    levels = torch.nan_to_num(maps.detach().float().cpu())[:, None] * maps[0].numel() if T else None  # x uniform
    if T:  # a panel smaller than the map keeps each block's highest level: a peak a pixel wide still shows
        levels = (F.adaptive_max_pool2d(levels, (ph, pw)) if ph < levels.shape[-2] or pw < levels.shape[-1]
                  else F.interpolate(levels, size=(ph, pw), mode="nearest-exact"))[:, 0]
    panels = []
    for t in range(T):
        if bad[t]:
            picture, stats = np.full_like(base, DEGENERATE_GREY[0]), ["degenerate map (zero or NaN)"]
        else:
            top = max(CONTRAST, float(peak[t]))
            level = (levels[t] / top).clamp(0, 1).numpy()
            picture = base * (0.3 + 0.7 * level[..., None]) * 0.6 + colormap(level).astype(np.float32) * 0.4
            stats = [f"peak {float(peak[t]):.1f}x  spread {float(spreads[t]):.2f}", f"scale 0 to {top:.1f}x"]
        picture = Image.fromarray(picture.clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(picture)
        for x0, y0, x1, y1, rgb in ([] if boxes is None else boxes[t]):
            draw.rectangle([x0 * pw / W, y0 * ph / H, x1 * pw / W - 1, y1 * ph / H - 1], outline=rgb, width=2)
        panels.append((picture, [labels[t][:24], *stats]))
    bars = [(colour_bar(ph), ["each map from 0 to its peak", f"(at least {CONTRAST:g}x uniform)",
                              "spread exp(H)/N: 1 = uniform"])]
    return panels, bars, [0] * T


def colour_bar(height: int) -> Image.Image:
    """A vertical colour scale from 0 (bottom) to a map's own top."""
    strip_width = max(8, height // 10)
    bar = Image.new("RGB", (strip_width + 64, height), (255, 255, 255))
    bar.paste(Image.fromarray(colormap(np.linspace(1, 0, height)[:, None].repeat(strip_width, 1))), (0, 0))
    draw, small = ImageDraw.Draw(bar), font(10)
    for text, at in (("its top", 0), ("0", height - 12)):
        draw.text((strip_width + 5, at), text, fill=(0, 0, 0), font=small)
    return bar


def layout(cells: list[tuple[Image.Image, list[str]]], columns: int = 8) -> Image.Image:
    """Pictures in a grid, each with its text lines beneath (a column is as wide as its widest line)."""
    small, pad = font(11), 4
    widths = [max([c[0].width] + [ImageDraw.Draw(c[0]).textlength(line, font=small) + 2 for line in c[1]])
              for c in cells]
    cols = max(1, min(columns, len(cells)))
    col_w = [max(widths[k::cols]) for k in range(cols)]
    ph, text_h = max(c[0].height for c in cells), 13 * max(len(c[1]) for c in cells) + 2
    rows = -(-len(cells) // cols)
    figure = Image.new("RGB", (round(sum(col_w)) + pad * (cols + 1), rows * (ph + text_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(figure)
    for k, (picture, lines) in enumerate(cells):
        x, y = pad + round(sum(col_w[:k % cols])) + pad * (k % cols), pad + (k // cols) * (ph + text_h + pad)
        figure.paste(picture, (x, y))
        for i, line in enumerate(lines):
            draw.text((x + 1, y + picture.height + 1 + 13 * i), line, fill=(0, 0, 0), font=small)
    return figure


def record_panels(record, b: int, image: torch.Tensor, targets=None, size: int = 128):
    """`attention_panels` of image b's existing steps, with the record's boxes and the known
    `targets` [M, 4] (image pixels; a negative coordinate marks no box), and the legend naming them."""
    steps = record.step_mask[b].nonzero().flatten().tolist()
    kinds = list(zip(record.box_labels, cycle(BOX_COLOURS))) if record.boxes is not None else []
    known = [] if targets is None else [[float(v) for v in box] for box in targets if float(min(box)) >= 0]
    boxes = [[(*record.boxes[b, t, k].tolist(), rgb) for k, (_, (_, rgb)) in enumerate(kinds)]
             + [(*box, TARGET_COLOUR[1]) for box in known] for t in steps]
    legend = [f"{colour} box: {name}" for name, (colour, _) in kinds + [("known target", TARGET_COLOUR)] * bool(known)]
    panels, bars, bar_of = attention_panels(image, record.maps[b, steps], [record.labels[b][t] for t in steps],
                                            boxes, record.degenerate()[b, steps], size)
    return panels, bars, bar_of, legend


def strip(record, b: int, image: torch.Tensor, targets=None, size: int = 128, columns: int = 8) -> Image.Image:
    """The input (with the box legend), every step of image b, and the colour bars in one figure."""
    panels, bars, _, legend = record_panels(record, b, image, targets, size)
    return layout([(_plain(image, size), ["input", *legend])] + panels + bars, columns)


def caption_figure(image: Any, result: dict, panel_size: int = 160, columns: int = 5,
                   show_beta: bool = True, warnings: list[str] = ()) -> Image.Image:
    """Show-Attend-Tell: image [3, H, W] in [0, 1] (or PIL); result one `Captioner.caption()` entry
    (`words`, `alpha` [n, h, w], `beta` [n], optional `locations` [n, 2] (row, column): hard
    attention's chosen cell, outlined) -> the input, a panel per word (its gate beta_t), the bar;
    `warnings` (short lines: why not to trust the caption) under the input."""
    words, beta, locations = list(result.get("words", [])), result.get("beta"), result.get("locations")
    alpha = torch.as_tensor(result.get("alpha", torch.zeros(0, 1, 1)), dtype=torch.float32)[: len(words)]
    H, W = to_rgb_uint8(image).shape[:2]
    h, w = alpha.shape[-2:]
    labels = [word + (f"  beta {float(beta[t]):.2f}" if show_beta and beta is not None and len(beta) > t else "")
              for t, word in enumerate(words)]
    cells = [] if locations is None else torch.as_tensor(locations).tolist()[: len(words)]
    boxes = [[(c * W / w, r * H / h, (c + 1) * W / w, (r + 1) * H / h, BOX_COLOURS[0][1])] for r, c in cells]
    boxes += [[] for _ in range(len(words) - len(boxes))]
    panels, bars, _ = attention_panels(image, alpha, labels, boxes=boxes, size=panel_size)
    legend = [f"{BOX_COLOURS[0][0]} box: chosen cell"] if locations is not None else []
    return layout([(_plain(image, panel_size), ["input", *legend, *warnings])] + panels + bars, columns)


def _plain(image: Any, size: int) -> Image.Image:
    base = Image.fromarray(to_rgb_uint8(image))
    scale = size / max(base.size)
    return base.resize((max(1, round(base.width * scale)), max(1, round(base.height * scale))), Image.NEAREST)


def _data_uri(picture: Image.Image) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def class_name(record, index: int) -> str:
    """The record's name for class `index`, or the index where the model has no class names."""
    names = record.prediction.get("class_names") or []
    return str(names[index]) if index < len(names) else str(index)


def prediction_text(record, b: int) -> str:
    prediction = record.prediction
    if "words" in prediction:
        words = prediction["words"][b]
        probs = prediction.get("word_probs", [[]] * (b + 1))[b]
        cut = "" if prediction.get("finished", [True] * (b + 1))[b] else " [cut at max length]"
        return " ".join(f"{w} ({p:.0%})" for w, p in zip(words, probs)) + cut if probs else " ".join(words) + cut
    if "probs" in prediction:
        probs = prediction["probs"][b].float()
        label = int(probs.argmax())
        return f"{class_name(record, label)} ({float(probs[label]):.0%})"
    if "canvas" in prediction:
        return "the redrawn canvas is the last panel"
    return ""


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
section {{ border-top: 1px solid #ccc; padding: 1em 0; }}
.row {{ display: flex; gap: 1em; align-items: flex-start; flex-wrap: wrap; }}
.step img, .input img {{ image-rendering: pixelated; border: 1px solid #999; }}
.label {{ font-weight: bold; margin: .3em 0; }}
table {{ border-collapse: collapse; font-size: 90%; }} td, th {{ padding: 2px 8px; border-bottom: 1px solid #eee; }}
</style></head><body>
<h1>{title}</h1>
<p>{legend}</p>
{sections}
<script>
const record = {data};
document.querySelectorAll("section").forEach((section) => {{
  const slider = section.querySelector("input[type=range]");
  const frames = section.querySelectorAll(".step img");
  const label = section.querySelector(".label");
  const show = () => {{
    const k = Number(slider.value);
    frames.forEach((frame, i) => {{ frame.style.display = i === k ? "block" : "none"; }});
    label.textContent = frames[k].dataset.label;
    section.dataset.shown = String(k);
  }};
  slider.addEventListener("input", show);
  show();
}});
// A self-check a browser test (or a reader) can see in the DOM: how many pictures decoded, and how
// many steps each slider really shows.
window.addEventListener("load", () => {{
  const pictures = [...document.querySelectorAll("section img")];
  document.body.dataset.images = String(pictures.length);
  document.body.dataset.rendered = String(pictures.filter((p) => p.complete && p.naturalWidth > 0).length);
  let shown = 0;
  document.querySelectorAll("section").forEach((section) => {{
    const slider = section.querySelector("input[type=range]");
    for (let k = 0; k <= Number(slider.max); k++) {{
      slider.value = String(k);
      slider.dispatchEvent(new Event("input"));
      const frame = section.querySelectorAll(".step img")[k];
      if (frame && frame.style.display === "block" && frame.naturalWidth > 0) shown++;
    }}
    slider.value = "0";
    slider.dispatchEvent(new Event("input"));
  }});
  document.body.dataset.stepsShown = String(shown);
}});
</script>
</body></html>
"""


def html_report(record, images: torch.Tensor, names: list[str], title: str, metrics: list | None = None,
                targets: list | None = None, size: int = 256) -> str:
    """One self-contained page (images embedded): per image the input, the prediction, the boxes'
    legend and a slider over its steps (each frame a panel beside its colour bar); with `metrics`
    (per image a list of per-step dicts, or None) a table of them."""
    sections = []
    for b, name in enumerate(names):
        panels, bars, bar_of, legend = record_panels(record, b, images[b], None if targets is None else targets[b], size)
        frames = "\n".join(f'<img alt="step {k + 1}" data-label="step {k + 1} of {len(panels)}: '
                           f'{html.escape("; ".join(lines + bars[bar_of[k]][1][-1:]))}" '
                           f'src="{_data_uri(layout([(picture, lines), bars[bar_of[k]]], 2))}">'
                           for k, (picture, lines) in enumerate(panels))
        table = ""
        if metrics and metrics[b]:
            keys = list(metrics[b][0])
            cell = lambda v: html.escape(f"{v:.3f}" if isinstance(v, float) else "-" if v is None else str(v))
            rows = "".join("<tr>" + "".join(f"<td>{cell(m[k])}</td>" for k in keys) + "</tr>"
                           for m in metrics[b])
            table = f"<table><tr>{''.join(f'<th>{html.escape(k)}</th>' for k in keys)}</tr>{rows}</table>"
        sections.append(
            f'<section id="image-{b}"><h2>{html.escape(name)}</h2>'
            f"<p>prediction: {html.escape(prediction_text(record, b))}</p>"
            + (f'<p class="boxes">{html.escape(", ".join(legend))}</p>' if legend else "") +
            f'<div class="row"><div class="input"><img alt="input" src="{_data_uri(_plain(images[b], size))}"></div>'
            f'<div><div class="label"></div><div class="step">{frames}</div>'
            f'<input type="range" min="0" max="{max(len(panels) - 1, 0)}" value="0" aria-label="step"></div>'
            f"{table}</div></section>")
    legend = html.escape(f"{record.family} ({record.kind} attention): each step's map over the input from 0 to "
                         f"its own peak (at least {CONTRAST:g}x the uniform level, so a near-uniform map stays dark), "
                         "with its peak (x uniform) and its spread exp(H)/N (H the entropy in nats over the map's N "
                         "pixels; 1 = uniform)")
    data = script_json(record.as_dict(maps=False))
    return PAGE.format(title=html.escape(title), legend=legend, sections="\n".join(sections), data=data)


#: characters a string inside <script> must not hold as themselves: `<` starts `</script>`, `<!--`
#: and `<script`, `>` and `&` other markup, U+2028/9 end a line in older JavaScript
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value) -> str:
    """Strict JSON that is inert inside an HTML <script> element, whatever strings it holds."""
    return json_text(value).translate(str.maketrans(_SCRIPT_UNSAFE))
