"""The K-matrix of CS Drafting (Algorithm 1, Appendix B).

For drafters ``[d_1, ..., d_n]`` (largest first, Max-Gram usually last) ``K`` is ``n x n`` and upper
triangular. Row ``r`` (0-based) governs the Algorithm-1 call whose reviewer is level ``r - 1`` (row 0:
the target): ``K[r][j]`` for ``j >= r`` is how many tokens drafter ``d_j`` contributes to that
reviewer's draft (horizontal cascade; 0 skips the drafter). A neural ``d_j`` with smaller drafters
below it gets its tokens by reviewing their drafts (vertical cascade), governed by row ``j + 1``.
"""

from __future__ import annotations

import torch

NEURAL_DEFAULT = 2  # tokens from each neural drafter (the paper's k_11 in [[2, 10], [0, 10]])
STATISTICAL_DEFAULT = 10  # tokens from Max-Gram (Appendix B: "MaG generates 10 tokens at once")


def default_k_matrix(is_statistical: list[bool]) -> list[list[int]]:
    """The paper's ``[[2, 10], [0, 10]]`` pattern generalised to any number of levels."""
    n = len(is_statistical)
    return [
        [0 if j < r else (STATISTICAL_DEFAULT if is_statistical[j] else NEURAL_DEFAULT) for j in range(n)]
        for r in range(n)
    ]


def validate_k_matrix(k_matrix, num_drafters: int) -> list[list[int]]:
    """Return ``k_matrix`` as a list of int rows or raise ``ValueError`` explaining what is wrong."""
    k = torch.as_tensor(k_matrix)
    if k.dim() != 2 or k.shape != (num_drafters, num_drafters):
        raise ValueError(
            f"k_matrix must be {num_drafters}x{num_drafters} (one row and column per drafter), "
            f"got shape {tuple(k.shape)}."
        )
    if k.is_floating_point() and not torch.equal(k, k.round()):
        raise ValueError("k_matrix entries must be whole numbers of tokens.")
    k = k.long()
    if (k < 0).any():
        raise ValueError("k_matrix entries must be >= 0.")
    if torch.tril(k, diagonal=-1).any():
        raise ValueError("k_matrix must be upper triangular (entries below the diagonal must be 0).")
    if k[0].sum() == 0:
        raise ValueError("k_matrix row 0 is all zeros: no drafter would propose anything to the target.")
    for j in range(num_drafters - 1):
        used = bool(k[: j + 1, j].any())
        if used and k[j + 1, j + 1 :].sum() == 0:
            raise ValueError(
                f"k_matrix row {j + 1} is all zeros, but drafter {j} reviews drafts from the drafters below it. "
                f"Give row {j + 1} a positive entry, or remove the smaller drafters."
            )
    return k.tolist()
