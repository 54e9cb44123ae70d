"""The GPU variant: each trial trains a small model on the GPUs the runner leased.

runnerctl's executor sets CUDA_VISIBLE_DEVICES to the job's GPUs, which CUDA numbers
from 0 inside the job, so the script just uses every visible device. Needs PyTorch
with CUDA in the job's image (see .gitlab-ci.yml).
"""

from __future__ import annotations

import optuna

from runnerctl.optuna import run_worker


def objective(trial: optuna.Trial) -> float:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible: run this on a runnerctl GPU runner")
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    width = trial.suggest_int("width", 16, 256, log=True)
    torch.manual_seed(trial.number)
    x = torch.randn(8192, 32, device="cuda")
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)).cuda()
    if torch.cuda.device_count() > 1:  # a multi-GPU job: split each batch over its GPUs
        model = torch.nn.DataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(300):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step % 100 == 99:
            trial.report(float(loss.item()), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
    return float(loss.item())


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"ran {run_worker(objective)} trials")
