"""optc.torch on CUDA tensors: the step runs on the tensors' device, on
torch's current stream. Skipped where torch sees no CUDA device.

optc's CUDA backend gives the same bytes as its CPU backend (README), so
a step on the GPU must equal optc's step on copies of the tensors on the
CPU, bit for bit, which equals torch's CPU for-loop. torch's own CUDA
kernels round differently (no MKL sqrt, their own contractions): they are
compared within a tolerance only.
"""
import pytest
import torch

from test_optc_torch import Net, assert_same_params, batches, capi, diff, loss_of, make_models, otorch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def cuda_backend():
    try:
        capi.Step(dict(optimizer="torch.optim.SGD", target=capi.OPTC_TARGET_CUDA))
        return True
    except capi.OptcError:
        return False


@pytest.fixture(scope="module")
def need_backend():
    if not cuda_backend():
        pytest.skip("this liboptc has no CUDA backend")


@pytest.mark.parametrize("name,kw", [("AdamW", dict(weight_decay=0.1)), ("SGD", dict(lr=0.05, momentum=0.9)),
                                     ("Adam", dict(amsgrad=True)), ("Lion", dict())])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_equals_cpu(name, kw, dtype, need_backend):
    mc, mg = make_models(dtype)
    mg.cuda()
    extra = {} if name == "Lion" else dict(foreach=False)
    oc = getattr(otorch, name)(mc.parameters(), **kw, **extra)
    og = getattr(otorch, name)(mg.parameters(), **kw, **extra)
    for xy in batches(6):
        loss_of(mc, xy).backward()
        loss_of(mg, (xy[0].cuda(), xy[1].cuda())).backward()
        for pc, pg in zip(mc.parameters(), mg.parameters()):
            pg.grad.copy_(pc.grad)  # the same grads: cuBLAS's backward rounds its own way
        oc.step()
        og.step()
        oc.zero_grad()
        og.zero_grad()
        torch.cuda.synchronize()
        bad = [n for (n, a), (_, b) in zip(mc.named_parameters(), mg.named_parameters()) if diff(a, b.cpu())]
        assert not bad, bad
    for p in mg.parameters():
        for k, v in og.state[p].items():
            if torch.is_tensor(v) and v.dim() > 0:
                assert v.is_cuda


def test_cuda_close_to_torch_cuda(need_backend):
    mt, mo = make_models(torch.float32)
    mt.cuda()
    mo.cuda()
    ot = torch.optim.AdamW(mt.parameters(), foreach=False)
    oo = otorch.AdamW(mo.parameters(), foreach=False)
    for xy in batches(6):
        xy = (xy[0].cuda(), xy[1].cuda())
        loss_of(mt, xy).backward()
        loss_of(mo, xy).backward()
        ot.step()
        oo.step()
        ot.zero_grad()
        oo.zero_grad()
    for a, b in zip(mt.parameters(), mo.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_cuda_clip_and_stream(need_backend):
    """fused_step with clipping on a side stream: the norm comes back on the
    grads' device; the step is queued on the current stream."""
    m = Net().cuda()
    o = otorch.AdamW(m.parameters())
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x, y = batches(1)[0]
        loss_of(m, (x.cuda(), y.cuda())).backward()
        want = torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)
        got = o.fused_step(max_norm=1.0)
    torch.cuda.synchronize()
    assert got.is_cuda and abs(got.item() - want.item()) <= 1e-5 * want.item()


def test_cuda_without_backend_is_a_clear_error():
    if cuda_backend():
        pytest.skip("this liboptc has a CUDA backend")
    p = torch.nn.Parameter(torch.randn(3, device="cuda"))
    p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="param 0"):
        otorch.AdamW([p]).step()


def test_cuda_params_and_cpu_params_in_one_optimizer(need_backend):
    mc, mg = make_models(torch.float32)
    mg.fc2.cuda()
    o = otorch.SGD(mg.parameters(), lr=0.1, momentum=0.9)
    oc = otorch.SGD(mc.parameters(), lr=0.1, momentum=0.9)
    for p in mg.parameters():
        p.grad = torch.ones_like(p)
    for p in mc.parameters():
        p.grad = torch.ones_like(p)
    o.step()
    oc.step()
    torch.cuda.synchronize()
    mg.fc2.cpu()
    assert_same_params(mc, mg)
