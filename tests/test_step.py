"""helpers.step: the course's one training step -- one update, a tuple of inputs, autocast, the
scaler, and the phase marks that timing callers rely on."""

import torch

from helpers import step


def test_train_step_is_one_update_with_optional_autocast_and_scaler():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loss_fn = torch.nn.CrossEntropyLoss()
    before = model.weight.detach().clone()
    first = step.train_step(model, opt, loss_fn, x, y)
    assert not torch.equal(before, model.weight)  # the update happened
    second = step.train_step(model, opt, loss_fn, (x,), y)  # a tuple of inputs is unpacked
    assert second.item() < first.item()
    bf16 = step.train_step(model, opt, loss_fn, x, y, autocast_dtype=torch.bfloat16)
    assert bf16.dtype == torch.float32  # cross-entropy runs in fp32 under autocast
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    step.train_step(model, opt, loss_fn, x, y, scaler=scaler)
    assert scaler.get_scale() == 8.0  # finite gradients: the scale stays


def test_mark_is_called_after_each_phase_in_order_and_sees_the_work_done():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    model(x).sum().backward()  # stale gradients that zero_grad must clear
    seen = []

    def mark(phase):
        grad = model.weight.grad
        seen.append((phase, None if grad is None else float(grad.abs().sum())))

    before = model.weight.detach().clone()
    step.train_step(model, opt, torch.nn.CrossEntropyLoss(), x, y, mark=mark)
    assert [p for p, _ in seen] == list(step.PHASES)
    assert seen[0][1] is None and seen[2][1] is None  # cleared, and no gradient before backward
    assert seen[3][1] > 0  # backward made the new ones
    assert not torch.equal(before, model.weight)

