"""An Optuna worker for runnerctl's optuna-sweep template: copy it and put your model in.

Each of the sweep's parallel jobs runs this script. `run_worker` loads the study named
by OPTUNA_STUDY_NAME from OPTUNA_STORAGE and runs trials until the study holds
OPTUNA_N_TRIALS complete ones, over all workers together. The objective is a made-up
validation loss that runs in a fraction of a second on a CPU; SEARCH_SLEEP_S stands in
for training time.
"""

from __future__ import annotations

import math
import os
import time

import optuna

from runnerctl.optuna import run_worker

STEP_S = float(os.environ.get("SEARCH_SLEEP_S", "0.2"))


def objective(trial: optuna.Trial) -> float:
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    layers = trial.suggest_int("layers", 1, 6)
    dropout = trial.suggest_float("dropout", 0.0, 0.5)
    time.sleep(STEP_S)  # train here, on the GPUs in CUDA_VISIBLE_DEVICES
    # smallest near lr=3e-3, 3 layers, dropout 0.1
    return abs(math.log10(lr) + 2.5) + 0.3 * abs(layers - 3) + 2.0 * abs(dropout - 0.1)


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    node = os.environ.get("CI_NODE_INDEX", "1"), os.environ.get("CI_NODE_TOTAL", "1")
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
    ran = run_worker(objective)
    print(f"worker {node[0]}/{node[1]} on GPUs {gpus} ran {ran} trials")
