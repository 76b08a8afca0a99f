"""Model loading is quiet below --log-level debug: the scheduler process gets an environment in
which the progress bar transformers draws while de-quantising a GGUF (its module's own tqdm)
draws nothing; at DEBUG, or when the user set the variables, it is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker.frontend.process import quiet_loading_env

BAR = (
    "from transformers.modeling_gguf_pytorch_utils import tqdm\n"
    "for _ in tqdm(range(3), desc='Converting and de-quantizing GGUF tensors...'): pass\n"
)


@pytest.mark.parametrize(("level", "drawn"), [("INFO", False), ("DEBUG", True)])
def test_gguf_progress_bar_only_at_debug(level: str, drawn: bool) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    env.update(quiet_loading_env(level, env))
    done = subprocess.run([sys.executable, "-c", BAR], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("Converting and de-quantizing" in done.stderr) is drawn, done.stderr


def test_variables_the_user_set_are_kept() -> None:
    assert quiet_loading_env("INFO", {"TQDM_DISABLE": "0"}) == {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
