import torch

import fusewise
from fusewise.examples.gpt import GPT, GPTConfig


class MyNorm(torch.nn.LayerNorm):
    def forward(self, x):
        return super().forward(x) * 2


def test_patch_swaps_norms_in_place_and_keeps_parameters(device):
    c = GPTConfig(vocab=64, seq=16, d_model=32, heads=2, layers=2, batch=2)
    model = GPT(c, "clean").to(device)
    model.extra = torch.nn.Sequential(torch.nn.RMSNorm(32), MyNorm(32)).to(device)
    params = {n: p for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 32, device=device)
    before = [model.blocks[0].ln1(x), model.extra[0](x)]
    changes = fusewise.patch(model)
    swapped = {ch.name: ch.now for ch in changes}
    assert swapped["blocks.0.ln1"] == "LayerNorm" and swapped["extra.0"] == "RMSNorm"
    assert swapped["extra.1"] is None  # the user's subclass is reported, not replaced
    assert next(ch for ch in changes if ch.name == "extra.1").reason.startswith("a subclass")
    assert type(model.blocks[0].ln1) is fusewise.nn.LayerNorm and type(model.extra[1]) is MyNorm
    assert {n: p for n, p in model.named_parameters()} == params  # the same Parameter objects
    assert opt.param_groups[0]["params"][0] is next(model.parameters())
    after = [model.blocks[0].ln1(x), model.extra[0](x)]
    for a, b in zip(after, before):
        assert torch.allclose(a, b, atol=1e-5)
    assert fusewise.patch(model) == [ch for ch in changes if ch.now is None]  # idempotent
