"""torch.optim optimizers whose step is one of optc's compiled kernels.

    from optc.torch import AdamW
    opt = AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    for batch in data:
        loss = model(batch).backward()
        opt.step()            # torch.optim.AdamW(foreach=False)'s bits (fused=True: fused=True's)
        opt.zero_grad()

AdamW, Adam, SGD, Adagrad and RMSprop take torch.optim's constructor
arguments, with torch's defaults and torch's checks (they are subclasses of
torch's own classes, whose constructors run unchanged), and Lion takes
lion-pytorch's. All are torch.optim.Optimizer: param groups, add_param_group,
zero_grad, hooks, lr_scheduler, and state_dict()/load_state_dict() in
torch's own format, both ways. What a step writes is what torch writes,
bit for bit (README, "Torch's bits"):

- fused=False (the default) or foreach=True: the for-loop's bits
  (torch.optim.X(foreach=False)); in fp32 they are also foreach=True's.
- fused=True: the bits of torch's fused=True CPU kernel (AdamW, Adam, SGD,
  Adagrad; RMSprop and Lion have none, and take no `fused`, as in torch).
- capturable is accepted and changes nothing but where torch keeps the
  step count (on the param's device). differentiable=True is refused:
  optc's step runs outside autograd.

Params may be plain tensors or FSDP2's DTensors (`fully_shard`, with or
without CPUOffloadPolicy): a DTensor is stepped on its local shard, its
states are DTensors as torch makes them (so state_dict() and
torch.distributed.checkpoint see torch.optim's format), and the clip norm
and the skip on a non-finite grad span every rank's shard.

Two keyword arguments are optc's own:
- nonfinite: "propagate" (default; torch's behaviour: NaN/Inf grads run
  and spread), "skip" (the whole step is skipped: params, states and step
  counts unchanged; counted in `opt.skipped_steps`), or "error" (raises
  FloatingPointError, nothing changed).
- threads: the threads optc runs on (default: torch.get_num_threads() at
  each step). The bits never depend on it.

`opt.fused_step(grad_scale=None, max_norm=None)` does torchtune's
scale_grads_ and clip_grad_norm_ inside the step (see its docstring), and
`opt.optc_ir()` prints the programs in use. How a step runs is said in
_optimizer.py; optc.torch.integrations holds the adapters for torchtitan
and HF Trainer.
"""
from ._lowbit import AdamW4bit, AdamW8bit, QuantState
from ._optimizer import torch_cpu
from ._optimizers import SGD, Adagrad, Adam, AdamW, Lion, RMSprop

__all__ = ["AdamW", "Adam", "SGD", "Adagrad", "RMSprop", "Lion", "AdamW8bit", "AdamW4bit", "QuantState", "torch_cpu"]
