"""The drafters and heads trained here for Gemma-3-270M, by the path of their folder.

They are the folders of ``model_cards/`` in hf_cascade's source repository (Hub layout: ``config.json``, weights,
card), and nothing else: they are not published on the Hugging Face Hub, and a wheel does not carry them.
:func:`shipped` returns a folder's path in the checkout this package runs from (a clone, or an editable install
of one), for any argument that takes a checkpoint::

    pipeline("text-generation", model="google/gemma-3-270m",
             assistant_model=hf_cascade.shipped("gemma-3-270m-glide-xs"))
    GlideAssistant(hf_cascade.shipped("gemma-3-270m-glide-xs"), settings=GlideSettings.chain())

To use one by Hub repo id, upload the folder to a repo of your own (``hf upload <your-org>/gemma-3-270m-glide-xs
model_cards/gemma-3-270m-glide-xs``) and give that id (with ``loading=Loading(revision=..., token=...)`` as for
``from_pretrained``).
"""

from __future__ import annotations

from pathlib import Path

#: Where a source checkout keeps the shipped folders (absent from an installed wheel).
MODEL_CARDS = Path(__file__).resolve().parent.parent / "model_cards"


def shipped(name: str) -> str:
    """The path of the shipped folder ``name`` of ``model_cards/`` (e.g. ``"gemma-3-270m-glide-xs"``), as a
    string. ``FileNotFoundError`` saying what to do when this install has no such folder (a wheel has none)."""
    folder = MODEL_CARDS / name
    if name and "/" not in name and "\\" not in name and folder.is_dir():
        return str(folder)
    if MODEL_CARDS.is_dir():
        names = sorted(d.name for d in MODEL_CARDS.iterdir() if d.is_dir() and not d.name.startswith("."))
        raise FileNotFoundError(
            f"hf_cascade.shipped({name!r}): {MODEL_CARDS} has no folder {name!r}; the shipped ones: {', '.join(names)}."
        )
    raise FileNotFoundError(
        f"hf_cascade.shipped({name!r}): the shipped drafters and heads are the folders of model_cards/ in "
        f"hf_cascade's source repository, and this install has none ({MODEL_CARDS} does not exist: a wheel does "
        "not carry them, and they are not on the Hugging Face Hub). Clone the repository and install that clone "
        "(pip install -e .), or copy the folder from a clone and pass its path; to load it by repo id, upload "
        f"it to a Hub repo of your own (hf upload <your-org>/{name} model_cards/{name}) and pass that id."
    )


__all__ = ["MODEL_CARDS", "shipped"]
