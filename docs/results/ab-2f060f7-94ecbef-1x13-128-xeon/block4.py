"""Run `hf-cascade bench` with the output head's block held at 4 rows (calibrate_block_rows replaced)."""

import sys

from hf_cascade.backends.cpu import verify_head

verify_head.calibrate_block_rows = lambda vh, *a, **k: 4
from hf_cascade.cli import main  # noqa: E402 -- after the patch, so every later import sees it

sys.exit(main(sys.argv[1:]))
