"""Which `apply_rotary_pos_emb` functions of Hugging Face modeling modules fusewise.ops.apply_rotary
can stand in for, and the adaptors that do (hf_rotary.py puts one in place of the global).

A module-level function is recognised by its source, normalised (docstring, decorators, comments,
annotations' layout and whitespace dropped by an ast round trip), compared with APPLY_FORMS; the
name of the rotate helper it calls (rotate_half, rotate_half_llm, rotate_half_text,
rotate_every_two) is replaced by ROTATE first, and that helper (a global of the same module) must
be one of ROTATE_FORMS: HF's "rotate_half" pairing (i, i + h), or the GPT-J / GLM / Cohere pairing
(2i, 2i + 1), which is the op's interleaved=True. Recognised in transformers 5.17 (see the
counting test in tests/test_patch_hf_rotary.py):

* the Llama form, q * cos + ROTATE(q) * sin after cos.unsqueeze(unsqueeze_dim) (106 modules);
* the partial forms that rotate q[..., :cos.shape[-1]] and keep the rest (GPT-NeoX, Phi, Phi-3,
  StableLM, Nemotron, GLM-ASR...): the op's pass-through features;
* the upcasting forms (Cohere, OLMo, ESM, Hunyuan, ERNIE 4.5): fp32 math, one rounding to q's
  dtype, which is what the op does;
* GLM / Helium / ERNIE's cos[..., :n // 2].repeat_interleave(2) (done by the adaptor on cos);
* the one-tensor form apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim) (Gemma 3n, Gemma 4) and
  GPT-J / CodeGen's apply_rotary_pos_emb(tensor, sin, cos) with sin/cos [B, S, D/2] interleaved.

Not recognised (left alone, with the reason): a rotation of the last features (DeepSeek-V4),
cos/sin sliced per call (the q_len slice of muse_glimmer), q, k and v rotated together (CLVP),
an optional k (qwen4_exp), complex-number forms (PE audio/video, GPT-OSS's _apply_rotary_emb),
the prefix-token split of DINOv3, and a rotate helper of another sign (nanochat).

The adaptor takes the HF function's own parameters, computes what it computes (its dtype rules
included: the plain forms return q * cos's promoted dtype, the upcasting forms q's dtype) and
raises ValueError for what the op cannot express: q/k not 4-D, cos/sin not [B or 1, S, Dr], an
unsqueeze_dim other than 1 or 2 (2: q in [B, S, H, D], handled by a transposed view), a rotary
width that differs from the head's in a non-partial form (HF would broadcast or fail).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

import torch

from .. import ops

ROTATE = "ROTATE"
_ROTATE_NAMES = ("rotate_half_llm", "rotate_half_text", "rotate_half", "rotate_every_two")

QK, QK_POSITION_IDS, X, GPTJ = "q_k", "q_k_position_ids", "x", "gptj"  # the call signatures
AS_IS, HALF_REPEAT, REPEAT = "as is", "first half repeat_interleave(2)", "repeat_interleave(2)"


@dataclass(frozen=True)
class RotaryForm:
    call: str  # QK, QK_POSITION_IDS, X, GPTJ: which parameters (adaptor_for builds the same)
    cos: str = AS_IS  # what the function does to cos/sin before using them per feature
    partial: bool = False  # rotates x[..., :Dr] and keeps the rest (else Dr must equal D)
    upcast: bool = False  # fp32 math, returns q's dtype (else HF's type promotion of q * cos)

    def describe(self, interleaved: bool) -> str:
        parts = ["interleaved=True" if interleaved else "rotate_half"]
        if self.partial:
            parts.append("partial (features past cos.shape[-1] kept)")
        if self.cos != AS_IS:
            parts.append(f"cos/sin {self.cos}")
        if self.upcast:
            parts.append("fp32 math")
        return ", ".join(parts)


def normalised(fn) -> str:
    """fn's source as ast.unparse writes it, without its docstring and decorators."""
    return normalised_node(ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0])


def normalised_node(node: ast.FunctionDef) -> str:
    """normalised() of a parsed function definition (changed in place)."""
    node.decorator_list = []
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        node.body = body[1:]
    return ast.unparse(node)


def _norm(text: str) -> str:
    return ast.unparse(ast.parse(textwrap.dedent(text)))


ROTATE_FORMS = {
    _norm(
        """def ROTATE(x):
    x1 = x[..., :x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)"""
    ): False,
    _norm(
        """def ROTATE(x):
    x1 = x[..., 0::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)"""
    ): True,
    _norm(
        """def ROTATE(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    rot_x = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return rot_x"""
    ): True,
    _norm(
        """def ROTATE(x: torch.Tensor) -> torch.Tensor:
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)"""
    ): True,
}

_UNSQ = "cos = cos.unsqueeze(unsqueeze_dim)\n    sin = sin.unsqueeze(unsqueeze_dim)\n"
_HALF = (
    "cos = cos[..., :cos.shape[-1] // 2].repeat_interleave(2, dim=-1)\n"
    "    sin = sin[..., :sin.shape[-1] // 2].repeat_interleave(2, dim=-1)\n"
)
_QK = "def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):\n    "
_SPLIT = (
    "rotary_dim = cos.shape[-1]\n"
    "    q_rot, q_pass = (q[..., :rotary_dim], q[..., rotary_dim:])\n"
    "    k_rot, k_pass = (k[..., :rotary_dim], k[..., rotary_dim:])\n"
)
_PARTIAL_BODY = (
    _SPLIT + "    q_embed = q_rot * cos + ROTATE(q_rot) * sin\n"
    "    k_embed = k_rot * cos + ROTATE(k_rot) * sin\n"
    "    q_embed = torch.cat([q_embed, q_pass], dim=-1)\n"
    "    k_embed = torch.cat([k_embed, k_pass], dim=-1)\n"
    "    return (q_embed, k_embed)"
)
_PLAIN_BODY = (
    "q_embed = q * cos + ROTATE(q) * sin\n"
    "    k_embed = k * cos + ROTATE(k) * sin\n"
    "    return (q_embed, k_embed)"
)
_FLOAT_BODY = (
    "q_embed = q.float() * cos + ROTATE(q).float() * sin\n"
    "    k_embed = k.float() * cos + ROTATE(k).float() * sin\n"
    "    return (q_embed.to(original_dtype), k_embed.to(original_dtype))"
)

_SOURCES = {
    _QK + _UNSQ + "    " + _PLAIN_BODY: RotaryForm(QK),  # Llama and most
    _QK + _UNSQ + "    " + _PARTIAL_BODY: RotaryForm(QK, partial=True),  # GPT-NeoX, Phi...
    _QK
    + _UNSQ
    + "    "
    + _SPLIT
    + "    q_embed = torch.cat([q_rot * cos + ROTATE(q_rot) * sin, q_pass], dim=-1)\n"
    "    k_embed = torch.cat([k_rot * cos + ROTATE(k_rot) * sin, k_pass], dim=-1)\n"
    "    return (q_embed, k_embed)": RotaryForm(QK, partial=True),  # Phi-3
    _QK + _UNSQ + "    rot_dim = cos.shape[-1]\n"
    "    q, q_pass = (q[..., :rot_dim], q[..., rot_dim:])\n"
    "    k, k_pass = (k[..., :rot_dim], k[..., rot_dim:])\n"
    "    q_embed = q * cos + ROTATE(q) * sin\n"
    "    k_embed = k * cos + ROTATE(k) * sin\n"
    "    return (torch.cat((q_embed, q_pass), dim=-1), torch.cat((k_embed, k_pass), dim=-1))": (
        RotaryForm(QK, partial=True)  # Nemotron
    ),
    "def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):\n    "
    + _UNSQ
    + "    "
    + _PARTIAL_BODY: RotaryForm(QK_POSITION_IDS, partial=True),  # GLM-ASR
    _QK + _UNSQ + "    " + _HALF + "    " + _PARTIAL_BODY: (
        RotaryForm(QK, cos=HALF_REPEAT, partial=True)  # GLM, GLM-4, Moonshine
    ),
    _QK + _UNSQ + "    " + _HALF + "    " + _PLAIN_BODY: RotaryForm(QK, cos=HALF_REPEAT),  # Helium
    _QK + "dtype = q.dtype\n    q = q.float()\n    k = k.float()\n    " + _UNSQ + "    "
    "q_embed = q * cos + ROTATE(q) * sin\n"
    "    k_embed = k * cos + ROTATE(k) * sin\n"
    "    return (q_embed.to(dtype=dtype), k_embed.to(dtype=dtype))": (
        RotaryForm(QK, upcast=True)  # Cohere
    ),
    _QK + "q_type, k_type = (q.dtype, k.dtype)\n    " + _UNSQ + "    "
    "q_embed = q * cos + ROTATE(q) * sin\n"
    "    k_embed = k * cos + ROTATE(k) * sin\n"
    "    return (q_embed.to(q_type), k_embed.to(k_type))": (
        # OLMo: the product is promoted, then rounded to q's dtype; the op's fp32 math with one
        # rounding equals it whenever cos is fp32, and rounds once where HF rounds per product
        RotaryForm(QK, upcast=True)
    ),
    _QK + "original_dtype = q.dtype\n    " + _UNSQ + "    "
    "q_embed = q.float() * cos + ROTATE(q.float()) * sin\n"
    "    k_embed = k.float() * cos + ROTATE(k.float()) * sin\n"
    "    return (q_embed.to(original_dtype), k_embed.to(original_dtype))": (
        RotaryForm(QK, upcast=True)  # ESM, ModernBERT
    ),
    _QK + "original_dtype = q.dtype\n    " + _UNSQ + "    " + _HALF + "    " + _FLOAT_BODY: (
        RotaryForm(QK, cos=HALF_REPEAT, upcast=True)  # ERNIE 4.5
    ),
    _QK + "original_dtype = q.dtype\n    " + _UNSQ + "    " + _FLOAT_BODY: (
        RotaryForm(QK, upcast=True)  # ERNIE 4.5 VL
    ),
    _QK + "origin_dtype = q.dtype\n    q, k = (q.float(), k.float())\n"
    "    cos = cos.unsqueeze(unsqueeze_dim).float()\n"
    "    sin = sin.unsqueeze(unsqueeze_dim).float()\n"
    "    q_embed = q * cos + ROTATE(q) * sin\n"
    "    k_embed = k * cos + ROTATE(k) * sin\n"
    "    return (q_embed.to(origin_dtype), k_embed.to(origin_dtype))": (
        RotaryForm(QK, upcast=True)  # Hunyuan VL
    ),
    "def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, "
    "unsqueeze_dim: int=1):\n    " + _UNSQ + "    return x * cos + ROTATE(x) * sin": (
        RotaryForm(X)  # Gemma 3n, Gemma 4
    ),
    "def apply_rotary_pos_emb(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> "
    "torch.Tensor:\n"
    "    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)\n"
    "    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)\n"
    "    return tensor * cos + ROTATE(tensor) * sin": RotaryForm(GPTJ, cos=REPEAT),  # GPT-J
}
APPLY_FORMS: dict[str, RotaryForm] = {_norm(text): form for text, form in _SOURCES.items()}


def hub_function(fn):
    """The plain function behind a hub-kernel wrapper, else fn. transformers >= 5.25 decorates
    apply_rotary_pos_emb with use_kernel_forward_from_hub; with the `kernels` package installed
    the module's global is then an nn.Module instance (kernel_layer_name set) whose class forward
    calls the function, held in its closure cell `func`, unless kernelize() gave the instance a
    forward of its own (a hub kernel: kept, fn returned as it is)."""
    if not isinstance(fn, torch.nn.Module) or not hasattr(fn, "kernel_layer_name"):
        return fn
    if "forward" in vars(fn):
        return fn
    forward = type(fn).forward
    code = getattr(forward, "__code__", None)
    if code is None or "func" not in code.co_freevars:
        return fn
    inner = forward.__closure__[code.co_freevars.index("func")].cell_contents
    return inner if inspect.isfunction(inner) else fn


def recognise(fn, module_globals: dict) -> tuple[RotaryForm, bool] | str:
    """(form, interleaved) for a module's apply_rotary_pos_emb, or why it is not recognised."""
    fn = hub_function(fn)
    if not inspect.isfunction(fn):
        return f"its apply_rotary_pos_emb is a {type(fn).__name__}, not a plain function"
    if hasattr(fn, "__wrapped__"):
        return "its apply_rotary_pos_emb is wrapped (a hub kernel?): the wrapper would be dropped"

    def helper_source(name: str) -> str | None:
        helper = module_globals.get(name)
        if not inspect.isfunction(helper) or hasattr(helper, "__wrapped__"):
            return None
        return normalised(helper)

    try:
        return recognise_source(normalised(fn), helper_source)
    except (OSError, TypeError, SyntaxError) as e:
        return f"the source of its apply_rotary_pos_emb or rotate helper cannot be read ({e})"


def recognise_source(text: str, helper_source) -> tuple[RotaryForm, bool] | str:
    """recognise() on source: `text` the function's normalised(), helper_source(name) the
    normalised source of the module's function `name` (None if it is no plain function)."""
    tree = ast.parse(text)
    called = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in _ROTATE_NAMES}
    if len(called) != 1:
        return "its apply_rotary_pos_emb calls no single known rotate helper"
    (rotate_name,) = called
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == rotate_name:
            n.id = ROTATE
    form = APPLY_FORMS.get(ast.unparse(tree))
    if form is None:
        return "its apply_rotary_pos_emb is not a form fusewise knows (hf_rotary_forms.py)"
    rotate = helper_source(rotate_name)
    if rotate is None:
        return f"its {rotate_name} is not a plain function"
    rtree = ast.parse(rotate)
    rtree.body[0].name = ROTATE
    interleaved = ROTATE_FORMS.get(ast.unparse(rtree))
    if interleaved is None:
        return f"its {rotate_name} is not a pairing fusewise knows (hf_rotary_forms.py)"
    return form, interleaved


def adaptor_for(form: RotaryForm, interleaved: bool):
    """A function with the HF function's parameters that computes it with fusewise.ops."""

    def rotate(q, k, cos, sin, unsqueeze_dim):
        return _rotate(form, interleaved, q, k, cos, sin, unsqueeze_dim)

    if form.call == QK:

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            return rotate(q, k, cos, sin, unsqueeze_dim)

    elif form.call == QK_POSITION_IDS:

        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return rotate(q, k, cos, sin, unsqueeze_dim)  # HF's ignores position_ids too

    elif form.call == X:

        def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
            return rotate(x, None, cos, sin, unsqueeze_dim)[0]

    else:

        def apply_rotary_pos_emb(tensor, sin, cos):  # sin first, as GPT-J's
            return rotate(tensor, None, cos, sin, 2)[0]

    apply_rotary_pos_emb.__qualname__ = "apply_rotary_pos_emb (fusewise adaptor)"
    apply_rotary_pos_emb.fusewise_form = (form, interleaved)
    return apply_rotary_pos_emb


def _fail(what: str):
    raise ValueError(
        f"fusewise's apply_rotary_pos_emb (fusewise.patch(model, rotary=True)) cannot express "
        f"{what}; HF's function would compute something else. Call fusewise.unpatch(model) or "
        f"patch with rotary=False for this call."
    )


def _rotate(form: RotaryForm, interleaved: bool, q, k, cos, sin, unsqueeze_dim):
    """HF's function on q (and k, or None for the one-tensor forms) via fusewise.ops."""
    tensors = (q, cos, sin) if k is None else (q, k, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        _fail("non-tensor arguments")
    if isinstance(unsqueeze_dim, bool) or not isinstance(unsqueeze_dim, int):
        _fail(f"unsqueeze_dim={unsqueeze_dim!r}")
    if cos.dim() != 3 or sin.shape != cos.shape:
        _fail(f"cos/sin of shapes {tuple(cos.shape)}, {tuple(sin.shape)} (wants [B, S, Dr])")
    if -4 <= unsqueeze_dim < 0:
        unsqueeze_dim += 4
    if unsqueeze_dim not in (1, 2):
        _fail(f"unsqueeze_dim={unsqueeze_dim} (1: q [B, H, S, D]; 2: q [B, S, H, D])")
    heads_second = unsqueeze_dim == 1
    if q.dim() != 4 or (k is not None and k.dim() != 4):
        _fail("q/k that are not 4-D")
    if form.cos == HALF_REPEAT:
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    elif form.cos == REPEAT:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    if not form.partial and cos.shape[-1] != q.shape[-1]:
        _fail(f"a rotary width {cos.shape[-1]} other than the head's {q.shape[-1]}")
    qh = q if heads_second else q.transpose(1, 2)  # [B, H, S, D], a view
    kh = qh[:, :1] if k is None else (k if heads_second else k.transpose(1, 2))
    batch, seq = qh.shape[0], qh.shape[2]
    if cos.shape[1] != seq or cos.shape[0] not in (1, batch):
        _fail(f"cos/sin {tuple(cos.shape)} for q of {batch} sequences of {seq}")
    if cos.shape[0] != batch:
        cos, sin = cos[0], sin[0]  # [S, Dr], broadcast over the batch as HF's
    if not form.upcast:  # HF's q * cos: the promoted dtype (fp32 cos with bf16 q gives fp32)
        qh, kh = _promoted(qh, cos, sin), _promoted(kh, cos, sin)
    q_out, k_out = ops.apply_rotary(qh, kh, cos, sin, interleaved=interleaved)
    if not heads_second:
        q_out, k_out = q_out.transpose(1, 2), k_out.transpose(1, 2)
    return q_out, (None if k is None else k_out)


def _promoted(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dtype = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)
    return x if dtype == x.dtype else x.to(dtype)
