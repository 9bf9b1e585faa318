"""The report's segmentation slices read only the voxels they draw: a few-KB ``*segmentation*.h5`` declaring
(3, 12000, 12000), (1, 10^6, 10^6) or (10^9, 2, 2) is drawn under 200 MB (it reached 4.7 GB, a MemoryError and an
OverflowError); a FIFO in its place is named, never opened; labels that are not a 3-D integer volume are said,
not drawn.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.guarded_command import hpctrain

PEAK_MB = 200


def run_with_segmentation(tmp_path: Path, shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    with h5py.File(run / "heldout_segmentation.h5", "w") as f:
        f.create_dataset("segmentation", shape=shape, dtype=dtype, chunks=chunks)
    return run


@pytest.mark.processes
@pytest.mark.parametrize("shape, dtype, chunks, titles", [
    ((3, 12000, 12000), "uint64", (1, 256, 256), ["z=0 (every 47×47)", "z=1 (every 47×47)", "z=2 (every 47×47)"]),
    ((1, 10**6, 10**6), "uint64", (1, 256, 256), ["z=0 (every 3907×3907)"]),
    ((10**9, 2, 2), "int8", (1024, 2, 2), ["z=250000000<", "z=500000000<", "z=750000000<"]),
])
def test_a_declared_huge_segmentation_is_drawn_from_the_voxels_drawn(tmp_path: Path, shape: tuple[int, ...],
                                                                    dtype: str, chunks: tuple[int, ...],
                                                                    titles: list[str]) -> None:
    run = run_with_segmentation(tmp_path, shape, dtype, chunks)
    done = hpctrain("report", str(run), "-o", str(tmp_path / "r.html"), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.peak_mb < PEAK_MB
    page = (tmp_path / "r.html").read_text()
    for title in titles:
        assert f"heldout_segmentation.h5 {title}" in page


@pytest.mark.processes
def test_a_fifo_in_place_of_the_segmentation_is_named_not_opened(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "heldout_segmentation.h5")
    done = hpctrain("report", str(run), "-o", str(tmp_path / "r.html"), timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "heldout_segmentation.h5 is a FIFO (named pipe), not a regular file" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("shape, dtype", [((4, 5, 6), "float32"), ((4, 5), "uint32"), ((0, 5, 6), "uint32")])
def test_labels_that_are_not_a_3d_integer_volume_are_said_not_drawn(tmp_path: Path, shape: tuple[int, ...],
                                                                     dtype: str) -> None:
    from hpctrain.report.segmentation import segmentation_slices

    with h5py.File(tmp_path / "x_segmentation.h5", "w") as f:
        f["segmentation"] = np.zeros(shape, dtype)
    slices, note = segmentation_slices((tmp_path,))
    assert slices == [] and "not a 3-D volume of integer labels" in note


@pytest.mark.parametrize("chunks", [None, (1, 4, 5), (2, 7, 3), (3, 50, 61)])
def test_a_drawn_plane_is_the_strided_plane_however_the_file_is_chunked(tmp_path: Path,
                                                                        chunks: tuple[int, ...] | None) -> None:
    from hpctrain.report.segmentation import SIDE, plane_steps, sampled_plane

    labels = np.random.default_rng(0).integers(0, 1000, (3, 600, 610)).astype(np.uint32)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f.create_dataset("segmentation", data=labels, chunks=chunks)
    with h5py.File(tmp_path / "s.h5", "r") as f:
        sy, sx = plane_steps(600, 610)
        plane = sampled_plane(f["segmentation"], 1, sy, sx)
    np.testing.assert_array_equal(plane, labels[1, ::sy, ::sx])
    assert max(plane.shape) <= SIDE
