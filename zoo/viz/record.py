"""Pictures of an `AttentionRecord`, the same for every family: a step's map over the image (one
colour scale per image: 0 to the largest weight of any of its steps, so a flat map looks flat), its
boxes, and the self-contained HTML report (`zoo attend --html`).

A degenerate map (all zero, NaN or Inf) is never drawn as a picture: its panel is grey and says so."""
from __future__ import annotations

import base64
import html
import io

import numpy as np
import torch
from PIL import Image, ImageDraw

from zoo.io import json_text
from zoo.viz.common import colormap, font, to_rgb_uint8

BOX_COLOURS = [(0, 230, 255), (255, 60, 60), (80, 255, 80), (255, 200, 0)]  # per box kind (scale, read, write)
TARGET_COLOUR = (255, 255, 255)
DEGENERATE_GREY = (110, 110, 110)


def step_panel(image: torch.Tensor, heat: torch.Tensor | None, top: float, boxes=None, targets=None,
               size: int = 192) -> Image.Image:
    """image [C, H, W] in [0, 1]; heat [H, W] (a probability map) or None for a degenerate map;
    boxes [K, 4] and targets [M, 4] in the image's pixels -> an RGB panel `size` pixels on its long side."""
    base = to_rgb_uint8(image).astype(np.float32)
    H, W = base.shape[:2]
    if heat is None:
        panel = np.full_like(base, DEGENERATE_GREY[0])
    else:
        level = (heat.float().cpu().numpy() / max(top, 1e-30)).clip(0, 1)
        panel = base * (0.3 + 0.7 * level[..., None]) * 0.6 + colormap(level).astype(np.float32) * 0.4
    scale = size / max(H, W)
    picture = Image.fromarray(panel.clip(0, 255).astype(np.uint8)).resize(
        (max(1, round(W * scale)), max(1, round(H * scale))), Image.NEAREST)
    draw = ImageDraw.Draw(picture)
    if heat is None:
        draw.text((4, 4), "degenerate map (zero or NaN)", fill=(255, 255, 255), font=font(11))
    for target in ([] if targets is None else targets):
        if float(target.min()) >= 0:
            draw.rectangle([float(v) * scale for v in target], outline=TARGET_COLOUR, width=1)
    for k, box in enumerate([] if boxes is None else boxes):
        draw.rectangle([float(v) * scale for v in box], outline=BOX_COLOURS[k % len(BOX_COLOURS)], width=2)
    return picture


def image_panels(record, b: int, image: torch.Tensor, targets=None, size: int = 192) -> list[Image.Image]:
    """One panel per existing step of image b."""
    steps = record.step_mask[b].nonzero().flatten().tolist()
    bad = record.degenerate()[b]
    good = [t for t in steps if not bool(bad[t])]
    top = float(record.maps[b, good].max()) if good else 1.0
    boxes = record.boxes[b] if record.boxes is not None else None
    return [step_panel(image, None if bool(bad[t]) else record.maps[b, t], top,
                       None if boxes is None else boxes[t], targets, size) for t in steps]


def strip(record, b: int, image: torch.Tensor, targets=None, size: int = 128, columns: int = 8) -> Image.Image:
    """The input and every step of image b in one figure, each panel labelled."""
    panels = [_plain(image, size)]
    panels += image_panels(record, b, image, targets, size)
    labels = ["input"] + [record.labels[b][t] for t in record.step_mask[b].nonzero().flatten().tolist()]
    pw, ph, text_h, pad = panels[0].width, panels[0].height, 14, 3
    cols = max(1, min(columns, len(panels)))
    rows = -(-len(panels) // cols)
    figure = Image.new("RGB", (cols * (pw + pad) + pad, rows * (ph + text_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(figure)
    for k, (panel, label) in enumerate(zip(panels, labels)):
        x, y = pad + (k % cols) * (pw + pad), pad + (k // cols) * (ph + text_h + pad)
        figure.paste(panel, (x, y))
        draw.text((x + 2, y + ph + 1), label[:24], fill=(0, 0, 0), font=font(11))
    return figure


def _plain(image: torch.Tensor, size: int) -> Image.Image:
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
    """One self-contained page (images embedded, no network): per image the input, the prediction,
    and a slider over its steps (words, glimpses, DRAW steps, layers); with `metrics` (per image a
    list of per-step dicts, or None) a table of them."""
    sections = []
    for b, name in enumerate(names):
        steps = record.step_mask[b].nonzero().flatten().tolist()
        panels = image_panels(record, b, images[b], None if targets is None else targets[b], size=size)
        frames = "\n".join(f'<img alt="step {k + 1}" data-label="{html.escape(record.labels[b][t])}" '
                           f'src="{_data_uri(p)}">' for k, (t, p) in enumerate(zip(steps, panels)))
        table = ""
        if metrics and metrics[b]:
            keys = list(metrics[b][0])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(m[k]))}</td>" for k in keys) + "</tr>"
                           for m in metrics[b])
            table = f"<table><tr>{''.join(f'<th>{html.escape(k)}</th>' for k in keys)}</tr>{rows}</table>"
        sections.append(
            f'<section id="image-{b}"><h2>{html.escape(name)}</h2>'
            f"<p>prediction: {html.escape(prediction_text(record, b))}</p>"
            f'<div class="row"><div class="input"><img alt="input" src="{_data_uri(_plain(images[b], size))}"></div>'
            f'<div><div class="label"></div><div class="step">{frames}</div>'
            f'<input type="range" min="0" max="{max(len(steps) - 1, 0)}" value="0" aria-label="step"></div>'
            f"{table}</div></section>")
    legend = html.escape(f"{record.family} ({record.kind} attention): each step's map over the input "
                         f"(bright = more attention; one colour scale per image)"
                         + (f"; boxes: {', '.join(record.box_labels)}" if record.box_labels else "")
                         + ("; white boxes: the known targets" if metrics else ""))
    data = script_json(record.as_dict(maps=False))
    return PAGE.format(title=html.escape(title), legend=legend, sections="\n".join(sections), data=data)


#: characters a string inside <script> must not hold as themselves: `<` starts `</script>`, `<!--`
#: and `<script` (which switch the HTML parser's script states), `>` and `&` other markup, U+2028/9
#: end a line in older JavaScript
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value) -> str:
    """Strict JSON (non-finite numbers as null) that is inert inside an HTML <script> element,
    whatever strings a model or a file supplied: every unsafe character as its JavaScript escape."""
    text = json_text(value)
    return text.translate(str.maketrans(_SCRIPT_UNSAFE))


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
