"""engine.maths.optim against torch.optim: the same parameters after every step, for each optimiser,
with and without weight decay: the fused kernel bit for bit against torch's fused Adam (what the
trainers ran before), and the rule written out (``reference_step``) to rounding in float64 and float32."""

from __future__ import annotations

import pytest
import torch

from engine.maths.optim import OPTIMIZERS

REFERENCE = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("dtype, fused", [(torch.float64, False), (torch.float32, True)])
@pytest.mark.parametrize("written_out", [False, True])
def test_each_step_matches_torch_optim(name, weight_decay, dtype, fused, written_out):
    g = torch.Generator().manual_seed(3)
    start = [torch.randn(7, 5, generator=g, dtype=dtype), torch.randn(4, generator=g, dtype=dtype)]
    ours = [p.clone().requires_grad_() for p in start]
    theirs = [p.clone().requires_grad_() for p in start]
    lr = 0.3 if name == "sgd" else 0.01
    opt = OPTIMIZERS[name](ours, lr=lr, weight_decay=weight_decay)
    kw = {"fused": True} if fused and name != "sgd" else {}
    ref = REFERENCE[name](theirs, lr=lr, weight_decay=weight_decay, **kw)
    # the fused kernel against torch's fused Adam: the same bits; the rule written out: to rounding
    same_kernel = fused and not written_out and name != "sgd"
    tol = ({"rtol": 0.0, "atol": 0.0} if same_kernel else {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64
           else {"rtol": 2e-5, "atol": 1e-6})
    step = opt.reference_step if written_out and name != "sgd" else opt.step
    for _ in range(25):
        grads = [torch.randn(p.shape, generator=g, dtype=dtype) for p in start]
        for o, t, gr in zip(ours, theirs, grads, strict=True):
            o.grad, t.grad = gr.clone(), gr.clone()
        step()
        ref.step()
        for o, t in zip(ours, theirs, strict=True):
            torch.testing.assert_close(o.detach(), t.detach(), **tol)
    assert not torch.equal(ours[0].detach(), start[0])  # the steps moved it


def test_zero_grad_keeps_or_drops_the_buffers():
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)
    buffer = p.grad
    opt = OPTIMIZERS["adam"]([p], lr=0.1)
    opt.zero_grad(set_to_none=False)
    assert p.grad is buffer and not p.grad.any()
    opt.zero_grad(set_to_none=True)
    assert p.grad is None
    opt.step()  # a parameter without a gradient is left alone
    assert not p.detach().any()
