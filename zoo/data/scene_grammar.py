"""FashionScenes' caption grammar: noun phrases ("a red shirt") related by where their boxes lie
("left of"), and which item each colour and item word names, as supervised attention needs (Liu et
al. 2017), even in a scene with two red shirts.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zoo.data.vocab import tokenize

# Fashion-MNIST class -> caption phrase; the head (last) word is the item's box word.
ITEM_NAMES = ["tshirt", "trousers", "pullover", "dress", "coat",
              "sandal", "shirt", "sneaker", "bag", "ankle boot"]
HEAD_WORDS = [name.split()[-1] for name in ITEM_NAMES]
# colour word -> RGB multiplier applied to the grey item
COLOURS = {"red": (1.0, 0.15, 0.15), "green": (0.2, 0.85, 0.2), "blue": (0.25, 0.4, 1.0),
           "yellow": (1.0, 0.9, 0.1), "purple": (0.65, 0.25, 1.0), "orange": (1.0, 0.55, 0.05),
           "white": (1.0, 1.0, 1.0), "cyan": (0.1, 0.85, 0.9)}
COLOUR_NAMES = list(COLOURS)

# relation of item i to item j
LEFT, RIGHT, ABOVE, BELOW = 0, 1, 2, 3
RELATION_WORDS = {LEFT: "left of", RIGHT: "right of", ABOVE: "above", BELOW: "below"}
RELATION_LONG = {LEFT: "to the left of", RIGHT: "to the right of", ABOVE: "above", BELOW: "below"}

TAG = "\x01"  # joins a word to the item slot it names inside the generator; never in a caption
MAX_TRIES = 50  # caption draws per wanted caption before a scene settles for fewer distinct ones


def noun_phrase(label: int, colour: int, definite: bool = False, slot: int | None = None) -> str:
    """"a red shirt"; with `slot`, the colour and item words are tagged "red\x01<slot>" so the
    caption can say which item each word names (see `untag`)."""
    tag = "" if slot is None else f"{TAG}{slot}"
    colour_word = COLOUR_NAMES[colour] + tag
    name = " ".join(w + tag for w in ITEM_NAMES[label].split())
    article = ("the" if definite else "a pair of" if ITEM_NAMES[label] == "trousers"
               else "an" if colour_word[0] in "aeiou" else "a")
    return f"{article} {colour_word} {name}"


def untag(tagged: str) -> tuple[str, list[int]]:
    """A tagged caption -> (the caption, the item slot of each of its tokens, -1: none)."""
    words, slots = [], []
    for raw in tagged.split():
        word, _, slot = raw.partition(TAG)
        words.append(word)
        slots += [int(slot) if slot else -1] * len(tokenize(word))
    return " ".join(words), slots


# Templates over the scene's items in an order the caller permutes: {a[k]} is item k's noun phrase,
# {the[k]} its definite one, {rel[i][j]} / {rel_long[i][j]} the relation of item i to item j.
TEMPLATES = {
    1: ["{a[0]}", "a picture of {a[0]}", "there is {a[0]}", "{a[0]} on a black background",
        "an image showing {a[0]}", "{a[0]} in the picture"],
    2: ["{a[0]} {rel[0][1]} {a[1]}", "{a[0]} {rel_long[0][1]} {a[1]}", "there is {a[0]} {rel[0][1]} {a[1]}",
        "{a[0]} and {a[1]}", "{a[0]} with {a[1]} {rel[1][0]} it", "{a[0]} is {rel_long[0][1]} {a[1]}"],
    3: ["{a[0]} , {a[1]} and {a[2]}",
        "{a[0]} {rel[0][1]} {a[1]} and {a[2]} {rel[2][1]} {the[1]}",
        "{a[0]} {rel[0][1]} {a[1]} and {a[2]} {rel[2][0]} {the[0]}",
        "three items : {a[0]} , {a[1]} and {a[2]}",
        "{a[0]} {rel_long[0][2]} {a[2]} , and {a[1]}",
        "there is {a[0]} {rel[0][1]} {a[1]} and {a[2]}"],
}


def relations(boxes: np.ndarray) -> np.ndarray:
    """Spatial relation of item i to item j: boxes float [N, K, 4] -> int [N, K, K], along a separating
    axis (the larger centre distance where both separate): "A left of B" means A ends before B begins."""
    b = boxes[:, :, None, :]  # item i
    o = boxes[:, None, :, :]  # item j
    left, right = b[..., 2] <= o[..., 0], o[..., 2] <= b[..., 0]
    above, below = b[..., 3] <= o[..., 1], o[..., 3] <= b[..., 1]
    cx = (b[..., 0] + b[..., 2] - o[..., 0] - o[..., 2]) / 2
    cy = (b[..., 1] + b[..., 3] - o[..., 1] - o[..., 3]) / 2
    sep_x, sep_y = left | right, above | below
    horizontal = sep_x & (~sep_y | (np.abs(cx) >= np.abs(cy)))
    return np.where(horizontal, np.where(left, LEFT, RIGHT), np.where(above, ABOVE, BELOW))


def captions_for_scene(labels: Sequence[int], colours: Sequence[int], rel: np.ndarray,
                       count: int, rng: np.random.Generator) -> tuple[list[str], list[list[int]]]:
    """`count` distinct captions of one scene (its n items' labels and colours, rel [n, n]) and, per
    caption, the item each token names (-1: none)."""
    n = len(labels)
    out, items = [], []
    for _ in range(MAX_TRIES * count):
        if len(out) == count:
            break
        perm = rng.permutation(n)
        phrases = {"a": [noun_phrase(int(labels[k]), int(colours[k]), slot=int(k)) for k in perm],
                   "the": [noun_phrase(int(labels[k]), int(colours[k]), True, slot=int(k)) for k in perm],
                   "rel": [[RELATION_WORDS[int(rel[i, j])] for j in perm] for i in perm],
                   "rel_long": [[RELATION_LONG[int(rel[i, j])] for j in perm] for i in perm]}
        caption, slots = untag(TEMPLATES[n][int(rng.integers(len(TEMPLATES[n])))].format(**phrases))
        if caption not in out:
            out.append(caption)
            items.append(slots)
    return out, items
