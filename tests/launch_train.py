"""Run ``hf-cascade`` with its training loss made to fail at one call: an interrupted run for the resume tests
(tests/test_training_parallel.py), started alone or under ``accelerate launch``.

    python tests/launch_train.py [--fail-at-call N] train vanilla ...
"""

from __future__ import annotations

import sys

import hf_cascade.training.run as run
from hf_cascade.cli import main


class Interrupted(Exception):
    pass


def failing_at(n: int, loss):
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise Interrupted(f"interrupted at loss call {n}")
        return loss(*args, **kwargs)

    return wrapped


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--fail-at-call"]:
        run.vanilla_loss = failing_at(int(argv[1]), run.vanilla_loss)
        argv = argv[2:]
    sys.exit(main(argv))
