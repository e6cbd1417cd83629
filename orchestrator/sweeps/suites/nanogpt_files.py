"""The ``nanogpt`` suite's workspace: a synthetic corpus, a small GPT training script (the
baseline to speed up) and the checker the gate runs (``nanogpt.py``).

The corpus is sentences of a small seeded language: agreement (``the red fox sees 3 owls.``),
plural subjects, sums (``12+7=19.``) and a copy (``ana has a gold hat, so ana's hat is
gold.``). Each sentence is drawn from uniform choices and the text determines the choices, so
the text's entropy is exactly the sum of the choices' ``log(options)``: the entropy per
character ``split_corpus`` answers is the lowest validation loss any model can reach on it
(nats per character), and a task's target is that plus a margin.
"""

from __future__ import annotations

import math
import random
from typing import Final

__all__ = [
    "BLOCK",
    "VOCAB",
    "check_script",
    "split_corpus",
    "train_script",
]

VOCAB: Final = "\nabcdefghijklmnopqrstuvwxyz0123456789 .,'+="
BLOCK: Final = 128  # the context the checker evaluates with (and the baseline trains with)

_ANIMALS: Final = ("fox", "cat", "dog", "owl", "bee", "ant", "elk", "yak", "emu", "ram", "hen")
_COLORS: Final = ("red", "blue", "green", "gray", "gold", "pink", "tan", "black", "white")
_VERBS: Final = (
    ("sees", "see"),
    ("likes", "like"),
    ("follows", "follow"),
    ("finds", "find"),
    ("chases", "chase"),
    ("helps", "help"),
)
_NAMES: Final = ("ana", "bo", "cy", "dee", "eli", "fay", "gus", "ida", "jo", "kim", "lu", "max")
_THINGS: Final = ("hat", "cup", "box", "kite", "bag", "coat", "ball")
_SUMMAND_MAX: Final = 99


def _pick(rng: random.Random, options: tuple[str, ...], nats: list[float]) -> str:
    nats.append(math.log(len(options)))
    return rng.choice(options)


def _sentence(rng: random.Random, lex: dict[str, tuple[str, ...]], nats: list[float]) -> str:
    kind = _pick(rng, ("agree", "plural", "sum", "copy"), nats)
    counts = tuple(str(n) for n in range(2, 10))
    if kind == "agree":
        color, animal = _pick(rng, lex["colors"], nats), _pick(rng, lex["animals"], nats)
        verb = _pick(rng, lex["verbs"], nats).split("/")[0]
        count, other = _pick(rng, counts, nats), _pick(rng, lex["animals"], nats)
        return f"the {color} {animal} {verb} {count} {other}s."
    if kind == "plural":
        count, color = _pick(rng, counts, nats), _pick(rng, lex["colors"], nats)
        animal = _pick(rng, lex["animals"], nats)
        verb = _pick(rng, lex["verbs"], nats).split("/")[1]
        return f"{count} {color} {animal}s {verb} the {_pick(rng, lex['animals'], nats)}."
    if kind == "sum":
        numbers = tuple(str(n) for n in range(_SUMMAND_MAX + 1))
        a, b = int(_pick(rng, numbers, nats)), int(_pick(rng, numbers, nats))
        return f"{a}+{b}={a + b}."
    name, color = _pick(rng, lex["names"], nats), _pick(rng, lex["colors"], nats)
    thing = _pick(rng, lex["things"], nats)
    return f"{name} has a {color} {thing}, so {name}'s {thing} is {color}."


def _lexicon(rng: random.Random) -> dict[str, tuple[str, ...]]:
    """The seed's words: a subset of each pool (tasks of other seeds speak other languages)."""
    return {
        "animals": tuple(rng.sample(_ANIMALS, 8)),
        "colors": tuple(rng.sample(_COLORS, 6)),
        "verbs": tuple("/".join(v) for v in rng.sample(_VERBS, 4)),
        "names": tuple(rng.sample(_NAMES, 8)),
        "things": tuple(rng.sample(_THINGS, 5)),
    }


def _text(rng: random.Random, lex: dict[str, tuple[str, ...]], chars: int) -> tuple[str, float]:
    lines: list[str] = []
    nats: list[float] = []
    size = 0
    while size < chars:
        line = _sentence(rng, lex, nats) + "\n"
        lines.append(line)
        size += len(line)
    text = "".join(lines)
    return text, math.fsum(nats) / len(text)


def split_corpus(rng: random.Random, train_chars: int, val_chars: int) -> tuple[str, str, float]:
    """Train and validation text of one language; the validation text's entropy per char."""
    lex = _lexicon(rng)
    train, _ = _text(rng, lex, train_chars)
    val, entropy = _text(rng, lex, val_chars)
    return train, val, entropy


_TRAIN: Final = '''"""Train a small character-level GPT on data/train.txt until its loss on
data/val.txt is at most the target in speedrun.json, then save it as TorchScript to out/model.pt.

This is the baseline: make the whole run (start to saved model) as fast as you can. The
checker (check_speedrun.py) times `python train.py`, loads out/model.pt, and measures the
validation loss itself: a module that maps token ids [batch, BLOCK] to logits
[batch, BLOCK, len(VOCAB)], tokens being positions in VOCAB.
"""

import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = __VOCAB__
BLOCK = __BLOCK__
CONFIG = json.load(open("speedrun.json"))
TARGET = CONFIG["target_val_loss"]
MAX_STEPS = int(os.environ.get("MAX_STEPS", 20000))
N_LAYER, N_HEAD, N_EMBD = 4, 4, 128
BATCH, LR, EVAL_EVERY, EVAL_BATCHES = 64, 1e-3, 200, 8
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)


def encode(path):
    index = {c: i for i, c in enumerate(VOCAB)}
    return torch.tensor([index[c] for c in open(path).read()], dtype=torch.long)


train, val = encode("data/train.txt"), encode("data/val.txt")


def batch(data):
    starts = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([data[s : s + BLOCK] for s in starts])
    y = torch.stack([data[s + 1 : s + BLOCK + 1] for s in starts])
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.qkv, self.proj = nn.Linear(N_EMBD, 3 * N_EMBD), nn.Linear(N_EMBD, N_EMBD)
        self.mlp = nn.Sequential(
            nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD)
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(len(VOCAB), N_EMBD)
        self.pos = nn.Embedding(BLOCK, N_EMBD)
        self.blocks = nn.Sequential(*[Block() for _ in range(N_LAYER)])
        self.ln = nn.LayerNorm(N_EMBD)
        self.head = nn.Linear(N_EMBD, len(VOCAB))

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))


@torch.no_grad()
def val_loss(model):
    model.eval()
    losses = []
    for _ in range(EVAL_BATCHES):
        x, y = batch(val)
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


model = GPT().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=LR)
started = time.time()
for step in range(1, MAX_STEPS + 1):
    x, y = batch(train)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % EVAL_EVERY == 0 or step == MAX_STEPS:
        current = val_loss(model)
        print(f"step {step}: val {current:.4f} ({time.time() - started:.0f} s)", flush=True)
        if current <= TARGET:
            break
model.eval()
os.makedirs("out", exist_ok=True)
example = torch.zeros((1, BLOCK), dtype=torch.long, device=device)
torch.jit.trace(model, example).save("out/model.pt")
print("saved out/model.pt")
'''

_CHECK: Final = '''"""The nanogpt checker (prime-agent, sweeps/suites/nanogpt_files.py). Do not
edit: the gate checks this file's hash and data/val.txt's. Times `python train.py` (start to
exit), loads the TorchScript model it saved to out/model.pt, and measures its loss on
data/val.txt: every BLOCK-character window, predicting each next character. Passes (exit 0)
when the loss is at most TARGET, and then writes the time for the sweep's score."""

import json
import os
import subprocess
import sys
import time

VOCAB = __VOCAB__
BLOCK = __BLOCK__
TARGET = __TARGET__
REFERENCE_S = __REFERENCE__
TIME_LIMIT_S = __LIMIT__
RESULT_FILE = __RESULT__
MODEL = "out/model.pt"


def val_loss():
    import torch
    import torch.nn.functional as F

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.jit.load(MODEL, map_location=device)
    model.eval()
    index = {c: i for i, c in enumerate(VOCAB)}
    ids = torch.tensor([index[c] for c in open("data/val.txt").read()], dtype=torch.long)
    windows = (len(ids) - 1) // BLOCK
    x = ids[: windows * BLOCK].view(windows, BLOCK)
    y = ids[1 : windows * BLOCK + 1].view(windows, BLOCK)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, windows, 64):
            xb, yb = x[start : start + 64].to(device), y[start : start + 64].to(device)
            logits = model(xb)
            if tuple(logits.shape) != (xb.shape[0], BLOCK, len(VOCAB)):
                raise SystemExit(f"check: the model answered shape {tuple(logits.shape)}")
            flat = logits.float().reshape(-1, len(VOCAB))
            total += F.cross_entropy(flat, yb.reshape(-1), reduction="sum").item()
            count += yb.numel()
    return total / count


def main():
    for stale in (RESULT_FILE, MODEL):
        if os.path.exists(stale):
            os.remove(stale)
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "train.py"], timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        print(f"check: train.py ran longer than {TIME_LIMIT_S} s")
        return 1
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        print(f"check: train.py exited {proc.returncode}")
        return 1
    if not os.path.exists(MODEL):
        print(f"check: train.py saved no {MODEL}")
        return 1
    loss = val_loss()
    print(f"check: validation loss {loss:.4f} (target {TARGET}), train.py took {seconds:.1f} s")
    if not loss <= TARGET:
        return 1
    with open(RESULT_FILE, "w") as out:
        json.dump({"seconds": seconds, "reference_s": REFERENCE_S, "val_loss": loss}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def train_script() -> str:
    return _TRAIN.replace("__VOCAB__", repr(VOCAB)).replace("__BLOCK__", str(BLOCK))


def check_script(target: float, reference_s: float, limit_s: float, result_file: str) -> str:
    return (
        _CHECK.replace("__VOCAB__", repr(VOCAB))
        .replace("__BLOCK__", str(BLOCK))
        .replace("__TARGET__", repr(target))
        .replace("__REFERENCE__", repr(reference_s))
        .replace("__LIMIT__", repr(limit_s))
        .replace("__RESULT__", repr(result_file))
    )
