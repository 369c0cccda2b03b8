"""What a KV cache format costs in accuracy, measured against HF transformers in fp32.

Held-out chats (multi-turn, a long system prompt, French / German / Russian / Chinese / Spanish)
are run through the engine's own model and pool, teacher-forced: each chat but its last DECODE
tokens as chunked prefill (CHUNK tokens per step, each chunk attending to the cached chunks before
it), then every further token as one batched decode step, so the decode kernel, prefill and
prefix attention all read the pool in the format under test. At every position the engine's
next-token distribution is compared with HF fp32's on the same tokens:
  KL(HF || engine), mean over positions, and top-1 agreement (argmax equal).
Greedy agreement (the first 64 generated tokens, engine vs HF greedy) is measured separately
through LLM.generate.

`python -m bench.kv_accuracy --heldout` runs the held-out chats instead (bench/kv_heldout.py: greedy
agreement, KL and top-1 per format and CPU path, beside llama.cpp's cache types).
`python -m bench.kv_accuracy` prints the table for float32 / bfloat16 / int8 KV (without and with
the Hadamard rotation) under fp32 weights (--study: other int8 formats, fake-quantized inside HF);
tests/engine/kv/test_kv_cache_accuracy.py
asserts the rule of docs/BENCHMARKS.md with it.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass

import torch

DECODE, CHUNK = (
    48,
    128,
)  # the last DECODE tokens of each chat are decode steps; before: prefill chunks

SYSTEM = (
    "You are Atlas, a careful travel and language assistant for a small agency in Lyon. Answer in the "
    "language of the user's last message. Keep answers short, give prices in euros, never invent "
    "opening hours, say when you are unsure, and end with one practical tip. Customers are often "
    "elderly; avoid jargon, spell out abbreviations, and prefer trains to flights when the trip "
    "is under five hours. If a question is about health or visas, point to the official source."
)

CHATS = [
    [
        ("user", "We want to go from Lyon to Barcelona in May with two children. Train or car?"),
        (
            "assistant",
            "The train is easier: a direct TGV takes about five hours and children under four "
            "travel free. By car it is six and a half hours plus tolls of roughly 70 euros.",
        ),
        ("user", "And if we stop one night on the way, where would you suggest?"),
        (
            "assistant",
            "Montpellier or Perpignan both work. Perpignan is closer to the border, has a "
            "calm old town and family hotels from about 90 euros a night.",
        ),
        ("user", "What should we pack for the beach in May, is the sea warm enough?"),
    ],
    [
        (
            "user",
            "Bonjour, je voudrais visiter Annecy un dimanche. Est-ce que les magasins sont ouverts ?",
        ),
        (
            "assistant",
            "Le dimanche, beaucoup de boutiques du centre sont fermées, mais le marché de la "
            "vieille ville a lieu le matin et les cafés restent ouverts.",
        ),
        ("user", "Et pour le lac, peut-on louer un bateau sans permis ?"),
        (
            "assistant",
            "Oui, des bateaux électriques sans permis se louent près du Pâquier, environ "
            "45 euros l'heure pour quatre personnes.",
        ),
        (
            "user",
            "Merci ! Quel train dois-je prendre depuis Lyon Part-Dieu, et combien de temps dure le trajet ?",
        ),
    ],
    [
        (
            "user",
            "Guten Tag, wir planen eine Radtour entlang der Rhône. Wie viele Kilometer pro Tag sind realistisch?",
        ),
        (
            "assistant",
            "Für gemütliche Fahrer sind 40 bis 60 Kilometer pro Tag gut machbar; mit E-Bikes "
            "auch 70. Die ViaRhôna ist größtenteils flach und gut ausgeschildert.",
        ),
        ("user", "Kann man die Fahrräder im Zug mitnehmen, falls es regnet?"),
        (
            "user",
            "Und welche Unterkünfte sind fahrradfreundlich, mit abschließbarem Raum für die Räder?",
        ),
    ],
    [
        ("user", "Здравствуйте! Мы хотим провести три дня в Париже осенью. С чего начать?"),
        (
            "assistant",
            "Начните с Лувра утром в будний день, затем прогулка по Сене. Музейный "
            "абонемент на два дня стоит около 70 евро.",
        ),
        ("user", "А где лучше остановиться, чтобы было недорого и безопасно?"),
        (
            "assistant",
            "Хорошие варианты: районы у площади Бастилии или у Монмартра, от 110 евро за ночь.",
        ),
        ("user", "Нужна ли виза для граждан Казахстана и как долго её оформляют?"),
    ],
    [
        ("user", "你好，我们想从里昂去瑞士日内瓦玩一天，怎么去最方便？"),
        ("assistant", "坐火车最方便，大约两小时，票价二十到四十欧元。日内瓦市中心可以步行游览。"),
        ("user", "日内瓦有什么适合老人参观的地方？"),
        ("assistant", "可以去湖边的英国花园和大喷泉，还有联合国万国宫的导览，路都比较平。"),
        ("user", "瑞士用欧元吗？我们需要换钱吗？"),
    ],
    [
        ("user", "Hola, ¿qué tiempo suele hacer en Marsella en octubre?"),
        (
            "assistant",
            "Suele ser templado, entre 15 y 22 grados, con algún día de mistral, un viento frío del norte.",
        ),
        ("user", "¿Y qué barrio nos recomienda para cenar pescado fresco sin gastar demasiado?"),
        (
            "assistant",
            "El Vallon des Auffes y el Puerto Viejo tienen buenos sitios; una bullabesa auténtica cuesta unos 60 euros.",
        ),
        (
            "user",
            "Perfecto. ¿Hay excursiones en barco a las calas desde el puerto, y cuánto cuestan para cuatro adultos?",
        ),
    ],
    [
        (
            "user",
            "Can you explain how to read a French train ticket? I always get confused by the codes.",
        ),
        (
            "assistant",
            "Sure. The ticket shows the train number, the coach (voiture) and the seat (place). "
            "'Salle haute' means the upper deck on a double-decker TGV.",
        ),
        ("user", "What does 'échangeable sans frais' mean?"),
        (
            "assistant",
            "It means you can change the ticket for free, usually until a few days before departure.",
        ),
        (
            "user",
            "Great. Last question: if my train is two hours late, what compensation can I claim and how?",
        ),
    ],
]


def chat_token_ids(tokenizer) -> list[list[int]]:
    """The chats with the shared system prompt, tokenized with the model's chat template."""
    out = []
    for turns in CHATS:
        msgs = [{"role": "system", "content": SYSTEM}] + [
            {"role": r, "content": c} for r, c in turns
        ]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


@torch.inference_mode()
def hf_logits(hf_model, seqs) -> list[torch.Tensor]:
    return [hf_model(torch.tensor([s])).logits[0].float() for s in seqs]


@torch.inference_mode()
def engine_logits(
    runner, seqs, decode: int = DECODE, chunk: int = CHUNK, group: int | None = None
) -> list[torch.Tensor]:
    """Teacher-forced next-token logits [len, vocab] per sequence, from runner.model on runner.kv_pool
    (chunked prefill of all but the last `decode` tokens, then batched decode steps: all sequences'
    j-th tokens in one step, or `group` sequences per step; group=1 is one chat's decode, the lean
    C++ step's shape when the runner has one). Blocks are handed out in a permuted order, so block
    tables are not contiguous."""
    from engine.exec.models.llama import AttentionMetadata

    model, pool, bs = runner.model, runner.kv_pool, runner.cfg.block_size
    need = [-(-len(s) // bs) for s in seqs]
    ids = (
        torch.randperm(pool.shape[2] - 1, generator=torch.Generator().manual_seed(0)) + 1
    ).tolist()
    assert sum(need) <= len(ids), "pool too small for the chats"
    tables = torch.zeros(len(seqs), max(need), dtype=torch.int32)
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor([ids.pop() for _ in range(n)])
    logits: list = [[] for _ in seqs]  # per sequence, [n, vocab] pieces in position order

    def step(rows):  # rows: [(seq index, start, n)]
        tok, pos, slots, cu = [], [], [], [0]
        for i, a, n in rows:
            p = torch.arange(a, a + n)
            tok += seqs[i][a : a + n]
            pos.append(p)
            slots.append(tables[i, p // bs].long() * bs + p % bs)
            cu.append(cu[-1] + n)
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slots),
            block_tables=tables[[i for i, _, _ in rows]],
            seq_lens=torch.tensor([a + n for _, a, n in rows], dtype=torch.int32),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
            max_seqlen_q=max(n for _, _, n in rows),
            backend=runner.backend,
        )
        out = model.forward(torch.tensor(tok), torch.cat(pos), pool, meta, torch.arange(cu[-1]))
        for (i, a, n), c in zip(rows, cu):
            logits[i].append(out[c : c + n])

    starts = [max(1, len(s) - decode) for s in seqs]
    for i, s in enumerate(seqs):
        for a in range(0, starts[i], chunk):
            step([(i, a, min(chunk, starts[i] - a))])
    for j in range(
        max(len(s) - a for s, a in zip(seqs, starts))
    ):  # the sequences' j-th decode tokens together
        rows = [(i, a + j, 1) for i, (s, a) in enumerate(zip(seqs, starts)) if a + j < len(s)]
        for g in range(0, len(rows), group or len(rows)):
            step(rows[g : g + (group or len(rows))])
    return [torch.cat(parts) for parts in logits]


@dataclass
class Accuracy:
    kv_cache_dtype: str
    positions: int
    mean_kl: float  # mean over positions of KL(HF fp32 || engine), nats
    top1: float  # fraction of positions whose argmax equals HF's

    def row(self) -> str:
        return f"| {self.kv_cache_dtype} | {self.positions} | {self.mean_kl:.2e} | {100 * self.top1:.2f}% |"


ROWS = 16  # positions per float64 pass in compare()


def compare(name: str, ref: list[torch.Tensor], got: list[torch.Tensor]) -> Accuracy:
    """Mean KL(HF || engine) and top-1 agreement over every position, in float64. ROWS positions at
    a time: a [16 x 49,152] float64 block (6 MiB) stays in cache through the ~10 element-wise passes;
    a whole sequence at a time streamed each pass through memory (measured on 600 positions: 2.6 s,
    0.4 s in blocks of 16; the same sums up to float64 rounding)."""
    kl_sum, same, n = 0.0, 0, 0
    for r_seq, g_seq in zip(ref, got):
        for a in range(0, r_seq.shape[0], ROWS):
            r, g = r_seq[a : a + ROWS].double(), g_seq[a : a + ROWS].double()
            lp, lq = r.log_softmax(-1), g.log_softmax(-1)
            kl_sum += float((lp.exp() * (lp - lq)).sum())
            same += int((r.argmax(-1) == g.argmax(-1)).sum())
            n += r.shape[0]
    return Accuracy(name, n, kl_sum / n, same / n)


def hf_greedy(hf_model, seqs, n: int = 64) -> list[list[int]]:
    """HF fp32's first n greedy tokens after each chat (the reference greedy_agreement compares to)."""
    out = []
    with torch.inference_mode():
        for s in seqs:
            x = torch.tensor([s])
            out.append(
                hf_model.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=n,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=hf_model.config.eos_token_id,
                )[0, len(s) :].tolist()
            )
    return out


def hf_greedy_draft(hf_model, seq: list[int], n: int, draft: list[int]) -> list[int]:
    """hf_greedy for one chat, answered with a draft's help (as tests/engine/hf_reference.py does):
    one forward over seq + draft gives the model's argmax after every prefix; draft tokens are kept
    while they are that argmax, and generate() continues from the first that is not. Usable inside
    hf_kv_format (its fake quantization is per row, the same in one forward as step by step)."""
    with torch.inference_mode():
        am = hf_model(torch.tensor([seq + draft[:n]])).logits[0, len(seq) - 1 :].argmax(-1).tolist()
    out = []
    for j in range(n):
        out.append(am[j])
        if j >= len(draft) or am[j] != draft[j]:
            break
    if len(out) < n:
        out += hf_greedy(hf_model, [seq + out], n - len(out))[0]
    return out


def engine_greedy(llm, seqs, n: int = 64) -> list[list[int]]:
    """The engine's first n greedy tokens after each chat (EOS ignored, as in hf_greedy)."""
    from engine.sampling.sampling_params import SamplingParams

    outs = llm.generate(
        [{"prompt_token_ids": s} for s in seqs],
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def agreement(refs: list[list[int]], outs: list[list[int]], n: int = 64) -> float:
    """Mean over chats of the fraction of the first n tokens equal to the reference's, counted up to
    the first difference (after it the two continue different texts)."""
    fracs = []
    for ref, got in zip(refs, outs):
        same = next(
            (i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got))
        )
        fracs.append(same / n)
    return sum(fracs) / len(fracs)


def greedy_agreement(
    llm, hf_model, seqs, n: int = 64, refs: list[list[int]] | None = None
) -> float:
    """agreement() of the engine's greedy tokens with HF fp32 greedy's. refs: hf_greedy's answer,
    when the caller already has it (HF decodes ~4x slower than the engine here)."""
    outs = engine_greedy(llm, seqs, n)
    return agreement(refs if refs is not None else hf_greedy(hf_model, seqs, n), outs, n)


def build_runner(
    loaded,
    kv_cache_dtype: str,
    num_blocks: int = 256,
    dtype: str = "float32",
    rotation: str = "auto",
    lean_step: str = "auto",
    quantization: str | None = None,
):
    """kv_cache_dtype may name the rotation after a slash: "int8/none", "int8/hadamard"."""
    from engine.config import EngineConfig
    from engine.exec.model_runner import ModelRunner

    kv_cache_dtype, _, rot = kv_cache_dtype.partition("/")
    cfg = EngineConfig(
        num_blocks=num_blocks,
        device="cpu",
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_rotation=rot or rotation,
        lean_step=lean_step,
        quantization=quantization,
    )
    return ModelRunner(cfg, loaded.config, loaded.weights)


# ---- the design study: which int8 granularity, and does a Hadamard rotation pay? -------------
# Fake quantization inside HF's own attention (K after RoPE, V), so only the KV format differs.


def hadamard(d: int, seed: int = 0) -> torch.Tensor:
    """A fixed random orthonormal Hadamard rotation (Sylvester Hadamard x random signs), [d, d]."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    signs = (
        torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(seed)).double() * 2 - 1
    )
    return (signs[:, None] * h / d**0.5).float()


def _fake_int8(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    scale = (amax / 127).clamp_min(1e-30)
    return torch.round(x / scale).clamp(-127, 127) * scale


def fake_quant(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """x [B, kvh, T, d] -> what a pool in `scheme` would give back."""
    if scheme == "bfloat16":
        return x.to(torch.bfloat16).float()
    if scheme == "int8/token":  # one scale per token per KV head (ours)
        return _fake_int8(x, x.abs().amax(-1, keepdim=True))
    if scheme == "int8/block":  # one scale per 16-token block per KV head
        B, h, T, d = x.shape
        pad = (-T) % 16
        xp = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(B, h, -1, 16, d)
        out = _fake_int8(xp, xp.abs().amax((-1, -2), keepdim=True))
        return out.view(B, h, T + pad, d)[:, :, :T]
    if (
        scheme == "int8/token+hadamard"
    ):  # the first study's: random signs x Sylvester (not symmetric)
        r = hadamard(x.shape[-1]).to(x)
        return fake_quant(x @ r, "int8/token") @ r.T
    if scheme == "int8/token+rot":  # the engine's rotation: symmetric H / sqrt(d) (kv_quant)
        from kernels import kv_quant

        r = kv_quant.hadamard(x.shape[-1]).to(x)
        return fake_quant(x @ r, "int8/token") @ r
    if scheme.startswith("int8/g"):  # int8/g32f16[+rot]: a scale per G elements, stored
        # as fp16 ("f16", 2 bytes: g32f16 is the same 68 bytes per row as ours) or fp32 ("f32")
        base, _, rot = scheme.partition("+")
        g, sdt = base[len("int8/g") :].split("f")
        if rot:
            from kernels import kv_quant

            r = kv_quant.hadamard(x.shape[-1]).to(x)
            return fake_quant(x @ r, base) @ r
        xg = x.unflatten(-1, (-1, int(g)))
        amax = xg.abs().amax(-1, keepdim=True)
        amax = amax.to(
            torch.float16 if sdt == "16" else torch.float32
        ).float()  # the scale's storage
        return _fake_int8(xg, amax).flatten(-2)
    if scheme in ("q8_0", "llama.cpp-q8_0"):  # llama.cpp's q8_0 cache (+ its q8_0 query)
        return fake_q8_0(x)
    if scheme == "int8/tensor":  # the per-tensor mutant
        return _fake_int8(x, x.abs().amax())
    raise ValueError(scheme)


STUDY = (
    "bfloat16",
    "int8/token",
    "int8/block",
    "int8/token+hadamard",
    "int8/token+rot",
    "int8/g32f16",
    "int8/g32f16+rot",
    "int8/tensor",
    "q8_0",
    "llama.cpp-q8_0",
)


def fake_q8_0(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's q8_0 on CPU, value for value: blocks of 32 along the last dim, d = amax / 127 in
    fp32, codes round(x * (1 / d)) half away from zero (C's roundf), d stored as fp16 and the
    values read back as code * fp16(d) (ggml's quantize_row_q8_0_ref and dequantize_row_q8_0)."""
    xg = x.float().unflatten(-1, (-1, 32))
    d = xg.abs().amax(-1, keepdim=True) / 127
    y = xg * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.sign(y) * torch.floor(y.abs() + 0.5)
    return (codes * d.half().float()).flatten(-2).to(x.dtype)


def emulated_q(scheme: str) -> bool:
    """ "llama.cpp-q8_0": K and V in q8_0, and q too: ggml's CPU flash attention converts the query to
    the K cache's dot-product type (q8_0 for a q8_0 cache) before every q . k."""
    return scheme == "llama.cpp-q8_0"


@contextlib.contextmanager
def hf_kv_format(hf_model, scheme: str):
    """HF's own attention with K (after RoPE) and V fake-quantized in `scheme` (fake_quant), so
    only the KV format differs from HF fp32; inside, hf_model's logits and generate() see it."""
    import transformers.models.llama.modeling_llama as ml

    real = ml.eager_attention_forward
    old_impl = hf_model.config._attn_implementation
    hf_model.config._attn_implementation = "eager"
    quant = fake_q8_0 if emulated_q(scheme) else (lambda t: fake_quant(t, scheme))
    ml.eager_attention_forward = lambda m, q, k, v, *a, **kw: real(
        m, fake_q8_0(q) if emulated_q(scheme) else q, quant(k), quant(v), *a, **kw
    )
    try:
        yield hf_model
    finally:
        ml.eager_attention_forward = real
        hf_model.config._attn_implementation = old_impl


@torch.inference_mode()
def study(hf_model, seqs, schemes=STUDY) -> list[Accuracy]:
    ref = hf_logits(hf_model, seqs)
    rows = []
    for sch in schemes:
        with hf_kv_format(hf_model, sch):
            rows.append(compare(sch, ref, hf_logits(hf_model, seqs)))
    return rows


def main() -> None:
    import sys

    if "--heldout" in sys.argv[1:]:  # the held-out chats, beside llama.cpp (bench/kv_heldout.py)
        from bench import kv_heldout

        raise SystemExit(kv_heldout.main([x for x in sys.argv[1:] if x != "--heldout"]))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--kv",
        default="float32,bfloat16,int8/none,int8",
        help="KV formats; int8 = int8 with its default Hadamard rotation, int8/none = without",
    )
    p.add_argument(
        "--study",
        action="store_true",
        help="fake-quantized HF: per-token vs per-block scales, Hadamard",
    )
    p.add_argument("--schemes", default=",".join(STUDY), help="--study: which formats")
    p.add_argument("--chats", type=int, default=len(CHATS), help="use the first N chats only")
    a = p.parse_args()
    if a.study:
        from transformers import AutoModelForCausalLM
        from engine.exec.loader import load_model

        loaded = load_model(None)
        hf = AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=torch.float32).eval()
        print(
            "| KV format (fake-quantized in HF) | positions | mean KL vs HF fp32 | top-1 agreement |\n|---|---|---|---|"
        )
        for r in study(
            hf, chat_token_ids(loaded.tokenizer)[: a.chats], tuple(a.schemes.split(","))
        ):
            print(r.row(), flush=True)
        return
    from transformers import AutoModelForCausalLM
    from engine.exec.loader import load_model

    loaded = load_model(None)
    hf = AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=torch.float32).eval()
    seqs = chat_token_ids(loaded.tokenizer)[: a.chats]
    ref = hf_logits(hf, seqs)
    print(
        "| KV cache dtype | positions | mean KL vs HF fp32 | top-1 agreement |\n|---|---|---|---|"
    )
    for kv in a.kv.split(","):
        print(compare(kv, ref, engine_logits(build_runner(loaded, kv), seqs)).row(), flush=True)


if __name__ == "__main__":
    main()
