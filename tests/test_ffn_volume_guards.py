"""What ``hpctrain ffn segment/evaluate`` refuse in one line before reading a voxel: files declaring shapes far
beyond the memory budget (a few KB of HDF5 or zarr metadata each: chunked datasets with no chunk written), an
image of the wrong dtype, FIFOs given as volumes, ``--threads`` outside 1..CPUs and paths longer than the OS
takes. Each runs as a child held to an address-space limit (tests/guarded_command.py): a refusal stays under
200 MB and ends with a non-zero exit, never a traceback or a hang.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.errors import ConfigError, DataError
from tests.guarded_command import hpctrain
from tests.test_ffn_subvolumes import everything_model

PEAK_MB = 200


def declared(path: Path, shape: tuple[int, ...], dtype: str, name: str = "image") -> str:
    """An HDF5 file whose dataset declares ``shape`` and holds no chunk: a few KB on disk."""
    with h5py.File(path, "w") as f:
        f.create_dataset(name, shape=shape, dtype=dtype, chunks=tuple(min(64, n) for n in shape))
    return f"{path}:{name}"


def declared_zarr(path: Path, side: int) -> str:
    import zarr

    zarr.create_array(str(path), shape=(side,) * 3, chunks=(64, 64, 64), dtype="uint8")
    return str(path)


@pytest.mark.processes
@pytest.mark.parametrize("shape, dtype", [((4096,) * 3, "uint8"), ((1, 1 << 30, 1 << 30), "uint8"),
                                          ((2048,) * 3, "uint64")])
def test_evaluate_refuses_declared_shapes_beyond_the_budget(tmp_path: Path, shape: tuple[int, ...],
                                                           dtype: str) -> None:
    spec = declared(tmp_path / "v.h5", shape, dtype)
    done = hpctrain("ffn", "evaluate", spec, spec)
    line = done.one_line_error()
    assert str(shape) in line and "more than the budget of" in line and "--memory-gb" in line
    assert done.peak_mb < PEAK_MB


@pytest.mark.processes
def test_evaluate_refuses_a_zarr_store_of_2_to_the_40_per_side(tmp_path: Path) -> None:
    spec = declared_zarr(tmp_path / "v.zarr", 1 << 40)
    done = hpctrain("ffn", "evaluate", spec, spec)
    assert "more than the budget of" in done.one_line_error()
    assert done.peak_mb < PEAK_MB


@pytest.mark.processes
def test_the_budget_is_named_and_settable_by_flag_and_environment(tmp_path: Path) -> None:
    spec = declared(tmp_path / "v.h5", (64, 64, 64), "uint32")  # 25 MB to evaluate: 64^3 x (4 + 4 + 81) B
    assert "(--memory-gb 0.01)" in hpctrain("ffn", "evaluate", spec, spec, "--memory-gb", "0.01").one_line_error()
    by_env = hpctrain("ffn", "evaluate", spec, spec, env={"HPCTRAIN_MEMORY_GB": "0.02"})
    assert "budget of 0.02 GB (HPCTRAIN_MEMORY_GB=0.02)" in by_env.one_line_error()
    assert "not a number" in hpctrain("ffn", "evaluate", spec, spec, env={"HPCTRAIN_MEMORY_GB": "lots"}
                                      ).one_line_error()
    fits = hpctrain("ffn", "evaluate", spec, spec, "--memory-gb", "1", "--json")
    assert fits.returncode == 2 and "no voxel other than the ignored label" in fits.one_line_error()  # read, then
    # evaluated: every voxel is the fill value 0, the ignored background


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(everything_model(tmp_path / "m.pt"))


@pytest.mark.processes
def test_segment_checks_an_image_s_dtype_and_size_before_reading_it(tmp_path: Path, checkpoint: str) -> None:
    """A 1024^3 image was read whole (1-4 GB) before its shape or type was looked at."""
    out = str(tmp_path / "seg.h5")
    wrong = declared(tmp_path / "int.h5", (1024,) * 3, "int32")
    assert "dtype int32; expected uint8" in hpctrain("ffn", "segment", checkpoint, wrong, "-o", out
                                                     ).one_line_error()
    big = declared(tmp_path / "big.h5", (1024,) * 3, "uint8")
    done = hpctrain("ffn", "segment", checkpoint, big, "-o", out, "--memory-gb", "8")
    line = done.one_line_error()
    assert "segmenting" in line and "(--memory-gb 8)" in line and "--subvolumes" in line
    assert done.peak_mb < PEAK_MB
    flat = declared(tmp_path / "flat.h5", (1, 1 << 30, 1 << 30), "uint8")
    assert "more than the budget" in hpctrain("ffn", "segment", checkpoint, flat, "-o", out).one_line_error()
    assert not Path(out).exists()


@pytest.mark.processes
def test_segment_in_pieces_checks_the_pieces_a_rank_floods_at_once(tmp_path: Path, checkpoint: str) -> None:
    big = declared(tmp_path / "big.h5", (1024,) * 3, "uint8")
    done = hpctrain("ffn", "segment", checkpoint, big, "-o", str(tmp_path / "seg.h5"), "--subvolumes", "2", "2",
                    "2", "--memory-gb", "4", timeout=90)
    line = done.one_line_error()
    assert "flooding 4 pieces of up to" in line and "more --subvolumes" in line
    assert not (tmp_path / "seg.parts").exists()


@pytest.mark.processes
def test_fifos_given_as_volumes_are_refused_without_opening_them(tmp_path: Path, checkpoint: str) -> None:
    fifo = tmp_path / "vol.h5"
    os.mkfifo(fifo)
    line = hpctrain("ffn", "evaluate", f"{fifo}:x", f"{fifo}:x", timeout=60).one_line_error()
    assert "is a FIFO (named pipe), not a regular file" in line
    line = hpctrain("ffn", "segment", checkpoint, f"{fifo}:image", "-o", str(tmp_path / "o.h5"),
                    timeout=60).one_line_error()
    assert "is a FIFO" in line
    store = tmp_path / "v.zarr"
    store.mkdir()
    os.mkfifo(store / "zarr.json")
    assert "zarr.json is a FIFO" in hpctrain("ffn", "evaluate", str(store), str(store), timeout=60).one_line_error()


@pytest.mark.processes
@pytest.mark.parametrize("threads", ["-1", "0", "100000"])
def test_threads_outside_one_to_the_cpus_are_refused_by_the_parser(tmp_path: Path, checkpoint: str,
                                                                 threads: str) -> None:
    vol = tmp_path / "v.h5"
    with h5py.File(vol, "w") as f:
        f["image"] = np.full((8, 8, 8), 128, np.uint8)
    done = hpctrain("ffn", "segment", checkpoint, f"{vol}:image", "-o", str(tmp_path / "o.h5"), "--threads", threads)
    assert done.returncode == 2
    assert f"argument --threads: {threads} threads; give 1 to {os.cpu_count()}" in done.one_line_error()


def test_threads_are_checked_where_python_code_asks_for_them(checkpoint: str) -> None:
    from hpctrain.ffn.inference.runner import prepare_inference

    with pytest.raises(ConfigError, match="threads: -1 threads; give 1 to"):
        prepare_inference(checkpoint, threads=-1, tune=False)


@pytest.mark.processes
def test_a_path_longer_than_the_os_takes_is_one_line(tmp_path: Path, checkpoint: str) -> None:
    long = f"{tmp_path}/{'a' * 100_000}.h5:image"
    done = hpctrain("ffn", "evaluate", long, long)
    assert done.returncode == 2 and "longer than the 4095 the system takes" in done.one_line_error()
    assert len(done.stderr) < 5000  # the path is not repeated
    name = f"{tmp_path}/{'b' * 300}.h5:image"
    line = hpctrain("ffn", "segment", checkpoint, name, "-o", str(tmp_path / "o.h5")).one_line_error()
    assert "a name of 303 bytes, longer than the 255" in line
    fits = f"{tmp_path}/{'c' * 250}.h5:image"  # the dataset's name is no part of the file's
    assert "does not exist" in hpctrain("ffn", "evaluate", fits, fits).one_line_error()


def test_a_read_is_checked_from_the_shape_of_its_selection(tmp_path: Path) -> None:
    from hpctrain.ffn.volume import open_volume
    from hpctrain.memory_budget import MemoryBudget

    spec = declared(tmp_path / "v.h5", (1 << 20, 1 << 20, 1 << 20), "uint16")
    with open_volume(spec, MemoryBudget(10**6, "a test's")) as volume:
        assert volume[5, 10:12, 3:7].shape == (2, 4)  # a small box of a huge volume is read
        with pytest.raises(DataError, match=r"reading .* \(1048576, 1048576\) uint16 needs 2.2e\+03 GB"):
            volume[0]
        with pytest.raises(DataError, match="more than the budget of 0.001 GB"):
            volume.read()


@pytest.mark.parametrize("key, shape", [
    ((slice(None),), (4, 5, 6)), (Ellipsis, (4, 5, 6)), ((1, Ellipsis, 2), (5,)), ((slice(0, 4, 2), 1), (2, 6)),
    ((slice(-2, None), slice(10, 20)), (2, 0, 6)), (2, (5, 6)), ((np.int64(1), 2, 3), ()),
    (([0, 1],), None), ((Ellipsis, Ellipsis), None), ((1, 2, 3, 4), None),
])
def test_selection_shapes_are_known_before_reading(key: object, shape: tuple[int, ...] | None) -> None:
    from hpctrain.ffn.volume import selection_shape

    assert selection_shape((4, 5, 6), key) == shape
    if shape is not None:
        assert np.zeros((4, 5, 6))[key].shape == shape  # as numpy slices
