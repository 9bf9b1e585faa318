"""A trained FFN used on this machine: which checkpoint and settings a run, a run directory or a checkpoint stands
for (its model package first), segmenting a volume whole or in overlapping pieces on local ranks, and choosing the
inference settings for a trained model on a labelled volume and writing them as its model package.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.errors import ConfigError, RuntimeFailure
from hpctrain.memory_budget import MemoryBudget


@dataclass
class Trained:
    """What ``hpctrain ffn segment|tune TARGET`` segments with: the checkpoint file, the model package beside it
    (None where none was written), and the job the run was trained with (None for a bare checkpoint)."""

    checkpoint: str
    package: dict[str, Any] | None = None
    package_path: Path | None = None
    job_data: dict[str, Any] | None = None
    run_dir: Path | None = None
    warnings: list[str] = field(default_factory=list)


def _run_job(run_dir: Path) -> tuple[dict[str, Any], str]:
    """(data, checkpoint directory name) of the job a run directory was trained with (``job.yaml``)."""
    from hpctrain.config.job import load_job

    job = load_job(str(run_dir / "job.yaml"))
    return dict(job.data), job.checkpoint.dir


def _newest(checkpoint_dir: Path, warnings: list[str]) -> str:
    from hpctrain.checkpoint.manifest import newest_shared_file

    shared, problems = newest_shared_file(checkpoint_dir)
    warnings.extend(problems)
    return str(shared)


def find_trained(target: str) -> Trained:
    """A run id (or its prefix), a run directory, a checkpoint directory or a checkpoint file → ``Trained``.

    Where the checkpoint directory holds a model package, its checkpoint (the one its settings were chosen for)
    is used; otherwise the newest checkpoint whose shared file checks out against the manifest."""
    from hpctrain.checkpoint.manifest import STEP_DIR
    from hpctrain.ffn.inference.settings import PACKAGE_FILE, find_package, read_package

    path = Path(target)
    run_dir: Path | None = None
    job_data: dict[str, Any] | None = None
    warnings: list[str] = []
    if not path.exists():
        from hpctrain.submission.registry import RunRegistry

        with RunRegistry(readonly=True) as registry:
            path = Path(registry.get_run(target).run_dir)
    if path.is_dir() and (path / "job.yaml").is_file():
        run_dir = path
        job_data, checkpoint_dir = _run_job(path)
        path = path / checkpoint_dir
    elif path.is_file() and STEP_DIR.fullmatch(path.parent.name) and (path.parent.parent.parent / "job.yaml").is_file():
        run_dir = path.parent.parent.parent
        job_data, _ = _run_job(run_dir)
    package_path = find_package(path)
    package = read_package(package_path) if package_path is not None else None
    if path.is_file():
        checkpoint = str(path)
        if package is not None and Path(package["checkpoint"]) != path.resolve():
            warnings.append(f"{package_path} holds the settings chosen for {package['checkpoint']}; segmenting "
                            f"{checkpoint} with them")
    elif package is not None and Path(package["checkpoint"]).is_file():
        checkpoint = package["checkpoint"]
    else:
        if package is not None:
            warnings.append(f"{path / PACKAGE_FILE} names {package['checkpoint']}, which is gone; its settings are "
                            "used with the newest checkpoint")
        checkpoint = _newest(path, warnings)
    return Trained(checkpoint, package, package_path, job_data, run_dir, warnings)


def resolve_checkpoint(path: str) -> str:
    """A run's checkpoint directory stands for the newest checkpoint in it whose shared file checks out
    against the manifest (size and checksum); skipped checkpoints are reported on stderr."""
    if not Path(path).is_dir():
        return path
    warnings: list[str] = []
    shared = _newest(Path(path), warnings)
    for problem in warnings:
        print(f"hpctrain: warning: {problem}", file=sys.stderr)
    return shared


def inference_settings(job_data: dict[str, Any]) -> dict[str, Any]:
    """The held-out segmentation settings: ``data.eval.inference`` of a job (flat InferenceConfig keys); {} if
    unset."""
    return dict((job_data.get("eval") or {}).get("inference") or {})


def inference_tuning(job_data: dict[str, Any]) -> Any:
    """``data.eval.tune`` of a job (``config.plugins.ffn.InferenceTuning``), or None where it has none."""
    from hpctrain.config.plugins.ffn import InferenceTuning

    raw = (job_data.get("eval") or {}).get("tune")
    return InferenceTuning.model_validate(raw) if raw else None


def checked_ffn_job(job_path: str) -> Any:
    """An FFN job spec, checked by the FFN schema (a wrong key or value: one error naming it, before any work)."""
    from hpctrain.config.catalog import find_schema
    from hpctrain.config.job import load_job
    from hpctrain.config.plugins.ffn import SCHEMA

    job = load_job(job_path)
    if find_schema(job.model)[0] is not SCHEMA:
        raise ConfigError(f"{job_path}: model {job.model!r} is not the FFN; --job takes the settings of an FFN "
                          "job's data.eval", key="model", hint="pass an FFN job, e.g. jobs/ffn-local.yaml")
    SCHEMA.parse(job.model_args, job.data)
    return job


def segment_settings(trained: Trained, job_path: str | None,
                     options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the flat settings ``hpctrain ffn segment`` runs with, where they came from): ``--job``'s
    ``data.eval.inference``, else the model package, else the run's own job's ``data.eval.inference``, else the
    defaults; ``options`` (the command's threshold options) override any of them."""
    if job_path:
        settings, source = inference_settings(dict(checked_ffn_job(job_path).data)), f"job {job_path}"
    elif trained.package is not None:
        settings, source = dict(trained.package["settings"]), str(trained.package_path)
    elif trained.job_data is not None and inference_settings(trained.job_data):
        settings, source = inference_settings(trained.job_data), f"job of run {trained.run_dir}"
        if inference_tuning(trained.job_data) is not None:
            trained.warnings.append(f"run {trained.run_dir} has no model package: its job's data.eval.tune "
                                    "candidates were not chosen for this model; hpctrain ffn tune RUN chooses "
                                    "them and writes it")
    else:
        settings, source = {}, "defaults"
    given = {k: v for k, v in options.items() if v is not None}
    settings.update(given)
    return settings, {"settings_from": source, **({"options": given} if given else {})}


# ---------------------------------------------------------------------------------------- in pieces
def parts_dir_for(output: str) -> Path:
    """Where the pieces of ``output`` (FILE.h5[:DATASET]) are kept: FILE.parts/ beside it."""
    from hpctrain.ffn.segmentation import h5_target

    file, _ = h5_target(output, "segmentation")
    return file.with_name(file.stem + ".parts")


def segment_in_pieces(checkpoint: str, volume: str, output: str, config: dict[str, Any] | None, *,
                      counts: tuple[int, int, int], overlap: int | None = None, ranks: int = 1,
                      threads: int | None = None, keep_parts: bool = False,
                      attrs: dict[str, Any] | None = None, budget: MemoryBudget | None = None,
                      memory_gb: float | None = None) -> dict[str, Any]:
    """Plan overlapping subvolumes; flood them with ``ranks`` local processes (the local site's launcher) or
    in this process; reconcile; then, when the settings agglomerate or fill, count the contacts, finish the
    pieces on the ranks again and assemble ``output`` (``ffn/inference/subvolume_finish.py``). Returns a summary.
    The image is checked from its header, and the pieces a rank floods at once against ``budget`` (default:
    ``memory_budget()``), before any work; ``memory_gb`` is passed to the ranks as their ``--memory-gb``."""
    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.config.plugins.ffn_volumes import check_image
    from hpctrain.ffn.inference.runner import load_model
    from hpctrain.ffn.inference.settings import checkpoint_settings, finishes
    from hpctrain.ffn.inference.subvolume_finish import OVERSEGMENTATION, assemble, assign_pairs, finish_parts
    from hpctrain.ffn.inference.subvolumes import (
        check_pieces_fit,
        plan_subvolumes,
        read_plan,
        reconcile,
        segment_parts,
        write_plan,
    )
    from hpctrain.ffn.volume import open_volume

    t0 = time.perf_counter()
    with open_volume(volume, budget) as image:
        check_image(image)
        _, model_args, ckpt = load_model(checkpoint)
        settings = InferenceConfig.from_mapping({**checkpoint_settings(model_args, ckpt), **(config or {})})
        fov = settings.flood.fov
        shape = image.shape
        halo = overlap if overlap is not None else max(fov)
        plan = plan_subvolumes(shape, counts, halo, min_size=fov)
        check_pieces_fit(plan, image)
    parts = parts_dir_for(output)
    plan_path = parts / "plan.json"
    if plan_path.exists():  # a rerun keeps finished pieces only if they were cut the same way
        old, _ = read_plan(plan_path)
        if old != plan:
            shutil.rmtree(parts)
    if not plan_path.exists():
        write_plan(plan_path, plan, checkpoint=str(Path(checkpoint).resolve()), volume=str(volume),
                   config=config or {}, shape=list(shape))
    if ranks > 1:
        on_ranks("segment-parts", plan_path, ranks, threads, memory_gb)
    else:
        segment_parts(plan_path, 0, 1, threads=threads, budget=budget)
    attrs = {"checkpoint": checkpoint, "image": str(volume), "subvolumes": list(counts), "overlap": halo,
             **(attrs or {})}
    if not finishes(settings):
        summary = reconcile(plan, parts, output, shape, attrs=attrs)
    else:
        if not (parts / OVERSEGMENTATION).exists():
            joined = reconcile(plan, parts, parts / OVERSEGMENTATION, shape)["joined_pairs"]
            (parts / "reconciled.txt").write_text(str(joined))
        assign_pairs(plan, parts, shape, settings.joins.min_contact)
        if ranks > 1:
            on_ranks("finish-parts", plan_path, ranks, threads, memory_gb)
        else:
            finish_parts(plan_path, 0, 1, threads=threads, budget=budget)
        summary = assemble(plan, parts, output, shape, settings.joins.agglomerate_threshold, attrs=attrs,
                           linkage=settings.joins.linkage)
        summary["joined_pairs"] = int((parts / "reconciled.txt").read_text())
    if not keep_parts:
        shutil.rmtree(parts)
    return {**summary, "seconds": round(time.perf_counter() - t0, 1)}


def on_ranks(action: str, plan_path: Path, ranks: int, threads: int | None, memory_gb: float | None = None) -> None:
    """``hpctrain ffn ACTION PLAN`` as ``ranks`` processes of the local site's launcher."""
    from hpctrain.submission.launchers.local_launch import launch

    command = [sys.executable, "-m", "hpctrain", "ffn", action, str(plan_path)]
    if threads:
        command += ["--threads", str(threads)]
    if memory_gb is not None:
        command += ["--memory-gb", repr(memory_gb)]
    code = launch(command, ranks, log_dir=str(plan_path.parent / "logs" / action))
    if code != 0:
        raise RuntimeFailure(f"hpctrain ffn {action} {plan_path} failed (launcher exit {code})",
                             hint=f"see {plan_path.parent / 'logs' / action}; running the same command again keeps "
                                  "finished pieces")


# ---------------------------------------------------------------------------------------- the package
def write_model_package(checkpoint: str, settings: dict[str, Any], chosen: dict[str, Any],
                        record: dict[str, Any]) -> Path:
    """The settings a trained model segments with (flat keys: the job's ``data.eval.inference`` and what was
    chosen for it), resolved against its checkpoint, written as the model package beside it."""
    from hpctrain.config.plugins.ffn_inference import InferenceConfig
    from hpctrain.ffn.inference.runner import load_model
    from hpctrain.ffn.inference.settings import checkpoint_settings, write_package

    _, model_args, ckpt = load_model(checkpoint)
    resolved = InferenceConfig.from_mapping({**checkpoint_settings(model_args, ckpt), **settings})
    kept = {k: v for k, v in record.items() if k != "rows"}
    return write_package(checkpoint, resolved, model_name=str(ckpt.get("model_name") or "ffn"), chosen=chosen,
                         record=kept)


def labelled_volume(trained: Trained, tuning: Any, image: str | None,
                    labels: str | None) -> tuple[str, str]:
    """(image, labels) the settings are chosen on: the ones given, else the job's ``data.eval.tune.volume``,
    else its training volume (files; a synthetic volume is the demo's to write)."""
    if image and labels:
        return image, labels
    if image or labels:
        raise ConfigError("give both --volume IMAGE and --labels LABELS", hint="e.g. --volume V.h5:image "
                          "--labels V.h5:labels")
    source = tuning.volume if tuning.volume is not None else (trained.job_data or {}).get("train") or {}
    image, labels = (source.image, source.labels) if hasattr(source, "image") else (source.get("image"),
                                                                                   source.get("labels"))
    if not image or not labels:
        raise ConfigError("no labelled volume to choose the settings on (the job's is synthetic or missing)",
                          key="data.eval.tune.volume", hint="pass --volume V.h5:image --labels V.h5:labels")
    return str(image), str(labels)


def join_fit_volume(fit_joins: list[str] | None, job_data: dict[str, Any],
                    tuning: Any) -> tuple[str, str, Any] | None:
    """(image, labels, crop) the join model is fitted on: ``fit_joins``, else the job's data.eval.tune.fit_joins
    volume or data.train (files; a synthetic one is the demo's to write); None when neither asks for one."""
    fit = tuning.fit_joins
    if fit_joins:
        return fit_joins[0], fit_joins[1], fit.crop if fit is not None else None
    if fit is None:
        return None
    if fit.volume is not None:
        image, labels = fit.volume.image, fit.volume.labels
    else:
        train = job_data.get("train") or {}
        image, labels = train.get("image"), train.get("labels")
    if not image or not labels:
        raise ConfigError("data.eval.tune.fit_joins needs a labelled volume with image and labels files",
                          key="data.eval.tune.fit_joins",
                          hint="pass --fit-joins IMAGE LABELS (e.g. the training volume's FILE.h5:image and "
                               "FILE.h5:labels)")
    return str(image), str(labels), fit.crop


# A join model fitted on fewer than this share of the pairs of the one it would replace is refused (unless
# --replace-joins): its weights' standard errors are at least twice as large (they grow as 1 / sqrt(pairs)).
REPLACE_PAIRS_SHARE = 0.25


def packaged_join_pairs(package: dict[str, Any] | None) -> int | None:
    """The pairs the join model in a model package was fitted on; None where it has no join model or does not
    say."""
    if not package or not (package.get("chosen") or {}).get("join_model"):
        return None
    pairs = ((package.get("record") or {}).get("join_fit") or {}).get("pairs")
    return pairs if isinstance(pairs, int) and not isinstance(pairs, bool) else None


def join_fit_guard(trained: Trained) -> Callable[[Mapping[str, Any]], None] | None:
    """A ``check_fit`` for ``tune_checkpoint`` that refuses a join fit on far fewer pairs than the join model of
    the package it would replace (or no fit at all), naming both counts; None when there is nothing to guard."""
    old = packaged_join_pairs(trained.package)
    if old is None:
        return None

    def check(record: Mapping[str, Any]) -> None:
        new = int(record.get("pairs") or 0)
        if new >= REPLACE_PAIRS_SHARE * old:
            return
        fit = f"this fit has {new}" if new else f"this volume fitted none ({record.get('not_fitted')})"
        raise ConfigError(f"{trained.package_path}: its join model was fitted on {old} pairs of pieces; {fit}: "
                          "the model package would lose the better fit",
                          key="--fit-joins", hint="fit on a larger labelled volume (--fit-joins IMAGE LABELS, e.g. "
                          "the training volume), keep the package with --no-write, or replace its join model anyway "
                          "with --replace-joins")

    return check


def tune_trained(trained: Trained, job_data: dict[str, Any], *, image: str | None, labels: str | None,
                 crop: Any = None, fit_joins: list[str] | None = None, threads: int | None = None,
                 write: bool = True, replace_joins: bool = False,
                 budget: MemoryBudget | None = None) -> dict[str, Any]:
    """Choose the inference settings for a trained model among the job's ``data.eval.tune`` candidates on a
    labelled volume (``ffn/inference/tuning.py``) and, with ``write``, write them as its model package. Where no join
    model can be fitted (a barely trained model's floods leave no pairs of both kinds), pairs are joined by their
    claims, as the demo does, and the record says why. A join fit on far fewer pairs than the package's join model is
    refused before the candidates are tried, unless ``replace_joins``. Returns the tuning's record with "package"
    (the path written, or None)."""
    from hpctrain.ffn.inference.tuning import tune_checkpoint
    from hpctrain.ffn.perf import available_cpus

    tuning = inference_tuning(job_data)
    if tuning is None:
        raise ConfigError("the job has no data.eval.tune: nothing to choose between", key="data.eval.tune",
                          hint="add e.g. data.eval.tune: {move_threshold: [0.7, 0.8, 0.9], "
                               "agglomerate_threshold: [0.6, 0.7, 0.8]}")
    image, labels = labelled_volume(trained, tuning, image, labels)
    base = inference_settings(job_data)
    guard = join_fit_guard(trained) if write and not replace_joins else None
    record = tune_checkpoint(trained.checkpoint, image, labels, base, tuning.grid(), crop or tuning.crop,
                             threads=threads or available_cpus(), fit_on=join_fit_volume(fit_joins, job_data, tuning),
                             fit_settings=tuning.fit_flood_settings(), fit_required=False, check_fit=guard,
                             budget=budget)
    record["volume"] = image
    package = None
    if write:
        package = write_model_package(trained.checkpoint, {**base, **record["chosen"]}, record["chosen"], record)
    return {**record, "package": str(package) if package else None}


def baseline_scores(image_spec: str, labels: Any, train: tuple[str, str] | None,
                    budget: MemoryBudget | None = None) -> dict[str, dict[str, Any]]:
    """Scores of the Otsu-components baseline and of the seeded watershed on ``image_spec``; the watershed's
    parameters are chosen on the ``train`` (image, labels) volume when given, else its defaults. Each volume is
    read whole, refused first where it does not fit ``budget``."""
    import numpy as np

    from hpctrain.ffn.evaluation.baseline import baseline_segmentation
    from hpctrain.ffn.evaluation.evaluate import evaluate_segmentation
    from hpctrain.ffn.evaluation.watershed import WatershedParams, tune_watershed, watershed_segmentation
    from hpctrain.ffn.volume import load_volume

    image = np.asarray(load_volume(image_spec, budget))
    params = WatershedParams()
    if train:
        params, _ = tune_watershed(np.asarray(load_volume(train[0], budget)),
                                   np.asarray(load_volume(train[1], budget)))
    return {"baseline (Otsu components)": evaluate_segmentation(baseline_segmentation(image), labels),
            f"watershed ({'tuned on --train' if train else 'default parameters'})":
                {**evaluate_segmentation(watershed_segmentation(image, params), labels), "params": vars(params)}}
