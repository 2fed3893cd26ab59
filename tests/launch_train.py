"""Run ``hf-cascade`` commands one after another in the same process(es), each optionally made to fail at one
training step: interrupted runs for the resume tests (tests/test_training_parallel.py), started alone or under
``accelerate launch``.

    python tests/launch_train.py [--fail-at-call N] train vanilla ... [::: train glide ...]

With ``--fail-at-call N`` each command's N-th training step raises :class:`Interrupted` in every process (before
the step's gradients are exchanged, so the processes stay in step); the helper then goes on with the next command
and exits 3 at the end. Otherwise it exits with the first non-zero exit code of the commands, or 0.
"""

from __future__ import annotations

import sys

import hf_cascade.training.loop as loop
from hf_cascade.cli import main
from hf_cascade.training.launch import leave_process_group


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


def run(argv: list[str]) -> int:
    fail_at = 0
    if argv[:1] == ["--fail-at-call"]:
        fail_at, argv = int(argv[1]), argv[2:]
    commands, current = [], []
    for a in argv + [":::"]:
        if a == ":::":
            commands.append(current)
            current = []
        else:
            current.append(a)
    forward = loop._Step.forward
    code = 0
    for command in commands:
        if fail_at:
            loop._Step.forward = failing_at(fail_at, forward)
        try:
            rc = main(command)
        except Interrupted as e:
            print(f"{command[1]}: {e}", file=sys.stderr, flush=True)
            rc = 3
        code = code or rc
    return code


if __name__ == "__main__":
    status = run(sys.argv[1:])
    leave_process_group(finished=status in (0, 3))  # 3: every process was interrupted at the same step
    sys.exit(status)
