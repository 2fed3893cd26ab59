"""Run hf-cascade's CLI with the output head's block held at 4 rows (the once-per-process timed choice removed),
so that two commits compared under the same load verify with the same head block."""

import sys

import hf_cascade.backends.cpu.verify_head as v


def fixed(vh, *args, **kwargs):
    v._BLOCK_ROWS[v.shape_key(vh.weight, 1)] = 4
    return 4


v.calibrate_block_rows = fixed
from hf_cascade.cli import main  # noqa: E402 -- after the patch, so every later import sees it

sys.exit(main())
