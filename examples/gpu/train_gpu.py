"""The GPU variant: each trial trains a tiny model on the GPUs the runner leased.

runnerctl sets CUDA_VISIBLE_DEVICES to the job's GPUs (numbered from 0 inside the job),
so the script just uses `cuda`. Needs PyTorch with CUDA in the job's image.
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
    x = torch.randn(4096, 32, device="cuda")
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 1)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(200):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return float(loss.item())


if __name__ == "__main__":
    print(f"ran {run_worker(objective)} trials")
