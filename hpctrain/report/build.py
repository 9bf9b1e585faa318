"""A run's report from its source: collect the files, add the plan comparison and the segmentation slices, render
the page, write it whole (beside, then renamed: a browser reloading it never reads half a page).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.files import write_atomic
from hpctrain.report.collect import JSON_CAP, PROFILE_FILE, ReportData, collect
from hpctrain.report.efficiency import try_compare
from hpctrain.report.html import page
from hpctrain.report.segmentation import segmentation_slices
from hpctrain.report.source import RunSource
from hpctrain.run_files import read_run_text
from hpctrain.text import printable_short

DEFAULT_NAME = "report.html"


def report_data(source: RunSource, extra_dirs: tuple[Path, ...] = ()) -> ReportData:
    data = collect(source.directory, source.facts, extra_dirs=extra_dirs)
    try:
        text = read_run_text(source.directory / PROFILE_FILE, JSON_CAP)
    except OSError:
        text = None  # noted among the problems when collected
    data.efficiency, data.efficiency_note = try_compare(source.job_file, source.site_file, source.facts.site, text,
                                                        f"{source.facts.where}/{PROFILE_FILE}")
    data.slices, data.slices_note = segmentation_slices((source.directory, *extra_dirs))
    return data


def write_page(path: Path, text: str) -> Path:
    """Write the page whole at ``path`` (its directory must exist: nothing is created but the file)."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise HpctrainError(f"{printable_short(str(path))}: cannot write the report: {exc.strerror or exc}",
                            hint="name a file in a directory you can write, with -o FILE.html") from None
    return path


def build_report(source: RunSource, out: Path | None = None, *, extra_dirs: tuple[Path, ...] = (),
                 refresh_s: float | None = None) -> tuple[Path, ReportData]:
    """Write the report of ``source`` to ``out`` (default: report.html in the run's local directory)."""
    data = report_data(source, extra_dirs)
    target = out or source.directory / DEFAULT_NAME
    return write_page(target, page(data, refresh_s)), data


def report_of(run_ref: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
              extra_dirs: tuple[str | os.PathLike[str], ...] = ()) -> Path:
    """``hpctrain report RUN -o OUT`` from Python (the demo calls it): the path written."""
    from hpctrain.report.source import open_source

    source = open_source(str(run_ref))
    path, _ = build_report(source, Path(out) if out is not None else None,
                           extra_dirs=tuple(Path(p) for p in extra_dirs))
    return path


def demo_report_line(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                     figure: str | os.PathLike[str]) -> str:
    """``hpctrain demo``'s last line: its run's report (with the demo's scores and segmentation), beside its figure.
    The report is never why the demo fails: a report that cannot be written says why on that line."""
    try:
        path = report_of(run_dir, Path(out_dir) / DEFAULT_NAME, extra_dirs=(out_dir,))
    except (HpctrainError, OSError, ImportError, ValueError) as exc:
        return f"report: not written ({exc}); figure {figure}"
    return f"report {path}  (figure {figure})"
