"""`python tests/pause_hook.py ARGS...` runs `rstar2 ARGS...` with a test hook installed from outside the product:
with RSTAR2_TEST_PAUSE_AT=POINT:STEP (STEP counted from 1, as the store counts) the command logs
`test hook: paused at POINT:STEP` and stops there (the whole event loop, for up to 10 minutes, then exits with
status 3), so a test can kill it in that window (conftest.run_until_paused). Points:

- rollout: a rollout of the step is done, the others in flight (`Rollouts.rollout` returned; the probe's rollouts
  are step -1, the stage filter's step 0);
- in-update: in the update's thread, before its first micro-batch (a long update; the update's `stop` event ends
  the pause, as it ends an update);
- stored: the step's rollouts are in the store, its metrics are not (`Store.add_metrics` about to run);
- recorded: the step's metrics are in the store, its checkpoint is not saved (`Store.add_metrics` returned);
- sample: the STEP-th sample of an eval run is in the store (`Store.add_sample` returned; the later ones wait to
  be stored);
- convert: the embedded model's one-time conversion has written part of its folder (a config.json, no weights;
  `models.convert_gguf` stands in for the conversion: STEP is ignored).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

ENV = "RSTAR2_TEST_PAUSE_AT"


def pause(stop: threading.Event | None = None) -> None:
    print(f"test hook: paused at {os.environ[ENV]}", file=sys.stderr, flush=True)
    if stop is not None:
        if stop.wait(600):
            return
    else:
        time.sleep(600)
    os._exit(3)


def install(point: str, step: int) -> None:
    from rstar2_agent.store import Store
    from rstar2_agent.train.learner.local import LocalLearner
    from rstar2_agent.train.rollout.rollouts import Rollouts

    if point == "rollout":
        original = Rollouts.rollout

        @functools.wraps(original)
        async def rollout(self, question, stage, key):
            traj = await original(self, question, stage, key)
            if int(key.split(":")[1]) + 1 == step:  # the key is f"{seed}:{step}:{problem}:{sample}"
                pause()
            return traj

        Rollouts.rollout = rollout
    elif point == "in-update":
        update = LocalLearner.update

        @functools.wraps(update)
        def paused_update(self, items, cfg, total_tokens, stop=None):
            if self.step + 1 == step:
                pause(stop)
            return update(self, items, cfg, total_tokens, stop)

        LocalLearner.update = paused_update
    elif point in ("stored", "recorded"):
        add = Store.add_metrics

        @functools.wraps(add)
        def add_metrics(self, run_id, at, values):
            if at == step and point == "stored":
                pause()
            add(self, run_id, at, values)
            if at == step and point == "recorded":
                pause()

        Store.add_metrics = add_metrics
    elif point == "sample":
        add_sample, lock, stored = Store.add_sample, threading.Lock(), [0]

        @functools.wraps(add_sample)
        def add_paused(self, *args, **kwargs):
            with lock:  # the samples store from their own threads: one at a time, none while the STEP-th pauses
                out = add_sample(self, *args, **kwargs)
                stored[0] += 1
                if stored[0] == step:
                    pause()
                return out

        Store.add_sample = add_paused
    elif point == "convert":
        from rstar2_agent import models

        def convert_gguf(gguf_dir, filename, out):
            (out / "config.json").write_text("{}")  # what a conversion cut short would leave
            pause()

        models.convert_gguf = convert_gguf
    else:
        raise SystemExit(f"{ENV}: unknown point {point!r} (rollout, in-update, stored, recorded, sample, convert)")


if __name__ == "__main__":
    if os.environ.get(ENV):
        where, _, at = os.environ[ENV].rpartition(":")
        install(where, int(at))
    from rstar2_agent.cli import main

    main(sys.argv[1:], prog_name="rstar2")
