"""Capture and restore every random number generator a rank draws from, as a weights_only-loadable dict.

Python ``random``, NumPy's global generator and any ``numpy.random.Generator`` passed in, torch's CPU
generator and, when CUDA is available, every CUDA device's generator. NumPy states go through JSON
strings because their 128-bit integers and nested dicts are not tensors.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        return {k: _from_jsonable(v) for k, v in obj.items()}
    return obj


def capture_rng_state(generators: Sequence[np.random.Generator] = ()) -> dict[str, Any]:
    """Every generator's state; ``generators`` are extra NumPy Generators (e.g. a data sampler's)."""
    version, words, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss_next},
        "numpy": json.dumps(_jsonable(np.random.get_state(legacy=False))),
        "numpy_generators": [json.dumps(_jsonable(g.bit_generator.state)) for g in generators],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any], generators: Sequence[np.random.Generator] = ()) -> None:
    """Put every generator back where ``capture_rng_state`` found it; ``generators`` in the same order."""
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    np.random.set_state(_from_jsonable(json.loads(state["numpy"])))
    saved = state.get("numpy_generators", [])
    if len(saved) != len(generators):
        raise ValueError(f"{len(saved)} NumPy generator states were saved but {len(generators)} were passed")
    for gen, text in zip(generators, saved, strict=True):
        gen.bit_generator.state = _from_jsonable(json.loads(text))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = list(state["cuda"])
        # A restart on a different GPU count restores the devices both runs have.
        for device in range(min(len(cuda), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda[device], device)
