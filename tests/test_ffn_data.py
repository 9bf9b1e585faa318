"""Synthetic volumes, volume loading and its errors, partitions, balanced coordinates and rank shards."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

from hpctrain.errors import DataError
from hpctrain.ffn.segmentation import clear_dust
from hpctrain.ffn.synthetic import make_synthetic_volume, write_hdf5
from hpctrain.ffn.training.coordinates import (
    DEFAULT_THRESHOLDS,
    IGNORE_PARTITION,
    build_coordinates,
    compute_partitions,
    read_coordinates,
    shard,
    write_coordinates,
)
from hpctrain.ffn.volume import Volume, load_image_and_labels, load_volume, open_volume


@pytest.fixture(scope="module")
def small() -> tuple[np.ndarray, np.ndarray]:
    return make_synthetic_volume((40, 48, 48), seed=3)


# ------------------------------------------------------------------------------------------------ synthetic


def test_synthetic_is_deterministic_and_typed(small: tuple[np.ndarray, np.ndarray]) -> None:
    image, labels = small
    again = make_synthetic_volume((40, 48, 48), seed=3)
    other = make_synthetic_volume((40, 48, 48), seed=4)
    assert image.dtype == np.uint8 and labels.dtype == np.uint32
    assert image.shape == labels.shape == (40, 48, 48)
    assert np.array_equal(image, again[0]) and np.array_equal(labels, again[1])
    assert not np.array_equal(labels, other[1])


def test_synthetic_objects_are_separated_by_darker_membranes() -> None:
    image, labels = make_synthetic_volume((48, 64, 64), seed=0)
    ids = np.unique(labels)
    assert ids[0] == 0 and len(ids) >= 6
    # Membranes (label 0) separate objects: no two different objects touch along an axis.
    for axis in range(3):
        a, b = np.moveaxis(labels, axis, 0)[:-1], np.moveaxis(labels, axis, 0)[1:]
        assert not np.any((a != b) & (a > 0) & (b > 0))
    assert image[labels == 0].mean() < image[labels > 0].mean() - 20
    # Elongated: some object spans most of an axis.
    spans = [np.ptp(np.nonzero(labels == i)[ax]) for i in ids[1:] for ax in range(3)]
    assert max(spans) > 0.7 * 48
    # Thresholding alone does not find the membranes: best voxel accuracy stays clearly below 1.
    membrane = labels == 0
    best = max(np.mean((image < t) == membrane) for t in range(40, 220, 5))
    assert 0.6 < best < 0.95


def _membrane_dip(image: np.ndarray, labels: np.ndarray) -> float:
    """Mean of (brightness of the membrane voxel's nearest object, away from its edges) - (the voxel's own)."""
    from scipy import ndimage

    img, membrane = image.astype(np.float64), labels == 0
    _, idx = ndimage.distance_transform_edt(membrane, return_indices=True)
    nearest = labels[idx[0], idx[1], idx[2]][membrane]
    inner = np.where(ndimage.distance_transform_edt(~membrane) >= 3, labels, 0)
    with np.errstate(invalid="ignore"):  # objects with no voxel 3 from their edge have no mean (NaN)
        means = ndimage.mean(img, inner, np.arange(labels.max() + 1))
    return float(np.nanmean(means[nearest] - img[membrane]))


def test_membrane_on_neighbours_makes_faint_membranes_equally_faint_in_every_volume() -> None:
    """By default every membrane voxel starts from label 0's random brightness, so a faint membrane (all of them
    here: faint_fraction 1) is anywhere from invisible to clearly darker depending on the volume's seed; with
    membrane_on_neighbours it is darker than its own objects by the same contrast in every volume, and the
    objects (labels) do not change."""
    from hpctrain.config.plugins.ffn import SyntheticVolume

    spec = SyntheticVolume(shape=(24, 48, 48), seed=0, faint_fraction=1.0, noise_sigma=0.0,
                           membrane_on_neighbours=True)
    default, on = [], []
    for seed in range(6):
        kw = {**spec.options(), "membrane_on_neighbours": False}
        image, labels = make_synthetic_volume(spec.shape, seed, **kw)
        image_on, labels_on = make_synthetic_volume(spec.shape, seed, **spec.options())
        assert np.array_equal(labels, labels_on)
        default.append(_membrane_dip(image, labels))
        on.append(_membrane_dip(image_on, labels_on))
    assert min(default) < 2 and max(default) - min(default) > 10, default  # seed 0: invisible
    assert all(6 < d < 13 for d in on), on  # 15 % of 90 grey levels, less what the blur takes



def test_write_hdf5_and_load_volume_roundtrip(tmp_path: Path, small: tuple[np.ndarray, np.ndarray]) -> None:
    image, labels = small
    path = write_hdf5(tmp_path / "vol.h5", image, labels)
    assert np.array_equal(load_volume(f"{path}:image"), image)
    assert np.array_equal(load_volume({"path": str(path), "dataset": "labels"}), labels)
    with open_volume(f"{path}:labels") as vol:
        assert isinstance(vol, Volume) and isinstance(vol._array, h5py.Dataset)  # lazy: nothing read yet
        assert vol.shape == labels.shape and vol.dtype == labels.dtype
        assert np.array_equal(vol[3:5, 10:20, 7], labels[3:5, 10:20, 7])


def test_zarr_group_and_array(tmp_path: Path, small: tuple[np.ndarray, np.ndarray]) -> None:
    image, labels = small
    group = zarr.open_group(str(tmp_path / "vol.zarr"), mode="w")
    group.create_array("raw", data=image, chunks=(16, 16, 16))
    group.create_array("seg/gt", data=labels, chunks=(16, 16, 16))
    zarr.create_array(str(tmp_path / "img.zarr"), data=image, chunks=(16, 16, 16))
    img, lab = load_image_and_labels(f"{tmp_path}/vol.zarr:raw", f"{tmp_path}/vol.zarr:seg/gt")
    assert np.array_equal(img[...], image) and np.array_equal(lab[5:9], labels[5:9])
    assert np.array_equal(load_volume(str(tmp_path / "img.zarr")), image)
    with pytest.raises(DataError, match=r"no dataset 'nope'.*'raw'"):
        open_volume(f"{tmp_path}/vol.zarr:nope")


def test_volume_errors_name_the_problem(tmp_path: Path, small: tuple[np.ndarray, np.ndarray]) -> None:
    image, labels = small
    path = write_hdf5(tmp_path / "vol.h5", image, labels)
    with h5py.File(path, "a") as f:
        f["short"] = labels[:-1]
        f["floats"] = labels.astype(np.float32)
        f["wide"] = image.astype(np.uint16)
        f["flat"] = image[0]
    with pytest.raises(DataError, match="does not exist"):
        open_volume(f"{tmp_path}/missing.h5:image")
    with pytest.raises(DataError, match=r"no dataset 'raw'.*datasets in the file: \[.*'image'.*'labels'"):
        open_volume(f"{path}:raw")
    with pytest.raises(DataError, match="no dataset named"):
        open_volume(str(path))
    with pytest.raises(DataError, match=r"shape \(40, 48, 48\) but labels .* shape \(39, 48, 48\)"):
        load_image_and_labels(f"{path}:image", f"{path}:short")
    with pytest.raises(DataError, match="float32; expected an integer"):
        load_image_and_labels(f"{path}:image", f"{path}:floats")
    with pytest.raises(DataError, match="uint16; expected uint8"):
        load_image_and_labels(f"{path}:wide", f"{path}:labels")
    with pytest.raises(DataError, match="3-D"):
        load_image_and_labels(f"{path}:flat", f"{path}:labels")
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(DataError, match="not a readable HDF5"):
        open_volume(f"{tmp_path}/junk.h5:image")
    img, lab = load_image_and_labels(f"{path}:floats", f"{path}:labels")  # float images are accepted
    assert img.dtype == np.float32 and lab.shape == labels.shape


# ------------------------------------------------------------------------------------ partitions, coordinates


def test_partitions_match_a_direct_count(small: tuple[np.ndarray, np.ndarray]) -> None:
    _, labels = small
    radius = (6, 7, 8)
    parts = compute_partitions(labels, lom_radius=radius, min_size=300)
    assert parts.shape == labels.shape and parts.dtype == np.uint8
    cleaned = clear_dust(labels, 300)
    thresholds = np.array(DEFAULT_THRESHOLDS)
    rz, ry, rx = radius
    valid = np.zeros(labels.shape, bool)
    valid[rz:-rz, ry:-ry, rx:-rx] = True
    assert np.all(parts[~valid] == IGNORE_PARTITION)
    assert np.all(parts[valid & (cleaned == 0)] == 0)
    rng = np.random.default_rng(0)
    checked = 0
    for z, y, x in rng.integers((rz, ry, rx), np.array(labels.shape) - (rz, ry, rx), size=(400, 3)):
        label = cleaned[z, y, x]
        if label == 0:
            continue
        box = cleaned[z - rz : z + rz + 1, y - ry : y + ry + 1, x - rx : x + rx + 1]
        fraction = np.mean(box == label)
        assert parts[z, y, x] == 1 + np.sum(thresholds <= fraction)
        checked += 1
    assert checked > 100


def test_clear_dust_removes_small_objects() -> None:
    labels = np.zeros((10, 10, 10), np.uint64)
    labels[:5] = 7
    labels[9, 9, 9] = 2**40  # a huge id must not cost memory in compute_partitions
    out = clear_dust(labels, 10)
    assert out[9, 9, 9] == 0 and np.all(out[:5] == 7)
    parts = compute_partitions(labels, lom_radius=(2, 2, 2), min_size=0)
    assert parts[9, 9, 9] == IGNORE_PARTITION and parts[4, 4, 4] > 0 and parts[6, 5, 5] == 0


def test_coordinates_are_balanced_inside_the_margin_and_deterministic(
    small: tuple[np.ndarray, np.ndarray],
) -> None:
    _, labels = small
    parts = compute_partitions(labels, lom_radius=(6, 6, 6), min_size=300)
    margin = (8, 9, 10)
    coords = build_coordinates(parts, margin, seed=1)
    assert coords.dtype == np.int64 and coords.shape[1] == 3
    assert np.all(coords >= margin) and np.all(coords < np.array(labels.shape) - margin)
    at = parts[coords[:, 0], coords[:, 1], coords[:, 2]]
    assert IGNORE_PARTITION not in at
    inner = parts[8:-8, 9:-9, 10:-10]
    present = [v for v in np.unique(inner) if v != IGNORE_PARTITION]
    values, counts = np.unique(at, return_counts=True)
    assert list(values) == present and len(present) >= 5
    assert np.all(counts == counts[0])  # every partition equally often
    assert counts[0] == max(np.sum(inner == v) for v in present)  # oversampled to the largest
    assert len(np.unique(coords[at == values[-1]], axis=0)) == np.sum(inner == values[-1])  # each voxel used
    assert np.array_equal(coords, build_coordinates(parts, margin, seed=1))
    assert not np.array_equal(coords, build_coordinates(parts, margin, seed=2))


def test_coordinate_file_roundtrip_and_errors(tmp_path: Path) -> None:
    coords = np.arange(30).reshape(10, 3)
    path = write_coordinates(tmp_path / "c" / "coords.npz", coords, margin=np.array([1, 2, 3]))
    assert np.array_equal(read_coordinates(path), coords)
    assert list(tmp_path.joinpath("c").iterdir()) == [path]  # no temp file left
    with pytest.raises(DataError, match="does not exist"):
        read_coordinates(tmp_path / "none.npz")
    np.savez(tmp_path / "bad.npz", coords=np.zeros((4, 2), np.int64))
    with pytest.raises(DataError, match=r"expected \(K, 3\)"):
        read_coordinates(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_text("junk")
    with pytest.raises(DataError, match="not a coordinate file"):
        read_coordinates(tmp_path / "junk.npz")


def test_shards_are_disjoint_cover_the_epoch_and_change_per_epoch() -> None:
    coords = np.stack([np.arange(103)] * 3, axis=1)
    world = 4
    for epoch in range(3):
        parts = [shard(coords, r, world, epoch, seed=5) for r in range(world)]
        ids = np.concatenate([p[:, 0] for p in parts])
        assert all(len(p) == 103 // world for p in parts)
        assert len(np.unique(ids)) == len(ids) == 100  # disjoint; all but the 3 left over
        assert np.array_equal(parts[1], shard(coords, 1, world, epoch, seed=5))
    assert not np.array_equal(shard(coords, 0, world, 0, 5), shard(coords, 0, world, 1, 5))
    with pytest.raises(ValueError, match="rank 4"):
        shard(coords, 4, world, 0)
    with pytest.raises(DataError, match="cannot feed"):
        shard(coords[:3], 0, 4, 0)


def test_shading_and_faint_contrast_change_the_image_not_the_labels() -> None:
    image, labels = make_synthetic_volume((24, 40, 40), seed=5, faint_fraction=0.0)
    shaded, labels2 = make_synthetic_volume((24, 40, 40), seed=5, faint_fraction=0.0, shading=30.0)
    assert np.array_equal(labels, labels2)
    diff = shaded.astype(np.float64) - image.astype(np.float64)
    assert diff.std() > 10  # a smooth field of ~30 grey levels, clipped at 0 and 255
    # Smooth: neighbouring voxels move together, unlike the per-voxel noise.
    assert np.corrcoef(diff[:, :, :-1].ravel(), diff[:, :, 1:].ravel())[0, 1] > 0.9
    faint, _ = make_synthetic_volume((24, 40, 40), seed=5, faint_fraction=0.5, faint_contrast=0.15)
    clear, _ = make_synthetic_volume((24, 40, 40), seed=5, faint_fraction=0.5, faint_contrast=1.0)
    membrane = labels == 0
    assert faint[membrane].mean() > clear[membrane].mean() + 5  # faint membranes are brighter (less contrast)


def test_membrane_width_thickens_membranes_and_keeps_the_default_volume() -> None:
    from scipy import ndimage

    image2, labels2 = make_synthetic_volume((20, 32, 32), seed=3)
    again = make_synthetic_volume((20, 32, 32), seed=3, membrane_width=2)
    assert np.array_equal(image2, again[0]) and np.array_equal(labels2, again[1])
    image4, labels4 = make_synthetic_volume((20, 32, 32), seed=3, membrane_width=4)
    assert (labels4 == 0).sum() > 1.5 * (labels2 == 0).sum()
    assert set(np.unique(labels4[labels2 == 0])) == {0}  # only object voxels turned into membrane
    # two different objects never come within 4 voxels' reach of each other: growing every object by one
    # voxel (6-neighbourhood) still leaves them apart, which a 2-voxel membrane does not guarantee past 1
    grown = ndimage.grey_dilation(labels4, footprint=ndimage.generate_binary_structure(3, 1))
    touching = (grown != labels4) & (labels4 > 0) & (grown > 0)
    assert not touching.any()
    assert image4[(labels4 == 0) & (labels2 > 0)].mean() < image4[labels4 > 0].mean() - 20
    with pytest.raises(ValueError, match="even number"):
        make_synthetic_volume((20, 32, 32), seed=3, membrane_width=3)
