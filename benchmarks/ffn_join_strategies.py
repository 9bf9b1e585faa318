"""Ways of fitting the join model and choosing the join threshold, compared on one trained model's cached floods.

    python benchmarks/ffn_join_strategies.py flood RUN_DIR DATA_DIR STORE VOLUME MODE   # one flood, cached
    python benchmarks/ffn_join_strategies.py score DATA_DIR STORE STRATEGY               # one strategy, scored

A ``benchmarks/ffn_quality.py`` seed directory's ``data/`` holds the demo's volumes. Each flood is one process
(``VOLUME`` train, v7, v8 — synthetic validation seeds in the held-out condition —, s2-s5 and gen; ``MODE`` u: the
join fit's settings, without the self-prediction check, c: the held-out settings), so the floods of one model run
side by side; they are cached in ``STORE``. A strategy then costs no model call: the pair features of every flood
are computed once, the join model is fitted on the named floods' pairs, the join threshold (0.3-0.6) is chosen by
the sum of VOIs on the named floods, and the held-out floods are joined and filled with it. Strategy ``A`` is the
demo's (fit and choose on the training volume) and gives the demo's scores for the same checkpoint.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parents[1]
FILES = {"train": "train.h5", "s2": "eval.h5", "s3": "eval-seed3.h5", "s4": "eval-seed4.h5", "s5": "eval-seed5.h5",
         "gen": "generalisation.h5"}
VALIDATION_SEEDS = {"v7": 7, "v8": 8}
HELD_OUT = ("s2", "s3", "s4", "s5", "gen")
THRESHOLDS = (0.3, 0.4, 0.5, 0.6)
TRAIN, V7, V8 = ("train", "u"), ("v7", "u"), ("v8", "u")
# name: (floods the join model is fitted on, floods the threshold is chosen on, L2)
STRATEGIES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], float]] = {
    "A": ((TRAIN,), (TRAIN,), 1.0), "AL": ((TRAIN,), (TRAIN,), 10.0), "B": ((TRAIN,), (V7,), 1.0),
    "C": ((TRAIN, V7), (TRAIN, V7), 1.0), "CL": ((TRAIN, V7), (TRAIN, V7), 10.0), "D": ((V7,), (V7,), 1.0),
    "E": ((TRAIN,), (TRAIN, V7), 1.0), "G": ((V7, V8), (V7, V8), 1.0)}


def demo_settings() -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((ROOT / "hpctrain/jobs/ffn-local.yaml").read_text())["data"]["eval"]["inference"])


def volume(data: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(image, labels) of a demo volume, or of a validation volume made like the held-out one."""
    from hpctrain.ffn.synthetic import make_synthetic_volume
    from hpctrain.ffn.volume import load_volume

    if name in VALIDATION_SEEDS:
        shape = tuple(int(s) for s in np.asarray(load_volume(f"{data / FILES['s2']}:image")).shape)
        return make_synthetic_volume(shape, VALIDATION_SEEDS[name])  # type: ignore[arg-type]
    path = data / FILES[name]
    return np.asarray(load_volume(f"{path}:image")), np.asarray(load_volume(f"{path}:labels"))


def flood(run_dir: Path, data: Path, store: Path, name: str, mode: str) -> None:
    from hpctrain.ffn.inference.runner import prepare_inference
    from hpctrain.ffn.inference.tuning import flood_pieces

    checkpoint = max((run_dir / "checkpoints").glob("step-*/shared.pt"))
    model, cfg, _ = prepare_inference(checkpoint, demo_settings(), threads=1)
    run = cfg.replace(self_prediction=0.0) if mode == "u" else cfg
    pieces, claims, _ = flood_pieces(model, volume(data, name)[0], run)
    store.mkdir(parents=True, exist_ok=True)
    (store / f"{name}-{mode}.pkl").write_bytes(pickle.dumps({"pieces": pieces, "claims": claims, "cfg": cfg}))
    print(f"{name} {mode}: {int(pieces.max(initial=0))} pieces, {len(claims)} pairs", flush=True)


def score(data: Path, store: Path, strategy: str) -> dict[str, Any]:
    from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
    from hpctrain.ffn.inference.join_model import JoinModel, feature_matrix, fit_join_model, same_object
    from hpctrain.ffn.inference.runner import join_and_fill

    cached = {tuple(f.stem.rsplit("-", 1)): pickle.loads(f.read_bytes()) for f in store.glob("*-?.pkl")}
    cfg = next(iter(cached.values()))["cfg"]
    volumes = {name: volume(data, name) for name in {k[0] for k in cached}}
    features: dict[tuple[str, str], tuple[list, np.ndarray, np.ndarray, np.ndarray]] = {}

    def pairs(key: tuple[str, str]) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        if key not in features:
            image, labels = volumes[key[0]]
            pieces, claims = cached[key]["pieces"], cached[key]["claims"]
            found, x = feature_matrix(image, pieces, claims)
            truth = same_object(pieces, labels, found)
            sizes = np.bincount(pieces.ravel().astype(np.int64))
            features[key] = (found, x, np.array([truth[p] for p in found], dtype=np.float64),
                             np.array([np.sqrt(min(sizes[a], sizes[b])) for a, b in found]))
        return features[key]

    def segment(key: tuple[str, str], model: JoinModel, threshold: float) -> tuple[float, float, float]:
        image, labels = volumes[key[0]]
        found, x, _, _ = pairs(key)
        scores = dict(zip(found, model.probability(x).tolist(), strict=True)) if found else {}
        chosen = cfg.replace(agglomerate_threshold=threshold)
        seg = join_and_fill(image, cached[key]["pieces"], scores, chosen.joins, chosen.fill)
        m = evaluate_segmentation(seg, labels)
        return m["voi_split"] + m["voi_merge"], m["voi_merge"], m["adapted_rand_error"]

    fit_on, choose_on, l2 = STRATEGIES[strategy]
    parts = [pairs(k) for k in fit_on]
    model = fit_join_model(np.vstack([p[1] for p in parts]), np.concatenate([p[2] for p in parts]),
                           np.concatenate([p[3] for p in parts]), l2=l2)
    totals = [sum(segment(k, model, t)[0] for k in choose_on) for t in THRESHOLDS]
    threshold = THRESHOLDS[int(np.argmin(totals))]  # the first of equals
    rows = {name: segment((name, "c"), model, threshold) for name in HELD_OUT}
    mean = np.mean([rows[n] for n in HELD_OUT if n != "gen"], axis=0).tolist()
    result = {"strategy": strategy, "threshold": threshold, "rows": rows, "held_out_mean": mean}
    (store / f"strategy-{strategy}.json").write_text(json.dumps(result))
    print(f"{strategy} join {threshold}: " + " ".join(f"{k} {v[0]:.3f}/{v[2]:.3f}" for k, v in rows.items())
          + f" | held-out mean VOI {mean[0]:.3f} merge {mean[1]:.3f} adapted Rand {mean[2]:.3f}")
    return result


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["flood"] and len(args) == 6:
        flood(Path(args[1]), Path(args[2]), Path(args[3]), args[4], args[5])
    elif args[:1] == ["score"] and len(args) == 4:
        score(Path(args[1]), Path(args[2]), args[3])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
